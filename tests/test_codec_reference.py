"""The plain-numpy codec decoder (convert/numpy_reference.py) against the official decoder and the graph.

fp32 bar 1e-4 on the clamped wav: torch fp32 differs from its own fp64 run by ~4e-5 on this deep
decoder (docs/codec-streaming-notes.md); a wrong layer shows up as O(1e-2..1). Measured here:
numpy fp64 vs torch fp32 ~3e-5, vs torch .double() ~5e-6 (HF keeps RoPE and RMSNorm in fp32).
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.codec_graph import build_codec_decoder
from qwen3_tts_gguf.convert.numpy_reference import decode_codes
from qwen3_tts_gguf.convert.onnx_builder import save_model
from qwen3_tts_gguf.model.codec import CodecDecoder

from tests.reference.official import import_qwen_tts

FP32_TOL = 1e-4
T = 12  # > sliding window 8 of the tiny codec, so the window is exercised


def official_wav(ckpt_dir, codes: np.ndarray) -> np.ndarray:
    import torch

    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    model = Qwen3TTSTokenizerV2Model.from_pretrained(str(ckpt_dir / "speech_tokenizer"), dtype=torch.float32).eval()
    with torch.no_grad():
        return model.decoder(torch.from_numpy(np.ascontiguousarray(codes.T[None]))).numpy()[0, 0]


@pytest.fixture(scope="module", params=["tiny_cv", "tiny0b6_cv_bf16"])
def case(request, tmp_path_factory):
    ckpt_dir = request.getfixturevalue(request.param)
    ckpt = Checkpoint.open(ckpt_dir)
    codes = np.random.default_rng(77).integers(0, ckpt.config.codec.codebook_size, (T, 16))
    return dict(ckpt=ckpt, ckpt_dir=ckpt_dir, codes=codes,
                ref=decode_codes(ckpt.codec_weights, ckpt.config.codec, codes))


def test_matches_official_decoder(case):
    ref, cfg = case["ref"], case["ckpt"].config.codec
    assert ref.dtype == np.float64 and ref.shape == (T * cfg.samples_per_frame,)
    assert np.abs(ref).max() <= 1.0 and np.abs(ref).max() > 0.1  # clamped, and not silence
    assert np.abs(ref - official_wav(case["ckpt_dir"], case["codes"])).max() < FP32_TOL


def test_matches_onnx_graph(case, tmp_path):
    path = tmp_path / "codec.onnx"
    save_model(build_codec_decoder(case["ckpt"]), path)
    wav = CodecDecoder(path, threads=2).decode_all(case["codes"])
    assert np.abs(wav - case["ref"]).max() < FP32_TOL


def test_float32_close_and_padding_and_refusals(case):
    ckpt, codes = case["ckpt"], case["codes"]
    w, cfg = ckpt.codec_weights, ckpt.config.codec
    wav32 = decode_codes(w, cfg, codes, dtype=np.float32)
    assert wav32.dtype == np.float32 and np.abs(wav32 - case["ref"]).max() < FP32_TOL
    padded = codes[:3].copy()
    padded[1, 4] = -1  # padding decodes as code 0, like the official wrapper's clamp
    zeroed = np.maximum(padded, 0)
    assert np.array_equal(decode_codes(w, cfg, padded), decode_codes(w, cfg, zeroed))
    with pytest.raises(ValueError, match="must be <"):
        decode_codes(w, cfg, np.full((2, 16), cfg.codebook_size))
    with pytest.raises(ValueError, match="codes must be"):
        decode_codes(w, cfg, np.zeros((2, 15), np.int64))
