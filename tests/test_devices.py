"""Device settings: --gpu-layers and --device reach the engine from `serve` and `synth`, are refused at
start when this installation cannot honour them, and `doctor` says what there is.

These run under any build (the CPU build of .venv, or .venv-vulkan); the Vulkan runs themselves are
tests/test_vulkan.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qwen3_tts_gguf.cli import build_parser
from qwen3_tts_gguf.host import devices, locks
from qwen3_tts_gguf.host.devices import GPU_LAYERS_ALL, BackendDevice, DeviceError, LlamaRuntime, check_gpu_layers
from qwen3_tts_gguf.model import onnx_session

from api.config import engine_settings_from_args
from api.ops.metrics import device_lock_lines

ROOT = Path(__file__).resolve().parent.parent
GPU_BUILD = bool(devices.llama_runtime().gpu_backends)
CPU_BUILD_ONLY = pytest.mark.skipif(GPU_BUILD, reason="this python's llama.cpp has a GPU backend")
NO_CUDA_EP = "CUDAExecutionProvider" not in ort.get_available_providers()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QTTS_")}
    return {**env, **extra}


def run_cli(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", *argv], cwd=ROOT, capture_output=True, text=True,
                          env=_env(**env), timeout=180)


def serve_args(*argv: str):
    return build_parser().parse_args(["serve", *argv])


# -- item 1: serve passes the device flags through ----------------------------------------------------
def test_serve_passes_gpu_layers_and_device_to_the_engine(monkeypatch):
    for name in ("QTTS_GPU_LAYERS", "QTTS_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    s = engine_settings_from_args(serve_args("--gpu-layers", "7", "--device", "cuda", "--threads", "3"),
                                  check_devices=False)
    assert (s.gpu_layers, s.device, s.threads) == (7, "cuda", 3)
    s = engine_settings_from_args(serve_args("--gpu-layers", "all"), check_devices=False)
    assert (s.gpu_layers, s.device) == (GPU_LAYERS_ALL, "cpu")
    monkeypatch.setenv("QTTS_GPU_LAYERS", "all")
    monkeypatch.setenv("QTTS_DEVICE", "auto")
    s = engine_settings_from_args(serve_args(), check_devices=False)
    assert (s.gpu_layers, s.device) == (GPU_LAYERS_ALL, "auto")
    # the defaults: all on the CPU, and that passes the start check on any installation
    monkeypatch.delenv("QTTS_GPU_LAYERS")
    monkeypatch.delenv("QTTS_DEVICE")
    s = engine_settings_from_args(serve_args())
    assert (s.gpu_layers, s.device) == (0, "cpu")


def test_kv_cache_flags_reach_the_engine_from_synth_and_serve(monkeypatch):
    monkeypatch.delenv("QTTS_KV_CACHE", raising=False)
    monkeypatch.delenv("QTTS_N_CTX", raising=False)
    monkeypatch.delenv("QTTS_NO_CODEC_OVERLAP", raising=False)
    assert engine_settings_from_args(serve_args(), check_devices=False).kv_cache == "q8_0"
    assert engine_settings_from_args(serve_args("--kv-cache", "f16"), check_devices=False).kv_cache == "f16"
    monkeypatch.setenv("QTTS_KV_CACHE", "f16")
    assert engine_settings_from_args(serve_args(), check_devices=False).kv_cache == "f16"
    assert build_parser().parse_args(["synth", "hello", "--kv-cache", "f16"]).kv_cache == "f16"
    assert engine_settings_from_args(serve_args("--kv-cache", "q4_0"), check_devices=False).kv_cache == "q4_0"
    with pytest.raises(SystemExit):
        serve_args("--kv-cache", "q2_k")
    assert engine_settings_from_args(serve_args("--n-ctx", "4096"), check_devices=False).kv_cells == 4096
    assert engine_settings_from_args(serve_args(), check_devices=False).kv_cells == 8192  # 8 streams x 1024
    assert engine_settings_from_args(serve_args("--max-streams", "4"), check_devices=False).kv_cells == 4096
    assert engine_settings_from_args(serve_args("--max-streams", "1"), check_devices=False).kv_cells == 2048
    assert build_parser().parse_args(["synth", "hello", "--n-ctx", "2048"]).n_ctx == 2048
    with pytest.raises(SystemExit):
        serve_args("--n-ctx", "100")
    assert engine_settings_from_args(serve_args(), check_devices=False).codec_overlap is True
    assert engine_settings_from_args(serve_args("--no-codec-overlap"), check_devices=False).codec_overlap is False
    monkeypatch.setenv("QTTS_NO_CODEC_OVERLAP", "1")
    assert engine_settings_from_args(serve_args(), check_devices=False).codec_overlap is False
    assert engine_settings_from_args(serve_args(), check_devices=False).codec_threads == 0
    assert engine_settings_from_args(serve_args("--codec-threads", "1"), check_devices=False).codec_threads == 1
    assert build_parser().parse_args(["synth", "hello", "--codec-threads", "1"]).codec_threads == 1
    with pytest.raises(SystemExit):
        serve_args("--codec-threads", "0")
    monkeypatch.setenv("QTTS_CODEC_THREADS", "1")
    assert engine_settings_from_args(serve_args(), check_devices=False).codec_threads == 1
    assert engine_settings_from_args(serve_args(), check_devices=False).heap_map_threshold == 1 << 20
    assert (engine_settings_from_args(serve_args("--heap-map-threshold", "0"), check_devices=False).heap_map_threshold
            == 0)
    assert (build_parser().parse_args(["synth", "hello", "--heap-map-threshold", "4194304"]).heap_map_threshold
            == 4 << 20)
    for bad in ("-1", str((32 << 20) + 1), "1.5"):
        with pytest.raises(SystemExit):
            serve_args("--heap-map-threshold", bad)
    monkeypatch.setenv("QTTS_HEAP_MAP_THRESHOLD", "2097152")
    assert engine_settings_from_args(serve_args(), check_devices=False).heap_map_threshold == 2 << 20


@pytest.mark.parametrize("text", ["-2", "many", "1.5"])
def test_gpu_layers_must_be_a_count_or_all(text, capsys):
    with pytest.raises(SystemExit):
        serve_args("--gpu-layers", text)
    assert "--gpu-layers" in capsys.readouterr().err


def test_the_device_reaches_the_onnx_sessions(tiny_cv_f32):
    """--device auto through serve's settings into a loaded model: the sessions say which provider."""
    from qwen3_tts_gguf.model.loaded import LoadedModel

    settings = engine_settings_from_args(serve_args("--device", "auto", "--threads", "1", "--max-streams", "1"))
    assert settings.device == "auto"
    model = LoadedModel(tiny_cv_f32, settings)
    try:
        expected = onnx_session.resolve_device("auto").provider
        assert model.predictor.session.get_providers()[0] == expected
        assert model.codec.session.get_providers()[0] == expected
    finally:
        model.close()


