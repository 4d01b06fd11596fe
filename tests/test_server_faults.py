"""Through a real server: a prompt too long for the context is a 400; a dead engine worker is restarted (503 with
Retry-After meanwhile), a hopeless one makes /health fail; a client that stops reading is paused, then ended, and
frees its slot."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from qwen3_tts_gguf.model.settings import EngineSettings

from api import ModelRegistry, ServerConfig, create_app
from api.limits import ServerLimits
from api.registry import SupervisionPolicy
from api.testing import ServerThread
from tests.waiting import wait_until


def speech(frames: int = 4, fmt: str = "pcm", text: str = "Hello there.") -> dict:
    return {"model": "tts-1", "input": text, "voice": "ryan", "response_format": fmt, "seed": 1,
            "max_frames": frames}


def kill_worker_once(engine) -> None:
    """The next admission raises outside every stream's work: the worker thread dies."""
    real, killed = engine.admission.admit, threading.Event()

    def admit():
        if not killed.is_set():
            killed.set()
            raise RuntimeError("injected: the loop broke")
        return real()

    engine.admission.admit = admit


@pytest.fixture
def served(tiny_cv_f32):
    registry = ModelRegistry.load([tiny_cv_f32], EngineSettings(threads=1, deterministic=True, max_streams=2),
                                  )
    registry.policy = SupervisionPolicy(interval_s=0.05, max_restarts=1, window_s=300)
    server = ServerThread(create_app(ServerConfig(webui_dir=None), registry))
    with server:
        yield registry, server
    registry.close()


def test_a_dead_worker_is_restarted_and_then_given_up(served):
    registry, server = served
    engine = registry.default.engine
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.post("/v1/audio/speech", json=speech()).status_code == 200
        kill_worker_once(engine)
        failed = http.post("/v1/audio/speech", json=speech())
        assert failed.status_code == 503 and failed.headers["retry-after"] == "1"
        assert failed.json()["error"]["code"] == "unavailable"
        assert "RuntimeError" not in failed.text and "injected" not in failed.text
        wait_until(lambda: engine.health().restarts == 1 and http.get("/ready").status_code == 200,
                   what="the supervisor to restart the engine")
        ok = http.post("/v1/audio/speech", json=speech())
        assert ok.status_code == 200 and len(ok.content) == 4 * 1920 * 2

        kill_worker_once(engine)  # a second death within the window: max_restarts=1 -> given up
        assert http.post("/v1/audio/speech", json=speech()).status_code == 503
        wait_until(lambda: engine.health().status == "dead", what="the supervisor to give up")
        for path in ("/ready", "/health"):
            answer = http.get(path)
            assert answer.status_code == 503 and "retry-after" not in answer.headers, path
            assert "failed for good" in answer.json()["error"]["message"]
        refused = http.post("/v1/audio/speech", json=speech())
        assert refused.status_code == 503 and "retry-after" not in refused.headers


class SmallBufferServer(ServerThread):
    """uvicorn on a listening socket whose accepted connections get a small send buffer, so a client
    that stops reading pushes back after kilobytes rather than the megabytes loopback would absorb."""

    def __enter__(self):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        sock.bind(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        return super().__enter__()


def test_a_client_that_stops_reading_is_paused_then_ended(tiny_cv_f32):
    registry = ModelRegistry.load([tiny_cv_f32], EngineSettings(threads=1, deterministic=True, max_streams=2,
                                                                max_buffered_audio_s=1.0))
    config = ServerConfig(webui_dir=None, limits=ServerLimits(send_timeout_s=1.0))
    engine = registry.default.engine
    try:
        with SmallBufferServer(create_app(config, registry)) as server:
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(("127.0.0.1", server.port))
            body = json.dumps(speech(frames=1000, text="A long answer that nobody will listen to. " * 8)).encode()
            client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                           b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            assert client.recv(12) == b"HTTP/1.1 200"  # then it reads nothing more
            wait_until(lambda: engine.load()["paused"] == 1, what="the engine to pause the stream")
            assert engine.stats["frames"] < 1000
            # nothing read for send_timeout_s: the server ends the response, the engine frees the slot
            wait_until(lambda: engine.load()["active"] == 0, what="the stalled client to be ended")
            assert engine.load()["free_slots"] == 2 and engine.stats["cancelled"] >= 1
            client.settimeout(10)
            received = b""
            while chunk := client.recv(65536):
                received += chunk
            assert not received.endswith(b"0\r\n\r\n")  # cut off, never made to look complete
            client.close()
            assert httpx.post(f"{server.url}/v1/audio/speech", json=speech()).status_code == 200
    finally:
        registry.close()


def test_a_prompt_too_long_for_the_context_is_a_400_before_any_audio(tiny_cv_f32):
    registry = ModelRegistry.load([tiny_cv_f32], EngineSettings(threads=1, deterministic=True, max_streams=8,
                                                                n_ctx=2048))  # 256 cells per stream
    try:
        with ServerThread(create_app(ServerConfig(webui_dir=None), registry)) as server:
            too_long = {**speech(), "instructions": "Speak slowly and clearly. " * 60}
            answer = httpx.post(f"{server.url}/v1/audio/speech", json=too_long, timeout=30)
            assert answer.status_code == 400
            assert answer.json()["error"]["code"] == "context_length_exceeded"
            assert answer.json()["error"]["param"] == "instructions"
            digits = {**speech(frames=6), "input": "".join(str(i % 10) for i in range(600))}
            ok = httpx.post(f"{server.url}/v1/audio/speech", json=digits, timeout=60)  # split until it fits
            assert ok.status_code == 200 and len(ok.content) == 6 * 1920 * 2
    finally:
        registry.close()
