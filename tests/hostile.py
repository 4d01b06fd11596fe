"""Clients for the hostile-client suite (`tests/test_hostile_clients.py`).

Every client connects from its own loopback address (127.0.0.N), so the server sees separate
clients (its per-client caps count by address) without trusting any proxy header. Raw sockets
speak HTTP/1.1 by hand where a library would refuse to send what a hostile client sends.

`Audit` collects what went wrong instead of stopping at the first problem, so one run lists every
hostile request that was not answered cleanly, with the request and the response.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import openai
from websockets.sync.client import ClientConnection, connect

KEY = "hostile-suite-key"
VERBOSE = bool(os.environ.get("QTTS_HOSTILE_VERBOSE"))
"""Print every hostile exchange (label, status, error code) as it is checked."""
TIMEOUT = 60.0
ENVELOPE_KEYS = {"message", "type", "param", "code"}


def ip(n: int) -> str:
    """The loopback address 127.0.0.n: one client each."""
    return f"127.0.0.{n}"


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll `predicate` until it holds; AssertionError naming `what` after `timeout_s` (a bound on a
    failure, never a measurement)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- raw HTTP ------------------------------------------------------------------------------------


def raw_socket(port: int, address: str, *, rcvbuf: int | None = None, timeout: float = TIMEOUT) -> socket.socket:
    """A TCP connection to the server from `address` (a small `rcvbuf` makes a stalled reader stall soon)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def reset(sock: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0) instead of a FIN: a client that vanishes."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    sock.close()


def request_bytes(method: str, path: str, body: bytes = b"", *, key: str | None = KEY, host: str = "127.0.0.1",
                  headers: dict[str, str] | None = None, content_length: bool = True,
                  content_type: str | None = "application/json") -> bytes:
    """One HTTP/1.1 request as bytes (head + body)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if content_type is not None and (body or method in ("POST", "PUT", "PATCH")):
        lines.append(f"Content-Type: {content_type}")
    if content_length and (body or method in ("POST", "PUT", "PATCH")):
        lines.append(f"Content-Length: {len(body)}")
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class RawResponse:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    complete: bool
    """The body ended as its framing says (terminating chunk, or Content-Length bytes)."""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


class RawReader:
    """Reads one HTTP/1.1 response from a socket, in parts (head, then as much body as wanted)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.eof = False

    def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def head(self) -> tuple[int, str, dict[str, str]] | None:
        """Status, reason and headers (lower-cased names); None when the connection closed first.
        Interim 1xx responses (100 Continue) are skipped."""
        while True:
            while b"\r\n\r\n" not in self.buf:
                if not self._fill():
                    return None
            raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
            lines = raw.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            status = int(parts[1])
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
            if 100 <= status < 200:
                continue
            return status, parts[2] if len(parts) > 2 else "", headers

    def some_body(self, at_least: int) -> bytes:
        """At least `at_least` raw body bytes (framing included), or fewer at EOF."""
        while len(self.buf) < at_least and self._fill():
            pass
        return self.buf

    def body(self, headers: dict[str, str]) -> tuple[bytes, bool]:
        """The whole body and whether it was complete."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            out, pos = bytearray(), 0
            while True:
                while b"\r\n" not in self.buf[pos:]:
                    if not self._fill():
                        return bytes(out), False
                end = self.buf.index(b"\r\n", pos)
                size = int(self.buf[pos:end].split(b";")[0] or b"0", 16)
                while len(self.buf) < end + 2 + size + 2:
                    if not self._fill():
                        out += self.buf[end + 2:end + 2 + size]
                        return bytes(out), False
                out += self.buf[end + 2:end + 2 + size]
                pos = end + 2 + size + 2
                if size == 0:
                    return bytes(out), True
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n and self._fill():
                pass
            return self.buf[:n], len(self.buf) >= n
        while self._fill():
            pass
        return self.buf, True


def raw_exchange(port: int, address: str, data: bytes, *, timeout: float = TIMEOUT) -> RawResponse | None:
    """Send `data` on a fresh connection and read one response (None: closed without one)."""
    with raw_socket(port, address, timeout=timeout) as sock:
        sock.sendall(data)
        reader = RawReader(sock)
        head = reader.head()
        if head is None:
            return None
        status, reason, headers = head
        body, complete = reader.body(headers)
        return RawResponse(status, reason, headers, body, complete)


def sse_audio(text: str) -> tuple[bytes, list[dict]]:
    """The audio of an SSE body (its deltas joined) and its events."""
    audio, events = bytearray(), []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                event = json.loads(line[6:])
                events.append(event)
                if event.get("type") == "speech.audio.delta":
                    audio += base64.b64decode(event["audio"])
    return bytes(audio), events


# -- library clients -------------------------------------------------------------------------------


def http_client(server, address: str, key: str | None = KEY, timeout: float = TIMEOUT) -> httpx.Client:
    """An httpx client from `address` (a fresh connection per client)."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.Client(base_url=server.url, timeout=timeout, headers=headers,
                        transport=httpx.HTTPTransport(local_address=address))


