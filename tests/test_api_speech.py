"""POST /v1/audio/speech and the listings, end to end: a real uvicorn server, the real `openai` SDK.

Three tiny converted models are served: a 1.7B-like CustomVoice (default; takes instructions), a
0.6B-like CustomVoice (cannot take instructions) and a VoiceDesign model. Random weights rarely
say EOS, so every request caps `max_frames`; the deterministic engine profile and fixed seeds
make the server's audio comparable with the engine's own output.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
from typing import get_args

import av
import numpy as np

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import openai
import pytest
import soundfile

from qwen3_tts_gguf.audio.formats import to_s16
from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings

from api import ModelRegistry, ServerConfig, create_app
from api.registry import OPENAI_MODEL_ALIASES
from api.testing import ServerThread
from tests.server_fixtures import server_fixtures

KEY = "test-key"
ORIGIN = "http://console.example"
TEXT = "Hello there, this is a streaming test."
SEED = 7
FRAMES = 16
SAMPLES_PER_FRAME = 1920
AUTH = {"Authorization": f"Bearer {KEY}"}


registry, server = server_fixtures(8, models=("tiny_cv", "tiny0b6_cv_bf16", "tiny_vd"), api_key=KEY,
                                   cors_origins=(ORIGIN,))


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api_url, api_key=KEY, max_retries=0)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def speech(client: openai.OpenAI, fmt: str = "pcm", voice="ryan", text: str = TEXT, model: str = "tts-1",
           **extra) -> tuple[bytes, dict]:
    """One streamed request through the SDK: (body, headers)."""
    extra = {"seed": SEED, "max_frames": FRAMES, **extra}
    speed = extra.pop("speed", None)
    instructions = extra.pop("instructions", None)
    kwargs = {k: v for k, v in (("speed", speed), ("instructions", instructions)) if v is not None}
    with client.audio.speech.with_streaming_response.create(
            model=model, input=text, voice=voice, response_format=fmt, extra_body=extra, **kwargs) as response:
        return b"".join(response.iter_bytes()), dict(response.headers)


def engine_samples(registry: ModelRegistry, text: str, speaker: str, seed: int, frames: int) -> np.ndarray:
    """The default model's engine, asked directly (no HTTP), with the manifest's sampling defaults."""
    served = registry.default
    gen = served.manifest.sampling
    request = SynthesisRequest(
        text=text, voice=VoiceSpec(speaker=speaker),
        talker=TalkerSampling(SamplingParams.from_generation_config(gen), gen["repetition_penalty"]),
        code_predictor=SamplingParams.from_generation_config(gen, "subtalker_"), seed=seed, max_frames=frames)
    stream = served.engine.submit(request)
    samples = np.concatenate([chunk.samples for chunk in stream])
    assert stream.result.finish_reason in ("eos", "max_frames")
    return samples


@pytest.fixture(scope="module")
def reference(registry, server) -> np.ndarray:
    return engine_samples(registry, TEXT, "ryan", SEED, FRAMES)


def decode(data: bytes, fmt: str) -> np.ndarray:
    """Decoded mono samples at 24 kHz: int16 for the lossless formats, float32 for the lossy ones."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2")
    if fmt == "wav":  # streamed WAV: RIFF/data sizes 0xFFFFFFFF, which soundfile accepts
        samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
        assert rate == 24000
        return samples
    container = av.open(io.BytesIO(data), format={"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac"}[fmt])
    lossless = fmt == "flac"
    resampler = av.AudioResampler(format="s16" if lossless else "flt", layout="mono", rate=24000)
    frames = [f for frame in container.decode(audio=0) for f in resampler.resample(frame)]
    frames += resampler.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames])


def aligned_correlation(reference: np.ndarray, decoded: np.ndarray) -> float:
    """Correlation after removing the codec's delay (found by cross-correlation)."""
    n = len(reference) + len(decoded)
    cc = np.fft.irfft(np.fft.rfft(decoded, n) * np.conj(np.fft.rfft(reference, n)), n)
    lag = int(np.argmax(cc))
    lag = lag if lag < n // 2 else lag - n
    shifted = decoded[lag:] if lag >= 0 else np.concatenate([np.zeros(-lag, decoded.dtype), decoded])
    k = min(len(shifted), len(reference))
    return float(np.corrcoef(reference[:k], shifted[:k])[0, 1])


