"""Faults stay in their stream; the worker is supervised; KV capacity is checked; readers that lag
pause their stream instead of buffering without end. Deterministic profile: a stream's numbers do
not depend on its neighbours, so "the others are untouched" is an exact comparison."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.engine.scheduler import Engine, EngineBusy, EngineStopped
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import ContextLengthExceeded, PromptError, VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.model.talker import TalkerError

from tests.waiting import wait_until

SAMPLED = SamplingParams(temperature=0.9, top_k=50)
TEXTS = ["The first stream speaks calmly.", "A second stream says something else.",
         "Third one. It has two sentences."]
SPEAKERS = ["ryan", "aiden", "serena"]


def request(k: int, frames: int = 24, **kw) -> SynthesisRequest:
    # each request gets its own sampling objects, so a fault can be aimed at one of them by identity
    return SynthesisRequest(TEXTS[k], VoiceSpec(speaker=SPEAKERS[k]), talker=TalkerSampling(replace(SAMPLED)),
                            code_predictor=replace(SAMPLED), seed=100 + k, max_frames=frames, ignore_eos=True, **kw)


STREAM_END_TIMEOUT_S = 120.0  # a stream the engine lost fails the test instead of hanging the suite


def collect(stream):
    box: list = []
    reader = threading.Thread(target=lambda: box.append(list(stream)), daemon=True)
    reader.start()
    reader.join(STREAM_END_TIMEOUT_S)
    if reader.is_alive():
        stream.cancel()
        pytest.fail(f"the stream did not end within {STREAM_END_TIMEOUT_S:g} s")
    chunks = box[0]
    wav = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.float32)
    return stream.result, wav




@pytest.fixture(scope="module")
def engine(converted_factory):
    model = LoadedModel(converted_factory("tiny_cv", "f32"),
                        EngineSettings(threads=1, deterministic=True, max_streams=4, max_segment_chars=12,
                                       budget_base_frames=4, budget_frames_per_token=2))  # segments go by fast
    with Engine(model) as started:
        yield started
    model.close()


@pytest.fixture(scope="module")
def solo(engine):
    """Each request's codes and audio when it runs alone."""
    return [collect(engine.submit(request(k))) for k in range(3)]


def active_of(engine: Engine, req: SynthesisRequest):
    return next((a for a in engine.admission.active.values() if a.stream.request is req), None)


def inject(engine: Engine, monkeypatch, stage: str, poisoned: SynthesisRequest) -> None:
    """Make `stage` fail for the poisoned request only (after it has made a few frames)."""
    model = engine.model

    def late(act) -> bool:
        return act is not None and len(act.codes) >= 3

    if stage == "sampler":
        import qwen3_tts_gguf.engine.iteration as iteration
        real = iteration.sample_code0

        def sample(logits, history, step, sampling, rng, **kw):
            if sampling is poisoned.talker and late(active_of(engine, poisoned)):
                raise FloatingPointError("injected: non-finite probabilities")
            return real(logits, history, step, sampling, rng, **kw)

        monkeypatch.setattr(iteration, "sample_code0", sample)
    elif stage == "code predictor":
        real = model.predictor.predict

        def predict(hidden, code0, params, rngs=None, rand=None):
            if any(p is poisoned.code_predictor for p in params) and late(active_of(engine, poisoned)):
                raise RuntimeError("injected: ONNX Runtime failed")
            return real(hidden, code0, params, rngs=rngs, rand=rand)

        monkeypatch.setattr(model.predictor, "predict", predict)
    elif stage == "codec":
        real_emit, real_decode, current = engine.audio.emit_audio, model.codec.decode, []

        def emit(act, frames):
            current[:] = [act]
            return real_emit(act, frames)

        def decode(frames, state=None):
            if current and current[0].stream.request is poisoned and late(current[0]):
                raise ValueError("injected: codes must be < 2048")
            return real_decode(frames, state)

        monkeypatch.setattr(engine.audio, "emit_audio", emit)
        monkeypatch.setattr(model.codec, "decode", decode)
    elif stage == "talker decode":
        real = model.talker.decode

        def decode(items):
            act = active_of(engine, poisoned)
            if late(act) and any(item.seq == act.seq for item in items):
                raise TalkerError("injected: llama_decode failed with code 1")
            return real(items)

        monkeypatch.setattr(model.talker, "decode", decode)
    elif stage == "admission":
        real = engine.admission.reservation

        def reservation(act):
            if act.stream.request is poisoned:
                raise ValueError("injected: its reservation could not be computed")
            return real(act)

        monkeypatch.setattr(engine.admission, "reservation", reservation)
    elif stage == "prompt":
        real = model.prompts.build

        def build(text, voice, text_mode):
            if text.startswith("It has two"):  # the poisoned request's second segment
                raise RuntimeError("injected: prompt build failed")
            return real(text, voice, text_mode)

        monkeypatch.setattr(model.prompts, "build", build)


