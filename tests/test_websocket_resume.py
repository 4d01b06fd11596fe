"""Resumable `/v1/ws` streams end to end (`api/protocols/resume.py`): a real uvicorn server, the `websockets`
client, the tiny random model in the deterministic profile.

The proof that a resume loses nothing: a stream whose TCP connection is cut mid-stream and resumed on
a new socket from the last acknowledged (or received) byte gives, joined, the same PCM bytes as the
whole text through POST /v1/audio/speech (same seed and max_frames). Text is sent in two parts around
the cut, so the stream is still waiting for words when it is cut (it cannot finish meanwhile).
"""

from __future__ import annotations

import functools
import json
import socket
import struct
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from api.limits import ServerLimits
from api.testing import ServerThread
from tests import ws_helpers
from tests.server_fixtures import registry_fixture, server_fixture
from tests.ws_helpers import (
    KEY,
    TIMEOUT,
    event,
    event_after_audio,
    httpx,
    open_from,
    open_ws,
    send,
    serve,
    until_done,
    wait_idle,
    whole_text_pcm,
)

MAX_STREAMS = 4
FRAMES = 48
FIRST, SECOND = "Hello there, this is a live streaming", " test of words that resume."
TEXT = FIRST + SECOND
BYTES_PER_FRAME = 2 * 1920

eventually = functools.partial(ws_helpers.eventually, interval=0.02)


registry = registry_fixture(MAX_STREAMS)
# a server of its own per test (an app's lifespan starts and stops the registry's engines)
server = server_fixture(scope="function")


def start(ws: ClientConnection, **fields) -> dict:
    """`start` a resumable stream of FRAMES frames."""
    return ws_helpers.start(ws, **{"max_frames": FRAMES, "resumable": True, **fields})


def audio_at_least(ws: ClientConnection, n: int) -> bytes:
    """Binary frames until at least `n` bytes came (no event may come first)."""
    audio = bytearray()
    while len(audio) < n:
        message = ws.recv(timeout=TIMEOUT)
        assert isinstance(message, bytes), message
        audio += message
    return bytes(audio)


def cut(ws: ClientConnection) -> None:
    """Drop the TCP connection at once (an RST, no close frame): a lost network."""
    ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.close_socket()


def resume(server: ServerThread, token: str, audio_bytes: int, key: str | None = KEY) -> tuple[ClientConnection, dict]:
    ws = open_ws(server, key)
    send(ws, type="resume", resume_token=token, audio_bytes=audio_bytes)
    return ws, event(ws)


def cut_midway(server: ServerThread, key: str | None = KEY) -> tuple[str, bytes]:
    """A resumable stream sent FIRST, then cut after its first frame: its resume token and the audio got."""
    ws = open_ws(server, key)
    token = start(ws)["resume_token"]
    send(ws, type="text", text=FIRST, seq=1)
    got = audio_at_least(ws, BYTES_PER_FRAME)
    cut(ws)
    return token, got


def refused(ws: ClientConnection, reply: dict) -> tuple[str, int | None]:
    """A `resume_failed` refusal: its param, and the close code that follows."""
    assert reply["type"] == "error" and reply["error"]["code"] == "resume_failed", reply
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=TIMEOUT)
    return reply["error"]["param"], ws.close_code


def detached(server: ServerThread) -> int:
    registry = getattr(server.app.state, "qtts_resume", None)
    return 0 if registry is None else len(registry.detached)


def held(server: ServerThread) -> int:
    return server.app.state.client_limiter.held("127.0.0.1")


# -- resume after a cut ---------------------------------------------------------------------------------


