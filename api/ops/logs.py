"""What the server logs, and how: `--log-format text` (as before, uvicorn's lines) or `json`.

json: every log record is one JSON object on one line (`time`, `level`, `logger`, `message`, the
`request_id` of the request being served when there is one, `exception` with the traceback), and
uvicorn's access lines give way to one access record per HTTP request and per WebSocket utterance
(logger `api.access`, fields `ACCESS_FIELDS`), all written by `log_access`. HTTP records come from
`AccessLog`; the speech route adds what its stream did (`note_stream`, from `SpeechStream.close`);
Socket utterances are recorded by `utterance.record`.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any, Literal

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.ops import headers

TEXT_FORMAT = "%(levelname)s:     %(name)s: %(message)s"
ACCESS_FIELDS = ("request_id", "method", "route", "status", "model", "voice", "finish_reason", "frames",
                 "audio_s", "ttfa_s", "rtf", "elapsed_s")
"""An access record's fields (null when they do not apply): `ttfa_s` is the time to first audio (HTTP:
from arrival to the first audio bytes; WebSocket: from the first text), `rtf` the real-time factor
(wall time over audio time; none for WebSocket utterances, which go at the writer's pace)."""

access_log = logging.getLogger("api.access")
_current: ContextVar[dict[str, Any] | None] = ContextVar("qtts_access_record", default=None)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        access = getattr(record, "access", None)
        current = _current.get()
        if access is not None:
            out.update(access)
        elif current is not None:
            out["request_id"] = current["request_id"]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(log_format: Literal["text", "json"]) -> dict[str, Any]:
    """Set up the process's logging for `log_format`; returns the uvicorn settings that go with it."""
    if log_format == "text":
        logging.basicConfig(level=logging.INFO, format=TEXT_FORMAT)
        access_log.setLevel(logging.WARNING)  # uvicorn's access lines say it in text mode
        return {}
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    access_log.setLevel(logging.INFO)
    logging.captureWarnings(True)
    return {"log_config": None, "access_log": False}  # uvicorn's records reach the root handler


def access_record(**fields: Any) -> dict[str, Any]:
    """A record with every field of ACCESS_FIELDS (None unless given)."""
    return {**dict.fromkeys(ACCESS_FIELDS), **fields}


def log_access(record: dict[str, Any]) -> None:
    """Write one access record."""
    access_log.info("%s %s %s", record["method"], record["route"], record["status"], extra={"access": record})


def note_stream(**fields: Any) -> None:
    """Add what a speech stream did to the access record of the request being served (if any)."""
    current = _current.get()
    if current is not None:
        current.update(fields)


class AccessLog:
    """ASGI middleware: one access record per HTTP request (inside `RequestObserver`, which names it)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.get("state", {})
        record = access_record(request_id=state.get("request_id"), method=scope["method"], status=500)
        started = state.get("received_at") or time.monotonic()
        token = _current.set(record)

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent = Headers(raw=message.get("headers", []))
                record.update(status=message["status"], model=sent.get(headers.MODEL) or record["model"],
                              voice=sent.get(headers.VOICE))
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            _current.reset(token)
            record.update(route=getattr(scope.get("route"), "path", None) or scope["path"],
                          elapsed_s=round(time.monotonic() - started, 4))
            log_access(record)