@pytest.mark.parametrize("stage", ["sampler", "code predictor", "codec", "talker decode", "prompt", "admission"])
def test_a_fault_in_one_stream_ends_that_stream_alone(stage, engine, solo, monkeypatch):
    reqs = [request(k) for k in range(3)]
    poisoned = reqs[2]
    inject(engine, monkeypatch, stage, poisoned)
    streams = [engine.submit(r) for r in reqs]
    results = [collect(s) for s in streams]
    bad, _ = results[2]
    assert bad.finish_reason == "error" and stage in bad.error
    assert "injected" not in bad.error  # the exception's text goes to the log, not to the client
    for (result, wav), (alone, alone_wav) in zip(results[:2], solo[:2]):
        assert result.finish_reason == alone.finish_reason == "max_frames"
        np.testing.assert_array_equal(result.codes, alone.codes)
        np.testing.assert_array_equal(wav, alone_wav)
    monkeypatch.undo()
    wait_until(lambda: engine.load()["active"] == 0, what="an idle engine")
    result, wav = collect(engine.submit(request(2)))  # the engine itself is fine
    np.testing.assert_array_equal(result.codes, solo[2][0].codes)


@pytest.mark.parametrize("broken", ["admit", "make_room"])  # before, and while, a queued request is placed
def test_a_dead_worker_fails_its_requests_and_restarts(engine, solo, monkeypatch, broken):
    real = getattr(engine.admission, broken)
    killed = threading.Event()

    def fail_once(*args):
        if not killed.is_set():
            killed.set()
            raise RuntimeError("injected: the loop itself broke")
        return real(*args)

    monkeypatch.setattr(engine.admission, broken, fail_once)
    result, _ = collect(engine.submit(request(0)))
    assert result.finish_reason == "error" and "retry" in result.error
    wait_until(lambda: engine.health().status == "failed", what="the engine to report its failure")
    assert "stopped unexpectedly" in engine.health().reason
    with pytest.raises(EngineStopped) as refused:
        engine.submit(request(0))
    assert refused.value.retry_after_s  # a retry can cure it: the supervisor restarts the engine
    engine.restart()
    assert engine.health().ok and engine.health().restarts >= 1
    result, wav = collect(engine.submit(request(0)))
    np.testing.assert_array_equal(result.codes, solo[0][0].codes)
    np.testing.assert_array_equal(wav, solo[0][1])


@pytest.mark.parametrize("seed", [-1, 2.5, True, "7"])
def test_a_seed_outside_its_domain_is_refused_at_submit(engine, seed):
    with pytest.raises(PromptError, match="seed"):
        engine.submit(replace(request(0), seed=seed))
    assert engine.health().ok


def test_a_prompt_that_cannot_fit_is_refused_at_submit(engine):
    cells = engine.model.talker.cells_per_stream
    words = " ".join(["word"] * cells)
    with pytest.raises(ContextLengthExceeded, match="context"):
        engine.submit(SynthesisRequest("Hi.", VoiceSpec(speaker="ryan", instruct=words)))
    # tiny_cv takes instructions (1.7B-like): a long voice reference does the same for live text
    with pytest.raises(ContextLengthExceeded):
        engine.open_text_stream(SynthesisRequest("", VoiceSpec(speaker="ryan", instruct=words)))


@pytest.mark.parametrize("max_streams, deterministic, cells, per_stream", [
    (1, False, 2048, 2048), (4, False, 4096, 4096), (4, True, 4096, 1024)])
def test_the_kv_cache_is_sized_from_the_streams_configured(converted_factory, max_streams, deterministic,
                                                           cells, per_stream):
    """No n_ctx given: 1024 cells per stream, at least 2048 (llama.cpp's own context size checked)."""
    model = LoadedModel(converted_factory("tiny_cv", "f32"),
                        EngineSettings(threads=1, max_streams=max_streams, deterministic=deterministic))
    try:
        talker = model.talker
        assert talker._L.llama_n_ctx(talker._ctx) == cells and talker.cells_per_stream == per_stream
    finally:
        model.close()


