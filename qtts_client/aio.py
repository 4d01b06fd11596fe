"""The asyncio client: HTTP calls (urllib on a worker thread) and live utterances over `/v1/ws`.

    async with AsyncClient("http://127.0.0.1:8100") as client:
        async with client.stream(voice="ryan") as utterance:
            await utterance.send_text("Hello ")
            await utterance.send_text("world.")
            await utterance.finish()
            async for event in utterance:      # Audio, Progress, Resumed, then Done
                ...
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any, Dict, List, Optional, Tuple, Union

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from . import _http
from .errors import APIError, AuthenticationError, ProtocolError, QTTSError, ResumeFailed, TransportError
from .types import Audio, Capabilities, Done, Event, Progress, Resumed, Started

PROTOCOL = "qtts"
DEFAULT_PATH = "/v1/ws"
DEFAULT_SUBPROTOCOL = "qtts.v1"
SPEECH_PROTOCOL = "openai-speech"
SPEECH_PATH = "/v1/audio/speech"
CAPABILITIES_PATH = "/v1/capabilities"
MAX_INCOMING_BYTES = 16 * 1024 * 1024
"""The largest message taken from the server (audio chunks are far smaller)."""
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
"""The server's `ws_max_message_bytes` when its capabilities do not say (longer text is split)."""
DEFAULT_MAX_SESSION_CHARS = 4096
"""The server's `ws_max_session_chars` when its capabilities do not say: the most text an utterance
keeps for sending again after a resume (the server refuses text past it anyway)."""
ACK_INTERVAL_S = 0.25
RESUME_TIMEOUT_S = 30.0
"""How long to keep trying to resume (capped by the server's `resume_window_s`)."""
RETRYABLE_ON_RESUME = {"too_many_sockets", "unavailable"}
"""Refusals a resume retries past (the old socket may still count on the server; a restart)."""
FINAL_CLOSE_CODES = {1009, 1012}
"""Close codes after which the server kept nothing: a message too big (1009), its drain (1012: it is
going away). Others (a lost connection, 1008 send_timeout for a client that stopped reading) are resumed."""
_SWALLOW_AFTER_RESUME = {"no_active_stream", "stream_closed"}
_UNSET: Any = object()
_WS_SUPPORTS_PROXY = "proxy" in inspect.signature(connect.__init__).parameters  # websockets >= 15


def _close_reason(closed: BaseException) -> str:
    rcvd = getattr(closed, "rcvd", None)
    if rcvd is not None:
        return f"close code {rcvd.code}" + (f" ({rcvd.reason})" if rcvd.reason else "")
    return "connection lost"


def _close_code(closed: BaseException) -> Optional[int]:
    rcvd = getattr(closed, "rcvd", None)
    return rcvd.code if rcvd is not None else None


def split_text(text: str, max_bytes: int) -> List[str]:
    """`text` in pieces of at most `max_bytes` UTF-8 bytes, cut between characters."""
    if len(text.encode()) <= max_bytes:
        return [text]
    pieces, start, size = [], 0, 0
    for i, ch in enumerate(text):
        n = len(ch.encode())
        if size + n > max_bytes and i > start:
            pieces.append(text[start:i])
            start, size = i, 0
        size += n
    pieces.append(text[start:])
    return pieces


def _speak_body(text: str, voice: Any, fmt: str, model: Optional[str], fields: Dict[str, Any],
                caps: Optional[Capabilities]) -> Dict[str, Any]:
    if caps is not None and caps.protocols and not caps.supports(SPEECH_PROTOCOL):
        raise ProtocolError("this server does not offer POST /v1/audio/speech")
    model = model or (caps.default_model if caps is not None else None) or "tts-1"
    return {"model": model, "input": text, "voice": voice, "response_format": fmt, **fields}


