"""The batched code predictor on the project's own ggml graphs (`--cp-runtime ggml`, `ggml/predictor.py`), on
ggml's CPU backend here (lavapipe's Vulkan in tests/test_vulkan_stages.py).

It reads the llama stages file's code predictor, so these tests use the tiny talker with the published codec
(`tiny_realcodec_*`, at the exact preset: f32). What holds: greedy codes equal the official implementation's
(up to a near tie: tests/greedy_agreement.py) and the fp32 ONNX code predictor's, with the same frame
embeddings; sampled codes, given the same uniform draws, equal the ONNX graph's draws (the same sampler
semantics); a row's codes are the same alone or beside other rows (a seed means the same audio; seeded
streams through the engine: tests/test_llama_stages.py, `test_seeded_sampling_reproduces_...[ggml]`).
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.ggml.graph import Backend
from qwen3_tts_gguf.ggml.predictor import GgmlCodePredictor
from qwen3_tts_gguf.model.manifest import LLAMA_STAGES_FILE, PREDICTOR_FILE, load_manifest
from qwen3_tts_gguf.model.predictor import CodePredictor
from qwen3_tts_gguf.model.prompt import ReferencePrompt, VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams

from tests.greedy_agreement import assert_greedy_codes_agree, recording
from tests.reference.runner import clone_prompt, official_generate
from tests.test_llama_stages import CASES, assert_case_equals_official, greedy_request, open_engine, speak

SAMPLED = SamplingParams(temperature=0.9, top_k=50, top_p=1.0)


@pytest.fixture(scope="module")
def exact(converted_factory):
    return {kind: converted_factory(f"tiny_realcodec_{kind}", "f32") for kind in ("cv", "vd", "base")}


@pytest.fixture(scope="module")
def engines(exact):
    engines = {kind: open_engine(folder, cp_runtime="ggml") for kind, folder in exact.items()}
    yield engines
    for engine in engines.values():
        engine.stop()
        engine.model.close()


@pytest.fixture(scope="module")
def predictors(exact):
    """The ggml code predictor and the fp32 ONNX one of the same checkpoint."""
    folder = exact["cv"]
    backend = Backend(threads=2)
    ggml = GgmlCodePredictor(folder / LLAMA_STAGES_FILE, backend,
                             temperature=load_manifest(folder).llama_stages["temperature"])
    yield ggml, CodePredictor(folder / PREDICTOR_FILE, threads=2)
    ggml.close()
    backend.close()


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=lambda c: f"{c[0]}-{c[3]}")
def test_greedy_codes_equal_official(case, engines, checkpoint_factory):
    engine = engines[case[0]]
    assert (engine.model.runtimes.predictor, engine.model.runtimes.codec) == ("ggml", "onnxruntime")
    assert_case_equals_official(engine, case, checkpoint_factory)


def test_greedy_codes_of_a_clone_equal_official(engines, checkpoint_factory):
    engine = engines["base"]
    rng = np.random.default_rng(11)
    xvector = rng.standard_normal(engine.model.tables.hidden_size).astype(np.float32)
    ref_codes, ref_text = rng.integers(0, 2048, (9, 16)), "What the reference clip says."
    text = "Hello, this is my cloned voice."
    voice = VoiceSpec(speaker_embedding=xvector, language="english", reference=ReferencePrompt(ref_text, ref_codes))
    inputs = recording(engine)
    try:
        result, _ = speak(engine, greedy_request(text, voice, frames=24))
    finally:
        del engine.model.predictor.predict
    checkpoint = checkpoint_factory("tiny_realcodec_base")
    want, _ = official_generate(checkpoint, text, language="english", non_streaming=False, frames=24,
                                clone=clone_prompt(xvector, ref_text, ref_codes))
    assert_greedy_codes_agree(result.codes, want, inputs, checkpoint)


def test_the_same_frames_as_the_onnx_code_predictor(predictors):
    """Greedy: codes and frame embeddings equal; sampled with the same draws: the same codes (measured 90 of
    90 rows' codes equal, 2026-12-06; an inverse-CDF draw may land on the other side of a boundary that fp32
    rounding moves)."""
    ggml, onnx = predictors
    rng = np.random.default_rng(4)
    hidden = rng.standard_normal((6, ggml.hidden_size)).astype(np.float32)
    code0 = rng.integers(0, 2048, 6)
    rand = rng.random((6, 15), dtype=np.float32)
    greedy = SamplingParams(greedy=True)
    want, got = onnx.predict(hidden, code0, greedy, rand=rand), ggml.predict(hidden, code0, greedy, rand=rand)
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_allclose(got.frame_embedding, want.frame_embedding, rtol=0, atol=1e-5)
    want, got = onnx.predict(hidden, code0, SAMPLED, rand=rand), ggml.predict(hidden, code0, SAMPLED, rand=rand)
    assert (got.codes == want.codes).mean() >= 0.95


def test_a_row_is_the_same_alone_and_beside_others(predictors):
    ggml, _ = predictors
    rng = np.random.default_rng(5)
    hidden = rng.standard_normal((7, ggml.hidden_size)).astype(np.float32)
    code0 = rng.integers(0, 2048, 7)
    rand = rng.random((7, 15), dtype=np.float32)
    params = [SAMPLED, SamplingParams(greedy=True), SAMPLED, SAMPLED, SamplingParams(greedy=True), SAMPLED, SAMPLED]
    together = ggml.predict(hidden, code0, params, rand=rand)
    for i in range(7):
        alone = ggml.predict(hidden[i:i + 1], code0[i:i + 1], params[i], rand=rand[i:i + 1])
        np.testing.assert_array_equal(alone.codes[0], together.codes[i])
        np.testing.assert_array_equal(alone.frame_embedding[0], together.frame_embedding[i])


def test_inputs_ggml_could_not_take_are_refused_before_the_call(predictors):
    ggml, _ = predictors
    hidden = np.zeros((2, ggml.hidden_size), np.float32)
    bad_hidden = hidden.copy()
    bad_hidden[1, 3] = np.nan
    for args in ((bad_hidden, [1, 2]), (hidden, [1, 1 << 20]), (hidden, [-1, 2]), (hidden[:, :5], [1, 2]),
                 (hidden[:0], [])):
        with pytest.raises(ValueError):
            ggml.predict(*args, SamplingParams(greedy=True), rand=np.zeros((len(args[0]), 15), np.float32))
    for rand in (np.full((2, 15), np.nan, np.float32), np.full((2, 15), 1.0, np.float32)):
        with pytest.raises(ValueError, match="uniform"):
            ggml.predict(hidden, [1, 2], SamplingParams(greedy=True), rand=rand)