# -- refused at start ------------------------------------------------------------------------------------
def _runtime(backends: tuple[str, ...], *devs: tuple[str, str]) -> LlamaRuntime:
    found = tuple(BackendDevice(b, f"{b}0", "", kind, 0, 0) for b, kind in devs)
    return LlamaRuntime(version="x", library_dir="/lib", gpu_offload=any(d.kind != "cpu" for d in found),
                        backends=backends, devices=found, system_info="")


def test_gpu_layers_need_a_gpu_backend_and_a_gpu_device():
    check_gpu_layers(0, _runtime(("CPU",), ("CPU", "cpu")))  # nothing asked: nothing checked
    with pytest.raises(DeviceError, match="no GPU backend.*scripts/build-vulkan.sh"):
        check_gpu_layers(4, _runtime(("CPU",), ("CPU", "cpu")))
    # a Vulkan build whose only Vulkan device is lavapipe, not made visible: llama.cpp would run on the CPU
    with pytest.raises(DeviceError, match=r"GPU backend \(Vulkan\) sees no GPU device"):
        check_gpu_layers(GPU_LAYERS_ALL, _runtime(("Vulkan", "CPU"), ("CPU", "cpu")))
    check_gpu_layers(GPU_LAYERS_ALL, _runtime(("Vulkan", "CPU"), ("CPU", "cpu"), ("Vulkan", "gpu")))
    check_gpu_layers(3, _runtime(("Vulkan", "CPU"), ("CPU", "cpu"), ("Vulkan", "igpu")))


@CPU_BUILD_ONLY
def test_serve_refuses_gpu_layers_on_a_cpu_build(tmp_path):
    proc = run_cli("serve", "--model", str(tmp_path / "never-loaded"), "--gpu-layers", "all")
    assert proc.returncode == 2, proc.stderr
    assert "--gpu-layers all: this llama.cpp build has no GPU backend" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("serve", "--model", str(tmp_path / "never-loaded"), QTTS_GPU_LAYERS="4")
    assert proc.returncode == 2 and "--gpu-layers 4: this llama.cpp build has no GPU backend" in proc.stderr