class AsyncClient:
    """A Qwen3-TTS-X server: `speak`, `capabilities`, live utterances (`stream`, `connect`, `stream_text`).

    `base_url` and `api_key` default to $QTTS_BASE_URL (else http://127.0.0.1:8100) and $QTTS_API_KEY.
    The key goes as `Authorization: Bearer` (also on the WebSocket; `key_in_query=True` sends
    `?api_key=` instead, for proxies that drop the header). `proxy`: an HTTP proxy URL; None = direct.
    `verify` (an https:// server): True (the system's CAs), a CA file to trust, an `ssl.SSLContext`, or
    False (no check); HTTP and the WebSocket alike.
    """

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0,
                 proxy: Optional[str] = None, key_in_query: bool = False, verify: _http.Verify = True):
        self.endpoint = _http.Endpoint.make(base_url, api_key, timeout, proxy, verify)
        self.key_in_query = key_in_query
        self._caps: Any = _UNSET

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Nothing stays open between calls; here for symmetry with the sockets."""

    # -- HTTP -------------------------------------------------------------------------------------
    def _fetch_capabilities(self, refresh: bool = False) -> Capabilities:
        if refresh or not isinstance(self._caps, Capabilities):
            doc = _http.get_json(self.endpoint, CAPABILITIES_PATH)
            try:
                self._caps = Capabilities.from_json(doc)
            except (KeyError, TypeError, AttributeError) as e:
                raise ProtocolError(f"GET {CAPABILITIES_PATH}: not a capabilities document ({e!r})") from None
        return self._caps

    def _known_capabilities(self) -> Optional[Capabilities]:
        """The capabilities, or None where the server does not answer them (an older server: then the
        SDK assumes the defaults). Read once and remembered; a wrong key is raised at once."""
        if self._caps is _UNSET:
            try:
                self._fetch_capabilities()
            except AuthenticationError:
                raise
            except (APIError, ProtocolError) as e:
                status = getattr(e, "status", None)
                if status is not None and (status >= 500 or status == 429):
                    return None  # passing trouble: ask again next time
                self._caps = None
        return self._caps

    def _speak(self, text: str, voice: Any, fmt: str, model: Optional[str], fields: Dict[str, Any]) -> bytes:
        body = _speak_body(text, voice, fmt, model, fields, self._known_capabilities())
        return _http.request(self.endpoint, "POST", SPEECH_PATH, body, accept="*/*")

    async def capabilities(self, refresh: bool = False) -> Capabilities:
        """GET /v1/capabilities (remembered; `refresh=True` reads it again)."""
        return await asyncio.to_thread(self._fetch_capabilities, refresh)

    async def speak(self, text: str, voice: Any, format: str = "wav", model: Optional[str] = None,
                    **fields: Any) -> bytes:
        """The whole audio file of `text` (POST /v1/audio/speech). `fields`: any other request field
        (instructions, speed, language, seed, max_frames, ...). `model` defaults to the server's default."""
        return await asyncio.to_thread(self._speak, text, voice, format, model, fields)

    # -- WebSocket --------------------------------------------------------------------------------
    def connect(self) -> AsyncSpeechSocket:
        """One `/v1/ws` connection for any number of utterances, one at a time (an async context manager)."""
        return AsyncSpeechSocket(self)

    @contextlib.asynccontextmanager
    async def stream(self, voice: Any, *, format: str = "pcm", model: Optional[str] = None,
                     resumable: Optional[bool] = None, progress: bool = False,
                     text_normalization: Optional[str] = None, **fields: Any) -> AsyncIterator[AsyncUtterance]:
        """One utterance on its own connection; see `AsyncSpeechSocket.start` for the arguments."""
        async with self.connect() as socket:
            utterance = await socket.start(voice, format=format, model=model, resumable=resumable,
                                           progress=progress, text_normalization=text_normalization, **fields)
            async with utterance:
                yield utterance

    async def stream_text(self, deltas: Union[AsyncIterable[str], Iterable[str]], voice: Any,
                          **options: Any) -> AsyncIterator[Event]:
        """Speak text as it is produced (an LLM's tokens): feeds `deltas`, yields the events to `Done`.

        A sync iterable is read on a worker thread (it may block). When reading `deltas` fails, the
        utterance is cancelled and that exception is raised after its `Done`.
        """
        async with self.stream(voice, **options) as utterance:
            failure: List[BaseException] = []
            feeder = asyncio.create_task(_feed(utterance, deltas, failure))
            try:
                async for event in utterance:
                    yield event
                await feeder
                if failure:
                    raise failure[0]
            finally:
                feeder.cancel()
                with contextlib.suppress(BaseException):
                    await feeder


