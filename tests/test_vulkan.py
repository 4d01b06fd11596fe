"""The talker on a real Vulkan backend: Mesa's software device (lavapipe), so it runs without a GPU.

Run by the Vulkan build's own python, in a process of its own (CI does, after scripts/build-vulkan.sh):

    .venv-vulkan/bin/python -m pytest -q tests/test_vulkan.py

Under any other python (the CPU build of .venv) every test here is skipped with the reason. llama.cpp
skips CPU-type Vulkan devices unless GGML_VK_VISIBLE_DEVICES names them: this module sets it to
lavapipe's index before llama.cpp's Vulkan backend starts, so a real GPU on the machine is never used
and nothing depends on what else is installed. lavapipe proves correctness (every shader, buffer and
offload decision is the real one), never speed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
VULKAN_VENV = ROOT / ".venv-vulkan"

# Measured on lavapipe (Mesa 22.3.6, LLVM 15.0.6), f32 talker, F32 KV cache, flash attention off, every
# layer and the output offloaded, tiny fixtures (hidden std ~1, logits std ~4), prefill + 5 steps:
#   vs llama.cpp's CPU backend and vs PyTorch alike (those two agree to ~1e-6 / 1e-5):
#   hidden max |d| 1.2e-3 / 8.2e-4, logits max |d| 9.4e-3 / 6.9e-3, relative RMS 3.4e-4 / 2.3e-4
#   (tiny_cv / tiny0b6_cv_bf16); argmax equal at every position.
# The error is f16 arithmetic ggml-vulkan picks when the device reports fp16 support: with
# GGML_VK_DISABLE_F16=1 it falls to a relative RMS of 9e-5 / 6e-5. The bars leave ~3x room.
HIDDEN_TOL = 5e-3
LOGIT_TOL = 3e-2
REL_RMS_TOL = 1e-3
FRAMES = 30


def _why_skip() -> str | None:
    if not (VULKAN_VENV / "bin" / "python").exists():
        return ".venv-vulkan is absent: scripts/build-vulkan.sh builds it (CI does)"
    from qwen3_tts_gguf.host import devices

    # before llama.cpp's Vulkan backend starts (it reads the variable once, when first asked)
    index = devices.lavapipe_index()
    if index is None:
        return "vulkaninfo shows no lavapipe (llvmpipe) device: apt-get install mesa-vulkan-drivers vulkan-tools"
    os.environ["GGML_VK_VISIBLE_DEVICES"] = str(index)
    rt = devices.llama_runtime()
    if "Vulkan" not in rt.gpu_backends:
        return (f"{sys.executable} loads a llama.cpp without the Vulkan backend: run "
                ".venv-vulkan/bin/python -m pytest tests/test_vulkan.py")
    if not any(d.backend.lower().startswith("vulkan") for d in rt.gpu_devices):
        return (f"llama.cpp's Vulkan backend sees no device (devices: {[d.name for d in rt.devices]}); it starts "
                "once per process: run this file in a process of its own")
    return None


_SET_BEFORE = "GGML_VK_VISIBLE_DEVICES" in os.environ
SKIP = _why_skip()
if SKIP is not None and not _SET_BEFORE:
    os.environ.pop("GGML_VK_VISIBLE_DEVICES", None)  # leave other tests' environment as it was
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
ALL = -1


def _report(record_property, **values) -> None:
    for k, v in values.items():
        record_property(k, v)
    print(" ".join(f"{k}={v}" for k, v in values.items()))


def test_the_lavapipe_device_is_what_llama_cpp_offloads_to():
    from qwen3_tts_gguf import doctor
    from qwen3_tts_gguf.host import devices

    rt = devices.llama_runtime()
    gpu = [d for d in rt.gpu_devices if d.backend.lower().startswith("vulkan")]
    assert len(gpu) == 1 and "llvmpipe" in gpu[0].description.lower(), rt.devices
    assert "Vulkan" in doctor.describe_plan(ALL, "CPUExecutionProvider", rt)


@pytest.fixture(scope="module", params=["tiny_cv", "tiny0b6_cv_bf16"])
def talker_case(request, converted_factory):
    return request.param, converted_factory(request.param, "f32")


def test_offloaded_talker_matches_cpu_and_official(talker_case, record_property):
    """Every layer and the output on lavapipe: logits and post-norm hidden of a prefill and 5 single
    steps, against llama.cpp's CPU backend (same build) and the official PyTorch talker."""
    from qwen3_tts_gguf.model.talker import Talker, TalkerSettings

    from tests.conftest import official_checkpoint
    from tests.reference.runner import talker_forward

    name, folder = talker_case
    settings = dict(n_ctx=256, max_streams=2, deterministic=True, threads=2)
    gpu = Talker(folder / "talker.gguf", TalkerSettings(gpu_layers=ALL, **settings))
    cpu = Talker(folder / "talker.gguf", TalkerSettings(gpu_layers=0, **settings))
    rows = np.random.default_rng(0).standard_normal((14, gpu.hidden_size)).astype(np.float32)
    g_logits, g_hidden = gpu.decode_steps(0, rows, 9)
    c_logits, c_hidden = cpu.decode_steps(0, rows, 9)
    gpu.close()
    cpu.close()
    ref_logits, ref_hidden = talker_forward(official_checkpoint(name), rows)
    ref_logits, ref_hidden = ref_logits[8:], ref_hidden[8:]
    rel = float(np.sqrt(np.mean((g_logits - ref_logits) ** 2)) / np.sqrt(np.mean(ref_logits ** 2)))
    d = dict(hidden_vs_cpu=float(np.abs(g_hidden - c_hidden).max()),
             logits_vs_cpu=float(np.abs(g_logits - c_logits).max()),
             hidden_vs_official=float(np.abs(g_hidden - ref_hidden).max()),
             logits_vs_official=float(np.abs(g_logits - ref_logits).max()),
             cpu_logits_vs_official=float(np.abs(c_logits - ref_logits).max()),
             logits_rel_rms_vs_official=rel,
             argmax_equal=bool((g_logits.argmax(-1) == ref_logits.argmax(-1)).all()))
    _report(record_property, case=name, **d)
    assert d["hidden_vs_cpu"] < HIDDEN_TOL and d["hidden_vs_official"] < HIDDEN_TOL
    assert d["logits_vs_cpu"] < LOGIT_TOL and d["logits_vs_official"] < LOGIT_TOL and rel < REL_RMS_TOL
    assert d["argmax_equal"]