@CPU_BUILD_ONLY
def test_synth_refuses_gpu_layers_on_a_cpu_build(tiny_cv_f32, tmp_path):
    proc = run_cli("synth", "hello", "--model", str(tiny_cv_f32), "--gpu-layers", "2", "-o", str(tmp_path / "a.wav"))
    assert proc.returncode == 2 and "error: --gpu-layers 2: this llama.cpp build has no GPU backend" in proc.stderr
    assert not (tmp_path / "a.wav").exists()


@CPU_BUILD_ONLY
def test_the_talker_itself_refuses_gpu_layers_on_a_cpu_build(tiny_cv_f32):
    from qwen3_tts_gguf.model.talker import Talker, TalkerError, TalkerSettings

    with pytest.raises(TalkerError, match="no GPU backend"):
        Talker(tiny_cv_f32 / "talker.gguf", TalkerSettings(n_ctx=64, max_streams=1, gpu_layers=1))


@pytest.mark.skipif(not NO_CUDA_EP, reason="this ONNX Runtime has the CUDA provider")
def test_a_provider_that_is_not_installed_is_refused_at_start(tmp_path):
    with pytest.raises(onnx_session.OnnxDeviceError, match="onnxruntime-gpu"):
        onnx_session.resolve_device("cuda")
    proc = run_cli("serve", "--model", str(tmp_path / "never-loaded"), "--device", "cuda")
    assert proc.returncode == 2 and "--device cuda: this ONNX Runtime has no CUDAExecutionProvider" in proc.stderr
    with pytest.raises(onnx_session.OnnxDeviceError, match="unknown ONNX device"):
        onnx_session.resolve_device("tpu")


# -- ONNX Runtime devices ----------------------------------------------------------------------------------
def _tiny_graph(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_auto_takes_the_best_installed_provider_and_says_which(tmp_path):
    dev = onnx_session.resolve_device("auto")
    installed = ort.get_available_providers()
    expected = next(n for n in onnx_session.AUTO_ORDER if onnx_session.DEVICE_PROVIDERS[n] in installed)
    assert dev.name == expected and dev.reason.startswith("auto")
    session = onnx_session.make_session(_tiny_graph(tmp_path / "g.onnx"), threads=1, device="auto")
    assert session.get_providers()[0] == dev.provider
    assert session.run(None, {"x": np.array([-1, 2], np.float32)})[0].tolist() == [0, 2]
    assert set(onnx_session.DEVICES) == set(devices.ONNX_DEVICES) == {"auto", *onnx_session.DEVICE_PROVIDERS}


@pytest.mark.skipif(not NO_CUDA_EP, reason="this ONNX Runtime has the CUDA provider")
def test_a_session_that_falls_back_to_the_cpu_is_an_error(tmp_path, monkeypatch):
    """ONNX Runtime falls back to the CPU with only a warning when a provider cannot be used: refused."""
    real = ort.get_available_providers()
    monkeypatch.setattr(onnx_session.ort, "get_available_providers", lambda: [*real, "CUDAExecutionProvider"])
    with pytest.raises(onnx_session.OnnxDeviceError, match="did not use CUDAExecutionProvider"):
        with pytest.warns(UserWarning):
            onnx_session.make_session(_tiny_graph(tmp_path / "g.onnx"), threads=1, device="cuda")


def test_webgpu_without_its_plugin_says_which_package(monkeypatch):
    monkeypatch.setattr(onnx_session, "_plugin_module", lambda device: None)
    with pytest.raises(onnx_session.OnnxDeviceError, match="onnxruntime-ep-webgpu"):
        onnx_session.resolve_device("webgpu")


# -- doctor ------------------------------------------------------------------------------------------------
def test_doctor_reports_backends_providers_and_the_default_plan():
    proc = run_cli("doctor")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "llama.cpp (llama-cpp-python 0.3.36" in out and "backends: " in out and "device CPU: cpu" in out
    assert ("GPU backend: none" in out) != GPU_BUILD
    assert "ONNX Runtime" in out and "CPUExecutionProvider" in out and "auto ->" in out
    from qwen3_tts_gguf.model.openvino_session import openvino_version

    openvino = (f"openvino {openvino_version()}" if openvino_version()
                else "openvino not installed (pip install openvino)")
    assert f"--codec-runtime: onnxruntime {ort.__version__}, {openvino}" in out
    assert ("serve with --gpu-layers 0 --device cpu --cp-runtime auto --codec-runtime auto: talker on the CPU; "
            "code predictor and codec on CPUExecutionProvider") in out
    proc = run_cli("doctor", "--json", "--device", "auto")
    report = json.loads(proc.stdout)
    assert report["llama"]["backends"][0] and report["llama"]["devices"][0]["kind"] in ("cpu", "gpu", "igpu", "accel")
    assert report["onnx"]["devices"]["cpu"] is True and report["plan"]["device"] == "auto"
    assert report["problems"] == [] and report["codec_runtimes"]["onnxruntime"] == ort.__version__


@CPU_BUILD_ONLY
def test_doctor_names_the_problem_with_gpu_layers_on_a_cpu_build():
    proc = run_cli("doctor", "--gpu-layers", "all")
    assert proc.returncode == 1
    assert "problem: --gpu-layers all: this llama.cpp build has no GPU backend" in proc.stdout
    assert "refused at start" in proc.stdout


def test_vulkaninfo_summary_is_parsed(monkeypatch):
    summary = ("Devices:\n========\nGPU0:\n\tapiVersion = 1.3.230\n\tdeviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\n"
               "\tdeviceName = Radeon RX\nGPU1:\n\tdeviceType = PHYSICAL_DEVICE_TYPE_CPU\n"
               "\tdeviceName = llvmpipe (LLVM 15.0.6, 256 bits)\n")
    monkeypatch.setattr(devices.shutil, "which", lambda name: "/usr/bin/vulkaninfo")
    monkeypatch.setattr(devices.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=summary, stderr=""))
    assert devices.vulkan_physical_devices() == [
        {"index": "0", "name": "Radeon RX", "type": "discrete_gpu"},
        {"index": "1", "name": "llvmpipe (LLVM 15.0.6, 256 bits)", "type": "cpu"}]
    assert devices.lavapipe_index() == 1


