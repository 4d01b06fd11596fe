"""Prometheus metrics in the text exposition format (written by hand; no client library needed).

Counters and histograms are updated on the event loop only (middleware and response bodies), so
they need no lock; gauges of engine load are read from the engines when scraped.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from qwen3_tts_gguf.engine.runaway import RUNAWAY_COUNTS
from qwen3_tts_gguf.host.locks import device_lock_stats

from api.ops.lifecycle import PROCESS
from api.registry import ModelRegistry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFA_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)

Labels = tuple[tuple[str, str], ...]


def _labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Counter:
    """A monotonically increasing count per label set."""

    def __init__(self, name: str, help: str):
        self.name, self.help = name, help
        self.values: dict[Labels, float] = defaultdict(float)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] += amount

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels, value in sorted(self.values.items()):
            yield f"{self.name}{_labels(labels)} {_number(value)}"


class Histogram:
    """Cumulative buckets, sum and count per label set."""

    def __init__(self, name: str, help: str, buckets: Sequence[float]):
        self.name, self.help = name, help
        self.bounds = tuple(sorted(buckets))
        self.series: dict[Labels, list] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        counts, total = self.series.setdefault(key, [[0] * (len(self.bounds) + 1), 0.0])
        counts[bisect.bisect_left(self.bounds, value)] += 1
        self.series[key][1] = total + value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels, (counts, total) in sorted(self.series.items()):
            running = 0
            for bound, count in zip(self.bounds + (math.inf,), counts, strict=True):
                running += count
                yield f"{self.name}_bucket{_labels(labels, f'le={_quote(bound)}')} {running}"
            yield f"{self.name}_sum{_labels(labels)} {_number(total)}"
            yield f"{self.name}_count{_labels(labels)} {running}"


def _quote(bound: float) -> str:
    return f'"{_number(bound)}"'


def real_time_factor(reason: str, audio_s: float, wall_s: float) -> float | None:
    """Wall time over audio time of a finished stream; None when it made no audio or was cut short."""
    return wall_s / audio_s if audio_s > 0 and reason not in ("cancelled", "error") else None


class Metrics:
    """The server's metrics: HTTP requests, finished streams, first-audio latency, real-time factor."""

    def __init__(self) -> None:
        self.requests = Counter("qtts_http_requests_total", "HTTP requests by route and status code.")
        self.streams = Counter("qtts_speech_streams_total",
                               "Speech streams by model and how they ended (eos, max_frames, budget, "
                               "cancelled, error).")
        self.audio_seconds = Counter("qtts_audio_seconds_total", "Seconds of audio generated, by model.")
        self.first_audio = Histogram("qtts_time_to_first_audio_seconds",
                                     "From request arrival to the first audio bytes sent, by model.", TTFA_BUCKETS)
        self.real_time_factor = Histogram("qtts_real_time_factor",
                                          "Wall time over audio duration per finished stream (< 1 is faster "
                                          "than real time), by model.", RTF_BUCKETS)

    def stream_finished(self, model: str, reason: str, audio_s: float, wall_s: float,
                        first_audio_s: float | None) -> None:
        """Record one speech stream that ended (on its own, by the client leaving, or by an error)."""
        self.streams.inc(model=model, reason=reason)
        if first_audio_s is not None:
            self.first_audio.observe(first_audio_s, model=model)
        if audio_s > 0:
            self.audio_seconds.inc(audio_s, model=model)
        rtf = real_time_factor(reason, audio_s, wall_s)
        if rtf is not None:
            self.real_time_factor.observe(rtf, model=model)

    def render(self, registry: ModelRegistry, *, websocket_sessions: int = 0, detached_streams: int = 0,
               draining: bool = False) -> str:
        """The exposition text; engine gauges read now, with the open sockets and the drain state."""
        lines: list[str] = []
        for metric in (self.requests, self.streams, self.audio_seconds, self.first_audio, self.real_time_factor):
            lines.extend(metric.render())
        loads = [(served.id, served.engine.load()) for served in registry.models]
        for key, name, help in (("active", "qtts_active_streams", "Streams being synthesised, by model."),
                                ("waiting", "qtts_queue_depth", "Requests waiting for a slot, by model."),
                                ("free_slots", "qtts_free_slots", "Free stream slots, by model."),
                                ("waiting_text", "qtts_streams_waiting_for_text",
                                 "Live-text streams (WebSocket) waiting for their first words, by model.")):
            lines += [f"# HELP {name} {help}", f"# TYPE {name} gauge"]
            lines += [f"{name}{_labels((('model', model),))} {load[key]}" for model, load in loads]
        for name, help, value in (
                ("qtts_websocket_sessions", "Open WebSocket sessions (sockets).", websocket_sessions),
                ("qtts_detached_streams", "Resumable /v1/ws streams whose socket was lost, waiting for a resume.",
                 detached_streams),
                ("qtts_draining", "1 while the server drains before it stops, else 0.", int(draining))):
            lines += [f"# HELP {name} {help}", f"# TYPE {name} gauge", f"{name} {value}"]
        lines += ["# HELP qtts_runaways_total Runaways the engine caught, by model, kind (loop: codebook 0 repeated; "
                  "budget: a segment used up the frames its text may take) and action (end, retry).",
                  "# TYPE qtts_runaways_total counter"]
        for served in registry.models:
            stats = served.engine.stats
            lines += [f"qtts_runaways_total{_labels((('model', served.id), ('kind', kind), ('action', action)))} "
                      f"{stats[f'runaway_{kind}_{action}']}" for kind, action in RUNAWAY_COUNTS]
        lines += device_lock_lines()  # how long work waited for a GPU device (none on CPU)
        return "\n".join(lines) + "\n"


def device_lock_lines() -> list[str]:
    """The device locks' counters (`host/locks.py`: none on a CPU)."""
    stats = device_lock_stats()
    lines: list[str] = []
    for metric, key, kind, text in (
            ("qtts_device_wait_seconds_total", "waited_s", "counter", "seconds work waited for a GPU device's lock"),
            ("qtts_device_busy_seconds_total", "held_s", "counter", "seconds a GPU device's lock was held"),
            ("qtts_device_acquisitions_total", "acquisitions", "counter", "times a GPU device's lock was taken"),
            ("qtts_device_max_wait_seconds", "max_wait_s", "gauge", "longest single wait for a GPU device's lock")):
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
        lines += [f'{metric}{{device="{name}"}} {values[key]!r}' for name, values in sorted(stats.items())]
    return lines


router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse, include_in_schema=False)
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus scrape endpoint."""
    state = request.app.state.qtts
    # api/protocols/resume.py, made by the first resumable stream
    resume = getattr(request.app.state, "qtts_resume", None)
    return PlainTextResponse(state.metrics.render(state.registry, websocket_sessions=len(PROCESS.sessions),
                                                  detached_streams=len(resume.detached) if resume else 0,
                                                  draining=PROCESS.draining), media_type=CONTENT_TYPE)
