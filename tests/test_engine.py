"""The engine against the official generate: codes frame for frame, audio within tolerance."""

from __future__ import annotations

import time

import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import PromptError, VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings

from tests.llm_text import PAUSE_S, llm_deltas
from tests.reference.runner import official_generate
from tests.waiting import wait_until

FRAMES = 40
# Both sides are fp32 renderings of the same math: PyTorch's own fp32 differs from fp64 by up to
# ~8e-5 on these fixtures and ONNX Runtime's by ~5e-5 (codec-streaming-notes.md), so their peak
# difference reaches ~1.2e-4 on a few samples; the RMS difference stays ~1e-6.
AUDIO_TOL = 2e-4
AUDIO_RMS_TOL = 1e-5
GREEDY = SamplingParams(greedy=True)

CASES = [  # (checkpoint, text, speaker, language, instruct, text_mode)
    ("tiny_cv", "Hello world, this is a parity test.", "ryan", "english", None, "non-streaming"),
    ("tiny_cv", "Hello world, this is a parity test.", "ryan", "english", None, "streaming"),
    ("tiny_cv", "你好，欢迎使用。今天天气很好。", "vivian", "chinese", None, "non-streaming"),
    ("tiny_cv", "你好，我是成都人。", "eric", "auto", None, "streaming"),  # dialect speaker, auto language
    ("tiny_cv", "OpenAI and McDonald's use JavaScript iPhone APIs.", "aiden", "auto", "Speak slowly.", "non-streaming"),
    ("tiny0b6_cv_bf16", "你好，欢迎使用。Hello there.", "serena", "auto", None, "non-streaming"),
    ("tiny_vd", "A designed voice speaks in English.", None, "english", "A calm, low elderly voice.", "non-streaming"),
    ("tiny_vd", "设计的声音。", None, "auto", "Bright young female voice.", "streaming"),
]


def greedy_request(text, speaker=None, language="auto", instruct=None, text_mode=None, frames=FRAMES, **kw):
    return SynthesisRequest(text, VoiceSpec(speaker=speaker, language=language, instruct=instruct),
                            text_mode=text_mode, talker=TalkerSampling(GREEDY), code_predictor=GREEDY,
                            seed=0, max_frames=frames, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def engines(converted_factory):
    opened = {}

    def get(name: str) -> Engine:
        if name not in opened:
            model = LoadedModel(converted_factory(name, "f32"), EngineSettings(deterministic=True, max_streams=8))
            opened[name] = Engine(model).start()
        return opened[name]

    yield get
    for engine in opened.values():
        engine.stop()
        engine.model.close()


def run(engine: Engine, request: SynthesisRequest):
    stream = engine.submit(request)
    chunks = list(stream)
    wav = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.float32)
    return stream.result, chunks, wav


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[3]}-{c[5]}")
def test_codes_and_audio_equal_official_generate(case, engines, checkpoint_factory):
    name, text, speaker, language, instruct, text_mode = case
    result, chunks, wav = run(engines(name), greedy_request(text, speaker, language, instruct, text_mode))
    ref_codes, ref_wav = official_generate(checkpoint_factory(name), text, speaker=speaker, language=language,
                                           instruct=instruct, non_streaming=text_mode == "non-streaming",
                                           frames=FRAMES)
    assert result.finish_reason == "max_frames" and result.frames == FRAMES
    np.testing.assert_array_equal(result.codes, ref_codes)
    assert wav.shape == ref_wav.shape
    assert np.abs(wav - ref_wav).max() < AUDIO_TOL
    assert np.sqrt(np.mean((wav - ref_wav) ** 2)) < AUDIO_RMS_TOL
    # first audio after the first frame, then chunks growing to 8 frames
    assert [c.n_frames for c in chunks][:5] == [1, 2, 4, 8, 8]
    assert sum(c.n_frames for c in chunks) == FRAMES


