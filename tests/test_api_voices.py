"""Cloned voices over HTTP: create (upload or design), list, speak by name (SDK), delete, refusals."""

from __future__ import annotations

import concurrent.futures
import io

import numpy as np
import openai
import pytest
import soundfile

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.voicebank.store import VoiceStore

from tests.server_fixtures import FixtureValue, server_fixtures
from tests.test_cli_voices import speechlike


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


registry, server = server_fixtures(settings=EngineSettings(threads=1, deterministic=True, max_streams=4),
                                   models=("tiny_cv", "tiny_base", "tiny_vd"), api_key=None,
                                   voices_dir=FixtureValue("voices_dir"))


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def wav_bytes(seconds=2.0, rate=24000, seed=0) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, speechlike(seconds, rate, seed), rate, format="WAV")
    return buf.getvalue()


def create(http, name, audio=None, **fields):
    files = {"audio_sample": ("clip.wav", audio, "audio/wav")} if audio is not None else None
    data = {"name": name, "consent": "yes", **fields}
    if files is None:
        return http.post("/v1/audio/voices", data=data)
    return http.post("/v1/audio/voices", data=data, files=files)


def test_clone_list_speak_delete(server, http, voices_dir):
    r = create(http, "alice", wav_bytes(), text="Exactly what alice says in the clip.")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "audio.voice" and body["id"] == body["name"] == "alice" and body["mode"] == "icl"
    assert isinstance(body["created_at"], int)
    assert create(http, "bob", wav_bytes(seed=1)).json()["mode"] == "xvector"  # no transcript
    listed = {v["id"]: v for v in http.get("/v1/audio/voices").json()["voices"]}
    assert listed["alice"]["name"] == "alice" and "bob" in listed and "ryan" in listed
    client = openai.OpenAI(base_url=server.api_url, api_key="not-needed", max_retries=0)
    for voice in ("alice", {"id": "alice"}, "bob"):
        # `tts-1` is the default (CustomVoice) model's alias: a profile speaks with its own Base model
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", input="Hi, I'm a cloned voice.", voice=voice, response_format="pcm",
                extra_body={"max_frames": 6, "seed": 3}) as response:
            pcm = response.read()
        assert len(pcm) == 6 * 1920 * 2
        assert response.headers["x-qwen3tts-model"].startswith("tiny_base")
    assert http.delete("/v1/audio/voices/alice").json() == {"object": "audio.voice.deleted", "id": "alice",
                                                            "deleted": True}
    assert http.delete("/v1/audio/voices/alice").status_code == 404
    assert http.delete("/v1/audio/voices/bob").status_code == 200
    assert VoiceStore(voices_dir).list() == []


def test_refusals(http, voices_dir, tmp_path):
    cases = [
        (create(http, "x1"), 400, "audio_sample"),  # neither audio nor instructions
        (create(http, "../evil", wav_bytes()), 400, "name"),
        (create(http, "x2", b"this is a text file, not audio"), 400, "audio_sample"),
        (create(http, "x3", wav_bytes(seconds=0.2)), 400, "audio_sample"),
        (create(http, "x4", wav_bytes(), model="tts-1"), 400, "model"),  # the CustomVoice default: not Base
        (http.post("/v1/audio/voices", json={"name": "x5"}), 400, None),
    ]
    for response, status, param in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["message"] and error["param"] == param
    assert VoiceStore(voices_dir).list() == []


def test_no_overwrite_unless_asked_and_concurrent_creates(http, voices_dir):
    clip = wav_bytes(seed=2)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        statuses = sorted(pool.map(lambda _: create(http, "carol", clip).status_code, range(3)))
    assert statuses[0] == 200 and set(statuses[1:]) <= {200, 409} and statuses.count(200) >= 1
    assert statuses.count(409) == len(statuses) - 1  # exactly one create won
    assert create(http, "carol", clip).status_code == 409
    assert create(http, "carol", clip, overwrite="true").status_code == 200
    assert VoiceStore(voices_dir).get("carol").mode == "xvector"
    assert http.delete("/v1/audio/voices/carol").status_code == 200


def test_design_then_clone(http, voices_dir):
    r = create(http, "narrator", instructions="A calm, low elderly voice.", language="english")
    assert r.status_code == 200, r.text
    profile = VoiceStore(voices_dir).get("narrator")
    assert profile.mode == "icl" and profile.ref_codes is not None and np.isfinite(profile.speaker_embedding).all()
    assert http.delete("/v1/audio/voices/narrator").status_code == 200
