"""A seeded request that runs alone gives the same codes and the same audio bytes every time in the
fast profile (codec overlapped on 2 threads, q8_0 KV cache, prefix cache, adaptive chunks), whatever
ran before it and whatever the timing; in the parity profile (`--deterministic`) also whatever runs
beside it (api/README.md, *Reproducibility*)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.settings import EngineSettings

from tests.ws_helpers import loaded_registry, serve

FRAMES = 300
TEXT = ("The quick brown fox jumps over the lazy dog while the early morning sun climbs over the hills, "
        "and the small village below slowly wakes to the sound of church bells and the smell of fresh bread.")
SEEDED = SynthesisRequest(TEXT, VoiceSpec(speaker="ryan", language="english"), seed=7, max_frames=FRAMES,
                          ignore_eos=True)


def run(engine: Engine, request: SynthesisRequest = SEEDED) -> tuple[np.ndarray, bytes, list[int]]:
    stream = engine.submit(request)
    chunks = list(stream)
    assert stream.result.frames == request.max_frames
    return stream.result.codes, np.concatenate([c.samples for c in chunks]).tobytes(), [c.n_frames for c in chunks]


def assert_same(got, want, what: str) -> None:
    codes, wav, _ = got
    differ = np.nonzero((codes != want[0]).any(axis=1))[0]
    assert not len(differ), f"{what}: codes differ from frame {differ[0]} on"
    assert wav == want[1], f"{what}: the codes are equal, the audio bytes are not"


def slow_codec_lanes(model: LoadedModel, delay_s: float):
    """The codec, `delay_s` slower in its lanes: frames come while a call is in flight (talker steps
    beside it) and join the stream's next call, which the timing then shapes."""
    real = model.codec.decode

    def decode(codes, state=None):
        if threading.current_thread().name.startswith("qwen3-tts-codec"):
            time.sleep(delay_s)
        return real(codes, state)

    return decode


def a_voice_prefix_above_freed_cells(engine: Engine) -> None:
    """Ryan's voice prefix cached anew while another stream runs, whose cells, below it, are then freed."""
    engine.clear_prefix_cache()
    other = engine.submit(SynthesisRequest("Another client talks here at some length today, and keeps on talking.",
                                           VoiceSpec(speaker="aiden"), seed=99, max_frames=400, ignore_eos=True))
    next(iter(other))  # (it runs)
    run(engine, SynthesisRequest("A short one.", VoiceSpec(speaker="ryan", language="english"), seed=5,
                                 max_frames=2, ignore_eos=True))
    other.cancel()
    list(other)


@pytest.fixture(scope="module")
def small_q8(converted_factory):
    """The small shape at the default preset's formats: 64-wide heads, so the KV cache is q8_0."""
    return converted_factory("small_cv", "q8_0", "int8")


def test_a_seeded_stream_alone_gives_the_same_bytes_whatever_ran_before_and_however_timed(small_q8, monkeypatch):
    model = LoadedModel(small_q8, EngineSettings(threads=2, max_streams=4))
    assert model.codec_overlap and model.talker.kv_cache == "q8_0" and model.talker.thread_invariant
    steps = []
    real_threads = model.talker.set_step_threads
    monkeypatch.setattr(model.talker, "set_step_threads", lambda n: (steps.append(n), real_threads(n)))
    with Engine(model) as engine:
        first = run(engine)  # the voice's prefix prefilled with the text
        assert_same(run(engine), first, "its prefix loaded from the cache")
        a_voice_prefix_above_freed_cells(engine)
        hits = engine.stats["prefix_hits"]
        assert_same(run(engine), first, "its prefix cached above cells freed later")
        assert engine.stats["prefix_hits"] == hits + 1
        steps.clear()
        monkeypatch.setattr(model.codec, "decode", slow_codec_lanes(model, 0.02))
        slow = run(engine)
        assert {1, 2} <= set(steps)  # steps of 1 thread beside a codec call, of 2 without
        assert slow[2] != first[2]  # chunks shaped by the timing
        assert_same(slow, first, "a slow codec")
        monkeypatch.undo()
        engine.clear_prefix_cache()
        assert_same(run(engine), first, "after the prefix cache was cleared")
    model.close()


def test_knobs_of_speed_change_no_bit_of_a_seeded_stream(converted_factory, monkeypatch):
    """Prefix cache, codec overlap and adaptive chunks change when and where the work runs, not its
    numbers: here on the tiny talker, whose 16-wide heads take an f16 KV cache, over which llama.cpp's
    sums depend on the thread count (so the talker's step threads stay fixed)."""
    folder = converted_factory("tiny_cv", "f32")
    model = LoadedModel(folder, EngineSettings(threads=2, max_streams=4))
    assert model.codec_overlap and model.talker.kv_cache == "f16" and not model.talker.thread_invariant
    with Engine(model) as engine:
        first = run(engine)
        monkeypatch.setattr(model.codec, "decode", slow_codec_lanes(model, 0.02))
        assert_same(run(engine), first, "a slow codec")
    model.close()
    for knob in (dict(prefix_cache=0), dict(codec_overlap=False), dict(adaptive_chunks=False)):
        model = LoadedModel(folder, EngineSettings(threads=2, max_streams=4, **knob))
        with Engine(model) as engine:
            assert_same(run(engine), first, str(knob))
        model.close()


@pytest.fixture(scope="module")
def parity_server(converted_factory):
    """`serve --deterministic` on the tiny model at the default preset's formats (q8_0 talker, int8 code
    predictor, whose kernels round a row differently with the rows beside it), and a second model."""
    models = [converted_factory("tiny_cv", "q8_0", "int8"), converted_factory("tiny_cv", "f32")]
    with loaded_registry(models, EngineSettings(threads=1, deterministic=True, max_streams=4)) as registry, \
            serve(registry, None, max_requests_per_client=4) as server:
        yield registry, server


def test_a_seeded_stream_in_the_parity_profile_is_its_solo_self_whatever_runs_beside_it(parity_server):
    """Through the server and the openai SDK: a sampled, seeded request alone, then at the same moment as
    other requests (unseeded, seeded, greedy, another voice, another model): the same bytes every time."""
    registry, server = parity_server
    client = openai.OpenAI(base_url=server.api_url, api_key="any", max_retries=0)
    other_model = registry.models[1].id

    def speak(model: str = "tts-1", voice: str = "alloy", **extra) -> bytes:
        with client.audio.speech.with_streaming_response.create(
                model=model, input="Hello there, this is a seeded stream.", voice=voice, response_format="pcm",
                extra_body={"max_frames": 40, **extra}) as response:
            return response.read()

    solo = speak(seed=7)
    assert len(solo) == 40 * 1920 * 2 and speak(seed=7) == solo
    for neighbours in ([{}, {}], [{"seed": 1}, {"temperature": 0}], [{"voice": "ryan"}, {"model": other_model}]):
        start = threading.Barrier(1 + len(neighbours))

        def together(extra: dict) -> bytes:
            start.wait()
            return speak(**extra)

        with ThreadPoolExecutor(len(neighbours) + 1) as pool:
            beside = list(pool.map(together, [{"seed": 7}, *neighbours]))[0]
        assert beside == solo, f"beside {neighbours}: samples differ from frame " \
            f"{np.nonzero(np.frombuffer(beside, '<i2') != np.frombuffer(solo, '<i2'))[0][0] // 1920} on"
