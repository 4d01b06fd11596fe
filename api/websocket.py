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

Authentication (the HTTP middleware does not see WebSockets): `?api_key=KEY`, the subprotocol
`bearer.KEY` (what a browser can send; offer `qtts.v1` with it), or `Authorization: Bearer KEY`.
Browsers do not apply CORS to WebSockets, so a connection whose `Origin` is neither this server's
own host nor one of `--cors-origin` is refused: any web page could otherwise make the server talk.
A `Host` outside the allowed hosts (DNS rebinding) is refused the same way. These refusals are an
`error` event, then close code 1008.

Limits (`api/limits.py` `ServerLimits`, per server):
- `max_sockets_per_client` (a client is its address: `clients.client_address`) and `max_sockets`
  in all: one more is accepted, told `error` (code `too_many_sockets`, type rate_limit_error) and
  closed with 1013 ("try again later"). Not an HTTP 429 before the upgrade: a browser cannot read
  that answer. Each session is also one of the client's speech streams (`client_limit` on `start`).
- `ws_max_message_bytes`: a bigger message gets `error` (code `payload_too_large`), then close
  1009; a running session is cancelled. (uvicorn's `ws_max_size` drops far bigger ones itself.)
- `ws_max_session_chars`: text past it is refused (`string_above_max_length`); the session goes on.
- `ws_idle_timeout_s`: a session without non-blank text for this long (from `started`, then from
  each text that is not empty or whitespace) is stopped as if `stop` had come (cancelled when it
  never got any text); its `done` says `"limit": "idle_timeout"` (and `"idle_timeout": true`).
- `ws_max_session_s`: at this age a session is stopped the same way, `"limit": "session_length"`
  (what was sent is still spoken). 0 turns either timer off.
- `send_timeout_s`: a client that takes no message for this long (its audio piles up) is ended:
  its stream is cancelled and everything it held freed at once, nothing more is sent but the close
  frame (1008 "send_timeout"). That frame waits for the client to read again or leave (ASGI cannot
  drop a connection whose client does not read): until then the stalled connection still counts as
  one of the client's sockets, so stalled connections stay bounded by the socket limits.

A client that disconnects cancels its stream; the engine frees the slot at its next iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.types import Message

from qwen3_tts_gguf.audio_encoding import StreamingEncoder
from qwen3_tts_gguf.scheduler import Stream

from . import logs
from .clients import client_address, client_of, parse_networks
from .errors import (
    RATE_LIMIT,
    SERVER_ERROR,
    APIError,
    invalid_request,
    payload_too_large,
    synthesis_failed,
    unauthorized,
    validation_error,
)
from .hosts import host_allowed, host_not_allowed, origin_allowed
from .lifecycle import CLOSE_SERVICE_RESTART, PROCESS, draining_error
from .limits import ServerLimits
from .middleware import bearer_token, key_matches
from .schemas import SpeechRequest
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
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_TRY_AGAIN_LATER = 1013
NOT_FOR_LIVE_TEXT = ("input", "text_mode", "stream_format")
"""Speech-request fields a session ignores (the text comes in deltas, always in streaming mode)."""
_PLACEHOLDER_INPUT = "(live text)"


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


def handshake_problem(websocket: WebSocket, state: AppState) -> APIError | None:
    """Why this connection must be refused, or None."""
    config = state.config
    if not host_allowed(websocket.scope, config):  # DNS rebinding: api/hosts.py
        return host_not_allowed(websocket.headers.get("host"))
    if not origin_allowed(websocket.scope, config):
        return _policy_error(f"Origin '{websocket.headers.get('origin')}' may not open WebSockets here "
                             "(start the server with --cors-origin to allow it).", "origin_not_allowed")
    if config.api_key:
        key = offered_key(websocket)
        if not key_matches(config.api_key, key):
            return unauthorized("You didn't provide an API key: use ?api_key=<key> or the subprotocol "
                                "'bearer.<key>'." if key is None else "Incorrect API key provided.")
    return None


class SocketCounts:
    """Open WebSockets in all and per client (used on the event loop only, so no lock)."""

    def __init__(self) -> None:
        self.total = 0
        self.by_client: Counter[str] = Counter()

    def admit(self, client: str, limits: ServerLimits) -> APIError | None:
        """Count one more socket of `client`, or say why it may not open (429-like, retry later)."""
        if self.by_client[client] >= limits.max_sockets_per_client:
            message = (f"This client has {self.by_client[client]} WebSockets open, the most one client may "
                       "have: close one (or run several utterances on one socket) and retry.")
        elif self.total >= limits.max_sockets:
            message = f"The server has {self.total} WebSockets open, its limit; retry shortly."
        else:
            self.total += 1
            self.by_client[client] += 1
            return None
        return APIError(message, status_code=429, type=RATE_LIMIT, code="too_many_sockets")

    def release(self, client: str) -> None:
        self.total -= 1
        self.by_client[client] -= 1
        if self.by_client[client] <= 0:
            del self.by_client[client]


def socket_counts(websocket: WebSocket) -> SocketCounts:
    """The app's SocketCounts (made on first use)."""
    app_state = websocket.app.state
    counts = getattr(app_state, "qtts_sockets", None)
    if counts is None:
        counts = app_state.qtts_sockets = SocketCounts()
    return counts


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
    """Some text that is not blank came (blank deltas are spoken but keep no session alive)."""
    first_text_at: float | None = None
    first_audio_at: float | None = None
    samples: int = 0
    stopped: bool = False
    cancelled: bool = False
    limit: str | None = None
    """The server limit that ended the text: "idle_timeout" or "session_length"."""
    last_text_at: float = 0.0
    pump: asyncio.Task | None = None
    watchdog: asyncio.Task | None = None

    @property
    def sample_rate(self) -> int:
        return self.plan.served.model.sample_rate

    def push(self, delta: str) -> None:
        now = time.monotonic()
        if self.first_text_at is None:
            self.first_text_at = now
        if delta.strip():
            self.last_text_at = now
            self.has_text = True
        self.chars += len(delta)
        self.stream.push_text(delta)

    def stop(self) -> None:
        """No more text: speak what came."""
        if not self.stopped and not self.cancelled:
            self.stopped = True
            self.stream.close_text()

    def cancel(self) -> None:
        """Stop at once; the engine frees the slot at its next iteration."""
        if not self.cancelled:
            self.cancelled = True
            self.stream.cancel()

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
            "limit": self.limit, "idle_timeout": self.limit == "idle_timeout",
            "timings": {
                "first_audio_s": first_audio,  # from the first text message to the first audio sent
                "elapsed_s": round(now - self.started_at, 4),
                "compute_s": round(sum(timings.get(k, 0.0) for k in ("talker_s", "predictor_s", "codec_s")), 4),
            },
        }


