"""Sampling settings and a numpy sampler with the same semantics as the in-graph one.

Semantics follow Hugging Face `generate` (transformers 4.57.3) for one step:
greedy (`do_sample=False`) = argmax of the raw logits (first index on ties); otherwise
temperature -> top-k (keep logits >= the k-th largest, ties kept; k = 0 or k >= vocab = off) ->
top-p (`TopPLogitsWarper`: drop the tokens whose ascending cumulative probability is <= 1 - p,
always keep the most likely one) -> softmax -> one draw.

The draw is an inverse CDF over the kept tokens ordered by descending (scaled) logit, ties
lower id first, with a caller-supplied uniform number in [0, 1), so a request's randomness is
reproducible from its own generator. It samples the same distribution as HF's
`torch.multinomial`, not the same sequence. One deviation from HF: at the top-p boundary, tokens whose logits tie the last kept
logit are all kept (HF's sort order decides among them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings (HF names; `greedy` is `do_sample=False`)."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    greedy: bool = False

    def __post_init__(self) -> None:
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {self.temperature}); use greedy=True")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")

    @classmethod
    def from_generation_config(cls, gen: dict, prefix: str = "") -> "SamplingParams":
        """From `generation_config.json`; prefix "subtalker_" gives the code predictor's settings."""
        do_sample = gen.get(prefix + "dosample" if prefix else "do_sample", True)
        return cls(temperature=float(gen.get(prefix + "temperature", 0.9)), top_k=int(gen.get(prefix + "top_k", 50)),
                   top_p=float(gen.get(prefix + "top_p", 1.0)), greedy=not do_sample)


def pack(params: SamplingParams | Sequence[SamplingParams], batch: int | None = None) -> dict[str, np.ndarray]:
    """Per-row arrays `temperature` f32 [B], `top_k` i64 [B], `top_p` f32 [B], `greedy` bool [B].

    A single SamplingParams is repeated `batch` times. Greedy rows get temperature 1 so no row
    ever divides by zero.
    """
    if isinstance(params, SamplingParams):
        params = [params] * (1 if batch is None else batch)
    if batch is not None and len(params) != batch:
        raise ValueError(f"{len(params)} sampling settings for a batch of {batch}")
    return {
        "temperature": np.array([1.0 if p.greedy else p.temperature for p in params], np.float32),
        "top_k": np.array([p.top_k for p in params], np.int64),
        "top_p": np.array([p.top_p for p in params], np.float32),
        "greedy": np.array([p.greedy for p in params], np.bool_),
    }


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def filter_sorted(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray,
                  top_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Temperature, top-k and top-p on [B, V] logits, in descending order.

    Returns (order [B, V] token ids by descending scaled logit, ties lower id first; filtered
    [B, V] scaled logits in that order, -inf for removed tokens). The same steps as the ONNX graph.
    """
    logits = np.asarray(logits, np.float32)
    vocab = logits.shape[-1]
    scaled = logits / temperature.astype(np.float32)[:, None]
    order = np.argsort(-scaled, axis=-1, kind="stable")
    scaled = np.take_along_axis(scaled, order, axis=-1)
    k = np.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
    kth = np.take_along_axis(scaled, (k - 1)[:, None], axis=-1)
    scaled = np.where(scaled >= kth, scaled, np.float32(-np.inf))
    # HF's ascending cumulative sum, seen from the descending side: a suffix sum
    suffix = np.cumsum(_softmax(scaled)[:, ::-1], axis=-1, dtype=np.float32)[:, ::-1]
    kept = np.maximum((suffix > (np.float32(1) - top_p.astype(np.float32))[:, None]).sum(-1), 1)
    last = np.take_along_axis(scaled, (kept - 1)[:, None], axis=-1)
    return order, np.where(scaled >= last, scaled, np.float32(-np.inf))


def sample(logits: np.ndarray, params: SamplingParams | Sequence[SamplingParams], rand: np.ndarray) -> np.ndarray:
    """One token per row of [B, V] logits; rand [B] uniform in [0, 1). Returns int64 [B]."""
    logits = np.asarray(logits, np.float32)
    p = pack(params, logits.shape[0])
    order, filtered = filter_sorted(logits, p["temperature"], p["top_k"], p["top_p"])
    cdf = np.cumsum(_softmax(filtered), axis=-1, dtype=np.float32)
    u = np.asarray(rand, np.float32)[:, None] * cdf[:, -1:]
    n_kept = np.isfinite(filtered).sum(-1)
    pos = np.minimum((cdf <= u).sum(-1), n_kept - 1)
    drawn = np.take_along_axis(order, pos[:, None], axis=-1)[:, 0]
    return np.where(p["greedy"], logits.argmax(-1), drawn).astype(np.int64)


def talker_logits_processors(logits: np.ndarray, history: set[int], step: int, repetition_penalty: float,
                             eos_id: int, allow_eos: bool = True, min_new_tokens: int = 2,
                             control_ids_from: int = 2048) -> np.ndarray:
    """The official generate's processors on codebook-0 logits [V], in its order (fp32).

    Repetition penalty over the set of previous codebook-0 ids; EOS forbidden for the first
    `min_new_tokens` steps; every control id (>= 2048) except EOS suppressed. With allow_eos False
    EOS is suppressed too (how `--ignore-eos` and the reference runs force a frame count).
    """
    scores = np.array(logits, dtype=np.float32, copy=True)
    if history and repetition_penalty != 1.0:
        idx = np.fromiter(history, dtype=np.int64)
        picked = scores[idx]
        scores[idx] = np.where(picked < 0, picked * np.float32(repetition_penalty),
                               picked / np.float32(repetition_penalty))
    if step < min_new_tokens or not allow_eos:
        scores[eos_id] = -np.inf
    suppressed = np.arange(control_ids_from, scores.shape[0])
    scores[suppressed[suppressed != eos_id]] = -np.inf
    return scores


def sample_code0(logits: np.ndarray, history: set[int], step: int, sampling, rng: np.random.Generator,
                 eos_id: int, allow_eos: bool = True) -> int:
    """Codebook 0 of the next frame: processors, then `sample` with one draw from `rng`.

    `sampling` is a request.TalkerSampling (SamplingParams + repetition penalty). One number is
    drawn from rng even when greedy, so a stream's random sequence does not depend on its mode.
    """
    scores = talker_logits_processors(logits, history, step, sampling.repetition_penalty, eos_id, allow_eos)
    u = np.array([rng.random(dtype=np.float32)])
    return int(sample(scores[None], sampling.params, u)[0])