@pytest.mark.parametrize("resume_from", ["acked", "received"])
def test_a_cut_stream_resumed_on_a_new_socket_gives_the_bytes_of_an_uninterrupted_run(server, registry,
                                                                                      resume_from):
    reference = whole_text_pcm(server, TEXT, max_frames=FRAMES)
    ws = open_ws(server)
    started = start(ws)
    token = started["resume_token"]
    assert isinstance(token, str) and len(token) >= 22
    send(ws, type="text", text=FIRST, seq=1)
    received = audio_at_least(ws, 3 * BYTES_PER_FRAME)
    acked = len(received) // 2
    send(ws, type="ack", audio_bytes=acked)
    time.sleep(0.1)  # let the ack arrive before the cut
    cut(ws)
    eventually(lambda: detached(server) == 1)
    assert held(server) == 1  # the detached stream keeps its client's speech place
    offset = acked if resume_from == "acked" else len(received)
    ws2, resumed = resume(server, token, offset)
    with ws2:
        assert resumed == {"type": "resumed", "id": started["id"], "last_text_seq": 1,
                           "resume_token": resumed["resume_token"], "audio_bytes": offset}
        assert resumed["resume_token"] != token
        send(ws2, type="text", text=FIRST, seq=1)  # sent again by a client unsure it arrived: ignored
        send(ws2, type="text", text=SECOND, seq=2)
        send(ws2, type="stop")
        audio, events = until_done(ws2)
    assert [e["type"] for e in events] == ["done"], events
    assert received[:offset] + audio == reference
    done = events[-1]
    assert done["id"] == started["id"] and done["finish_reason"] in ("max_frames", "eos")
    assert done["usage"]["characters"] == len(TEXT)
    assert done["usage"]["audio_seconds"] == pytest.approx(len(reference) / 2 / 24000)
    assert detached(server) == 0 and wait_idle(registry)["active"] == 0


def test_the_token_rotates_and_a_spent_token_fails(server, registry):
    reference = whole_text_pcm(server, TEXT, max_frames=FRAMES)
    first_token, got = cut_midway(server)
    ws2, resumed = resume(server, first_token, len(got))
    second_token = resumed["resume_token"]
    got += audio_at_least(ws2, 1)
    cut(ws2)
    # the first token was spent by the first resume
    ws3, reply = resume(server, first_token, len(got))
    assert refused(ws3, reply) == ("resume_token", 1008)
    ws4, resumed = resume(server, second_token, len(got))
    with ws4:
        assert resumed["type"] == "resumed" and resumed["resume_token"] not in (first_token, second_token)
        send(ws4, type="text", text=SECOND, seq=2)
        send(ws4, type="stop")
        audio, events = until_done(ws4)
    assert got + audio == reference and events[-1]["type"] == "done"
    # the stream is over: its last token resumes nothing
    ws5, reply = resume(server, resumed["resume_token"], len(got + audio))
    assert refused(ws5, reply) == ("resume_token", 1008)
    assert wait_idle(registry)["active"] == 0


def test_a_resume_with_another_key_fails_and_leaves_the_stream_resumable(registry):
    """An open server binds the stream to the key its socket offered; a keyed server refuses a wrong
    key at the handshake already."""
    with serve(registry, api_key=None) as server:
        token, got = cut_midway(server, key="alice")
        eventually(lambda: detached(server) == 1)
        for key in ("bob", None):
            ws2, reply = resume(server, token, len(got), key=key)
            assert refused(ws2, reply) == ("resume_token", 1008)
        ws3, resumed = resume(server, token, len(got), key="alice")  # the failures did not spend it
        with ws3:
            assert resumed["type"] == "resumed"
            send(ws3, type="cancel")
            _, events = until_done(ws3)
            assert events[-1]["finish_reason"] == "cancelled"
    with serve(registry) as server:
        token, got = cut_midway(server)
        with open_ws(server, key="wrong") as ws2:  # refused before any message
            assert event(ws2)["error"]["code"] == "invalid_api_key"
        ws3, resumed = resume(server, token, len(got))
        with ws3:
            assert resumed["type"] == "resumed"
            send(ws3, type="cancel")
            until_done(ws3)
    assert wait_idle(registry)["active"] == 0