def sdk_client(server, address: str, key: str = KEY) -> tuple[openai.OpenAI, httpx.Client]:
    """The real OpenAI SDK (no retries) from `address`; close the httpx client after use."""
    http = httpx.Client(timeout=TIMEOUT, transport=httpx.HTTPTransport(local_address=address))
    return openai.OpenAI(base_url=server.api_url, api_key=key, max_retries=0, http_client=http), http


def ws_open(server, address: str, key: str | None = KEY, rcvbuf: int | None = None, **kwargs: Any) -> ClientConnection:
    """A WebSocket to /v1/ws from `address` (key as `?api_key=`)."""
    sock = raw_socket(server.port, address, rcvbuf=rcvbuf)
    url = f"ws://{server.host}:{server.port}/v1/ws" + (f"?api_key={key}" if key is not None else "")
    return connect(url, sock=sock, open_timeout=TIMEOUT, close_timeout=5, **kwargs)


def ws_send(ws: ClientConnection, **message: Any) -> None:
    ws.send(json.dumps(message))


def ws_next(ws: ClientConnection, timeout: float = TIMEOUT) -> dict | bytes:
    message = ws.recv(timeout=timeout)
    return message if isinstance(message, bytes) else json.loads(message)


def ws_until_done(ws: ClientConnection, timeout: float = TIMEOUT) -> tuple[bytes, list[dict]]:
    """Audio and events up to and including `done`."""
    audio, events = bytearray(), []
    while not events or events[-1].get("type") != "done":
        message = ws_next(ws, timeout)
        if isinstance(message, bytes):
            audio += message
        else:
            events.append(message)
    return bytes(audio), events


# -- the audit ---------------------------------------------------------------------------------------


def short(data: bytes | str, n: int = 300) -> str:
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    return text if len(text) <= n else text[:n] + f"... ({len(text)} chars)"


def envelope_problem(body: bytes | str | dict) -> str | None:
    """Why `body` is not OpenAI's error envelope (None: it is)."""
    try:
        parsed = body if isinstance(body, dict) else json.loads(body)
    except ValueError:
        return "the body is not JSON"
    if not isinstance(parsed, dict) or set(parsed) != {"error"} or not isinstance(parsed["error"], dict):
        return "the body is not {'error': {...}}"
    error = parsed["error"]
    if set(error) != ENVELOPE_KEYS:
        return f"the error has keys {sorted(error)}, not {sorted(ENVELOPE_KEYS)}"
    if not isinstance(error["message"], str) or not error["message"] or not isinstance(error["type"], str):
        return "the error's message or type is not a non-empty string"
    if not all(error[k] is None or isinstance(error[k], str) for k in ("param", "code")):
        return "the error's param or code is neither a string nor null"
    return None


@dataclass
class Expect:
    """What a hostile request must get. `status`: the acceptable statuses (200 means a complete
    response); `code`/`param`: the envelope's, when given (for statuses other than 200)."""

    status: Iterable[int]
    code: str | Iterable[str] | None = None
    param: str | None | type(...) = ...
    headers: dict[str, str] = field(default_factory=dict)
    """Response headers that non-200 answers must carry, each containing its value (case-insensitive;
    "" = any value)."""


def expect(*status: int, code: str | Iterable[str] | None = None, param: Any = ..., **headers: str) -> Expect:
    return Expect(status, code, param, {k.replace("_", "-"): v for k, v in headers.items()})


