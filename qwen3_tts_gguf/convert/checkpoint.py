"""An official Qwen3-TTS 12 Hz checkpoint folder: its configs as types, its tensors, its checks.

`Checkpoint.open(dir)` refuses clearly what the converter cannot take: missing files, a 25 Hz or
unknown model type, a config dimension that is absurd (checked before anything is allocated), a
tensor whose shape does not match its config.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from qwen3_tts_gguf.model.safetensors_io import SafetensorsError, SafetensorsFile

REQUIRED_FILES = (
    "config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
    "tokenizer_config.json", "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
)
MODEL_TYPES = ("custom_voice", "voice_design", "base")

# Ceilings on config dimensions: 16x the largest published value (the 1.7B model's, in brackets), far
# beyond any real Qwen3-TTS model, so a corrupt or hostile config.json is refused before the converter
# loops over its layers or allocates anything from it.
MAX_WIDTH = 16 * 6144  # hidden / intermediate / embedding / codec channel widths [intermediate 6144]
MAX_LAYERS = 16 * 28  # decoder layers [talker 28]
MAX_HEADS = 16 * 16  # attention heads, query or key/value [16]
MAX_HEAD_DIM = 16 * 128  # [128]
MAX_CODEC_VOCAB = 16 * 3072  # talker codec vocabulary, codebook size [3072, 2048]
MAX_TEXT_VOCAB = 16 * 151936  # text vocabulary [151936]
MAX_WINDOW = 16 * 72  # codec attention sliding window [72]
MAX_UPSAMPLE = 16 * 8  # one codec upsampling factor [8]
MAX_UPSAMPLE_STAGES = 16 * 4  # codec upsampling stages [4]
MAX_SAMPLES_PER_FRAME = 16 * 1920  # codec output samples per frame, decode_upsample_rate [1920]
MAX_SAMPLE_RATE = 16 * 24000  # [24000]


class CheckpointError(ValueError):
    """A checkpoint folder the converter refuses, with the reason."""


def _dim(d: dict, key: str, where: str, ceiling: int, default: int | None = None) -> int:
    """`d[key]` (or `default` when absent) as a size in 1..ceiling; else a CheckpointError naming the field."""
    value = d.get(key)
    if value is None and default is None:
        raise CheckpointError(f"{where}.{key} is missing")
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
        raise CheckpointError(f"{where}.{key} = {value!r} is not a plausible size (an integer in 1..{ceiling})")
    return value


def _head_dim(d: dict, where: str, hidden: int, heads: int) -> int:
    """`head_dim`, or hidden // heads where the config leaves it out (then heads must divide hidden)."""
    if d.get("head_dim") is None and hidden % heads:
        raise CheckpointError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                              "and no head_dim is given")
    hd = _dim(d, "head_dim", where, MAX_HEAD_DIM, hidden // heads)
    if hd % 2:
        raise CheckpointError(f"{where}.head_dim = {hd} is odd (RoPE rotates pairs)")
    return hd


@dataclass(frozen=True)
class TransformerConfig:
    """A Qwen3 decoder stack (talker or code predictor)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "TransformerConfig":
        """Read and bound-check one decoder stack's config (`where`: its path in config.json)."""
        hidden, heads = _dim(d, "hidden_size", where, MAX_WIDTH), _dim(d, "num_attention_heads", where, MAX_HEADS)
        kv_heads = _dim(d, "num_key_value_heads", where, MAX_HEADS)
        if heads % kv_heads:
            raise CheckpointError(f"{where}: num_attention_heads {heads} is not a multiple of "
                                  f"num_key_value_heads {kv_heads}")
        return cls(
            hidden_size=hidden, num_layers=_dim(d, "num_hidden_layers", where, MAX_LAYERS),
            num_heads=heads, num_kv_heads=kv_heads, head_dim=_head_dim(d, where, hidden, heads),
            intermediate_size=_dim(d, "intermediate_size", where, MAX_WIDTH), rms_norm_eps=float(d["rms_norm_eps"]),
            rope_theta=float(d["rope_theta"]),
        )


@dataclass(frozen=True)
class TalkerConfig(TransformerConfig):
    vocab_size: int = 3072
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    num_code_groups: int = 16
    codec_ids: dict = field(default_factory=dict)  # pad, bos, eos, think, nothink, think_bos, think_eos
    language_ids: dict = field(default_factory=dict)
    speaker_ids: dict = field(default_factory=dict)
    speaker_dialects: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CodecDecoderConfig:
    """The 12 Hz speech tokenizer's decoder (code2wav)."""

    codebook_size: int
    codebook_dim: int
    latent_dim: int
    decoder_dim: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int
    num_quantizers: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    samples_per_frame: int
    sample_rate: int

    @classmethod
    def from_dict(cls, codec: dict) -> "CodecDecoderConfig":
        """Read and bound-check speech_tokenizer/config.json's decoder (defaults: the published values)."""
        d, where = codec["decoder_config"], "decoder_config"
        hidden = _dim(d, "hidden_size", where, MAX_WIDTH, 512)
        heads = _dim(d, "num_attention_heads", where, MAX_HEADS, 16)
        if _dim(d, "num_key_value_heads", where, MAX_HEADS, heads) != heads:
            raise CheckpointError(f"{where}: num_key_value_heads must equal num_attention_heads {heads} "
                                  "(the codec graph has no grouped-query attention)")
        rates, ratios = _factors(d, "upsample_rates", (8, 5, 4, 3)), _factors(d, "upsampling_ratios", (2, 2))
        decoder_dim = _dim(d, "decoder_dim", where, MAX_WIDTH, 1536)
        if decoder_dim >> len(rates) < 1:
            raise CheckpointError(f"{where}: decoder_dim {decoder_dim} cannot be halved {len(rates)} times")
        samples_per_frame = _dim(codec, "decode_upsample_rate", "speech_tokenizer", MAX_SAMPLES_PER_FRAME, 1920)
        if math.prod(rates) * math.prod(ratios) != samples_per_frame:
            raise CheckpointError(f"speech_tokenizer: decode_upsample_rate {samples_per_frame} is not the product "
                                  f"of {where}.upsample_rates {list(rates)} and upsampling_ratios {list(ratios)}")
        return cls(
            codebook_size=_dim(d, "codebook_size", where, MAX_CODEC_VOCAB, 2048),
            codebook_dim=_dim(d, "codebook_dim", where, MAX_WIDTH, 512),
            latent_dim=_dim(d, "latent_dim", where, MAX_WIDTH, 1024), decoder_dim=decoder_dim,
            hidden_size=hidden, intermediate_size=_dim(d, "intermediate_size", where, MAX_WIDTH, 1024),
            num_layers=_dim(d, "num_hidden_layers", where, MAX_LAYERS, 8), num_heads=heads,
            head_dim=_head_dim(d, where, hidden, heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)), rope_theta=float(d.get("rope_theta", 10000)),
            sliding_window=_dim(d, "sliding_window", where, MAX_WINDOW, 72),
            num_quantizers=int(d.get("num_quantizers", 16)), upsample_rates=rates, upsampling_ratios=ratios,
            samples_per_frame=samples_per_frame,
            sample_rate=_dim(codec, "output_sample_rate", "speech_tokenizer", MAX_SAMPLE_RATE, 24000),
        )


