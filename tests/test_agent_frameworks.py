"""Voice-agent frameworks' own TTS services against a real server, their base URL changed as
docs/integrations.md says. LiveKit Agents' plugins (livekit-plugins-openai, livekit-plugins-elevenlabs
1.8.9): the OpenAI plugin's one-shot request in both of its shapes (`tts-1`: the audio itself; other
model names: SSE events), the ElevenLabs plugin's token stream (the multi-context socket) and its
one-shot request (`/stream`), in pcm and in its own default format (mp3 at 22.05 kHz, 32 kb/s, decoded by
the plugin), on the `/elevenlabs/v1` base URL too. Pipecat's OpenAITTSService (pipecat-ai 1.14; its ElevenLabs services:
tests/test_elevenlabs.py).

Each run must give 24 kHz mono frames with audio in them and leave nothing running; the services choose
no seed, so the bytes are not compared (tests/test_elevenlabs.py compares them bit for bit).
"""

from __future__ import annotations

import pytest

from tests.server_fixtures import server_fixture, short_stream_registries
from tests.ws_helpers import KEY, run_async, run_pipecat, wait_idle

pytest.importorskip("livekit.plugins.elevenlabs")
pytest.importorskip("livekit.plugins.openai")

registry, own_registry = short_stream_registries(max_streams=2, max_pending=4)
server = server_fixture()
TEXT = "Hello there. This is a voice agent speaking."


def check(frames, rate: int = 24000) -> None:
    """Mono frames at `rate` (LiveKit's or Pipecat's) holding at least the budget's 6 frames of 80 ms."""
    assert frames and all(f.sample_rate == rate and f.num_channels == 1 for f in frames)
    samples = sum(f.samples_per_channel if hasattr(f, "samples_per_channel") else f.num_frames for f in frames)
    assert samples >= rate * 6 * 8 // 100


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


@pytest.mark.parametrize("encoding, base", [("pcm_24000", "/v1"), (None, "/elevenlabs/v1")])
@pytest.mark.parametrize("streamed", [True, False])
def test_livekits_elevenlabs_plugin(server, registry, streamed, encoding, base):
    """None: the plugin's default `encoding`, mp3_22050_32."""
    import aiohttp
    from livekit.plugins import elevenlabs

    async def speak():
        async with aiohttp.ClientSession() as session:
            tts = elevenlabs.TTS(api_key=KEY, base_url=f"{server.url}{base}", voice_id="ryan", model="tts-1",
                                 http_session=session, **({"encoding": encoding} if encoding else {}))
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

    frames = run_async(speak())
    check(frames, 24000 if encoding else 22050)
    if streamed:  # the socket's alignment gives the plugin its timed words (for LiveKit's transcript sync)
        from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

        timed = [t for f in frames for t in f.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
        assert "".join(timed).strip() == TEXT and len(timed) == len(TEXT.split(" "))
    assert wait_idle(registry)["active"] == 0


def test_pipecats_openai_service(server, registry, monkeypatch):
    """Pipecat's OpenAITTSService (the openai SDK's streaming response, pcm at 24 kHz, OpenAI's voice
    names only): audio frames between its started and stopped frames, and the sentence said."""
    pytest.importorskip("pipecat")
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSStartedFrame, TTSStoppedFrame, TTSTextFrame
    from pipecat.services.openai.tts import OpenAITTSService

    def make_service(_session):
        return OpenAITTSService(api_key=KEY, base_url=f"{server.url}/v1", sample_rate=24000,
                                settings=OpenAITTSService.Settings(voice="alloy", model="gpt-4o-mini-tts"))

    down, up = run_pipecat(make_service, TEXT, 24000, monkeypatch)
    assert not [f for f in [*down, *up] if isinstance(f, ErrorFrame)], [*down, *up]
    kinds = [type(f) for f in down if isinstance(f, (TTSStartedFrame, TTSAudioRawFrame, TTSStoppedFrame))]
    assert kinds[0] is TTSStartedFrame and kinds[-1] is TTSStoppedFrame and TTSAudioRawFrame in kinds
    check([f for f in down if isinstance(f, TTSAudioRawFrame)])
    assert " ".join(f.text for f in down if isinstance(f, TTSTextFrame)) == TEXT
    assert wait_idle(registry)["active"] == 0