class Audit:
    """Thread-safe record of every hostile exchange and of each problem found in one."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.exchanges = 0
        self._lock = threading.Lock()

    def problem(self, label: str, message: str) -> None:
        with self._lock:
            self.problems.append(f"[{label}] {message}")

    def response(self, label: str, status: int, headers: dict[str, str] | Any, body: bytes, want: Expect,
                 complete: bool = True) -> dict | None:
        """Check one HTTP answer; returns the error object of an envelope (or None)."""
        with self._lock:
            self.exchanges += 1
        shown = f"got {status} {short(body)}"
        if VERBOSE:
            print(f"HOSTILE [{label}] {status} {short(body, 160) if status != 200 else f'{len(body)} bytes'}")
        error = None
        if status >= 500:
            self.problem(label, f"a 5xx answer: {shown}")
        if status != 200:
            why = envelope_problem(body)
            if why is not None:
                self.problem(label, f"not the error envelope ({why}): {shown}")
            else:
                error = json.loads(body)["error"]
        elif not complete:
            self.problem(label, f"a 200 whose body was cut off ({len(body)} bytes)")
        statuses = tuple(want.status)
        if status not in statuses:
            self.problem(label, f"expected status {'/'.join(map(str, statuses))}, {shown}")
        if error is not None and status in statuses:
            codes = (want.code,) if isinstance(want.code, str) else want.code
            if codes is not None and error["code"] not in tuple(codes):
                self.problem(label, f"expected code {'/'.join(codes)}, {shown}")
            if want.param is not ... and error["param"] != want.param:
                self.problem(label, f"expected param {want.param!r}, {shown}")
        for name, value in want.headers.items():
            got = headers.get(name)
            if status in statuses and status != 200 and (got is None or value.lower() not in got.lower()):
                self.problem(label, f"expected header {name}: {value}, got {got!r} ({shown})")
        return error

    def httpx(self, label: str, call: Callable[[], httpx.Response], want: Expect) -> httpx.Response | None:
        """Run an httpx request (body read in full) and check its answer."""
        try:
            response = call()
        except httpx.RemoteProtocolError as e:  # a cut-off body, or no answer at all
            self.problem(label, f"the connection broke ({type(e).__name__}: {e})")
            return None
        except Exception as e:  # noqa: BLE001 - reported with the request's label
            self.problem(label, f"no answer ({type(e).__name__}: {e})")
            return None
        self.response(label, response.status_code, response.headers, response.content, want)
        return response

    def raw(self, label: str, response: RawResponse | None, want: Expect) -> None:
        if response is None:
            self.problem(label, "the server closed the connection without an answer")
            return
        self.response(label, response.status, response.headers, response.body, want, response.complete)

    def ws_error(self, label: str, event: dict | bytes, code: str | Iterable[str] | None = None,
                 param: Any = ...) -> dict | None:
        """Check a WebSocket `error` event (envelope, code, param)."""
        with self._lock:
            self.exchanges += 1
        if VERBOSE:
            print(f"HOSTILE [{label}] {short(repr(event), 160)}")
        if isinstance(event, bytes) or event.get("type") != "error":
            self.problem(label, f"expected an error event, got {short(repr(event))}")
            return None
        why = envelope_problem({"error": event.get("error")})
        if why is not None:
            self.problem(label, f"error event not in the envelope ({why}): {short(json.dumps(event))}")
            return None
        error = event["error"]
        if error["type"] == "server_error":
            self.problem(label, f"a server error: {short(json.dumps(event))}")
        codes = (code,) if isinstance(code, str) else code
        if codes is not None and error["code"] not in tuple(codes):
            self.problem(label, f"expected code {'/'.join(codes)}, got {short(json.dumps(event))}")
        if param is not ... and error["param"] != param:
            self.problem(label, f"expected param {param!r}, got {short(json.dumps(event))}")
        return error

    def guard(self, label: str, fn: Callable[[], Any]) -> Any:
        """Run one scripted hostile step; an exception is recorded as a problem, not raised."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - each step's failure is reported with its label
            self.problem(label, f"{type(e).__name__}: {e}")
            return None

    def assert_clean(self) -> None:
        assert not self.problems, f"{len(self.problems)} problem(s) in {self.exchanges} hostile exchanges:\n" + \
            "\n".join(self.problems)
