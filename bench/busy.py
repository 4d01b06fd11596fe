"""Busy machine: the headline configuration's single-stream real-time factor while other processes
load the machine, side by side with the official pipeline.

Loads come from `stress-ng` (the Debian package; without it the block is skipped and the report
says so): nothing, one CPU hog, two CPU hogs (as many as the cores of the development machine), one
memory-bandwidth hog. Each load is started in its own process group, given a moment to ramp up,
then our runs and the official ones alternate (so both see the same load), and the whole group is
killed and checked gone before the next load starts. The unloaded runs of the same block are the
baseline of every slowdown.

Our engine also runs with llama.cpp's OpenMP threads spinning at every barrier
(`OMP_WAIT_POLICY=ACTIVE` with no spin count, which spins for ever: what the engine did before it
capped the spin in `qwen3_tts_gguf.host.cpus.import_llama`). That session is started only for its own runs and closed
right after: its idle OpenMP threads spin too, so while it is alive it is a background load of its
own.

Our engine on one thread (`threads=1`: every stage inline on one core) runs with no load and beside one
busy process: with no load it says how much the second core speeds our run up, which is what a load
that leaves us one core takes back (the loads run in sessions of their own, and with the kernel's
autogroup the CPU is shared between sessions before threads). And beside one busy process, our engine
in a session of its own at autogroup nice WEIGHTED_NICE: a larger CPU weight than the load's, which an
operator gives a service (systemd's `CPUWeight=`, `nice`); lowering a nice needs privileges, and the
runs report the refusal otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import nullcontext

from bench.common import Meter, wait_for_quiet

# (key, stress-ng arguments, what it is); "none" is the baseline of the block
LOADS = (
    ("none", None, "nothing else runs (the harness waits for the machine to go quiet before each run)"),
    ("cpu1", ["--cpu", "1"], "one process computing flat out: one busy background process"),
    ("cpu2", ["--cpu", "2"], "two such processes: as many busy processes as the development machine has cores"),
    ("stream1", ["--stream", "1"], "one process streaming through a buffer larger than the caches (STREAM "
                                   "copy/scale/add/triad): a memory-bandwidth hog, and a busy process too"),
)
OLD_POLICY = {"OMP_WAIT_POLICY": "ACTIVE"}
OLD_POLICY_LOADS = ("none", "cpu1", "cpu2")  # the old waits are measured where they matter (and quiet, as baseline)
ONE_THREAD_LOADS = ("none", "cpu1")  # our engine on one thread: what one core gives, quiet and beside one busy process
WEIGHTED_LOADS = ("cpu1",)  # our engine with a larger CPU weight than the load's
WEIGHTED_NICE = -5  # its session's autogroup nice: CFS weight 3121 against the load's 1024 (nice 0)
SETTLE_S = 2.0  # the load ramps up before the first measured run
HEADLINE = ("0.6b", "q8_0", "int8")


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is `pgid`."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in "ZX":
            pids.append(int(name))
    return pids


class StressLoad:
    """`stress-ng ARGS` in a process group of its own; stopping kills the group and waits until no
    member is left. A `--timeout` ends it anyway should the harness itself die."""

    def __init__(self, exe: str, args: list[str], max_s: float, term_grace_s: float = 5.0):
        self.term_grace_s = term_grace_s
        self.cmd = [exe, *args, "--timeout", f"{max(int(max_s), 10)}s", "--quiet"]
        self.proc: subprocess.Popen | None = None
        self.stopped: dict = {}

    def __enter__(self) -> "StressLoad":
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err,
                                     start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def error(self) -> str:
        self._err.seek(0)
        text = self._err.read().decode(errors="replace").strip()
        return f"stress-ng exited with {self.proc.returncode}" + (f": {text[-300:]}" if text else "")

    def stop(self) -> dict:
        if self.proc is None or self.stopped:
            return self.stopped
        t0, pgid = time.perf_counter(), self.proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            deadline = time.perf_counter() + (self.term_grace_s if sig == signal.SIGTERM else 10)
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None and not group_members(pgid):
                    break
                time.sleep(0.05)
            else:
                continue
            break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._err.close()
        self.stopped = {"stop_s": time.perf_counter() - t0, "left": group_members(pgid)}
        return self.stopped

    def __exit__(self, *exc) -> None:
        self.stop()


def measure(progress, log, *, model_dir: str, checkpoint: str, threads: int, frames: int, reps: int,
            official_reps: int, old_reps: int, official_loaded_reps: int | None = None, one_reps: int = 0,
            weighted_reps: int = 0,
            quiet_s: float, budget_s: float | None, official: bool = True,
            timeout_s: float = 600, step=None) -> dict:
    """Every load of LOADS in turn; returns the block for results["busy"]."""
    from bench import machine
    from bench.session import Budget, Session

    out = {"shape": HEADLINE[0], "quant": HEADLINE[1], "cp": HEADLINE[2], "threads": threads, "frames": frames,
           "reps": reps, "official_reps": official_reps if official else 0,
           "official_loaded_reps": (official_reps if official_loaded_reps is None else official_loaded_reps)
           if official else 0, "old_reps": old_reps, "one_reps": one_reps, "weighted_reps": weighted_reps,
           "weighted_nice": WEIGHTED_NICE,
           "old_policy_env": OLD_POLICY, "autogroup": machine.sched_autogroup(), "settle_s": SETTLE_S,
           "quiet_s": quiet_s,
           **machine.block_origin(), "started": time.time(), "loads": {}}
    exe = shutil.which("stress-ng")
    if exe is None:
        out["status"] = "skipped: `stress-ng` is not installed (Debian/Ubuntu: `apt-get install stress-ng`)"
        log(f"busy machine: {out['status']}")
        return out
    try:
        out["stress_ng"] = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                          timeout=20).stdout.strip()
    except Exception:
        out["stress_ng"] = None
    budget = Budget(budget_s)
    step = step or (lambda label: None)

    step("busy machine: loading ours" + (" + official" if official else ""))
    ours = Session(progress, "busy ours", "ours", dict(
        model_dir=model_dir, threads=threads, frames=frames, warmup_frames=4, concurrency_frames=frames,
        max_streams=8), timeout=timeout_s)
    off = Session(progress, "busy official", "official", dict(
        checkpoint=checkpoint, threads=threads, frames=frames, warmup_frames=3),
        timeout=timeout_s) if official else None
    walls: dict = {}

    def one(session, who: str, load: str, rep: int, runs: list, errors: list, pids: tuple = ()) -> None:
        label = f"busy {load}: {who} run {rep + 1}"
        if rep and not budget.allows(label, walls.get((who, load), 0)):
            return
        step(label)
        if load == "none" and quiet_s:
            wait_for_quiet(quiet_s, pids=pids)
        r = session.call(op="single", rep=rep)
        if "error" in r:
            errors.append(r["error"])
        else:
            runs.append(r)
            walls[(who, load)] = r.get("wall_s", 0)

    def extra_runs(who: str, load: str, label: str, n: int, row: dict, env: dict | None = None, **params) -> None:
        """`n` runs of our engine in a session started for them and closed right after (`params` over the
        headline session's); a session that does not load leaves `{who}_error` and a failed run."""
        step(f"busy {load}: loading ours {label}")
        session = Session(progress, f"busy ours ({label})", "ours", {
            **dict(model_dir=model_dir, threads=threads, frames=frames, warmup_frames=4, concurrency_frames=frames,
                   max_streams=8), **params}, timeout=timeout_s, env=env)
        if session.ok:
            for rep in range(n):
                one(session, who, load, rep, row[who], row["errors"], pids=(session.proc.pid,))
        else:
            row[f"{who}_error"] = session.ready["error"]
            row["errors"].append(f"ours {label}: {session.ready['error']}")
        row[f"{who}_summary"] = session.close()

    for key, args, what in LOADS:
        row = out["loads"][key] = {"what": what, "command": None if args is None else "stress-ng " + " ".join(args),
                                   "ours": [], "official": [], "old": [], "one": [], "weighted": [], "errors": []}
        if quiet_s:  # the previous load is gone and nothing else is busy
            row["quiet_before"] = wait_for_quiet(quiet_s)
        load = StressLoad(exe, args, timeout_s * 4) if args else None
        with load or nullcontext():
            started = True
            if load:
                step(f"busy {key}: starting {row['command']}")
                with Meter() as m:
                    time.sleep(SETTLE_S)
                row["load_alone_background"] = m.background  # the load by itself, before our runs
                if not load.alive():
                    row["errors"].append(load.error())
                    log(f"busy machine: {row['command']} did not start: {row['errors'][-1]}")
                    started = False
            n_off = out["official_reps"] if load is None else out["official_loaded_reps"]
            for rep in range(max(reps, n_off) if started else 0):
                # ours and the official runs alternate, so both see the same load
                if rep < reps:
                    one(ours, "ours", key, rep, row["ours"], row["errors"])
                if off and rep < n_off:
                    one(off, "official", key, rep, row["official"], row["errors"])
            if key in OLD_POLICY_LOADS and old_reps and started:
                # started only now and closed right after: its idle threads spin, a load of their own
                extra_runs("old", key, "with spinning waits", old_reps, row, env=OLD_POLICY)
            if key in ONE_THREAD_LOADS and one_reps and started:
                extra_runs("one", key, "on one thread", one_reps, row, threads=1)
            if key in WEIGHTED_LOADS and weighted_reps and started:
                extra_runs("weighted", key, f"at autogroup nice {WEIGHTED_NICE}", weighted_reps, row,
                           autogroup_nice=WEIGHTED_NICE)
            if load and started and not load.alive():  # it ended before we stopped it: the load did not last the runs
                row["errors"].append("the load ended early: " + load.error())
        if load:
            row["stop"] = load.stopped
            if load.stopped.get("left"):
                log(f"busy machine: stress-ng processes left after kill: {load.stopped['left']}")
    out["ours_summary"] = ours.close()
    if off:
        out["official_summary"] = off.close()
    out["skipped"] = budget.skipped
    out["finished"] = time.time()
    return out
