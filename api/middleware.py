"""Pure ASGI middleware (no BaseHTTPMiddleware, so streaming and disconnects pass straight through).

- `APIKeyMiddleware`: the API routes need `Authorization: Bearer <key>`; checked before the body
  is read, so an unauthenticated client learns nothing about its request.
- `RequestObserver`: gives every HTTP response an `x-request-id` and counts responses by route and
  status for /metrics.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import Sequence

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import headers
from .errors import unauthorized
from .metrics import Metrics

PROTECTED_PREFIXES = ("/v1/", "/audio/")


def bearer_token(scope: Scope) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, or None."""
    value = Headers(scope=scope).get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def key_matches(expected: str, presented: str | None) -> bool:
    """Constant-time comparison of an API key (reusable by the WebSocket endpoint)."""
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())


class APIKeyMiddleware:
    """401 in the OpenAI envelope for API requests without the right key (health, metrics and the
    web console stay open). WebSocket endpoints authenticate themselves (browsers cannot send the
    header there): use `key_matches`."""

    def __init__(self, app: ASGIApp, api_key: str, prefixes: Sequence[str] = PROTECTED_PREFIXES):
        self.app = app
        self.api_key = api_key
        self.prefixes = tuple(prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.prefixes):
            token = bearer_token(scope)
            if not key_matches(self.api_key, token):
                message = ("You didn't provide an API key: send 'Authorization: Bearer <key>'." if token is None
                           else "Incorrect API key provided.")
                await unauthorized(message).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RequestObserver:
    """Adds `x-request-id` to each HTTP response and counts responses by route and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        scope["state"]["received_at"] = time.monotonic()
        status = 500  # an exception before any response: Starlette answers 500 outside us

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[headers.REQUEST_ID] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.inc(path=path, status=str(status))
