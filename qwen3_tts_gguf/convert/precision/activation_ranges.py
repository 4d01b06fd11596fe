"""How large each matrix product's input gets on a checkpoint's own weights, and which weights a reduced
precision must therefore leave at f32.

Published weights can drive a layer's input far past what f16 holds: the 0.6B code predictor's
`mlp.down_proj` input peaks at about 1.3e5, twice f16's largest value (llama.cpp PR #28231). ggml's
`mul_mat` rounds its f32 input to the weight's type, so an f16 weight turns that input into inf, then
NaN, then an out-of-range gather that aborts the process. Random weights never reach such values.

`measure(ckpt, prompts)` runs PROMPTS through the fp32 numpy reference (`convert/numpy_reference.py`):
the talker prefills the prompts side by side and makes FRAMES frames of each (codebook 0 greedy,
codebooks 1-15 from two teacher-forced passes of the code predictor), and the codec decoder (its
convolutions and vocoder included) decodes those frames and CODEC_RANDOM_FRAMES random ones. For every
weight it records its input's peak |x| and its largest peak-to-median ratio within one row. Results are
keyed by checkpoint tensor name (the speech tokenizer's `decoder.*` names for the codec), never by a file
format's.

`keep_f32(ranges, fmt)` names the weights whose input `fmt` could not take:
- f16 (talker GGUF, llama stages file): a peak above F16_LIMIT, f16's largest value over F16_HEADROOM
  (a few prompts measure; others may go higher). Whatever is measured, a 0.6B checkpoint's
  code-predictor `mlp.down_proj` weights (upstream's rule).
- llama.cpp's quantized types (LLAMA_QUANTS): a matrix product quantizes its input to 8 bits per block
  (q8_0, blocks of 32, for q8_0 and iq4_nl weights on the CPU; q8_K, blocks of 256, for the K-quants;
  q8_1 on CUDA and Vulkan, whose block scale and sum are f16). So the f16 rule, and a row whose peak is
  more than INT8_PEAK_TO_MEDIAN times its median magnitude: the peak's block rounds most of its other
  inputs to zero.
- int8 / int4 code predictor (ONNX Runtime's MatMulNBits at accuracy level 4: int8 inputs per block of
  the weights' block size, float scales): the peak-to-median rule.
- f32, fp32 and bf16 (f32's range): nothing.
The codec is written fp32 whatever the preset, but a GPU's matrix kernels may round its inputs to f16
(ggml-vulkan's on a device with fp16): the report's `codec_peak` is its largest input peak, and a folder whose
peak passes F16_LIMIT keeps the codec off the GPU (`model/stage_runtimes.py`). The talker's KV cache
(f16, or 8-bit blocks with an f16 scale) takes the same two rules: the report's `talker_kv_cache` is what its
layers cache at most, and the talker keeps a cache its values fit (`model/talker.kv_cache_for`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.numpy_reference import code_predictor_logits, decode_codes, decoder_stack
from qwen3_tts_gguf.model.prompt import PromptBuilder, VoiceSpec

PROMPTS = (("Hello, this is a test of the speech system. How are you today?", "english"),
           ("你好，欢迎使用语音合成系统。今天天气很好。", "chinese"))
FRAMES = 1
CODEC_RANDOM_FRAMES = 8
F16_MAX = 65504.0
F16_HEADROOM = 4.0
F16_LIMIT = F16_MAX / F16_HEADROOM
"""Inputs peaking above this are kept from f16 (a quarter of its range)."""
INT8_PEAK_TO_MEDIAN = 1024.0
"""Inputs whose peak is this many times a row's median magnitude are kept from 8-bit activations: the
peak's block then has a step of peak / 127, eight times the median input, which rounds to zero."""
LLAMA_QUANTS = ("q8_0", "q5_k_m", "q4_k_m", "iq4_nl")
NBITS = ("int8", "int4")
EXACT = ("f32", "fp32", "bf16")
CACHED = (".k_cache", ".v_cache")
"""The names `numpy_reference.decoder_stack` gives what an attention layer caches (no weight's)."""
STAGES = {"talker": ("talker.model.", "talker.codec_head."), "code_predictor": ("talker.code_predictor.",),
          "codec": ("decoder.",)}
"""Each stage's weights by name prefix."""
_UPSTREAM_0B6 = re.compile(r"talker\.code_predictor\.model\.layers\.\d+\.mlp\.down_proj\.weight")


@dataclass(frozen=True)
class InputRange:
    """One matrix product's input as measured: its peak |x| and its largest peak-to-median ratio in a row."""

    peak: float
    peak_to_median: float