def test_the_q8_0_kv_cache_on_vulkan(checkpoint_factory, tmp_path, record_property):
    """The fast profile's default KV cache (q8_0, flash attention) with every layer on lavapipe: 64-wide
    heads (the small shape), logits against the CPU's f16 cache. Measured: relative RMS 4.3e-3 on
    Vulkan, 4.9e-3 for q8_0 on the CPU (the cache's rounding), 4.4e-4 for f16 on Vulkan."""
    from qwen3_tts_gguf.convert.checkpoint import Checkpoint
    from qwen3_tts_gguf.convert.talker_gguf import write_talker_gguf
    from qwen3_tts_gguf.model.talker import Talker, TalkerSettings

    ckpt = Checkpoint.open(checkpoint_factory("small_cv"))
    write_talker_gguf(ckpt, tmp_path / "talker.gguf", "f32")
    rows = np.random.default_rng(3).standard_normal((24, ckpt.config.talker.hidden_size)).astype(np.float32)
    logits = {}
    for name, layers, kv in (("cpu f16", 0, "f16"), ("vulkan q8_0", ALL, "q8_0")):
        talker = Talker(tmp_path / "talker.gguf", TalkerSettings(n_ctx=128, max_streams=1, threads=2,
                                                                 gpu_layers=layers, kv_cache=kv))
        assert talker.kv_cache == kv
        logits[name], _ = talker.decode_steps(0, rows, 8)
        talker.close()
    ref, got = logits["cpu f16"], logits["vulkan q8_0"]
    rel = float(np.sqrt(np.mean((got - ref) ** 2)) / np.sqrt(np.mean(ref ** 2)))
    _report(record_property, kv_q8_0_vulkan_rel_rms_vs_cpu_f16=rel)
    assert 0 < rel < 2e-2


def _greedy(text: str, frames: int = FRAMES, voice=None, **kw):
    from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
    from qwen3_tts_gguf.model.prompt import VoiceSpec
    from qwen3_tts_gguf.model.sampler import SamplingParams

    greedy = SamplingParams(greedy=True)
    return SynthesisRequest(text, voice or VoiceSpec(speaker="ryan", language="english"),
                            talker=TalkerSampling(greedy), code_predictor=greedy, seed=0, max_frames=frames,
                            ignore_eos=True, **kw)


def _engine(folder: Path, gpu_layers: int, deterministic: bool = True, max_streams: int = 4, device: str = "cpu"):
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.settings import EngineSettings

    model = LoadedModel(folder, EngineSettings(deterministic=deterministic, max_streams=max_streams, threads=2,
                                               gpu_layers=gpu_layers, n_ctx=2048, device=device))
    return Engine(model).start()


