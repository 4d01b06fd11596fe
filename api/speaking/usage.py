"""What one stream used, in one place: the `usage` object every route reports, and the usage log.

`usage(...)` builds the object that `/v1/ws` `done` (`Utterance.usage()`), `/v1/realtime`
`response.done` and the speech route's SSE `speech.audio.done` (`SpeechStream.usage()`) carry:

    input_tokens           text tokens the engine read (OpenAI's name)
    output_tokens          codec frames made (OpenAI's name; 12.5 frames a second)
    total_tokens           the sum
    characters             characters of the raw text taken (the speech route's `input`; a live
                           stream's accepted deltas)
    normalized_characters  characters spoken after text normalization, when the engine normalized the
                           text (`SynthesisResult.normalized_chars`); null otherwise (normalization off,
                           or the result not known: a stream its client left)
    audio_seconds          seconds of audio made and sent, at the model's rate before `speed`
    frames                 codec frames made (= output_tokens)
    first_audio_s          seconds to the first audio sent: from the request's arrival (HTTP), from
                           the first text (sockets); null when no audio was sent
    runaways               runaways the engine caught (`SynthesisResult.runaway`): a segment whose
                           codebook 0 looped, or that used up its frame budget; 0 when none or unknown
    runaway_retries        of those, loops retried with a new random state (`--runaway retry`)

The usage log (`serve --usage-log PATH`, `QTTS_USAGE_LOG`) gets one JSON line per finished stream
of every route (`USAGE_LOG_FIELDS`): plain audio responses, whose body has no room for usage, are
accounted there only. Lines are appended atomically: the file is opened with O_APPEND for each
line and the line goes out in one `write()` (a few hundred bytes; the kernel appends a regular
file's single write as one piece, so concurrent streams, even other processes on the same file,
never interleave), under a process lock besides. Opening per line also follows log rotation.
The API key never appears, only `key_id`, a fingerprint of it (`key_id`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("api.speaking.usage")

USAGE_FIELDS = ("input_tokens", "output_tokens", "total_tokens", "characters", "normalized_characters",
                "audio_seconds", "frames", "first_audio_s", "runaways", "runaway_retries")
USAGE_LOG_FIELDS = ("time", "request_id", "route", "stream_format", "response_format", "model", "voice", "key_id",
                    "finish_reason", "usage")
"""One usage log line: `time` (UTC, ISO 8601, when the stream finished), `request_id` (the HTTP
request's X-Request-Id, or the socket utterance's id), `route`, `stream_format` ("audio" or "sse"
on the speech route, null on sockets), `response_format`, `model`, `voice`, `key_id` (null on an open
server), `finish_reason` and `usage` (the object above, as the client saw it)."""


def usage(result: Any, *, characters: int, samples: int, sample_rate: int, first_audio_s: float | None,
          frames_taken: int = 0) -> dict[str, Any]:
    """The usage object of one stream. `result` is its SynthesisResult (None while unknown: a stream
    its client left; then `frames_taken`, the frames of the audio taken so far, stand in)."""
    text_tokens = result.text_tokens if result is not None else 0
    frames = result.frames if result is not None else frames_taken
    normalized = getattr(result, "normalized_chars", None)
    runaway = getattr(result, "runaway", None) or []
    return {
        "input_tokens": text_tokens, "output_tokens": frames, "total_tokens": text_tokens + frames,
        "characters": characters,
        "normalized_characters": normalized if isinstance(normalized, int) and not isinstance(normalized, bool)
        else None,
        "audio_seconds": round(samples / sample_rate, 4) if sample_rate else 0.0,
        "frames": frames,
        "first_audio_s": None if first_audio_s is None else round(max(first_audio_s, 0.0), 4),
        "runaways": len(runaway),
        "runaway_retries": sum(event["action"] == "retry" for event in runaway),
    }


def key_id(api_key: str | None) -> str | None:
    """A fingerprint that names an API key in the usage log (never the key): "sha256:" and the first
    16 hex digits of its SHA-256; None on an open server."""
    if not api_key:
        return None
    return "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


class UsageLog:
    """Appends one JSON line per finished stream to `path` (module docstring)."""

    _lock = threading.Lock()

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._failing = False

    def check(self) -> None:
        """OSError unless the file can be opened for appending (created when missing)."""
        os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640))

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` as one line; a failure is logged (once until a write succeeds), never raised."""
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=True, default=str) + "\n").encode()
        try:
            with self._lock:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
                try:
                    written = os.write(fd, line)
                finally:
                    os.close(fd)
            if written != len(line):  # only a full disk cuts a regular file's write short
                raise OSError(f"short write ({written} of {len(line)} bytes)")
            self._failing = False
        except OSError as e:
            if not self._failing:
                log.warning("usage log %s: cannot append (%s); lines are lost until it can", self.path, e)
            self._failing = True

    def record(self, *, request_id: str | None, route: str, model: str, voice: str | None,
               response_format: str | None, finish_reason: str, usage: dict[str, Any],
               key_id: str | None = None, stream_format: str | None = None) -> None:
        self.write({"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                    "request_id": request_id, "route": route, "stream_format": stream_format,
                    "response_format": response_format, "model": model, "voice": voice, "key_id": key_id,
                    "finish_reason": finish_reason, "usage": usage})


_LOGS: dict[Path, UsageLog] = {}
_LOGS_LOCK = threading.Lock()


def usage_log(path: Path | str | None) -> UsageLog | None:
    """The UsageLog of `path` (one per path in this process), or None without a path."""
    if path is None:
        return None
    path = Path(path)
    with _LOGS_LOCK:
        found = _LOGS.get(path)
        if found is None:
            found = _LOGS[path] = UsageLog(path)
        return found