def test_a_replica_id_prefixes_the_token_and_a_token_of_another_replica_is_refused_by_name(registry):
    """`--replica-id r1`: tokens are `r1.` + 22 secret characters, rotated with the same prefix (a balancer
    routes the resume socket on `?replica=r1`, which the server ignores); a token naming another replica
    (here the stream's own secret under another name) is refused with a message naming the holder, and
    the refusal spends nothing."""
    from api import ServerConfig, create_app

    config = ServerConfig(api_key=KEY, webui_dir=None, replica_id="r1")
    with ServerThread(create_app(config, registry)) as server:
        reference = whole_text_pcm(server, TEXT, max_frames=FRAMES)
        token, got = cut_midway(server)
        replica, dot, secret = token.partition(".")
        assert (replica, dot, len(secret)) == ("r1", ".", 22), token
        eventually(lambda: detached(server) == 1)
        for other in ("r2", "x"):
            ws2, reply = resume(server, f"{other}.{secret}", len(got))
            assert "held by replica " + repr(other) in reply["error"]["message"], reply
            assert "'r1'" in reply["error"]["message"] and f"?replica={other}" in reply["error"]["message"]
            assert refused(ws2, reply) == ("resume_token", 1008)
        ws3, reply = resume(server, secret, len(got))  # the secret alone names no stream here
        assert refused(ws3, reply) == ("resume_token", 1008) and "held by" not in reply["error"]["message"]
        ws4 = connect(f"{ws_helpers.ws_url(server)}&replica=r1", proxy=None, open_timeout=TIMEOUT)  # ignored here
        send(ws4, type="resume", resume_token=token, audio_bytes=len(got))
        with ws4:
            resumed = event(ws4)
            assert resumed["type"] == "resumed" and resumed["resume_token"].startswith("r1.")
            assert resumed["resume_token"] != token
            send(ws4, type="text", text=SECOND, seq=2)
            send(ws4, type="stop")
            audio, events = until_done(ws4)
        assert got + audio == reference and events[-1]["type"] == "done"
    assert wait_idle(registry)["active"] == 0


def test_bad_resumes_fail_with_resume_failed(server, registry):
    for message in ({"type": "resume"}, {"type": "resume", "resume_token": 7, "audio_bytes": 0},
                    {"type": "resume", "resume_token": "x" * 100, "audio_bytes": 0},
                    {"type": "resume", "resume_token": "made-up-token-0123456789", "audio_bytes": 0}):
        ws = open_ws(server)
        ws.send(json.dumps(message))
        assert refused(ws, event(ws)) == ("resume_token", 1008)
    # audio the server no longer holds (here: never sent): refused, and the stream is cancelled
    engine = registry.default.engine
    cancelled = engine.stats["cancelled"]
    token, got = cut_midway(server)
    for bad in (-1, "0", True):
        ws2, reply = resume(server, token, bad)
        assert refused(ws2, reply) == ("audio_bytes", 1008)
    ws2, reply = resume(server, token, len(got) + 10 ** 9)
    assert refused(ws2, reply) == ("audio_bytes", 1008)
    eventually(lambda: engine.stats["cancelled"] == cancelled + 1)
    ws3, reply = resume(server, token, len(got))
    assert refused(ws3, reply) == ("resume_token", 1008)
    assert wait_idle(registry)["active"] == 0 and detached(server) == 0


# -- the window and the bounds --------------------------------------------------------------------------


def test_a_stream_not_resumed_within_the_window_is_cancelled_and_frees_its_places(registry):
    engine = registry.default.engine
    with serve(registry, resume_window_s=1.0) as server:
        cancelled = engine.stats["cancelled"]
        token, got = cut_midway(server)
        eventually(lambda: detached(server) == 1)
        assert held(server) == 1 and engine.load()["active"] == 1  # paused, holding its places
        eventually(lambda: engine.stats["cancelled"] == cancelled + 1)
        load = wait_idle(registry)
        assert (load["active"], load["waiting"], load["free_slots"]) == (0, 0, MAX_STREAMS)
        eventually(lambda: held(server) == 0)
        assert detached(server) == 0
        ws2, reply = resume(server, token, len(got))
        assert refused(ws2, reply) == ("resume_token", 1008)


