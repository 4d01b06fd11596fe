"""The batched code predictor on the project's own ggml graphs (`--cp-runtime ggml`, `ggml/batched_predictor.py`), on
ggml's CPU backend here (lavapipe's Vulkan in tests/test_vulkan_stages.py).

It reads the llama stages file's code predictor, so these tests use the tiny talker with the published codec
(`tiny_realcodec_*`, at the exact preset: f32). What holds: greedy codes equal the official implementation's
(up to a near tie: tests/greedy_agreement.py) and the fp32 ONNX code predictor's, with the same frame
embeddings; sampled codes, given the same uniform draws, equal the ONNX graph's draws (the same sampler
semantics); a row's codes are the same alone or beside other rows, and seeded streams through the engine
reproduce alone and beside others (a seed means the same audio); a failed call ends its streams alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.ggml.batched_predictor import GgmlCodePredictor
from qwen3_tts_gguf.ggml.graph import Backend
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.manifest import LLAMA_STAGES_FILE, PREDICTOR_FILE, ModelFolderError, load_manifest
from qwen3_tts_gguf.model.predictor import CodePredictor
from qwen3_tts_gguf.model.prompt import ReferencePrompt, VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.model.stage_runtimes import StageRuntimeError

from tests.greedy_agreement import assert_greedy_codes_agree, recording
from tests.reference.runner import clone_prompt, official_generate

FRAMES = 30
GREEDY = SamplingParams(greedy=True)


def greedy_request(text, voice, text_mode=None, frames=FRAMES, **kw) -> SynthesisRequest:
    return SynthesisRequest(text, voice, text_mode=text_mode, talker=TalkerSampling(GREEDY), code_predictor=GREEDY,
                            seed=0, max_frames=frames, ignore_eos=True, **kw)


def speak(engine: Engine, request: SynthesisRequest):
    stream = engine.submit(request)
    wav = np.concatenate([c.samples for c in stream] or [np.zeros(0, np.float32)])
    return stream.result, wav


def open_engine(folder, **settings) -> Engine:
    return Engine(LoadedModel(folder, EngineSettings(**{"max_streams": 4, "threads": 2, **settings}))).start()


CASES = [  # (model, text, voice, text_mode)
    ("cv", "Hello world, this is a parity test.", VoiceSpec(speaker="ryan", language="english"), "non-streaming"),
    ("cv", "Hello world, this is a parity test.", VoiceSpec(speaker="ryan", language="english"), "streaming"),
    ("vd", "A designed voice speaks.", VoiceSpec(language="english", instruct="A calm, low elderly voice."),
     "non-streaming"),
]


def assert_case_equals_official(engine: Engine, case, checkpoint_factory) -> None:
    """A CASES entry spoken greedily: its codes equal the official implementation's (up to a near tie)."""
    kind, text, voice, text_mode = case
    inputs = recording(engine)
    try:
        result, wav = speak(engine, greedy_request(text, voice, text_mode))
    finally:
        del engine.model.predictor.predict
    checkpoint = checkpoint_factory(f"tiny_realcodec_{kind}")
    ref_codes, ref_wav = official_generate(checkpoint, text, speaker=voice.speaker, language=voice.language,
                                           instruct=voice.instruct, non_streaming=text_mode == "non-streaming",
                                           frames=FRAMES)
    assert_greedy_codes_agree(result.codes, ref_codes, inputs, checkpoint)
    assert wav.shape == ref_wav.shape


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


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[3]}")
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


def test_live_text_gives_the_codes_of_the_whole_text(engines):
    engine = engines["cv"]
    voice = VoiceSpec(speaker="ryan", language="english")
    text = "Hello world, this is a parity test."
    whole, _ = speak(engine, greedy_request(text, voice, "streaming"))
    stream = engine.open_text_stream(greedy_request("", voice))
    for piece in ("Hello wo", "rld, this is", " a parity test."):
        stream.push_text(piece)
    stream.close_text()
    list(stream)
    np.testing.assert_array_equal(stream.result.codes, whole.codes)


def test_seeded_sampling_reproduces_alone_and_beside_other_streams(engines):
    engine = engines["cv"]

    def request(seed: int) -> SynthesisRequest:
        return SynthesisRequest("Seeded speech sounds the same.", VoiceSpec(speaker="ryan", language="english"),
                                talker=TalkerSampling(SAMPLED), code_predictor=SAMPLED, seed=seed,
                                max_frames=FRAMES, ignore_eos=True)

    alone = speak(engine, request(5))[0].codes
    assert np.array_equal(speak(engine, request(5))[0].codes, alone)
    # the same seed twice side by side, and another seed beside them
    streams = [engine.submit(request(seed)) for seed in (5, 5, 6)]
    for stream in streams:
        list(stream)
    assert np.array_equal(streams[0].result.codes, alone) and np.array_equal(streams[1].result.codes, alone)
    assert not np.array_equal(streams[2].result.codes, alone)


def test_a_failed_call_ends_its_stream_alone(exact, monkeypatch):
    """The sampled stream's calls fail (the greedy one's go through): it alone ends, as an error."""
    engine = open_engine(exact["cv"], cp_runtime="ggml")
    predictor = engine.model.predictor
    real = predictor._run

    def failing_when_sampled(setting, *args):
        if setting.top_k != 1:
            raise RuntimeError("injected: the ggml graph failed")
        return real(setting, *args)

    monkeypatch.setattr(predictor, "_run", failing_when_sampled)
    try:
        good = greedy_request("A good stream.", VoiceSpec(speaker="ryan"), frames=12)
        bad = SynthesisRequest("A bad stream.", VoiceSpec(speaker="ryan"), talker=TalkerSampling(SAMPLED),
                               code_predictor=SAMPLED, max_frames=12, ignore_eos=True, seed=3)
        streams = [engine.submit(good), engine.submit(bad)]
        for stream in streams:
            list(stream)
        assert streams[0].result.finish_reason == "max_frames" and streams[0].result.frames == 12
        assert streams[1].result.finish_reason == "error" and "code predictor" in streams[1].result.error
    finally:
        engine.stop()
        engine.model.close()


def test_auto_keeps_onnx_on_the_cpu_and_ggml_needs_the_file(exact, converted_factory):
    model = LoadedModel(exact["cv"], EngineSettings(max_streams=1, threads=1))
    try:
        assert (model.runtimes.predictor, model.runtimes.codec) == ("onnxruntime", "onnxruntime")
    finally:
        model.close()
    with pytest.raises(ModelFolderError, match="llama_stages.gguf"):
        LoadedModel(converted_factory("tiny_cv", "f32"), EngineSettings(max_streams=1, cp_runtime="ggml"))
    with pytest.raises(ValueError, match="deterministic"):
        EngineSettings(deterministic=True, codec_runtime="ggml")
    for removed in ("llama", "tensorrt"):  # llama.cpp's own graphs left on 2026-12-06 (docs/gpu.md)
        with pytest.raises(StageRuntimeError):
            EngineSettings(cp_runtime=removed)
