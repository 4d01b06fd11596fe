"""The orchestrator's side of a measurement worker (`bench.worker`), shared by `python -m bench`, its blocks and
`bench.experiments`: `Session` (a worker process holding one loaded model, driven one request line at a time),
`one_shot` (a worker that runs one task), the progress bar both feed, the time budget of optional runs, and the
environment every worker starts with."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from qwen3_tts_gguf.host.cpus import OPENMP_WAIT_VARS

from bench.common import ROOT

# As the bench was started (bench.cli imports this module first), before anything loads llama_cpp:
# `qwen3_tts_gguf.host.cpus.import_llama` sets the engine's OMP_WAIT_POLICY in the process that loads it (here:
# converting a model), and the workers must not inherit that: the official pipeline's PyTorch (libgomp too) runs
# as its users run it.
LAUNCH_OPENMP_WAITS = {k: os.environ.get(k) for k in OPENMP_WAIT_VARS}


def child_env(extra: dict | None = None) -> dict:
    """A worker's environment: this process's, OpenMP's wait variables as launched (loading llama_cpp here
    sets the engine's), then `extra` (None removes)."""
    env = dict(os.environ)
    for k, v in LAUNCH_OPENMP_WAITS.items():
        env.pop(k, None)
        if v is not None:
            env[k] = v
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


class Progress:
    """One tqdm bar for the whole run; workers' `@progress` lines become its postfix."""

    def __init__(self, bar):
        self.bar = bar

    def pump(self, stream, tail: list) -> None:
        for line in stream:
            if line.startswith("@progress "):
                self.bar.set_postfix_str(line[10:].strip()[:60])
            else:
                tail.append(line.rstrip())
                del tail[:-40]


class Session:
    """A `bench.worker session` process: one loaded model, operations on request."""

    def __init__(self, progress: Progress, label: str, kind: str, params: dict, timeout: float = 1800,
                 env: dict | None = None, python: str | None = None):
        self.label, self.timeout, self.progress = label, timeout, progress
        self.tail: list[str] = []
        # python: another interpreter (a peer engine's venv, bench.pipelines.peers)
        self.proc = subprocess.Popen([python or sys.executable, "-m", "bench.worker", "session", kind,
                                      json.dumps(params)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, env=child_env(env))
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=progress.pump, args=(self.proc.stderr, self.tail), daemon=True).start()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self._next()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _next(self) -> dict:
        try:
            line = self.lines.get(timeout=self.timeout)
        except queue.Empty:
            self.proc.kill()
            return {"error": f"no answer within {self.timeout:.0f} s"}
        if line is None:
            self.proc.wait(timeout=30)
            return {"error": f"worker exited with {self.proc.returncode}: " + " | ".join(self.tail[-5:])}
        result = json.loads(line)
        if "error" in result:
            self.progress.bar.write(f"[{self.label}] {result['error']}\n" + "\n".join(self.tail[-12:]))
        return result

    @property
    def ok(self) -> bool:
        return "error" not in self.ready

    def call(self, **op) -> dict:
        if not self.ok or self.proc.poll() is not None:
            return {"error": self.ready.get("error", "the worker is gone")}
        self.proc.stdin.write(json.dumps(op) + "\n")
        self.proc.stdin.flush()
        return self._next()

    def close(self) -> dict:
        summary = self.call(op="summary") if self.ok else dict(self.ready)
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except Exception:
            self.proc.kill()
        return summary


def one_shot(progress: Progress, task: str, params: dict, timeout: float = 1800) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        proc = subprocess.Popen([sys.executable, "-m", "bench.worker", task, json.dumps(params), str(out)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=child_env())
        tail: list[str] = []
        pump = threading.Thread(target=progress.pump, args=(proc.stderr, tail), daemon=True)
        pump.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        pump.join(timeout=5)
        result = json.loads(out.read_text()) if out.exists() else {"error": f"worker exited with {proc.returncode}"}
        if "error" in result:
            progress.bar.write(f"[{task}] failed: {result['error']}\n" + "\n".join(tail[-12:]))
        return result


class Budget:
    """Optional runs are skipped when they would end past the budget (quick mode)."""

    def __init__(self, seconds: float | None):
        self.seconds, self.start, self.skipped = seconds, time.perf_counter(), []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, what: str, estimate_s: float) -> bool:
        if self.seconds is None or self.elapsed() + estimate_s <= self.seconds:
            return True
        self.skipped.append(what)
        return False
