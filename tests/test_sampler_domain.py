"""The sampler's domain: every setting SamplingParams / TalkerSampling accept, any logits.

Property tests (hypothesis, derandomized) over the whole accepted range of `sample`,
`talker_logits_processors` and `sample_code0` with adversarial logits (huge, tiny, ties, NaN, +-inf,
rows that are -inf except a few): the distribution is always finite and sums to 1, the token is a
valid index, and codebook 0 is never a control code (>= 2048) other than an allowed EOS. Ordinary
rows are drawn bit for bit as HF's fp32 maths (the original algorithm, kept below as the reference).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen3_tts_gguf.engine.request import TalkerSampling
from qwen3_tts_gguf.model import sampler
from qwen3_tts_gguf.model.sampler import SamplingParams, distribution, sample, sample_code0, talker_logits_processors

CODES = 2048  # codebook-0 codes; ids from here up are control ids
TALKER_VOCAB = 3072
EOS = 2150
PROPERTY = settings(derandomize=True, deadline=None, max_examples=250, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 1e-38, -1e-38, 3.4e38, -3.4e38, 1e30, -1e30, 88.7, -88.7,
           float("inf"), float("-inf"), float("nan")]


# -- strategies ---------------------------------------------------------------------------------

positive = st.one_of(  # every temperature / penalty > 0 the dataclasses accept, fp32 underflow and overflow included
    st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=True),
    st.sampled_from([5e-324, 1e-45, 1e-40, 1e-30, 1e-8, 1e-3, 0.5, 1.0, 1.05, 2.0, 1e8, 1e30, 3.5e38, 1e300,
                     float("inf")]))
top_k = st.one_of(st.integers(0, 64), st.sampled_from([1, 2047, 2048, 3071, 3072, 3073, 10**6, 2**63, 10**40]))
top_p = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1e-45, 0.5, 0.999999, 1.0]))


@st.composite
def sampling_params(draw) -> SamplingParams:
    greedy = draw(st.booleans())
    temperature = draw(st.one_of(positive, st.just(0.0))) if greedy else draw(positive)
    return SamplingParams(temperature=temperature, top_k=draw(top_k), top_p=draw(top_p), greedy=greedy)


@st.composite
def logit_rows(draw, vocab: int) -> np.ndarray:
    """One fp32 row: a base pattern (ordinary, ties, huge, tiny, constant, all -inf), then a few
    entries overwritten with any fp32 value (NaN and +-inf included)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["normal", "ties", "huge", "tiny", "constant", "neg_inf"]))
    with np.errstate(over="ignore"):
        if kind == "normal":
            row = rng.standard_normal(vocab) * draw(st.sampled_from([1.0, 10.0, 1e4]))
        elif kind == "ties":
            row = np.round(rng.standard_normal(vocab))
        elif kind == "huge":
            row = rng.choice([-3.4e38, -1e38, 1e38, 3e38, 3.4e38], vocab)
        elif kind == "tiny":
            row = rng.standard_normal(vocab) * 1e-40
        elif kind == "constant":
            row = np.full(vocab, draw(st.sampled_from(SPECIAL[:-1])))
        else:
            row = np.full(vocab, -np.inf)
        row = row.astype(np.float32)
    for _ in range(draw(st.integers(0, 6))):
        value = draw(st.one_of(st.sampled_from(SPECIAL), st.floats(width=32)))
        row[draw(st.integers(0, vocab - 1))] = value
    return row


# -- the original algorithm: the bit-for-bit reference for ordinary rows -------------------------


def _reference_sample(logits: np.ndarray, params: SamplingParams, rand: float) -> int:
    """sampler.sample as it was before the domain work (HF's fp32 maths, no overflow handling)."""
    logits = np.asarray(logits, np.float32)[None]
    temperature = np.float32(1.0 if params.greedy else params.temperature)
    scaled = logits / temperature
    order = np.argsort(-scaled, axis=-1, kind="stable")
    scaled = np.take_along_axis(scaled, order, axis=-1)
    vocab = logits.shape[-1]
    k = vocab if params.top_k <= 0 or params.top_k >= vocab else params.top_k
    scaled = np.where(scaled >= scaled[:, k - 1:k], scaled, np.float32(-np.inf))

    def soft(x):
        return np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)

    suffix = np.cumsum(soft(scaled)[:, ::-1], axis=-1, dtype=np.float32)[:, ::-1]
    kept = max(int((suffix > np.float32(1) - np.float32(params.top_p)).sum()), 1)
    filtered = np.where(scaled >= scaled[:, kept - 1:kept], scaled, np.float32(-np.inf))
    cdf = np.cumsum(soft(filtered), axis=-1, dtype=np.float32)
    u = np.float32(rand) * cdf[:, -1:]
    pos = min(int((cdf <= u).sum()), int(np.isfinite(filtered).sum()) - 1)
    return int(logits[0].argmax()) if params.greedy else int(order[0, pos])


