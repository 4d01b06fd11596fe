"""The public address of a request behind a proxy: its path prefix and its scheme.

A proxy that serves this server under a path (`https://example.com/tts/` -> `http://127.0.0.1:8100/`)
strips the prefix; the server learns it either from `serve --root-path /tts` (uvicorn's `root_path`:
every request's `scope["path"]` then begins with it, `scope["root_path"]` says it) or, per request,
from `X-Forwarded-Prefix: /tts` sent by a proxy whose address is one of `--trusted-proxies` (the
setting that already names the proxies whose `X-Forwarded-For` is read, `api/ops/clients.py`). From
such a proxy `X-Forwarded-Proto` (http, https; ws, wss on a socket) is the request's scheme too.
Headers from any other peer are ignored: anyone could send them. uvicorn's own proxy-header handling
is off (`connections.uvicorn_config`), so one setting decides whom the server believes.

The prefix changes only what the server writes about its own address (redirects, `/docs`); routes
and the middleware match the path without it (Starlette's `get_route_path`). The web console, `/sdk/` and the SDKs
build every URL relative to the page or the base URL they are given, so they work under any prefix.
A prefix outside `paths.path_prefix`'s domain in the header is refused: 400 `invalid_forwarded_prefix`
(a socket: closed before it opens).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import invalid_request
from api.limits import parse_networks
from api.ops.clients import peer_in
from api.ops.path_prefix import path_prefix

PREFIX_HEADER = "x-forwarded-prefix"
PROTO_HEADER = "x-forwarded-proto"
_SCHEMES = {"http": ("http", "ws"), "https": ("https", "wss"), "ws": ("http", "ws"), "wss": ("https", "wss")}


class ForwardedHeaders:
    """Pure ASGI middleware, outermost: a trusted proxy's `X-Forwarded-Prefix` becomes the request's
    root path (replacing `--root-path`), its `X-Forwarded-Proto` the request's scheme."""

    def __init__(self, app: ASGIApp, trusted_proxies: Sequence[str] = ()):
        self.app = app
        self.trusted = parse_networks(trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.trusted and peer_in(scope, self.trusted):
            headers = Headers(scope=scope)
            proto = headers.get(PROTO_HEADER, "").strip().lower()
            if proto in _SCHEMES:
                scope["scheme"] = _SCHEMES[proto][scope["type"] == "websocket"]
            forwarded = headers.get(PREFIX_HEADER)
            if forwarded is not None:
                try:
                    prefix = path_prefix(forwarded)
                except ValueError as e:
                    await _refuse(str(e), scope, receive, send)
                    return
                _set_prefix(scope, prefix)
        await self.app(scope, receive, send)


def _set_prefix(scope: Scope, prefix: str) -> None:
    """The request as uvicorn gives it under `root_path=prefix`: the prefix in front of the route path."""
    old_root = scope.get("root_path", "")
    path = get_route_path(scope)
    scope["root_path"], scope["path"] = prefix, prefix + path
    raw = scope.get("raw_path")
    if raw is not None:
        if old_root and raw.startswith(old_root.encode()):
            raw = raw[len(old_root.encode()):]
        scope["raw_path"] = prefix.encode() + raw


async def _refuse(reason: str, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": "invalid X-Forwarded-Prefix"})
        return
    error = invalid_request(f"X-Forwarded-Prefix: {reason}.", code="invalid_forwarded_prefix")
    await error.response()(scope, receive, send)
