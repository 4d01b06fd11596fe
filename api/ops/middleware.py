"""Pure ASGI middleware (no BaseHTTPMiddleware, so streaming and disconnects pass straight through).

- `APIKeyMiddleware`: the API routes need `Authorization: Bearer <key>`; checked before the body
  is read, so an unauthenticated client learns nothing about its request.
- `RequestObserver`: gives every HTTP response an `x-request-id` and counts responses by route and
  status for /metrics; an unexpected exception is logged with the request id and answered with a
  plain 500 envelope (its text, class and traceback never reach the client).
- `BodyLimits`: a request body over its size cap gets 413 (`Content-Length` checked up front,
  chunked bodies counted as they arrive), one that does not arrive within `body_timeout_s` of the
  headers gets 408; either way the connection is closed and the route sees the client as gone, so
  it frees what it held. A body that is not an upload is read as JSON whatever its Content-Type
  (`read_as_json`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import Sequence

from starlette.datastructures import Headers, MutableHeaders
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import (
    API_PREFIXES,
    SENT_CONTENT_TYPE,
    SERVER_ERROR,
    APIError,
    error_response,
    invalid_request,
    no_key,
    payload_too_large,
    unauthorized,
)
from api.limits import ServerLimits
from api.ops import headers
from api.ops.metrics import Metrics

log = logging.getLogger("api.requests")

PROTECTED_PREFIXES = API_PREFIXES
PUBLIC_LISTINGS = ("/v1/audio/voices", "/v1/audio/models")
"""What `serve --public-listings` answers without the key (GET only): the two lists Open WebUI reads
without sending its key (docs/integrations.md)."""
UPLOAD_PATHS = ("/v1/audio/voices",)
"""POST routes whose body is a multipart upload (`max_upload_bytes`; other bodies: `max_body_bytes`)."""
_CLOSE = {"Connection": "close"}


KEY_HEADER = "xi-api-key"
"""The header ElevenLabs' clients send their key in: taken as the key wherever `Authorization` is."""


