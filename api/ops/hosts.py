"""Browser safety without a key: a Host allow-list (DNS rebinding) and no cross-site form posts.

- **Host allow-list.** A web page can rebind its own DNS name to 127.0.0.1 and then talk to a local
  server as "its own" site; its requests still carry `Host: evil.example`. When the server is bound
  to a loopback address, only the loopback names (`localhost`, `127.0.0.1`, `[::1]`, any port) are
  accepted; `limits.allowed_hosts` sets the list (`*` = any host, `*.example.com` = its subdomains).
  `/health` and `/ready` answer any Host (probes use the pod's address). Refused: 400
  `host_not_allowed`.
- **Cross-site requests.** A browser sends a form (`multipart/form-data`, urlencoded, `text/plain`)
  to any site without asking first, with the page's `Origin`. A state-changing request (any method
  but GET, HEAD, OPTIONS) whose `Origin` is neither this server's own origin nor an allowed CORS
  origin, or that says `Sec-Fetch-Site: cross-site` without an allowed Origin, is refused: 403
  `origin_not_allowed`. Clients that are not browsers send no Origin and are not affected.

The WebSocket endpoint checks its handshake itself with `host_allowed(scope, config)` (this
middleware sees HTTP only).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from api.config import ServerConfig
from api.errors import APIError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
EXEMPT_PATHS = ("/health", "/ready")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_loopback(host: str) -> bool:
    """Whether a bind address only takes connections from this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _hostname(value: str) -> str | None:
    """The host name of a `Host` header or origin netloc, lowercased, without port or brackets."""
    try:
        return urlsplit(f"//{value.strip()}").hostname
    except ValueError:
        return None


def allowed_hosts(config: ServerConfig) -> tuple[str, ...] | None:
    """The accepted host names (normalized), or None for any host."""
    configured = config.limits.allowed_hosts
    if configured is None:
        return LOOPBACK_NAMES if is_loopback(config.host) else None
    if "*" in configured:
        return None
    return tuple(entry.strip().lower() if entry.strip().startswith("*.") else (_hostname(entry) or "")
                 for entry in configured)


def host_matches(host_header: str | None, allowed: tuple[str, ...] | None) -> bool:
    if allowed is None:
        return True
    name = _hostname(host_header) if host_header else None
    if not name:
        return False
    return any(name == entry or (entry.startswith("*.") and name.endswith(entry[1:])) for entry in allowed)


def host_allowed(scope: Scope, config: ServerConfig) -> bool:
    """Whether the `Host` of an HTTP request or WebSocket handshake is on the allow-list."""
    return host_matches(Headers(scope=scope).get("host"), allowed_hosts(config))


def origin_allowed(scope: Scope, config: ServerConfig) -> bool:
    """No Origin and not cross-site (not a browser, or same-site), the server's own origin, or a
    CORS origin."""
    headers = Headers(scope=scope)
    origin = headers.get("origin")
    if origin is None:
        return headers.get("sec-fetch-site", "").lower() != "cross-site"
    if "*" in config.cors_origins or origin in config.cors_origins:
        return True
    return bool(origin != "null" and urlsplit(origin).netloc.lower() == headers.get("host", "").lower())


def host_not_allowed(host: str | None) -> APIError:
    shown = (host or "")[:100]
    return APIError(f"Host '{shown}' is not served here (start the server with --allowed-hosts to add it).",
                    param=None, code="host_not_allowed")


def cross_site_refused() -> APIError:
    return APIError("Cross-site requests may not change anything here (start the server with --cors-origin "
                    "to allow a web site).", status_code=403, code="origin_not_allowed")


class BrowserGuard:
    """Pure ASGI middleware: the Host allow-list, then the cross-site check (HTTP only)."""

    def __init__(self, app: ASGIApp, config: ServerConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = None
            if get_route_path(scope) not in EXEMPT_PATHS and not host_allowed(scope, self.config):
                problem = host_not_allowed(Headers(scope=scope).get("host"))
            elif scope["method"] not in SAFE_METHODS and not origin_allowed(scope, self.config):
                problem = cross_site_refused()
            if problem is not None:
                await problem.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
