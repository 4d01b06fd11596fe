"""The llama stages file: the code predictor, the codec decoder and a speaker encoder as one GGUF that
libmtmd (llama.cpp's multimodal library, as bundled in llama-cpp-python 0.3.36) loads as a "mmproj".

libmtmd calls the code predictor "code_gen" (talker hidden + codebook 0 -> codes 1..15 and the next
talker input row) and the codec decoder "code2wav" (codes -> 24 kHz audio); the runtime is
`model/llama_stages.py`. What this libmtmd loads (its clip.cpp and mtmd.cpp, checked by loading and
running such files):

- `general.architecture` is `clip`. An audio (or vision) encoder is required: libmtmd refuses a file
  without one even when it is only asked to generate. So every file carries a speaker encoder
  (`clip.audio.*`, projector `qwen3tts_spkenc`, tensors `a.*` and `mm.a.fc.*`): a Base checkpoint's
  own (the published ECAPA-TDNN layout, `SPEAKER_ENCODER_SHAPE`; another gets no file), and for
  CustomVoice / VoiceDesign a tiny valid one (8 channels, near-zero weights) that is never used.
  `clip.projector_type` is never written: it would override both projector types.
- The generator (`clip.gen.audio.*`, projector `qwen3tts_gen`) is code_gen (`a.gen.code.*`) and
  code2wav (`a.gen.wav.*`). libmtmd builds both graphs on every call, so both are written.
- code2wav's hyperparameters are hard-coded in libmtmd, not read from the file (`CODEC_SHAPE`): 8
  layers of width 512, feed-forward 1024, 16 heads, window 72 frames, 2 upsampling blocks, 4 DAC
  blocks of 3 residual units, RMS eps 1e-5, RoPE theta 1e4. Every published speech tokenizer has that
  shape; a checkpoint whose codec decoder has another (the tiny test shapes) gets no file, and the
  manifest says why (`unsupported_reason`). code_gen's RoPE theta is hard-coded too (1e6); its other
  sizes, and every channel count and kernel of code2wav, are read from the metadata and tensor shapes.
- Tensors are written in PyTorch layout: ggml's dimensions (ne) are the numpy shape reversed.
  Snake parameters are folded (alpha' = exp(alpha), beta' = 1 / (exp(beta) + 1e-9)) and codebooks
  divided out (embedding_sum / max(cluster_usage, 1e-5)), as the graph expects them.
- Types: vectors are F32; the codec's ConvTranspose kernels F32 (its graph reshapes them); its plain
  and depthwise conv kernels F16 (ggml_conv_1d rounds its input to F16 for any kernel but BF16, so F32
  kernels give bit-identical audio at twice the size); the speaker encoder F32; the matrices of the
  code predictor and of the codec as `presets.LlamaStagesFormat` says (measured agreement in
  `presets.LLAMA_STAGES_TYPES`), except the matrices whose input f16 cannot hold, which stay F32
  (`f32_weights`: measured by `convert/precision/activation_ranges.py`, and upstream's 0.6B rule).
- code_gen samples at temperature 1 whatever it is asked (libmtmd ignores the request's
  temperature), so the checkpoint's code-predictor temperature (`subtalker_temperature`) is baked
  into its heads (logits / T: HF's temperature-then-top-k-then-top-p order; greedy unchanged) and
  recorded in the manifest for the runtime.

numpy and `gguf` only; tensors are read lazily from the memory-mapped checkpoint and written one at
a time, so memory stays at about the largest tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from qwen3_tts_gguf.convert.checkpoint import Checkpoint, ModelConfig
from qwen3_tts_gguf.convert.precision.activation_ranges import ActivationRanges, keep_f32
from qwen3_tts_gguf.convert.presets import LLAMA_STAGES_TYPES, LlamaStagesFormat
from qwen3_tts_gguf.convert.random_checkpoint import speaker_encoder_shapes

N_ACOUSTIC = 15  # codebooks 1..15: the code predictor's tables and heads
CODEC_SHAPE = {"num_layers": 8, "hidden_size": 512, "intermediate_size": 1024, "num_heads": 16,
               "sliding_window": 72, "rms_norm_eps": 1e-5, "rope_theta": 1e4}
"""code2wav's hyperparameters as libmtmd hard-codes them (with 2 upsampling blocks, 4 DAC blocks)."""
CODEC_UPSAMPLING_BLOCKS, CODEC_DAC_BLOCKS = 2, 4
CODE_PREDICTOR_ROPE_THETA = 1e6
# the speaker encoder's layout this writer maps (the published ECAPA-TDNN): 128 mel bins, Res2Net scale 8
SPEAKER_ENCODER_SHAPE = {"mel_dim": 128, "enc_res2net_scale": 8, "enc_kernel_sizes": [5, 3, 3, 3, 1],
                         "enc_dilations": [1, 2, 3, 4, 1]}