def test_eight_concurrent_streams_equal_separate_runs(engines):
    """Deterministic profile: batching changes nothing, greedy or sampled, whatever the mix."""
    engine = engines("tiny_cv")
    speakers = ["ryan", "aiden", "serena", "vivian", "sohee", "ono_anna", "uncle_fu", "ryan"]
    requests = [SynthesisRequest(f"Client number {i} says hello.", VoiceSpec(speaker=spk), seed=100 + i,
                                 max_frames=10 + i, ignore_eos=True) for i, spk in enumerate(speakers)]
    requests[0] = greedy_request("Hello world, this is a parity test.", "ryan", "english", frames=18)
    requests[1] = greedy_request("你好，欢迎使用。", "vivian", "chinese", frames=25, text_mode="streaming")
    requests[2] = SynthesisRequest("Another sampled one.", VoiceSpec(speaker="sohee"), seed=9, max_frames=12,
                                   ignore_eos=True, code_predictor=SamplingParams(temperature=0.7, top_k=20, top_p=0.9))
    separate = [run(engine, r)[0].codes for r in requests]
    streams = [engine.submit(r) for r in requests]
    for s in streams:
        list(s)
    for k, (a, s) in enumerate(zip(separate, streams)):
        np.testing.assert_array_equal(a, s.result.codes, err_msg=f"stream {k}")
    assert engine.load()["active"] == 0


def test_same_seed_same_audio_different_seed_differs(engines):
    engine = engines("tiny_cv")
    base = dict(voice=VoiceSpec(speaker="ryan"), max_frames=10, ignore_eos=True)
    a = run(engine, SynthesisRequest("Seeded sampling.", seed=123, **base))[0].codes
    b = run(engine, SynthesisRequest("Seeded sampling.", seed=123, **base))[0].codes
    c = run(engine, SynthesisRequest("Seeded sampling.", seed=124, **base))[0].codes
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_cancel_frees_the_sequence(engines):
    engine = engines("tiny_cv")
    stream = engine.submit(greedy_request("A long one that we stop early.", "ryan", frames=400))
    received = 0
    for chunk in stream:
        received += chunk.n_frames
        if received >= 3:
            stream.cancel()
    assert stream.result.finish_reason == "cancelled"
    assert stream.result.frames < 400
    load = engine.load()
    assert load["active"] == 0 and load["free_slots"] == engine.settings.max_streams
    assert all(engine.model.talker.length(seq) == 0 for seq in range(engine.settings.max_streams))


def test_runaway_budget_ends_a_stream(converted_factory):
    settings = EngineSettings(deterministic=True, max_streams=1, budget_base_frames=5, budget_frames_per_token=1)
    model = LoadedModel(converted_factory("tiny_cv", "f32"), settings)
    with Engine(model) as engine:
        stream = engine.submit(SynthesisRequest("Hi there.", VoiceSpec(speaker="ryan"), seed=1, ignore_eos=True))
        list(stream)
    assert stream.result.finish_reason == "budget"
    assert stream.result.frames == 5 + stream.result.text_tokens
    model.close()


def test_long_input_is_split_into_segments_with_continuous_audio(converted_factory):
    settings = EngineSettings(deterministic=True, max_streams=2, max_segment_chars=40,
                              budget_base_frames=3, budget_frames_per_token=0)
    model = LoadedModel(converted_factory("tiny_cv", "f32"), settings)
    text = "First sentence is here. Second sentence follows it. And a third one ends."
    with Engine(model) as engine:
        stream = engine.submit(SynthesisRequest(text, VoiceSpec(speaker="ryan"), seed=1, ignore_eos=True))
        chunks = list(stream)
    assert len(stream.prompts) == 3
    assert stream.result.frames == 9  # 3 segments x 3 frames
    # one codec state for the whole stream: the audio is the decode of all codes in one go
    wav = np.concatenate([c.samples for c in chunks])
    np.testing.assert_allclose(wav, model.codec.decode_all(stream.result.codes), atol=1e-4)
    model.close()


def test_bad_requests(engines):
    engine = engines("tiny_cv")
    with pytest.raises(PromptError, match="unknown speaker 'nobody'; valid: vivian"):
        engine.submit(greedy_request("Hi", "nobody"))
    with pytest.raises(PromptError, match="unknown language 'elvish'"):
        engine.submit(greedy_request("Hi", "ryan", language="elvish"))
    with pytest.raises(PromptError, match="empty"):
        engine.submit(greedy_request("  ", "ryan"))
    with pytest.raises(PromptError, match="max_frames"):
        engine.submit(greedy_request("Hi", "ryan", frames=0))


