"""WebSocket /v1/ws limits end to end (`api/limits.py`): message size, text and length of a
session, idle time, sockets per client and in all, a client that stops reading.

Each test runs its own real uvicorn server with the limits it checks set small; clients are the
`websockets` package. Timeouts are small but no test asserts a duration: each checks what happened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from api.testing import ServerThread
from tests.server_fixtures import registry_fixture
from tests.ws_helpers import (
    TEXT,
    TIMEOUT,
    event,
    eventually,
    expect_error,
    httpx,
    open_from,
    send,
    serve,
    start,
    until_done,
    wait_idle,
    whole_text_pcm,
)

MAX_STREAMS = 2


registry = registry_fixture(MAX_STREAMS)


def closed_with(ws: ClientConnection) -> int | None:
    """Read (discarding audio) until the server closes; the close code."""
    with pytest.raises(ConnectionClosed):
        while True:
            ws.recv(timeout=TIMEOUT)
    return ws.close_code


def next_event(ws: ClientConnection) -> dict:
    """The next JSON event, skipping audio frames."""
    while isinstance(message := ws.recv(timeout=TIMEOUT), bytes):
        pass
    return json.loads(message)


def admitted(ws: ClientConnection) -> bool:
    """Whether the server took this socket: a stray `stop` gets `no_active_stream`, a refused
    socket got `too_many_sockets` and is closed with 1013 (maybe before the `stop` went out)."""
    with contextlib.suppress(ConnectionClosed):
        send(ws, type="stop")
    error = event(ws)["error"]
    if error["code"] == "no_active_stream":
        return True
    assert error["code"] == "too_many_sockets" and error["type"] == "rate_limit_error", error
    assert closed_with(ws) == 1013
    return False


def admitted_now(server: ServerThread, address: str = "127.0.0.1") -> bool:
    """Whether a new socket from `address` gets in (it is closed again)."""
    ws = open_from(server, address)
    if not admitted(ws):
        return False
    ws.close()
    return True


# -- message size ------------------------------------------------------------------------------------


def test_a_message_over_the_size_limit_is_an_error_then_close_1009(registry):
    limit = 1024
    with serve(registry, ws_max_message_bytes=limit) as server, open_from(server) as ws:
        # exactly at the limit: read and answered as usual
        padding = limit - len(json.dumps({"type": "speak", "pad": ""}, separators=(",", ":")))
        ws.send(json.dumps({"type": "speak", "pad": "x" * padding}, separators=(",", ":")))
        expect_error(ws, "invalid_value", "type")
        start(ws, max_frames=400)
        send(ws, type="text", text="Hello there, this text keeps the stream waiting for more")
        assert isinstance(ws.recv(timeout=TIMEOUT), bytes)
        assert registry.default.engine.load()["active"] == 1
        # 600 characters, 1200 bytes: the limit counts bytes
        send(ws, type="text", text="é" * 600)
        error = next_event(ws)
        assert error["type"] == "error" and error["error"]["code"] == "payload_too_large", error
        assert closed_with(ws) == 1009
        assert wait_idle(registry)["active"] == 0  # the stream that was running went with the socket


# -- text, length and idle time of a session ----------------------------------------------------------


def test_text_past_the_session_limit_is_refused_and_the_session_goes_on(registry):
    accepted = ["Hello there. ", "Bye now"]  # 20 characters
    with serve(registry, ws_max_session_chars=20) as server, open_from(server) as ws:
        start(ws)
        send(ws, type="text", text=accepted[0])
        send(ws, type="text", text="This would be too long.")
        assert expect_error(ws, "string_above_max_length", "text")
        send(ws, type="text", text=accepted[1])
        send(ws, type="stop")
        audio, events = until_done(ws)
        assert [e["type"] for e in events] == ["done"] and events[-1]["limit"] is None
        assert audio == whole_text_pcm(server, "".join(accepted))  # the refused text was not spoken


def test_a_session_is_stopped_at_its_length_limit(registry):
    """With the idle timeout off, only the session length ends a session the client never stops."""
    with serve(registry, ws_max_session_s=1.0, ws_idle_timeout_s=0) as server, open_from(server) as ws:
        start(ws)
        send(ws, type="text", text=TEXT)
        audio, events = until_done(ws)
        assert [e["type"] for e in events] == ["done"], events
        done = events[-1]
        assert done["limit"] == "session_length" and done["idle_timeout"] is False
        assert done["finish_reason"] in ("max_frames", "eos")  # as `stop`: what was sent is spoken
        assert audio == whole_text_pcm(server, TEXT)
        # no text at all: cancelled at the limit, no error
        start(ws)
        _, events = until_done(ws)
        assert [e["type"] for e in events] == ["done"]
        assert events[-1]["limit"] == "session_length" and events[-1]["finish_reason"] == "cancelled"
        assert wait_idle(registry)["active"] == 0


def test_a_session_without_text_for_the_idle_timeout_is_stopped(registry):
    """A forgotten socket does not hold its engine slot: no text for `ws_idle_timeout_s` acts as
    `stop` (as `cancel` when no text came at all); text that keeps coming keeps the session open."""
    with serve(registry, ws_idle_timeout_s=0.6) as server, open_from(server) as ws:
        # text every 0.2 s for longer than the timeout: never stopped, then a normal stop
        start(ws, max_frames=40)
        for word in ("One ", "two ", "three ", "four ", "five."):
            send(ws, type="text", text=word)
            time.sleep(0.2)
        send(ws, type="stop")
        _, events = until_done(ws)
        assert [e["type"] for e in events] == ["done"]
        assert events[-1]["idle_timeout"] is False and events[-1]["limit"] is None
        # text, then silence: finished as if `stop` had come, with the same audio
        start(ws)
        send(ws, type="text", text=TEXT)
        audio, events = until_done(ws)
        assert [e["type"] for e in events] == ["done"], events
        assert events[-1]["idle_timeout"] is True and events[-1]["limit"] == "idle_timeout"
        assert events[-1]["finish_reason"] in ("max_frames", "eos")
        assert audio == whole_text_pcm(server, TEXT)
        assert wait_idle(registry)["active"] == 0
        # no text at all: cancelled, no error; the socket takes the next start
        start(ws)
        _, events = until_done(ws)
        assert [e["type"] for e in events] == ["done"]
        assert events[-1]["idle_timeout"] is True and events[-1]["finish_reason"] == "cancelled"
        assert wait_idle(registry)["active"] == 0
        start(ws, max_frames=1)
        send(ws, type="text", text="Again.")
        send(ws, type="stop")
        assert until_done(ws)[1][-1]["idle_timeout"] is False


def test_blank_deltas_do_not_keep_an_idle_session_alive(registry):
    """A few words, then only empty and whitespace deltas, faster than the idle timeout: the
    session is still stopped for being idle."""
    with serve(registry, ws_idle_timeout_s=0.6) as server, open_from(server) as ws:
        start(ws, max_frames=400)
        send(ws, type="text", text="A few words")
        events: list[dict] = []
        deadline = time.monotonic() + TIMEOUT
        while not events or events[-1]["type"] != "done":
            assert time.monotonic() < deadline, "the idle session was never stopped"
            send(ws, type="text", text=" " if len(events) % 2 else "")
            try:
                message = ws.recv(timeout=0.1)
            except TimeoutError:
                continue
            if isinstance(message, str):
                events.append(json.loads(message))
        done = events[-1]
        assert done["limit"] == "idle_timeout" and done["finish_reason"] in ("max_frames", "eos", "budget")
        # blank deltas that raced the stop are refused as late text, nothing else
        assert {e["error"]["code"] for e in events[:-1]} <= {"stream_closed"}
        assert wait_idle(registry)["active"] == 0


# -- sockets per client and in all --------------------------------------------------------------------


def test_sockets_per_client_and_in_all_are_capped(registry):
    with serve(registry, max_sockets_per_client=2, max_sockets=3) as server:
        a1, a2 = open_from(server, "127.0.0.1"), open_from(server, "127.0.0.1")
        assert admitted(a1) and admitted(a2)
        assert not admitted_now(server, "127.0.0.1")  # this client's third
        b1 = open_from(server, "127.0.0.2")
        assert admitted(b1)  # another client still gets in
        assert not admitted_now(server, "127.0.0.3")  # but not past the total
        a1.close()  # a socket that closes frees its place (refused ones never took one)
        eventually(lambda: admitted_now(server, "127.0.0.3"))
        for ws in (a2, b1):
            ws.close()


# -- a client that stops reading ------------------------------------------------------------------------


def test_a_client_that_stops_reading_is_ended_and_frees_its_slot(registry):
    """The client stops reading (a tiny receive buffer and message queue, and no recv), while its
    stream makes audio: TCP backpressure stalls the server's send, and after `send_timeout_s` the
    stream is cancelled and its engine slot freed. The stalled connection keeps its socket's place
    until the client reads again: then it gets the audio in flight, the close frame, and no `done`."""
    engine = registry.default.engine
    with serve(registry, send_timeout_s=0.5, max_sockets_per_client=1) as server:
        # accepted sockets inherit the listener's buffer size: a small send buffer on the server side
        server.server.servers[0].sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        cancelled_before = engine.stats["cancelled"]
        stalled = open_from(server, rcvbuf=4096, max_queue=1)
        try:
            start(stalled, max_frames=2000)
            send(stalled, type="text", text=" ".join([TEXT] * 20))
            send(stalled, type="stop")
            eventually(lambda: engine.stats["cancelled"] == cancelled_before + 1)
            ready = httpx.get(f"{server.url}/ready", timeout=TIMEOUT).json()
            assert ready["models"][0]["active"] == 0
            assert not admitted_now(server)  # the stalled connection is still this client's one socket
            with pytest.raises(ConnectionClosed):
                while True:
                    message = stalled.recv(timeout=TIMEOUT)
                    assert isinstance(message, bytes), message  # audio only: no `done`
            assert (stalled.close_code, stalled.close_reason) == (1008, "send_timeout")
            eventually(lambda: admitted_now(server))  # gone: its place is free
        finally:
            stalled.close_socket()


def test_a_text_frame_that_is_not_utf8_closes_1007_with_one_log_line(registry):
    """uvicorn logs this client fault with a traceback; the server makes it one warning line."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    uvicorn_log = logging.getLogger("uvicorn.error")  # no propagation to the root; configured per server
    with serve(registry) as server:
        uvicorn_log.addHandler(handler)
        try:
            with open_from(server) as ws:
                ws.send(b'{"type":"start","voice":"\xff\xfe"}', text=True)  # bytes sent as a text frame
                assert closed_with(ws) == 1007
        finally:
            uvicorn_log.removeHandler(handler)
    faults = [r for r in records if r.getMessage().startswith("Invalid UTF-8")]
    assert faults and all(r.exc_info is None and r.levelname == "WARNING" for r in faults)