def test_a_device_lock_serialises_and_counts_the_wait():
    import threading
    import time

    lock = locks.device_lock("TestGPU0")
    assert locks.device_lock("TestGPU0") is lock  # one per device, process-wide
    inside, overlaps = [], []

    def work():
        with lock.hold():
            inside.append(1)
            overlaps.append(len(inside))
            time.sleep(0.05)
            inside.pop()

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [1, 1, 1]
    stats = locks.device_lock_stats()["TestGPU0"]
    assert stats["acquisitions"] == 3
    assert stats["waited_s"] >= 0.05 * 2 and stats["held_s"] >= 0.15 and stats["max_wait_s"] >= 0.05
    lines = device_lock_lines()
    assert "# TYPE qtts_device_wait_seconds_total counter" in lines
    assert any(line.startswith('qtts_device_wait_seconds_total{device="TestGPU0"} ') for line in lines)
    # sessions on the CPU take no lock; a CUDA session shares llama.cpp's CUDA0 lock
    assert locks.onnx_device_lock("cpu", "CPUExecutionProvider") is None
    assert locks.onnx_device_lock("cuda", "CUDAExecutionProvider") is locks.device_lock("CUDA0")
    assert locks.talker_device_locks(0) == ()


def test_the_plan_names_each_stage_on_ggml():
    """`--cp-runtime`/`--codec-runtime ggml`, or `auto` with the talker offloaded beyond ONNX
    Runtime's device: the start-up line says which stage runs on which ggml graphs, on which device."""
    from qwen3_tts_gguf.doctor import describe_plan, stage_words

    cpu = "CPUExecutionProvider"
    stages = stage_words("ggml", "onnxruntime", gpu_layers=0, onnx_device="cpu", deterministic=False)
    assert describe_plan(0, cpu, stages=stages) == ("talker on the CPU; code predictor on the project's ggml graphs "
                                                    "on the CPU; codec on CPUExecutionProvider")
    rt = LlamaRuntime("0", "", True, ("Vulkan", "CPU"), (BackendDevice("Vulkan", "Vulkan0", "GPU", "gpu", 1, 1),), "")
    stages = stage_words("auto", "auto", gpu_layers=GPU_LAYERS_ALL, onnx_device="cpu", deterministic=False)
    line = describe_plan(GPU_LAYERS_ALL, cpu, rt, stages=stages)
    assert ("code predictor on the project's ggml graphs on the talker's device where the model folder has its "
            "llama stages file (auto)") in line
    assert "codec on the project's ggml graphs on the talker's device (auto)" in line
    assert stage_words("onnxruntime", "ggml", gpu_layers=0, onnx_device="cpu", deterministic=False) == {
        "codec": "codec on the project's ggml graphs on the CPU"}
    assert stage_words("auto", "auto", gpu_layers=GPU_LAYERS_ALL, onnx_device="cpu", deterministic=True) == {}
    assert stage_words("auto", "auto", gpu_layers=GPU_LAYERS_ALL, onnx_device="cuda", deterministic=False) == {}
