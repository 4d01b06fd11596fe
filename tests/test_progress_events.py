"""Text progress and normalization through every protocol, on a real uvicorn: `/v1/ws` `progress`
events, SSE `speech.progress`, Realtime `response.output_audio.progress`, and `text_normalization`.

What the engine computes is tested in tests/test_text_progress.py and tests/test_text_normalization.py;
here: the fields reach each client in order with the audio they describe, the last one is final and
covers the text, and a request without `progress` gets no such events (old clients unchanged).
"""

from __future__ import annotations

import base64
import json

import pytest
from websockets.sync.client import connect

from qwen3_tts_gguf.model.settings import EngineSettings

from tests.server_fixtures import server_fixtures
from tests.ws_helpers import httpx, post_speech, ws_url

TEXT = "Hello there, 👋 this is progress: 世界."
SEED, FRAMES, TIMEOUT = 5, 40, 30.0
SAMPLE_RATE = 24000


registry, server = server_fixtures(settings=EngineSettings(threads=1, deterministic=True, max_streams=2),
                                   api_key=None)


def check_progress(events: list[dict], text: str, audio_bytes: int, speed: float = 1.0) -> None:
    """Monotonic, spoken <= fed, the last one final and at the end of the text and of the audio."""
    assert events, "no progress events"
    fed = [e["text_fed_end"] for e in events]
    spoken = [e["spoken_end_estimate"] for e in events]
    audio = [e["audio_end_s"] for e in events]
    assert fed == sorted(fed) and spoken == sorted(spoken) and audio == sorted(audio)
    assert all(s <= f <= len(text) for s, f in zip(spoken, fed))
    assert events[-1]["basis"] == "final" and all(e["basis"] == "frames_per_token" for e in events[:-1])
    # audio_end_s counts the audio as played: after `speed` (atempo's output length is within a few ms)
    assert events[-1]["audio_end_s"] == pytest.approx(audio_bytes / 2 / SAMPLE_RATE, abs=1e-3 if speed == 1 else 0.03)


def ws_session(server, start: dict, deltas: list[str]) -> tuple[bytes, list[dict]]:
    audio, events = bytearray(), []
    with connect(ws_url(server, None), proxy=None, open_timeout=TIMEOUT) as ws:
        ws.send(json.dumps({"type": "start", "format": "pcm", "seed": SEED, "max_frames": FRAMES,
                            "voice": "ryan", **start}))
        for delta in deltas:
            ws.send(json.dumps({"type": "text", "text": delta}))
        ws.send(json.dumps({"type": "stop"}))
        while not events or events[-1]["type"] != "done":
            message = ws.recv(timeout=TIMEOUT)
            if isinstance(message, bytes):
                audio += message
                events.append({"type": "audio", "end": len(audio)})
            else:
                events.append(json.loads(message))
    return bytes(audio), events


def test_ws_progress_follows_the_audio_and_ends_final(server):
    deltas = [TEXT[i:i + 3] for i in range(0, len(TEXT), 3)]
    audio, events = ws_session(server, {"progress": True}, deltas)
    assert events[0]["type"] == "started" and events[-1]["type"] == "done"
    progress = [e for e in events if e["type"] == "progress"]
    check_progress(progress, TEXT, len(audio))
    # each intermediate event comes right after the audio it describes
    for i, e in enumerate(events):
        if e["type"] == "progress" and e["basis"] != "final":
            assert events[i - 1]["type"] == "audio"
            assert e["audio_end_s"] == pytest.approx(events[i - 1]["end"] / 2 / SAMPLE_RATE, abs=1e-3)
    assert events[-2] == progress[-1]  # the final one just before done
    if events[-1]["finish_reason"] == "eos":
        assert progress[-1]["text_fed_end"] == len(TEXT) == progress[-1]["spoken_end_estimate"]

    plain_audio, plain = ws_session(server, {}, deltas)  # the same session without progress
    assert plain_audio == audio and not [e for e in plain if e["type"] == "progress"]


def sse(server, **fields) -> list[dict]:
    response = post_speech(server, TEXT, None, TIMEOUT,
                           **{"stream_format": "sse", "seed": SEED, "max_frames": FRAMES, **fields})
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("text_mode", ["streaming", "non-streaming"])
def test_sse_progress_after_each_delta_in_both_text_modes_only_when_asked(server, text_mode):
    events = sse(server, progress=True, text_mode=text_mode, speed=1.25)
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    progress = [e for e in events if e["type"] == "speech.progress"]
    check_progress(progress, TEXT, len(audio), speed=1.25)
    assert len(progress) > 2 and events[-1]["type"] == "speech.audio.done" and events[-2] == progress[-1]
    if text_mode == "non-streaming":  # the prefill read the whole text
        assert {e["text_fed_end"] for e in progress} == {len(TEXT)}
    assert not [e for e in sse(server, text_mode=text_mode) if e["type"] == "speech.progress"]


def test_realtime_progress_extension(server):
    with connect(f"ws://{server.host}:{server.port}/v1/realtime?model=gpt-realtime", proxy=None,
                 open_timeout=TIMEOUT) as ws:
        assert json.loads(ws.recv(timeout=TIMEOUT))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"voice": "ryan"}}, "progress": True, "seed": SEED,
            "text_mode": "streaming", "max_output_tokens": FRAMES}}))
        assert json.loads(ws.recv(timeout=TIMEOUT))["type"] == "session.updated"
        ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT}]}}))
        ws.send(json.dumps({"type": "response.create"}))
        events = []
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(ws.recv(timeout=TIMEOUT)))
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    progress = [e for e in events if e["type"] == "response.output_audio.progress"]
    check_progress(progress, TEXT, len(audio))
    last = max(i for i, e in enumerate(events) if e["type"] == "response.output_audio.progress")
    assert events[last + 1]["type"] == "response.output_audio.done"  # the final one closes the audio
    assert all(e["response_id"] and e["item_id"] for e in progress)


def test_text_normalization_reaches_the_engine_and_the_usage(server):
    text = "It costs $5 on 11/30."
    audio, events = ws_session(server, {"progress": True, "text_normalization": "auto", "language": "english"},
                               [text[:7], text[7:]])
    done = events[-1]
    assert done["usage"]["characters"] == len(text)
    assert done["usage"]["normalized_characters"] and done["usage"]["normalized_characters"] > len(text)
    final = [e for e in events if e["type"] == "progress"][-1]
    assert final["normalized_text_fed_end"] >= final["text_fed_end"]
    _, plain = ws_session(server, {"language": "english"}, [text])
    assert plain[-1]["usage"]["normalized_characters"] is None

    normalized = sse(server, text_normalization="auto", language="english", input=text)
    assert normalized[-1]["usage"]["normalized_characters"] is not None
    response = httpx.post(f"http://{server.host}:{server.port}/v1/audio/speech", timeout=TIMEOUT, json={
        "model": "tts-1", "voice": "ryan", "input": text, "text_normalization": "always"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "text_normalization"