def test_no_idle_timeout_while_detached_and_it_runs_again_after_a_resume(registry):
    with serve(registry, ws_idle_timeout_s=1.5) as server:
        reference = whole_text_pcm(server, TEXT, max_frames=FRAMES)
        token, got = cut_midway(server)
        eventually(lambda: detached(server) == 1)
        time.sleep(2.5)  # longer than the idle timeout, detached
        ws2, resumed = resume(server, token, len(got))
        with ws2:
            assert resumed["type"] == "resumed"
            send(ws2, type="text", text=SECOND, seq=2)  # still open: taken
            audio, events = until_done(ws2)  # no stop: the idle timeout stops it as `stop` does
        assert [e["type"] for e in events] == ["done"], events
        assert events[-1]["limit"] == "idle_timeout" and events[-1]["finish_reason"] in ("max_frames", "eos")
        assert got + audio == reference


def test_detached_streams_are_bounded(registry):
    with serve(registry, max_detached_streams=1) as server:
        engine = registry.default.engine
        sockets = [open_ws(server), open_ws(server)]
        tokens = [start(ws)["resume_token"] for ws in sockets]
        for ws in sockets:
            send(ws, type="text", text=FIRST, seq=1)
        received = [audio_at_least(ws, BYTES_PER_FRAME) for ws in sockets]
        cancelled = engine.stats["cancelled"]
        cut(sockets[0])
        eventually(lambda: detached(server) == 1)
        metrics = httpx.get(f"http://{server.host}:{server.port}/metrics", timeout=10,
                            headers={"Authorization": f"Bearer {KEY}"}).text
        assert "qtts_detached_streams 1" in metrics.splitlines()
        cut(sockets[1])  # past the bound: cancelled as a stream that is not resumable
        eventually(lambda: engine.stats["cancelled"] == cancelled + 1)
        ws, reply = resume(server, tokens[1], len(received[1]))
        assert refused(ws, reply) == ("resume_token", 1008)
        ws, resumed = resume(server, tokens[0], len(received[0]))
        with ws:
            assert resumed["type"] == "resumed"
            send(ws, type="cancel")
            until_done(ws)
    assert wait_idle(registry)["active"] == 0


def test_resume_off_gives_no_token_and_a_lost_stream_is_cancelled(registry):
    with serve(registry, resume_window_s=0) as server, open_ws(server) as ws:
        started = start(ws, max_frames=1)
        assert started["resume_token"] is None
        send(ws, type="cancel")
        until_done(ws)


def test_a_client_that_stops_reading_leaves_its_stream_waiting_for_a_resume(registry):
    """Half-open TCP as the server sees it: nothing is read for `send_timeout_s` (a tiny receive buffer
    and no recv). The socket is ended, but the stream waits for a resume, which gets all of it."""
    with serve(registry, send_timeout_s=0.5) as server:
        reference = whole_text_pcm(server, TEXT, max_frames=FRAMES)
        server.server.servers[0].sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        stalled = open_from(server, rcvbuf=4096, max_queue=1)
        try:
            token = start(stalled)["resume_token"]
            send(stalled, type="text", text=TEXT, seq=1)
            send(stalled, type="stop")
            eventually(lambda: detached(server) == 1)
        finally:
            cut(stalled)
        ws, resumed = resume(server, token, 0)
        with ws:
            assert resumed["type"] == "resumed" and resumed["last_text_seq"] == 1
            audio, events = until_done(ws)
        assert audio == reference and [e["type"] for e in events] == ["done"]


# -- text sequence numbers ------------------------------------------------------------------------------


def test_text_sent_again_with_an_old_seq_is_ignored(server, registry):
    parts = ["Hello there, ", "this is a live ", "streaming test."]
    reference = whole_text_pcm(server, "".join(parts), max_frames=FRAMES)
    with open_ws(server) as ws:
        start(ws)
        send(ws, type="text", text=parts[0], seq=1)
        send(ws, type="text", text=parts[0], seq=1)
        send(ws, type="text", text=parts[1], seq=2)
        send(ws, type="text", text=parts[0], seq=1)
        send(ws, type="text", text=parts[1], seq=2)
        send(ws, type="text", text=parts[2], seq=5)  # gaps are allowed: only order counts
        early = bytearray()  # (the stream may be speaking already)
        for bad in (0, -3, "6", 1.5, True):
            send(ws, type="text", text="never", seq=bad)
            error = event_after_audio(ws, early)
            assert error["type"] == "error" and error["error"]["param"] == "seq", error
        send(ws, type="stop")
        audio, events = until_done(ws)
    assert early + audio == reference and events[-1]["usage"]["characters"] == len("".join(parts))


