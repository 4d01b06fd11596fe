"""Default thread counts follow the CPUs this process may use: affinity and the cgroup CPU quota."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3_tts_gguf.host import cpus


def _tree(tmp_path: Path, files: dict[str, str], proc: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc_file = tmp_path / "proc-self-cgroup"
    proc_file.write_text(proc)
    return root, proc_file


def test_cgroup_v2_quota_of_the_process_and_its_ancestors(tmp_path):
    root, proc = _tree(tmp_path, {
        "kubepods/pod1/cpu.max": "max 100000\n",
        "kubepods/pod1/ctr/cpu.max": "150000 100000\n",
        "kubepods/cpu.max": "400000 100000\n",
    }, "0::/kubepods/pod1/ctr\n")
    assert cpus.cgroup_cpu_limit(root, proc) == pytest.approx(1.5)


def test_cgroup_v1_quota(tmp_path):
    root, proc = _tree(tmp_path, {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    }, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    assert cpus.cgroup_cpu_limit(root, proc) == pytest.approx(2.0)


def test_no_quota_and_unreadable_files(tmp_path):
    root, proc = _tree(tmp_path, {"cpu.max": "max 100000\n", "a/cpu.max": "garbage\n"}, "0::/a\n")
    assert cpus.cgroup_cpu_limit(root, proc) is None
    assert cpus.cgroup_cpu_limit(tmp_path / "missing", tmp_path / "missing-proc") is None


def test_usable_cpus_rounds_the_quota_up_and_keeps_the_affinity(monkeypatch):
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 1.5)
    assert cpus.usable_cpus() == 2
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 0.2)
    assert cpus.usable_cpus() == 1
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 32.0)
    assert cpus.usable_cpus() == 8
    assert cpus.default_threads(3) == 3 and cpus.default_threads(0) == 8 and cpus.default_threads(None) == 8


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks on this platform")
def test_affinity_mask_limits_the_default_threads_of_every_runtime():
    """A process pinned to one CPU (taskset) defaults to one thread in llama.cpp's and ORT's settings."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from qwen3_tts_gguf.host.cpus import default_threads; "
            "from qwen3_tts_gguf.model.onnx_session import session_options; "
            "print(default_threads(0), session_options().intra_op_num_threads)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]


def _env_without_openmp_waits() -> dict:
    """This environment less the OpenMP wait variables: a subprocess then gets the engine's defaults."""
    return {k: v for k, v in os.environ.items() if k not in cpus.OPENMP_WAIT_VARS}


def test_llama_is_loaded_with_short_spins_then_sleep_unless_the_operator_chose():
    """libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when llama_cpp loads it: every load goes
    through import_llama. An operator's own setting of either one turns the engine's pair off."""
    code = ("import os; from qwen3_tts_gguf.host.cpus import quiet_llama_logs; quiet_llama_logs(); "
            "maps = open('/proc/self/maps').read(); "
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), 'libgomp' in maps)")
    root = Path(__file__).resolve().parents[1]
    env = _env_without_openmp_waits()

    def loaded(**extra) -> list[str]:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root,
                             env={**env, **extra})
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert cpus.WAIT_POLICY == "ACTIVE" and cpus.SPIN_COUNT == 300
    assert loaded() == ["ACTIVE", "300", "True"]  # the CPU build here uses OpenMP
    assert loaded(OMP_WAIT_POLICY="ACTIVE")[:2] == ["ACTIVE", "None"]  # a spin count would cap ACTIVE's spinning
    assert loaded(GOMP_SPINCOUNT="0")[:2] == ["None", "0"]


IDLE_AFTER_TWO_TEAMS = """
import sys, threading, time
import numpy as np
from qwen3_tts_gguf.model.talker import DecodeItem, Talker, TalkerSettings
talker = Talker(sys.argv[1], TalkerSettings(threads=2, max_streams=2))
row = np.zeros((1, talker.hidden_size), np.float32)
done, stop = threading.Event(), threading.Event()
def second_engine():  # a second thread that called llama.cpp and lives on, like a second model's engine
    talker.decode([DecodeItem(1, 0, row)]); done.set(); stop.wait()
threading.Thread(target=second_engine, daemon=True).start()
done.wait()
talker.decode([DecodeItem(0, 0, row)])
cpu = time.process_time(); time.sleep(1.0); print(time.process_time() - cpu)
"""


def test_llama_threads_sleep_once_idle_with_two_calling_threads(tiny_cv_f32):
    """ACTIVE with a spin count (the engine's pair) spins only that long: once idle, both threads' OpenMP
    teams sleep, also when libgomp manages more threads than CPUs. (ACTIVE alone would spin for ever:
    about a CPU-second per idle second per worker thread.)"""
    from qwen3_tts_gguf.model.manifest import TALKER_FILE

    env = _env_without_openmp_waits()
    out = subprocess.run([sys.executable, "-c", IDLE_AFTER_TWO_TEAMS, str(tiny_cv_f32 / TALKER_FILE)],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1], env=env)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) < 0.3  # CPU seconds used while idle for one second


