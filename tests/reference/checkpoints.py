"""Random checkpoints in the real Hugging Face layout, built with the official `qwen-tts` classes.

Every tensor is re-randomised (norm weights, biases, codebooks, layer scales, Snake parameters),
so a converter that drops any of them fails parity. Output heads are scaled so greedy top-1/top-2
margins sit far above fp32 noise; the codec's last conv is calibrated so almost nothing clips.
Builds are deterministic for a given seed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.convert.model_shapes import checkpoint_configs, tokenizer_config

from .official import import_qwen_tts
from .qwen_vocab import write_vocab_files


def _randomise(module, gen, head_scale: float = 4.0) -> None:
    import torch

    with torch.no_grad():
        params = [
            (f"{mod_name}.{leaf}", leaf, p, isinstance(mod, torch.nn.ConvTranspose1d))
            for mod_name, mod in module.named_modules()
            for leaf, p in mod.named_parameters(recurse=False)
        ]
        for name, leaf, p, transposed in params:
            shape = tuple(p.shape)
            if "layer_scale" in name or leaf == "gamma" or name.endswith(".scale"):
                p.copy_(torch.rand(shape, generator=gen) * 0.15 + 0.05)
            elif leaf in ("alpha", "beta"):
                p.copy_(torch.randn(shape, generator=gen) * 0.1)
            elif leaf == "bias":
                p.copy_(torch.randn(shape, generator=gen) * 0.05)
            elif p.dim() == 1:  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn(shape, generator=gen))
            elif "embedding" in name or "embed" in leaf:
                p.copy_(torch.randn(shape, generator=gen))
            else:  # Linear [out, in], Conv [out, in/g, k], ConvTranspose [in, out, k]
                fan_in = shape[0] if transposed else int(np.prod(shape[1:]))
                p.copy_(torch.randn(shape, generator=gen) / np.sqrt(max(fan_in, 1)))
            if "codec_head" in name or "lm_head" in name:
                p.mul_(head_scale)
        for name, b in module.named_buffers():
            if name.endswith("cluster_usage"):
                b.copy_(torch.rand(tuple(b.shape), generator=gen) * 1.5 + 0.5)
            elif name.endswith("embedding_sum") or name.endswith("embed_sum"):
                b.copy_(torch.randn(tuple(b.shape), generator=gen))
            elif name.endswith("initialized"):
                b.fill_(1.0)


def _calibrate_codec_output(codec, gen) -> None:
    """Scale the decoder's final conv so the pre-clamp waveform has std ~0.25."""
    import torch

    decoder = codec.decoder
    codes = torch.randint(0, 2048, (1, 16, 12), generator=gen)
    final = decoder.decoder[-1]
    captured = {}
    hook = final.register_forward_hook(lambda m, i, o: captured.__setitem__("y", o))
    with torch.no_grad():
        decoder(codes)
        hook.remove()
        std = float(captured["y"].std())
        final.conv.weight.mul_(0.25 / std)
        final.conv.bias.mul_(0.25 / std)


def _write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False))


def build_official_checkpoint(
    out_dir: Path,
    *,
    shape: str = "tiny",
    model_type: str = "custom_voice",
    seed: int = 0,
    talker_dtype: str = "float32",
    vocab_cache: Path,
    transformers_version: str = "4.57.3",
) -> Path:
    """Write a random checkpoint for `shape`/`model_type` into out_dir (atomically).

    talker_dtype "bfloat16" saves `model.safetensors` in BF16 like the published repos (the
    codec stays F32). Returns out_dir.
    """
    import torch
    from safetensors.torch import save_file

    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    configs = checkpoint_configs(shape, model_type, transformers_version)
    for rel, obj in configs.items():
        _write_json(tmp / rel, obj)
    _write_json(tmp / "tokenizer_config.json", tokenizer_config())
    vocab, merges = write_vocab_files(Path(vocab_cache))
    shutil.copy(vocab, tmp / "vocab.json")
    shutil.copy(merges, tmp / "merges.txt")

    gen = torch.Generator().manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**configs["config.json"]))
    _randomise(model, gen)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if talker_dtype == "bfloat16":
        state = {k: v.to(torch.bfloat16) for k, v in state.items()}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    codec = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**configs["speech_tokenizer/config.json"]))
    _randomise(codec, gen, head_scale=1.0)
    _calibrate_codec_output(codec, gen)
    codec_state = {k: v.contiguous() for k, v in codec.state_dict().items()}
    save_file(codec_state, str(tmp / "speech_tokenizer" / "model.safetensors"), metadata={"format": "pt"})

    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