@dataclass
class ActivationRanges:
    """Every measured weight's input range, by checkpoint tensor name; and what each attention layer caches
    (`cached`, by `<stack>.layers.<i>.self_attn.k_cache` / `.v_cache`)."""

    inputs: dict[str, InputRange] = field(default_factory=dict)
    cached: dict[str, InputRange] = field(default_factory=dict)
    model_size: str = ""  # the checkpoint's tts_model_size: "0b6" | "1b7"
    prompts: int = 0
    frames: int = 0

    def observe(self, name: str, x: np.ndarray) -> None:
        """`numpy_reference`'s observer: fold the input `x` [..., K] of weight `name` in."""
        rows = np.abs(np.asarray(x, np.float64)).reshape(-1, x.shape[-1])
        peaks = rows.max(-1)
        ratio = float((peaks / np.maximum(np.median(rows, -1), np.finfo(np.float32).tiny)).max())
        into = self.cached if name.endswith(CACHED) else self.inputs
        seen = into.get(name, InputRange(0.0, 0.0))
        into[name] = InputRange(max(seen.peak, float(peaks.max())), max(seen.peak_to_median, ratio))

    def largest(self, prefixes: tuple[str, ...], n: int = 3) -> dict[str, float]:
        """The `n` largest peaks of the weights whose names start with one of `prefixes`."""
        found = sorted(((r.peak, k) for k, r in self.inputs.items() if k.startswith(prefixes)), reverse=True)
        return {k: _round(peak) for peak, k in found[:n]}

    def report(self, kept: dict[str, frozenset[str]]) -> dict:
        """The manifest's `activations` entry: what was measured, the limits, the largest peaks per stage,
        and for each file (`kept`: file -> the weights it keeps at f32) its kept weights with their ranges."""
        talker_cached = [r for k, r in self.cached.items() if k.startswith("talker.model.")]
        return {
            "measured": f"{self.prompts} prompts, {self.frames} frame{'s' * (self.frames != 1)} each, "
                        "through the fp32 numpy reference",
            "f16_limit": F16_LIMIT, "int8_peak_to_median_limit": INT8_PEAK_TO_MEDIAN,
            "largest_peaks": {stage: self.largest(prefix) for stage, prefix in STAGES.items()},
            "codec_peak": _round(max((r.peak for k, r in self.inputs.items() if k.startswith(STAGES["codec"])),
                                     default=0.0)),
            "talker_kv_cache": {"peak": _round(max((r.peak for r in talker_cached), default=0.0)),
                                "peak_to_median": _round(max((r.peak_to_median for r in talker_cached), default=0.0))},
            "kept_f32": {file: {k: {"peak": _round(self.inputs[k].peak),
                                    "peak_to_median": _round(self.inputs[k].peak_to_median)} for k in sorted(names)}
                         for file, names in kept.items()},
        }


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def keep_f32(ranges: ActivationRanges, fmt: str, stage: str | None = None) -> frozenset[str]:
    """The weights (checkpoint names) whose input `fmt` could not take (see the module docstring), of one
    stage (a key of STAGES) or all."""
    if fmt in EXACT:
        return frozenset()
    if fmt not in ("f16", *LLAMA_QUANTS, *NBITS):
        raise ValueError(f"unknown weight format {fmt!r}")
    kept = set()
    for name, r in ranges.inputs.items():
        if stage is not None and not name.startswith(STAGES[stage]):
            continue
        over_f16 = r.peak > F16_LIMIT
        outlier = r.peak_to_median > INT8_PEAK_TO_MEDIAN
        if (fmt == "f16" and over_f16) or (fmt in LLAMA_QUANTS and (over_f16 or outlier)) or (fmt in NBITS and outlier):
            kept.add(name)
    if fmt == "f16" and ranges.model_size == "0b6" and stage in (None, "code_predictor"):  # upstream's rule
        kept.update(name for name in ranges.inputs if _UPSTREAM_0B6.fullmatch(name))
    return frozenset(kept)


def measure(ckpt: Checkpoint, prompts: PromptBuilder, frames: int = FRAMES) -> ActivationRanges:
    """Every matrix product's input range over PROMPTS (see the module docstring). `prompts` builds the
    checkpoint's prompts (its manifest, tokenizer and text tables)."""
    cfg, w = ckpt.config, ckpt.weights
    ranges = ActivationRanges(model_size=cfg.model_size, prompts=len(PROMPTS), frames=frames)
    head = np.asarray(w["talker.codec_head.weight"][:cfg.codec.codebook_size], np.float32)
    built = [prompts.build(text, _voice(prompts, language), "non-streaming") for text, language in PROMPTS]
    rows, made = [p.rows for p in built], []
    for step in range(frames + 1):  # the talker again over the longer rows: the last pass sees them all
        # the prompts side by side, each padded at its end (causal: no row of theirs sees the padding)
        lengths = np.array([len(r) for r in rows])
        batch = np.zeros((len(rows), lengths.max(), cfg.talker.hidden_size), np.float32)
        for i, r in enumerate(rows):
            batch[i, :len(r)] = r
        real = np.arange(lengths.max()) < lengths[:, None]
        observe = (lambda name, x: ranges.observe(name, x[real])) if step == frames else None
        hidden = decoder_stack(w, "talker.model", cfg.talker, batch, dtype=np.float32, observe=observe)
        if observe:
            observe("talker.codec_head.weight", hidden)
        hidden = hidden[np.arange(len(rows)), lengths - 1]  # each prompt's last row
        code0 = np.argmax(hidden @ head.T, axis=-1)
        codes = np.zeros((len(rows), 15), np.int64)
        for seen in (None, ranges.observe):  # the second pass is fed the first one's codes
            codes = code_predictor_logits(w, cfg, hidden, code0, codes, np.float32, seen).argmax(-1)
        made.append(np.concatenate([code0[:, None], codes], axis=1))
        text = [p.trailing[step] if step < len(p.trailing) else p.pad_row for p in built]
        rows = [np.concatenate([r, prompts.tables.frame_rows(f[None]) + t]) for r, f, t in zip(rows, made[-1], text)]
    rng = np.random.default_rng(0)
    codes = np.concatenate([*made, rng.integers(0, cfg.codec.codebook_size, (CODEC_RANDOM_FRAMES, 16))])
    decode_codes(ckpt.codec_weights, cfg.codec, codes, np.float32, ranges.observe)
    return ranges


def _voice(prompts: PromptBuilder, language: str) -> VoiceSpec:
    """A plain voice of the model: its first speaker (CustomVoice), an instruction (VoiceDesign)."""
    m = prompts.manifest
    speaker = min(m.speakers, default=None)
    instruct = "A clear, calm voice." if m.model_type == "voice_design" else None
    return VoiceSpec(speaker=speaker, language=language if language in m.languages else "auto", instruct=instruct)
