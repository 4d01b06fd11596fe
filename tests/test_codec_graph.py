"""The streaming codec decoder graph against the official whole-utterance decoder.

fp32 bar: max |error| < 1e-4 on the clamped wav. The decoder is deep (~40 convs with Snake), so
fp32 rounding alone moves the output by ~4e-5 (torch fp32 vs its own fp64, and ORT one call vs
ORT chunked, per docs/codec-streaming-notes.md); a state bug shows up as O(1e-2..1) errors.
fp64 bar: the same graph in double precision under onnx.reference, chunked vs one call, < 1e-10:
that proves the streaming split itself is exact.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.codec_graph import SIN_PI_SQUARED, build_codec_decoder, sin_pi_squared, state_specs
from qwen3_tts_gguf.convert.onnx_builder import GraphBuilder, save_model
from qwen3_tts_gguf.model.codec import CodecDecoder, CodecState, split_states, stack_states

from tests.reference.official import import_qwen_tts

FP32_TOL = 1e-4  # fp32 noise floor of this decoder is ~4e-5 (see module docstring)
FP64_TOL = 1e-10  # measured ~1e-13: only summation-order differences between chunkings
T = 40
SCHEDULES = {
    "whole": [T], "chunk1": [1], "chunk2": [2], "chunk3": [3], "chunk8": [8],
    "chunk12_gt_window": [12], "mixed": [1, 2, 3, 5, 8, 4, 7, 10],
}


def official_decoder(ckpt_dir):
    import torch

    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    return Qwen3TTSTokenizerV2Model.from_pretrained(str(ckpt_dir / "speech_tokenizer"), dtype=torch.float32).eval()


def official_wav(model, codes: np.ndarray) -> np.ndarray:
    """`decoder.forward` on codes [T, 16] -> wav [T*1920]."""
    import torch

    with torch.no_grad():
        return model.decoder(torch.from_numpy(np.ascontiguousarray(codes.T[None]))).numpy()[0, 0]


def chunks(total: int, schedule: list[int]):
    """(start, end) pairs covering range(total), chunk sizes cycling through schedule."""
    start, k = 0, 0
    while start < total:
        end = min(total, start + schedule[k % len(schedule)])
        yield start, end
        start, k = end, k + 1


def stream(dec: CodecDecoder, codes: np.ndarray, schedule: list[int]) -> np.ndarray:
    state, out = dec.new_state(), []
    for s, e in chunks(len(codes), schedule):
        wav, state = dec.decode(codes[s:e], state)
        out.append(wav)
    assert int(state.pos[0]) == len(codes)
    return np.concatenate(out)


@pytest.fixture(scope="module", params=["tiny_cv", "tiny0b6_cv_bf16"])
def setup(request, tmp_path_factory):
    ckpt_dir = request.getfixturevalue(request.param)
    model = build_codec_decoder(Checkpoint.open(ckpt_dir))
    path = tmp_path_factory.mktemp("codec") / "codec.onnx"
    save_model(model, path)
    codes = np.random.default_rng(1234).integers(0, 2048, (T, 16))
    official = official_decoder(ckpt_dir)
    # calls as large as the schedules ask (the graph's window logic needs calls longer than the window)
    return dict(model=model, dec=CodecDecoder(path, threads=2, max_call_frames=64), official=official, codes=codes,
                ref=official_wav(official, codes), ckpt_dir=ckpt_dir)


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_streaming_matches_official_whole_utterance(setup, schedule):
    wav = stream(setup["dec"], setup["codes"], schedule)
    assert wav.shape == setup["ref"].shape == (T * 1920,)
    assert wav.dtype == np.float32
    assert np.abs(wav - setup["ref"]).max() < FP32_TOL


def test_state_layout_in_metadata(setup):
    model, dec = setup["model"], setup["dec"]
    cfg = Checkpoint.open(setup["ckpt_dir"]).config.codec
    assert onnx.checker.check_model(model) is None
    assert model.opset_import[0].version == 17
    specs = {s.name: s for s in state_specs(model)}
    assert specs["pos"].shape == () and specs["pos"].dtype == "int64"
    for i in range(cfg.num_layers):
        assert specs[f"k{i}"].shape == specs[f"v{i}"].shape == (cfg.num_heads, cfg.sliding_window - 1, cfg.head_dim)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    assert inputs == ["codes"] + [f"in_{n}" for n in specs]
    assert outputs == ["wav"] + [f"out_{n}" for n in specs]
    # fixed-shape state: what comes out has the shape that went in, whatever N
    state = dec.new_state(batch=2)
    assert all(not v.any() for v in state.tensors.values())
    for n in (1, 5):
        _, new = dec.decode(np.zeros((2, n, 16), np.int64), state)
        assert {k: v.shape for k, v in new.tensors.items()} == {k: v.shape for k, v in state.tensors.items()}
        assert list(new.pos) == [n, n]


def test_negative_codes_clamped_like_official_wrapper(setup):
    """-1 (padding) decodes as code 0, as `Qwen3TTSTokenizerV2Model.decode` clamps before decoding;
    the wrapper also trims the padded frames (cb0 == -1) off the end, which is the caller's job here."""
    import torch

    codes = setup["codes"][:12].copy()
    codes[3, 5] = -1
    codes[7, 1:] = -1
    codes[10:, :] = -1  # trailing padding frames
    with torch.no_grad():
        (official,) = setup["official"].decode(torch.from_numpy(codes[None]), return_dict=False)[0]
    wav = setup["dec"].decode_all(codes)
    valid = 10 * 1920  # the wrapper keeps (number of frames with cb0 > -1) * 1920 samples
    assert official.shape == (valid,)
    assert np.abs(wav[:valid] - official.numpy()).max() < FP32_TOL
    assert np.abs(wav - official_wav(setup["official"], np.maximum(codes, 0))).max() < FP32_TOL