def test_text_arriving_in_pieces_gives_the_codes_of_the_whole_text(engines):
    """Streaming text mode: deltas of 1-3 characters (with pauses) equal the text sent at once. More
    frames than text tokens: the live stream then waits for the rest of its text and ends after
    close_text, so it has counted every token (with fewer, it could end while the last one was pending)."""
    engine = engines("tiny_cv")
    text = "OpenAI and McDonald's use JavaScript, on 2026-11-30 at https://x.org today. 你好，欢迎！"
    whole = run(engine, greedy_request(text, "ryan", "english", text_mode="streaming", frames=48))[0]
    assert whole.text_tokens < 48
    stream = engine.open_text_stream(greedy_request("", "ryan", "english", frames=48))
    for delta, pause in llm_deltas(text):
        stream.push_text(delta)
        if pause:
            time.sleep(PAUSE_S)
    stream.close_text()
    list(stream)
    np.testing.assert_array_equal(stream.result.codes, whole.codes)
    assert stream.result.text_tokens == whole.text_tokens


@pytest.mark.parametrize("text", [" Hello there.", "Hello there. Hello there. ", "Hi!\n", " Hi! "])
def test_whitespace_around_the_text_is_spoken_as_the_official_implementation_does(engines, text):
    """The official prompt takes the text as given (no strip): a fixed text keeps its leading and
    trailing whitespace, so it equals the same text arriving live. (Not a leading newline: in the
    official template it merges into the role's own newline token, which live text cannot know.)"""
    engine = engines("tiny_cv")
    whole = run(engine, greedy_request(text, "ryan", "english", text_mode="streaming", frames=24))[0]
    stream = engine.open_text_stream(greedy_request("", "ryan", "english", frames=24))
    stream.push_text(text[:4])
    stream.push_text(text[4:])
    stream.close_text()
    list(stream)
    np.testing.assert_array_equal(stream.result.codes, whole.codes)
    assert whole.text_tokens == len(engine.model.tokenizer.encode(text))


def test_live_text_waits_for_text_and_can_be_cancelled(engines):
    engine = engines("tiny_cv")
    stream = engine.open_text_stream(greedy_request("", "ryan", frames=200))
    stream.push_text("Hello there, ")  # "Hello" and "there," are final; " " is the open tail
    import time

    time.sleep(0.3)
    # with 3 tokens committed (role excluded) the stream made at most 2 frames, then waited
    assert engine.stats["frames"] >= 0
    assert engine.load()["active"] == 1
    stream.cancel()
    list(stream)
    assert stream.result.finish_reason == "cancelled"
    assert engine.load()["active"] == 0


def test_live_text_closed_empty_is_an_error(engines):
    engine = engines("tiny_cv")
    stream = engine.open_text_stream(greedy_request("", "ryan"))
    stream.close_text()
    list(stream)
    assert stream.result.finish_reason == "error" and "empty" in stream.result.error


def test_quantized_talker_reports_code_agreement(converted_factory, record_property):
    """q8_0 is not exact: report how many greedy frames agree with the f32 model (not asserted equal)."""
    request = greedy_request("Hello world, this is a parity test.", "ryan", "english", frames=20)
    codes = {}
    for quant in ("f32", "q8_0"):
        model = LoadedModel(converted_factory("tiny_cv", quant), EngineSettings(deterministic=True, max_streams=1))
        with Engine(model) as engine:
            codes[quant] = run(engine, request)[0].codes
        model.close()
    same = (codes["f32"] == codes["q8_0"]).all(axis=1)
    prefix = int(np.argmin(same)) if not same.all() else len(same)
    record_property("q8_0_identical_leading_frames", prefix)
    record_property("q8_0_codebook0_agreement", float((codes["f32"][:, 0] == codes["q8_0"][:, 0]).mean()))
    print(f"q8_0 vs f32: {prefix} identical leading frames of 20")
    assert codes["q8_0"].shape == (20, 16)


