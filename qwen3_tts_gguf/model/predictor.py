"""Runtime code predictor: codebooks 1..15 and the next talker input row for a batch of frames."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.model.onnx_session import make_session
from qwen3_tts_gguf.model.sampler import SamplingParams, pack

NUM_STEPS = 15
# What a frame costs on a CPU: its 15 steps each read every layer's weights (0.6B: 78 MB int8, 39 MB int4,
# more than a 32 MiB L3), so they come from memory at the rate a one-row MatMulNBits kernel streams them, not
# at the arithmetic's: one int8 [1,1024]x[1024,6144], 2 threads, 92-101 GB/s when the chain's weights fit the
# L3 (6-13 MB), 22-25 GB/s from memory (a plain read: ~55); int4 29-47 in cache (its unpacking bounds it),
# 20-22 from memory. Huge pages for those weights (glibc.malloc.hugetlb=1) changed nothing measurable
# (2026-12-02, three alternating runs). Dispatching the CPU graph's 2292 nodes costs little (0.3-1 us per
# small node: ~2 ms a frame). OpenVINO's CPU runtime is no faster here: the same graph with int8 weights
# (one scale per column, or per 128 rows) as Cast x scale before each MatMul, which it runs as compressed
# FullyConnected kernels, took 71-76 ms a frame against this graph's 62-66 on ONNX Runtime, and 97-102 with
# its dynamic quantization of the activations (0.6B, 2 threads, 20 alternating calls, 2026-12-03). ONNX
# Runtime's own dynamic quantization (int8 weights per column, activations per tensor: DynamicQuantizeLinear +
# MatMulInteger) streams one row no faster: a chain of 24 int8 [1024,3072]/[3072,1024] weights (80 MB), 2
# threads, 11.6 ms a pass against MatMulNBits' 8.3 (2026-12-03, a slower day: numpy read 28 GB/s).


@dataclass
class PredictorOutput:
    codes: np.ndarray            # int64 [B, 15], codebooks 1..15
    frame_embedding: np.ndarray  # float32 [B, H]: talker input row of this frame minus its text part


def uniform_draws(batch: int, rngs: Sequence[np.random.Generator] | None, rand: np.ndarray | None) -> np.ndarray:
    """The [B, 15] uniform numbers of a frame's draws: `rand` as given, else 15 from each row's generator."""
    if rand is None:
        if rngs is None or len(rngs) != batch:
            raise ValueError("pass either rand [B, 15] or one numpy Generator per row")
        rand = np.stack([g.random(NUM_STEPS, dtype=np.float32) for g in rngs])
    rand = np.ascontiguousarray(rand, np.float32)
    if rand.shape != (batch, NUM_STEPS):
        raise ValueError(f"rand must be [{batch}, {NUM_STEPS}], got {list(rand.shape)}")
    return rand


class CodePredictor:
    """The per-frame code predictor ONNX graph (`convert.predictor_graph`) behind one call."""

    def __init__(self, path: str | Path, *, threads: int | None = None, device: str = "cpu"):
        self.session = make_session(path, threads=threads, device=device)
        meta = self.session.get_modelmeta().custom_metadata_map
        self.hidden_size = int(meta.get("hidden_size", self.session.get_inputs()[0].shape[1]))

    def predict(self, hidden: np.ndarray, code0: np.ndarray,
                params: SamplingParams | Sequence[SamplingParams],
                rngs: Sequence[np.random.Generator] | None = None,
                rand: np.ndarray | None = None) -> PredictorOutput:
        """Codes and frame embeddings for B frames.

        hidden [B,H]: talker post-norm hidden state that produced code0 [B]; params: one per row
        (or one for all). Randomness: `rand` [B,15] uniform [0,1), or else 15 draws from each
        row's generator in `rngs` (a row's result then depends only on its own generator).
        """
        hidden = np.ascontiguousarray(hidden, np.float32)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(f"hidden must be [B, {self.hidden_size}], got {list(hidden.shape)}")
        batch = hidden.shape[0]
        code0 = np.asarray(code0, np.int64).reshape(batch)
        rand = uniform_draws(batch, rngs, rand)
        feeds = {"hidden": hidden, "code0": code0, "rand": rand, **pack(params, batch)}
        codes, frame = self.session.run(["codes", "frame_embedding"], feeds)
        return PredictorOutput(codes=codes, frame_embedding=frame)
