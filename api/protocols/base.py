"""What every WebSocket protocol of this server shares: the handshake checks, the socket counts, and a
connection that reads JSON messages and writes events and audio within the server's limits.

A protocol (`/v1/ws`, `/v1/realtime`) is a `SocketConnection` subclass that handles its messages and
shapes its events; `serve_socket` runs it:

    accept (echoing a subprotocol) -> Host / Origin / key checks (error event, close 1008)
    -> draining? (close 1012) -> socket counts (close 1013) -> connection.run() inside PROCESS.session

Authentication (the HTTP middleware does not see WebSockets): `?api_key=KEY`, a key subprotocol
(`bearer.KEY`, or a protocol's own prefix such as Realtime's `openai-insecure-api-key.KEY`: what a
browser can send), or `Authorization: Bearer KEY`. Browsers do not apply CORS to WebSockets, so a
connection whose `Origin` is neither this server's own host nor one of `--cors-origin` is refused: any
web page could otherwise make the server talk. A `Host` outside the allowed hosts (DNS rebinding) is
refused the same way.

Limits (`api/limits.py` `ServerLimits`) enforced here, for every protocol:
- `max_sockets_per_client` (a client is its address: `clients.client_address`) and `max_sockets` in
  all: one more is accepted, told `error` (code `too_many_sockets`, type rate_limit_error) and closed
  with 1013 ("try again later"). Not an HTTP 429 before the upgrade: a browser cannot read that answer.
- `ws_max_message_bytes`: a bigger message gets `error` (code `payload_too_large`), then close 1009;
  a running utterance is cancelled. (uvicorn's `ws_max_size` drops far bigger ones itself.)
- `send_timeout_s`: a client that takes no message for this long (its audio piles up) is ended: its
  stream is cancelled and everything it held freed at once, nothing more is sent but the close frame
  (1008 "send_timeout"). That frame waits for the client to read again or leave (ASGI cannot drop a
  connection whose client does not read): until then the stalled connection still counts as one of
  the client's sockets, so stalled connections stay bounded by the socket limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import WebSocket
from starlette.types import Message

from api.errors import (
    RATE_LIMIT,
    SERVER_ERROR,
    APIError,
    invalid_request,
    no_key,
    payload_too_large,
    unauthorized,
)
from api.limits import ServerLimits, parse_networks
from api.ops.clients import client_address
from api.ops.hosts import host_allowed, host_not_allowed, origin_allowed
from api.ops.lifecycle import CLOSE_SERVICE_RESTART, PROCESS, draining_error
from api.ops.middleware import bearer_token, key_matches
from api.state import AppState, get_state

log = logging.getLogger("api.protocols.base")

KEY_SUBPROTOCOL_PREFIX = "bearer."
CLOSE_POLICY_VIOLATION = 1008
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_TRY_AGAIN_LATER = 1013


def error_event(error: APIError, **extra: Any) -> dict[str, Any]:
    """`{"type": "error", "error": {message, type, param, code}}` (OpenAI's envelope) plus `extra`."""
    return {"type": "error", **error.body(), **extra}


# -- handshake -------------------------------------------------------------------------------------


def offered_key(websocket: WebSocket, key_prefixes: Sequence[str] = (KEY_SUBPROTOCOL_PREFIX,)) -> str | None:
    """The API key the client presented: `?api_key=`, a key subprotocol, or the header (`Authorization:
    Bearer`, or ElevenLabs' `xi-api-key`)."""
    for protocol in websocket.scope.get("subprotocols") or ():
        for prefix in key_prefixes:
            if protocol.startswith(prefix):
                return protocol[len(prefix):] or None
    return websocket.query_params.get("api_key") or bearer_token(websocket.scope)


def chosen_subprotocol(websocket: WebSocket, own: str | None,
                       key_prefixes: Sequence[str] = (KEY_SUBPROTOCOL_PREFIX,)) -> str | None:
    """The protocol's `own` subprotocol when offered, else the key protocol (a browser fails the
    handshake when none of its offered protocols is echoed), else none."""
    offered = list(websocket.scope.get("subprotocols") or ())
    if own is not None and own in offered:
        return own
    return next((p for p in offered if p.startswith(tuple(key_prefixes))), None)


def _policy_error(message: str, code: str) -> APIError:
    return APIError(message, status_code=403, code=code)


def handshake_problem(websocket: WebSocket, state: AppState,
                      key_prefixes: Sequence[str] = (KEY_SUBPROTOCOL_PREFIX,)) -> APIError | None:
    """Why this connection must be refused, or None."""
    config = state.config
    if not host_allowed(websocket.scope, config):  # DNS rebinding: api/ops/hosts.py
        return host_not_allowed(websocket.headers.get("host"))
    if not origin_allowed(websocket.scope, config):
        return _policy_error(f"Origin '{websocket.headers.get('origin')}' may not open WebSockets here "
                             "(start the server with --cors-origin to allow it).", "origin_not_allowed")
    if config.api_key:
        key = offered_key(websocket, key_prefixes)
        if not key_matches(config.api_key, key):
            return no_key(websocket.scope, ("?api_key=<key>", f"the subprotocol '{key_prefixes[0]}<key>'")) \
                if key is None else unauthorized("Incorrect API key provided.")
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


def socket_counts(app_state: Any) -> SocketCounts:
    """The app's SocketCounts (`app.state`), shared by every socket protocol (made on first use)."""
    counts = getattr(app_state, "qtts_sockets", None)
    if counts is None:
        counts = app_state.qtts_sockets = SocketCounts()
    return counts


# -- one connection --------------------------------------------------------------------------------


class SocketConnection:
    """One WebSocket: reads JSON messages, hands each to `handlers()`, writes events and audio.

    Subclasses give `handlers` (message type -> coroutine), shape errors (`error_event`), say when
    they are `busy` (the drain waits) and free what they hold in `release`.
    """

    protocol_name = "websocket"

    def __init__(self, websocket: WebSocket, state: AppState, client: str = ""):
        self.ws = websocket
        self.state = state
        self.client = client
        self.limits = state.config.limits
        self._send_lock = asyncio.Lock()
        self._ended: asyncio.Future[tuple[int, str] | None] = asyncio.get_running_loop().create_future()
        """Set once nothing more goes to the client: None when it left, else the (code, reason) to
        close with (the server ends the socket)."""

    # -- what a protocol provides -------------------------------------------------------------------
    def handlers(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[None]]]:
        raise NotImplementedError

    def error_event(self, error: APIError, message: dict[str, Any] | None = None) -> dict[str, Any]:
        """The event that reports `error` (caused by `message`, when known)."""
        return error_event(error)

    def on_end(self) -> None:
        """The socket ends (called once nothing more may be sent): cancel what runs."""

    async def release(self) -> None:
        """The socket is over: wait (bounded) for what it ran to finish."""

    @property
    def busy(self) -> bool:
        """Work runs that the drain lets finish (`lifecycle.Drainable`)."""
        return False

    # -- state ----------------------------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return not self._ended.done()

    def end(self, close: tuple[int, str] | None = None) -> None:
        """Send nothing more (then close with `close`); cancel what runs."""
        if self.open:
            self._ended.set_result(close)
        self.on_end()

    # -- sending (the reader and the audio pumps both send) --------------------------------------------
    async def send_event(self, event: dict[str, Any]) -> None:
        await self._send({"type": "websocket.send", "text": json.dumps(event, separators=(",", ":"))})

    async def send_bytes(self, data: bytes) -> None:
        await self._send({"type": "websocket.send", "bytes": data})

    async def send_error(self, error: APIError, message: dict[str, Any] | None = None) -> None:
        await self.send_event(self.error_event(error, message))

    async def _send(self, message: dict[str, Any]) -> None:
        """Send, or end the socket: a client that takes nothing for `send_timeout_s` is ended."""
        async with self._send_lock:
            if not self.open:
                return
            try:
                async with asyncio.timeout(self.limits.send_timeout_s):
                    await self.ws.send(message)
            except TimeoutError:
                log.warning("%s client %s read nothing for %g s: ending its socket", self.protocol_name,
                            self.client, self.limits.send_timeout_s)
                self.end((CLOSE_POLICY_VIOLATION, "send_timeout"))
            except Exception:  # the client is gone (disconnect, reset): stop talking to it
                self.end()

    # -- main loop --------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Answer messages until the client leaves or the server ends the socket; then free it all."""
        try:
            while (message := await self._receive()) is not None:
                await self.handle(message)
        except Exception:  # the socket broke mid-receive
            log.debug("%s receive failed", self.protocol_name, exc_info=True)
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
                                                    f"{size}. Send long text as several messages."))
            self.end((CLOSE_MESSAGE_TOO_BIG, "payload_too_large"))
        elif text is not None:
            await self.handle_text(text)
        else:
            await self.send_error(invalid_request(
                "Binary messages are not part of this protocol: send JSON text messages.",
                code="unsupported_message"))

    async def handle_text(self, raw: str) -> None:
        """One client message; every problem becomes an error event."""
        message: dict[str, Any] | None = None
        try:
            try:
                parsed = json.loads(raw)
            except (ValueError, RecursionError) as e:  # RecursionError: nested past the parser's depth
                where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
                raise invalid_request(f"The message is not valid JSON{where}.", code="invalid_json") from None
            if not isinstance(parsed, dict):
                raise invalid_request("A message must be a JSON object with a 'type'.", param="type")
            message = parsed
            kind = self.kind_of(message)
            handlers = self.handlers()
            handler = handlers.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise self.unknown_type(kind, message)
            await handler(message)
        except APIError as e:
            await self.send_error(e, message)
        except Exception:  # a bug must not take the socket (or the server) down: report it, go on
            log.exception("%s message failed", self.protocol_name)
            await self.send_error(APIError("The server had an error while processing your message.",
                                           status_code=500, type=SERVER_ERROR, code="internal_error"), message)

    def kind_of(self, message: dict[str, Any]) -> Any:
        """Which handler takes `message`: its `type` (a protocol without one derives it)."""
        return message.get("type")

    def unknown_type(self, kind: Any, message: dict[str, Any]) -> APIError:
        shown = (repr(kind[:40]) if isinstance(kind, str) else "(missing)" if kind is None
                 else f"of JSON type {type(kind).__name__}")
        return invalid_request(f"Unknown message type {shown}: expected {', '.join(self.handlers())}.",
                               param="type")


