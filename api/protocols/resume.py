"""Resumable `/v1/ws` streams: an utterance that outlives its socket, and the audio it may send again.

A `start` with `"resumable": true` registers its utterance here (`ResumeRegistry.open`) and the
client gets a `resume_token`. From then on every audio byte goes through the stream's `Resumable`:
into its replay buffer (`ReplayBuffer`: the bytes the client has not acknowledged, by offset from
the stream's first byte), then out on the socket it is attached to. When that socket is lost the
stream is *detached*: it stays registered, its pump stops taking audio from the engine (whose
bounded backlog then pauses the stream: the slow-reader pause), its idle timeout stops, and it is
cancelled unless a `resume` comes within `resume_window_s`. A `resume` on a new socket
(`ResumeRegistry.claim`, then `Resumable.attach`) moves it there: `resumed` (with a new token),
the bytes from the client's `audio_bytes` on, then the audio as it comes — and the final `error` /
`done` when the stream ended while it was away. A socket it is still attached to (half-open TCP:
the client is gone but the server has not noticed) is closed with 1008 "resumed elsewhere".

Tokens: 128 random bits (`secrets.token_urlsafe(16)`), single use (each resume gets a new one),
bound to the stream and to the API key that opened it (the key the socket offered: `?api_key=`,
subprotocol or header, compared as SHA-256 digests with `hmac.compare_digest`). Only their SHA-256
digests are kept; they are never logged. A token that is unknown, used, expired or offered with
another key, or an `audio_bytes` the buffer no longer holds, gets `error` `resume_failed` and close
1008 (in the last case the stream, which can no longer be delivered whole, is cancelled at once).

Bounds: the replay buffer of a stream holds at most `replay_limit` bytes (the 16-bit PCM bytes of
the engine's `max_buffered_audio_s`, 480 000 at the default 10 s, plus 64 KiB: every encoded format
is at most about PCM's size); older unacknowledged bytes are dropped, and a resume that asks for
them fails. Detached streams are at most `max_detached_streams` in all (a lost stream past it is
cancelled as a non-resumable one is); each keeps its client's speech place (`clients.py`) and its
engine slot while it waits. While the server drains, lost streams are cancelled and detached ones
end (a resume could not reach this process any more).

All of this is process-local: behind a load balancer with several replicas, a `resume` must reach
the replica that ran the stream. A server given a replica id (`--replica-id r1`, `QTTS_REPLICA_ID`)
makes its tokens `r1.` + the secret part: the client opens the resume socket as `/v1/ws?replica=r1`
(the part before the dot; never the token itself in a URL), which the balancer routes on (docs/deploy.md,
"Many machines"). A token of another replica is refused with `resume_failed` naming the replica that
holds it; a token without a known stream fails as any unknown token does.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import secrets
import time
from typing import Any, Protocol

from fastapi import WebSocket

from api.errors import APIError
from api.limits import ServerLimits
from api.ops.lifecycle import PROCESS
from api.speaking.utterance import Utterance, restart_watch
from api.state import get_state

log = logging.getLogger("api.protocols.resume")

TOKEN_BYTES = 16
"""128 random bits per token."""
MAX_TOKEN_CHARS = 96
"""A replica id (at most 63 characters), a dot and the 22 characters of the secret fit."""
REPLAY_HEADROOM_BYTES = 64 * 1024
"""Added to the PCM size of `max_buffered_audio_s`: a container's overhead (a WAV header, FLAC of noise)."""
REPLAY_FRAME_BYTES = 64 * 1024
"""Replayed audio goes out in binary frames of at most this size."""
CLOSE_RESUMED_ELSEWHERE = (1008, "resumed elsewhere")
CLOSE_RESUME_FAILED = (1008, "resume_failed")
_UNRESUMABLE = ("This stream cannot be resumed: its resume_token is unknown, already used or expired (the "
                "stream ended, or was not resumed within the server's resume window), or it was opened with "
                "another API key.")


def resume_failed(message: str = _UNRESUMABLE, param: str | None = "resume_token") -> APIError:
    return APIError(message, status_code=400, param=param, code="resume_failed")


def replay_limit(max_buffered_audio_s: float, sample_rate: int) -> int:
    """Bytes of audio a stream keeps for a resume: 16-bit mono PCM of `max_buffered_audio_s`, plus
    REPLAY_HEADROOM_BYTES."""
    return math.ceil(max(max_buffered_audio_s, 0.0) * sample_rate * 2) + REPLAY_HEADROOM_BYTES


def _digest(secret: str | None) -> bytes:
    return hashlib.sha256((secret or "").encode()).digest()


