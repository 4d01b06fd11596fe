"""The bench's own engine session (bench/ours.py) on a tiny model: the same objects the benchmarks time."""

from __future__ import annotations

import threading

from bench.ours import OursSession


def _engine_threads() -> int:
    return sum(t.name == "qwen3-tts-engine" for t in threading.enumerate())


def test_a_session_serving_two_models_runs_and_closes_both(tiny_cv_f32):
    """`second_model` (bench.experiments omp-policy) loads the folder again with an engine of its own that
    has served a request, as a server with two models has; the session's runs use the first engine."""
    before = _engine_threads()
    session = OursSession(str(tiny_cv_f32), threads=2, frames=6, warmup_frames=2, concurrency_frames=4,
                          max_streams=2, second_model=True)
    try:
        assert _engine_threads() == before + 2
        assert session.second.stats["streams_done"] == 1 and session.engine.stats["streams_done"] == 1
        run = session.single(0)
        assert run["frames"] == 6 and run["finish_reason"] == "max_frames"
        assert session.second.stats["streams_done"] == 1
    finally:
        session.summary()
    assert _engine_threads() == before