# -- properties ---------------------------------------------------------------------------------


def _check_draw(row: np.ndarray, params: SamplingParams, rand: float) -> int:
    order, probs = distribution(row[None], params)
    assert np.isfinite(probs).all() and (probs >= 0).all(), "a non-finite or negative probability"
    assert abs(float(probs.sum(dtype=np.float64)) - 1.0) < 1e-4
    assert sorted(order[0].tolist()) == list(range(row.size))
    token = int(sample(row[None], params, np.array([rand], np.float32))[0])
    assert 0 <= token < row.size
    clean = np.where(np.isnan(row), -np.inf, row)
    if params.greedy:
        assert token == int(clean.argmax())
    else:  # drawn from what the filters kept
        pack = sampler.pack(params)
        kept_order, filtered = sampler.filter_sorted(clean[None], pack["temperature"], pack["top_k"], pack["top_p"])
        assert np.isfinite(filtered[0][kept_order[0].tolist().index(token)])
        if clean.max() > -np.inf:
            assert clean[token] > -np.inf, "drew a forbidden (-inf) token while others were allowed"
    return token


@PROPERTY
@given(row=logit_rows(37), params=sampling_params(), rand=st.floats(0.0, 1.0, exclude_max=True, width=32))
def test_sample_is_finite_and_valid_for_any_logits_and_settings(row, params, rand):
    _check_draw(row, params, rand)


@PROPERTY
@given(rows=st.lists(logit_rows(11), min_size=1, max_size=5), data=st.data())
def test_batched_rows_are_independent(rows, data):
    params = [data.draw(sampling_params()) for _ in rows]
    rand = np.array([data.draw(st.floats(0.0, 1.0, exclude_max=True, width=32)) for _ in rows], np.float32)
    batched = sample(np.stack(rows), params, rand)
    for i, row in enumerate(rows):
        assert batched[i] == sample(row[None], params[i], rand[i:i + 1])[0]


@PROPERTY
@given(row=logit_rows(TALKER_VOCAB), history=st.sets(st.integers(0, TALKER_VOCAB - 1), max_size=12),
       step=st.integers(0, 4), penalty=positive, params=sampling_params(), allow_eos=st.booleans(),
       seed=st.integers(0, 2**63 - 1))
def test_codebook0_is_a_code_or_an_allowed_eos(row, history, step, penalty, params, allow_eos, seed):
    scores = talker_logits_processors(row, history, step, penalty, EOS, allow_eos)
    made_nan = np.flatnonzero(np.isnan(scores) & ~np.isnan(row))
    assert all(i in history and np.isinf(row[i]) for i in made_nan), "the processors made a NaN"  # only inf/inf
    control = np.arange(CODES, TALKER_VOCAB)
    assert (scores[control[control != EOS]] == -np.inf).all()
    eos_allowed = allow_eos and step >= 2
    if not eos_allowed:
        assert scores[EOS] == -np.inf
    code = sample_code0(row, history, step, TalkerSampling(params, penalty), np.random.default_rng(seed), EOS,
                        allow_eos)
    assert 0 <= code < TALKER_VOCAB
    assert code < CODES or (code == EOS and eos_allowed), f"control code {code}"
    _check_draw(scores, params, 0.5)


ordinary_params = st.builds(SamplingParams, temperature=st.floats(0.05, 5.0), top_k=st.integers(0, 100),
                            top_p=st.floats(0.0, 1.0), greedy=st.booleans())


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([0.5, 3.0, 20.0]), params=ordinary_params,
       rand=st.floats(0.0, 1.0, exclude_max=True, width=32), ties=st.booleans())
