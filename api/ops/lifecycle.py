"""Stopping without cutting a stream: signals, the drain state, and the shutdown sequence.

The first SIGTERM or SIGINT (`DrainingServer`, in place of uvicorn's own handler) starts the drain,
and the listener stays open while it lasts:
- `/ready` answers 503 with `Retry-After` at once, so load balancers stop routing here;
- new work is refused: a speech stream where every protocol starts one (`speaking/start.start_stream`:
  503 `unavailable` with `Retry-After` over HTTP, an `unavailable` error event on a socket), a voice
  job (503), a new WebSocket (close 1012, service restart);
- work in flight finishes: HTTP requests (counted by `TrackRequests`) and busy socket sessions
  (registered with `Lifecycle.session`) are waited for, up to the drain timeout;
- then every open session is closed with 1012 and a reason (what still runs at the deadline is
  cancelled);
- and the bytes already written reach their clients: a response is over for the app once its last
  chunk is in the socket's buffers, but a slow reader may still have megabytes of it in this
  process's transport and the kernel's send queue, and a container's network goes when its process
  ends (those bytes would be lost, the stream cut). So the drain also waits, within the same
  deadline, until every connection's buffers are empty (`OutboundBytes`: the transport's buffer plus
  the kernel's unacknowledged send queue, `SIOCOUTQ`), and until the sockets this server closed
  earlier have sent theirs (a `Connection: close` response finished before the signal, still being
  read: the kernel keeps sending it after the close, but not after a container's network is gone;
  their queues are read from the kernel's table of this network namespace, `/proc/self/net/tcp*`);
- then uvicorn stops as usual (listener, connections, the app's lifespan): exit code 0.
A second signal ends the process at once, with exit code 128 + the signal number.

Signals are process-wide, and so is the drain state: `PROCESS`. A later socket protocol drains by
starting its streams through `start_stream` and registering its connections with `PROCESS.session`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Protocol

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import APIError, unavailable

try:  # the kernel's send queue of a socket (Linux: SIOCOUTQ == TIOCOUTQ)
    import fcntl
    import termios
    _OUTQ = termios.TIOCOUTQ
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    fcntl = None
    _OUTQ = None

log = logging.getLogger("api.ops.lifecycle")

CLOSE_SERVICE_RESTART = 1012
"""WebSocket close code for a socket refused or ended by the drain: reconnect (elsewhere)."""
RETRY_AFTER_S = 1
POLL_S = 0.05
CLOSE_WAIT_S = 5.0
"""How long the drain waits for closed sessions to take their close frame."""


class Drainable(Protocol):
    """An open session (a socket) that the drain waits for, then closes."""

    @property
    def busy(self) -> bool:
        """Work in flight (an utterance) that the drain lets finish."""

    def end(self, close: tuple[int, str] | None = None) -> None:
        """Cancel what runs, send nothing more, close with (code, reason)."""


def draining_error() -> APIError:
    """503 for new work during the drain; the retry goes to another instance (`Connection: close`)."""
    error = unavailable("The server is draining before it stops: retry, another instance will answer.",
                        retry_after_s=RETRY_AFTER_S)
    error.headers["Connection"] = "close"
    return error


class Lifecycle:
    """The drain state: whether it drains, HTTP requests in progress, open sessions."""

    def __init__(self) -> None:
        self.draining = False
        self.requests = 0
        self.sessions: set[Drainable] = set()

    def refuse_if_draining(self) -> None:
        """APIError 503 (`draining_error`) while draining: call before starting new work."""
        if self.draining:
            raise draining_error()

    @contextmanager
    def session(self, session: Drainable) -> Iterator[None]:
        """Register `session` while it is open."""
        self.sessions.add(session)
        try:
            yield
        finally:
            self.sessions.discard(session)

    @property
    def busy(self) -> bool:
        return self.requests > 0 or any(s.busy for s in self.sessions)

    async def drain(self, timeout_s: float, unsent: Callable[[], int] = lambda: 0) -> None:
        """Wait up to `timeout_s` for the work in flight, then close every session and wait (briefly)
        for them to go, and (within `timeout_s`) for the `unsent` bytes to reach their clients."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.busy and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        if self.busy:
            log.warning("drain timeout (%g s): %d requests and %d busy sessions still running; ending them",
                        timeout_s, self.requests, sum(s.busy for s in self.sessions))
        for session in list(self.sessions):
            session.end((CLOSE_SERVICE_RESTART, "drain timeout" if session.busy else "server shutting down"))
        closing = loop.time() + CLOSE_WAIT_S
        while self.sessions and loop.time() < closing:
            await asyncio.sleep(POLL_S)
        while (left := unsent()) and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        if left:
            log.warning("drain timeout (%g s): %d bytes not yet taken by their clients", timeout_s, left)
        log.info("drained: stopping")