def test_decode_refuses_bad_codes(setup):
    dec = setup["dec"]
    with pytest.raises(ValueError, match="must be < 2048"):
        dec.decode(np.full((2, 16), 2048))
    with pytest.raises(ValueError, match="codes must be"):
        dec.decode(np.zeros((2, 15), np.int64))
    with pytest.raises(ValueError, match="streams"):
        dec.decode(np.zeros((2, 1, 16), np.int64), dec.new_state(batch=1))


def test_batched_streams_at_different_positions(setup):
    """Two streams at different positions in one call == each decoded alone with the same chunks."""
    dec, rng = setup["dec"], np.random.default_rng(7)
    a, b = rng.integers(0, 2048, (20, 16)), rng.integers(0, 2048, (20, 16))
    wa1, sa = dec.decode(a[:7])
    joint = stack_states([sa, dec.new_state()])
    assert list(joint.pos) == [7, 0]
    w, joint = dec.decode(np.stack([a[7:16], b[:9]]), joint)  # 9 frames > window 8
    assert w.shape == (2, 9 * 1920)
    assert list(joint.pos) == [16, 9]
    sa, sb = split_states(joint)
    assert isinstance(sa, CodecState) and sa.batch == sb.batch == 1
    wa2, _ = dec.decode(a[16:], sa)
    wb2, _ = dec.decode(b[9:], sb)

    alone_a, s = dec.decode(a[:7])
    alone_a2, s = dec.decode(a[7:16], s)
    alone_b, _ = dec.decode(b[:9])
    # same chunking per stream, so only a batch-dependent kernel choice could differ (measured: 0)
    assert np.abs(w[0] - alone_a2).max() < 1e-6
    assert np.abs(w[1] - alone_b).max() < 1e-6
    assert np.abs(np.concatenate([wa1, w[0], wa2]) - official_wav(setup["official"], a)).max() < FP32_TOL
    assert np.abs(np.concatenate([w[1], wb2]) - official_wav(setup["official"], b)).max() < FP32_TOL


def test_fp64_streaming_split_is_exact(tiny_cv):
    """Double-precision graph under onnx.reference: every chunking == one call, to 1e-10."""
    from onnx.reference import ReferenceEvaluator

    model = build_codec_decoder(Checkpoint.open(tiny_cv), np.float64)
    evaluator, specs = ReferenceEvaluator(model), state_specs(model)
    outputs = ["wav"] + [f"out_{s.name}" for s in specs]
    n = 13  # > sliding window 8, short enough for the pure-numpy evaluator
    codes = np.random.default_rng(5).integers(0, 2048, (1, n, 16))

    def run(schedule):
        feeds = {f"in_{s.name}": np.zeros((1, *s.shape), s.dtype) for s in specs}
        out = []
        for s, e in chunks(n, schedule):
            wav, *new = evaluator.run(outputs, {"codes": codes[:, s:e], **feeds})
            feeds = {f"in_{spec.name}": v for spec, v in zip(specs, new)}
            out.append(wav)
        return np.concatenate(out, axis=1)

    whole = run([n])
    assert whole.dtype == np.float64 and whole.shape == (1, n * 1920)
    for schedule in ([1], [5], [1, 2, 3, 4, 3]):
        assert np.abs(run(schedule) - whole).max() < FP64_TOL, schedule


