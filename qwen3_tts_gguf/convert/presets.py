"""Named pairs of weight formats (`convert --preset`, `pull --preset`): the talker's GGUF quant and the
code predictor's precision, chosen together. `--quant` / `--cp-precision` override either half."""

from __future__ import annotations

from dataclasses import dataclass


CP_PRECISIONS = ("fp32", "int8", "int4")
"""The code predictor's weight formats (`predictor_graph.quantize_code_predictor`)."""


@dataclass(frozen=True)
class Preset:
    quant: str
    cp_precision: str
    summary: str


PRESETS = {
    "default": Preset("q8_0", "int8", "talker q8_0, code predictor int8"),
    "fast": Preset("q4_k_m", "int4", "talker q4_k_m, code predictor int4: the fastest on CPUs, with the agreement "
                                     "docs/benchmarks.md reports against the wider formats"),
    "exact": Preset("f32", "fp32", "talker f32, code predictor fp32: the parity precisions, the slowest"),
}
DEFAULT_PRESET = "default"


def weight_formats(preset: str, quant: str | None = None, cp_precision: str | None = None) -> tuple[str, str]:
    """(talker quant, code predictor precision): the preset's, each overridden when given."""
    chosen = PRESETS[preset]
    return quant or chosen.quant, cp_precision or chosen.cp_precision