class OutboundBytes:
    """The bytes written to the server's connections that their clients have not acknowledged yet.

    `watch` takes a duplicate of each connection's socket when the drain starts: uvicorn closes a
    socket once its own buffer is in the kernel (a finished `Connection: close` response, say), and
    the kernel's send queue of a socket nobody holds is invisible (and, in a container, lost with the
    process). Through the duplicate it stays measurable (`SIOCOUTQ`, Linux; elsewhere only the
    transports' buffers count). `close` lets the sockets go.
    """

    def __init__(self, connections: Iterable[object], ports: Iterable[int] = ()):
        self._connections = connections
        self._ports = set(ports)
        """The listening ports: sockets of theirs the process closed already still count (`closed_queues`)."""
        self._fds: list[int] = []

    def watch(self) -> None:
        for protocol in list(self._connections):
            sock = _socket_of(protocol)
            if sock is not None and _OUTQ is not None:
                try:
                    self._fds.append(os.dup(sock.fileno()))
                except OSError:  # closed meanwhile
                    pass

    def __call__(self) -> int:
        total = 0
        for protocol in list(self._connections):
            transport = getattr(protocol, "transport", None)
            if transport is not None:
                total += transport.get_write_buffer_size()
        held = 0
        for fd in self._fds:
            try:
                held += struct.unpack("i", fcntl.ioctl(fd, _OUTQ, b"\0\0\0\0"))[0]
            except OSError:
                pass
        # the kernel's table has the held sockets too, and the ones closed before the drain began
        return total + max(held, closed_queues(self._ports))

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


TCP_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")
_TCP_LISTEN = "0A"


def closed_queues(ports: Iterable[int], tables: Iterable[str] = TCP_TABLES) -> int:
    """Bytes not yet acknowledged by their clients on every TCP socket of this network namespace whose
    local port is one of `ports` (listeners aside): the `tx_queue` column of the kernel's tables, which
    also lists the sockets a process has closed while their data is still going out. 0 where the tables
    cannot be read (not Linux)."""
    ports = {f"{port:04X}" for port in ports}
    if not ports:
        return 0
    total = 0
    for table in tables:
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if len(fields) < 5 or fields[3] == _TCP_LISTEN:
                        continue
                    if fields[1].rpartition(":")[2] in ports:
                        total += int(fields[4].partition(":")[0], 16)
        except (OSError, ValueError):
            continue
    return total


def _socket_of(protocol: object):
    transport = getattr(protocol, "transport", None)
    return None if transport is None else transport.get_extra_info("socket")


PROCESS = Lifecycle()
"""This process's drain state."""


class TrackRequests:
    """ASGI middleware: counts the HTTP requests in progress (the drain waits for them)."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle = PROCESS):
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.lifecycle.requests += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.lifecycle.requests -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn whose first SIGTERM/SIGINT drains (module docstring) before its usual shutdown."""

    def __init__(self, config: uvicorn.Config, drain_timeout_s: float, lifecycle: Lifecycle = PROCESS):
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s
        self.lifecycle = lifecycle
        self._drain: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.started:  # still starting: uvicorn's own stop
            super().handle_exit(sig, frame)
        elif self.lifecycle.draining:
            log.warning("second %s: exiting now", signal.Signals(sig).name)
            os._exit(128 + sig)
        else:
            self.lifecycle.draining = True  # /ready and new work see it at once; on_tick starts the drain

    async def _drain_then_release(self) -> None:
        ports = {sock.getsockname()[1] for server in self.servers for sock in (server.sockets or ())
                 if sock.family in (socket.AF_INET, socket.AF_INET6)}
        outbound = OutboundBytes(self.server_state.connections, ports)
        outbound.watch()
        try:
            await self.lifecycle.drain(self.drain_timeout_s, outbound)
        finally:
            outbound.close()

    async def on_tick(self, counter: int) -> bool:
        if self.lifecycle.draining and self._drain is None:
            log.info("draining: new work is refused, work in flight has up to %g s", self.drain_timeout_s)
            self._drain = asyncio.create_task(self._drain_then_release(), name="qtts-drain")
        if self._drain is not None and self._drain.done():
            self.should_exit = True
        return await super().on_tick(counter)
