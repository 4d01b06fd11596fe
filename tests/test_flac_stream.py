"""A streamed FLAC says total_samples = 0 in its STREAMINFO (unknown when the header goes out);
PyAV still decodes every sample of it (see api/README.md, "Reading a streamed FLAC")."""

from __future__ import annotations

import io

import av
import numpy as np

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from qwen3_tts_gguf.audio.encoding import StreamingEncoder, to_s16
from qwen3_tts_gguf.model.loaded import EngineSettings

from tests.server_fixtures import server_fixtures


def streaminfo(data: bytes) -> dict:
    """Rate, channels, bits and total_samples of a FLAC stream's first metadata block (STREAMINFO)."""
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # block type 0: STREAMINFO, 34 bytes from offset 8
    word = int.from_bytes(data[18:26], "big")  # 20 bits rate, 3 channels-1, 5 bits-1, 36 total samples
    return {"rate": word >> 44, "channels": (word >> 41 & 7) + 1, "bits": (word >> 36 & 31) + 1,
            "total_samples": word & (1 << 36) - 1}


def decode_flac(data: bytes) -> np.ndarray:
    """The README's reader: PyAV over the bytes, every frame."""
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)])


def test_streaming_encoder_flac_has_no_length_yet_decodes_every_sample():
    chunks = [0.5 * np.sin(np.arange(n) / (3.0 + i)).astype(np.float32) for i, n in enumerate((1920, 3840, 7680, 1001))]
    encoder = StreamingEncoder("flac", 24000)
    data = b"".join(encoder.encode(chunk) for chunk in chunks) + encoder.finish()
    assert streaminfo(data) == {"rate": 24000, "channels": 1, "bits": 16, "total_samples": 0}
    np.testing.assert_array_equal(decode_flac(data), to_s16(np.concatenate(chunks)))


registry, server = server_fixtures(settings=EngineSettings(threads=1, deterministic=True, max_streams=2,
                                                           max_pending=2), api_key=None)


def test_flac_streamed_over_http_decodes_to_the_pcm_samples(server):
    body = {"model": "tts-1", "input": "A streamed FLAC.", "voice": "ryan", "seed": 3, "max_frames": 6}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/audio/speech", json={**body, "response_format": "flac"}) as response:
            assert response.status_code == 200 and response.headers["content-type"] == "audio/flac"
            flac = b"".join(response.iter_bytes())
        pcm = http.post("/v1/audio/speech", json={**body, "response_format": "pcm"}).content
    assert streaminfo(flac)["total_samples"] == 0
    samples = decode_flac(flac)
    assert len(samples) == 6 * 1920
    np.testing.assert_array_equal(samples, np.frombuffer(pcm, "<i2"))
