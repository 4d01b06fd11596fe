"""`make-random`: a random-weight checkpoint in the real Hugging Face layout, with numpy alone.

It speaks noise, but it lets anyone try the whole path offline (convert, synth, serve) and gives
the benchmarks real-shape models. The talker is saved in BF16 and the codec in F32, like the
published repos. A Base checkpoint also gets the voice-cloning encoders (the speaker encoder in
`model.safetensors`, the speech tokenizer's `encoder.*` in the codec file). Without `tokenizer_dir`
a byte-level vocabulary is written (every byte one token, filler entries up to the special ids),
so any text tokenizes.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.convert.checkpoint import expected_codec_decoder_shapes, expected_talker_shapes, parse_config
from qwen3_tts_gguf.convert.model_shapes import FIRST_ADDED_ID, checkpoint_configs, tokenizer_config
from qwen3_tts_gguf.model.safetensors_io import write_safetensors
from qwen3_tts_gguf.model.tokenizer import TOKENIZER_FILES, bytes_to_unicode

# the role words of the prompt templates must be single tokens at their Qwen ids, as in the real vocab
_ROLE_WORDS = {"assistant": 77091, "user": 872}


def _write_byte_vocab(out: Path) -> None:
    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    merges, next_free = [], len(vocab)
    for word, word_id in _ROLE_WORDS.items():
        for end in range(2, len(word) + 1):
            piece = word[:end]
            merges.append(f"{word[:end - 1]} {word[end - 1]}")
            if end == len(word):
                vocab[piece] = word_id
            elif piece not in vocab:
                vocab[piece] = next_free
                next_free += 1
    used = set(vocab.values())
    for i in range(FIRST_ADDED_ID):
        if i not in used:
            vocab[f"<|filler_{i}|>"] = i
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2))


def _random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    leaf = name.rsplit(".", 1)[-1]
    if "layer_scale" in name or leaf in ("gamma", "scale"):
        return rng.uniform(0.05, 0.2, shape).astype(np.float32)
    if leaf in ("alpha", "beta"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if leaf == "cluster_usage":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if leaf == "initialized":  # the encoder codebooks' flag: trained, not to be re-initialised
        return np.ones(shape, np.float32)
    if leaf == "embed_sum":  # the encoder codebooks (embed = embed_sum / cluster_usage)
        return rng.standard_normal(shape, dtype=np.float32)
    if leaf == "bias":
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)
    if len(shape) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if "embedding" in name:
        return rng.standard_normal(shape, dtype=np.float32)
    # the codec decoder's ConvTranspose weights (the encoder's `.block.1.conv` is a plain Conv1d)
    transposed = name.startswith("decoder.") and (".block.1.conv" in name or
                                                  (name.startswith("decoder.upsample") and ".0.conv." in name))
    fan_in = shape[0] if transposed else int(np.prod(shape[1:]))  # ConvTranspose is [in, out, k]
    scale = 4.0 if ("codec_head" in name or "lm_head" in name) else 1.0
    return (rng.standard_normal(shape, dtype=np.float32) * (scale / np.sqrt(fan_in))).astype(np.float32)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 words (round to nearest even)."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def make_random_checkpoint(out_dir: str | Path, shape: str = "tiny", model_type: str = "custom_voice", *,
                           seed: int = 0, tokenizer_dir: str | Path | None = None,
                           progress: Callable[[str], None] | None = None) -> Path:
    """Write a random checkpoint to out_dir (atomically: a temp folder renamed at the end)."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists")
    tmp = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "speech_tokenizer").mkdir(parents=True)
    try:
        configs = checkpoint_configs(shape, model_type)
        for rel, obj in configs.items():
            (tmp / rel).write_text(json.dumps(obj, indent=2))
        if tokenizer_dir:
            for f in TOKENIZER_FILES:
                shutil.copy(Path(tokenizer_dir) / f, tmp / f)
        else:
            _write_byte_vocab(tmp)
        cfg = parse_config(configs["config.json"], configs["speech_tokenizer/config.json"])
        rng = np.random.default_rng(seed)
        talker = {}
        for name, shp in expected_talker_shapes(cfg).items():
            if progress:
                progress(name)
            talker[name] = ("BF16", _to_bf16(_random_tensor(name, shp, rng)))
        if model_type == "base":
            talker.update(_speaker_encoder_tensors(cfg.speaker_encoder, rng))
        write_safetensors(tmp / "model.safetensors", talker)
        del talker
        codec = {name: _random_tensor(name, shp, rng)
                 for name, shp in expected_codec_decoder_shapes(cfg.codec).items()}
        _calibrate_codec(codec, cfg.codec, rng)
        if model_type == "base":  # the codec encoder (wav -> codes) of in-context voice clones
            codec.update({name: _random_tensor(name, shp, rng) for name, shp in
                          codec_encoder_shapes(configs["speech_tokenizer/config.json"]).items()})
        write_safetensors(tmp / "speech_tokenizer" / "model.safetensors", codec)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _calibrate_codec(codec: dict, cfg, rng: np.random.Generator) -> None:
    """Scale the last conv so the waveform has std ~0.25 (random weights otherwise clip hard)."""
    from qwen3_tts_gguf.convert.numpy_reference import decode_codes

    last = len(cfg.upsample_rates) + 2
    weight, bias = f"decoder.decoder.{last}.conv.weight", f"decoder.decoder.{last}.conv.bias"
    codec[bias] = np.zeros_like(codec[bias])
    probe = dict(codec)
    probe[weight] = codec[weight] * 1e-3  # stay far from the clamp while measuring
    std = float(np.std(decode_codes(probe, cfg, rng.integers(0, cfg.codebook_size, (3, 16)), dtype=np.float32)))
    codec[weight] = (probe[weight] * (0.25 / max(std, 1e-12))).astype(np.float32)