class ReplayBuffer:
    """The latest bytes of a stream, by offset: [start, end) is held; at most `limit` bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self.start = 0
        self._data = bytearray()

    @property
    def end(self) -> int:
        """Bytes sent (or due) so far."""
        return self.start + len(self._data)

    def add(self, data: bytes) -> None:
        self._data += data
        excess = len(self._data) - self.limit
        if excess > 0:  # the oldest unacknowledged bytes go: a resume from them fails
            del self._data[:excess]
            self.start += excess

    def ack(self, offset: int) -> None:
        """The client has every byte before `offset` (at most `end`): they need not be kept."""
        if offset > self.start:
            del self._data[:offset - self.start]
            self.start = offset

    def holds(self, offset: int) -> bool:
        return self.start <= offset <= self.end

    def piece(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes from `offset` (b"" past the end or before the start)."""
        if not self.holds(offset):
            return b""
        return bytes(self._data[offset - self.start:offset - self.start + size])


class Attachable(Protocol):
    """The socket side of a resumable stream (`websocket.Connection`)."""

    @property
    def open(self) -> bool: ...

    async def send_event(self, event: dict[str, Any]) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    def end(self, close: tuple[int, str] | None = None) -> None: ...

    def adopt(self, utterance: Utterance) -> None:
        """The utterance is this socket's session from now on."""

    def let_go(self, utterance: Utterance, moved: bool = False) -> None:
        """The utterance is no longer this socket's session (it ended, or `moved` to another socket)."""