async def _feed(utterance: AsyncUtterance, deltas: Union[AsyncIterable[str], Iterable[str]],
                failure: List[BaseException]) -> None:
    try:
        if isinstance(deltas, AsyncIterable):
            async for delta in deltas:
                await utterance.send_text(delta)
        else:
            iterator, end = iter(deltas), object()
            while (delta := await asyncio.to_thread(next, iterator, end)) is not end:
                await utterance.send_text(delta)
        await utterance.finish()
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # the text source failed: stop speaking, report it after `done`
        failure.append(e)
        with contextlib.suppress(QTTSError):
            await utterance.cancel()


class AsyncSpeechSocket:
    """One `/v1/ws` connection; `start` runs an utterance on it (one at a time)."""

    def __init__(self, client: AsyncClient):
        self.client = client
        self._ws: Optional[ClientConnection] = None
        self._generation = 0
        """Counts connections: a resumed utterance moves to a new one."""
        self._send_lock: asyncio.Lock = None  # type: ignore[assignment]  # made on the loop (`open`)
        self._utterance: Optional[AsyncUtterance] = None
        self._path, self._subprotocol = DEFAULT_PATH, DEFAULT_SUBPROTOCOL
        self.capabilities: Optional[Capabilities] = None
        self.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES
        self.max_session_chars = DEFAULT_MAX_SESSION_CHARS
        self._stale_error = False
        """A `stop` sent again after a resume may still be answered (`no_active_stream`) after `done`."""

    async def __aenter__(self) -> AsyncSpeechSocket:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Read the capabilities (is `qtts` offered, where, with resume?), then connect."""
        if self._send_lock is None:
            self._send_lock = asyncio.Lock()
        caps = await asyncio.to_thread(self.client._known_capabilities)
        self.capabilities = caps
        if caps is not None and caps.protocols:
            protocol = caps.protocol(PROTOCOL)
            if protocol is None:
                raise ProtocolError("this server does not offer the qtts WebSocket protocol (/v1/ws)")
            self._path, self._subprotocol = protocol.path, protocol.subprotocol
        if caps is not None:
            limits = caps.limits
            if isinstance(limits.get("ws_max_message_bytes"), int):
                self.max_message_bytes = limits["ws_max_message_bytes"]
            if isinstance(limits.get("ws_max_session_chars"), int):
                self.max_session_chars = limits["ws_max_session_chars"]
        self._ws = await self._connect()

    async def close(self) -> None:
        """Cancel a running utterance and close the connection."""
        utterance, self._utterance = self._utterance, None
        if utterance is not None and not utterance.finished:
            with contextlib.suppress(QTTSError):
                await utterance.cancel()
        if self._ws is not None:
            ws, self._ws = self._ws, None
            await ws.close()

    async def _connect(self, replica: Optional[str] = None) -> ClientConnection:
        """A new socket; `replica` (a resume token's replica, the part before its dot) goes in the URL as
        `?replica=` for the load balancer to route the resume to the replica that holds the stream."""
        endpoint = self.client.endpoint
        headers = {} if self.client.key_in_query else {
            k: v for k, v in endpoint.headers().items() if k == "Authorization"}
        kwargs: Dict[str, Any] = dict(
            subprotocols=[self._subprotocol] if self._subprotocol else None, additional_headers=headers,
            user_agent_header=_http.USER_AGENT, open_timeout=endpoint.timeout, max_size=MAX_INCOMING_BYTES,
            compression=None)
        if _WS_SUPPORTS_PROXY:
            kwargs["proxy"] = endpoint.proxy
        if endpoint.tls is not None:  # wss://
            kwargs["ssl"] = endpoint.tls
        url = endpoint.ws_url(self._path, self.client.key_in_query)
        if replica:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"replica": replica})
        try:
            return await connect(url, **kwargs)
        except InvalidStatus as e:  # refused before the upgrade (e.g. 503: too many connections)
            response = e.response
            try:
                envelope = json.loads(response.body or b"")
            except ValueError:
                envelope = None
            raise APIError.from_envelope(envelope, status=response.status_code,
                                         fallback=f"WebSocket handshake refused ({response.status_code})") from None
        except (OSError, asyncio.TimeoutError, InvalidHandshake) as e:
            raise TransportError(f"cannot connect to {url.split('?')[0]}: {e}") from e

    async def _send(self, message: Dict[str, Any], ws: Optional[ClientConnection] = None) -> None:
        """Send on `ws` (default: the current connection); ConnectionClosed when it is gone."""
        ws = ws or self._ws
        if ws is None:
            raise TransportError("the socket is closed")
        await ws.send(json.dumps(message, separators=(",", ":")))

    async def _recv(self, ws: ClientConnection, timeout: Optional[float]) -> Union[str, bytes]:
        return await asyncio.wait_for(ws.recv(), timeout)

    async def start(self, voice: Any, *, format: str = "pcm", model: Optional[str] = None,
                    resumable: Optional[bool] = None, progress: bool = False,
                    text_normalization: Optional[str] = None, **fields: Any) -> AsyncUtterance:
        """Open an utterance (the `start` message; wait for `started`).

        `fields` are speech-request fields (instructions, language, seed, temperature, max_frames,
        speed, ...). `resumable` (default: when the server lists the `resume` feature) keeps the
        utterance across a lost connection; `progress=True` asks for Progress events;
        `text_normalization` is "off" or "auto". APIError when the server refuses.
        """
        if self._utterance is not None and not self._utterance.finished:
            raise QTTSError("an utterance is already running on this socket: finish or cancel it first")
        if self._ws is None:
            await self.open()
        caps = self.capabilities
        if resumable is None:  # ask unless the server says it cannot (unknown fields are ignored)
            resumable = caps is None or not caps.protocols or caps.supports(PROTOCOL, "resume")
        message: Dict[str, Any] = {"type": "start", "voice": voice, "format": format, **fields}
        if model is not None:
            message["model"] = model
        if resumable:
            message["resumable"] = True
        if progress:
            message["progress"] = True
        if text_normalization is not None:
            message["text_normalization"] = text_normalization
        ws = self._ws
        assert ws is not None
        self._stale_error = bool(self._utterance is not None and self._utterance._swallow)
        try:
            await self._send(message, ws)
            while True:
                raw = await self._recv(ws, self.client.endpoint.timeout)
                if isinstance(raw, bytes):
                    raise ProtocolError("audio before 'started'")
                event = _parse(raw)
                if event.get("type") == "started":
                    break
                if event.get("type") == "error":
                    error = APIError.from_envelope(event, event=event)
                    if self._stale_error and error.code in _SWALLOW_AFTER_RESUME:
                        self._stale_error = False
                        continue
                    raise error
        except ConnectionClosed as e:
            self._ws = None
            raise TransportError(f"the server closed the socket before 'started' ({_close_reason(e)})") from e
        except asyncio.TimeoutError:
            raise TransportError("no 'started' from the server in time") from None
        self._stale_error = False
        started = Started.from_event(event)
        self._utterance = AsyncUtterance(self, started)
        return self._utterance


def _parse(raw: str) -> Dict[str, Any]:
    try:
        event = json.loads(raw)
    except ValueError:
        raise ProtocolError(f"the server sent a message that is not JSON: {raw[:80]!r}") from None
    if not isinstance(event, dict):
        raise ProtocolError("the server sent a JSON message that is not an object")
    return event


class AsyncUtterance:
    """One running utterance: send text deltas, iterate its events (Audio, Progress, Resumed, Done).

    Iterating raises APIError for an `error` event from the server (the utterance goes on unless
    that error ended it: then `Done` with finish_reason "error" follows). Resumable utterances number
    their text messages, acknowledge the audio they got, and after a lost connection resume on a new
    one: the server sends the audio from the last byte received and the SDK sends again the text it
    had not seen. Leaving the `async with` block before `Done` cancels the utterance.
    """

    def __init__(self, socket: AsyncSpeechSocket, started: Started):
        self.socket = socket
        self.started = started
        self.resume_token: Optional[str] = started.resume_token
        self.audio_bytes = 0
        """Audio bytes received so far."""
        self.done: Optional[Done] = None
        self._texts: List[Tuple[int, str]] = []
        """(seq, text) the server may not have (resumable only; pruned on each resume; at most the
        server's `ws_max_session_chars` characters in all)."""
        self._kept_chars = 0
        self._seq = 0
        self._stop_sent = False
        self._cancelled = False
        self._ended = False
        """No more events (Done came, or a cancelled utterance lost its connection)."""
        self._acked = 0
        self._acked_at = 0.0
        self._pending: Optional[Event] = None
        self._swallow = False

    @property
    def id(self) -> str:
        return self.started.id

    @property
    def resumable(self) -> bool:
        return self.resume_token is not None

    @property
    def finished(self) -> bool:
        return self._ended

    async def __aenter__(self) -> AsyncUtterance:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._ended:
            await self.abort()

    # -- client messages ----------------------------------------------------------------------
    async def send_text(self, text: str) -> None:
        """Append `text` (any size: split to fit the server's message limit)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        if self._stop_sent or self._cancelled or self._ended:
            raise QTTSError("this utterance takes no more text (finished or cancelled)")
        if not text:
            return
        for piece in split_text(text, max(64, self.socket.max_message_bytes - 256)):
            async with self.socket._send_lock:
                message: Dict[str, Any] = {"type": "text", "text": piece}
                if self.resumable:
                    self._seq += 1
                    message["seq"] = self._seq
                    if self._kept_chars + len(piece) <= self.socket.max_session_chars:
                        self._texts.append((self._seq, piece))
                        self._kept_chars += len(piece)
                await self._send_or_keep(message)

    async def finish(self) -> None:
        """No more text: speak what came, then `Done`."""
        if self._stop_sent or self._cancelled or self._ended:
            return
        async with self.socket._send_lock:
            self._stop_sent = True
            await self._send_or_keep({"type": "stop"})

    async def cancel(self) -> None:
        """Stop now; audio not yet received is dropped. `Done` (cancelled) follows."""
        if self._cancelled or self._ended:
            return
        self._cancelled = True
        async with self.socket._send_lock:
            with contextlib.suppress(ConnectionClosed, TransportError):
                await self.socket._send({"type": "cancel"})

    async def abort(self, timeout: float = 10.0) -> None:
        """Cancel and read to `Done` (the socket then takes the next `start`); close the socket when
        the server does not answer in `timeout`."""
        await self.cancel()
        try:
            await asyncio.wait_for(self._drain(), timeout)
        except (asyncio.TimeoutError, QTTSError):
            self._ended = True
            await self.socket.close()

    async def _drain(self) -> None:
        while not self._ended:
            with contextlib.suppress(APIError):
                async for _ in self:
                    pass

    async def _send_or_keep(self, message: Dict[str, Any]) -> None:
        """Send (the caller holds the send lock). A resumable utterance keeps what a lost connection
        did not take (the resume sends it again); otherwise that is a TransportError."""
        try:
            await self.socket._send(message)
        except ConnectionClosed as e:
            if not self.resumable:
                raise TransportError(f"the connection was lost ({_close_reason(e)})") from e

    async def _ack(self) -> None:
        now = time.monotonic()
        if not self.resumable or self.audio_bytes == self._acked or now - self._acked_at < ACK_INTERVAL_S:
            return
        self._acked, self._acked_at = self.audio_bytes, now
        async with self.socket._send_lock:
            with contextlib.suppress(ConnectionClosed, TransportError):
                await self.socket._send({"type": "ack", "audio_bytes": self.audio_bytes})

    async def collect(self) -> Tuple[bytes, Done]:
        """Read to the end: (all the audio, Done)."""
        audio = bytearray()
        async for event in self:
            if isinstance(event, Audio):
                audio += event.data
        if self.done is None:
            raise TransportError("the utterance ended without 'done'")
        return bytes(audio), self.done

    # -- events ---------------------------------------------------------------------------------
    def __aiter__(self) -> AsyncUtterance:
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._pending is not None:
                event, self._pending = self._pending, None
                return event
            if self._ended:
                raise StopAsyncIteration
            ws, generation = self.socket._ws, self.socket._generation
            if ws is None:
                raise TransportError("the socket is closed")
            try:
                raw = await ws.recv()
            except ConnectionClosed as e:
                if self.socket._generation == generation:
                    await self._recover(e)
                continue
            if self.socket._generation != generation:
                continue  # from a connection already given up
            if isinstance(raw, bytes):
                offset = self.audio_bytes
                self.audio_bytes += len(raw)
                await self._ack()
                return Audio(raw, offset)
            event = _parse(raw)
            kind = event.get("type")
            if kind == "progress":
                return Progress.from_event(event)
            if kind == "done":
                self.done, self._ended = Done.from_event(event), True
                return self.done
            if kind == "error":
                error = APIError.from_envelope(event, event=event)
                if self._swallow and error.code in _SWALLOW_AFTER_RESUME:
                    self._swallow = False  # the `stop` sent again found the utterance already ending
                    continue
                raise error
            # other event types (a newer server's): skipped

    # -- resume ---------------------------------------------------------------------------------
    async def _recover(self, closed: ConnectionClosed) -> None:
        """After a lost connection: resume on a new one (or end / raise when that cannot be)."""
        old = self.socket._ws
        if self._cancelled:  # nothing more wanted: the server cancels it on its side
            self._ended = True
            self.socket._ws = None
            return
        if not self.resumable:
            self.socket._ws = None
            raise TransportError(f"the connection was lost ({_close_reason(closed)}) and the utterance "
                                 "is not resumable") from closed
        if _close_code(closed) in FINAL_CLOSE_CODES:
            self.socket._ws = None
            raise TransportError(f"the server ended the connection ({_close_reason(closed)})") from closed
        if old is not None and old.transport is not None:
            old.transport.abort()
        window = (self.socket.capabilities.limits.get("resume_window_s")
                  if self.socket.capabilities is not None else None)
        limit = min(RESUME_TIMEOUT_S, window) if isinstance(window, (int, float)) and window > 0 else RESUME_TIMEOUT_S
        deadline, delay = time.monotonic() + limit, 0.1
        last: BaseException = closed
        while True:
            try:
                ws, resumed = await self._try_resume()
                break
            except ResumeFailed:
                self.socket._ws = None
                raise
            except (TransportError, ConnectionClosed, asyncio.TimeoutError, OSError) as e:
                last = e
            except APIError as e:
                if e.code not in RETRYABLE_ON_RESUME:
                    self.socket._ws = None
                    raise
                last = e
            if time.monotonic() + delay > deadline:
                self.socket._ws = None
                raise TransportError(f"the connection was lost and could not be resumed within {limit:g} s: "
                                     f"{last}") from last
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        last_seq = resumed.get("last_text_seq")
        last_seq = last_seq if isinstance(last_seq, int) else 0
        async with self.socket._send_lock:  # no text goes out between the resend and the switch
            self.resume_token = resumed.get("resume_token") or self.resume_token
            self._texts = [(seq, text) for seq, text in self._texts if seq > last_seq]
            self._kept_chars = sum(len(text) for _, text in self._texts)
            with contextlib.suppress(ConnectionClosed):  # lost again: the next resume sends it
                for seq, text in self._texts:
                    await self.socket._send({"type": "text", "text": text, "seq": seq}, ws)
                if self._stop_sent:
                    self._swallow = True
                    await self.socket._send({"type": "stop"}, ws)
            self.socket._ws = ws
            self.socket._generation += 1
            self._acked, self._acked_at = self.audio_bytes, time.monotonic()
        self._pending = Resumed(id=str(resumed.get("id") or self.id), last_text_seq=last_seq,
                                audio_bytes=self.audio_bytes, raw=resumed)

    async def _try_resume(self) -> Tuple[ClientConnection, Dict[str, Any]]:
        replica, dot, _ = (self.resume_token or "").partition(".")
        ws = await self.socket._connect(replica if dot else None)
        try:
            await self.socket._send({"type": "resume", "resume_token": self.resume_token,
                                     "audio_bytes": self.audio_bytes}, ws)
            while True:
                raw = await self.socket._recv(ws, self.socket.client.endpoint.timeout)
                if isinstance(raw, bytes):
                    raise ProtocolError("audio before 'resumed'")
                event = _parse(raw)
                if event.get("type") == "resumed":
                    return ws, event
                if event.get("type") == "error":
                    raise APIError.from_envelope(event, event=event)
        except BaseException:
            if ws.transport is not None:
                ws.transport.abort()
            raise
