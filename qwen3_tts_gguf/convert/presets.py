"""Named sets of weight formats (`convert --preset`, `pull --preset`): the talker's GGUF quant and the
code predictor's precision, chosen together (`--quant` / `--cp-precision` override either half), and
the matrices of the llama stages file (`llama_stages.py`, read by the ggml code predictor), which only the
preset chooses."""

from __future__ import annotations

from dataclasses import dataclass

CP_PRECISIONS = ("fp32", "int8", "int4")
"""The code predictor's weight formats (`predictor_graph.quantize_code_predictor`)."""

CP_BLOCK_SIZES = (32, 64, 128, 256)
CP_BLOCK_SIZE = 128
"""The int8/int4 code predictor's weights per scale (MatMulNBits blocks). Its kernels take int8
activations (`predictor_graph.NBITS_ACCURACY_LEVEL`), quantized per block too, so a wider block costs
agreement and saves time. 0.6B, 2 threads, one frame (15 steps), side by side (`python -m
bench.experiments cp-quant`, 2026-12-01), blocks of 32 / 128 / 256: int8 55.1 / 44.7 / 42.7 ms, int4
40.4 / 32.1 / 27.5 ms; logits' relative RMS error against fp32: int8 2.1 / 2.6 / 2.8 %, int4 23 / 27 /
29 %; greedy first code equal to fp32's: int8 94.1 / 91.4 / 91.0 % (random weights). In the engine, one
stream's RTF 1.65 -> 1.44 (int8, 32 -> 128) and 1.30 -> 1.17 (`--preset fast`)."""


LLAMA_STAGES_TYPES = ("f32", "f16")
"""The llama stages file's matrix types. Measured through libmtmd (llama-cpp-python 0.3.36) against the
project's fp32 graphs, random weights, 2026-12-05: the code predictor's greedy frames (all 15 codes)
equal at 0.6B f32 19/20 (the one miss a near-tie), f16 20/20, q8_0 12/20 (tiny model 11/20); the codec's
SNR f32 39.5 dB, f16 37.9 dB, q8_0 23.1 dB. q8_0 is not offered. The codec's ceiling is ggml's conv1d,
which rounds its inputs to f16 whatever the file holds."""


@dataclass(frozen=True)
class LlamaStagesFormat:
    """The matrix types of the llama stages file: the code predictor's and the codec decoder's (f32 | f16).
    Vectors, the codec's ConvTranspose kernels and its conv kernels (always F16) do not follow them."""

    code_predictor: str
    codec: str


@dataclass(frozen=True)
class Preset:
    quant: str
    cp_precision: str
    summary: str
    llama_stages: LlamaStagesFormat


PRESETS = {
    "default": Preset("q8_0", "int8", "talker q8_0, code predictor int8", LlamaStagesFormat("f16", "f32")),
    "fast": Preset("q4_k_m", "int4", "talker q4_k_m, code predictor int4: the fastest on CPUs, with the agreement "
                                     "docs/benchmarks.md reports against the wider formats",
                   LlamaStagesFormat("f16", "f16")),
    "exact": Preset("f32", "fp32", "talker f32, code predictor fp32: the parity precisions, the slowest",
                    LlamaStagesFormat("f32", "f32")),
}
DEFAULT_PRESET = "default"


def weight_formats(preset: str, quant: str | None = None, cp_precision: str | None = None) -> tuple[str, str]:
    """(talker quant, code predictor precision): the preset's, each overridden when given."""
    chosen = PRESETS[preset]
    return quant or chosen.quant, cp_precision or chosen.cp_precision
