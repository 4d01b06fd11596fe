"""How many CPUs this process may actually use: the one default for every runtime's thread count.

`os.cpu_count()` counts the machine's CPUs, not this process's: in a container limited to 2 CPUs on a
64-core node it says 64, and llama.cpp's and ONNX Runtime's threads, which wait for each other at every
step, then collapse under the quota's throttling. The usable count is the smallest of:

- the CPUs in this process's affinity mask (`taskset`, `--cpuset-cpus`, Kubernetes' static CPU manager);
- the cgroup CPU quota, rounded up (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us / cpu.cfs_period_us`:
  `docker run --cpus`, a Kubernetes CPU limit), read from this process's own cgroup.
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """The cgroup folders whose limits apply to this process, innermost first (v2, then v1 `cpu`)."""
    dirs: list[Path] = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            base = root
        elif "cpu" in controllers.split(","):
            base = next((root / name for name in (controllers, "cpu,cpuacct", "cpu") if (root / name).is_dir()), root)
        else:
            continue
        # a limit on any ancestor applies too (inside a container the path may be "/" itself)
        current = base / rel
        while True:
            dirs.append(current)
            if current == base or current.parent == current:
                break
            current = current.parent
    if not dirs:
        dirs.append(root)
    return dirs


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest CPU quota on this process's cgroups, in CPUs (e.g. 1.5); None when there is none."""
    limits: list[float] = []
    for folder in _own_cgroup_dirs(root, proc_cgroup):
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            if quota != "max" and int(period) > 0:
                limits.append(int(quota) / int(period))
            continue
        except (OSError, ValueError):
            pass
        try:
            quota_us = int((folder / "cpu.cfs_quota_us").read_text())
            period_us = int((folder / "cpu.cfs_period_us").read_text())
            if quota_us > 0 and period_us > 0:
                limits.append(quota_us / period_us)
        except (OSError, ValueError):
            pass
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (all CPUs where the platform has no such mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cpus() -> int:
    """CPUs this process may use: affinity, then the cgroup quota rounded up; at least 1."""
    count = affinity_cpus()
    quota = cgroup_cpu_limit()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota - 1e-9)))
    return max(1, count)


def default_threads(threads: int | None = 0) -> int:
    """`threads` when set (> 0), else `usable_cpus()`: the default of every runtime's thread count."""
    return threads if threads and threads > 0 else usable_cpus()


@dataclass(frozen=True)
class StageThreads:
    """Threads of each stage of the engine (`stage_threads`)."""

    talker_step: int  # llama.cpp threads for a decode of one row while a codec call runs beside it
    talker_batch: int  # llama.cpp threads for a decode of several rows, and of one row with the codec idle
    predictor: int  # the code predictor's ONNX Runtime threads
    codec: int  # ONNX Runtime threads of one codec call
    codec_lanes: int  # codec calls that may run at once (different streams), when the codec overlaps