# -- audio ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus", "aac"])
def test_every_format_decodes_to_the_engine_samples(client, reference, fmt):
    body, headers = speech(client, fmt)
    if fmt == "flac":  # sent whole, its STREAMINFO final (tests/test_flac_stream.py)
        assert int(headers["content-length"]) == len(body) and "transfer-encoding" not in headers
    else:
        assert "content-length" not in headers and headers["transfer-encoding"] == "chunked"
    assert headers["content-type"] == {"pcm": "audio/pcm", "wav": "audio/wav", "flac": "audio/flac",
                                       "mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac"}[fmt]
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no"
    decoded = decode(body, fmt)
    if fmt in ("pcm", "wav", "flac"):
        np.testing.assert_array_equal(decoded, to_s16(reference))
    else:
        assert abs(len(decoded) - len(reference)) <= 2048  # encoder delay and padding
        assert aligned_correlation(reference, decoded) > 0.8


def test_first_bytes_arrive_before_the_last_frame_is_generated(client, registry):
    """By the engine's own count: frames generated when the first body bytes reached the client."""
    engine, total = registry.default.engine, 150
    before = engine.stats["frames"]
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", input=TEXT, voice="ryan", response_format="pcm",
            extra_body={"seed": SEED, "max_frames": total}) as response:
        pieces = response.iter_bytes()
        first = next(pieces)
        frames_at_first_bytes = engine.stats["frames"] - before
        body = first + b"".join(pieces)
    frames = len(body) // 2 // SAMPLES_PER_FRAME
    assert first and frames == engine.stats["frames"] - before
    assert frames_at_first_bytes < frames, (frames_at_first_bytes, frames)


