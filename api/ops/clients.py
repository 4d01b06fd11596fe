"""Who a client is, and the per-client cap on speech streams.

A client is its network address: the peer of the connection or, when that peer is one of
`limits.trusted_proxies` (a load balancer), the right-most address of `X-Forwarded-For` that is not
a trusted proxy (the left part of that header is whatever the client wrote, so it is never read).

The API key does not name a client: this server has one shared key, so every keyed client would be
one client, and on an open server a client could send a new made-up key with each request.

`ClientLimiter` counts the active plus waiting speech streams of each client (HTTP and WebSocket
alike); `speaking/start.start_stream` takes one place before it queues a stream and gives it back when
the stream ends, however it ends. Over the cap: 429 `client_limit` with `Retry-After`.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import Scope

from api.errors import RATE_LIMIT, APIError
from api.limits import Network, parse_networks

UNKNOWN_CLIENT = "unknown"


def _in(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in net for net in networks)


def peer_in(scope: Scope, networks: Sequence[Network]) -> bool:
    """Whether the connection's peer (not what a header says) is in `networks`."""
    peer = (scope.get("client") or (None, None))[0]
    return peer is not None and _in(peer, networks)


def client_address(scope: Scope, trusted: Sequence[Network] = ()) -> str:
    """The client's address (see the module docstring); "unknown" without a peer address."""
    peer = (scope.get("client") or (None, None))[0]
    if peer is None:
        return UNKNOWN_CLIENT
    if not trusted or not _in(peer, trusted):
        return peer
    forwarded = ",".join(Headers(scope=scope).getlist("x-forwarded-for"))
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _in(hop, trusted):
            return hop
    return hops[0] if hops else peer


def client_limit(cap: int) -> APIError:
    """429: this client already holds its share of the speech slots."""
    return APIError(f"This client already has {cap} speech stream{'s' if cap != 1 else ''} running or waiting "
                    "(the per-client limit); retry when one has finished.", status_code=429, type=RATE_LIMIT,
                    code="client_limit", headers={"Retry-After": "1"})


class ClientLimiter:
    """Thread-safe counts of each client's active plus waiting streams, at most `cap` each."""

    def __init__(self, cap: int, trusted_proxies: Iterable[str] = ()):
        if cap < 1:
            raise ValueError(f"the per-client cap must be at least 1, got {cap}")
        self.cap = cap
        self.trusted = parse_networks(trusted_proxies)
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, client: str) -> bool:
        """Take one place for `client`; False when it holds `cap` already."""
        with self._lock:
            held = self._held.get(client, 0)
            if held >= self.cap:
                return False
            self._held[client] = held + 1
            return True

    def release(self, client: str) -> None:
        """Give one place back (from any thread)."""
        with self._lock:
            held = self._held.get(client, 0) - 1
            if held > 0:
                self._held[client] = held
            else:
                self._held.pop(client, None)

    def held(self, client: str) -> int:
        with self._lock:
            return self._held.get(client, 0)


@dataclass(frozen=True)
class Client:
    """One client's handle on the limiter: what `speaking/start.start_stream(client=...)` takes."""

    id: str
    limiter: ClientLimiter

    def acquire(self) -> None:
        """Take a place; APIError 429 `client_limit` at the cap."""
        if not self.limiter.acquire(self.id):
            raise client_limit(self.limiter.cap)

    def release(self) -> None:
        self.limiter.release(self.id)


def client_of(conn: HTTPConnection) -> Client | None:
    """The client of a request or WebSocket, with its app's limiter (None: the app limits no one)."""
    limiter: ClientLimiter | None = getattr(conn.app.state, "client_limiter", None)
    if limiter is None:
        return None
    return Client(client_address(conn.scope, limiter.trusted), limiter)