class Connection:
    """One WebSocket: reads messages, runs at most one Session at a time, writes audio and events."""

    def __init__(self, websocket: WebSocket, state: AppState, client: str = ""):
        self.ws = websocket
        self.state = state
        self.client = client
        self.limits = state.config.limits
        self.session: Session | None = None
        self._last_pump: asyncio.Task | None = None
        """The latest session's pump (it sends that session's `done`)."""
        self._send_lock = asyncio.Lock()
        self._ended: asyncio.Future[tuple[int, str] | None] = asyncio.get_running_loop().create_future()
        """Set once nothing more goes to the client: None when it left, else the (code, reason) to
        close with (the server ends the socket)."""

    @property
    def open(self) -> bool:
        return not self._ended.done()

    @property
    def busy(self) -> bool:
        """An utterance runs or is sending its `done` (the drain lets it finish: `lifecycle.Drainable`)."""
        return self.session is not None or (self._last_pump is not None and not self._last_pump.done())

    def end(self, close: tuple[int, str] | None = None) -> None:
        """Send nothing more (then close with `close`); cancel the running stream."""
        if self.open:
            self._ended.set_result(close)
        if self.session is not None:
            self.session.cancel()

    # -- sending (the reader and the audio pump both send) ------------------------------------
    async def send_event(self, event: dict[str, Any]) -> None:
        await self._send({"type": "websocket.send", "text": json.dumps(event, separators=(",", ":"))})

    async def send_error(self, error: APIError, session_id: str | None = None) -> None:
        await self.send_event(_error_event(error, session_id))

    async def _send(self, message: dict[str, Any]) -> None:
        """Send, or end the socket: a client that takes nothing for `send_timeout_s` is ended."""
        async with self._send_lock:
            if not self.open:
                return
            try:
                async with asyncio.timeout(self.limits.send_timeout_s):
                    await self.ws.send(message)
            except TimeoutError:
                log.warning("websocket client %s read nothing for %g s: ending its socket (session %s)",
                            self.client, self.limits.send_timeout_s, self.session.id if self.session else None)
                self.end((CLOSE_POLICY_VIOLATION, "send_timeout"))
            except Exception:  # the client is gone (disconnect, reset): stop talking to it
                self.end()

    # -- main loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Answer messages until the client leaves or the server ends the socket; then free it all."""
        try:
            while (message := await self._receive()) is not None:
                await self.handle(message)
        except Exception:  # the socket broke mid-receive
            log.debug("websocket receive failed", exc_info=True)
        finally:
            self.end()
            await self.release()
        close = self._ended.result()
        if close is not None:
            # returns once the client takes the frame or is gone; until then its connection (which
            # ASGI cannot drop) keeps its place in SocketCounts
            with contextlib.suppress(Exception):
                await self.ws.close(*close)

    async def _receive(self) -> Message | None:
        """The next client message; None once the client left or the socket was ended."""
        receiving = asyncio.ensure_future(self.ws.receive())
        try:
            await asyncio.wait((receiving, self._ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not receiving.done():
                receiving.cancel()
        if receiving.cancelled():
            return None
        message = receiving.result()
        return message if self.open and message["type"] != "websocket.disconnect" else None

    async def handle(self, message: Message) -> None:
        """One received message: its size first, then text (the protocol) or binary (refused)."""
        text = message.get("text")
        size = len(text.encode()) if text is not None else len(message.get("bytes") or b"")
        limit = self.limits.ws_max_message_bytes
        if size > limit:
            await self.send_error(payload_too_large(f"A message may have at most {limit} bytes; this one has "
                                                    f"{size}. Send long text as several 'text' messages."),
                                  self._session_id())
            self.end((CLOSE_MESSAGE_TOO_BIG, "payload_too_large"))
        elif text is not None:
            await self.handle_text(text)
        else:
            await self.send_error(invalid_request(
                "Binary messages are not part of this protocol: send JSON text messages.",
                code="unsupported_message"), self._session_id())

    async def handle_text(self, raw: str) -> None:
        """One client message; every problem becomes an `error` event."""
        try:
            try:
                message = json.loads(raw)
            except (ValueError, RecursionError) as e:  # RecursionError: nested past the parser's depth
                where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
                raise invalid_request(f"The message is not valid JSON{where}.", code="invalid_json") from None
            if not isinstance(message, dict):
                raise invalid_request("A message must be a JSON object with a 'type'.", param="type")
            kind = message.get("type")
            handlers = {"start": self.start, "text": self.text, "stop": self.stop, "cancel": self.cancel}
            handler = handlers.get(kind) if isinstance(kind, str) else None
            if handler is None:
                shown = (repr(kind[:40]) if isinstance(kind, str) else "(missing)" if kind is None
                         else f"of JSON type {type(kind).__name__}")
                raise invalid_request(f"Unknown message type {shown}: expected start, text, stop or cancel.",
                                      param="type")
            await handler(message)
        except APIError as e:
            await self.send_error(e, self._session_id())
        except Exception:  # a bug must not take the socket (or the server) down: report it, go on
            log.exception("websocket message failed (session %s)", self._session_id())
            await self.send_error(APIError("The server had an error while processing your message.",
                                           status_code=500, type=SERVER_ERROR, code="internal_error"),
                                  self._session_id())

    def _session_id(self) -> str | None:
        return self.session.id if self.session else None

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
            stream = await start_stream(plan, request, client=client_of(self.ws))
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
        session.pump = self._last_pump = asyncio.create_task(self._pump(session), name=f"ws-pump-{session.id[:8]}")
        if self.limits.ws_idle_timeout_s or self.limits.ws_max_session_s:
            session.watchdog = asyncio.create_task(self._watch(session), name=f"ws-watch-{session.id[:8]}")

    async def text(self, message: dict[str, Any]) -> None:
        session = self._require_session("text")
        delta = message.get("text")
        if not isinstance(delta, str):
            raise invalid_request("A text message needs 'text': a string.", param="text",
                                  code="missing_required_parameter" if delta is None else "invalid_value")
        if session.stopped or session.cancelled:
            raise invalid_request(f"This stream was already {'stopped' if session.stopped else 'cancelled'}: "
                                  "wait for 'done' and send a new 'start'.", code="stream_closed")
        limit = self.limits.ws_max_session_chars
        if session.chars + len(delta) > limit:
            raise invalid_request(f"A stream takes at most {limit} characters of text; this text was not added "
                                  "(send 'stop', then the rest in a new stream).", param="text",
                                  code="string_above_max_length")
        session.push(delta)

    async def stop(self, _: dict[str, Any]) -> None:
        self._require_session("stop").stop()

    async def cancel(self, _: dict[str, Any]) -> None:
        """Stop at once; audio not yet sent is dropped. Idle: nothing to do (a cancel racing a `done`)."""
        if self.session is not None:
            self.session.cancel()

    async def _watch(self, session: Session) -> None:
        """Stop `session` at its idle timeout or its length limit (a forgotten or endless session must
        not hold its engine slot): as `stop` does, or as `cancel` when it got no text to speak."""
        idle, longest = self.limits.ws_idle_timeout_s, self.limits.ws_max_session_s
        while not (session.stopped or session.cancelled):
            idle_at = session.last_text_at + idle if idle else math.inf
            end_at = session.started_at + longest if longest else math.inf
            wait = min(idle_at, end_at) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            session.limit = "session_length" if end_at <= idle_at else "idle_timeout"
            log.info("websocket stream %s reached its %s limit: stopping it", session.id, session.limit)
            if session.has_text:
                session.stop()
            else:
                session.cancel()

    def _require_session(self, kind: str) -> Session:
        if self.session is None:
            raise invalid_request(f"'{kind}' before 'start': open a stream with a 'start' message first.",
                                  param="type", code="no_active_stream")
        return self.session

    # -- audio ------------------------------------------------------------------------------------
    async def _pump(self, session: Session) -> None:
        """Engine chunks -> encoder -> binary frames; then `done` (and `error` first if it failed)."""
        error: APIError | None = None
        try:
            async for chunk in session.stream:
                if session.cancelled:
                    continue  # drain to the result without sending what the client no longer wants
                session.samples += len(chunk.samples)
                data = await session.encoder.encode(chunk.samples)
                if data:
                    await self._send_audio(session, data)
            reason = session.stream.result.finish_reason
            if reason != "error":
                tail = await session.encoder.finish()
                if tail and not session.cancelled:
                    await self._send_audio(session, tail)
            elif not session.has_text:
                error = invalid_request("No text was sent before 'stop'.", param="text", code="empty_input")
            else:  # the engine's text is for the log (`_record`), not for the client
                error = synthesis_failed(f"the engine failed while speaking stream {session.id}.")
        except Exception:  # an encoder failure: end this session, keep the socket
            log.exception("websocket stream %s: encoding failed", session.id)
            session.cancel()
            reason = "error"
            error = synthesis_failed(f"the audio of stream {session.id} could not be encoded.")
        finally:
            session.encoder.close()
            if session.watchdog is not None:
                session.watchdog.cancel()
        done = session.done_event(reason)
        self._record(session, reason, done)
        if self.session is session:
            self.session = None  # the next `start` is welcome from here on
        if error is not None:
            await self.send_error(error, session.id)
        await self.send_event(done)

    async def _send_audio(self, session: Session, data: bytes) -> None:
        if session.first_audio_at is None:
            session.first_audio_at = time.monotonic()
        await self._send({"type": "websocket.send", "bytes": data})
        if not self.open:  # the client left (or was ended) while we were sending
            session.cancel()

    def _record(self, session: Session, reason: str, done: dict[str, Any]) -> None:
        """Metrics (streams by finish reason, audio seconds, time from first text to first audio) and the
        access record, from the `done` event. (No real-time factor: a live stream's wall time is the
        writer's typing speed.)"""
        metrics, model = self.state.metrics, session.plan.served.id
        metrics.streams.inc(model=model, reason=reason)
        if session.samples:
            metrics.audio_seconds.inc(session.samples / session.sample_rate, model=model)
        if session.first_audio_at is not None and session.first_text_at is not None:
            metrics.first_audio.observe(session.first_audio_at - session.first_text_at, model=model)
        if reason == "error":
            log.warning("websocket stream %s of %s ended with an error: %s", session.id, model,
                        session.stream.result.error if session.stream.result else "encoder failure")
        logs.log_access(logs.access_record(
            request_id=session.id, method="WS", route=PATH, status=101, model=model, voice=session.plan.voice.label,
            finish_reason=reason, frames=done["usage"]["output_tokens"], audio_s=done["audio_s"],
            ttfa_s=done["timings"]["first_audio_s"], elapsed_s=done["timings"]["elapsed_s"]))

    async def release(self) -> None:
        """The socket is over: cancel the running stream and wait for its pump to finish."""
        session = self.session
        if session is None:
            return
        session.cancel()
        if session.pump is not None:
            try:
                await asyncio.wait_for(asyncio.shield(session.pump), timeout=10)
            except asyncio.TimeoutError:  # the engine did not answer the cancel: never hang the server
                log.warning("websocket stream %s did not end after its client left", session.id)
                session.pump.cancel()
            except asyncio.CancelledError:  # the server is shutting down this connection
                session.pump.cancel()
                raise


async def _refuse(websocket: WebSocket, problem: APIError, code: int, timeout_s: float,
                  reason: str | None = None) -> None:
    """An `error` event, then close with `code` (reason: `reason`, else the error code)."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout_s):
            await websocket.send_text(json.dumps(_error_event(problem)))
            await websocket.close(code, reason=reason or problem.code or "refused")


@router.websocket(PATH)
async def speech_socket(websocket: WebSocket) -> None:
    """Live text to speech; see the module docstring for the protocol."""
    state = get_state(websocket)
    limits = state.config.limits
    await websocket.accept(subprotocol=chosen_subprotocol(websocket))
    problem = handshake_problem(websocket, state)
    if problem is not None:
        await _refuse(websocket, problem, CLOSE_POLICY_VIOLATION, limits.send_timeout_s)
        return
    if PROCESS.draining:  # reconnect: another instance answers
        await _refuse(websocket, draining_error(), CLOSE_SERVICE_RESTART, limits.send_timeout_s, "draining")
        return
    client = client_address(websocket.scope, parse_networks(limits.trusted_proxies))
    counts = socket_counts(websocket)
    problem = counts.admit(client, limits)
    if problem is not None:
        await _refuse(websocket, problem, CLOSE_TRY_AGAIN_LATER, limits.send_timeout_s)
        return
    try:
        connection = Connection(websocket, state, client)
        with PROCESS.session(connection):  # the drain waits for its utterance, then closes it
            await connection.run()
    finally:
        counts.release(client)


__all__ = ["router", "PATH", "SUBPROTOCOL", "Connection", "Session", "SocketCounts", "speech_request"]
