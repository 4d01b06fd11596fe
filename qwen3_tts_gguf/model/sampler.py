"""Sampling settings and a numpy sampler with the same semantics as the in-graph one.

Semantics follow Hugging Face `generate` (transformers 4.57.3) for one step:
greedy (`do_sample=False`) = argmax of the raw logits (first index on ties); otherwise
temperature -> top-k (keep logits >= the k-th largest, ties kept; k = 0 or k >= vocab = off) ->
top-p (`TopPLogitsWarper`: drop the tokens whose ascending cumulative probability is <= 1 - p,
always keep the most likely one) -> softmax -> one draw.

The draw is an inverse CDF over the kept tokens ordered by descending (scaled) logit, ties
lower id first, with a caller-supplied uniform number in [0, 1), so a request's randomness is
reproducible from its own generator. It samples the same distribution as HF's
`torch.multinomial`, not the same sequence. One deviation from HF: at the top-p boundary, tokens whose logits tie
the last kept logit are all kept (HF's sort order decides among them).

Every accepted setting gives a finite distribution, whatever the logits (the HTTP schema bounds the
settings; this module copes with the whole range SamplingParams accepts). Where HF's fp32 maths
would overflow into inf/NaN, the limit it tends to is used instead; every other row is computed
with HF's fp32 operations, bit for bit (tests/test_sampler_domain.py checks both):
- NaN logits count as -inf (never drawn).
- A row whose scaled logits are not all finite-or--inf (a tiny temperature, huge logits, +inf from
  an extreme repetition penalty): the scaling is redone on logits shifted by their maximum, which
  is the same distribution without the overflow; a temperature that is 0 in fp32 keeps only the
  maximal logits (the greedy limit); +inf logits are the only candidates, equally likely.
- A row with every logit -inf (nothing allowed) draws token 0, as greedy argmax does.
- top_k beyond the vocabulary is off (as 0), however large.
The code predictor's in-graph sampler has none of this: it only ever gets the model's own
generation_config settings (a request can only turn greedy on).
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


_TOP_K_OFF = 2**62  # any top_k from here up means "off" (it exceeds every vocabulary)


def pack(params: SamplingParams | Sequence[SamplingParams], batch: int | None = None) -> dict[str, np.ndarray]:
    """Per-row arrays `temperature` f32 [B], `top_k` i64 [B], `top_p` f32 [B], `greedy` bool [B].

    A single SamplingParams is repeated `batch` times. Greedy rows get temperature 1 so no row
    ever divides by zero.
    """
    if isinstance(params, SamplingParams):
        params = [params] * (1 if batch is None else batch)
    if batch is not None and len(params) != batch:
        raise ValueError(f"{len(params)} sampling settings for a batch of {batch}")
    with np.errstate(over="ignore"):  # a temperature beyond fp32 becomes inf: handled in filter_sorted
        temperature = np.array([1.0 if p.greedy else p.temperature for p in params], np.float32)
    return {
        "temperature": temperature,
        "top_k": np.array([min(int(p.top_k), _TOP_K_OFF) for p in params], np.int64),  # >= vocab: off
        "top_p": np.array([p.top_p for p in params], np.float32),
        "greedy": np.array([p.greedy for p in params], np.bool_),
    }


def _softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # far below the maximum: -inf, weight 0
        e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def filter_sorted(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray,
                  top_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Temperature, top-k and top-p on [B, V] logits, in descending order.

    Returns (order [B, V] token ids by descending scaled logit, ties lower id first; filtered
    [B, V] scaled logits in that order, -inf for removed tokens). The same steps as the ONNX graph.
    """
    logits = _finite_or_inf(logits)
    vocab = logits.shape[-1]
    temperature = temperature.astype(np.float32)
    with np.errstate(all="ignore"):
        scaled = logits / temperature[:, None]
    bad = ~((np.isfinite(scaled) | (scaled == -np.inf)).all(-1) & np.isfinite(scaled).any(-1))
    if bad.any():
        scaled[bad] = _limit_scaled(logits[bad], temperature[bad])
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


def _finite_or_inf(logits: np.ndarray) -> np.ndarray:
    """fp32 logits with NaN as -inf (a NaN is never drawn); a copy only when there is a NaN."""
    logits = np.asarray(logits, np.float32)
    nan = np.isnan(logits)
    return np.where(nan, np.float32(-np.inf), logits) if nan.any() else logits


def _limit_scaled(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """logits / temperature for rows where that overflows, is NaN or has no finite value: the same
    distribution, from logits shifted by their maximum (the maximum scales to 0, every other logit
    to a negative number or -inf). Never NaN, never +inf, at least one 0 per row."""
    top = logits.max(-1, keepdims=True)
    with np.errstate(all="ignore"):
        shifted = logits - top  # <= 0; -inf where it overflows (that token is out of reach anyway)
        # temperature 0 in fp32: -inf below the maximum (the greedy limit); inf: -0.0 (uniform)
        scaled = np.where(shifted == 0, np.float32(0), shifted / temperature[:, None])
    scaled = np.where(np.isnan(scaled), np.float32(-np.inf), scaled)
    scaled = np.where(logits == np.inf, np.float32(0), scaled)  # +inf logits: only they, equally likely
    scaled[(top == -np.inf)[:, 0], 0] = 0  # every logit -inf (nothing allowed): token 0, as argmax gives
    return scaled.astype(np.float32)


def distribution(logits: np.ndarray, params: SamplingParams | Sequence[SamplingParams]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The distribution `sample` draws from: (order [B, V] token ids, probs [B, V] in that order).

    Greedy rows put all the weight on the argmax. Every row is finite and sums to 1.
    """
    logits = _finite_or_inf(logits)
    p = pack(params, logits.shape[0])
    order, filtered = filter_sorted(logits, p["temperature"], p["top_k"], p["top_p"])
    probs = _softmax(filtered)
    greedy = p["greedy"]
    if greedy.any():
        order[greedy] = np.argsort(-logits[greedy], axis=-1, kind="stable")  # argmax (first of ties) first
        probs[greedy] = 0
        probs[greedy, 0] = 1
    return order, probs


def sample(logits: np.ndarray, params: SamplingParams | Sequence[SamplingParams], rand: np.ndarray) -> np.ndarray:
    """One token per row of [B, V] logits; rand [B] uniform in [0, 1). Returns int64 [B]."""
    logits = _finite_or_inf(logits)
    p = pack(params, logits.shape[0])
    order, filtered = filter_sorted(logits, p["temperature"], p["top_k"], p["top_p"])
    cdf = np.cumsum(_softmax(filtered), axis=-1, dtype=np.float32)
    u = np.asarray(rand, np.float32)[:, None] * cdf[:, -1:]
    n_kept = np.isfinite(filtered).sum(-1)
    pos = np.minimum((cdf <= u).sum(-1), n_kept - 1)
    drawn = np.take_along_axis(order, pos[:, None], axis=-1)[:, 0]
    return np.where(p["greedy"], logits.argmax(-1), drawn).astype(np.int64)


_TINY_PENALTY = np.nextafter(np.float32(0), np.float32(1))  # the smallest positive fp32


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
        with np.errstate(all="ignore"):
            # fp32 as HF; a penalty below fp32's range stays positive (0 / penalty = 0, never NaN):
            # logits it pushes past fp32 become +inf, which `sample` treats as the only candidates
            penalty = max(np.float32(repetition_penalty), _TINY_PENALTY)
            scores[idx] = np.where(picked < 0, picked * penalty, picked / penalty)
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