class Resumable:
    """One resumable stream's delivery: replay buffer, attached socket, text sequence, token."""

    def __init__(self, registry: ResumeRegistry, utterance: Utterance, connection: Attachable, key: str | None):
        settings = utterance.plan.served.model.settings
        self.registry = registry
        self.utterance = utterance
        self.connection: Attachable | None = connection
        """The socket it is attached to; None while detached."""
        self.replay = ReplayBuffer(replay_limit(settings.max_buffered_audio_s, utterance.sample_rate))
        self.last_text_seq = 0
        """The highest `seq` of a text message taken."""
        self.resumable = True
        """Registered (a resume may come); False once it finished, was cancelled or expired."""
        self.final: list[dict[str, Any]] | None = None
        """The closing events (`error`, `done`) once the pump has ended."""
        self.epoch = 0
        """Counts the resumes: whatever was buffered before one has been sent by it."""
        self.detached_at: float | None = None
        self._key = _digest(key)
        self._token: bytes | None = None
        self._lock = asyncio.Lock()
        """Serializes what goes to the socket: the pump's audio and closing events, a resume's replay."""
        self._wake = asyncio.Event()
        self._sending: asyncio.Task | None = None
        self._attaching = 0
        """Resumes under way: until one has sent `resumed` and the replay, nothing else goes out."""
        self._timer: asyncio.TimerHandle | None = None
        self.session = _DetachedSession(self)

    def _live(self) -> Attachable | None:
        """The socket the pump may send on now: attached, open, and not being resumed onto."""
        conn = self.connection
        return conn if conn is not None and conn.open and not self._attaching else None

    # -- the pump's side -------------------------------------------------------------------------
    async def deliver(self, data: bytes) -> None:
        """Buffer `data` and send it on the attached socket. Detached (or the socket failed): wait for a
        resume, which sends it from the buffer (so the engine pauses meanwhile), or for the end."""
        async with self._lock:
            self.replay.add(data)
            conn, epoch = self._live(), self.epoch
            if conn is not None and await self._send(conn.send_bytes(data)) and conn is self._live():
                return
        await self._wait(epoch)

    async def send_event(self, event: dict[str, Any]) -> None:
        """An advisory event (progress, say) on the attached socket, in order with the audio; while
        detached it is dropped (a resume replays audio and the closing events only)."""
        async with self._lock:
            conn = self._live()
            if conn is not None:
                await self._send(conn.send_event(event))

    async def finish(self, events: list[dict[str, Any]]) -> None:
        """The pump has ended: send the closing `events` on the attached socket, or keep them for a
        resume; then the stream is done with (unregistered)."""
        async with self._lock:
            self.final = events
            conn, epoch = self.connection, self.epoch
            if conn is not None and not self._attaching:  # (a resume under way sends them)
                conn.let_go(self.utterance)  # before `done` goes out: the next `start` is welcome
                if conn.open and await self._all_sent(conn, events) and conn is self._live():
                    self.registry.forget(self)
                    return
        if self.resumable:
            await self._wait(epoch)  # a resume sends them (or the window ends)

    # -- the socket's side -----------------------------------------------------------------------
    def detach(self) -> None:
        """The socket was lost: pause, and wait `resume_window_s` for a resume (the registry's bounds
        were checked)."""
        limits = self.registry.limits
        self.connection = None
        self.detached_at = time.monotonic()
        self.utterance.detached = True
        restart_watch(self.utterance, limits)
        self._timer = asyncio.get_running_loop().call_later(limits.resume_window_s, self._expire)

    async def attach(self, conn: Attachable, offset: int, token: str) -> None:
        """Move the stream to `conn` (after `ResumeRegistry.claim`): `resumed`, the audio from byte
        `offset`, then the closing events if the stream ended meanwhile; the pump goes on there."""
        self.registry.undetach(self)
        old = self.connection
        if self._sending is not None:  # the pump is sending on the old socket: never wait for it
            self._sending.cancel()
        if old is not None and old is not conn:  # half-open: the client is elsewhere now
            old.let_go(self.utterance, moved=True)
            old.end(CLOSE_RESUMED_ELSEWHERE)
            log.info("stream %s resumed on a new socket: closing the old one", self.utterance.id)
        elif old is None:
            log.info("stream %s resumed after %.1f s", self.utterance.id, time.monotonic() - (self.detached_at or 0))
        self.connection, self.detached_at = conn, None
        utterance = self.utterance
        utterance.detached = False
        utterance.last_text_at = time.monotonic()  # the idle clock starts again
        restart_watch(utterance, self.registry.limits)
        conn.adopt(utterance)
        self._attaching += 1
        try:
            async with self._lock:
                self.epoch += 1
                self.replay.ack(offset)

                def current() -> bool:  # still open, and not resumed elsewhere again
                    return conn.open and self.connection is conn

                sent = await self._send(conn.send_event({
                    "type": "resumed", "id": utterance.id, "last_text_seq": self.last_text_seq,
                    "resume_token": token, "audio_bytes": offset}))
                position = offset
                while sent and current() and (piece := self.replay.piece(position, REPLAY_FRAME_BYTES)):
                    sent = await self._send(conn.send_bytes(piece))
                    position += len(piece)
                if sent and current() and self.final is not None:
                    conn.let_go(utterance)
                    if await self._all_sent(conn, self.final) and current():
                        self.registry.forget(self)
        finally:
            self._attaching -= 1
            self._notify()

    def on_cancel(self) -> None:
        """The utterance was cancelled (client, limit, expiry, server): no resume any more."""
        self.registry.forget(self)

    # -- internals -------------------------------------------------------------------------------
    async def _send(self, sending: Any) -> bool:
        """Await one send (a coroutine), which a resume may cancel; whether it ran to the end."""
        task = self._sending = asyncio.ensure_future(sending)
        try:
            await asyncio.wait({task})
        finally:
            self._sending = None
            if not task.done():  # this pump itself is being cancelled
                task.cancel()
        return not task.cancelled() and task.exception() is None

    async def _all_sent(self, conn: Attachable, events: list[dict[str, Any]]) -> bool:
        for event in events:
            if not conn.open or not await self._send(conn.send_event(event)):
                return False
        return conn.open

    async def _wait(self, epoch: int) -> None:
        """Until a resume after `epoch` has sent everything buffered, or no resume can come."""
        while self.resumable and self.epoch == epoch:
            wake = self._wake
            await wake.wait()

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def _expire(self) -> None:
        self._timer = None
        if self.resumable and self.connection is None:
            log.info("stream %s was not resumed within %g s: cancelling it", self.utterance.id,
                     self.registry.limits.resume_window_s)
            self.utterance.cancel()  # -> on_cancel -> forget


class _DetachedSession:
    """A detached stream as the drain sees it (`lifecycle.Drainable`): nothing to wait for; ended
    (cancelled) when the drain closes the sessions."""

    def __init__(self, resumable: Resumable):
        self.resumable = resumable

    @property
    def busy(self) -> bool:
        return False

    def end(self, close: tuple[int, str] | None = None) -> None:
        self.resumable.utterance.cancel()


def token_replica(token: str) -> str | None:
    """The replica a token names (the part before its first dot), or None (a token of a server without
    a replica id: `secrets.token_urlsafe` has no dot)."""
    replica, dot, _ = token.partition(".")
    return replica if dot else None