def _speaker_encoder_tensors(sc: dict, rng: np.random.Generator) -> dict:
    """ECAPA-TDNN speaker encoder weights (Base models), BF16."""
    tensors = {}
    for name, shp in speaker_encoder_shapes(sc).items():
        tensors[f"{name}.weight"] = ("BF16", _to_bf16(_random_tensor(f"{name}.weight", shp, rng)))
        tensors[f"{name}.bias"] = ("BF16", _to_bf16(_random_tensor(f"{name}.bias", (shp[0],), rng)))
    return tensors


def speaker_encoder_shapes(sc: dict) -> dict[str, tuple[int, int, int]]:
    """The speaker encoder's convolutions (names without `.weight`; each has a bias of its first size)
    -> (out, in, kernel), from config.json's speaker_encoder_config."""
    ch, ks, att, se = sc["enc_channels"], sc["enc_kernel_sizes"], sc["enc_attention_channels"], sc["enc_se_channels"]
    scale, mel, out = sc.get("enc_res2net_scale", 8), sc["mel_dim"], sc["enc_dim"]
    shapes = {"speaker_encoder.blocks.0.conv": (ch[0], mel, ks[0])}
    for b in (1, 2, 3):
        p = f"speaker_encoder.blocks.{b}"
        shapes[f"{p}.tdnn1.conv"] = (ch[b], ch[b - 1], 1)
        for r in range(scale - 1):
            shapes[f"{p}.res2net_block.blocks.{r}.conv"] = (ch[b] // scale, ch[b] // scale, ks[b])
        shapes[f"{p}.tdnn2.conv"] = (ch[b], ch[b], 1)
        shapes[f"{p}.se_block.conv1"] = (se, ch[b], 1)
        shapes[f"{p}.se_block.conv2"] = (ch[b], se, 1)
    shapes["speaker_encoder.mfa.conv"] = (ch[4], ch[1] + ch[2] + ch[3], ks[4])
    shapes["speaker_encoder.asp.tdnn.conv"] = (att, ch[4] * 3, 1)
    shapes["speaker_encoder.asp.conv"] = (ch[4], att, 1)
    shapes["speaker_encoder.fc"] = (out, ch[4] * 2, 1)
    return shapes


def codec_encoder_shapes(codec_config: dict) -> dict[str, tuple[int, ...]]:
    """Every `encoder.*` tensor of the speech tokenizer (transformers' Mimi encoder, as qwen-tts
    saves it), from speech_tokenizer/config.json's encoder_config with the defaults the converter
    assumes (`codec_encoder_graph.DEFAULTS`)."""
    from qwen3_tts_gguf.convert.codec_encoder_graph import DEFAULTS

    c = {**DEFAULTS, **codec_config["encoder_config"]}
    s: dict[str, tuple[int, ...]] = {}

    def conv(name: str, c_out: int, c_in: int, k: int, bias: bool = True) -> None:
        s[f"{name}.conv.weight"] = (c_out, c_in, k)
        if bias:
            s[f"{name}.conv.bias"] = (c_out,)

    # SEANet: conv, then per ratio (residual blocks, ELU, strided conv), ELU, conv
    nf, idx = int(c["num_filters"]), 0
    conv(f"encoder.encoder.layers.{idx}", nf, int(c["audio_channels"]), int(c["kernel_size"]))
    idx += 1
    width = nf
    for ratio in reversed(c["upsampling_ratios"]):
        for _ in range(int(c["num_residual_layers"])):
            p = f"encoder.encoder.layers.{idx}"
            conv(f"{p}.block.1", width // int(c["compress"]), width, int(c["residual_kernel_size"]))
            conv(f"{p}.block.3", width, width // int(c["compress"]), 1)
            if c["use_conv_shortcut"]:
                conv(f"{p}.shortcut", width, width, 1)
            idx += 1
        idx += 1  # ELU
        conv(f"encoder.encoder.layers.{idx}", 2 * width, width, 2 * int(ratio))
        width *= 2
        idx += 1
    idx += 1  # ELU
    hs = int(c["hidden_size"])
    conv(f"encoder.encoder.layers.{idx}", hs, width, int(c["last_kernel_size"]))

    heads, kv = int(c["num_attention_heads"]), int(c["num_key_value_heads"])
    hd = int(c["head_dim"] or hs // heads)
    for i in range(int(c["num_hidden_layers"])):
        p = f"encoder.encoder_transformer.layers.{i}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            s[f"{p}.{norm}.weight"] = s[f"{p}.{norm}.bias"] = (hs,)
        s[f"{p}.self_attn.q_proj.weight"] = (heads * hd, hs)
        s[f"{p}.self_attn.k_proj.weight"] = s[f"{p}.self_attn.v_proj.weight"] = (kv * hd, hs)
        s[f"{p}.self_attn.o_proj.weight"] = (hs, heads * hd)
        s[f"{p}.mlp.fc1.weight"] = (int(c["intermediate_size"]), hs)
        s[f"{p}.mlp.fc2.weight"] = (hs, int(c["intermediate_size"]))
        s[f"{p}.self_attn_layer_scale.scale"] = s[f"{p}.mlp_layer_scale.scale"] = (hs,)

    frames_per_second = math.ceil(int(c["sampling_rate"]) / math.prod(int(r) for r in c["upsampling_ratios"]))
    conv("encoder.downsample", hs, hs, 2 * int(frames_per_second / float(c["frame_rate"])), bias=False)

    vq, semantic = int(c["vector_quantization_hidden_dimension"]), int(c["num_semantic_quantizers"])
    for part, n in (("semantic", semantic), ("acoustic", int(c["num_quantizers"]) - semantic)):
        p = f"encoder.quantizer.{part}_residual_vector_quantizer"
        if vq != hs:  # Mimi projects only when the widths differ
            s[f"{p}.input_proj.weight"], s[f"{p}.output_proj.weight"] = (vq, hs, 1), (hs, vq, 1)
        for k in range(n):
            q = f"{p}.layers.{k}.codebook"
            s[f"{q}.initialized"] = (1,)
            s[f"{q}.cluster_usage"] = (int(c["codebook_size"]),)
            s[f"{q}.embed_sum"] = (int(c["codebook_size"]), int(c["codebook_dim"]))
    return s
