"""Graceful shutdown with a real `serve` process: SIGTERM drains (work in flight finishes intact, new
work is refused, `/ready` says 503), then the process exits 0; a second signal exits at once.

Every wait is bounded and polled; the drain is held open by a WebSocket utterance that only ends
when the test sends `stop`, so each step is taken while the server is known to be draining.
"""

from __future__ import annotations

import json
import signal

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.serve_process import ServeProcess
from tests.waiting import wait_until

TEXT = "Hello there, this is a long stream that must survive a rolling update of the server."
SPEECH = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "pcm", "seed": 7, "max_frames": 48}
LIVE = {"type": "start", "voice": "alloy", "format": "pcm", "seed": 7, "max_frames": 24}
DIALOGUE = {"inputs": [{"text": "Hi there.", "voice_id": "ryan"}, {"text": "Hello!", "voice_id": "vivian"},
                       {"text": "Bye now.", "voice_id": "ryan"}], "seed": 7}
"""Three lines: a dialogue holds two lines' streams at most, so its third starts once its first has ended,
which here comes after the signal (each line runs to its frame budget, 66 frames: random weights say no end
of speech, and the signal goes at the first audio)."""
DIALOGUE_ROUTE = "/v1/text-to-dialogue/stream?output_format=pcm_24000"
TIMEOUT_S = 60.0


@pytest.fixture
def serve(tiny_cv_f32, tmp_path):
    """Start `serve` on the tiny model with extra flags (deterministic: batching changes no bit)."""
    def start(*flags: str) -> ServeProcess:
        return ServeProcess("--model", str(tiny_cv_f32), "--threads", "1", "--deterministic",
                            "--voices-dir", str(tmp_path / "voices"), *flags, log_path=tmp_path / "server.log")
    return start


def open_ws(server: ServeProcess) -> ClientConnection:
    return connect(server.ws_url, proxy=None, open_timeout=TIMEOUT_S)


def event(ws: ClientConnection) -> dict:
    message = ws.recv(timeout=TIMEOUT_S)
    assert isinstance(message, str), f"expected an event, got {len(message)} audio bytes"
    return json.loads(message)


def start_live(ws: ClientConnection, text: str | None = TEXT) -> dict:
    """`start` (and the whole text, when given) on `ws`; the `started` event."""
    ws.send(json.dumps(LIVE))
    started = event(ws)
    assert started["type"] == "started", started
    if text is not None:
        ws.send(json.dumps({"type": "text", "text": text}))
    return started


def until_done(ws: ClientConnection) -> tuple[bytes, dict]:
    """The audio up to `done`, and `done`."""
    audio = bytearray()
    while True:
        message = ws.recv(timeout=TIMEOUT_S)
        if isinstance(message, bytes):
            audio += message
        elif (done := json.loads(message))["type"] == "done":
            return bytes(audio), done


