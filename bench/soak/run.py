"""`python -m bench soak [--minutes 30] [--model DIR] [--seed N] ...`: the server under mixed load.

Starts the real server (`python -m qwen3_tts_gguf serve`) as a subprocess on a free port of
127.0.0.1, measures the first-audio time of one fixed request unloaded (sequentially), then runs
mixed clients concurrently for `--minutes` (bench/soak/clients.py):

- polite: HTTP speech in every format through the `openai` SDK and httpx, SSE, WebSocket live text
  in small deltas, and a probe that repeats the unloaded request (its first-audio time under load);
- disruptive: cancels (a response closed mid-stream, WebSocket `cancel`), disconnects before the
  body is sent, while queued, after the status line, mid-body with an RST, WebSocket drops;
- hostile: bad JSON, invalid UTF-8, oversized bodies, out-of-range values, unknown fields with odd
  names, deep nesting, wrong methods and paths, malformed HTTP, slow senders, slow readers, idle
  connections and WebSockets, bad WebSocket messages.

Meanwhile a thread samples the server's RSS (/proc/<pid>/status VmRSS), threads, open files and
`GET /ready`. After the load: a settle, then `/ready` must show every model idle with all slots free,
and the gauges of `/ready` and `/metrics` must be back where they were before the load. The server's
log is scanned for tracebacks. Results: bench/out/soak-<stamp>.json and .md, and a summary on stdout.
Exit status 0 when the goals are met (no server error, no leak, no traceback), 1 otherwise.

Only 127.0.0.1 is ever contacted; every loop is bounded in count and time, and the run stops by
itself. Defaults suit a 2-core machine (a few clients of each kind, `max_frames` 12).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import OUT, ROOT, Meter, http_get
from bench.soak.clients import (
    ERROR_OUTCOMES,
    FINDING_OUTCOMES,
    HOST,
    Recorder,
    Target,
    http_speech,
    probe_body,
)

DEFAULT_SHAPE = "0.6b"
DEFAULT_QUANTS = {"0.6b": ("q8_0", "int8"), "1.7b": ("q8_0", "int8")}  # the users' default conversion
SMALL_QUANTS = ("f32", "fp32")  # tiny shapes: rows too narrow for q8_0 blocks everywhere


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="length of the load phase (default 30; 1 = smoke)")
    p.add_argument("--seed", type=int, default=0, help="seeds every client's choices (default 0)")
    p.add_argument("--model", type=Path, help="a converted model folder (default: a random-weight model built "
                                              "by bench/prepare.py, see --shape)")
    p.add_argument("--shape", default=DEFAULT_SHAPE, choices=("tiny", "tiny-0b6", "small", "0.6b", "1.7b"),
                   help="shape of the random-weight model when no --model (default 0.6b: talker q8_0, code "
                        "predictor int8; tiny shapes f32/fp32)")
    p.add_argument("--polite", type=int, default=3, help="polite clients (SDK, httpx, SSE, WebSocket; default 3)")
    p.add_argument("--disrupt", type=int, default=1, help="cancelling / disconnecting clients (default 1)")
    p.add_argument("--hostile", type=int, default=2, help="hostile clients (default 2)")
    p.add_argument("--no-probe", action="store_true", help="no probe client repeating the unloaded request")
    p.add_argument("--max-frames", type=int, default=12, help="max_frames of every request (80 ms each; default 12)")
    p.add_argument("--baseline", type=int, default=20,
                   help="sequential unloaded requests before the load (default 20; at most 4 minutes of them)")
    p.add_argument("--threads", type=int, default=2, help="server --threads (default 2)")
    p.add_argument("--max-streams", type=int, default=4,
                   help="server --max-streams (default 4: below the clients' peak, so requests also wait in the "
                        "engine's queue)")
    p.add_argument("--per-client", type=int, default=16,
                   help="server --max-requests-per-client (default 16: every soak client shares 127.0.0.1, "
                        "so the server's default cap, half the slots, would refuse most of the load; "
                        "0 keeps the server's default)")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra flag for `serve` (repeat; e.g. --server-arg=--max-queue=4)")
    p.add_argument("--request-timeout", type=float, default=180.0,
                   help="seconds one request may take before it counts as a timeout (default 180)")
    p.add_argument("--settle", type=float, default=60.0, help="seconds at most to wait for the server to go idle")
    p.add_argument("--sample-every", type=float, help="seconds between RSS samples (default 2, or 5 past 10 min)")
    p.add_argument("--out", type=Path, default=OUT, help="folder for soak-<stamp>.json/.md (bench/out/)")
    return p


# -- model and server -----------------------------------------------------------------------------

def resolve_model(args, log=print) -> tuple[Path, str]:
    """(model folder, how it was chosen)."""
    if args.model:
        return args.model.resolve(), f"given: {args.model}"
    from bench import prepare

    quant, cp = DEFAULT_QUANTS.get(args.shape, SMALL_QUANTS)
    ckpt, vocab = prepare.ensure_checkpoint(args.shape, log)
    folder = prepare.ensure_converted(ckpt, args.shape, quant, cp, args.threads, log)
    return folder, f"random weights, {args.shape} shape, talker {quant}, code predictor {cp}, {vocab} vocabulary"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]




class ServerFailed(RuntimeError):
    """The server did not start (its log tail is in the message)."""


def serve_has_flag(flag: str) -> bool:
    """Whether this checkout's `serve` takes `flag` (older servers have no limit flags)."""
    out = subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120).stdout
    return flag in out