_RES2NET_BLOCKS = SPEAKER_ENCODER_SHAPE["enc_res2net_scale"] - 1


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the file: its name, numpy shape, ggml type ("F32" | "F16") and how to read it."""

    name: str
    shape: tuple[int, ...]
    type: str
    load: Callable[[], np.ndarray]


def unsupported_reason(cfg: ModelConfig) -> str | None:
    """Why libmtmd cannot load this checkpoint's llama stages (None: it can)."""
    c = cfg.codec
    wrong = [f"{key} {getattr(c, key)} (llama.cpp hard-codes {want})"
             for key, want in CODEC_SHAPE.items() if getattr(c, key) != want]
    if len(c.upsampling_ratios) != CODEC_UPSAMPLING_BLOCKS:
        wrong.append(f"{len(c.upsampling_ratios)} upsampling blocks (llama.cpp hard-codes {CODEC_UPSAMPLING_BLOCKS})")
    if len(c.upsample_rates) != CODEC_DAC_BLOCKS:
        wrong.append(f"{len(c.upsample_rates)} decoder blocks (llama.cpp hard-codes {CODEC_DAC_BLOCKS})")
    if wrong:
        return "the codec decoder is not the published shape llama.cpp hard-codes: " + ", ".join(wrong)
    if cfg.code_predictor.rope_theta != CODE_PREDICTOR_ROPE_THETA:
        return (f"the code predictor's rope_theta is {cfg.code_predictor.rope_theta:g}; "
                f"llama.cpp hard-codes {CODE_PREDICTOR_ROPE_THETA:g}")
    spk = cfg.speaker_encoder
    if spk is not None and (off := [k for k, v in SPEAKER_ENCODER_SHAPE.items() if spk.get(k, v) != v]):
        return f"the speaker encoder is not the published layout ({', '.join(f'{k} {spk[k]}' for k in off)})"
    return None


def f32_weights(ranges: ActivationRanges, fmt: LlamaStagesFormat) -> frozenset[str]:
    """The code predictor's and the codec's weights (checkpoint names) the file keeps F32 at `fmt`."""
    return keep_f32(ranges, fmt.code_predictor, "code_predictor") | keep_f32(ranges, fmt.codec, "codec")


