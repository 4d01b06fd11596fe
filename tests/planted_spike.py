"""Checkpoints with the published 0.6B's massive activation planted (issue 47, item 5): one intermediate
channel of an MLP (the code predictor's first layer, and the talker's) has its gate and up rows scaled by s and
its down_proj column by 1/s^2, so the MLP's output keeps its size while down_proj's input reaches PEAK on the
converter's measured prompts. Used by tests/test_activation_ranges.py and `python -m bench.experiments cp-spike`
(the published sizes); `against_reference` judges a code predictor's greedy codes on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.numpy_reference import code_predictor_logits
from qwen3_tts_gguf.convert.pipeline import build_manifest, prompt_builder
from qwen3_tts_gguf.convert.precision.activation_ranges import ActivationRanges, measure
from qwen3_tts_gguf.convert.text_tables import write_text_tables
from qwen3_tts_gguf.model.safetensors_io import write_safetensors

from tests.greedy_agreement import NEAR_TIE

PEAK = 2e5
"""down_proj's planted input peak on the measured prompts (the issue's reproduction planted ~2e5)."""
PLANTED = ("talker.code_predictor.model", "talker.model")
CHANNEL = 0
CP_DOWN, TALKER_DOWN = (f"{stack}.layers.0.mlp.down_proj.weight" for stack in PLANTED)


def measured(ckpt_dir: Path, work: Path) -> ActivationRanges:
    """`measure` of a checkpoint folder, its text tables written into `work`."""
    ckpt = Checkpoint.open(ckpt_dir)
    manifest = build_manifest(ckpt, "f32", "measured")
    write_text_tables(ckpt, work / "tables.safetensors")
    return measure(ckpt, prompt_builder(ckpt_dir, manifest, work / "tables.safetensors"))


def plant(src: Path, dst: Path) -> ActivationRanges:
    """`src` with a massive activation planted in the first layer of the code predictor and of the talker
    (the module docstring), written to `dst` (its other files linked); returns its measured ranges."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).symlink_to(f)
    base = {n: np.array(w, np.float32) for n, w in Checkpoint.open(src).weights.items()}
    scales = dict.fromkeys(PLANTED, 30.0)
    for _ in range(2):  # once s * gate is large, down_proj's input grows as s^2: one correction lands on PEAK
        weights = dict(base)
        for stack, s in scales.items():
            for leaf, where, factor in (("gate_proj", np.s_[CHANNEL], s), ("up_proj", np.s_[CHANNEL], s),
                                        ("down_proj", np.s_[:, CHANNEL], 1 / s ** 2)):
                name = f"{stack}.layers.0.mlp.{leaf}.weight"
                weights[name] = base[name].copy()
                weights[name][where] *= factor
        (dst / "model.safetensors").unlink(missing_ok=True)
        write_safetensors(dst / "model.safetensors", weights)
        ranges = measured(dst, dst.parent)
        scales = {stack: s * np.sqrt(PEAK / ranges.inputs[f"{stack}.layers.0.mlp.down_proj.weight"].peak)
                  for stack, s in scales.items()}
    return ranges


def against_reference(ckpt: Checkpoint, hidden: np.ndarray, code0: np.ndarray, codes: np.ndarray,
                      observe=None) -> tuple[int, int]:
    """Greedy code-predictor codes [R, 15] of `hidden` / `code0` against the float64 reference's argmax
    (teacher-forced on them): (codes that differ, of those the near ties: the reference's top two within
    NEAR_TIE). `observe`: the reference's activation observer."""
    differ = near = 0
    for h, c, row in zip(hidden, code0, codes):
        logits = code_predictor_logits(ckpt.weights, ckpt.config, h, c, row, observe=observe)
        top2 = np.sort(logits, axis=-1)[:, -2:]
        wrong = logits.argmax(-1) != row
        differ += int(wrong.sum())
        near += int((wrong & (top2[:, 1] - top2[:, 0] < NEAR_TIE)).sum())
    return differ, near