class ResumeRegistry:
    """The resumable streams of one app (tokens, detached streams); used on the event loop only."""

    def __init__(self, limits: ServerLimits, replica_id: str | None = None):
        self.limits = limits
        self.replica_id = replica_id
        """Prefixes every token (`replica.secret`) when set."""
        self._by_token: dict[bytes, Resumable] = {}
        self.detached: set[Resumable] = set()

    def __len__(self) -> int:
        return len(self._by_token)

    def open(self, utterance: Utterance, connection: Attachable, key: str | None) -> str:
        """Make `utterance` resumable (it goes through its `Resumable` from now on); its first token."""
        resumable = utterance.resume = Resumable(self, utterance, connection, key)
        return self._issue(resumable)

    def claim(self, token: Any, key: str | None, audio_bytes: Any) -> tuple[Resumable, str]:
        """The stream `token` resumes and its next token (the old one is spent), or APIError
        `resume_failed` (module docstring). Synchronous: two resumes of one token cannot both win."""
        if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS:
            raise resume_failed("A resume message needs 'resume_token': the token of `started` or of the last "
                                "`resumed`.")
        holder = token_replica(token)
        if holder is not None and holder != self.replica_id:
            raise resume_failed(
                f"This stream is held by replica {holder!r}, not by this one "
                f"({'no replica id' if self.replica_id is None else repr(self.replica_id)}): the resume reached the "
                f"wrong replica. Open the resume socket as /v1/ws?replica={holder} so that the load balancer routes "
                "it to that replica (docs/deploy.md).")
        digest = _digest(token)
        resumable = self._by_token.get(digest)
        if resumable is None or resumable._token is None or not hmac.compare_digest(resumable._token, digest) \
                or not hmac.compare_digest(resumable._key, _digest(key)):
            raise resume_failed()
        if not isinstance(audio_bytes, int) or isinstance(audio_bytes, bool) or audio_bytes < 0:
            raise resume_failed("A resume message needs 'audio_bytes': the number of audio bytes received "
                                "(an integer, 0 or more).", param="audio_bytes")
        replay = resumable.replay
        if not replay.holds(audio_bytes):
            resumable.utterance.cancel()  # it can no longer be delivered whole
            raise resume_failed(
                f"The audio from byte {audio_bytes} is not held any more (held: bytes {replay.start} to "
                f"{replay.end}; acknowledge audio with 'ack' as it arrives): the stream was cancelled.",
                param="audio_bytes")
        return resumable, self._issue(resumable)

    def detach(self, resumable: Resumable, connection: Attachable) -> bool:
        """`connection` was lost: keep its stream for a resume when the bounds allow (True), else False
        (the caller cancels it)."""
        if not resumable.resumable or resumable.connection is not connection:
            return False
        if PROCESS.draining or self.limits.resume_window_s <= 0:
            return False
        if len(self.detached) >= self.limits.max_detached_streams:
            log.warning("stream %s lost its socket while %d streams wait for a resume (the limit): cancelling it",
                        resumable.utterance.id, len(self.detached))
            return False
        resumable.detach()
        self.detached.add(resumable)
        PROCESS.sessions.add(resumable.session)
        log.info("stream %s lost its socket: paused, resumable for %g s", resumable.utterance.id,
                 self.limits.resume_window_s)
        return True

    def forget(self, resumable: Resumable) -> None:
        """No resume any more (finished, cancelled, expired): unregister, wake its pump."""
        if resumable._token is not None:
            self._by_token.pop(resumable._token, None)
            resumable._token = None
        resumable.resumable = False
        if resumable._timer is not None:
            resumable._timer.cancel()
            resumable._timer = None
        self.detached.discard(resumable)
        PROCESS.sessions.discard(resumable.session)
        resumable._notify()

    def undetach(self, resumable: Resumable) -> None:
        """A detached stream is being resumed: it waits no more."""
        if resumable._timer is not None:
            resumable._timer.cancel()
            resumable._timer = None
        self.detached.discard(resumable)
        PROCESS.sessions.discard(resumable.session)

    def _issue(self, resumable: Resumable) -> str:
        if resumable._token is not None:
            self._by_token.pop(resumable._token, None)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        if self.replica_id is not None:
            token = f"{self.replica_id}.{token}"
        resumable._token = _digest(token)
        self._by_token[resumable._token] = resumable
        return token


def resume_registry(websocket: WebSocket) -> ResumeRegistry:
    """The app's ResumeRegistry (made on first use, with the app's limits)."""
    app_state = websocket.app.state
    registry = getattr(app_state, "qtts_resume", None)
    if registry is None:
        config = get_state(websocket).config
        registry = app_state.qtts_resume = ResumeRegistry(config.limits, config.replica_id)
    return registry