def test_a_long_input_of_digits_works_through_segments(converted_factory):
    """A segment too long for one stream's context is split again until it fits."""
    model = LoadedModel(converted_factory("tiny_cv", "f32"),
                        EngineSettings(threads=1, deterministic=True, max_streams=8, n_ctx=1024))
    digits = "".join(str(i % 10) for i in range(400))  # 400 tokens, one segment by characters
    try:
        with Engine(model) as engine:
            assert engine.model.talker.cells_per_stream == 128
            stream = engine.submit(replace(request(0, frames=None), text=digits, max_frames=None,
                                           ignore_eos=False))
            assert len(stream.text.prompts[0].rows) < 128 and len(stream.text._segments) > 3
            stream.cancel()
            result, _ = collect(stream)
            assert result.finish_reason == "cancelled"
    finally:
        model.close()


def test_a_large_request_does_not_block_smaller_ones(converted_factory):
    """Shared KV pool: a waiting request too large for the free cells is passed by small ones (a
    bounded number of times), and runs once cells are free."""
    model = LoadedModel(converted_factory("tiny_cv", "f32"),
                        EngineSettings(threads=1, max_streams=4, n_ctx=1024, prefix_cache=0,
                                       budget_base_frames=40, budget_frames_per_token=12))
    try:
        with Engine(model) as engine:
            # holds its cells while we watch (its budget, 40 + 12 per token, outlasts its 10 s backlog)
            first = engine.submit(replace(request(0, frames=400), text=" ".join(["calm"] * 30)))
            next(iter(first))
            big = engine.submit(replace(request(1, frames=None), text=" ".join(["word"] * 70), max_frames=None))
            small = [engine.submit(request(2, frames=4)) for _ in range(3)]
            for stream in small:
                assert collect(stream)[0].finish_reason == "max_frames"
            assert big.result_sent is None and engine.load()["waiting"] == 1  # still waiting, not dropped
            # the running stream's reader is away: it pauses, and the engine waits instead of spinning
            # on a request that cannot fit (an idle engine makes no iterations)
            wait_until(lambda: engine.load()["paused"] == 1, what="the unread stream to pause")
            iterations = engine.stats["iterations"]
            threading.Event().wait(0.3)
            assert engine.load()["waiting"] == 1
            assert engine.stats["iterations"] - iterations <= 2
            first.cancel()
            list(first)
            wait_until(lambda: engine.load()["active"] >= 1 and engine.load()["waiting"] == 0,
                       what="the large request to start")
            big.cancel()
            assert collect(big)[0].finish_reason == "cancelled"
    finally:
        model.close()


def test_an_unread_stream_pauses_with_a_bounded_backlog(converted_factory):
    model = LoadedModel(converted_factory("tiny_cv", "f32"),
                        EngineSettings(threads=1, deterministic=True, max_streams=2, max_buffered_audio_s=1.0))
    try:
        with Engine(model) as engine:
            alone = collect(engine.submit(request(0, frames=60)))
            stream = engine.submit(request(0, frames=60))
            wait_until(lambda: engine.load()["paused"] == 1, what="the unread stream to pause")
            limit = int(1.0 * model.sample_rate)
            made = engine.stats["frames"]
            other = collect(engine.submit(request(1, frames=8)))  # the engine goes on for others
            assert other[0].finish_reason == "max_frames"
            assert engine.stats["frames"] == made + 8 and stream.backlog_samples <= limit + 8 * 1920
            result, wav = collect(stream)  # reading resumes it: complete and exact
            np.testing.assert_array_equal(result.codes, alone[0].codes)
            np.testing.assert_array_equal(wav, alone[1])
    finally:
        model.close()


def test_live_streams_waiting_for_text_do_not_fill_the_queue(converted_factory):
    model = LoadedModel(converted_factory("tiny_cv", "f32"),
                        EngineSettings(threads=1, deterministic=True, max_streams=1, max_pending=1,
                                       max_pending_live=3))
    try:
        with Engine(model) as engine:
            live = [engine.open_text_stream(request(0)) for _ in range(3)]
            with pytest.raises(EngineBusy):
                engine.open_text_stream(request(0))
            assert engine.load()["waiting_text"] == 3 and engine.load()["waiting"] == 0
            assert collect(engine.submit(request(1, frames=4)))[0].finish_reason == "max_frames"
            live[0].push_text("Now it speaks. ")
            live[0].close_text()
            assert collect(live[0])[0].finish_reason == "max_frames"
            for stream in live[1:]:
                stream.cancel()
                assert collect(stream)[0].finish_reason == "cancelled"
            assert engine.load()["waiting_text"] == 0
    finally:
        model.close()


