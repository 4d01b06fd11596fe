"""WebSocket `/v1/ws`: text in as it is written (an LLM's tokens, a typist's keys), audio out as it is ready.

One connection carries any number of utterances ("sessions"), one at a time:

    client -> {"type": "start", "voice": "ryan", "format": "pcm", ...}   # the speech request's fields
    server <- {"type": "started", "id", "model", "voice", "sample_rate", "channels", "format", ...}
    client -> {"type": "text", "text": "Hel"}  {"type": "text", "text": "lo th"} ...
    server <- binary frames: audio (pcm = s16le, 24 kHz, mono) as soon as each chunk exists
    client -> {"type": "stop"}      (finish speaking)   or   {"type": "cancel"}   (stop now)
    server <- {"type": "done", "id", "finish_reason", "usage": {...}, "audio_s", "timings": {...}}

Every session always runs in the streaming text mode: the engine speaks each token once its
tokenization is final, so audio starts long before the sentence is complete, and the codes are
exactly those of the same text sent at once (same seed). A session that got `started` ends with
exactly one `done` (finish_reason eos, max_frames, budget, cancelled or error); the socket then
takes the next `start`. An `error` event ({"type": "error", "error": {message, type, param, code}},
OpenAI's envelope) never ends a session by itself: a rejected message changes nothing, and a session
that fails reports `error` and then `done` with finish_reason "error".

Authentication (the HTTP middleware does not see WebSockets): `?api_key=KEY`, the subprotocol
`bearer.KEY` (what a browser can send; offer `qtts.v1` with it), or `Authorization: Bearer KEY`.
Browsers do not apply CORS to WebSockets, so a connection whose `Origin` is neither this server's
own host nor one of `--cors-origin` is refused: any web page could otherwise make the server talk.
Refusals are an `error` event, then close code 1008.

A client that disconnects cancels its stream; the engine frees the slot at its next iteration.
A session that gets no `text` for IDLE_TIMEOUT_S seconds (a forgotten socket) is finished by the
server as if `stop` had come (cancelled when it never got any text), so it cannot hold an engine
slot forever; its `done` says `"idle_timeout": true`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, WebSocket
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import Headers

from qwen3_tts_gguf.audio_encoding import StreamingEncoder
from qwen3_tts_gguf.scheduler import Stream

from .errors import (
    SERVER_ERROR,
    APIError,
    invalid_request,
    synthesis_failed,
    unauthorized,
    validation_error,
)
from .middleware import bearer_token, key_matches
from .schemas import MAX_INPUT_CHARS, SpeechRequest
from .state import AppState, get_state
from .streaming import OffloadedEncoder
from .synthesis import SpeechPlan, plan_speech, start_stream
from .voice_profiles import model_for_voice

log = logging.getLogger("api.websocket")

router = APIRouter(tags=["audio"])

PATH = "/v1/ws"
SUBPROTOCOL = "qtts.v1"
KEY_SUBPROTOCOL_PREFIX = "bearer."
CLOSE_POLICY_VIOLATION = 1008
MAX_SESSION_CHARS = MAX_INPUT_CHARS
"""Text one session may take, as for `input` (longer answers: one session per paragraph). The
engine's TextFeed re-tokenizes its whole buffer on every delta, so this also bounds that cost."""
NOT_FOR_LIVE_TEXT = ("input", "text_mode", "stream_format")
"""Speech-request fields a session ignores (the text comes in deltas, always in streaming mode)."""
_PLACEHOLDER_INPUT = "(live text)"
IDLE_TIMEOUT_S: float | None = 30.0
"""Seconds a session may go without a `text` message (from `started`, then from each text) before
the server stops it as if `stop` had come; None or 0: never. Read when a session starts."""


def _error_event(error: APIError, session_id: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "error", **error.body()}
    if session_id is not None:
        event["id"] = session_id
    return event


def _policy_error(message: str, code: str) -> APIError:
    return APIError(message, status_code=403, code=code)


# -- handshake -------------------------------------------------------------------------------------


def offered_key(websocket: WebSocket) -> str | None:
    """The API key the client presented: `?api_key=`, a `bearer.KEY` subprotocol, or the header."""
    for protocol in websocket.scope.get("subprotocols") or ():
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX):
            return protocol[len(KEY_SUBPROTOCOL_PREFIX):] or None
    return websocket.query_params.get("api_key") or bearer_token(websocket.scope)