def test_ordinary_rows_draw_what_hf_fp32_maths_draws(seed, scale, params, rand, ties):
    """No change for ordinary values: the same token as the original algorithm, bit for bit."""
    row = (np.random.default_rng(seed).standard_normal(CODES) * scale).astype(np.float32)
    if ties:
        row = np.round(row).astype(np.float32)
    token = int(sample(row[None], params, np.array([rand], np.float32))[0])
    assert token == _reference_sample(row, params, rand)


# -- the limits, named -------------------------------------------------------------------------

ROW = np.array([0.5, 2.0, -1.0, 2.0 - 2**-20, 1.5], np.float32)


@pytest.mark.parametrize("temperature", [1e-30, 1e-40, 1e-45, 5e-324])
def test_a_tiny_temperature_is_the_greedy_limit(temperature):
    order, probs = distribution(ROW[None], SamplingParams(temperature, 0, 1.0))
    assert order[0, 0] == 1 and probs[0, 0] == 1.0
    for rand in (0.0, 0.5, 0.999):
        assert sample(ROW[None], SamplingParams(temperature, 0, 1.0), np.array([rand], np.float32))[0] == 1


def test_huge_logits_do_not_overflow():
    row = np.array([3.4e38, -3.4e38, 3e38, 0.0], np.float32)
    for temperature in (0.5, 1.0, 1e-20):
        order, probs = distribution(row[None], SamplingParams(temperature, 0, 1.0))
        assert order[0, 0] == 0 and probs[0, 0] == 1.0


def test_huge_temperature_is_uniform_over_the_allowed_tokens():
    row = np.array([1.0, -np.inf, 5.0, -3.0], np.float32)
    for temperature in (1e30, 1e300, float("inf")):
        order, probs = distribution(row[None], SamplingParams(temperature, 0, 1.0))
        weights = dict(zip(order[0].tolist(), probs[0].tolist()))
        assert weights[1] == 0 and all(abs(weights[i] - 1 / 3) < 1e-6 for i in (0, 2, 3))


def test_top_p_zero_keeps_the_top_token_and_a_huge_top_k_is_off():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((64, 300)).astype(np.float32)
    rand = rng.random(64, dtype=np.float32)
    np.testing.assert_array_equal(sample(logits, SamplingParams(1.0, 0, 0.0), rand), logits.argmax(-1))
    for huge in (300, 10**6, 2**63, 10**40):
        np.testing.assert_array_equal(sample(logits, SamplingParams(0.8, huge, 0.9), rand),
                                      sample(logits, SamplingParams(0.8, 0, 0.9), rand))


@pytest.mark.parametrize("penalty", [1e-30, 1e-45, 5e-324])
def test_a_tiny_repetition_penalty_makes_the_repeated_positive_code_certain(penalty):
    row = np.zeros(TALKER_VOCAB, np.float32)
    row[:CODES] = np.random.default_rng(5).standard_normal(CODES)
    row[7], row[9] = 2.0, 0.0
    scores = talker_logits_processors(row, {7, 9}, 5, penalty, EOS)
    assert scores[9] == 0.0 and not np.isnan(scores).any()  # 0 / penalty stays 0
    for seed in range(5):
        code = sample_code0(row, {7, 9}, 5, TalkerSampling(SamplingParams(0.9, 50, 1.0), penalty),
                            np.random.default_rng(seed), EOS)
        assert code == 7


@pytest.mark.parametrize("penalty", [1e30, 3.5e38, 1e300, float("inf")])
def test_a_huge_repetition_penalty_rules_the_repeated_codes_out(penalty):
    row = np.full(TALKER_VOCAB, -5.0, np.float32)
    row[3], row[4], row[5] = 9.0, -1.0, 1.0
    scores = talker_logits_processors(row, {3, 4}, 5, penalty, EOS)
    assert scores[4] <= -1e30 and 0 <= scores[3] < 1e-29
    code = sample_code0(row, {3, 4}, 5, TalkerSampling(SamplingParams(0.9, 1, 1.0), penalty),
                        np.random.default_rng(0), EOS)
    assert code == 5


def test_nothing_allowed_gives_code_zero():
    row = np.full(TALKER_VOCAB, -np.inf, np.float32)
    row[EOS] = 10.0  # EOS not yet allowed (step 0); every code -inf
    for greedy in (False, True):
        assert sample_code0(row, set(), 0, TalkerSampling(SamplingParams(0.9, 50, 1.0, greedy), 1.05),
                            np.random.default_rng(1), EOS) == 0