def test_the_snake_polynomial_is_the_least_squares_fit_of_sin_squared():
    """SIN_PI_SQUARED re-derived: Q with sin²(πf) ≈ u·Q(u), u = f², on Chebyshev nodes of |f| ≤ 1/2."""
    f = np.cos(np.linspace(0, np.pi, 4001)) * 0.5
    keep = f * f > 1e-12
    u = (f * f)[keep]
    fit, *_ = np.linalg.lstsq(np.stack([u ** (k + 1) for k in range(6)], 1), np.sin(np.pi * f[keep]) ** 2, rcond=None)
    np.testing.assert_allclose(SIN_PI_SQUARED, fit, rtol=1e-6)
    f = np.linspace(-0.5, 0.5, 200001)
    assert np.abs(f * f * np.polynomial.polynomial.polyval(f * f, SIN_PI_SQUARED) - np.sin(np.pi * f) ** 2).max() < 1e-8


def test_the_snake_polynomial_graph_follows_sin_squared_at_any_argument():
    """The fp32 ops ONNX Runtime runs: within 3e-7 of sin²(πy) for the fp32 y it is given, |y| up to 1e4."""
    import onnxruntime as ort

    g = GraphBuilder("sin_pi_squared", np.float32)
    g.output(sin_pi_squared(g, g.input("y", "float", ["N"])), "s", "float", ["N"])
    session = ort.InferenceSession(g.model().SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.uniform(-3, 3, 100000), rng.uniform(-1e4, 1e4, 100000), np.arange(-8, 8.5, 0.5)])
    y = y.astype(np.float32)
    (s,) = session.run(None, {"y": y})
    assert np.abs(s - np.sin(np.pi * y.astype(np.float64)) ** 2).max() < 3e-7


def test_snakes_are_polynomials_in_fp32_and_sin_in_the_fp64_proof(tiny_cv):
    """Only the rotary embedding keeps a Sin in the runtime graph; `snake_sin` builds the Sin form."""
    ckpt = Checkpoint.open(tiny_cv)
    sines = {k: sum(n.op_type == "Sin" for n in m.graph.node) for k, m in (
        ("fp32", build_codec_decoder(ckpt)), ("fp64", build_codec_decoder(ckpt, np.float64)),
        ("fp32 sin", build_codec_decoder(ckpt, snake_sin=True)))}
    snakes = 1 + 7 * len(ckpt.config.codec.upsample_rates)  # each block: its own + 2 in each of 3 residual units
    assert sines["fp64"] == sines["fp32 sin"] == sines["fp32"] + snakes


def test_long_input_is_decoded_in_bounded_calls(setup, tmp_path):
    """CodecDecoder splits B*N frames into calls of at most max_call_frames (a call's activations grow
    with its frames): the same samples and state as one call, to fp32 rounding."""
    path = tmp_path / "codec.onnx"
    save_model(setup["model"], path)
    whole_dec, split_dec = (CodecDecoder(path, threads=1, max_call_frames=1000),
                            CodecDecoder(path, threads=1, max_call_frames=4))
    seen: list[tuple[int, ...]] = []
    run = split_dec.session.run
    split_dec.session = type("Spy", (), {
        "run": lambda _, names, feeds: seen.append(feeds["codes"].shape) or run(names, feeds)})()
    codes = np.stack([setup["codes"][:11], setup["codes"][5:16]])  # 2 streams x 11 frames
    whole, whole_state = whole_dec.decode(codes)
    split, split_state = split_dec.decode(codes)
    assert seen == [(2, 2, 16)] * 5 + [(2, 1, 16)]
    assert np.abs(split - whole).max() < FP32_TOL
    for name, value in whole_state.tensors.items():
        assert np.abs(split_state.tensors[name] - value).max() <= FP32_TOL * max(1.0, np.abs(value).max()), name
    one, _ = split_dec.decode(setup["codes"][:9])  # one stream: 4 + 4 + 1
    assert seen[6:] == [(1, 4, 16), (1, 4, 16), (1, 1, 16)] and one.shape == (9 * 1920,)