def chosen_subprotocol(websocket: WebSocket) -> str | None:
    """`qtts.v1` when offered, else the key protocol (a browser fails the handshake when none of
    its offered protocols is echoed), else none."""
    offered = list(websocket.scope.get("subprotocols") or ())
    if SUBPROTOCOL in offered:
        return SUBPROTOCOL
    return next((p for p in offered if p.startswith(KEY_SUBPROTOCOL_PREFIX)), None)


def origin_allowed(headers: Headers, cors_origins: tuple[str, ...]) -> bool:
    """No Origin (not a browser), the server's own origin (the web console), or a CORS origin."""
    origin = headers.get("origin")
    if origin is None:
        return True
    if "*" in cors_origins or origin in cors_origins:
        return True
    return bool(origin != "null" and urlsplit(origin).netloc.lower() == headers.get("host", "").lower())


def handshake_problem(websocket: WebSocket, state: AppState) -> APIError | None:
    """Why this connection must be refused, or None."""
    config = state.config
    if not origin_allowed(Headers(scope=websocket.scope), config.cors_origins):
        return _policy_error(f"Origin '{websocket.headers.get('origin')}' may not open WebSockets here "
                             "(start the server with --cors-origin to allow it).", "origin_not_allowed")
    if config.api_key:
        key = offered_key(websocket)
        if not key_matches(config.api_key, key):
            return unauthorized("You didn't provide an API key: use ?api_key=<key> or the subprotocol "
                                "'bearer.<key>'." if key is None else "Incorrect API key provided.")
    return None


# -- start message ---------------------------------------------------------------------------------


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


# -- one utterance ---------------------------------------------------------------------------------


@dataclass
class Session:
    """One `start` .. `done`: the engine stream, its encoder and what the client is told at the end."""

    id: str
    plan: SpeechPlan
    stream: Stream
    encoder: OffloadedEncoder
    response_format: str
    started_at: float
    chars: int = 0
    has_text: bool = False
    first_text_at: float | None = None
    first_audio_at: float | None = None
    samples: int = 0
    stopped: bool = False
    cancelled: bool = False
    idle_timeout: bool = False
    """The server ended the text because none came for IDLE_TIMEOUT_S."""
    last_text_at: float = 0.0
    pump: asyncio.Task | None = None
    watchdog: asyncio.Task | None = None

    @property
    def sample_rate(self) -> int:
        return self.plan.served.model.sample_rate

    def push(self, delta: str) -> None:
        self.last_text_at = time.monotonic()
        if self.first_text_at is None:
            self.first_text_at = self.last_text_at
        self.chars += len(delta)
        self.has_text = self.has_text or bool(delta.strip())
        self.stream.push_text(delta)

    def done_event(self, finish_reason: str) -> dict[str, Any]:
        result = self.stream.result
        text_tokens, frames = (result.text_tokens, result.frames) if result else (0, 0)
        timings = result.timings if result else {}
        now = time.monotonic()
        first_audio = (None if self.first_audio_at is None or self.first_text_at is None
                       else round(self.first_audio_at - self.first_text_at, 4))
        return {
            "type": "done", "id": self.id, "finish_reason": finish_reason,
            "usage": {"input_tokens": text_tokens, "output_tokens": frames, "total_tokens": text_tokens + frames},
            "audio_s": round(self.samples / self.sample_rate, 4),
            "idle_timeout": self.idle_timeout,
            "timings": {
                "first_audio_s": first_audio,  # from the first text message to the first audio sent
                "elapsed_s": round(now - self.started_at, 4),
                "compute_s": round(sum(timings.get(k, 0.0) for k in ("talker_s", "predictor_s", "codec_s")), 4),
            },
        }


