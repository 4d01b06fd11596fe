"""Wyoming (`serve --wyoming-port`, `api/protocols/wyoming.py`) end to end: a real uvicorn server whose lifespan
opens the Wyoming port on loopback, and the `wyoming` package's own client (what Home Assistant uses).

Random weights rarely say EOS: the engine's runaway budget is set small, so every synthesis ends
within a few dozen frames. No test asserts a duration: timeouts only bound a test that would hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from qwen3_tts_gguf.cli import build_parser

from api import ServerConfig, create_app
from api.limits import ServerLimits
from api.ops.lifecycle import PROCESS
from api.testing import ServerThread
from tests.server_fixtures import short_stream_registries
from tests.ws_helpers import KEY, httpx, run_async, wait_idle

SAMPLES_PER_FRAME = 1920


registry, own_registry = short_stream_registries(max_streams=2, max_pending=4)


@contextlib.contextmanager
def serve(registry, **limits) -> Iterator[tuple[ServerThread, int]]:
    """A real server with an API key and a Wyoming port (any free one); (server, Wyoming port)."""
    config = ServerConfig(api_key=KEY, webui_dir=None, wyoming_port=0, limits=ServerLimits(**limits))
    app = create_app(config, registry)
    with ServerThread(app) as server:
        yield server, app.state.wyoming.port


@pytest.fixture(scope="module")
def server(registry):
    with serve(registry) as running:
        yield running


async def read_until(client: AsyncTcpClient, *types: str) -> list[Event]:
    """Events up to and including the first of `types` (or up to the end of the connection)."""
    events = []
    while (event := await client.read_event()) is not None:
        events.append(event)
        if event.type in types:
            break
    return events


def audio_of(events: list[Event]) -> bytes:
    return b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))


# -- describe, synthesize, streaming ---------------------------------------------------------------


def test_describe_offers_the_voices_of_the_http_listing_in_language_codes(server):
    http, port = server

    async def describe():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            return Info.from_event(await client.read_event())

    info = run_async(describe())
    assert len(info.tts) == 1 and info.tts[0].supports_synthesize_streaming and info.tts[0].installed
    listed = httpx.get(f"{http.url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}).json()["voices"]
    assert [v.name for v in info.tts[0].voices] == [v["id"] for v in listed]
    assert all("en" in v.languages and "zh" in v.languages for v in info.tts[0].voices)
    capabilities = httpx.get(f"{http.url}/v1/capabilities", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert {"name": "wyoming", "path": f"tcp://127.0.0.1:{port}", "subprotocol": None, "version": "1.10.2",
            "features": ["synthesize", "synthesize_streaming"]} in capabilities["protocols"]


def test_synthesize_sends_pcm_between_audio_start_and_audio_stop_and_the_connection_serves_again(server, registry):
    _, port = server

    async def two_syntheses():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            runs = []
            for voice in (SynthesizeVoice(name="ryan"), SynthesizeVoice(language="en-US")):
                await client.write_event(Synthesize(text="Hello from the kitchen.", voice=voice).event())
                runs.append(await read_until(client, AudioStop().event().type))
            await client.write_event(Ping(text="still there?").event())
            return runs, Pong.from_event(await client.read_event())

    runs, pong = run_async(two_syntheses())
    assert pong.text == "still there?"
    for events in runs:
        assert AudioStart.is_type(events[0].type) and AudioStop.is_type(events[-1].type)
        start = AudioStart.from_event(events[0])
        assert (start.rate, start.width, start.channels) == (24000, 2, 1)
        assert all(AudioChunk.is_type(e.type) for e in events[1:-1]) and len(events) > 2
        audio = audio_of(events)
        assert audio and len(audio) % (2 * SAMPLES_PER_FRAME) == 0  # whole 80 ms frames of s16 samples
    assert wait_idle(registry)["active"] == 0


def test_streamed_text_is_spoken_and_ends_with_synthesize_stopped(server, registry):
    _, port = server

    async def stream():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="alloy")).event())
            for chunk in ("Turning on ", "the lights ", "in the hall. ", "Anything else?"):
                await client.write_event(SynthesizeChunk(text=chunk).event())
            # Home Assistant sends the whole text once more for servers without streaming: ignored
            await client.write_event(Synthesize(text="Turning on the lights in the hall. Anything else?").event())
            await client.write_event(SynthesizeStop().event())
            return await read_until(client, SynthesizeStopped().event().type)

    events = run_async(stream())
    types = [e.type for e in events]
    assert types[0] == "audio-start" and types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert set(types[1:-2]) == {"audio-chunk"} and types.count("audio-stop") == 1
    assert len(audio_of(events)) % (2 * SAMPLES_PER_FRAME) == 0
    assert wait_idle(registry)["active"] == 0


# -- refusals and hostile clients -------------------------------------------------------------------


async def refused_with(port: int, *raw: bytes) -> tuple[Error, bool]:
    """Send `raw` bytes (or nothing); the error event and whether the server then closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for chunk in raw:
            writer.write(chunk)
        await writer.drain()
        header = json.loads(await reader.readline())
        data = json.loads(await reader.readexactly(header["data_length"])) if header.get("data_length") else {}
        assert header["type"] == "error", header
        closed = await reader.read() == b""
        return Error.from_event(Event(type="error", data=data)), closed
    finally:
        writer.close()