def _stop(engine) -> None:
    engine.stop()
    engine.model.close()


@pytest.fixture(scope="module")
def vulkan_engine(tiny_cv_f32):
    engine = _engine(tiny_cv_f32, ALL)
    yield engine
    _stop(engine)


def _codes(engine, request) -> np.ndarray:
    stream = engine.submit(request)
    for _ in stream:
        pass
    assert stream.result.finish_reason == "max_frames", stream.result
    return stream.result.codes


def _agreement(a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    """(frames equal before the first difference, fraction of equal codes)."""
    same = (a == b).all(axis=1)
    first = int(np.argmin(same)) if not same.all() else len(same)
    return first, float((a == b).mean())


def test_greedy_codes_on_vulkan_equal_cpu_and_official(vulkan_engine, tiny_cv_f32, record_property):
    from tests.conftest import official_checkpoint
    from tests.reference.runner import official_generate

    text = "Hello world, this is a parity test."
    gpu = _codes(vulkan_engine, _greedy(text))
    cpu_engine = _engine(tiny_cv_f32, 0)
    try:
        cpu = _codes(cpu_engine, _greedy(text))
    finally:
        _stop(cpu_engine)
    ref, _ = official_generate(official_checkpoint("tiny_cv"), text, speaker="ryan", language="english",
                               non_streaming=True, frames=FRAMES)
    first_cpu, frac_cpu = _agreement(gpu, cpu)
    first_ref, frac_ref = _agreement(gpu, ref)
    _report(record_property, frames=FRAMES, equal_frames_vs_cpu=first_cpu, equal_codes_vs_cpu=frac_cpu,
            equal_frames_vs_official=first_ref, equal_codes_vs_official=frac_ref,
            cpu_equals_official=bool(np.array_equal(cpu, ref)))
    np.testing.assert_array_equal(gpu, cpu)
    np.testing.assert_array_equal(gpu, ref)


def test_a_batch_of_streams_on_vulkan(vulkan_engine, tiny_cv_f32):
    """Deterministic profile: each stream in a batch equals its run alone. Then the shared-KV profile
    (one llama_decode steps every stream) runs a batch of 4 to the end."""
    texts = ["First client speaks.", "Second client, a bit longer than the first.", "Third.", "Fourth one here."]
    requests = [_greedy(t, frames=8 + 3 * i) for i, t in enumerate(texts)]
    alone = [_codes(vulkan_engine, r) for r in requests]
    streams = [vulkan_engine.submit(r) for r in requests]
    for s in streams:
        list(s)
    for k, (a, s) in enumerate(zip(alone, streams)):
        np.testing.assert_array_equal(a, s.result.codes, err_msg=f"stream {k}")
    shared = _engine(tiny_cv_f32, ALL, deterministic=False)
    try:
        streams = [shared.submit(r) for r in requests]
        for s in streams:
            list(s)
        assert [s.result.finish_reason for s in streams] == ["max_frames"] * 4
        assert [s.result.frames for s in streams] == [8, 11, 14, 17]
        assert shared.load()["active"] == 0
    finally:
        _stop(shared)


def test_cancel_on_vulkan(vulkan_engine):
    stream = vulkan_engine.submit(_greedy("A long one that we stop early.", frames=400))
    received = 0
    for chunk in stream:
        received += chunk.n_frames
        if received >= 3:
            stream.cancel()
    assert stream.result.finish_reason == "cancelled" and stream.result.frames < 400
    assert vulkan_engine.load()["active"] == 0
    # the device and the freed sequence serve the next request
    assert len(_codes(vulkan_engine, _greedy("After the cancel.", frames=5))) == 5


def test_a_request_through_the_server_on_vulkan(tiny_cv_f32, tmp_path):
    from tests.serve_process import ServeProcess, httpx

    env = {"GGML_VK_VISIBLE_DEVICES": os.environ["GGML_VK_VISIBLE_DEVICES"]}
    with ServeProcess("--model", str(tiny_cv_f32), "--gpu-layers", "all", "--threads", "2", "--max-streams", "2",
                      log_path=tmp_path / "serve.log", env=env) as server:
        r = httpx.post(f"{server.url}/v1/audio/speech", timeout=120,
                       json={"model": "tts-1", "input": "Hello from the software GPU.", "voice": "ryan",
                             "response_format": "pcm", "seed": 1, "max_frames": 12})
        assert r.status_code == 200, r.text
        assert len(r.content) > 2 * 1920  # at least one 80 ms frame of s16 at 24 kHz
        log = server.log()
    assert "devices: talker: all layers on Vulkan" in log and "llvmpipe" in log, log


def test_two_models_on_one_device_take_turns(tiny_cv_f32, converted_factory, monkeypatch, record_property):
    """Two engines (two served models) offloaded to the same device: their talker decodes never overlap
    (one lock per device), and the time work waited for the device is counted."""
    import threading
    import time

    from qwen3_tts_gguf.host import locks
    from qwen3_tts_gguf.model.talker import Talker

    from api.ops.metrics import device_lock_lines

    intervals: list[tuple[int, float, float]] = []
    real = Talker._run_unlocked

    def timed(self, *args):
        t0 = time.perf_counter()
        try:
            return real(self, *args)
        finally:
            intervals.append((id(self), t0, time.perf_counter()))

    monkeypatch.setattr(Talker, "_run_unlocked", timed)
    before = locks.device_lock_stats()
    a = _engine(tiny_cv_f32, ALL, deterministic=False)
    b = _engine(converted_factory("tiny_vd", "f32"), ALL, deterministic=False)
    try:
        assert a.model.talker._device_locks == b.model.talker._device_locks != ()
        name = a.model.talker._device_locks[0].name
        results = {}

        def speak(engine, key, request):
            results[key] = _codes(engine, request)

        from qwen3_tts_gguf.model.prompt import VoiceSpec

        req_b = _greedy("A designed voice speaks.", frames=20,
                        voice=VoiceSpec(language="english", instruct="A calm voice."))
        threads = [threading.Thread(target=speak, args=(a, "a", _greedy("Model A speaks now.", frames=20))),
                   threading.Thread(target=speak, args=(b, "b", req_b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert len(results["a"]) == len(results["b"]) == 20
    finally:
        _stop(a)
        _stop(b)
    talkers = {k for k, _, _ in intervals}
    assert len(talkers) == 2
    spans = sorted((s, e) for _, s, e in intervals)
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:])), "decodes of two models overlapped"
    after = locks.device_lock_stats()[name]
    _report(record_property, device=name, decodes=len(intervals), lock_waited_s=round(after["waited_s"], 3),
            lock_held_s=round(after["held_s"], 3), max_wait_s=round(after["max_wait_s"], 4))
    assert after["acquisitions"] - before.get(name, {}).get("acquisitions", 0) >= len(intervals)
    assert after["waited_s"] >= 0 and any(line.startswith(f'qtts_device_wait_seconds_total{{device="{name}"}}')
                                          for line in device_lock_lines())


def test_webgpu_plugin_provider(tiny_cv_f32, record_property):
    """ONNX Runtime's WebGPU plugin (onnxruntime-ep-webgpu, installed into .venv-vulkan): registered
    through register_execution_provider_library and chosen through the device API. Where ONNX Runtime
    offers a WebGPU device, the engine's greedy codes with the code predictor and codec there must equal
    those with the graphs on the CPU; where it offers none (its hardware discovery finds no GPU: lavapipe
    is no hardware device), --device webgpu is refused with the reason, and that is what is checked."""
    pytest.importorskip("onnxruntime_ep_webgpu", reason="onnxruntime-ep-webgpu is not installed")
    import onnxruntime as ort

    from qwen3_tts_gguf.model import onnx_session

    assert onnx_session._register_plugin("webgpu"), "ONNX Runtime refused the WebGPU plugin library"
    devices = onnx_session.plugin_ep_devices("webgpu")
    record_property("webgpu_ep_devices", len(devices))
    if not devices:
        assert "WebGpuExecutionProvider" not in [d.ep_name for d in ort.get_ep_devices()]
        with pytest.raises(onnx_session.OnnxDeviceError, match="reports no device"):
            onnx_session.resolve_device("webgpu")
        print("webgpu: the plugin registers but ONNX Runtime offers no WebGPU device here")
        return
    # a WebGPU device: the whole engine with its graphs there, greedy codes against the graphs on the CPU
    text = "Hello world, this is a parity test."
    engines = [_engine(tiny_cv_f32, ALL, device=d) for d in ("webgpu", "cpu")]
    try:
        assert engines[0].model.predictor.session.get_providers()[0] == "WebGpuExecutionProvider"
        codes = [_codes(e, _greedy(text)) for e in engines]
    finally:
        for e in engines:
            _stop(e)
    first, frac = _agreement(*codes)
    _report(record_property, webgpu_equal_frames=first, webgpu_equal_codes=frac)
    np.testing.assert_array_equal(*codes)