# -- a socket that still looks open ------------------------------------------------------------------


def test_a_resume_closes_the_old_socket_that_still_looks_open(server, registry):
    reference = whole_text_pcm(server, TEXT, max_frames=FRAMES)
    old = open_ws(server)
    token = start(old)["resume_token"]
    send(old, type="text", text=FIRST, seq=1)
    got = audio_at_least(old, 2 * BYTES_PER_FRAME)
    new, resumed = resume(server, token, len(got))  # the old socket is open: half-open, as far as we know
    with new:
        assert resumed["type"] == "resumed" and resumed["last_text_seq"] == 1
        with pytest.raises(ConnectionClosed):
            while True:
                assert isinstance(old.recv(timeout=TIMEOUT), bytes)  # audio in flight, then the close
        assert (old.close_code, old.close_reason) == (1008, "resumed elsewhere")
        send(new, type="text", text=SECOND, seq=2)
        send(new, type="stop")
        audio, events = until_done(new)
    assert got + audio == reference and events[-1]["type"] == "done"
    assert wait_idle(registry)["active"] == 0


# -- streams that are not resumable --------------------------------------------------------------------


def test_streams_that_are_not_resumable_behave_as_before(server, registry):
    engine = registry.default.engine
    with open_ws(server) as ws:
        started = start(ws, resumable=False)
        assert "resume_token" not in started
        send(ws, type="text", text=FIRST, seq=1)
        send(ws, type="text", text=FIRST, seq=1)  # seq means nothing here: spoken twice
        send(ws, type="text", text=SECOND, seq=2)
        send(ws, type="ack", audio_bytes=123)  # nothing to acknowledge: no answer
        send(ws, type="stop")
        audio, events = until_done(ws)
        assert [e["type"] for e in events] == ["done"]
        assert audio == whole_text_pcm(server, FIRST + FIRST + SECOND, max_frames=FRAMES)
        send(ws, type="ack", audio_bytes=-1)
        assert event(ws)["error"]["param"] == "audio_bytes"
        send(ws, type="start", voice="ryan", resumable="yes")
        assert event(ws)["error"]["param"] == "resumable"
    cancelled = engine.stats["cancelled"]
    ws = open_ws(server)
    start(ws, resumable=False, max_frames=400)
    send(ws, type="text", text=FIRST)
    audio_at_least(ws, 1)
    cut(ws)  # cancelled at once, as before
    eventually(lambda: engine.stats["cancelled"] == cancelled + 1)
    assert detached(server) == 0 and wait_idle(registry)["active"] == 0


# -- the delivery's order under races (no server: fake sockets) ------------------------------------------


class FakeSocket:
    """An `Attachable` whose sends can be held (a half-open connection whose buffers are full)."""

    def __init__(self, name: str, blocked: bool = False):
        import asyncio

        self.name, self.open, self.session, self.closed_with = name, True, None, None
        self.sent: list = []
        self.gate = asyncio.Event()
        if not blocked:
            self.gate.set()

    async def send_event(self, event: dict) -> None:
        await self.gate.wait()
        if self.open:
            self.sent.append(event["type"])

    async def send_bytes(self, data: bytes) -> None:
        await self.gate.wait()
        if self.open:
            self.sent.append(data)

    def end(self, close=None) -> None:
        self.open, self.closed_with = False, close

    def adopt(self, utterance) -> None:
        self.session = utterance

    def let_go(self, utterance, moved: bool = False) -> None:
        if self.session is utterance:
            self.session = None

    def audio(self) -> bytes:
        return b"".join(m for m in self.sent if isinstance(m, bytes))


