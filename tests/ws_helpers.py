"""Shared pieces of the socket tests: a registry and a real uvicorn server on loopback, and a small
`/v1/ws` client (the `websockets` package) with the defaults those tests speak with.

The test files' `registry` and `server` fixtures are made, one line a file, by the factories of
`server_fixtures.py` from the pieces here (a file whose fixtures are its own writes them out); a test
that needs a server of other limits for a while opens one with `serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from qwen3_tts_gguf.model.settings import EngineSettings

from api import ModelRegistry, ServerConfig, create_app
from api.limits import ServerLimits
from api.testing import ServerThread

__all__ = ["FRAMES", "KEY", "SAMPLES_PER_FRAME", "SEED", "TEXT", "TIMEOUT", "ClientConnection", "ServerThread",
           "event", "eventually", "expect_error", "httpx", "loaded_registry", "open_from", "open_ws",
           "post_speech", "refused", "run_async", "say_and_stop", "send", "serve", "speak_live", "start",
           "until_done", "wait_idle", "whole_text_pcm", "ws_settings", "ws_url"]

KEY = "test-key"
TEXT = "Hello there, this is a live streaming test of words."
SEED = 11
FRAMES = 16
SAMPLES_PER_FRAME = 1920
TIMEOUT = 30.0


# -- the registry and the server ---------------------------------------------------------------------


def ws_settings(max_streams: int) -> EngineSettings:
    """The socket tests' engine profile: one thread, deterministic, `max_streams` slots, 4 pending."""
    return EngineSettings(threads=1, deterministic=True, max_streams=max_streams, max_pending=4)


@contextlib.contextmanager
def loaded_registry(models: Path | list[Path], settings: EngineSettings) -> Iterator[ModelRegistry]:
    """A ModelRegistry of the converted model or models (the first is the default) with `settings`, closed on exit."""
    registry = ModelRegistry.load([models] if isinstance(models, Path) else models, settings)
    try:
        yield registry
    finally:
        registry.close()


@contextlib.contextmanager
def serve(registry: ModelRegistry, api_key: str | None = KEY, *, usage_log: Path | None = None,
          **limits: Any) -> Iterator[ServerThread]:
    """A real uvicorn server (no web console) whose ServerLimits are the defaults but for `limits`."""
    config = ServerConfig(api_key=api_key, webui_dir=None, usage_log=usage_log, limits=ServerLimits(**limits))
    with ServerThread(create_app(config, registry)) as running:
        yield running


def run_async(coro: Any, timeout: float = TIMEOUT) -> Any:
    """Run `coro` to its end (within `timeout`) on an event loop of its own thread: the web console
    tests' session-scoped Playwright keeps a loop running in the main thread."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, asyncio.wait_for(coro, timeout)).result()


def run_pipecat(make_service: Callable[[Any], Any], text: str, sample_rate: int, monkeypatch) -> tuple[list, list]:
    """Speak `text` with the Pipecat TTS service `make_service(aiohttp_session)` builds, in a pipeline
    run by Pipecat's own test runner at `sample_rate`; returns the frames that went (down, up)."""
    import aiohttp
    from pipecat.frames.frames import TTSSpeakFrame
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.tests import utils
    from pipecat.tests.utils import SleepFrame, run_test

    # its runner takes SIGINT by default, which only the main thread may (the pipeline runs in another)
    monkeypatch.setattr(utils, "WorkerRunner", functools.partial(utils.WorkerRunner, handle_sigint=False))

    async def speak():
        async with aiohttp.ClientSession() as session:
            return await run_test(make_service(session),
                                  frames_to_send=[TTSSpeakFrame(text=text), SleepFrame(sleep=3.0)],
                                  pipeline_params=PipelineParams(audio_out_sample_rate=sample_rate))

    return run_async(speak())