def test_a_live_stream_that_outgrows_the_pool_ends_alone(converted_factory):
    model = LoadedModel(converted_factory("tiny_cv", "f32"),
                        EngineSettings(threads=1, max_streams=2, n_ctx=256, prefix_cache=0,
                                       budget_base_frames=8, budget_frames_per_token=4))
    try:
        with Engine(model) as engine:
            live = engine.open_text_stream(replace(request(0, frames=None), max_frames=None, ignore_eos=True))
            live.push_text(" ".join(["word"] * 200) + " ")
            live.close_text()
            result, _ = collect(live)
            assert result.finish_reason == "context_full"
            assert engine.load()["active"] == 0 and engine.load()["free_slots"] == 2
    finally:
        model.close()


def test_the_overlapped_codec_keeps_faults_and_order_per_stream(converted_factory, monkeypatch):
    """Fast profile on 2 threads, codec calls of one thread: two lanes. A codec failure
    there ends its stream alone (with an error result after its chunks); the other streams' audio,
    chunk by chunk in order, equals one decode of their codes; the three streams' calls use both lanes."""
    model = LoadedModel(converted_factory("tiny_cv", "f32"), EngineSettings(threads=2, max_streams=4, codec_threads=1))
    assert model.codec_overlap and model.codec.session.get_session_options().intra_op_num_threads == 1
    try:
        with Engine(model) as engine:
            assert len(engine.audio.lanes) == 2
            reqs = [request(k, frames=30) for k in range(3)]
            poisoned, real_decode, owner, threads = reqs[1], model.codec.decode, threading.local(), set()
            real_emit = engine.audio.emit_audio

            def emit(act, frames):
                owner.act = act
                return real_emit(act, frames)

            def decode(frames, state=None):
                act = getattr(owner, "act", None)
                if act is not None and act.decoded_frames > 0:  # (a first chunk is decoded on the engine thread)
                    threads.add(threading.current_thread().name)
                if act is not None and act.stream.request is poisoned and act.decoded_frames >= 3:
                    raise ValueError("injected: codec failure")
                return real_decode(frames, state)

            monkeypatch.setattr(engine.audio, "emit_audio", emit)
            monkeypatch.setattr(model.codec, "decode", decode)
            streams = [engine.submit(r) for r in reqs]
            results = [collect(s) for s in streams]
            monkeypatch.undo()
            assert threads == {"qwen3-tts-codec-0_0", "qwen3-tts-codec-1_0"}, threads
            bad, bad_wav = results[1]
            assert bad.finish_reason == "error" and "codec" in bad.error
            assert len(bad_wav) >= 3 * model.codec.samples_per_frame
            for result, wav in (results[0], results[2]):
                assert result.finish_reason == "max_frames" and result.frames == 30
                np.testing.assert_allclose(wav, model.codec.decode_all(result.codes), atol=1e-4)
            wait_until(lambda: engine.load()["active"] == 0, what="an idle engine")
            assert collect(engine.submit(request(1, frames=8)))[0].finish_reason == "max_frames"
    finally:
        model.close()


def test_the_overlapped_codec_failing_on_the_last_chunk_fails_that_stream(converted_factory, monkeypatch):
    """The last audio goes out after the stream's final step (with its result, on the codec thread):
    a failure there still ends that stream with an error, and only that stream."""
    model = LoadedModel(converted_factory("tiny_cv", "f32"), EngineSettings(threads=2, max_streams=2))
    try:
        with Engine(model) as engine:
            reqs = [request(k, frames=20) for k in range(2)]
            real_decode, owner = model.codec.decode, threading.local()
            real_emit = engine.audio.emit_audio

            def emit(act, frames):
                owner.act, owner.last = act, act.decoded_frames + len(frames) >= 20
                return real_emit(act, frames)

            def decode(frames, state=None):
                if owner.act.stream.request is reqs[0] and owner.last:
                    raise ValueError("injected: the last chunk fails")
                return real_decode(frames, state)

            monkeypatch.setattr(engine.audio, "emit_audio", emit)
            monkeypatch.setattr(model.codec, "decode", decode)
            results = [collect(s) for s in [engine.submit(r) for r in reqs]]
            assert results[0][0].finish_reason == "error" and "codec" in results[0][0].error
            assert len(results[0][1]) < 20 * model.codec.samples_per_frame
            assert results[1][0].finish_reason == "max_frames"
            assert len(results[1][1]) == 20 * model.codec.samples_per_frame
    finally:
        model.close()