class Connection:
    """One WebSocket: reads messages, runs at most one Session at a time, writes audio and events."""

    def __init__(self, websocket: WebSocket, state: AppState):
        self.ws = websocket
        self.state = state
        self.session: Session | None = None
        self._send_lock = asyncio.Lock()
        self._open = True

    # -- sending (the reader and the audio pump both send) ------------------------------------
    async def send_event(self, event: dict[str, Any]) -> None:
        await self._send({"type": "websocket.send", "text": json.dumps(event, separators=(",", ":"))})

    async def send_error(self, error: APIError, session_id: str | None = None) -> None:
        await self.send_event(_error_event(error, session_id))

    async def _send(self, message: dict[str, Any]) -> None:
        if not self._open:
            return
        async with self._send_lock:
            try:
                await self.ws.send(message)
            except Exception:  # the client is gone (disconnect, reset): stop talking to it
                self._open = False

    # -- main loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("text") is not None:
                    await self.handle_text(message["text"])
                else:
                    await self.send_error(invalid_request(
                        "Binary messages are not part of this protocol: send JSON text messages.",
                        code="unsupported_message"))
        except Exception:  # the socket broke mid-receive
            log.debug("websocket receive failed", exc_info=True)
        finally:
            self._open = False
            await self.release()

    async def handle_text(self, raw: str) -> None:
        """One client message; every problem becomes an `error` event."""
        try:
            try:
                message = json.loads(raw)
            except ValueError as e:
                raise invalid_request(f"The message is not valid JSON ({e}).", code="invalid_json") from None
            if not isinstance(message, dict):
                raise invalid_request("A message must be a JSON object with a 'type'.", param="type")
            kind = message.get("type")
            handler = {"start": self.start, "text": self.text, "stop": self.stop, "cancel": self.cancel}.get(kind)
            if handler is None:
                raise invalid_request(f"Unknown message type {kind!r}: expected start, text, stop or cancel.",
                                      param="type")
            await handler(message)
        except APIError as e:
            await self.send_error(e, self.session.id if self.session else None)
        except Exception:  # a bug must not take the socket (or the server) down: report it, go on
            log.exception("websocket message failed")
            await self.send_error(APIError("The server had an error while processing your message.",
                                           status_code=500, type=SERVER_ERROR, code="internal_error"),
                                  self.session.id if self.session else None)

    # -- messages ---------------------------------------------------------------------------------
    async def start(self, message: dict[str, Any]) -> None:
        if self.session is not None:
            raise invalid_request("A stream is already running on this socket: send 'stop' or 'cancel' and "
                                  "wait for 'done' before the next 'start'.", code="stream_active")
        registry = self.state.registry
        body, ignored = speech_request(message, registry.default.id)
        served = model_for_voice(registry, body.model, body.voice_id, self.state.voice_profiles)  # as the route
        plan = replace(plan_speech(body, served, self.state.voice_profiles), ignored_fields=ignored)
        request = replace(plan.request, text="", text_mode="streaming")
        sample_rate = plan.served.model.sample_rate
        encoder = StreamingEncoder(body.response_format, sample_rate, body.speed)
        try:
            stream = await start_stream(plan, request)
        except BaseException:
            encoder.close()
            raise
        now = time.monotonic()
        session = Session(id=uuid.uuid4().hex, plan=plan, stream=stream,
                          encoder=OffloadedEncoder(encoder, self.state.encoder_pool),
                          response_format=body.response_format, started_at=now, last_text_at=now)
        self.session = session
        await self.send_event({
            "type": "started", "id": session.id, "model": plan.served.id, "voice": plan.voice.label,
            "sample_rate": sample_rate, "channels": 1, "format": body.response_format,
            "instructions_ignored": plan.voice.instructions_ignored, "voice_ignored": plan.voice.voice_ignored,
            "ignored_fields": list(ignored),
        })
        session.pump = asyncio.create_task(self._pump(session), name=f"ws-pump-{session.id[:8]}")
        if IDLE_TIMEOUT_S:
            session.watchdog = asyncio.create_task(self._watch_idle(session, float(IDLE_TIMEOUT_S)),
                                                   name=f"ws-idle-{session.id[:8]}")

    async def text(self, message: dict[str, Any]) -> None:
        session = self._require_session("text")
        delta = message.get("text")
        if not isinstance(delta, str):
            raise invalid_request("A text message needs 'text': a string.", param="text",
                                  code="missing_required_parameter" if delta is None else "invalid_value")
        if session.stopped or session.cancelled:
            raise invalid_request(f"This stream was already {'stopped' if session.stopped else 'cancelled'}: "
                                  "wait for 'done' and send a new 'start'.", code="stream_closed")
        if session.chars + len(delta) > MAX_SESSION_CHARS:
            raise invalid_request(f"A stream takes at most {MAX_SESSION_CHARS} characters of text; this text "
                                  "was not added.", param="text", code="string_above_max_length")
        session.push(delta)

    async def stop(self, _: dict[str, Any]) -> None:
        session = self._require_session("stop")
        if not session.stopped and not session.cancelled:
            session.stopped = True
            session.stream.close_text()

    async def cancel(self, _: dict[str, Any]) -> None:
        """Stop at once; audio not yet sent is dropped. Idle: nothing to do (a cancel racing a `done`)."""
        session = self.session
        if session is not None and not session.cancelled:
            session.cancelled = True
            session.stream.cancel()

    async def _watch_idle(self, session: Session, timeout: float) -> None:
        """Stop `session` once it has had no text for `timeout` seconds (a forgotten socket must not
        hold its engine slot): as `stop` does, or as `cancel` when there is no text to speak."""
        while not (session.stopped or session.cancelled):
            remaining = session.last_text_at + timeout - time.monotonic()
            if remaining > 0:
                await asyncio.sleep(remaining)
                continue
            session.idle_timeout = True
            log.info("websocket stream %s got no text for %g s: stopping it", session.id, timeout)
            if session.has_text:
                session.stopped = True
                session.stream.close_text()
            else:
                session.cancelled = True
                session.stream.cancel()

    def _require_session(self, kind: str) -> Session:
        if self.session is None:
            raise invalid_request(f"'{kind}' before 'start': open a stream with a 'start' message first.",
                                  param="type", code="no_active_stream")
        return self.session

    # -- audio ------------------------------------------------------------------------------------
    async def _pump(self, session: Session) -> None:
        """Engine chunks -> encoder -> binary frames; then `done` (and `error` first if it failed)."""
        try:
            async for chunk in session.stream:
                if session.cancelled:
                    continue  # drain to the result without sending what the client no longer wants
                session.samples += len(chunk.samples)
                data = await session.encoder.encode(chunk.samples)
                if data:
                    await self._send_audio(session, data)
            result = session.stream.result
            reason = result.finish_reason
            if reason != "error":
                tail = await session.encoder.finish()
                if tail and not session.cancelled:
                    await self._send_audio(session, tail)
        except Exception as e:  # an encoder failure: end this session, keep the socket
            log.exception("websocket stream %s failed", session.id)
            session.stream.cancel()
            reason = "error"
            result = None
            error: APIError | None = synthesis_failed(f"{type(e).__name__}: {e}")
        else:
            error = None
            if reason == "error":
                error = (invalid_request("No text was sent before 'stop'.", param="text", code="empty_input")
                         if not session.has_text else synthesis_failed(result.error or "unknown error"))
        finally:
            session.encoder.close()
            if session.watchdog is not None:
                session.watchdog.cancel()
        self._record(session, reason)
        if self.session is session:
            self.session = None  # the next `start` is welcome from here on
        if error is not None:
            await self.send_error(error, session.id)
        await self.send_event(session.done_event(reason))

    async def _send_audio(self, session: Session, data: bytes) -> None:
        if session.first_audio_at is None:
            session.first_audio_at = time.monotonic()
        await self._send({"type": "websocket.send", "bytes": data})
        if not self._open and not session.cancelled:  # the client left while we were sending
            session.cancelled = True
            session.stream.cancel()

    def _record(self, session: Session, reason: str) -> None:
        """Metrics: streams by finish reason, audio seconds, time from first text to first audio.
        (No real-time factor: a live stream's wall time is the writer's typing speed.)"""
        metrics, model = self.state.metrics, session.plan.served.id
        metrics.streams.inc(model=model, reason=reason)
        if session.samples:
            metrics.audio_seconds.inc(session.samples / session.sample_rate, model=model)
        if session.first_audio_at is not None and session.first_text_at is not None:
            metrics.first_audio.observe(session.first_audio_at - session.first_text_at, model=model)
        if reason == "error":
            log.warning("websocket stream %s of %s ended with an error: %s", session.id, model,
                        session.stream.result.error if session.stream.result else "encoder failure")

    async def release(self) -> None:
        """The socket is gone: cancel the running stream and wait for its pump to finish."""
        session = self.session
        if session is None:
            return
        session.cancelled = True
        session.stream.cancel()
        if session.pump is not None:
            try:
                await asyncio.wait_for(asyncio.shield(session.pump), timeout=10)
            except asyncio.TimeoutError:  # the engine did not answer the cancel: never hang the server
                log.warning("websocket stream %s did not end after its client left", session.id)
                session.pump.cancel()
            except asyncio.CancelledError:  # the server is shutting down this connection
                session.pump.cancel()
                raise


@router.websocket(PATH)
async def speech_socket(websocket: WebSocket) -> None:
    """Live text to speech; see the module docstring for the protocol."""
    state = get_state(websocket)
    await websocket.accept(subprotocol=chosen_subprotocol(websocket))
    problem = handshake_problem(websocket, state)
    if problem is not None:
        await websocket.send_text(json.dumps(_error_event(problem)))
        await websocket.close(CLOSE_POLICY_VIOLATION, reason=problem.code or "policy_violation")
        return
    await Connection(websocket, state).run()


__all__ = ["router", "PATH", "SUBPROTOCOL", "IDLE_TIMEOUT_S", "Connection", "Session", "speech_request",
           "origin_allowed"]
