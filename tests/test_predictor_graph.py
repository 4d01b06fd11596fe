"""The code-predictor ONNX graph, its sampler and the numpy reference against the official model."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pytest

from qwen3_tts_gguf.convert import numpy_reference
from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.onnx_builder import save_model
from qwen3_tts_gguf.convert.predictor_graph import build_code_predictor, build_sampler
from qwen3_tts_gguf.model import sampler
from qwen3_tts_gguf.model.onnx_session import make_session
from qwen3_tts_gguf.model.predictor import CodePredictor
from qwen3_tts_gguf.model.sampler import SamplingParams

from tests.reference.official import import_qwen_tts

LOGIT_ATOL = 1e-4  # fp32 graph vs fp32 torch, logits std ~4
GREEDY = SamplingParams(greedy=True)


@dataclass
class Setup:
    ckpt: Checkpoint
    talker: object  # official Qwen3TTSTalkerForConditionalGeneration (fp32)
    predictor: CodePredictor
    forced: object  # onnxruntime session of the teacher-forced graph

    @property
    def H(self) -> int:
        return self.ckpt.config.talker.hidden_size


@pytest.fixture(scope="module", params=["tiny_cv", "tiny0b6_cv_bf16"])
def setup(request, checkpoint_factory, tmp_path_factory) -> Setup:
    import torch

    path = checkpoint_factory(request.param)
    ckpt = Checkpoint.open(path)
    assert ckpt.config.has_mtp_projection == (request.param == "tiny_cv")
    out = tmp_path_factory.mktemp(request.param)
    save_model(build_code_predictor(ckpt), out / "cp.onnx")
    save_model(build_code_predictor(ckpt, teacher_forced=True), out / "cp_tf.onnx")
    import_qwen_tts()
    from qwen_tts import Qwen3TTSModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Qwen3TTSModel.from_pretrained(str(path), dtype=torch.float32)
    return Setup(ckpt, model.model.talker.eval(), CodePredictor(out / "cp.onnx", threads=2),
                 make_session(out / "cp_tf.onnx", threads=2))


def _frames(setup: Setup, n: int, seed: int):
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((n, setup.H)).astype(np.float32)
    return hidden, rng.integers(0, 2048, n), rng.integers(0, 2048, (n, 15))


def _official_forced_logits(talker, hidden, code0, codes):
    """Official code predictor run step by step with its KV cache, inputs forced: [B,15,V]."""
    import torch

    cp = talker.code_predictor
    with torch.inference_mode():
        h = torch.from_numpy(hidden)[:, None]
        e0 = talker.get_input_embeddings()(torch.from_numpy(code0)[:, None])
        out = cp(inputs_embeds=torch.cat([h, e0], 1), use_cache=True)
        logits = [out.logits[:, -1]]
        for j in range(1, 15):
            ids = torch.from_numpy(np.ascontiguousarray(codes[:, j - 1:j]))
            out = cp(input_ids=ids, past_key_values=out.past_key_values, use_cache=True, generation_steps=j)
            logits.append(out.logits[:, -1])
    return torch.stack(logits, 1).numpy()


def _numpy_logits(setup: Setup, hidden, code0, codes):
    return numpy_reference.code_predictor_logits(setup.ckpt.weights, setup.ckpt.config, hidden, code0, codes)


def _official_frame_embedding(talker, code0, codes):
    import torch

    with torch.inference_mode():
        e = talker.get_input_embeddings()(torch.from_numpy(code0))
        for i in range(15):
            e = e + talker.code_predictor.get_input_embeddings()[i](torch.from_numpy(np.ascontiguousarray(codes[:, i])))
    return e.numpy()


def _run_forced(setup: Setup, hidden, code0, forced, params=GREEDY, rand=None):
    n = len(code0)
    rand = np.zeros((n, 15), np.float32) if rand is None else rand
    feeds = {"hidden": hidden, "code0": code0, "rand": rand, "forced_codes": forced, **sampler.pack(params, n)}
    return setup.forced.run(None, feeds)


def _run(setup: Setup, hidden, code0, params, rand):
    feeds = {"hidden": hidden, "code0": np.asarray(code0, np.int64), "rand": rand,
             **sampler.pack(params, len(hidden))}
    return setup.predictor.session.run(None, feeds)  # codes, frame_embedding, logits


# -- parity with the official model ------------------------------------------------------------

def test_teacher_forced_logits_and_frame_embedding(setup):
    hidden, code0, forced = _frames(setup, 4, seed=1)
    want = _official_forced_logits(setup.talker, hidden, code0, forced)
    codes, frame, logits = _run_forced(setup, hidden, code0, forced)
    assert logits.shape == (4, 15, 2048) and 3 < want.std() < 6
    assert np.abs(logits - want).max() < LOGIT_ATOL
    np.testing.assert_array_equal(codes, logits.argmax(-1))
    np.testing.assert_allclose(frame, _official_frame_embedding(setup.talker, code0, forced), atol=1e-5)


def test_greedy_codes_match_official_generate(setup):
    import torch

    hidden, code0, _ = _frames(setup, 6, seed=2)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e0 = setup.talker.get_input_embeddings()(torch.from_numpy(code0)[:, None])
        res = setup.talker.code_predictor.generate(
            inputs_embeds=torch.cat([torch.from_numpy(hidden)[:, None], e0], 1), max_new_tokens=15,
            do_sample=False, output_logits=True, return_dict_in_generate=True)
    want_codes = res.sequences.numpy()
    assert want_codes.shape == (6, 15)
    out = setup.predictor.predict(hidden, code0, GREEDY, rand=np.zeros((6, 15), np.float32))
    np.testing.assert_array_equal(out.codes, want_codes)
    np.testing.assert_allclose(out.frame_embedding, _official_frame_embedding(setup.talker, code0, want_codes),
                               atol=1e-5)
    _, _, logits = _run(setup, hidden, code0, GREEDY, np.zeros((6, 15), np.float32))
    assert np.abs(logits - torch.stack(res.logits, 1).numpy()).max() < LOGIT_ATOL


def test_numpy_reference_code_predictor(setup):
    hidden, code0, forced = _frames(setup, 2, seed=3)
    want = _official_forced_logits(setup.talker, hidden, code0, forced)
    for b in range(2):
        got = _numpy_logits(setup, hidden[b], code0[b], forced[b])
        assert np.abs(got - want[b]).max() < LOGIT_ATOL


def test_numpy_reference_talker_stack(setup):
    import torch

    rows = np.random.default_rng(4).standard_normal((2, 7, setup.H)).astype(np.float32)
    with torch.inference_mode():
        want = setup.talker.model(inputs_embeds=torch.from_numpy(rows), use_cache=False).last_hidden_state.numpy()
    got = numpy_reference.decoder_stack(setup.ckpt.weights, "talker.model", setup.ckpt.config.talker, rows)
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())


def test_float64_graph_is_the_numpy_reference(setup, tmp_path):
    """The graph construction itself is exact: in float64 it agrees with numpy to rounding."""
    save_model(build_code_predictor(setup.ckpt, float_type=np.float64, teacher_forced=True), tmp_path / "cp64.onnx")
    hidden, code0, forced = _frames(setup, 2, seed=12)
    feeds = {"hidden": hidden.astype(np.float64), "code0": code0, "rand": np.zeros((2, 15)), "forced_codes": forced,
             **{k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in sampler.pack(GREEDY, 2).items()}}
    _, _, logits = make_session(tmp_path / "cp64.onnx", threads=1).run(None, feeds)
    for b in range(2):
        want = _numpy_logits(setup, hidden[b], code0[b], forced[b])
        assert np.abs(logits[b] - want).max() < 1e-10


# -- batching and sampling ---------------------------------------------------------------------

MIXED = [SamplingParams(0.9, 50, 1.0), SamplingParams(1.3, 0, 0.8), GREEDY]


def test_batch_equals_single_rows(setup):
    hidden, code0, _ = _frames(setup, 3, seed=5)
    rngs = [np.random.default_rng(100 + i) for i in range(3)]
    batched = setup.predictor.predict(hidden, code0, MIXED, rngs=rngs)
    for i in range(3):
        one = setup.predictor.predict(hidden[i:i + 1], code0[i:i + 1], MIXED[i], rngs=[np.random.default_rng(100 + i)])
        np.testing.assert_array_equal(one.codes[0], batched.codes[i])
        np.testing.assert_allclose(one.frame_embedding[0], batched.frame_embedding[i], atol=1e-5)


def test_top_k_one_is_greedy_and_rand_is_deterministic(setup):
    hidden, code0, _ = _frames(setup, 8, seed=6)
    rand = np.random.default_rng(7).random((8, 15), dtype=np.float32)
    greedy = setup.predictor.predict(hidden, code0, GREEDY, rand=rand).codes
    np.testing.assert_array_equal(setup.predictor.predict(hidden, code0, SamplingParams(1.5, 1, 1.0), rand=rand).codes,
                                  greedy)
    np.testing.assert_array_equal(setup.predictor.predict(hidden, code0, SamplingParams(1.0, 0, 0.0), rand=rand).codes,
                                  greedy)  # top_p 0 keeps only the most likely token
    a = setup.predictor.predict(hidden, code0, MIXED[1], rand=rand).codes
    np.testing.assert_array_equal(setup.predictor.predict(hidden, code0, MIXED[1], rand=rand).codes, a)
    assert (setup.predictor.predict(hidden, code0, MIXED[1], rand=1 - rand).codes != a).any()


def _hf_probs(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, bool]:
    """HF generate's processed distribution for one row (the warpers it would install), and
    whether a token sits on the top-p boundary (within fp32 rounding, so either choice is right)."""
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = torch.from_numpy(logits[None].astype(np.float32))
    if p.temperature != 1.0:
        scores = TemperatureLogitsWarper(float(p.temperature))(None, scores)
    if p.top_k != 0:
        scores = TopKLogitsWarper(top_k=int(p.top_k))(None, scores)
    on_boundary = False
    if p.top_p < 1.0:
        cumulative = torch.sort(scores, descending=False)[0].softmax(-1).cumsum(-1)
        on_boundary = bool((cumulative - (1 - p.top_p)).abs().min() < 1e-6)
        scores = TopPLogitsWarper(top_p=float(p.top_p))(None, scores)
    return torch.softmax(scores, -1)[0].numpy(), on_boundary


SWEEP = [SamplingParams(t, k, p) for t in (0.5, 0.9, 1.7) for k in (0, 1, 7, 50, 4096) for p in (1.0, 0.9, 0.5)]


def test_in_graph_sampling_follows_hf_semantics(setup):
    """Every (row, step) draw equals the numpy sampler's on the same logits, whose distribution is HF's."""
    n = len(SWEEP)
    hidden, code0, _ = _frames(setup, n, seed=8)
    rand = np.random.default_rng(9).random((n, 15), dtype=np.float32)
    codes, _, logits = _run(setup, hidden, code0, SWEEP, rand)
    ranks = (logits > np.take_along_axis(logits, codes[..., None], -1)).sum(-1)  # 0 = the argmax
    # the same algorithm in numpy; a differing draw is only possible where fp32 rounding decides
    twin = np.stack([sampler.sample(logits[:, j], SWEEP, rand[:, j]) for j in range(15)], 1)
    assert (twin != codes).sum() <= codes.size // 500
    boundary = 0
    for i, p in enumerate(SWEEP):
        if 0 < p.top_k < 2048:
            assert ranks[i].max() < p.top_k
        packed = sampler.pack(p, 15)
        order, filtered = sampler.filter_sorted(logits[i], packed["temperature"], packed["top_k"], packed["top_p"])
        ours = np.zeros((15, 2048), np.float32)
        e = np.exp(filtered - filtered[:, :1])
        np.put_along_axis(ours, order, e / e.sum(-1, keepdims=True), -1)
        for j in range(0, 15, 4):
            hf, on_boundary = _hf_probs(logits[i, j], p)
            if on_boundary:
                boundary += 1
                continue
            np.testing.assert_array_equal(ours[j] > 0, hf > 0)
            np.testing.assert_allclose(ours[j], hf, atol=1e-6)
            assert hf[codes[i, j]] > 0
    assert boundary <= 2


def test_sampling_frequencies_match_probabilities(setup):
    n, p = 1500, SamplingParams(1.3, 20, 0.9)
    hidden, code0, _ = _frames(setup, 1, seed=10)
    _, _, logits = _run(setup, hidden, code0, GREEDY, np.zeros((1, 15), np.float32))
    probs, _ = _hf_probs(logits[0, 0], p)  # codebook 1 depends on hidden and code0 only
    rand = np.random.default_rng(11).random((n, 15), dtype=np.float32)
    codes = setup.predictor.predict(np.repeat(hidden, n, 0), np.repeat(code0, n), p, rand=rand).codes[:, 0]
    freq = np.bincount(codes, minlength=2048) / n
    assert freq[probs == 0].sum() == 0 and (probs > 0).sum() > 3
    assert (np.abs(freq - probs) <= 5 * np.sqrt(probs * (1 - probs) / n) + 1e-9).all()


def test_sampler_graph_ties_and_edges(tmp_path):
    """Tied logits (kept at the top-k cut, drawn lower id first), k >= vocab, top_p 0, rand near 1."""
    vocab, n = 300, 600
    save_model(build_sampler(vocab), tmp_path / "sampler.onnx")
    session = make_session(tmp_path / "sampler.onnx", threads=1)
    rng = np.random.default_rng(13)
    logits = (np.round(rng.standard_normal((n, vocab)) * 2) / 2).astype(np.float32)  # many exact ties
    grid = [SamplingParams(t, k, p, g) for t in (0.7, 1.0) for k in (0, 1, 5, 40, 300, 999)
            for p in (1.0, 0.6, 0.0) for g in (False, True)]
    params = [grid[i % len(grid)] for i in range(n)]
    rand = rng.random(n, dtype=np.float32)
    rand[::7] = np.nextafter(np.float32(1), np.float32(0))
    code = session.run(None, {"logits": logits, "rand": rand, **sampler.pack(params)})[0]
    np.testing.assert_array_equal(code, sampler.sample(logits, params, rand))
    for i, p in enumerate(params):
        if p.greedy:
            assert code[i] == logits[i].argmax()  # the first of the tied maxima, as torch
        elif p.top_k == 1 or p.top_p == 0.0:
            assert logits[i, code[i]] == logits[i].max()  # any of the tied maxima
        elif p.top_p == 1.0:  # HF keeps every tie at the k-th logit; no top-p boundary ambiguity
            hf, _ = _hf_probs(logits[i], p)
            assert hf[code[i]] > 0
            packed = sampler.pack(p, 1)
            order, filtered = sampler.filter_sorted(logits[i:i + 1], packed["temperature"], packed["top_k"],
                                                    packed["top_p"])
            np.testing.assert_array_equal(np.sort(order[0][np.isfinite(filtered[0])]), np.flatnonzero(hf > 0))


def test_sampling_params_from_generation_config():
    gen = {"do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0, "subtalker_dosample": False,
           "subtalker_temperature": 0.7, "subtalker_top_k": 20, "subtalker_top_p": 0.8}
    assert SamplingParams.from_generation_config(gen) == SamplingParams(0.9, 50, 1.0, False)
    assert SamplingParams.from_generation_config(gen, "subtalker_") == SamplingParams(0.7, 20, 0.8, True)
    with pytest.raises(ValueError):
        SamplingParams(temperature=0.0)
    assert SamplingParams(temperature=0.0, greedy=True).greedy


@pytest.mark.parametrize("precision,max_rel_rms", [("int8", 0.05), ("int4", 0.4)])
def test_quantized_code_predictor_agreement(converted_factory, precision, max_rel_rms, record_property):
    """MatMulNBits code predictors are not exact: report greedy agreement with fp32 and bound the
    logit error (the converter's self-check measured it against the source weights too)."""
    from qwen3_tts_gguf.model.manifest import load_manifest
    from qwen3_tts_gguf.model.predictor import CodePredictor
    from qwen3_tts_gguf.model.sampler import pack

    fp32 = CodePredictor(converted_factory("tiny_cv", "f32") / "code_predictor.onnx", threads=1)
    folder = converted_factory("tiny_cv", "f32", precision)
    assert load_manifest(folder).code_predictor["precision"] == precision
    quant = CodePredictor(folder / "code_predictor.onnx", threads=1)
    rng = np.random.default_rng(3)
    rows = 16
    feeds = {"hidden": rng.standard_normal((rows, fp32.hidden_size)).astype(np.float32),
             "code0": rng.integers(0, 2048, rows), "rand": np.zeros((rows, 15), np.float32),
             **pack(SamplingParams(greedy=True), rows)}
    ref_logits, ref_codes = fp32.session.run(["logits", "codes"], feeds)
    logits, codes = quant.session.run(["logits", "codes"], feeds)
    # step 0 (codebook 1) sees the same inputs in both; later steps feed back their own choices
    logits, ref_logits = logits[:, 0], ref_logits[:, 0]
    rel_rms = float(np.sqrt(np.mean((logits - ref_logits) ** 2)) / np.sqrt(np.mean(ref_logits ** 2)))
    agreement = float((codes[:, 0] == ref_codes[:, 0]).mean())
    record_property(f"{precision}_logit_rel_rms", rel_rms)
    record_property(f"{precision}_codebook1_greedy_agreement", agreement)
    print(f"{precision}: logits rel RMS {rel_rms:.4f}, codebook-1 greedy agreement {agreement:.2f}")
    assert rel_rms < max_rel_rms


def test_quantized_code_predictor_block_size(setup):
    """Every MatMulNBits takes the asked weights per scale (default `CP_BLOCK_SIZE`), written in the graph's
    metadata; a size ONNX Runtime's kernels do not take is refused."""
    from qwen3_tts_gguf.convert.predictor_graph import quantize_code_predictor
    from qwen3_tts_gguf.convert.presets import CP_BLOCK_SIZE

    def blocks(model) -> set[int]:
        return {a.i for n in model.graph.node if n.op_type == "MatMulNBits"
                for a in n.attribute if a.name == "block_size"}

    default = quantize_code_predictor(build_code_predictor(setup.ckpt), "int8")
    assert CP_BLOCK_SIZE == 128 and blocks(default) == {128}
    narrow = quantize_code_predictor(build_code_predictor(setup.ckpt), "int4", 32)
    assert blocks(narrow) == {32}
    assert {p.key: p.value for p in narrow.metadata_props}.items() >= {"precision": "int4", "block_size": "32"}.items()
    with pytest.raises(ValueError, match="block size"):
        quantize_code_predictor(build_code_predictor(setup.ckpt), "int8", 48)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_graphs_of_one_code_predictor_are_quantized_once_as_each_alone(setup, precision, monkeypatch):
    """The converter's two graphs (portable, CPU) quantized together, each weight once: every graph equals
    the one ONNX Runtime's quantizer makes of it alone, node by node (names too) and initializer by
    initializer; fp32 leaves them as they are."""
    from qwen3_tts_gguf.convert.predictor_graph import quantize_code_predictor, quantize_code_predictors

    def build():
        return [build_code_predictor(setup.ckpt), build_code_predictor(setup.ckpt, attention="standard")]

    def parts(model):
        nodes = sorted((n.name, n.op_type, tuple(n.input), tuple(n.output),
                        tuple(sorted(a.SerializeToString() for a in n.attribute))) for n in model.graph.node)
        return nodes, {t.name: t.SerializeToString() for t in model.graph.initializer}, \
            [(m.key, m.value) for m in model.metadata_props], sorted((o.domain, o.version) for o in model.opset_import)

    from qwen3_tts_gguf.convert import predictor_graph

    def weight_matmuls(model) -> int:
        weights = {t.name for t in model.graph.initializer}
        return sum(n.op_type == "MatMul" and n.input[1] in weights for n in model.graph.node)

    left = []  # constant-weight MatMuls each graph still had when it reached the quantizer

    def spy(model, *args):
        left.append(weight_matmuls(model))
        return quantize_code_predictor(model, *args)

    monkeypatch.setattr(predictor_graph, "quantize_code_predictor", spy)
    together = quantize_code_predictors(build(), precision)
    monkeypatch.undo()
    assert left[0] > 0 and left[1:] == [0]  # the CPU graph's weights were all quantized already
    alone = [quantize_code_predictor(g, precision) for g in build()]
    assert [parts(m) for m in together] == [parts(m) for m in alone]
    assert {"MatMulNBits", "Attention"} <= {n.op_type for n in together[1].graph.node}
    assert weight_matmuls(together[1]) == 0
    fp32 = build()
    assert quantize_code_predictors(fp32, "fp32") == fp32


def test_quantized_code_predictor_keeps_its_tables_in_float16(setup, tmp_path):
    """A quantized graph stores its embedding tables in float16 (half their resident pages): no float32
    table is left, and the frame embedding (tables only, when the codes are forced) is the official one
    within float16 rounding, exactly for a bfloat16 checkpoint."""
    import onnx

    from qwen3_tts_gguf.convert.predictor_graph import quantize_code_predictor

    int8 = quantize_code_predictor(build_code_predictor(setup.ckpt, teacher_forced=True), "int8")
    weights = {t.name: t.data_type for t in int8.graph.initializer}
    tables = [n.input[0] for n in int8.graph.node if n.op_type == "Gather" and n.input[0] in weights]
    assert len(tables) == 16 and {weights[t] for t in tables} == {onnx.TensorProto.FLOAT16}
    save_model(int8, tmp_path / "cp_tf_int8.onnx")
    hidden, code0, forced = _frames(setup, 4, seed=5)
    feeds = {"hidden": hidden, "code0": code0, "rand": np.zeros((4, 15), np.float32), "forced_codes": forced,
             **sampler.pack(GREEDY, 4)}
    frame = make_session(tmp_path / "cp_tf_int8.onnx", threads=2).run(["frame_embedding"], feeds)[0]
    want = _official_frame_embedding(setup.talker, code0, forced)
    assert frame.dtype == np.float32
    np.testing.assert_allclose(frame, want, rtol=0, atol=16 * 2.0 ** -11 * np.abs(want).max())
    # bfloat16 checkpoints' values (the released ones are bfloat16) are float16 values at these magnitudes
    bf16 = setup.ckpt.weights.dtype_of("talker.model.codec_embedding.weight") == "BF16"
    assert np.array_equal(frame, want) == bf16


def test_weights_that_read_the_same_rows_are_one_matmul(setup):
    """q, k, v and gate, up each read one normed input: one MatMul (one MatMulNBits quantized) per group,
    so no two weight MatMuls share an input (their activation would be quantized twice)."""
    from qwen3_tts_gguf.convert.predictor_graph import ROPE_NODE, quantize_code_predictor

    fp32 = build_code_predictor(setup.ckpt)
    layers = setup.ckpt.config.code_predictor.num_layers
    fused = {t.name for t in fp32.graph.initializer if t.name.endswith(("qkv_proj.weight", "gate_up_proj.weight"))}
    assert len(fused) == 2 * layers
    int8 = quantize_code_predictor(build_code_predictor(setup.ckpt), "int8")  # (quantizes in place)
    for model, op in ((fp32, "MatMul"), (int8, "MatMulNBits")):
        weights = {t.name for t in model.graph.initializer}
        inputs = [n.input[0] for n in model.graph.node
                  if n.op_type == op and n.input[1] in weights and not n.name.startswith(ROPE_NODE)]
        assert len(inputs) == len(set(inputs)) > 0


@pytest.mark.parametrize("attention, op, domain, opset", [("gqa", "GroupQueryAttention", "com.microsoft", 17),
                                                         ("standard", "Attention", "", 23)])
def test_fused_attention_graphs_equal_the_default(setup, tmp_path, attention, op, domain, opset):
    """`attention="gqa"` / `"standard"` (bench.experiments graphs): one GroupQueryAttention node, or one
    opset-23 Attention, per layer and step in place of the MatMul chain; the same teacher-forced logits as
    the official code predictor, batch and steps."""
    import onnx

    model = build_code_predictor(setup.ckpt, teacher_forced=True, attention=attention)
    layers = setup.ckpt.config.code_predictor.num_layers
    nodes = [n for n in model.graph.node if n.op_type == op]
    assert len(nodes) == layers * 15
    assert {n.domain for n in nodes} == {domain} and {domain} <= {o.domain for o in model.opset_import}
    assert [o.version for o in model.opset_import if o.domain == ""] == [opset]
    if attention == "standard":  # q and k of every layer and step
        assert sum(n.op_type == "RotaryEmbedding" for n in model.graph.node) == 2 * layers * 15
    onnx.checker.check_model(model)
    save_model(model, tmp_path / "cp_tf.onnx")
    session = make_session(tmp_path / "cp_tf.onnx", threads=2)
    hidden, code0, codes = _frames(setup, 3, seed=11)
    feeds = {"hidden": hidden, "code0": code0, "rand": np.zeros((3, 15), np.float32), "forced_codes": codes,
             **sampler.pack(GREEDY, 3)}
    got_codes, frame, logits = session.run(None, feeds)
    want_codes, want_frame, want_logits = _run_forced(setup, hidden, code0, codes)
    assert np.abs(logits - _official_forced_logits(setup.talker, hidden, code0, codes)).max() < LOGIT_ATOL
    np.testing.assert_allclose(logits, want_logits, atol=5e-5)
    np.testing.assert_array_equal(got_codes, want_codes)
    np.testing.assert_array_equal(frame, want_frame)
    with pytest.raises(ValueError, match="attention"):
        build_code_predictor(setup.ckpt, attention="flash")