async def refuse(websocket: WebSocket, event: dict[str, Any], code: int, timeout_s: float, reason: str) -> None:
    """Send `event`, then close with `code` and `reason` (bounded: the client may not read)."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout_s):
            await websocket.send_text(json.dumps(event))
            await websocket.close(code, reason=reason)


async def serve_socket(websocket: WebSocket, connect: Callable[[WebSocket, AppState, str], SocketConnection], *,
                       subprotocol: str | None, key_prefixes: Sequence[str] = (KEY_SUBPROTOCOL_PREFIX,),
                       refusal_event: Callable[[APIError], dict[str, Any]] = error_event) -> None:
    """Accept, check, count and run one connection of a protocol (see the module docstring)."""
    state = get_state(websocket)
    limits = state.config.limits
    await websocket.accept(subprotocol=chosen_subprotocol(websocket, subprotocol, key_prefixes))
    problem = handshake_problem(websocket, state, key_prefixes)
    if problem is not None:
        await refuse(websocket, refusal_event(problem), CLOSE_POLICY_VIOLATION, limits.send_timeout_s,
                     problem.code or "refused")
        return
    if PROCESS.draining:  # reconnect: another instance answers
        await refuse(websocket, refusal_event(draining_error()), CLOSE_SERVICE_RESTART, limits.send_timeout_s,
                     "draining")
        return
    client = client_address(websocket.scope, parse_networks(limits.trusted_proxies))
    counts = socket_counts(websocket.app.state)
    problem = counts.admit(client, limits)
    if problem is not None:
        await refuse(websocket, refusal_event(problem), CLOSE_TRY_AGAIN_LATER, limits.send_timeout_s,
                     problem.code or "refused")
        return
    try:
        connection = connect(websocket, state, client)
        with PROCESS.session(connection):  # the drain waits for its work, then closes it
            await connection.run()
    finally:
        counts.release(client)