@pytest.mark.parametrize("name", ["tiny_base", "tiny0b6_base"])
@pytest.mark.parametrize("mode", ["icl", "xvector"])
def test_voice_clone_codes_and_audio_equal_official(name, mode, converted_factory, checkpoint_factory):
    """Base models: codes equal generate_voice_clone; ICL audio equals the official decode of
    reference + generated codes with exactly n_ref x 1920 samples removed."""
    from qwen3_tts_gguf.model.prompt import ReferencePrompt

    from tests.reference.runner import clone_prompt, official_decode

    model = LoadedModel(converted_factory(name, "f32"), EngineSettings(deterministic=True, max_streams=2))
    rng = np.random.default_rng(11)
    xvector = rng.standard_normal(model.tables.hidden_size).astype(np.float32)
    ref_codes = rng.integers(0, 2048, (9, 16))
    ref_text = "What the reference clip says."
    reference = ReferencePrompt(ref_text, ref_codes) if mode == "icl" else None
    text = "Hello, this is my cloned voice."
    request = SynthesisRequest(text, VoiceSpec(speaker_embedding=xvector, language="english", reference=reference),
                               talker=TalkerSampling(GREEDY), code_predictor=GREEDY, max_frames=24, ignore_eos=True)
    with Engine(model) as engine:
        result, chunks, wav = run(engine, request)
    model.close()
    clone = clone_prompt(xvector, ref_text, ref_codes) if mode == "icl" else clone_prompt(xvector)
    ref_out, _ = official_generate(checkpoint_factory(name), text, language="english", non_streaming=False,
                                   frames=24, clone=clone)
    np.testing.assert_array_equal(result.codes, ref_out)
    full = official_decode(checkpoint_factory(name), np.concatenate([ref_codes, ref_out]) if reference else ref_out)
    expected = full[len(ref_codes) * 1920:] if reference else full
    assert wav.shape == expected.shape
    assert np.abs(wav - expected).max() < AUDIO_TOL


def test_voice_prefix_is_cached_and_reused(converted_factory):
    """Fast profile (shared KV cache): a voice's prefix is prefilled once and copied into later
    streams; the result equals a run without the cache (greedy codes)."""
    folder = converted_factory("tiny_cv", "f32")
    requests = [greedy_request("Hello world, this is a parity test.", "ryan", "english", frames=12),
                greedy_request("A different text with the same voice.", "ryan", "english", frames=12),
                greedy_request("你好，欢迎使用。", "ryan", "english", frames=12, text_mode="streaming")]
    results = {}
    for slots in (0, 4):
        model = LoadedModel(folder, EngineSettings(max_streams=2, prefix_cache=slots))
        with Engine(model) as engine:
            results[slots] = [run(engine, r)[0].codes for r in requests]
            hits = engine.stats["prefix_hits"]
            live = engine.open_text_stream(greedy_request("", "ryan", "english", frames=12))
            live.push_text("Hello world, this is a parity test.")
            live.close_text()
            list(live)
            assert engine.stats["prefix_hits"] == hits + (1 if slots else 0)
            engine.clear_prefix_cache()  # the next request prefills its prefix again, same codes
            again = run(engine, requests[0])[0].codes
            assert engine.stats["prefix_hits"] == hits + (1 if slots else 0)
            np.testing.assert_array_equal(again, results[slots][0])
        model.close()
        assert hits == (2 if slots else 0)
    for a, b in zip(results[0], results[4]):
        np.testing.assert_array_equal(a, b)


def test_live_text_with_an_in_context_clone_equals_the_whole_text(converted_factory):
    """ICL voices in streaming text mode: the stream starts once the reference rows are paired
    with text (or at close), and deltas give the codes of the whole text at once."""
    from qwen3_tts_gguf.model.prompt import ReferencePrompt

    model = LoadedModel(converted_factory("tiny_base", "f32"), EngineSettings(deterministic=True, max_streams=2))
    rng = np.random.default_rng(5)
    xvector = rng.standard_normal(model.tables.hidden_size).astype(np.float32)
    cases = [("Hi.", rng.integers(0, 2048, (12, 16))),  # text shorter than the reference: starts at close
             ("This text is clearly longer than the short reference clip here, so it starts early.",
              rng.integers(0, 2048, (3, 16)))]
    with Engine(model) as engine:
        for text, ref_codes in cases:
            voice = VoiceSpec(speaker_embedding=xvector, language="english",
                              reference=ReferencePrompt("The reference says this.", ref_codes))
            req = SynthesisRequest(text, voice, text_mode="streaming", talker=TalkerSampling(GREEDY),
                                   code_predictor=GREEDY, max_frames=14, ignore_eos=True)
            whole = run(engine, req)[0]
            live = engine.open_text_stream(req)
            for i in range(0, len(text), 2):
                live.push_text(text[i:i + 2])
            live.close_text()
            list(live)
            np.testing.assert_array_equal(live.result.codes, whole.codes)
    model.close()