def test_sse_events_concatenate_to_the_audio_body(client, http, registry):
    audio, _ = speech(client, "mp3")
    response = http.post("/v1/audio/speech", json={
        "model": "tts-1", "input": TEXT, "voice": "ryan", "response_format": "mp3", "stream_format": "sse",
        "seed": SEED, "max_frames": FRAMES})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in response.text.split("\n\n") if b]
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks)  # no event: lines, no [DONE]
    events = [json.loads(b[len("data: "):]) for b in blocks]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == audio
    done = events[-1]
    text_tokens = len(registry.default.model.prompts.text_ids(TEXT))
    usage = done["usage"]
    assert done == {"type": "speech.audio.done", "usage": {
        "input_tokens": text_tokens, "output_tokens": FRAMES, "total_tokens": text_tokens + FRAMES,
        "characters": len(TEXT), "normalized_characters": usage["normalized_characters"],
        "audio_seconds": FRAMES * 0.08, "frames": FRAMES, "first_audio_s": usage["first_audio_s"],
        "runaways": 0, "runaway_retries": 0}}
    assert 0 < usage["first_audio_s"] < 60 and usage["normalized_characters"] in (None, *range(1, 10 * len(TEXT)))


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_changes_duration(client, reference, speed):
    body, _ = speech(client, "pcm", speed=speed)
    expected = len(reference) / speed
    assert abs(len(body) // 2 - expected) <= 0.02 * expected + 1024, (len(body) // 2, expected)


def test_voice_names_object_form_and_openai_aliases(client):
    by_name, headers = speech(client, voice="serena")
    assert headers["x-qwen3tts-voice"] == "serena"
    by_object, _ = speech(client, voice={"id": "Serena"})
    by_alias, alias_headers = speech(client, voice="alloy")  # alloy -> serena (api/voice_resolution.py table)
    assert by_name == by_object == by_alias
    assert alias_headers["x-qwen3tts-voice"] == "serena"


def test_models_are_picked_by_id_folder_name_and_alias(client, registry):
    served = registry.models[1]
    _, by_id = speech(client, model=served.id, max_frames=2)
    _, by_folder = speech(client, model=served.folder.name, max_frames=2)
    _, by_alias = speech(client, model="gpt-4o-mini-tts", max_frames=2)
    assert by_id["x-qwen3tts-model"] == by_folder["x-qwen3tts-model"] == served.id
    assert by_alias["x-qwen3tts-model"] == registry.default.id


def test_instructions_ignored_where_the_model_cannot_take_them(client, registry, caplog):
    small = registry.models[1]  # 0.6B-like CustomVoice
    assert not small.manifest.instruct_supported
    with caplog.at_level(logging.INFO, logger="api.routes.speech"):
        _, headers = speech(client, model=small.id, instructions="Speak very slowly.", max_frames=2)
    assert headers["x-qwen3tts-instructions-ignored"] == "true"
    assert any("instructions ignored" in r.getMessage() for r in caplog.records)
    _, headers = speech(client, instructions="Speak very slowly.", max_frames=2)  # 1.7B-like takes them
    assert "x-qwen3tts-instructions-ignored" not in headers


def test_voice_design_takes_its_voice_from_the_instructions(client, registry):
    design = registry.models[2].id
    _, headers = speech(client, model=design, voice="whoever", instructions="A calm, deep voice.", max_frames=2)
    assert headers["x-qwen3tts-voice-ignored"] == "true" and headers["x-qwen3tts-voice"] == "instructions"
    _, headers = speech(client, model=design, voice="onyx", max_frames=2)  # its description stands in
    assert "x-qwen3tts-voice-ignored" not in headers
    with pytest.raises(openai.BadRequestError) as err:
        speech(client, model=design, voice="whoever", max_frames=2)
    assert err.value.body["param"] == "instructions"


def test_unknown_fields_are_ignored_and_named(client):
    _, headers = speech(client, max_frames=2, stream=True, lang_code="a")
    assert headers["x-qwen3tts-ignored-fields"] == "lang_code,stream"


def test_the_path_without_v1_and_the_full_input_length(http):
    response = http.post("/audio/speech", json={"model": "tts-1", "input": "word " * 819 + "x", "voice": "ryan",
                                                 "response_format": "pcm", "max_frames": 2, "seed": 1})
    assert response.status_code == 200 and len(response.content) == 2 * 2 * SAMPLES_PER_FRAME


def test_failure_after_audio_aborts_the_connection_or_sends_an_error_event(http, registry, failing_codec):
    calls = failing_codec(registry.default.model.codec)
    body = {"model": "tts-1", "input": TEXT, "voice": "ryan", "response_format": "wav", "max_frames": 40}
    received = []
    with pytest.raises(httpx.RemoteProtocolError):  # no terminating chunk: the file is known to be cut
        with http.stream("POST", "/v1/audio/speech", json=body) as response:
            assert response.status_code == 200
            for piece in response.iter_bytes():
                received.append(piece)
    assert b"".join(received).startswith(b"RIFF")
    calls.clear()
    response = http.post("/v1/audio/speech", json={**body, "stream_format": "sse"})
    events = [json.loads(b[len("data: "):]) for b in response.text.split("\n\n") if b]
    assert events[0]["type"] == "speech.audio.delta"
    message = events[-1]["error"]["message"]
    assert events[-1]["type"] == "error" and "codec failed" in message and "exploded" not in message
    assert set(events[-1]["error"]) == {"message", "type", "param", "code"}


# -- errors ---------------------------------------------------------------------------------------


def _envelope(error: openai.APIStatusError) -> dict:
    body = error.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("kwargs, exc, status, param", [
    ({"input": ""}, openai.BadRequestError, 400, "input"),
    ({"input": "x" * 4097}, openai.BadRequestError, 400, "input"),
    ({"voice": "nobody"}, openai.BadRequestError, 400, "voice"),
    ({"model": "no-such-model"}, openai.NotFoundError, 404, "model"),
    ({"response_format": "xyz"}, openai.BadRequestError, 400, "response_format"),
    ({"speed": 5}, openai.BadRequestError, 400, "speed"),
    ({"extra_body": {"language": "klingon"}}, openai.BadRequestError, 400, "language"),
])
def test_documented_errors(client, kwargs, exc, status, param):
    request = {"model": "tts-1", "input": TEXT, "voice": "ryan", "response_format": "pcm",
               "extra_body": {"max_frames": 2}, **kwargs}
    with pytest.raises(exc) as err:
        client.audio.speech.create(**request)
    assert err.value.status_code == status
    error = _envelope(err.value)
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert err.value.response.headers["x-should-retry"] == "false"


def test_malformed_json(http):
    response = http.post("/v1/audio/speech", content=b'{"model": "tts-1", "input": ',
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_wrong_or_missing_api_key(server):
    bad = openai.OpenAI(base_url=server.api_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.audio.speech.create(model="tts-1", input=TEXT, voice="ryan")
    assert err.value.status_code == 401 and _envelope(err.value)["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # health stays open


# -- listings, health, metrics, CORS ---------------------------------------------------------


def test_model_listings(client, http, registry):
    ids = [m.id for m in client.models.list()]
    assert ids == [m.id for m in registry.models] + list(OPENAI_MODEL_ALIASES)
    card = client.models.retrieve("tts-1-hd")
    assert card.id == "tts-1-hd" and card.root == registry.default.id and card.object == "model"
    assert client.models.retrieve(registry.models[2].folder.name).root == registry.models[2].id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    assert http.get("/v1/audio/models").json() == {"models": [{"id": i} for i in ids]}


def test_every_speech_model_the_openai_sdk_names_is_served(client, registry):
    """The SDK's `SpeechModel` literal and the snapshots its create-speech documents (they differ: the
    literal has one snapshot, the text two): each speaks with the default model."""
    from openai.resources.audio.speech import Speech
    from openai.types.audio.speech_model import SpeechModel

    named = set(get_args(SpeechModel)) | set(re.findall(r"`([\w.-]*tts[\w.-]*)`", Speech.create.__doc__))
    assert {"tts-1", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-03-20"} <= named
    for model in sorted(named):
        _, headers = speech(client, model=model, max_frames=1)
        assert headers["x-qwen3tts-model"] == registry.default.id, model


def test_voice_listing(http, registry):
    voices = http.get("/v1/audio/voices").json()["voices"]
    by_id = {v["id"]: v for v in voices}
    assert all({"id", "name"} <= set(v) for v in voices)
    assert set(registry.default.manifest.speakers) < set(by_id)
    assert by_id["uncle_fu"]["name"] == "Uncle Fu" and by_id["uncle_fu"]["kind"] == "speaker"
    assert by_id["alloy"]["speaker"] == "serena" and by_id["alloy"]["kind"] == "openai"
    assert registry.models[2].id in by_id["alloy"]["models"]  # VoiceDesign: the description is used
    design_only = http.get("/v1/audio/voices", params={"model": registry.models[2].id}).json()["voices"]
    assert {v["kind"] for v in design_only} == {"openai"}


def test_health_ready_and_metrics(server, client):
    speech(client, max_frames=2)
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{server.url}/ready").json()
    assert ready["status"] == "ready" and ready["models"][0]["default"] is True
    response = httpx.get(f"{server.url}/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert 'qtts_http_requests_total{path="/v1/audio/speech",status="200"}' in text
    assert 'qtts_http_requests_total{path="/v1/audio/speech",status="400"}' in text
    for name in ("qtts_time_to_first_audio_seconds_bucket", "qtts_real_time_factor_count", "qtts_active_streams",
                 "qtts_queue_depth", "qtts_speech_streams_total", "qtts_audio_seconds_total"):
        assert name in text, name


def test_cors(server):
    preflight = httpx.options(f"{server.url}/v1/audio/speech", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    response = httpx.get(f"{server.url}/v1/models", headers={"Origin": ORIGIN, **AUTH})
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "x-qwen3tts-instructions-ignored" in response.headers["access-control-expose-headers"]
    other = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://elsewhere", **AUTH})
    assert "access-control-allow-origin" not in other.headers


def test_web_console_is_served_at_the_root_and_api_routes_win(tmp_path, converted_factory):
    (tmp_path / "index.html").write_text("<h1>console</h1>")
    registry = ModelRegistry.load([converted_factory("tiny_cv", "f32")], EngineSettings(threads=1, max_streams=1))
    try:
        with ServerThread(create_app(ServerConfig(api_key=KEY, webui_dir=tmp_path), registry)) as running:
            assert httpx.get(f"{running.url}/").text == "<h1>console</h1>"  # no key needed for the page
            assert httpx.get(f"{running.url}/v1/models", headers=AUTH).json()["object"] == "list"
            missing = httpx.get(f"{running.url}/missing.js")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    finally:
        registry.close()