@pytest.mark.parametrize("threads, overlap, codec_threads, expected", [
    (1, True, 0, cpus.StageThreads(1, 1, 1, 1, 1)),  # one core: nothing overlaps
    (2, False, 0, cpus.StageThreads(2, 2, 2, 2, 1)),  # inline: every stage on every core
    (2, True, 0, cpus.StageThreads(1, 2, 2, 2, 1)),  # overlapped: one codec call at a time on every core
    (2, True, 1, cpus.StageThreads(1, 2, 2, 1, 2)),  # calls of 1 thread: two lanes, a step leaves a core
    (8, True, 1, cpus.StageThreads(7, 8, 8, 1, 8)),
    (8, True, 2, cpus.StageThreads(7, 8, 8, 2, 4)),  # codec calls of 2 threads: 4 lanes
    (2, True, 4, cpus.StageThreads(1, 2, 2, 2, 1)),  # never more threads per call than cores
])
def test_stage_threads(threads, overlap, codec_threads, expected):
    assert cpus.stage_threads(threads, codec_overlap=overlap, codec_threads=codec_threads) == expected


def test_the_engine_gives_each_stage_its_threads(tiny_cv_f32):
    """With codec calls of one thread on 2 cores, each codec call has 1 (in two lanes); by default 2.
    llama.cpp and the code predictor have 2 (one-row steps drop to 1 only beside a codec call: the
    scheduler test below)."""
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.settings import EngineSettings

    for codec_threads, expected in ((1, (2, 2, 2, 1)), (0, (2, 2, 2, 2))):
        model = LoadedModel(tiny_cv_f32, EngineSettings(threads=2, max_streams=2, codec_threads=codec_threads))
        try:
            L, ctx = model.talker._L, model.talker._ctx
            got = (L.llama_n_threads(ctx), L.llama_n_threads_batch(ctx),
                   model.predictor.session.get_session_options().intra_op_num_threads,
                   model.codec.session.get_session_options().intra_op_num_threads)
            assert got == expected and model.stage_threads.codec_lanes == (2 if codec_threads else 1)
        finally:
            model.close()


@pytest.mark.parametrize("model_name, codec_threads", [("small_cv", 0), ("small_cv", 1), ("tiny_cv", 0)])
def test_a_step_leaves_a_core_to_a_codec_call_in_flight(converted_factory, monkeypatch, model_name, codec_threads):
    """Overlapped on 2 cores: a one-row step decodes on 1 thread while a codec call of its stream is in
    flight (a slowed codec keeps one there), on 2 when none is (the first frame's); prefills on 2. Only
    with a quantized KV cache (the small shape's 64-wide heads take q8_0): over the tiny talker's f16 cache
    llama.cpp's numbers depend on the thread count, and every step keeps 2 (`Talker.thread_invariant`)."""
    import time

    from qwen3_tts_gguf.engine.audio_out import AudioOut
    from qwen3_tts_gguf.engine.request import SynthesisRequest
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.prompt import VoiceSpec
    from qwen3_tts_gguf.model.settings import EngineSettings

    folder = converted_factory("small_cv", "q8_0", "int8") if model_name == "small_cv" else converted_factory("tiny_cv")
    model = LoadedModel(folder, EngineSettings(threads=2, max_streams=2, codec_threads=codec_threads))
    assert model.talker.thread_invariant == (model_name == "small_cv")
    talker, seen, decided = model.talker, [], []
    real_decode, real_codec, real_in_flight = talker.decode, model.codec.decode, AudioOut.in_flight

    def in_flight(self):
        # what the engine saw when it chose the step's threads (a lane call may end before the decode)
        decided.append(real_in_flight(self))
        return decided[-1]

    def decode(items):
        if sum(len(i.rows) for i in items) == 1:  # (an engine that cannot switch does not ask)
            busy = decided[-1] if talker.thread_invariant else real_in_flight(engine.audio)
            seen.append((talker._L.llama_n_threads(talker._ctx), busy))
        else:
            assert talker._L.llama_n_threads_batch(talker._ctx) == 2
        return real_decode(items)

    def slow_codec(frames, state=None):
        time.sleep(0.02)
        return real_codec(frames, state)

    monkeypatch.setattr(talker, "decode", decode)
    monkeypatch.setattr(model.codec, "decode", slow_codec)
    monkeypatch.setattr(AudioOut, "in_flight", in_flight)
    engine = Engine(model)
    try:
        with engine:
            stream = engine.submit(SynthesisRequest("Hello there.", VoiceSpec(speaker="vivian"), max_frames=24,
                                                    ignore_eos=True, seed=3))
            for _ in stream:
                pass
    finally:
        model.close()
    switching = talker.thread_invariant
    assert seen and all(threads == (1 if busy and switching else 2) for threads, busy in seen), seen
    assert {busy for _, busy in seen} == {True, False}, seen
