"""uvicorn as this server runs it: one function builds its settings (`serve` and tests alike), and an
HTTP protocol that bounds connections.

uvicorn has no timeout for a request head: a client may open a connection and send nothing, or
trickle a header byte by byte, forever. `BoundedH11Protocol` (uvicorn's h11 protocol, the one it
uses here) closes a connection that has not completed a request head within `header_timeout_s` of
opening or of its previous response. Requests beyond `max_connections` open connections (or
running requests) get 503 in the OpenAI envelope (uvicorn's own `limit_concurrency` answer is plain
text), with `Connection: close`. A client's protocol error that uvicorn logs with a traceback
(a WebSocket text frame that is not UTF-8) is logged as one warning line (`ClientFaultsQuiet`), so
no client can flood the log with tracebacks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.config import ServerConfig
from api.errors import invalid_request, unavailable

GRACEFUL_SHUTDOWN_S = 5
WS_HARD_LIMIT_BYTES = 1024 * 1024
"""WebSocket messages above max(this, 2 x --ws-max-message-bytes) are dropped by uvicorn (1009)
without an error event; smaller ones over the limit get one."""


async def _too_many_connections(scope: Any, receive: Any, send: Any) -> None:
    error = unavailable("The server has too many open connections; retry shortly.", retry_after_s=1)
    error.headers["Connection"] = "close"
    await error.response()(scope, receive, send)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head timeout and an enveloped connection limit."""

    header_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_connections = self.limit_concurrency
        self.limit_concurrency = None  # checked in handle_events, answered with the envelope
        self._app = self.app
        self._head_timer: asyncio.TimerHandle | None = None
        self._upgraded = False

    # -- the request-head timer: armed while no request is in progress -------------------------
    def _watch_head(self) -> None:
        waiting = not self._upgraded and (self.cycle is None or self.cycle.response_complete)
        if waiting and not self.transport.is_closing():
            if self._head_timer is None:  # trickled bytes never extend it
                self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)
        elif self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:
                pass
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._upgraded = True
        self._watch_head()
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._upgraded = True  # nothing to watch any more
        self._watch_head()
        super().connection_lost(exc)

    # -- malformed requests ------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, in the OpenAI envelope. A request whose
        app is already running (a bad chunk mid-body) is cut loose first, so the app sees the
        client as gone instead of answering into a connection that has its answer."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:  # too late for a status: just close
                self.transport.close()
                return
        error = invalid_request("The request is not valid HTTP/1.1.", code="invalid_http")
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), (b"x-should-retry", b"false")]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers,
                                                             reason=b"Bad Request")))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # the connection's state allows no answer any more
            pass
        self.transport.close()

    # -- the connection limit ---------------------------------------------------------------------
    def handle_events(self) -> None:
        limit = self.max_connections
        busy = limit is not None and (len(self.connections) > limit or len(self.tasks) >= limit)
        self.app = _too_many_connections if busy else self._app
        super().handle_events()


def bounded_protocol(header_timeout_s: float) -> type[BoundedH11Protocol]:
    """The protocol class with this request-head timeout (uvicorn takes a class)."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"header_timeout_s": header_timeout_s})


class ClientFaultsQuiet(logging.Filter):
    """uvicorn's tracebacks for faults of a client's making become one warning line."""

    MESSAGES = ("Invalid UTF-8 sequence received from client.",)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in self.MESSAGES:
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _quiet_client_faults() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientFaultsQuiet) for f in logger.filters):
        logger.addFilter(ClientFaultsQuiet())


def check_tls(config: ServerConfig) -> None:
    """Refuse TLS settings uvicorn would fail on only once the models are loaded: ValueError naming the
    flag (a key without a certificate, a file that is missing or not PEM, a key that does not match)."""
    if config.ssl_certfile is None:
        if config.ssl_keyfile is not None:
            raise ValueError("--ssl-keyfile needs --ssl-certfile")
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            config.ssl_certfile, config.ssl_keyfile, password=lambda: b"")  # an encrypted key is refused
    except (OSError, ssl.SSLError) as e:
        files = f"{config.ssl_certfile}" + (f", --ssl-keyfile {config.ssl_keyfile}" if config.ssl_keyfile else "")
        raise ValueError(f"--ssl-certfile {files}: {getattr(e, 'strerror', None) or e}") from None


def _path(path: Any) -> str | None:
    return None if path is None else str(path)


def uvicorn_config(app: Any, config: ServerConfig, *, host: str | None = None, port: int | None = None,
                   **overrides: Any) -> uvicorn.Config:
    """uvicorn's settings for `app` under `config` (the bind address may be overridden, e.g. port 0): the
    limits above, `--root-path`, TLS (`--ssl-certfile`, `--ssl-keyfile`)."""
    limits = config.limits
    settings: dict[str, Any] = dict(host=config.host if host is None else host,
                                    port=config.port if port is None else port,
                                    http=bounded_protocol(limits.header_timeout_s),
                                    limit_concurrency=limits.max_connections,
                                    # the app answers oversize messages with an error event; uvicorn
                                    # drops only far bigger ones itself (1009)
                                    ws_max_size=max(2 * limits.ws_max_message_bytes, WS_HARD_LIMIT_BYTES),
                                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, log_level="info",
                                    # a trusted proxy's headers are read by the app (forwarded.py, clients.py)
                                    # against --trusted-proxies; uvicorn's own reading trusts loopback peers
                                    proxy_headers=False, root_path=config.root_path,
                                    ssl_certfile=_path(config.ssl_certfile), ssl_keyfile=_path(config.ssl_keyfile))
    settings.update(overrides)
    _quiet_client_faults()
    return uvicorn.Config(app, **settings)