def fake_stream(limits: ServerLimits):
    """A registry and a resumable stand-in utterance attached to a first socket."""
    from types import SimpleNamespace

    from api.protocols.resume import ResumeRegistry

    settings = SimpleNamespace(max_buffered_audio_s=10.0)
    utterance = SimpleNamespace(id="u1", plan=SimpleNamespace(served=SimpleNamespace(model=SimpleNamespace(
        settings=settings))), sample_rate=24000, detached=False, last_text_at=0.0, pump=None, watchdog=None,
        live=False, resume=None, cancelled=False)
    utterance.cancel = lambda: (setattr(utterance, "cancelled", True), utterance.resume.on_cancel())
    registry = ResumeRegistry(limits)
    first = FakeSocket("first")
    token = registry.open(utterance, first, "key")
    return registry, utterance.resume, first, token


def test_a_resume_never_waits_for_a_send_stuck_on_the_old_socket_and_keeps_the_order():
    import asyncio

    async def scenario():
        registry, stream, first, token = fake_stream(ServerLimits())
        await stream.deliver(b"a" * 10)
        first.gate.clear()  # half-open: the next send never completes
        pumping = asyncio.create_task(stream.deliver(b"b" * 10))
        await asyncio.sleep(0.01)
        second = FakeSocket("second", blocked=True)  # its first sends are slow too
        resumable, new_token = registry.claim(token, "key", 10)
        attaching = asyncio.create_task(resumable.attach(second, 10, new_token))
        await asyncio.sleep(0.01)
        third = FakeSocket("third")  # resumed again while the second is still replaying
        resumable, newest = registry.claim(new_token, "key", 10)
        await resumable.attach(third, 10, newest)
        await asyncio.wait_for(asyncio.gather(pumping, attaching), 5)
        await stream.deliver(b"c" * 10)
        await stream.finish([{"type": "done"}])
        assert first.closed_with == second.closed_with == (1008, "resumed elsewhere")
        assert third.sent == ["resumed", b"b" * 10, b"c" * 10, "done"]
        assert len(registry) == 0 and not stream.resumable
        with pytest.raises(Exception) as refused:
            registry.claim(newest, "key", 30)
        assert refused.value.code == "resume_failed"

    asyncio.run(scenario())


def test_a_stream_that_ends_while_detached_gets_its_audio_and_done_on_resume():
    import asyncio

    async def scenario():
        registry, stream, first, token = fake_stream(ServerLimits(resume_window_s=5))
        await stream.deliver(b"a" * 10)
        first.open = False  # the socket broke; its `release` detaches the stream
        assert registry.detach(stream, first) and registry.detached == {stream}
        pumping = asyncio.create_task(stream.deliver(b"b" * 10))
        await asyncio.sleep(0.01)
        assert not pumping.done()  # held: the engine's backlog pauses the stream meanwhile
        with pytest.raises(Exception):
            registry.claim(token, "other key", 10)
        resumable, new_token = registry.claim(token, "key", 4)
        second = FakeSocket("second")
        await resumable.attach(second, 4, new_token)
        await asyncio.wait_for(pumping, 5)
        second.open = False
        assert registry.detach(stream, second)
        finishing = asyncio.create_task(stream.finish([{"type": "error"}, {"type": "done"}]))
        await asyncio.sleep(0.01)
        assert not finishing.done()
        resumable, newest = registry.claim(new_token, "key", 20)
        third = FakeSocket("third")
        await resumable.attach(third, 20, newest)
        await asyncio.wait_for(finishing, 5)
        assert second.audio() == b"a" * 6 + b"b" * 10
        assert third.sent == ["resumed", "error", "done"] and len(registry) == 0 and not registry.detached

    asyncio.run(scenario())


def test_an_expired_window_cancels_and_wakes_the_waiting_pump():
    import asyncio

    async def scenario():
        registry, stream, first, token = fake_stream(ServerLimits(resume_window_s=0.05))
        first.open = False
        assert registry.detach(stream, first)
        pumping = asyncio.create_task(stream.deliver(b"a"))
        await asyncio.wait_for(pumping, 5)  # woken by the expiry
        assert stream.utterance.cancelled and len(registry) == 0 and not registry.detached

    asyncio.run(scenario())