class Server:
    """`python -m qwen3_tts_gguf serve` on 127.0.0.1 in its own process group, log to a file."""

    def __init__(self, model: Path, port: int, args, log_path: Path):
        self.port, self.log_path = port, log_path
        self.cmd = [sys.executable, "-m", "qwen3_tts_gguf", "serve", "--model", str(model), "--host", HOST,
                    "--port", str(port), "--threads", str(args.threads), "--max-streams", str(args.max_streams)]
        if args.per_client and serve_has_flag("--max-requests-per-client"):
            self.cmd += ["--max-requests-per-client", str(args.per_client)]
        self.cmd += args.server_arg
        self._log = open(log_path, "wb")
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        self.pid = self.proc.pid
        self.exit_code: int | None = None

    def wait_ready(self, limit_s: float = 600.0) -> dict:
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            if self.proc.poll() is not None:
                raise ServerFailed(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, data = http_get(self.port, "/ready", 5)
                if status == 200:
                    return json.loads(data)
            except OSError:
                pass
            time.sleep(0.5)
        raise ServerFailed(f"the server was not ready within {limit_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGINT)  # the group we started; uvicorn shuts down gracefully
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        self.exit_code = self.proc.returncode
        self._log.close()
        return self.exit_code


def proc_status(pid: int) -> dict:
    """VmRSS/VmHWM (MB), threads and open files of a process."""
    out: dict = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) / 1024
                elif key == "Threads":
                    out["threads"] = int(value)
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        pass
    return out


class Sampler(threading.Thread):
    """Every `every` s: the server's RSS, threads, fds and /ready load, tagged with the phase."""

    def __init__(self, server: Server, every: float, t0: float):
        super().__init__(daemon=True)
        self.server, self.every, self.t0 = server, every, t0
        self.samples: list[dict] = []
        self.phase = "startup"
        self.ready_failures = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.every)

    def sample(self) -> dict:
        s = {"t_s": round(time.monotonic() - self.t0, 2), "phase": self.phase, **proc_status(self.server.pid)}
        try:
            status, data = http_get(self.server.port, "/ready", 10)
            if status == 200:
                models = json.loads(data)["models"]
                s["active"] = sum(m.get("active", 0) for m in models)
                s["waiting"] = sum(m.get("waiting", 0) for m in models)
            else:
                self.ready_failures += 1
        except (OSError, ValueError, KeyError):
            self.ready_failures += 1
        self.samples.append(s)
        return s

    def stop(self) -> None:
        self._halt.set()
        if self.ident is not None:  # started
            self.join(timeout=30)