def closed_with(ws: ClientConnection) -> tuple[int, str]:
    """The close frame the server sends next (anything before it is read and dropped)."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=TIMEOUT_S)
    return closed.value.rcvd.code, closed.value.rcvd.reason


def live_alone(server: ServeProcess) -> bytes:
    with open_ws(server) as ws:
        start_live(ws)
        ws.send(json.dumps({"type": "stop"}))
        audio, done = until_done(ws)
    assert done["finish_reason"] in ("eos", "max_frames", "budget"), done
    return audio


def test_sigterm_drains_streams_in_flight_refuses_new_work_and_exits_0(serve):
    with serve("--drain-timeout-s", "300") as server, httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        speech_alone = http.post("/v1/audio/speech", json=SPEECH).content
        assert len(speech_alone) == SPEECH["max_frames"] * 1920 * 2
        dialogue_alone = http.post(DIALOGUE_ROUTE, json=DIALOGUE).content
        live_reference = live_alone(server)

        with open_ws(server) as live, open_ws(server) as idle, \
                http.stream("POST", "/v1/audio/speech", json=SPEECH) as in_flight, \
                http.stream("POST", DIALOGUE_ROUTE, json=DIALOGUE) as dialogue:
            start_live(live)  # in flight until it gets `stop`: holds the drain open
            pieces, lines = in_flight.iter_bytes(), dialogue.iter_bytes()
            first, first_line = next(pieces), next(lines)
            server.signal(signal.SIGTERM)

            wait_until(lambda: server.ready_status() == 503, "/ready to say 503")
            ready = http.get("/ready")
            assert ready.headers["retry-after"] and ready.json()["error"]["code"] == "unavailable"
            refused = http.post("/v1/audio/speech", json=SPEECH)
            assert refused.status_code == 503 and refused.headers["retry-after"]
            assert refused.json()["error"]["code"] == "unavailable" and "draining" in refused.json()["error"]["message"]
            assert "qtts_draining 1" in http.get("/metrics").text

            with open_ws(server) as late:  # a new socket: an error event, then close 1012
                assert event(late)["error"]["code"] == "unavailable"
                assert closed_with(late) == (1012, "draining")
            idle.send(json.dumps(LIVE))  # `start` on a socket opened before the drain
            assert event(idle)["error"]["code"] == "unavailable"

            assert first + b"".join(pieces) == speech_alone  # the HTTP stream in flight, intact
            assert first_line + b"".join(lines) == dialogue_alone  # a dialogue too: its later lines still start
            live.send(json.dumps({"type": "stop"}))
            audio, done = until_done(live)
            assert audio == live_reference and done["finish_reason"] != "cancelled"  # the utterance, intact
            assert closed_with(live) == (1012, "server shutting down")  # nothing in flight: sockets closed
            assert closed_with(idle) == (1012, "server shutting down")
        assert server.wait_exit(TIMEOUT_S) == 0, server.log()


def test_a_session_open_at_the_deadline_gets_a_close_frame_and_the_process_exits_0(serve):
    with serve("--drain-timeout-s", "1") as server, open_ws(server) as ws:
        start_live(ws, text=None)  # started, waiting for text that never comes
        server.signal(signal.SIGTERM)
        assert closed_with(ws) == (1012, "drain timeout")
        assert server.wait_exit(TIMEOUT_S) == 0, server.log()


def test_a_second_signal_exits_at_once(serve):
    with serve("--drain-timeout-s", "600") as server, open_ws(server) as ws:
        start_live(ws, text=None)  # would hold the drain for 600 s
        server.signal(signal.SIGTERM)
        wait_until(lambda: server.ready_status() == 503, "the drain to begin")
        server.signal(signal.SIGTERM)
        assert server.wait_exit(TIMEOUT_S) == 128 + signal.SIGTERM, server.log()


@pytest.mark.parametrize("finished", [False, True], ids=["written-during-the-drain", "finished-before-the-signal"])
def test_the_process_waits_for_a_slow_reader_to_take_the_bytes_already_written(serve, finished):
    """A response the app has finished may still sit in this process's and the kernel's buffers while
    its client reads slowly; a container's network goes with its process, so the process must not end
    before those bytes have left (here: before the client's small receive buffer holds the rest). Also
    when the response was finished, and its `Connection: close` socket closed by the server, before the
    signal came (the kernel still sends a closed socket's queue, but not once a container's network is
    gone: `scripts/test-kube-play.sh` lost the end of such a stream)."""
    import socket
    import threading
    import time

    body = json.dumps({**SPEECH, "max_frames": 96}).encode()
    with serve("--drain-timeout-s", "120") as server, socket.socket() as sock, \
            httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # before connect: a small window
        sock.settimeout(TIMEOUT_S)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        received, read_at_exit = [0], []

        def watch_exit() -> None:
            while server.proc.poll() is None:
                time.sleep(0.01)
            read_at_exit.append(received[0])

        first = sock.recv(4096)
        received[0] += len(first)
        if finished:  # the stream is over for the server (its usage counted) before the signal
            wait_until(lambda: 'qtts_speech_streams_total{model=' in http.get("/metrics").text, "the stream's end")
        server.signal(signal.SIGTERM)
        watcher = threading.Thread(target=watch_exit, daemon=True)
        watcher.start()
        while data := sock.recv(2048):  # ~80 KB/s: the ~370 KB body takes seconds after the engine is done
            received[0] += len(data)
            time.sleep(0.025)
        watcher.join(TIMEOUT_S)
        assert server.wait_exit(TIMEOUT_S) == 0, server.log()
    assert b" 200 OK" in first.split(b"\r\n", 1)[0]
    total = received[0]
    assert total > SPEECH["max_frames"] * 2 * 1920 * 2  # the whole body came (96 frames of s16 pcm)
    # at exit, what was left fits the client's own buffers (rcvbuf + in flight), nothing in the server's
    assert read_at_exit and read_at_exit[0] >= total - 96 * 1024, (read_at_exit, total)