def stage_threads(threads: int | None = 0, *, codec_overlap: bool = False, codec_threads: int = 0) -> StageThreads:
    """Each stage's threads for an engine on `threads` cores (0: `usable_cpus()`).

    Inline, every stage uses every core, one after the other. Overlapped (the codec on threads of its
    own beside the talker and the code predictor), by default one codec call at a time on every core,
    and a one-row talker step (one stream's) leaves a core to the codec while one of its calls is in
    flight: a step reads its weights from memory and gains little from a second thread while the codec
    computes on it (the engine sets the step's threads before each decode; with the codec idle, as for
    a stream's first frame, the step has every core). 0.6B, 2 cores, side by side
    (`python -m bench.experiments codec-overlap`, 2026-12-01 18:01): one stream's RTF 1.49 -> 1.42, the
    same first audio (0.34 s) and eight streams' aggregate RTF (0.84 -> 0.83).
    With `codec_threads` below the cores, each codec call runs on that many threads, in as many lanes
    as the cores hold, so several streams' calls run side by side (eight streams 0.83 -> 0.77 in that
    run); but a stream's first chunk, decoded at once on the engine thread, then gets only that many
    threads too (its 1-frame call 76-80 ms instead of 49-51 in the full bench of 2026-12-01 13:34;
    first audio 0.34 -> 0.35 s in the 18:01 run, 0.29 -> 0.31 in one at 17:58): opt-in
    (`--codec-threads 1`), for servers that want throughput more than first audio.
    The code predictor keeps every core: on one thread, leaving the other to the codec, `--preset fast`'s
    int4 graph (which two threads speed up least: one frame alone 41.5 -> 38.7 ms) ran no faster in the
    engine (2026-12-02 11:28, 6 alternating rounds: RTF 1.32 / 1.32, code predictor 53 / 53 ms per frame).
    Nor does the default int8 graph, alone or in a strict partition (talker step, code predictor and a
    one-thread codec each on a core of its own, one lane): 0.6B, 32 frames, 7 alternating rounds
    (2026-12-03): one stream's RTF 1.77 (every core) / 1.84 (code predictor on one thread) / 1.73 (that and
    `--codec-threads 1`), eight streams 1.01 / 1.20 / 1.01, first audio 0.41 / 0.40 / 0.44 s; in an earlier
    run of 5 rounds, the strict partition 1.71 against 1.72. On one thread the codec takes 83-91 ms a frame,
    more than a frame lasts, and the code predictor 68-71 ms, as on two: neither side gains.
    Nor does a lower priority for the codec's threads (nice +10 on the lane's thread and on the ONNX Runtime
    pool it inherits, so that the talker and the code predictor never wait at a barrier for a core the codec
    holds): 0.6B, 2 AVX2 cores, a process per variant, 4 alternating pairs of 2 runs (2026-12-04): one
    stream's RTF 2.26 -> 2.62 (median), first audio 0.44 -> 0.54 s, eight streams 1.67 -> 1.78: the codec
    then falls behind the frames."""
    n = default_threads(threads)
    if not codec_overlap or n < 2:
        return StageThreads(n, n, n, codec_threads or n, 1)
    per_call = min(codec_threads or n, n)
    return StageThreads(n - 1, n, n, per_call, n // per_call)


WAIT_POLICY = "ACTIVE"
SPIN_COUNT = 300
"""OpenMP's waits for llama.cpp's threads (its CPU backend is built with OpenMP): spin `SPIN_COUNT` turns
(about 3 us) at a barrier, then sleep. libgomp's default spins about 3 ms: when another process takes
one of the cores, the spinning thread keeps its core while the thread it waits for cannot run, and
every barrier of every layer stalls (0.6B q8_0, 2 cores: real-time factor 2.9 quiet, 35 under
`stress-ng --cpu 2`). Sleeping at once (PASSIVE alone) survives that load (5.9) but pays a wake-up at
each barrier, which a virtual machine makes slow (talker step 36 ms against 20 ms spinning). 300 turns
keep the fast steps and the graceful degradation: side by side in `python -m bench.experiments omp-spin`
(2026-12-01), one stream 1.71 -> 1.60 quiet, equal under `stress-ng --cpu 1` and `--cpu 2` (2.52 / 2.53,
2.62 / 2.63); 10,000 turns already collapsed under two loads (4.73).

GOMP_SPINCOUNT sets the spin count, whatever the policy; the policy sets the *throttled* count, which
libgomp uses instead once it manages more threads than the process has CPUs: as soon as a second thread
calls llama.cpp (a server with two models, each engine on its thread) and keeps its own team. PASSIVE
throttles to 0, every barrier sleeps; no policy to 100 turns; ACTIVE to min(1000, GOMP_SPINCOUNT), the
same 300 turns. Hence ACTIVE here, which, with a spin count, still sleeps once idle. Talker steps
alone, a second thread's team alive (a one-off script, 2026-12-01, 0.6B q8_0): PASSIVE 34.5 ms, none
27, ACTIVE 21 (one team: 21 for all three). The full bench's *alone* talker step, taken on its worker's main
thread beside the engine's, was this case: 40 ms in its 2026-12-01 04:52 run with PASSIVE, 17 ms in the 06:58 run
with ACTIVE.
`python -m bench.experiments omp-policy`, two models served, two runs: one stream's RTF 1.69 / 1.65
(PASSIVE) -> 1.58 / 1.59 (ACTIVE); one model: 1.65 / 1.61 -> 1.62 / 1.55.
llama.cpp built without OpenMP (CMAKE_ARGS="-DGGML_OPENMP=OFF": ggml's own thread pool, whose barriers spin
without bound) measured and dropped: `python -m bench.experiments llama-builds`, 0.6B q8_0, 2026-12-03 on an
AVX2-only host: one stream equal quiet (RTF 2.55 / 2.53), eight streams 1.31 -> 1.68, and beside
`stress-ng --cpu 1` one stream 3.68 -> 8.49 (prefill 415 -> 1584 ms), eight streams 2.46 -> 6.25.
An operator's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins (either one turns this default off: ACTIVE alone
spins for ever)."""

OPENMP_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def import_llama() -> ModuleType:
    """`llama_cpp`, loaded with `WAIT_POLICY` and `SPIN_COUNT` in place: libgomp reads them once, when it
    is loaded, so every import of llama_cpp in this project goes through here."""
    if not any(v in os.environ for v in OPENMP_WAIT_VARS):
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    import llama_cpp

    return llama_cpp


_LOG_CALLBACK = None  # llama.cpp keeps a raw pointer: the ctypes callback must stay alive


def quiet_llama_logs() -> None:
    """Route llama.cpp's log output to nowhere (once per process)."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None:
        return
    llama_cpp = import_llama()
    _LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
