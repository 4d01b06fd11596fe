"""LiveKit Agents' own TTS plugins (livekit-plugins-openai, livekit-plugins-elevenlabs 1.8.9) against a
real server, their base URL changed as docs/integrations.md says: the OpenAI plugin's one-shot request
in both of its shapes (`tts-1`: the audio itself; other model names: SSE events), the ElevenLabs
plugin's token stream (the multi-context socket) and its one-shot request (`/stream`).

Each run must give 24 kHz mono frames with audio in them and leave nothing running; the plugins choose
no seed, so the bytes are not compared (tests/test_elevenlabs.py compares them bit for bit).
"""

from __future__ import annotations

import pytest

from tests.ws_helpers import KEY, run_async, serve, short_stream_registries, wait_idle

pytest.importorskip("livekit.plugins.elevenlabs")
pytest.importorskip("livekit.plugins.openai")

registry, own_registry = short_stream_registries(max_streams=2, max_pending=4)
TEXT = "Hello there. This is a voice agent speaking."


@pytest.fixture(scope="module")
def server(registry):
    with serve(registry) as running:
        yield running


def check(frames) -> None:
    assert frames and all(f.sample_rate == 24000 and f.num_channels == 1 for f in frames)
    assert sum(f.samples_per_channel for f in frames) >= 1920 * 6  # at least the budget's 6 frames of 80 ms


@pytest.mark.parametrize("model", ["tts-1", "gpt-4o-mini-tts"])
def test_livekits_openai_plugin(server, registry, model):
    from livekit.plugins import openai

    async def speak():
        tts = openai.TTS(base_url=f"{server.url}/v1", api_key=KEY, model=model, voice="alloy", response_format="pcm")
        try:
            return [event.frame async for event in tts.synthesize(TEXT)]
        finally:
            await tts.aclose()

    check(run_async(speak()))
    assert wait_idle(registry)["active"] == 0


@pytest.mark.parametrize("streamed", [True, False])
def test_livekits_elevenlabs_plugin(server, registry, streamed):
    import aiohttp
    from livekit.plugins import elevenlabs

    async def speak():
        async with aiohttp.ClientSession() as session:
            tts = elevenlabs.TTS(api_key=KEY, base_url=f"{server.url}/v1", voice_id="ryan", model="tts-1",
                                 encoding="pcm_24000", http_session=session)
            try:
                if not streamed:
                    return [event.frame async for event in tts.synthesize(TEXT)]
                stream = tts.stream()
                for word in TEXT.split(" "):  # as an LLM's tokens come
                    stream.push_text(word + " ")
                stream.end_input()
                frames = [event.frame async for event in stream]
                await stream.aclose()
                return frames
            finally:
                await tts.aclose()

    check(run_async(speak()))
    assert wait_idle(registry)["active"] == 0
