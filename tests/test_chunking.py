"""Chunk sizes that keep a real-time player fed: the plan alone (simulated generation speeds) and the
engine on a driven clock (its chunks against a player that starts at the first one; the samples
unchanged)."""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.engine.chunking import ChunkPlan
from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings

RAMP = (1, 2, 4, 8)
FRAME_S = 0.08


def stalls(arrivals: list[tuple[float, int]]) -> int:
    """Chunks (arrival time, frames) that arrive after a player that started at the first chunk and
    plays at real time has run out of audio."""
    start, played, count = arrivals[0][0], 0.0, 0
    for at, frames in arrivals:
        if at > start + played + 1e-9:
            count += 1
            start = at - played  # the player waits, then plays on
        played += frames * FRAME_S
    return count


def simulate(rtf: float, adaptive: bool, frames: int = 375, jitter: float = 0.0, seed: int = 0):
    """A stream made at `rtf` (codec calls included: 6 ms each plus 10 ms per frame) -> arrivals, RTF."""
    rng = np.random.default_rng(seed)
    codec = lambda n: 0.006 + 0.010 * n  # noqa: E731
    step = rtf * FRAME_S - codec(RAMP[-1]) / RAMP[-1]  # talker + code predictor per frame
    plan, t, pending, arrivals = ChunkPlan(RAMP, FRAME_S, adaptive=adaptive), 0.0, 0, []
    for i in range(frames):
        t += step * (1 + jitter * rng.uniform(-1, 1))
        plan.frame_made(t)
        pending += 1
        if plan.due(pending, t) or i == frames - 1:
            t += codec(pending)
            plan.emitted(pending, codec(pending), t)
            arrivals.append((t, pending))
            pending = 0
    return arrivals, t / (frames * FRAME_S)


@pytest.mark.parametrize("rtf", [0.3, 0.55, 0.7, 0.8, 0.89])
@pytest.mark.parametrize("jitter", [0.0, 0.25])
def test_a_30_s_text_plays_without_a_stall_below_rtf_0_9(rtf, jitter):
    arrivals, measured = simulate(rtf, adaptive=True, jitter=jitter)
    assert measured < 0.9 + 0.05
    assert stalls(arrivals) == 0
    sizes = [n for _, n in arrivals]
    assert sizes[0] == 1 and max(sizes) <= RAMP[-1]
    if rtf <= 0.3:  # fast enough: full chunks after a few
        assert RAMP[-1] in sizes[:5]


@pytest.mark.parametrize("rtf", [0.55, 0.7, 0.89])
def test_the_fixed_ramp_stalls_above_half_real_time(rtf):
    """What the adaptive plan is for (and proof that `stalls` can see a stall)."""
    arrivals, _ = simulate(rtf, adaptive=False)
    assert stalls(arrivals) > 0


@pytest.mark.parametrize("rtf", [1.2, 2.5])
def test_slower_than_real_time_keeps_the_ramp(rtf):
    """No adapting when it cannot help: the player stalls either way, and one-frame codec calls
    would only make generation slower still."""
    adaptive, _ = simulate(rtf, adaptive=True)
    fixed, _ = simulate(rtf, adaptive=False)
    assert [n for _, n in adaptive] == [n for _, n in fixed]


def test_chunks_grow_back_as_the_buffer_grows():
    arrivals, _ = simulate(0.8, adaptive=True)
    sizes = [n for _, n in arrivals]
    assert sizes[1] == 1  # at first, each frame goes out as it is made
    assert sizes[-10:-1] == [RAMP[-1]] * 9  # later the buffer covers full chunks