def wait_idle(registry: ModelRegistry, timeout: float = 10.0) -> dict:
    """The engine's load once no stream is active or waiting (fails after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        load = registry.default.engine.load()
        if (load["active"], load["waiting"]) == (0, 0) or time.monotonic() > deadline:
            return load
        time.sleep(0.02)


def eventually(check: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05) -> None:
    """Poll `check()` until it is true (fails after `timeout`: a safety net, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(interval)


def post_speech(server: ServerThread, text: str, key: str | None = KEY, timeout: float = 60.0,
                **fields: Any) -> httpx.Response:
    """POST /v1/audio/speech of `text` as pcm from voice ryan (`fields` add to the body); it must be a 200."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    response = httpx.post(f"{server.url}/v1/audio/speech", headers=headers, timeout=timeout,
                          json={"model": "tts-1", "input": text, "voice": "ryan", "response_format": "pcm", **fields})
    assert response.status_code == 200, response.text
    return response


def whole_text_pcm(server: ServerThread, text: str, **extra: Any) -> bytes:
    """POST /v1/audio/speech with the whole text in the streaming text mode (the reference)."""
    return post_speech(server, text, **{"text_mode": "streaming", "seed": SEED, "max_frames": FRAMES, **extra}).content


# -- a /v1/ws client ---------------------------------------------------------------------------------


def ws_url(server: ServerThread, key: str | None = KEY) -> str:
    """The /v1/ws address of `server`, with `key` as the api_key query parameter unless None."""
    return f"ws://{server.host}:{server.port}/v1/ws" + (f"?api_key={key}" if key is not None else "")


def open_ws(server: ServerThread, key: str | None = KEY, **kwargs: Any) -> ClientConnection:
    """A /v1/ws client connection (`kwargs` go to `websockets.sync.client.connect`)."""
    return connect(ws_url(server, key), proxy=None, open_timeout=TIMEOUT, **kwargs)


def open_from(server: ServerThread, address: str = "127.0.0.1", rcvbuf: int | None = None,
              **kwargs: Any) -> ClientConnection:
    """A /v1/ws client from `address` (any 127/8 address is this machine), its receive buffer optionally small."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting, so TCP never offers a bigger window
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((address, 0))
    sock.settimeout(TIMEOUT)
    sock.connect((server.host, server.port))
    return connect(ws_url(server), sock=sock, open_timeout=TIMEOUT, **kwargs)


def send(ws: ClientConnection, **message: Any) -> None:
    """Send `message` as one JSON text frame."""
    ws.send(json.dumps(message))


def event(ws: ClientConnection) -> dict:
    """The next message, which must be a JSON event."""
    message = ws.recv(timeout=TIMEOUT)
    assert isinstance(message, str), f"expected an event, got {len(message)} audio bytes"
    return json.loads(message)


def event_after_audio(ws: ClientConnection, audio: bytearray) -> dict:
    """The next JSON event; audio that arrives before it (a stream already speaking) is added to `audio`."""
    while isinstance(message := ws.recv(timeout=TIMEOUT), bytes):
        audio += message
    return json.loads(message)


def until_done(ws: ClientConnection) -> tuple[bytes, list[dict]]:
    """Audio and events up to and including `done`."""
    audio, events = bytearray(), []
    while not events or events[-1]["type"] != "done":
        message = ws.recv(timeout=TIMEOUT)
        if isinstance(message, bytes):
            audio += message
        else:
            events.append(json.loads(message))
    return bytes(audio), events


def start(ws: ClientConnection, **fields: Any) -> dict:
    """Send `start` (voice ryan, SEED, FRAMES unless `fields` say otherwise); the `started` event."""
    send(ws, type="start", **{"voice": "ryan", "seed": SEED, "max_frames": FRAMES, **fields})
    started = event(ws)
    assert started["type"] == "started", started
    return started


def say_and_stop(ws: ClientConnection, deltas: Iterable[str]) -> tuple[bytes, list[dict]]:
    """Send each text delta, then `stop`; the audio and events up to and including `done`."""
    for delta in deltas:
        send(ws, type="text", text=delta)
    send(ws, type="stop")
    return until_done(ws)


def speak_live(server: ServerThread, deltas: Iterable[str], key: str | None = KEY, open_timeout: float = TIMEOUT,
               **fields: Any) -> tuple[bytes, list[dict]]:
    """One /v1/ws utterance on its own socket: `start` with `fields`, the deltas, `stop`; as `say_and_stop`."""
    with connect(ws_url(server, key), proxy=None, open_timeout=open_timeout) as ws:
        start(ws, **fields)
        return say_and_stop(ws, deltas)


def expect_error(ws: ClientConnection, code: str, param: str | None = None) -> dict:
    """The next event, which must be a /v1/ws error with `code` (and `param` unless None); its `error`."""
    message = event(ws)
    assert message["type"] == "error", message
    error = message["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


def refused(ws: ClientConnection) -> tuple[dict, int | None]:
    """The refusal event and the close code."""
    message = event(ws)
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=TIMEOUT)
    return message, ws.close_code
