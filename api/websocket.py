"""WebSocket `/v1/ws`: text in as it is written (an LLM's tokens, a typist's keys), audio out as it is ready.

One connection carries any number of utterances ("sessions"), one at a time:

    client -> {"type": "start", "voice": "ryan", "format": "pcm", ...}   # the speech request's fields
    server <- {"type": "started", "id", "model", "voice", "sample_rate", "channels", "format", ...}
    client -> {"type": "text", "text": "Hel"}  {"type": "text", "text": "lo th"} ...
    server <- binary frames: audio (pcm = s16le, 24 kHz, mono) as soon as each chunk exists
    client -> {"type": "stop"}      (finish speaking)   or   {"type": "cancel"}   (stop now)
    server <- {"type": "done", "id", "finish_reason", "usage": {...}, "audio_s", "limit", "timings": {...}}

Every session always runs in the streaming text mode: the engine speaks each token once its
tokenization is final, so audio starts long before the sentence is complete, and the codes are
exactly those of the same text sent at once (same seed). A session that got `started` ends with
exactly one `done` (finish_reason eos, max_frames, budget, cancelled or error) unless the socket
itself ends first; the socket then takes the next `start`. An `error` event ({"type": "error",
"error": {message, type, param, code}}, OpenAI's envelope) never ends a session by itself: a
rejected message changes nothing, and a session that fails reports `error` and then `done` with
finish_reason "error". Error texts are written for clients: engine and encoder failures say only
that they happened (with the session id; the detail is in the server log).

Handshake checks, authentication (`?api_key=`, the subprotocol `bearer.KEY` — offer `qtts.v1` with
it —, or `Authorization: Bearer`) and the socket, message-size and send limits are every socket
protocol's: `api/sockets.py`. Each session is also one of the client's speech streams
(`client_limit` on `start`). The text limits (`ws_max_session_chars`: text past it is refused,
`string_above_max_length`, the session goes on; `ws_idle_timeout_s` and `ws_max_session_s`: the
session is stopped as if `stop` had come, and its `done` says `"limit": "idle_timeout"` or
`"session_length"`) are `api/utterance.py`'s.

A client that disconnects cancels its stream; the engine frees the slot at its next iteration.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from qwen3_tts_gguf.request import AudioChunk

from .errors import APIError, invalid_request, validation_error
from .schemas import SpeechRequest
from .sockets import SocketConnection, error_event, serve_socket
from .state import AppState
from .synthesis import plan_speech
from .utterance import Ending, Utterance, open_utterance, pump, record, settle, start_watch
from .voice_profiles import model_for_voice

log = logging.getLogger("api.websocket")

router = APIRouter(tags=["audio"])

PATH = "/v1/ws"
SUBPROTOCOL = "qtts.v1"
NOT_FOR_LIVE_TEXT = ("input", "text_mode", "stream_format")
"""Speech-request fields a session ignores (the text comes in deltas, always in streaming mode)."""
_PLACEHOLDER_INPUT = "(live text)"


def speech_request(message: dict[str, Any], default_model: str) -> tuple[SpeechRequest, tuple[str, ...]]:
    """A `start` message validated as a speech request: (request, fields ignored). APIError 400."""
    fields = {k: v for k, v in message.items() if k != "type"}
    ignored = tuple(k for k in NOT_FOR_LIVE_TEXT if fields.pop(k, None) is not None)
    if "format" in fields:
        if "response_format" in fields and fields["response_format"] != fields["format"]:
            raise invalid_request("Give either 'format' or 'response_format', not both.", param="format")
        fields["response_format"] = fields.pop("format")
    fields.setdefault("response_format", "pcm")
    fields.setdefault("model", default_model)
    try:
        body = SpeechRequest.model_validate({**fields, "input": _PLACEHOLDER_INPUT, "text_mode": "streaming"})
    except ValidationError as e:
        raise validation_error(RequestValidationError(e.errors())) from None
    return body, tuple(sorted(body.ignored_fields + ignored))


def done_event(utterance: Utterance, ending: Ending) -> dict[str, Any]:
    return {
        "type": "done", "id": utterance.id, "finish_reason": ending.reason, "usage": utterance.usage(),
        "audio_s": utterance.audio_s, "limit": utterance.limit, "idle_timeout": utterance.limit == "idle_timeout",
        "timings": utterance.timings(),  # first_audio_s: from the first text message to the first audio sent
    }


class Connection(SocketConnection):
    """One `/v1/ws` socket: runs at most one utterance at a time."""

    protocol_name = "websocket"

    def __init__(self, websocket: WebSocket, state: AppState, client: str = ""):
        super().__init__(websocket, state, client)
        self.session: Utterance | None = None
        self._last_pump = None
        """The latest session's pump (it sends that session's `done`)."""

    def handlers(self):
        return {"start": self.start, "text": self.text, "stop": self.stop, "cancel": self.cancel}

    def error_event(self, error: APIError, message: dict[str, Any] | None = None) -> dict[str, Any]:
        return error_event(error, **({"id": self.session.id} if self.session is not None else {}))

    @property
    def busy(self) -> bool:
        """An utterance runs or is sending its `done` (the drain lets it finish: `lifecycle.Drainable`)."""
        return self.session is not None or (self._last_pump is not None and not self._last_pump.done())

    def on_end(self) -> None:
        if self.session is not None:
            self.session.cancel()

    async def release(self) -> None:
        await settle(self.session)

    # -- messages ---------------------------------------------------------------------------------
    async def start(self, message: dict[str, Any]) -> None:
        if self.session is not None:
            raise invalid_request("A stream is already running on this socket: send 'stop' or 'cancel' and "
                                  "wait for 'done' before the next 'start'.", code="stream_active")
        registry = self.state.registry
        body, ignored = speech_request(message, registry.default.id)
        served = model_for_voice(registry, body.model, body.voice_id, self.state.voice_profiles)  # as the route
        plan = replace(plan_speech(body, served, self.state.voice_profiles), ignored_fields=ignored)
        session = await open_utterance(self.ws, self.state, plan, body.response_format, body.speed, live=True)
        self.session = session
        await self.send_event({
            "type": "started", "id": session.id, "model": plan.served.id, "voice": plan.voice.label,
            "sample_rate": session.sample_rate, "channels": 1, "format": body.response_format,
            "instructions_ignored": plan.voice.instructions_ignored, "voice_ignored": plan.voice.voice_ignored,
            "ignored_fields": list(ignored),
        })
        session.pump = self._last_pump = asyncio.create_task(self._pump(session), name=f"ws-pump-{session.id[:8]}")
        start_watch(session, self.limits)

    async def text(self, message: dict[str, Any]) -> None:
        session = self._require_session("text")
        delta = message.get("text")
        if not isinstance(delta, str):
            raise invalid_request("A text message needs 'text': a string.", param="text",
                                  code="missing_required_parameter" if delta is None else "invalid_value")
        session.check_text(delta, self.limits)
        session.push(delta)

    async def stop(self, _: dict[str, Any]) -> None:
        self._require_session("stop").stop()

    async def cancel(self, _: dict[str, Any]) -> None:
        """Stop at once; audio not yet sent is dropped. Idle: nothing to do (a cancel racing a `done`)."""
        if self.session is not None:
            self.session.cancel()

    def _require_session(self, kind: str) -> Utterance:
        if self.session is None:
            raise invalid_request(f"'{kind}' before 'start': open a stream with a 'start' message first.",
                                  param="type", code="no_active_stream")
        return self.session

    # -- audio ------------------------------------------------------------------------------------
    async def _pump(self, session: Utterance) -> None:
        """Binary frames as the audio comes; then `done` (and `error` first if it failed)."""

        async def deliver(data: bytes, _: AudioChunk | None) -> None:
            await self.send_bytes(data)
            if not self.open:  # the client left (or was ended) while we were sending
                session.cancel()

        ending = await pump(session, deliver)
        done = done_event(session, ending)
        record(self.state, session, ending, PATH)
        if self.session is session:
            self.session = None  # the next `start` is welcome from here on
        if ending.error is not None:
            await self.send_event(error_event(ending.error, id=session.id))
        await self.send_event(done)


@router.websocket(PATH)
async def speech_socket(websocket: WebSocket) -> None:
    """Live text to speech; see the module docstring for the protocol."""
    await serve_socket(websocket, Connection, subprotocol=SUBPROTOCOL)


__all__ = ["router", "PATH", "SUBPROTOCOL", "Connection", "speech_request"]