def sampling_temperature(ckpt: Checkpoint) -> float:
    """The code predictor's sampling temperature baked into the heads: generation_config.json's
    `subtalker_temperature` (1 where it is absent or not a positive number)."""
    value = ckpt.generation_config.get("subtalker_temperature", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        return 1.0
    return float(value)


def metadata(ckpt: Checkpoint) -> dict[str, bool | str | int | float]:
    """The file's key-value pairs (bool, str, uint32 and float32 by Python type)."""
    cfg = ckpt.config
    width, cp = cfg.talker.hidden_size, cfg.code_predictor
    return {
        "general.name": f"{ckpt.path.name} llama stages",
        "general.description": "Qwen3-TTS code predictor (code_gen), codec decoder (code2wav) and speaker "
                               "encoder for libmtmd",
        "clip.has_vision_encoder": False,
        "clip.has_audio_encoder": True,
        "clip.audio.projector_type": "qwen3tts_spkenc",
        "clip.audio.projection_dim": width,
        "clip.audio.num_mel_bins": SPEAKER_ENCODER_SHAPE["mel_dim"],
        "clip.audio.block_count": 3,  # SE-Res2Net blocks
        # ECAPA-TDNN has no attention or feed-forward: values libmtmd's generic loader requires
        "clip.audio.embedding_length": 1536,
        "clip.audio.feed_forward_length": 1536,
        "clip.audio.attention.head_count": 1,
        "clip.audio.attention.layer_norm_epsilon": 1e-5,
        "clip.has_gen_audio_encoder": True,
        "clip.gen.audio.projector_type": "qwen3tts_gen",
        "clip.gen.audio.projection_dim": width,
        "clip.gen.audio.embedding_length": cp.hidden_size,
        "clip.gen.audio.feed_forward_length": cp.intermediate_size,
        "clip.gen.audio.block_count": cp.num_layers,
        "clip.gen.audio.attention.head_count": cp.num_heads,
        "clip.gen.audio.attention.head_count_kv": cp.num_kv_heads,
        "clip.gen.audio.attention.layer_norm_epsilon": cp.rms_norm_eps,
    }


class _Plan:
    """The file's tensors in order, each typed by its role."""

    def __init__(self, fmt: LlamaStagesFormat, keep: frozenset[str]):
        for part, value in (("code_predictor", fmt.code_predictor), ("codec", fmt.codec)):
            if value not in LLAMA_STAGES_TYPES:
                raise ValueError(f"llama stages {part} type {value!r}; choose one of {', '.join(LLAMA_STAGES_TYPES)}")
        self.fmt, self.keep = fmt, keep
        self.tensors: list[PlannedTensor] = []

    def add(self, name: str, shape: tuple[int, ...], load: Callable[[], np.ndarray], matrix_type: str = "F32",
            sources: tuple[str, ...] = ()) -> None:
        """A tensor; `matrix_type` applies to 2-D and larger ones, vectors are always F32, and so is a
        tensor made of a checkpoint weight (`sources`) the plan keeps F32."""
        if not self.keep.isdisjoint(sources):
            matrix_type = "F32"
        self.tensors.append(PlannedTensor(name, tuple(shape), matrix_type if len(shape) > 1 else "F32", load))


def plan_llama_stages(ckpt: Checkpoint, fmt: LlamaStagesFormat, keep: frozenset[str] = frozenset()
                      ) -> tuple[list[PlannedTensor], str]:
    """Every tensor of the file, in order, and which speaker encoder it carries ("real" | "dummy");
    `keep`: the checkpoint weights kept F32 (`f32_weights`)."""
    plan = _Plan(fmt, keep)
    real = ckpt.config.model_type == "base"
    if real:
        _plan_speaker_encoder(plan, ckpt.weights.shape_of, ckpt.weights.__getitem__)
    else:
        dummy = dummy_speaker_encoder(ckpt.config.talker.hidden_size)
        _plan_speaker_encoder(plan, lambda n: dummy[n].shape, dummy.__getitem__)
    _plan_code_predictor(plan, ckpt)
    _plan_codec(plan, ckpt)
    return plan.tensors, "real" if real else "dummy"


def dummy_speaker_encoder(width: int) -> dict[str, np.ndarray]:
    """A tiny ECAPA-TDNN of valid shapes (8 channels, near-zero weights) for models without a speaker
    encoder: libmtmd opens no file without an audio encoder. Never used (its warm-up runs it)."""
    config = {**SPEAKER_ENCODER_SHAPE, "enc_channels": [8, 8, 8, 8, 24], "enc_attention_channels": 4,
              "enc_se_channels": 4, "enc_dim": width}
    rng = np.random.default_rng(0)
    tensors = {}
    for name, shape in speaker_encoder_shapes(config).items():
        tensors[f"{name}.weight"] = (0.01 * rng.standard_normal(shape)).astype(np.float32)
        tensors[f"{name}.bias"] = np.zeros(shape[0], np.float32)
    return tensors


def _plan_speaker_encoder(plan: _Plan, shape_of: Callable[[str], tuple[int, ...]],
                          read: Callable[[str], np.ndarray]) -> None:
    """qwen3tts_spkenc, all F32: conv kernels (out, in, k), ggml [k, in, out]."""
    names = {"a.conv1d.0": "speaker_encoder.blocks.0.conv"}
    for b in (1, 2, 3):
        p = f"speaker_encoder.blocks.{b}"
        names.update({f"a.blk.{b}.conv_pw1": f"{p}.tdnn1.conv", f"a.blk.{b}.conv_pw2": f"{p}.tdnn2.conv",
                      f"a.blk.{b}.se_conv1": f"{p}.se_block.conv1", f"a.blk.{b}.se_conv2": f"{p}.se_block.conv2"})
        names.update({f"a.blk.{b}.res2.{x}": f"{p}.res2net_block.blocks.{x}.conv" for x in range(_RES2NET_BLOCKS)})
    names.update({"a.conv_out": "speaker_encoder.mfa.conv", "a.asp_attn": "speaker_encoder.asp.conv",
                  "a.asp_tdnn": "speaker_encoder.asp.tdnn.conv", "mm.a.fc": "speaker_encoder.fc"})
    for leaf in ("weight", "bias"):
        for dst, src in names.items():
            plan.add(f"{dst}.{leaf}", shape_of(f"{src}.{leaf}"), lambda n=f"{src}.{leaf}": read(n))


def _plan_code_predictor(plan: _Plan, ckpt: Checkpoint) -> None:
    """qwen3tts_gen's code_gen: a.gen.code.*"""
    cfg, w, mat = ckpt.config, ckpt.weights, plan.fmt.code_predictor.upper()
    p = "talker.code_predictor."

    def copy(dst: str, src: str, matrix_type: str = mat) -> None:
        plan.add(dst, w.shape_of(src), lambda: w[src], matrix_type, (src,))

    def stacked(dst: str, src: str, divisor: float = 1.0) -> None:  # 15 per-codebook tables as [15, rows, width]
        names = [src.format(i) for i in range(N_ACOUSTIC)]
        plan.add(dst, (N_ACOUSTIC, *w.shape_of(names[0])),
                 lambda: np.stack([w[n] for n in names]) / np.float32(divisor), mat, tuple(names))

    if cfg.has_mtp_projection:  # absent where the talker and the code predictor are as wide (0.6B)
        copy("a.gen.code.proj_in.weight", p + "small_to_mtp_projection.weight")
        copy("a.gen.code.proj_in.bias", p + "small_to_mtp_projection.bias")
    stacked("a.gen.code.embd.weight", p + "model.codec_embedding.{}.weight")  # talker-wide input tables
    stacked("a.gen.code.head.weight", p + "lm_head.{}.weight", sampling_temperature(ckpt))
    copy("a.gen.code.out_embd.weight", "talker.model.codec_embedding.weight")  # codebook 0's row back to the talker
    copy("a.gen.code.output_norm.weight", p + "model.norm.weight")
    layer = {"input_layernorm": "ln1", "post_attention_layernorm": "ln2", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_out", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.code_predictor.num_layers):
        for src, dst in layer.items():
            copy(f"a.gen.code.blk.{i}.{dst}.weight", f"{p}model.layers.{i}.{src}.weight")


def _plan_codec(plan: _Plan, ckpt: Checkpoint) -> None:
    """qwen3tts_gen's code2wav: a.gen.wav.*, from the speech tokenizer's decoder.*"""
    cfg, w, mat = ckpt.config.codec, ckpt.codec_weights, plan.fmt.codec.upper()

    def copy(dst: str, src: str, matrix_type: str = mat) -> None:
        plan.add(dst, w.shape_of("decoder." + src), lambda: w["decoder." + src], matrix_type, ("decoder." + src,))

    def conv(dst: str, src: str) -> None:  # ggml_conv_1d(_dw) kernels: F16 (see the module docstring)
        copy(dst + ".weight", src + ".weight", "F16")
        copy(dst + ".bias", src + ".bias")

    def transposed(dst: str, src: str) -> None:  # ConvTranspose (in, out, k), ggml [k, out, in]: F32
        copy(dst + ".weight", src + ".weight", "F32")
        copy(dst + ".bias", src + ".bias")

    def linear(dst: str, src: str) -> None:  # a 1x1 conv without bias as a matrix
        shape = w.shape_of("decoder." + src)[:2]
        plan.add(dst, shape, lambda: w["decoder." + src][:, :, 0], mat)

    def snake(dst: str, src: str) -> None:
        shape = w.shape_of(f"decoder.{src}.alpha")
        plan.add(dst + ".alpha", shape, lambda: np.exp(w[f"decoder.{src}.alpha"]))
        plan.add(dst + ".beta", shape, lambda: 1.0 / (np.exp(w[f"decoder.{src}.beta"]) + 1e-9))

    def codebook(src: str) -> np.ndarray:
        return w[f"decoder.{src}._codebook.embedding_sum"] / np.maximum(
            w[f"decoder.{src}._codebook.cluster_usage"], 1e-5)[:, None]

    q = "quantizer."
    for part, src in (("first", "rvq_first"), ("rest", "rvq_rest")):
        linear(f"a.gen.wav.quant.{part}.in_proj.weight", f"{q}{src}.input_proj.weight")  # unused, required
        linear(f"a.gen.wav.quant.{part}.out_proj.weight", f"{q}{src}.output_proj.weight")
    books = w.shape_of(f"decoder.{q}rvq_first.vq.layers.0._codebook.embedding_sum")
    plan.add("a.gen.wav.quant.first.codebook.weight", books, lambda: codebook(f"{q}rvq_first.vq.layers.0"), mat)
    rest = cfg.num_quantizers - 1
    plan.add("a.gen.wav.quant.rest.codebook.weight", (rest, *books),
             lambda: np.stack([codebook(f"{q}rvq_rest.vq.layers.{i}") for i in range(rest)]), mat)
    conv("a.gen.wav.pre_conv", "pre_conv.conv")
    t = "pre_transformer."
    for dst, src in (("in_proj", "input_proj"), ("out_proj", "output_proj")):
        copy(f"a.gen.wav.tfm.{dst}.weight", f"{t}{src}.weight")
        copy(f"a.gen.wav.tfm.{dst}.bias", f"{t}{src}.bias")
    copy("a.gen.wav.tfm.output_norm.weight", t + "norm.weight")
    layer = {"input_layernorm.weight": "ln1.weight", "post_attention_layernorm.weight": "ln2.weight",
             "self_attn_layer_scale.scale": "ls1.weight", "mlp_layer_scale.scale": "ls2.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_out.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    for i in range(cfg.num_layers):
        for src, dst in layer.items():
            copy(f"a.gen.wav.tfm.blk.{i}.{dst}", f"{t}layers.{i}.{src}")
    for j in range(len(cfg.upsampling_ratios)):
        u, d = f"upsample.{j}.", f"a.gen.wav.up.blk.{j}."
        transposed(d + "conv", u + "0.conv")
        conv(d + "dwconv", u + "1.dwconv.conv")
        for src, dst in (("norm.weight", "norm.weight"), ("norm.bias", "norm.bias"), ("pwconv1.weight", "pw1.weight"),
                         ("pwconv1.bias", "pw1.bias"), ("pwconv2.weight", "pw2.weight"),
                         ("pwconv2.bias", "pw2.bias"), ("gamma", "gamma")):
            copy(d + dst, u + "1." + src)
    conv("a.gen.wav.dac.entry", "decoder.0.conv")
    for b in range(len(cfg.upsample_rates)):
        s, d = f"decoder.{b + 1}.block.", f"a.gen.wav.dac.blk.{b}."
        snake(d + "snake", s + "0")
        transposed(d + "conv", s + "1.conv")
        for x in range(3):  # residual units, dilations 1, 3, 9 (hard-coded in libmtmd)
            r, e = f"{s}{x + 2}.", f"{d}res.{x}."
            snake(e + "act1", r + "act1")
            conv(e + "conv1", r + "conv1.conv")
            snake(e + "act2", r + "act2")
            conv(e + "conv2", r + "conv2.conv")
    last = len(cfg.upsample_rates) + 1
    snake("a.gen.wav.dac.post_snake", f"decoder.{last}")
    conv("a.gen.wav.dac.post_conv", f"decoder.{last + 1}.conv")


_NUMPY = {"F32": np.float32, "F16": np.float16}
_ADD = {bool: gguf.GGUFWriter.add_bool, str: gguf.GGUFWriter.add_string, int: gguf.GGUFWriter.add_uint32,
        float: gguf.GGUFWriter.add_float32}


def write_llama_stages(ckpt: Checkpoint, path: Path, fmt: LlamaStagesFormat, keep: frozenset[str] = frozenset()
                       ) -> dict:
    """Write the llama stages file at `path`, the weights `keep` (`f32_weights`) F32; returns the manifest's
    `llama_stages` entry. The caller checks `unsupported_reason` first (libmtmd would not load the file
    otherwise)."""
    tensors, speaker = plan_llama_stages(ckpt, fmt, keep)
    writer = gguf.GGUFWriter(str(path), "clip")
    try:
        for key, value in metadata(ckpt).items():
            _ADD[type(value)](writer, key, value)
        for t in tensors:
            dtype = np.dtype(_NUMPY[t.type])
            writer.add_tensor_info(t.name, t.shape, dtype, int(np.prod(t.shape)) * dtype.itemsize)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            data = np.ascontiguousarray(t.load(), dtype=np.float32)
            if data.shape != t.shape:
                raise ValueError(f"llama stages tensor {t.name}: planned {list(t.shape)}, read {list(data.shape)}")
            writer.write_tensor_data(data.astype(_NUMPY[t.type]))
    finally:
        writer.close()
    return {"temperature": sampling_temperature(ckpt), "code_predictor": fmt.code_predictor, "codec": fmt.codec,
            "speaker_encoder": speaker, "f32_weights": sorted(keep)}
