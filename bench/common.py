"""Shared by the orchestrator and the workers: the fixed workload, clocks, CPU and memory meters."""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("QTTS_BENCH_CACHE", ROOT / "bench" / "cache"))
OUT = ROOT / "bench" / "out"

# The reference-harness §4 workload: speaker ryan, English, one 15-word sentence, non-streaming layout.
TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind distant hills."
SPEAKER = "ryan"
LANGUAGE = "english"
TEXT_MODE = "non-streaming"
# Time to first audio: a sentence the engine has not seen in that run (each takes the next one),
# so its text rows are projected on request like a user's new text.
LATENCY_TEXTS = (
    "Good morning, your train to Berlin leaves from platform seven in ten minutes.",
    "Please remember to water the plants on the balcony before you leave tonight.",
    "The meeting has been moved to Thursday afternoon because of the holiday.",
    "Our new library opens next week with a reading room for children.",
    "Turn left at the bakery, then walk straight until you see the river.",
    "Several volunteers cleaned the beach after the storm on Saturday morning.",
    "Dinner is ready, so wash your hands and come to the kitchen table.",
    "Scientists measured the glacier again and found it had shrunk by a metre.",
    "The concert starts at eight, but the doors open an hour earlier.",
    "Thank you for calling; all of our agents are currently helping other customers.",
    "Heavy snow is expected in the mountains, and several passes may close.",
    "She practised the violin every evening until the melody sounded effortless.",
)
# The chunk-ramp check: about half a minute of speech in one request.
LONG_TEXT = (
    "Once upon a time, in a village between two rivers, there lived a clockmaker who never slept. "
    "Every night he repaired the clocks of his neighbours, and every morning he returned them, "
    "ticking and polished, to their doorsteps. Nobody knew how he did it, and nobody asked, because "
    "the village had never once been late for anything. Then one winter the rivers froze, the roads "
    "closed, and the clockmaker ran out of the tiny springs he needed. So he climbed the hill behind "
    "the church, opened the old tower clock, and took its great spring apart, one coil at a time."
)
LONG_FRAMES = 375  # 30 s of audio
SAMPLE_RATE = 24000
FRAME_RATE = 12.5


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def peak_rss_mb() -> float:
    """This process's peak resident set size, MiB.

    VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a worker started by a big parent
    would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_file_mb() -> float | None:
    """The part of this process's RSS that is pages of mapped files (RssFile: clean pages the kernel may
    drop and read again, shared with other processes mapping the same files), MiB; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("RssFile:"))
    except (OSError, StopIteration):
        return None


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


@dataclass
class Meter:
    """Wall time, this process's CPU time, and the CPU that *other* processes used meanwhile.

    background = other processes' busy CPU / (wall * cores): 0 on a quiet machine, 0.5 when
    another job kept one of two cores busy. Every figure in the report carries it, because the
    development machine is shared.
    """

    wall: float = 0.0
    cpu: float = 0.0
    background: float = 0.0
    pids: tuple = ()  # other processes that belong to the measurement (a server we started)

    def _own_cpu(self) -> float:
        t = os.times()
        total = t.user + t.system
        hz = os.sysconf("SC_CLK_TCK")
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / hz  # utime, stime
            except (OSError, IndexError, ValueError):
                pass
        return total

    def __enter__(self) -> "Meter":
        self._t = time.perf_counter()
        self._cpu = self._own_cpu()
        self._busy = _busy_jiffies()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._t
        self.cpu = self._own_cpu() - self._cpu
        busy, total = _busy_jiffies()
        d_busy, d_total = busy - self._busy[0], total - self._busy[1]
        hz = os.sysconf("SC_CLK_TCK")
        other = max(d_busy / hz - self.cpu, 0.0)
        self.background = min(other / max(d_total / hz, 1e-9), 1.0) if d_total else 0.0

    def as_dict(self) -> dict:
        return {"wall_s": self.wall, "cpu_s": self.cpu, "background": self.background}


def wait_for_quiet(max_wait_s: float, threshold: float = 0.15, window_s: float = 0.5, pids: tuple = ()) -> dict:
    """Wait (at most max_wait_s) until other processes use less than `threshold` of the CPUs
    over a short window. Returns how long it waited and the last background share seen."""
    start = time.perf_counter()
    while True:
        with Meter(pids=pids) as m:
            time.sleep(window_s)
        waited = time.perf_counter() - start
        if m.background < threshold or waited >= max_wait_s:
            return {"waited_s": waited, "background_before": m.background}


def progress(message: str) -> None:
    """Worker -> orchestrator progress line (the orchestrator shows it on its progress bar)."""
    import sys

    print(f"@progress {message}", file=sys.stderr, flush=True)


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET http://127.0.0.1:PORT/PATH: (status, body). Benchmarks only ever talk to loopback."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
