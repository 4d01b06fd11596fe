"""The code predictor and the codec on llama.cpp's own Qwen3-TTS graphs (`--cp-runtime llama`,
`--codec-runtime llama`): the same semantics as the ONNX Runtime stages behind the same interfaces.

llama.cpp hard-codes the codec decoder's shape, so these tests use the tiny talker with the published
codec (`tiny_realcodec_*`). At the exact preset, greedy codes equal the official implementation's up
to a near tie of its float64 logits (then the test shows the tie: `assert_greedy_codes_agree`);
the codec's samples agree with the fp32 ONNX codec to a stated SNR (libmtmd's convolutions round to
f16: about 39.5 dB is its ceiling, docs/gpu.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.model.codec import CodecDecoder
from qwen3_tts_gguf.model.llama_stages import WINDOW, LlamaCodec, LlamaStages
from qwen3_tts_gguf.model.loaded import EngineSettings, LoadedModel
from qwen3_tts_gguf.model.manifest import CODEC_FILE, LLAMA_STAGES_FILE, ModelFolderError
from qwen3_tts_gguf.model.prompt import ReferencePrompt, VoiceSpec
from qwen3_tts_gguf.model.runtimes import StageRuntimeError
from qwen3_tts_gguf.model.sampler import SamplingParams

from tests.conftest import converted_preset
from tests.greedy_agreement import assert_greedy_codes_agree, recording, snr_db
from tests.reference.runner import clone_prompt, official_generate

FRAMES = 30
GREEDY = SamplingParams(greedy=True)
CODEC_SNR_DB = {"exact": 39.0, "fast": 37.0}
"""The llama.cpp codec against the fp32 ONNX codec, per preset: its matrices at f32 (exact, default) or
f16 (fast); measured 39.5 and 37.9 dB on random weights at the published shape."""


def greedy_request(text, voice, text_mode=None, frames=FRAMES, **kw) -> SynthesisRequest:
    return SynthesisRequest(text, voice, text_mode=text_mode, talker=TalkerSampling(GREEDY), code_predictor=GREEDY,
                            seed=0, max_frames=frames, ignore_eos=True, **kw)


def speak(engine: Engine, request: SynthesisRequest):
    stream = engine.submit(request)
    wav = np.concatenate([c.samples for c in stream] or [np.zeros(0, np.float32)])
    return stream.result, wav


def open_engine(folder, **settings) -> Engine:
    return Engine(LoadedModel(folder, EngineSettings(**{"max_streams": 4, "threads": 2, **settings}))).start()


@pytest.fixture(scope="module")
def exact(converted_factory):
    return {kind: converted_factory(f"tiny_realcodec_{kind}", "f32") for kind in ("cv", "vd", "base")}


@pytest.fixture(scope="module")
def cp_engines(exact):
    engines = {kind: open_engine(folder, deterministic=True, cp_runtime="llama") for kind, folder in exact.items()}
    yield engines
    for engine in engines.values():
        engine.stop()
        engine.model.close()


CASES = [  # (model, text, voice, text_mode)
    ("cv", "Hello world, this is a parity test.", VoiceSpec(speaker="ryan", language="english"), "non-streaming"),
    ("cv", "Hello world, this is a parity test.", VoiceSpec(speaker="ryan", language="english"), "streaming"),
    ("vd", "A designed voice speaks.", VoiceSpec(language="english", instruct="A calm, low elderly voice."),
     "non-streaming"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[3]}")
def test_llama_code_predictor_greedy_codes_equal_official(case, cp_engines, checkpoint_factory):
    engine = cp_engines[case[0]]
    assert engine.model.runtimes.predictor == "llama" and engine.model.runtimes.codec == "onnxruntime"
    assert_case_equals_official(engine, case, checkpoint_factory)


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


@pytest.mark.parametrize("mode", ["icl", "xvector"])
def test_llama_code_predictor_greedy_codes_equal_official_for_clones(mode, cp_engines, checkpoint_factory):
    engine = cp_engines["base"]
    rng = np.random.default_rng(11)
    xvector = rng.standard_normal(engine.model.tables.hidden_size).astype(np.float32)
    ref_codes, ref_text = rng.integers(0, 2048, (9, 16)), "What the reference clip says."
    reference = ReferencePrompt(ref_text, ref_codes) if mode == "icl" else None
    text = "Hello, this is my cloned voice."
    voice = VoiceSpec(speaker_embedding=xvector, language="english", reference=reference)
    inputs = recording(engine)
    try:
        result, _ = speak(engine, greedy_request(text, voice, frames=24))
    finally:
        del engine.model.predictor.predict
    clone = clone_prompt(xvector, ref_text, ref_codes) if mode == "icl" else clone_prompt(xvector)
    checkpoint = checkpoint_factory("tiny_realcodec_base")
    want, _ = official_generate(checkpoint, text, language="english", non_streaming=False, frames=24, clone=clone)
    assert_greedy_codes_agree(result.codes, want, inputs, checkpoint)


def test_live_text_on_the_llama_code_predictor_gives_the_codes_of_the_whole_text(cp_engines):
    engine = cp_engines["cv"]
    voice = VoiceSpec(speaker="ryan", language="english")
    text = "Hello world, this is a parity test."
    whole, _ = speak(engine, greedy_request(text, voice, "streaming"))
    stream = engine.open_text_stream(greedy_request("", voice))
    for piece in ("Hello wo", "rld, this is", " a parity test."):
        stream.push_text(piece)
    stream.close_text()
    list(stream)
    np.testing.assert_array_equal(stream.result.codes, whole.codes)


@pytest.mark.parametrize("runtime", ["llama", "ggml"])
def test_seeded_sampling_reproduces_alone_and_beside_other_streams(exact, runtime):
    """On llama.cpp's code_gen and on the project's ggml code predictor (tests/test_ggml_predictor.py)."""
    sampled = SamplingParams(temperature=0.9, top_k=50, top_p=1.0)
    engine = open_engine(exact["cv"], cp_runtime=runtime)
    try:
        def request(seed: int) -> SynthesisRequest:
            return SynthesisRequest("Seeded speech sounds the same.", VoiceSpec(speaker="ryan", language="english"),
                                    talker=TalkerSampling(sampled), code_predictor=sampled, seed=seed,
                                    max_frames=FRAMES, ignore_eos=True)

        alone = speak(engine, request(5))[0].codes
        assert np.array_equal(speak(engine, request(5))[0].codes, alone)
        # the same seed twice side by side (equal seeds at every frame), and another seed beside them
        streams = [engine.submit(request(seed)) for seed in (5, 5, 6)]
        for stream in streams:
            list(stream)
        assert np.array_equal(streams[0].result.codes, alone) and np.array_equal(streams[1].result.codes, alone)
        assert not np.array_equal(streams[2].result.codes, alone)
    finally:
        engine.stop()
        engine.model.close()


def test_a_failed_llama_call_ends_its_stream_alone(exact, monkeypatch):
    """The sampled stream's code_gen calls fail (the greedy one's go through): it alone ends, as an error."""
    engine = open_engine(exact["cv"], cp_runtime="llama")
    stages = engine.model.llama_stages
    real = stages.gen_code

    def failing_when_sampled(hidden, code0, **kw):
        if kw["top_k"] != 1:
            raise RuntimeError("injected: llama.cpp failed")
        return real(hidden, code0, **kw)

    monkeypatch.setattr(stages, "gen_code", failing_when_sampled)
    sampled = SamplingParams(temperature=0.9, top_k=50, top_p=1.0)
    try:
        good = greedy_request("A good stream.", VoiceSpec(speaker="ryan"), frames=12)
        bad = SynthesisRequest("A bad stream.", VoiceSpec(speaker="ryan"), talker=TalkerSampling(sampled),
                               code_predictor=sampled, max_frames=12, ignore_eos=True, seed=3)
        streams = [engine.submit(good), engine.submit(bad)]
        for stream in streams:
            list(stream)
        assert streams[0].result.finish_reason == "max_frames" and streams[0].result.frames == 12
        assert streams[1].result.finish_reason == "error" and "code predictor" in streams[1].result.error
    finally:
        engine.stop()
        engine.model.close()


@pytest.mark.parametrize("preset", ["exact", "fast"])
def test_the_llama_codec_agrees_with_onnx_and_streams_exactly(preset):
    """Samples against the fp32 ONNX codec as an SNR per precision; any chunking equals one whole decode
    (bit for bit), across the 72-frame windows."""
    folder = converted_preset("tiny_realcodec_cv", preset)
    stages = LlamaStages(folder / LLAMA_STAGES_FILE, threads=2)
    try:
        codec = LlamaCodec(stages)
        codes = np.random.default_rng(2).integers(0, 2048, (WINDOW + 2, 16))
        whole = codec.decode_all(codes)
        reference = CodecDecoder(folder / CODEC_FILE, threads=2).decode_all(codes)
        assert whole.shape == reference.shape
        assert snr_db(reference, whole) > CODEC_SNR_DB[preset]
        if preset == "exact":  # (a call is a whole window: seconds on a CPU; one preset shows the chunking)
            first, state = codec.decode(codes[:1])
            rest, state = codec.decode(codes[1:], state)  # crosses the window's end
            np.testing.assert_array_equal(np.concatenate([first, rest]), whole)
        with pytest.raises(ValueError):
            stages.gen_wav(codes[:WINDOW + 1], None)  # llama.cpp would abort the process
        with pytest.raises(ValueError):
            codec.decode(codes[:, :15])
    finally:
        stages.close()


def test_auto_keeps_onnx_on_the_cpu_and_llama_needs_the_file(exact, converted_factory):
    model = LoadedModel(exact["cv"], EngineSettings(max_streams=1, threads=1))
    try:
        assert (model.runtimes.predictor, model.runtimes.codec) == ("onnxruntime", "onnxruntime")
    finally:
        model.close()
    with pytest.raises(ModelFolderError, match="has no llama_stages.gguf"):
        LoadedModel(converted_factory("tiny_cv", "f32"), EngineSettings(max_streams=1, cp_runtime="llama"))
    with pytest.raises(ValueError, match="deterministic"):
        EngineSettings(deterministic=True, codec_runtime="llama")
    with pytest.raises(StageRuntimeError):
        EngineSettings(cp_runtime="tensorrt")