def line(event: dict) -> bytes:
    return json.dumps(event).encode() + b"\n"


@pytest.mark.parametrize("raw, code", [
    (line({"type": "synthesize", "data": {"text": "Hi", "voice": {"name": "nobody-by-this-name"}}}), "invalid_value"),
    (line({"type": "synthesize", "data": {"text": "   "}}), "invalid_value"),
    (line({"type": "synthesize", "data": {"text": 42}}), "invalid_value"),
    (line({"type": "synthesize-chunk", "data": {"text": "no start"}}), "no_active_stream"),
    (b"this is not json\n", "invalid_request_error"),
    (line({"type": "synthesize", "data_length": 10 ** 9}), "invalid_request_error"),  # refused before it is read
    (line({"type": "synthesize", "payload_length": -1}), "invalid_request_error"),
    (b"{" + b" " * (70 * 1024), "invalid_request_error"),  # a header line over ws_max_message_bytes
])
def test_a_bad_event_is_an_error_then_the_connection_closes_and_the_server_serves_on(server, registry, raw, code):
    _, port = server
    error, closed = run_async(refused_with(port, raw))
    assert error.code == code and error.text and closed

    async def describe():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            return await client.read_event()

    assert Info.is_type(run_async(describe()).type)
    assert wait_idle(registry)["active"] == 0


def test_a_client_that_leaves_mid_synthesis_frees_its_stream(own_registry):
    registry = own_registry
    with serve(registry) as (_, port):
        async def leave():
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="ryan")).event())
                await client.write_event(SynthesizeChunk(text="A sentence that never ends because").event())
                return await client.read_event()  # then gone, the text never stopped

        first = run_async(leave())
        assert first is None or AudioStart.is_type(first.type)
        assert wait_idle(registry)["active"] == 0


def test_idle_connections_and_socket_counts_are_bounded(own_registry):
    with serve(own_registry, ws_idle_timeout_s=0.3, max_sockets_per_client=2) as (_, port):
        async def idle_then_crowded():
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Ping().event())
                answered = Pong.is_type((await client.read_event()).type)
                idle_closed = answered and await client.read_event() is None  # then nothing: closed when idle
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            third = await refused_with(port)
            for _, w in held:
                w.close()
            return idle_closed, third

        idle_closed, (error, closed) = run_async(idle_then_crowded())
        assert idle_closed and error.code == "too_many_sockets" and closed


def test_a_draining_server_refuses_new_wyoming_connections(server):
    _, port = server
    PROCESS.draining = True
    try:
        error, closed = run_async(refused_with(port))
    finally:
        PROCESS.draining = False
    assert error.code == "unavailable" and "draining" in error.text and closed


def test_serve_flags_and_environment_reach_the_config(monkeypatch):
    args = build_parser().parse_args(["serve", "--wyoming-port", "10200", "--host", "0.0.0.0"])
    config = ServerConfig.from_args(args)
    assert (config.wyoming_port, config.wyoming_host or config.host) == (10200, "0.0.0.0")
    monkeypatch.setenv("QTTS_WYOMING_PORT", "10300")
    monkeypatch.setenv("QTTS_WYOMING_HOST", "127.0.0.2")
    config = ServerConfig.from_args(build_parser().parse_args(["serve"]))
    assert (config.wyoming_port, config.wyoming_host) == (10300, "127.0.0.2")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--wyoming-port", "70000"])