# -- figures -----------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    xs = sorted(values)
    k = max(0, min(len(xs) - 1, int(-(-q * len(xs) // 100)) - 1))
    return xs[k]


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) points, in MB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points)
    return None if den == 0 else sum((p[0] - mx) * (p[1] - my) for p in points) / den * 60


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict:
    """Prometheus text -> {"types": {name: type}, "values": {"name{labels}": float}}."""
    types, values = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            if m:
                try:
                    values[m.group(1) + (m.group(2) or "")] = float(m.group(3).replace("+Inf", "inf"))
                except ValueError:
                    pass
    return {"types": types, "values": values}


def gauges(metrics: dict) -> dict:
    return {k: v for k, v in metrics["values"].items() if metrics["types"].get(k.split("{")[0]) == "gauge"}


def by_label(metrics: dict, name: str, label: str, skip_paths: tuple[str, ...] = ()) -> dict:
    """Sum of `name` by one label's value (series whose path label is in skip_paths left out)."""
    out: dict = {}
    for key, value in metrics["values"].items():
        if key.split("{")[0] == name:
            path = re.search(r'path="([^"]*)"', key)
            if path and path.group(1) in skip_paths:
                continue
            m = re.search(label + r'="([^"]*)"', key)
            out[m.group(1) if m else ""] = out.get(m.group(1) if m else "", 0) + value
    return out


def numeric_fields(ready: dict) -> dict:
    """Every numeric field of every model in a /ready answer, flattened: {"model.field": value}."""
    out = {}

    def walk(prefix: str, obj) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
            out[prefix] = obj

    for m in ready.get("models", []):
        walk(m.get("id", "?"), {k: v for k, v in m.items() if k not in ("id", "default", "type")})
    for k, v in ready.items():
        if k != "models":
            walk(k, v)
    return out


def scan_log(path: Path) -> dict:
    """Tracebacks, ERROR/CRITICAL and WARNING lines of the server's log (access lines with 5xx too)."""
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    tracebacks, i = [], 0
    while i < len(lines):
        if lines[i].startswith("Traceback (most recent call last)"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or lines[j].startswith("Traceback")
                                      or lines[j].startswith("During handling") or lines[j].startswith("The above")
                                      or not lines[j].strip()):
                j += 1
            start = max(0, i - 2)
            tracebacks.append("\n".join(lines[start:min(j + 1, len(lines))]))
            i = j + 1
        else:
            i += 1
    errors = [ln for ln in lines if ln.startswith(("ERROR", "CRITICAL"))]
    warnings = [ln for ln in lines if ln.startswith("WARNING")]
    access_5xx = [ln for ln in lines if re.search(r'HTTP/1\.[01]" 5\d\d', ln)]
    groups: dict = {}
    for ln in warnings:
        key = re.sub(r"[0-9a-f]{32}|\d+(\.\d+)?", "#", ln)[:140]
        groups[key] = groups.get(key, 0) + 1
    unique_tb: dict = {}
    for tb in tracebacks:
        last = tb.strip().splitlines()[-1]
        unique_tb.setdefault(last, {"count": 0, "example": tb[-4000:]})
        unique_tb[last]["count"] += 1
    return {"tracebacks": len(tracebacks), "traceback_kinds": unique_tb, "error_lines": len(errors),
            "error_examples": errors[:20], "warning_lines": len(warnings), "warning_kinds": groups,
            "access_5xx": len(access_5xx), "access_5xx_examples": access_5xx[:10], "lines": len(lines)}


# -- phases -----------------------------------------------------------------------------------------

BASELINE_LIMIT_S = 240.0
"""The unloaded baseline stops after this long even when it has fewer than --baseline requests."""


async def baseline(target: Target, n: int) -> tuple[list[float], list[str]]:
    """n sequential probe requests after one warm-up: first-audio times, and anything that went wrong."""
    import httpx

    times, problems = [], []
    t0 = time.monotonic()
    async with httpx.AsyncClient(trust_env=False, timeout=target.timeout_s) as client:
        for i in range(n + 1):
            if i > 1 and time.monotonic() - t0 > BASELINE_LIMIT_S:
                problems.append(f"stopped after {i - 1} requests: the {BASELINE_LIMIT_S:.0f} s limit")
                break
            res = await http_speech(client, target, body=probe_body(target))
            if res.status != 200 or not res.complete:
                problems.append(f"status {res.status}, {res.error or ''} {res.data[:200]!r}")
            elif i:
                times.append(res.first_s)
    return times, problems


async def load(target: Target, args, rec: Recorder, deadline: float) -> dict:
    from bench.soak.load import run_clients

    return await run_clients(target, args, rec, deadline)


def run(args) -> dict:
    from bench import machine

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    info = machine.describe()
    model_dir, model_how = resolve_model(args)
    port = free_port()
    log_path = args.out / f"soak-{stamp}-server.log"
    t0 = time.monotonic()
    print(f"soak: serving {model_dir.name} on {HOST}:{port} (log {log_path})", flush=True)
    server = Server(model_dir, port, args, log_path)
    result: dict = {"started": time.time(), "machine": info, "model_dir": str(model_dir), "model": model_how,
                    "server_cmd": server.cmd[1:], "args": {k: (str(v) if isinstance(v, Path) else v)
                                                          for k, v in vars(args).items()}}
    every = args.sample_every or (2.0 if args.minutes <= 10 else 5.0)
    sampler = Sampler(server, every, t0)
    try:
        ready0 = server.wait_ready()
        result["startup_s"] = round(time.monotonic() - t0, 1)
        sampler.start()
        model_id = ready0["models"][0]["id"]
        target = Target(port=port, model=model_id, max_frames=args.max_frames, timeout_s=args.request_timeout)
        result["model_id"] = model_id
        result["slots"] = {m["id"]: m.get("free_slots") for m in ready0["models"]}

        sampler.phase = "baseline"
        print(f"soak: baseline, {args.baseline} sequential requests", flush=True)
        with Meter(pids=(server.pid,)) as m:
            base_times, base_problems = asyncio.run(baseline(target, args.baseline))
        result["baseline"] = {"n": len(base_times), "problems": base_problems, "background": m.background,
                              "p50_s": percentile(base_times, 50), "p95_s": percentile(base_times, 95),
                              "times_s": base_times, "loadavg": machine.loadavg()}
        time.sleep(1.0)
        idle_before = {"ready": json.loads(http_get(port, "/ready")[1]),
                       "metrics": parse_metrics(http_get(port, "/metrics")[1].decode()),
                       "proc": proc_status(server.pid)}

        sampler.phase = "load"
        rec = Recorder()
        print(f"soak: load for {args.minutes:g} min: {args.polite} polite + {0 if args.no_probe else 1} probe, "
              f"{args.disrupt} disruptive, {args.hostile} hostile clients", flush=True)
        load_t0 = time.monotonic()
        with Meter(pids=(server.pid,)) as m:
            deadline = time.monotonic() + args.minutes * 60
            load_info = asyncio.run(load(target, args, rec, deadline))
        load_t1 = time.monotonic()
        result["load"] = {**load_info, "wall_s": round(load_t1 - load_t0, 1), "background": m.background,
                          "server_cpu_s": None, "loadavg_end": machine.loadavg()}

        sampler.phase = "settle"
        settle = wait_idle(port, result["slots"], args.settle)
        time.sleep(2.0)  # let the last closes land before the end figures
        idle_after = {"ready": json.loads(http_get(port, "/ready")[1]),
                      "metrics": parse_metrics(http_get(port, "/metrics")[1].decode()), "proc": proc_status(server.pid)}
        sampler.sample()
        result["settle"] = settle
        result["recorder"] = {"counts": {k: dict(v) for k, v in sorted(rec.counts.items())},
                              "ttfa": {k: v for k, v in rec.ttfa.items()}, "events": rec.events,
                              "client_exceptions": rec.client_exceptions[:50]}
        result["ttfa"] = ttfa_table(rec, result["baseline"])
        result["leaks"] = leak_check(idle_before, idle_after, result["slots"])
        result["idle_before"], result["idle_after"] = summarize_idle(idle_before), summarize_idle(idle_after)
        result["server_metrics"] = {
            "requests_by_status": by_label(idle_after["metrics"], "qtts_http_requests_total", "status",
                                           skip_paths=("/ready", "/metrics", "/health")),
            "streams_by_reason": by_label(idle_after["metrics"], "qtts_speech_streams_total", "reason")}
    finally:
        try:
            sampler.stop()
        finally:
            result["server_exit_code"] = server.stop()
            result["loadavg_end"] = machine.loadavg()
    result["samples"] = sampler.samples
    result["ready_failures"] = sampler.ready_failures
    result["rss"] = rss_figures(sampler.samples)
    result["log"] = scan_log(log_path)
    result["log_path"] = str(log_path.relative_to(ROOT)) if log_path.is_relative_to(ROOT) else str(log_path)
    result["finished"] = time.time()
    result["verdict"] = verdict(result)
    result["stamp"] = stamp
    return result


def wait_idle(port: int, slots: dict, limit_s: float) -> dict:
    t0 = time.monotonic()
    last = None
    while True:
        try:
            status, data = http_get(port, "/ready", 10)
            last = json.loads(data) if status == 200 else {"status": status}
            if status == 200 and all(m.get("active") == 0 and m.get("waiting") == 0
                                     and m.get("free_slots") == slots.get(m["id"]) for m in last["models"]):
                return {"idle_after_s": round(time.monotonic() - t0, 1), "idle": True}
        except (OSError, ValueError):
            pass
        if time.monotonic() - t0 > limit_s:
            return {"idle_after_s": None, "idle": False, "last_ready": last}
        time.sleep(0.5)


def summarize_idle(snapshot: dict) -> dict:
    return {"ready": snapshot["ready"], "gauges": gauges(snapshot["metrics"]), "proc": snapshot["proc"]}


def leak_check(before: dict, after: dict, slots: dict) -> dict:
    """The goal: every model idle with all its slots free, and every gauge back where it was."""
    problems = []
    for m in after["ready"].get("models", []):
        if m.get("active") != 0 or m.get("waiting") != 0 or m.get("free_slots") != slots.get(m["id"]):
            problems.append(f"/ready {m['id']}: active {m.get('active')}, waiting {m.get('waiting')}, "
                            f"free_slots {m.get('free_slots')} of {slots.get(m['id'])}")
    fb, fa = numeric_fields(before["ready"]), numeric_fields(after["ready"])
    ready_diff = {k: [fb.get(k), fa.get(k)] for k in sorted(set(fb) | set(fa)) if fb.get(k) != fa.get(k)}
    gb, ga = gauges(before["metrics"]), gauges(after["metrics"])
    gauge_diff = {k: [gb.get(k), ga.get(k)] for k in sorted(set(gb) | set(ga)) if gb.get(k) != ga.get(k)}
    for k, (b, a) in ready_diff.items():
        problems.append(f"/ready field {k}: {b} before the load, {a} after")
    for k, (b, a) in gauge_diff.items():
        problems.append(f"/metrics gauge {k}: {b} before the load, {a} after")
    pb, pa = before["proc"], after["proc"]
    return {"problems": problems, "ready_fields": sorted(fa), "gauges": sorted(ga),
            "ready_diff": ready_diff, "gauge_diff": gauge_diff,
            "fds": [pb.get("fds"), pa.get("fds")], "threads": [pb.get("threads"), pa.get("threads")]}


def ttfa_table(rec: Recorder, base: dict) -> dict:
    rows = {"unloaded probe (baseline)": {"n": base["n"], "p50_s": base["p50_s"], "p95_s": base["p95_s"]}}
    for kind in sorted(rec.ttfa):
        if kind.startswith(("polite.", "probe")):
            xs = rec.ttfa[kind]
            rows[kind] = {"n": len(xs), "p50_s": percentile(xs, 50), "p95_s": percentile(xs, 95)}
    http = [x for k, xs in rec.ttfa.items() if k.startswith(("polite.sdk", "polite.httpx", "probe")) for x in xs]
    rows["all polite HTTP audio (loaded)"] = {"n": len(http), "p50_s": percentile(http, 50),
                                              "p95_s": percentile(http, 95)}
    return rows


def rss_figures(samples: list[dict]) -> dict:
    rss = [(s["t_s"], s["VmRSS"]) for s in samples if "VmRSS" in s]
    if not rss:
        return {}
    load = [(t, v) for (t, v), s in zip(rss, [s for s in samples if "VmRSS" in s]) if s["phase"] == "load"]
    half = load[len(load) // 2:] if load else []
    first_load = load[0][1] if load else None
    return {"start_mb": rss[0][1], "load_start_mb": first_load, "peak_mb": max(v for _, v in rss),
            "end_mb": rss[-1][1], "hwm_mb": max((s.get("VmHWM", 0) for s in samples), default=None),
            "slope_last_half_mb_per_min": slope_per_min(half), "slope_whole_load_mb_per_min": slope_per_min(load),
            "samples": len(rss)}


def verdict(result: dict) -> dict:
    rec = result.get("recorder", {}).get("counts", {})
    errors = {o: sum(c.get(o, 0) for c in rec.values()) for o in ERROR_OUTCOMES}
    findings = {o: sum(c.get(o, 0) for c in rec.values()) for o in FINDING_OUTCOMES}
    log = result["log"]
    leaks = result.get("leaks", {}).get("problems", ["no leak check (the run failed before it)"])
    ok = (not sum(errors.values()) and not leaks and not log["tracebacks"] and not log["access_5xx"]
          and result.get("settle", {}).get("idle", False))
    return {"ok": ok, "errors": errors, "findings": findings, "leaks": leaks, "tracebacks": log["tracebacks"],
            "access_5xx": log["access_5xx"],
            "client_exceptions": sum(c.get("client_exception", 0) for c in rec.values())}


# -- report -------------------------------------------------------------------------------------------

def _s(x, digits=3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def render(r: dict) -> str:
    m, v = r["machine"], r["verdict"]
    rss = r.get("rss", {})
    load = r.get("load", {})
    dirty = f" (+{m['dirty_files']} modified tracked files)" if m.get("dirty_files") else ""
    lines = [f"# Soak {r['stamp']}", "",
             f"**Verdict: {'PASS' if v['ok'] else 'FAIL'}** (server errors {sum(v['errors'].values())}, "
             f"leaks {len(v['leaks'])}, tracebacks {v['tracebacks']}, findings {sum(v['findings'].values())})", "",
             "| | |", "|---|---|",
             f"| commit | `{m['commit']}` {m['commit_subject']}{dirty} |",
             f"| date | {m['date']} |",
             f"| machine | {m['cpu']}, {m['cores']} cores, {m['ram_gib']:.0f} GiB |",
             f"| load average | {' '.join(m['loadavg_start'])} at the start, {' '.join(r.get('loadavg_end', []))} at "
             f"the end; other processes' CPU share: {_s(r.get('baseline', {}).get('background'), 2)} during the "
             f"baseline, {_s(load.get('background'), 2)} during the load |",
             f"| model | {r['model']} (`{Path(r['model_dir']).name}`), served as `{r.get('model_id')}` |",
             f"| server | `{' '.join(r['server_cmd'][2:])}` (startup {r.get('startup_s')} s) |",
             f"| load | {r['args']['minutes']:g} min ({load.get('wall_s')} s wall), seed {r['args']['seed']}: "
             f"{r['args']['polite']} polite + {'no' if r['args']['no_probe'] else '1'} probe, {r['args']['disrupt']} "
             f"disruptive, {r['args']['hostile']} hostile clients; max_frames {r['args']['max_frames']} |",
             "", "## Goals", "", "| figure | value | goal |", "|---|---|---|"]
    for o, n in v["errors"].items():
        lines.append(f"| {o} | {n} | 0 |")
    lines += [f"| tracebacks in the server log | {v['tracebacks']} | 0 |",
              f"| 5xx lines in the access log | {v['access_5xx']} | 0 |",
              f"| idle after the load | {r.get('settle', {}).get('idle')} after "
              f"{r.get('settle', {}).get('idle_after_s')} s | true |",
              f"| leaks (/ready, /metrics gauges) | {len(v['leaks'])} | 0 |"]
    for p in v["leaks"]:
        lines.append(f"| leak | {p} | |")
    for o, n in v["findings"].items():
        lines.append(f"| {o} (finding) | {n} | 0 |")
    lines.append(f"| exceptions in the soak's own clients | {v['client_exceptions']} | 0 |")
    lines += ["", "## Server RSS", "", "| start | at load start | peak | end | VmHWM | slope, last half of the load "
              "| slope, whole load | samples |", "|---|---|---|---|---|---|---|---|",
              f"| {_s(rss.get('start_mb'), 0)} MB | {_s(rss.get('load_start_mb'), 0)} MB | {_s(rss.get('peak_mb'), 0)} "
              f"MB | {_s(rss.get('end_mb'), 0)} MB | {_s(rss.get('hwm_mb'), 0)} MB | "
              f"{_s(rss.get('slope_last_half_mb_per_min'), 2)} MB/min | "
              f"{_s(rss.get('slope_whole_load_mb_per_min'), 2)} MB/min | {rss.get('samples')} |", ""]
    leaks = r.get("leaks", {})
    if leaks:
        lines += [f"Open files of the server before / after the load: {leaks['fds'][0]} / {leaks['fds'][1]}; "
                  f"threads {leaks['threads'][0]} / {leaks['threads'][1]}. /ready fields checked: "
                  f"{', '.join(leaks['ready_fields'])}; /metrics gauges: {', '.join(leaks['gauges'])}.", ""]
    lines += ["## Time to first audio (request sent -> first audio byte)", "",
              "| requests | n | p50, s | p95, s |", "|---|---|---|---|"]
    for name, row in r.get("ttfa", {}).items():
        lines.append(f"| {name} | {row['n']} | {_s(row['p50_s'])} | {_s(row['p95_s'])} |")
    lines += ["", "The probe repeats the baseline's request (pcm, fixed text and seed) under load. "
              "WebSocket figures count from the first `text` message.", "",
              "## Outcomes by client kind", ""]
    counts = r.get("recorder", {}).get("counts", {})
    outcomes = sorted({o for c in counts.values() for o in c},
                      key=lambda o: (o in ERROR_OUTCOMES + FINDING_OUTCOMES, o))
    lines += ["| kind | " + " | ".join(outcomes) + " |", "|---|" + "---|" * len(outcomes)]
    for kind, c in counts.items():
        lines.append(f"| {kind} | " + " | ".join(str(c.get(o, "")) for o in outcomes) + " |")
    sm = r.get("server_metrics", {})
    if sm:
        lines += ["", f"Server's own counters: requests by status (the soak's /ready and /metrics polls left out) "
                      f"{json.dumps(sm['requests_by_status'])}; "
                      f"streams by finish reason {json.dumps(sm['streams_by_reason'])}."]
    events = r.get("recorder", {}).get("events", [])
    if events:
        lines += ["", "## Errors and findings (first 40)", "", "| t, s | kind | outcome | request | detail |",
                  "|---|---|---|---|---|"]
        for e in events[:40]:
            lines.append(f"| {e['t_s']} | {e['kind']} | {e['outcome']} | {_cell(e['request'])} | "
                         f"{_cell(e['detail'])} |")
    log = r["log"]
    lines += ["", "## Server log", "",
              f"{log['lines']} lines; {log['tracebacks']} tracebacks, {log['error_lines']} ERROR "
              f"lines, {log['warning_lines']} WARNING lines, {log['access_5xx']} access lines with 5xx "
              f"(`{r['log_path']}`); server exit code {r.get('server_exit_code')}."]
    for last, tb in log["traceback_kinds"].items():
        lines += ["", f"Traceback ×{tb['count']}: `{last[:200]}`", "", "```", tb["example"][-2500:], "```"]
    if log["warning_kinds"]:
        lines += ["", "Warnings by kind:", ""] + [f"- ×{n} `{k}`" for k, n in
                                                  sorted(log["warning_kinds"].items(), key=lambda kv: -kv[1])[:15]]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.minutes <= 0:
        raise SystemExit("--minutes must be positive")
    try:
        result = run(args)
    except ServerFailed as e:
        print(f"soak: {e}", file=sys.stderr)
        return 2
    text = render(result)
    base = args.out / f"soak-{result['stamp']}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    base.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {base}.json and {base}.md")
    return 0 if result["verdict"]["ok"] else 1