class DrivenClock:
    """The engine's clock, advanced by the wrapped model calls rather than by real time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run_on_driven_clock(folder, adaptive: bool, rtf: float, frames: int = 48, seed: int | None = None):
    model = LoadedModel(folder, EngineSettings(max_streams=1, threads=1, prefix_cache=0, adaptive_chunks=adaptive))
    engine = Engine(model)
    clock = engine.clock = DrivenClock()
    talker_decode, codec_decode = model.talker.decode, model.codec.decode
    codec_cost = lambda n: 0.006 + 0.010 * n  # noqa: E731
    arrivals = []

    def decode(items):
        clock.now += rtf * FRAME_S - codec_cost(8) / 8
        return talker_decode(items)

    def codec(codes, state=None):
        clock.now += codec_cost(len(codes))
        calls.append((clock.now, len(codes)))
        return codec_decode(codes, state)

    model.talker.decode, model.codec.decode = decode, codec
    greedy = SamplingParams(greedy=True)  # (the same codes without a seed)
    request = SynthesisRequest("Hello world, this is a chunking test.", VoiceSpec(speaker="ryan", language="english"),
                               talker=TalkerSampling(greedy), code_predictor=greedy, seed=seed, max_frames=frames,
                               ignore_eos=True)
    calls = []  # (clock after the call, frames)
    with engine:
        stream = engine.submit(request)
        chunks = list(stream)
    model.close()
    ends = np.cumsum([n for _, n in calls])
    for chunk in chunks:  # a chunk arrives after the call that decodes its last frame
        arrivals.append((calls[int(np.searchsorted(ends, chunk.first_frame + chunk.n_frames))][0], chunk.n_frames))
    return arrivals, [n for _, n in calls], stream.result.codes, np.concatenate([c.samples for c in chunks])


def test_engine_chunks_keep_a_player_fed_and_the_samples_equal(tiny_cv_f32):
    """Fast profile at 0.8 of real time on a driven clock: the fixed ramp stalls, the engine's plan
    does not; codes equal, and the audio equals within the codec's chunking tolerance."""
    arrivals, calls, codes, wav = _run_on_driven_clock(tiny_cv_f32, adaptive=True, rtf=0.8)
    fixed_arrivals, _, fixed_codes, fixed_wav = _run_on_driven_clock(tiny_cv_f32, adaptive=False, rtf=0.8)
    assert calls == [n for _, n in arrivals]  # a chunk is one codec call
    assert stalls(fixed_arrivals) > 0
    assert stalls(arrivals) == 0
    assert [n for _, n in arrivals] != [n for _, n in fixed_arrivals]
    np.testing.assert_array_equal(codes, fixed_codes)
    np.testing.assert_allclose(wav, fixed_wav, atol=1e-4)


def test_a_seeded_stream_calls_the_codec_on_its_grid_whatever_the_timing(tiny_cv_f32):
    """A seeded stream: its chunks end on its codec grid (1, 3, 7, 11, ... frames) and its calls
    follow the grid, so early chunks change no bit of its audio; the price is the fixed ramp's first
    chunks (a player started at the first chunk waits twice at 0.8 of real time, not at all unseeded)."""
    arrivals, calls, codes, wav = _run_on_driven_clock(tiny_cv_f32, adaptive=True, rtf=0.8, seed=5)
    fixed_arrivals, fixed_calls, fixed_codes, fixed_wav = _run_on_driven_clock(tiny_cv_f32, adaptive=False,
                                                                                 rtf=0.8, seed=5)
    sizes = [n for _, n in arrivals]
    assert sizes[:3] == [1, 2, 4] and sizes != [n for _, n in fixed_arrivals]  # early chunks, on the grid
    ends = np.cumsum(sizes)[:-1]
    assert all(end in (1, 3) or end >= 7 and (end - 7) % 4 == 0 for end in ends)
    assert calls == fixed_calls == [1, 2] + [4] * 11 + [1]
    assert stalls(arrivals) == 2 < stalls(fixed_arrivals)  # (the second and third chunks; the ramp's a fourth)
    np.testing.assert_array_equal(codes, fixed_codes)
    assert wav.tobytes() == fixed_wav.tobytes()


def test_the_grid_cuts_chunks_and_calls_at_the_ramp_then_every_four_frames():
    plan = ChunkPlan(RAMP, FRAME_S, grid=4)
    assert [plan.cut(0, n) for n in (1, 2, 3)] == [1, 1, 3]
    assert [plan.cut(3, n) for n in (3, 4, 7, 8, 9)] == [0, 4, 4, 8, 8]
    assert plan.calls(0, 15) == [1, 2, 4, 4, 4] and plan.calls(1, 8) == [2, 4, 2] and plan.calls(7, 11) == [4, 4, 3]
    assert ChunkPlan(RAMP, FRAME_S).cut(3, 3) == 3 and ChunkPlan(RAMP, FRAME_S).calls(3, 11) == [11]
    assert ChunkPlan((6,), FRAME_S, grid=4).calls(0, 14) == [4, 2, 4, 2, 2]