def _factors(d: dict, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A list of codec upsampling factors, each in 1..MAX_UPSAMPLE, at most MAX_UPSAMPLE_STAGES of them."""
    value = d.get(key, default)
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= MAX_UPSAMPLE_STAGES:
        raise CheckpointError(f"decoder_config.{key} = {value!r} is not a list of 1..{MAX_UPSAMPLE_STAGES} factors")
    return tuple(_dim({key: v}, key, "decoder_config", MAX_UPSAMPLE) for v in value)


@dataclass(frozen=True)
class ModelConfig:
    """Everything the converter and the engine need from `config.json`."""

    model_type: str  # custom_voice | voice_design | base
    model_size: str  # "0b6" | "1b7" as published
    talker: TalkerConfig
    code_predictor: TransformerConfig
    codec: CodecDecoderConfig
    special_text_ids: dict  # im_start, im_end, assistant, newline, tts_pad, tts_bos, tts_eos
    speaker_encoder: dict | None
    raw: dict

    @property
    def has_mtp_projection(self) -> bool:
        return self.code_predictor.hidden_size != self.talker.hidden_size


def parse_config(config: dict, codec_config: dict) -> ModelConfig:
    """Typed view of config.json + speech_tokenizer/config.json; raises CheckpointError."""
    if config.get("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
        raise CheckpointError(
            f"tokenizer_type {config.get('tokenizer_type')!r} is not supported: only the 12 Hz models "
            "(qwen3_tts_tokenizer_12hz) can be converted; the 25 Hz family is not."
        )
    if codec_config.get("model_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
        raise CheckpointError(f"speech_tokenizer model_type {codec_config.get('model_type')!r} is not the 12 Hz codec")
    model_type = config.get("tts_model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"unknown tts_model_type {model_type!r}; expected one of {', '.join(MODEL_TYPES)}")
    try:
        t = config["talker_config"]
        cp = t["code_predictor_config"]
        where = "talker_config"
        talker = TalkerConfig(
            **vars(TransformerConfig.from_dict(t, where)),
            vocab_size=_dim(t, "vocab_size", where, MAX_CODEC_VOCAB),
            text_vocab_size=_dim(t, "text_vocab_size", where, MAX_TEXT_VOCAB, 151936),
            text_hidden_size=_dim(t, "text_hidden_size", where, MAX_WIDTH),
            num_code_groups=int(t.get("num_code_groups", 16)),
            codec_ids={k: int(t[f"codec_{k}_id" if k != "eos" else "codec_eos_token_id"])
                       for k in ("pad", "bos", "eos", "think", "nothink", "think_bos", "think_eos")},
            language_ids={k.lower(): int(v) for k, v in (t.get("codec_language_id") or {}).items()},
            speaker_ids={k.lower(): int(v[0] if isinstance(v, list) else v)
                         for k, v in (t.get("spk_id") or {}).items()},
            speaker_dialects={k.lower(): v for k, v in (t.get("spk_is_dialect") or {}).items()},
        )
        code_predictor = TransformerConfig.from_dict(cp, f"{where}.code_predictor_config")
        codec = CodecDecoderConfig.from_dict(codec_config)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is missing or has a malformed field: {e}") from e
    if talker.num_code_groups != 16 or codec.num_quantizers != talker.num_code_groups:
        raise CheckpointError(f"expected 16 code groups, got talker {talker.num_code_groups} / codec "
                              f"{codec.num_quantizers}")
    special = {
        "im_start": int(config.get("im_start_token_id", 151644)), "im_end": int(config.get("im_end_token_id", 151645)),
        "assistant": int(config.get("assistant_token_id", 77091)), "newline": 198,
        "tts_pad": int(config.get("tts_pad_token_id", 151671)), "tts_bos": int(config.get("tts_bos_token_id", 151672)),
        "tts_eos": int(config.get("tts_eos_token_id", 151673)),
    }
    codec_ids = {**talker.codec_ids, **talker.language_ids, **talker.speaker_ids}
    for kind, ids, size in (("codec", codec_ids, talker.vocab_size), ("text", special, talker.text_vocab_size)):
        if bad := {k: v for k, v in ids.items() if not 0 <= v < size}:  # rows the prompt would look up
            raise CheckpointError(f"{kind} token ids {bad} lie outside the {kind} vocabulary of {size}")
    return ModelConfig(
        model_type=model_type, model_size=str(config.get("tts_model_size", "")), talker=talker,
        code_predictor=code_predictor, codec=codec, special_text_ids=special,
        speaker_encoder=config.get("speaker_encoder_config") if model_type == "base" else None, raw=config,
    )


def expected_talker_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes every talker/code-predictor tensor must have, from the config alone."""
    t, c = cfg.talker, cfg.code_predictor
    shapes: dict[str, tuple[int, ...]] = {
        "talker.model.text_embedding.weight": (t.text_vocab_size, t.text_hidden_size),
        "talker.model.codec_embedding.weight": (t.vocab_size, t.hidden_size),
        "talker.model.norm.weight": (t.hidden_size,),
        "talker.codec_head.weight": (t.vocab_size, t.hidden_size),
        "talker.text_projection.linear_fc1.weight": (t.text_hidden_size, t.text_hidden_size),
        "talker.text_projection.linear_fc1.bias": (t.text_hidden_size,),
        "talker.text_projection.linear_fc2.weight": (t.hidden_size, t.text_hidden_size),
        "talker.text_projection.linear_fc2.bias": (t.hidden_size,),
        "talker.code_predictor.model.norm.weight": (c.hidden_size,),
    }

    def layer(prefix: str, s: TransformerConfig) -> None:
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        shapes.update({
            f"{prefix}.input_layernorm.weight": (s.hidden_size,),
            f"{prefix}.post_attention_layernorm.weight": (s.hidden_size,),
            f"{prefix}.self_attn.q_proj.weight": (q, s.hidden_size),
            f"{prefix}.self_attn.k_proj.weight": (kv, s.hidden_size),
            f"{prefix}.self_attn.v_proj.weight": (kv, s.hidden_size),
            f"{prefix}.self_attn.o_proj.weight": (s.hidden_size, q),
            f"{prefix}.self_attn.q_norm.weight": (s.head_dim,),
            f"{prefix}.self_attn.k_norm.weight": (s.head_dim,),
            f"{prefix}.mlp.gate_proj.weight": (s.intermediate_size, s.hidden_size),
            f"{prefix}.mlp.up_proj.weight": (s.intermediate_size, s.hidden_size),
            f"{prefix}.mlp.down_proj.weight": (s.hidden_size, s.intermediate_size),
        })

    for i in range(t.num_layers):
        layer(f"talker.model.layers.{i}", t)
    for i in range(c.num_layers):
        layer(f"talker.code_predictor.model.layers.{i}", c)
    for i in range(t.num_code_groups - 1):
        shapes[f"talker.code_predictor.model.codec_embedding.{i}.weight"] = (2048, t.hidden_size)
        shapes[f"talker.code_predictor.lm_head.{i}.weight"] = (2048, c.hidden_size)
    if cfg.has_mtp_projection:
        shapes["talker.code_predictor.small_to_mtp_projection.weight"] = (c.hidden_size, t.hidden_size)
        shapes["talker.code_predictor.small_to_mtp_projection.bias"] = (c.hidden_size,)
    return shapes


@dataclass
class Checkpoint:
    """An opened checkpoint folder: typed config plus lazily read tensors."""

    path: Path
    config: ModelConfig
    generation_config: dict
    weights: SafetensorsFile
    codec_weights: SafetensorsFile

    @classmethod
    def open(cls, path: str | Path) -> "Checkpoint":
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path} is not a folder")
        missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
        if missing:
            raise CheckpointError(f"{path} is not a complete Qwen3-TTS 12 Hz checkpoint: missing {', '.join(missing)}")
        try:
            config = json.loads((path / "config.json").read_text())
            codec_config = json.loads((path / "speech_tokenizer/config.json").read_text())
            generation_config = json.loads((path / "generation_config.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: a config file is not valid JSON ({e})") from e
        parsed = parse_config(config, codec_config)
        try:
            weights = SafetensorsFile(path / "model.safetensors")
            codec_weights = SafetensorsFile(path / "speech_tokenizer/model.safetensors")
        except SafetensorsError as e:
            raise CheckpointError(str(e)) from e
        ckpt = cls(path, parsed, generation_config, weights, codec_weights)
        ckpt.validate_shapes()
        return ckpt

    def validate_shapes(self) -> None:
        """Every tensor the runtime uses exists with the shape its config implies."""
        for name, shape in expected_talker_shapes(self.config).items():
            if name not in self.weights:
                raise CheckpointError(f"model.safetensors has no tensor {name}")
            if self.weights.shape_of(name) != shape:
                raise CheckpointError(
                    f"tensor {name} has shape {list(self.weights.shape_of(name))} but config.json implies {list(shape)}"
                )
        for name, shape in expected_codec_decoder_shapes(self.config.codec).items():
            if name not in self.codec_weights:
                raise CheckpointError(f"speech_tokenizer/model.safetensors has no tensor {name}")
            if self.codec_weights.shape_of(name) != shape:
                raise CheckpointError(
                    f"tensor {name} has shape {list(self.codec_weights.shape_of(name))} but "
                    f"speech_tokenizer/config.json implies {list(shape)}"
                )


def expected_codec_decoder_shapes(c: CodecDecoderConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of every `decoder.*` tensor of the speech tokenizer, from its config alone."""
    half, cd, lat, hs = c.codebook_dim // 2, c.codebook_dim, c.latent_dim, c.hidden_size
    attn = c.num_heads * c.head_dim
    s: dict[str, tuple[int, ...]] = {}
    for part, n in (("rvq_first", 1), ("rvq_rest", c.num_quantizers - 1)):
        s[f"decoder.quantizer.{part}.input_proj.weight"] = (half, cd, 1)
        s[f"decoder.quantizer.{part}.output_proj.weight"] = (cd, half, 1)
        for k in range(n):
            s[f"decoder.quantizer.{part}.vq.layers.{k}._codebook.cluster_usage"] = (c.codebook_size,)
            s[f"decoder.quantizer.{part}.vq.layers.{k}._codebook.embedding_sum"] = (c.codebook_size, half)
    s["decoder.pre_conv.conv.weight"] = (lat, cd, 3)
    s["decoder.pre_conv.conv.bias"] = (lat,)
    p = "decoder.pre_transformer"
    s[f"{p}.input_proj.weight"], s[f"{p}.input_proj.bias"] = (hs, lat), (hs,)
    s[f"{p}.output_proj.weight"], s[f"{p}.output_proj.bias"] = (lat, hs), (lat,)
    s[f"{p}.norm.weight"] = (hs,)
    for i in range(c.num_layers):
        q = f"{p}.layers.{i}"
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight",
                     "self_attn_layer_scale.scale", "mlp_layer_scale.scale"):
            s[f"{q}.{name}"] = (hs,)
        for name in ("q_proj", "k_proj", "v_proj"):
            s[f"{q}.self_attn.{name}.weight"] = (attn, hs)
        s[f"{q}.self_attn.o_proj.weight"] = (hs, attn)
        s[f"{q}.mlp.gate_proj.weight"] = s[f"{q}.mlp.up_proj.weight"] = (c.intermediate_size, hs)
        s[f"{q}.mlp.down_proj.weight"] = (hs, c.intermediate_size)
    for u, factor in enumerate(c.upsampling_ratios):
        q = f"decoder.upsample.{u}"
        s[f"{q}.0.conv.weight"], s[f"{q}.0.conv.bias"] = (lat, lat, factor), (lat,)
        s[f"{q}.1.dwconv.conv.weight"], s[f"{q}.1.dwconv.conv.bias"] = (lat, 1, 7), (lat,)
        for name in ("gamma", "norm.weight", "norm.bias", "pwconv2.bias"):
            s[f"{q}.1.{name}"] = (lat,)
        s[f"{q}.1.pwconv1.weight"], s[f"{q}.1.pwconv1.bias"] = (4 * lat, lat), (4 * lat,)
        s[f"{q}.1.pwconv2.weight"] = (lat, 4 * lat)
    s["decoder.decoder.0.conv.weight"], s["decoder.decoder.0.conv.bias"] = (c.decoder_dim, lat, 7), (c.decoder_dim,)
    ch = c.decoder_dim
    for b, rate in enumerate(c.upsample_rates, start=1):
        q, out = f"decoder.decoder.{b}.block", ch // 2
        s[f"{q}.0.alpha"] = s[f"{q}.0.beta"] = (ch,)
        s[f"{q}.1.conv.weight"], s[f"{q}.1.conv.bias"] = (ch, out, 2 * rate), (out,)
        for r in (2, 3, 4):
            for act in ("act1", "act2"):
                s[f"{q}.{r}.{act}.alpha"] = s[f"{q}.{r}.{act}.beta"] = (out,)
            s[f"{q}.{r}.conv1.conv.weight"], s[f"{q}.{r}.conv1.conv.bias"] = (out, out, 7), (out,)
            s[f"{q}.{r}.conv2.conv.weight"], s[f"{q}.{r}.conv2.conv.bias"] = (out, out, 1), (out,)
        ch = out
    last = len(c.upsample_rates) + 1
    s[f"decoder.decoder.{last}.alpha"] = s[f"decoder.decoder.{last}.beta"] = (ch,)
    s[f"decoder.decoder.{last + 1}.conv.weight"], s[f"decoder.decoder.{last + 1}.conv.bias"] = (1, ch, 7), (1,)
    return s