def test_a_live_stream_waiting_for_words_has_its_voice_prefix_prefilled(converted_factory):
    """Fast profile: while a live stream waits for its first words the engine prefills its voice
    prefix into the prefix cache; the words then hit it, and the codes equal a run without the cache."""
    folder = converted_factory("tiny_cv", "f32")
    text = "Hello world, this is a parity test."
    codes = {}
    for slots in (0, 4):
        model = LoadedModel(folder, EngineSettings(max_streams=2, prefix_cache=slots))
        with Engine(model) as engine:
            live = engine.open_text_stream(greedy_request("", "ryan", "english", frames=12))
            if slots:
                wait_until(lambda: engine.stats["prefixes_warmed"] == 1, "the voice prefix prefilled")
            assert engine.stats["prefix_hits"] == 0
            live.push_text(text)
            live.close_text()
            list(live)
            assert engine.stats["prefix_hits"] == (1 if slots else 0)
            assert engine.stats["prefixes_warmed"] == (1 if slots else 0)
            codes[slots] = live.result.codes
            again = engine.open_text_stream(greedy_request("", "ryan", "english", frames=12))  # cached already
            again.push_text(text)
            again.close_text()
            list(again)
            assert engine.stats["prefixes_warmed"] == (1 if slots else 0)
        model.close()
    np.testing.assert_array_equal(codes[0], codes[4])


def test_waiting_live_streams_warm_no_more_prefixes_than_the_cache_holds(converted_factory):
    model = LoadedModel(converted_factory("tiny_cv", "f32"), EngineSettings(max_streams=2, prefix_cache=1))
    with Engine(model) as engine:
        with engine._wake:  # (reentrant) the worker sees both streams waiting at once
            waiting = [engine.open_text_stream(greedy_request("", speaker, "english", frames=4))
                       for speaker in ("ryan", "vivian")]
        wait_until(lambda: engine.stats["prefixes_warmed"] == 1, "one voice prefix prefilled")
        for stream in waiting:
            stream.push_text("Hello there.")
            stream.close_text()
            list(stream)
        assert engine.stats["prefixes_warmed"] == 1 and engine.stats["prefix_hits"] == 1
    model.close()


def test_an_idle_engine_gives_the_freed_heap_back_once(converted_factory, monkeypatch):
    """Once the last stream is done (and the overlapped codec's last call) and the engine has stayed idle
    for a while, it trims the heap: once per busy spell, not while streams run, not again while idle."""
    from qwen3_tts_gguf.engine import scheduler
    from qwen3_tts_gguf.host import heap

    monkeypatch.setattr(scheduler, "IDLE_TRIM_S", 0.3)
    model = LoadedModel(converted_factory("tiny_cv", "f32"), EngineSettings(max_streams=2, threads=2))
    assert model.codec_overlap
    trims = []
    with Engine(model) as engine:
        monkeypatch.setattr(heap, "release_freed_heap",
                            lambda: trims.append((len(engine.admission.active), engine.stats["streams_done"])))
        for n in (1, 2):
            stream = engine.submit(greedy_request("Hello world, this is a parity test.", "ryan", "english", frames=8))
            assert len(list(stream)) > 0
            wait_until(lambda: len(trims) == n, "the heap given back")
            assert trims[-1] == (0, n)
        time.sleep(1.0)  # idle past IDLE_TRIM_S again: the worker woke several times more
        assert len(trims) == 2
    model.close()


def test_the_largest_chunk_is_due_before_a_stream_stops_for_its_codec(converted_factory):
    """A stream with MAX_CHUNK_FRAMES frames waiting for the codec steps no more: its chunk must be due then."""
    from concurrent.futures import ThreadPoolExecutor

    from qwen3_tts_gguf.model.settings import MAX_CHUNK_FRAMES

    settings = EngineSettings(deterministic=True, max_streams=1, threads=1, chunk_frames=(MAX_CHUNK_FRAMES,))
    model = LoadedModel(converted_factory("tiny_cv", "f32"), settings)
    with Engine(model) as engine, ThreadPoolExecutor(1) as pool:
        stream = engine.submit(greedy_request("Hi there.", "ryan", frames=2 * MAX_CHUNK_FRAMES + 3))
        chunks = pool.submit(list, stream).result(timeout=120)
    assert [c.n_frames for c in chunks] == [MAX_CHUNK_FRAMES, MAX_CHUNK_FRAMES, 3]
    model.close()
