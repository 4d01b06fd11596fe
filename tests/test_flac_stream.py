"""FLAC readable everywhere: the speech route sends a FLAC whole, in audio mode and SSE alike, its STREAMINFO
final (total samples, MD5), so libsndfile (soundfile), PyAV and `flac -t` all read it; a streamed FLAC (the
encoder's bytes as they come: socket frames) says total_samples = 0 and PyAV still decodes every sample
(api/README.md, "FLAC")."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess

import av
import numpy as np
import openai
import pytest
import soundfile

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from qwen3_tts_gguf.audio.encoding import StreamingEncoder
from qwen3_tts_gguf.audio.formats import to_s16
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.model.talker import TalkerError

from tests.server_fixtures import server_fixtures


def streaminfo(data: bytes) -> dict:
    """Rate, channels, bits, total_samples and MD5 of a FLAC stream's first metadata block (STREAMINFO)."""
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # block type 0: STREAMINFO, 34 bytes from offset 8
    word = int.from_bytes(data[18:26], "big")  # 20 bits rate, 3 channels-1, 5 bits-1, 36 total samples
    return {"rate": word >> 44, "channels": (word >> 41 & 7) + 1, "bits": (word >> 36 & 31) + 1,
            "total_samples": word & (1 << 36) - 1, "md5": data[26:42].hex()}


def decode_flac(data: bytes) -> np.ndarray:
    """PyAV over the bytes, every frame (the reader for a streamed FLAC)."""
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)])


def read_soundfile(data: bytes) -> np.ndarray:
    """libsndfile's view: the frame count from STREAMINFO, then the samples."""
    info = soundfile.info(io.BytesIO(data))
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert (info.samplerate, info.channels, rate) == (24000, 1, 24000) and info.frames == len(samples)
    return samples


def flac_test(data: bytes, tmp_path) -> None:
    """`flac -t`: every frame's CRC, and the MD5 of the decoded samples against STREAMINFO's."""
    flac = shutil.which("flac")
    if flac is None:
        pytest.skip("the flac command is not installed (Debian's flac package; .ci/run installs it)")
    path = tmp_path / "speech.flac"
    path.write_bytes(data)
    done = subprocess.run([flac, "-t", "-w", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "MD5 signature" not in done.stderr, done.stderr  # unset MD5: a warning


CHUNKS = [0.5 * np.sin(np.arange(n) / (3.0 + i)).astype(np.float32) for i, n in enumerate((1920, 3840, 7680, 1001))]


def test_streaming_encoder_flac_has_no_length_until_its_final_header(tmp_path):
    encoder = StreamingEncoder("flac", 24000)
    data = b"".join(encoder.encode(chunk) for chunk in CHUNKS) + encoder.finish()
    expected = to_s16(np.concatenate(CHUNKS))
    assert streaminfo(data) == {"rate": 24000, "channels": 1, "bits": 16, "total_samples": 0, "md5": "00" * 16}
    np.testing.assert_array_equal(decode_flac(data), expected)  # streamed: PyAV decodes every sample
    assert soundfile.info(io.BytesIO(data)).frames == 2**63 - 1  # libsndfile cannot size it: reading fails
    with pytest.raises((RuntimeError, ValueError, MemoryError)):
        soundfile.read(io.BytesIO(data))
    offset, header = encoder.final_header()
    whole = data[:offset] + header + data[offset + len(header):]
    assert streaminfo(whole)["total_samples"] == len(expected)
    np.testing.assert_array_equal(read_soundfile(whole), expected)
    np.testing.assert_array_equal(decode_flac(whole), expected)
    flac_test(whole, tmp_path)
    assert StreamingEncoder("pcm", 24000).final_header() is None  # nothing to write over


registry, server = server_fixtures(settings=EngineSettings(threads=1, deterministic=True, max_streams=2,
                                                           max_pending=2), api_key=None)
BODY = {"model": "tts-1", "input": "A FLAC file.", "voice": "ryan", "seed": 3, "max_frames": 6}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.mark.parametrize("speed", [1.0, 1.5])
def test_flac_response_is_whole_and_read_by_soundfile_pyav_and_flac(http, tmp_path, speed):
    body = {**BODY, "speed": speed}
    response = http.post("/v1/audio/speech", json={**body, "response_format": "flac"})
    assert response.status_code == 200 and response.headers["content-type"] == "audio/flac"
    flac = response.content
    assert int(response.headers["content-length"]) == len(flac) and "transfer-encoding" not in response.headers
    pcm = np.frombuffer(http.post("/v1/audio/speech", json={**body, "response_format": "pcm"}).content, "<i2")
    assert speed != 1.0 or len(pcm) == 6 * 1920
    assert streaminfo(flac)["total_samples"] == len(pcm)  # after the tempo change too
    np.testing.assert_array_equal(read_soundfile(flac), pcm)  # lossless: s16 exact
    np.testing.assert_array_equal(decode_flac(flac), pcm)
    flac_test(flac, tmp_path)


def test_flac_sse_deltas_join_to_the_whole_file(http, server, tmp_path):
    """SSE sends a FLAC whole too (the openai SDK as client): its deltas, joined, are the audio-mode file, final
    STREAMINFO included, so libsndfile, PyAV and `flac -t` read it; word events still come."""
    client = openai.OpenAI(base_url=server.api_url, api_key="any", max_retries=0)
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", input=BODY["input"], voice="ryan", response_format="flac", stream_format="sse",
            extra_body={"seed": 3, "max_frames": 6, "word_timestamps": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line]
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert events[-1]["type"] == "speech.audio.done" and any(e["type"] == "speech.word" for e in events)
    assert streamed == http.post("/v1/audio/speech", json={**BODY, "response_format": "flac"}).content
    pcm = np.frombuffer(http.post("/v1/audio/speech", json={**BODY, "response_format": "pcm"}).content, "<i2")
    assert streaminfo(streamed)["total_samples"] == len(pcm)
    np.testing.assert_array_equal(read_soundfile(streamed), pcm)
    np.testing.assert_array_equal(decode_flac(streamed), pcm)
    flac_test(streamed, tmp_path)


def test_a_flac_whose_synthesis_fails_part_way_is_an_error_status_not_a_cut_file(http, registry, monkeypatch):
    """Nothing of a FLAC is sent before it is whole, so an engine failure after the first audio is still a
    real status (a streamed format would be cut off instead)."""
    talker, calls = registry.default.model.talker, []
    real = talker.decode

    def decode(items):  # the prefill, two frame steps, then a failure (audio was made by then)
        calls.append(len(items))
        if len(calls) > 3:
            raise TalkerError("injected: llama_decode failed with code 1")
        return real(items)

    monkeypatch.setattr(talker, "decode", decode)
    with pytest.raises(httpx.RemoteProtocolError):  # pcm: 200 at the first audio, then cut off
        http.post("/v1/audio/speech", json={**BODY, "max_frames": 12, "response_format": "pcm"})
    calls.clear()
    response = http.post("/v1/audio/speech", json={**BODY, "max_frames": 12, "response_format": "flac"})
    assert response.status_code == 500 and response.json()["error"]["code"] == "synthesis_failed"
    calls.clear()
    response = http.post("/v1/audio/speech", json={**BODY, "max_frames": 12, "response_format": "flac",
                                                   "stream_format": "sse"})
    monkeypatch.undo()
    assert response.status_code == 500 and response.json()["error"]["code"] == "synthesis_failed"  # SSE too
    assert http.post("/v1/audio/speech", json={**BODY, "response_format": "flac"}).status_code == 200