def bearer_token(scope: Scope) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (or of `xi-api-key`), or None."""
    headers = Headers(scope=scope)
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return headers.get(KEY_HEADER) or None
    return token.strip() or None


def key_matches(expected: str, presented: str | None) -> bool:
    """Constant-time comparison of an API key (reusable by the WebSocket endpoint)."""
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())


class APIKeyMiddleware:
    """401 in the OpenAI envelope for API requests without the right key (health, metrics and the
    web console stay open). WebSocket endpoints authenticate themselves (browsers cannot send the
    header there): use `key_matches`."""

    def __init__(self, app: ASGIApp, api_key: str, prefixes: Sequence[str] = PROTECTED_PREFIXES,
                 open_lists: Sequence[str] = ()):
        self.app = app
        self.api_key = api_key
        self.prefixes = tuple(prefixes)
        self.open_lists = frozenset(open_lists)
        """Paths whose GET needs no key (`PUBLIC_LISTINGS` with `--public-listings`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = get_route_path(scope) if scope["type"] == "http" else ""  # under --root-path too
        if path.startswith(self.prefixes) and not (scope["method"] in ("GET", "HEAD") and path in self.open_lists):
            token = bearer_token(scope)
            if not key_matches(self.api_key, token):
                refusal = no_key(scope) if token is None else unauthorized("Incorrect API key provided.")
                await error_response(scope, refusal)(scope, receive, send)
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
        status = 500
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                MutableHeaders(scope=message)[headers.REQUEST_ID] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as e:
            if started:  # uvicorn drops the connection (a cut-off response never looks whole) and logs it
                log.error("request %s (%s %s) ended after its response began: %s", request_id, scope["method"],
                          scope["path"], type(e).__name__)
                raise
            log.exception("request %s (%s %s) failed", request_id, scope["method"], scope["path"])
            await internal_error().response()(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.inc(path=path, status=str(status))


def internal_error() -> APIError:
    """500 for an unexpected exception: a fixed message (the details are in the log, by request id)."""
    return APIError("The server had an error while processing your request.", status_code=500,
                    type=SERVER_ERROR, code="internal_error")


def request_timeout(seconds: float) -> APIError:
    """408: the request body did not arrive in time."""
    return APIError(f"The request body did not arrive within {seconds:g} s.", status_code=408,
                    code="request_timeout", headers=_CLOSE)


def body_too_large(limit: int) -> APIError:
    error = payload_too_large(f"The request body is larger than {limit} bytes, the limit here.")
    error.headers.update(_CLOSE)
    return error


DRAIN_BYTES = 16 * 1024 * 1024
"""A body over its limit but under this is read and dropped before the 413 goes out: a client still
sending when the server closes would get a connection reset instead of the answer."""


async def _discard_body(receive: Receive, timeout_s: float, max_bytes: int = DRAIN_BYTES) -> None:
    """Read and drop the rest of a request body (bounded in bytes and time)."""
    async def drain() -> None:
        left = max_bytes
        while left > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            left -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    try:
        await asyncio.wait_for(drain(), timeout=max(0.0, timeout_s))
    except asyncio.TimeoutError:
        pass


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _is_json(content_type: str) -> bool:
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def read_as_json(scope: Scope) -> None:
    """Give a request whose body the route reads as JSON `Content-Type: application/json`, whatever it
    was sent with: `curl -d '{...}'` sends application/x-www-form-urlencoded, other clients text/plain
    or nothing, and FastAPI reads only a JSON Content-Type as JSON. The type sent stays in
    `scope["state"][SENT_CONTENT_TYPE]`, for the error's message when the body is not JSON after all.
    (FastAPI's strictness guards against cross-site form posts; `hosts.BrowserGuard` refuses those.)"""
    sent = Headers(scope=scope).get("content-type")
    if scope["method"] in _BODY_METHODS and (sent is None or not _is_json(sent)):
        scope.setdefault("state", {})[SENT_CONTENT_TYPE] = sent or ""
        MutableHeaders(scope=scope)["content-type"] = "application/json"


class BodyLimits:
    """Bounds an HTTP request body in size (413) and in the time it takes to arrive (408); a body
    that is not an upload is read as JSON (`read_as_json`).

    The answer goes out at once, with `Connection: close`; from then on the route's `receive`
    says `http.disconnect` and what it sends is dropped, so it ends as if the client had left.
    """

    def __init__(self, app: ASGIApp, limits: ServerLimits, upload_paths: Sequence[str] = UPLOAD_PATHS):
        self.app = app
        self.limits = limits
        self.upload_paths = tuple(upload_paths)

    def is_upload(self, scope: Scope) -> bool:
        return scope["method"] == "POST" and get_route_path(scope).rstrip("/") in self.upload_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = self.is_upload(scope)
        limit = self.limits.max_upload_bytes if upload else self.limits.max_body_bytes
        if not upload:
            read_as_json(scope)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        request_headers = Headers(scope=scope)
        length = request_headers.get("content-length", "")
        if length and "transfer-encoding" in request_headers:  # ambiguous framing (request smuggling)
            error = invalid_request("A request may not carry both Content-Length and Transfer-Encoding.",
                                    code="invalid_http")
            error.headers.update(_CLOSE)
            await error_response(scope, error)(scope, receive, send)
            return
        if length.isdigit() and int(length) > limit:
            if int(length) <= DRAIN_BYTES:
                await _discard_body(receive, deadline - loop.time())
            await error_response(scope, body_too_large(limit))(scope, receive, send)
            return
        received = 0
        body_done = False
        started = answered = False

        async def answer(error: APIError) -> Message:
            nonlocal answered
            if not answered and not started:
                await error_response(scope, error)(scope, receive, send)
            answered = True
            return {"type": "http.disconnect"}

        async def bounded_receive() -> Message:
            nonlocal received, body_done
            if answered:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return await answer(request_timeout(self.limits.body_timeout_s))
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if message.get("more_body", False) and received <= DRAIN_BYTES:
                        await _discard_body(receive, deadline - loop.time(), DRAIN_BYTES - received)
                    return await answer(body_too_large(limit))
                body_done = not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return  # the client already has its answer
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, bounded_receive, guarded_send)
