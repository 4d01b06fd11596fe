"""A model folder whose codec llama.cpp's `code2wav` runs in a second on a software GPU: the tiny talker
and a codec decoder with the hyperparameters libmtmd hard-codes (8 layers of width 512, 16 heads, a
72-frame window, 2 upsampling and 4 DAC blocks: `convert/llama_stages.CODEC_SHAPE`) but narrow channels
(codebook, latent and DAC widths of 32, where the published codec has 512, 1024 and 1536).

Why: at the published widths one `code2wav` window is about 300 GFLOP, minutes on lavapipe (docs/gpu.md);
the graph, its operations and its streaming state are the same at any width, since libmtmd reads the
channel counts from the tensors. numpy only (no torch, no pytest): `scripts/gpu-check.sh` builds it on a
machine that has neither.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

NARROW_CODEC = {"codebook_dim": 32, "vector_quantization_hidden_dimension": 32, "latent_dim": 32, "decoder_dim": 32}
"""The widths the published codec has wider (speech_tokenizer/config.json's decoder_config)."""
SEED = 17
ROOT = Path(__file__).resolve().parent.parent


def write_narrow_codec_checkpoint(out_dir: str | Path, seed: int = SEED) -> Path:
    """A random CustomVoice checkpoint (numpy's `make-random`, tiny shape) whose codec decoder has the
    published hyperparameters at NARROW_CODEC widths. Deterministic: the same seed writes the same bytes."""
    from qwen3_tts_gguf.convert.checkpoint import expected_codec_decoder_shapes, parse_config
    from qwen3_tts_gguf.convert.model_shapes import PUBLISHED_CODEC
    from qwen3_tts_gguf.convert.random_checkpoint import _calibrate_codec, _random_tensor, make_random_checkpoint
    from qwen3_tts_gguf.model.safetensors_io import write_safetensors

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    make_random_checkpoint(tmp, "tiny", "custom_voice", seed=seed)
    codec_json = tmp / "speech_tokenizer" / "config.json"
    configs = json.loads(codec_json.read_text())
    configs["decoder_config"].update({**PUBLISHED_CODEC, **NARROW_CODEC})
    codec_json.write_text(json.dumps(configs, indent=2))
    cfg = parse_config(json.loads((tmp / "config.json").read_text()), configs)
    rng = np.random.default_rng(seed + 1)
    codec = {name: _random_tensor(name, shape, rng) for name, shape in expected_codec_decoder_shapes(cfg.codec).items()}
    _calibrate_codec(codec, cfg.codec, rng)
    write_safetensors(tmp / "speech_tokenizer" / "model.safetensors", codec)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def convert_narrow_codec_model(checkpoint: str | Path, out_dir: str | Path, quant: str = "f32",
                               preset: str = "exact") -> Path:
    """`checkpoint` converted with its llama stages file at `preset`'s formats (the talker at `quant`,
    the code predictor at fp32); no self-check (the parity tests check the converter)."""
    from qwen3_tts_gguf.convert.pipeline import convert_checkpoint
    from qwen3_tts_gguf.convert.presets import PRESETS

    convert_checkpoint(checkpoint, out_dir, quant, cp_precision="fp32", llama_stages=PRESETS[preset].llama_stages,
                       overwrite=True, verify=False, show_progress=False)
    return Path(out_dir)


def source_digest() -> str:
    """What the narrow-codec model is made from: the converter (with `make-random`) and this file."""
    h = hashlib.sha256()
    for path in [*sorted((ROOT / "qwen3_tts_gguf" / "convert").glob("*.py")), Path(__file__)]:
        h.update(path.read_bytes())
    return h.hexdigest()[:10]


def narrow_codec_checkpoint(cache: Path) -> Path:
    """The narrow-codec checkpoint, made once under `cache` (tests: conftest.CACHE)."""
    out = Path(cache) / f"tiny_narrowcodec_cv-{source_digest()}"
    if not (out / "speech_tokenizer" / "model.safetensors").exists():
        write_narrow_codec_checkpoint(out)
    return out


def narrow_codec_model(cache: Path) -> Path:
    """The narrow-codec model folder (talker f32, code predictor fp32, llama stages at the exact preset), made
    once under `cache`."""
    out = Path(cache) / "converted" / f"tiny_narrowcodec_cv-f32-{source_digest()}"
    if not (out / "manifest.json").exists():
        convert_narrow_codec_model(narrow_codec_checkpoint(cache), out)
    return out
