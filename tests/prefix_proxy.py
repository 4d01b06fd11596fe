"""A tiny reverse proxy for the tests: what nginx's `location /tts/ { proxy_pass http://upstream/; }` does.

Requests under `prefix` go to the upstream server without it, HTTP (bodies and responses streamed) and
WebSockets (messages both ways) alike, with the client's `Host` and `Origin`, `X-Forwarded-For` and
`X-Forwarded-Proto`, and `X-Forwarded-Prefix` when `send_prefix` (for a server that trusts this proxy
instead of knowing its `--root-path`). Anything else is 404. It runs on uvicorn in a thread
(`api.testing.ServerThread`), as a plain ASGI app.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from api import ServerConfig
from api.testing import ServerThread
from tests.ws_helpers import httpx

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length"}
WS_HANDSHAKE = {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol",
                "origin", "user-agent"}


class PrefixProxy:
    """The proxy as an ASGI app: `prefix` ("/tts") in front of the upstream `host:port`."""

    def __init__(self, upstream_host: str, upstream_port: int, prefix: str, *, send_prefix: bool):
        self.upstream = (upstream_host, upstream_port)
        self.prefix, self.send_prefix = prefix, send_prefix
        self.seen: list[str] = []
        """Every upstream path asked for (`path?query`), HTTP and WebSocket."""

    def _forwarded(self, scope: dict[str, Any]) -> list[tuple[str, str]]:
        extra = [("x-forwarded-for", scope["client"][0]),
                 ("x-forwarded-proto", "https" if scope["scheme"] in ("https", "wss") else "http")]
        return extra + ([("x-forwarded-prefix", self.prefix)] if self.send_prefix else [])

    def _target(self, scope: dict[str, Any]) -> str | None:
        path = scope["path"]
        if not path.startswith(self.prefix + "/"):
            return None
        query = scope.get("query_string", b"").decode("latin-1")
        return path[len(self.prefix):] + (f"?{query}" if query else "")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        target = self._target(scope)
        if target is None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await send({"type": "http.response.start", "status": 404, "headers": []})
                await send({"type": "http.response.body", "body": b"not under the prefix"})
            return
        self.seen.append(target)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        host = next((v for k, v in headers if k == "host"), "")
        if scope["type"] == "websocket":
            await self._socket(scope, receive, send, target, host, headers)
        else:
            await self._http(scope, receive, send, target, host, headers)

    async def _http(self, scope, receive, send, target: str, host: str, headers) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        out = [(k, v) for k, v in headers if k not in HOP_BY_HOP] + [("host", host)] + self._forwarded(scope)
        url = f"http://{self.upstream[0]}:{self.upstream[1]}{target}"
        async with httpx.AsyncClient(timeout=60, trust_env=False) as client, \
                client.stream(scope["method"], url, headers=out, content=body) as response:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode(), v.encode()) for k, v in response.headers.multi_items()
                                    if k.lower() not in HOP_BY_HOP]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    async def _socket(self, scope, receive, send, target: str, host: str, headers) -> None:
        await receive()  # websocket.connect
        origin = next((v for k, v in headers if k == "origin"), None)
        passed = [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in WS_HANDSHAKE]
        try:  # the URI's host is the Host header; host= and port= are where the TCP connection goes
            upstream = await connect(f"ws://{host}{target}", host=self.upstream[0], port=self.upstream[1],
                                     subprotocols=scope.get("subprotocols") or None, origin=origin,
                                     additional_headers=passed + self._forwarded(scope), compression=None,
                                     max_size=None, proxy=None)
        except (InvalidStatus, OSError):
            await send({"type": "websocket.close", "code": 1011})
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})

        async def down() -> None:  # upstream -> client
            with contextlib.suppress(ConnectionClosed):
                async for message in upstream:
                    key = "text" if isinstance(message, str) else "bytes"
                    await send({"type": "websocket.send", key: message})
            close = upstream.close_code or 1000
            await send({"type": "websocket.close", "code": close, "reason": upstream.close_reason or ""})

        async def up() -> None:  # client -> upstream
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    await upstream.close()
                    return
                await upstream.send(message["text"] if message.get("text") is not None else message["bytes"])

        tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks)
        await upstream.close()


def proxy_thread(proxy: PrefixProxy) -> ServerThread:
    """The proxy on uvicorn, 127.0.0.1 and a free port (a context manager, as every test server); the
    thread's `proxy` is `proxy` (what it saw: `proxy.seen`)."""
    thread = ServerThread(proxy, config=ServerConfig())  # type: ignore[arg-type]
    thread.proxy = proxy  # type: ignore[attr-defined]
    return thread
