"""`python -m qwen3_tts_gguf doctor`: what this installation can use, and where each stage would run.

Also the device settings checked at start (serve, synth): `check_device_settings`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from qwen3_tts_gguf.host.devices import (
    GPU_LAYERS_ALL,
    DeviceError,
    LlamaRuntime,
    check_gpu_layers,
    llama_runtime,
    vulkan_physical_devices,
)


def check_device_settings(gpu_layers: int, device: str, codec_runtime: str = "auto",
                          deterministic: bool = False, *, cp_runtime: str = "auto") -> str:
    """The device settings checked at start (serve, synth): DeviceError (a ValueError) naming what is
    missing; otherwise one line saying where the work will run."""
    from qwen3_tts_gguf.model.onnx_session import OnnxDeviceError, resolve_device
    from qwen3_tts_gguf.model.openvino_session import CodecRuntimeError, check_codec_runtime
    from qwen3_tts_gguf.model.stage_runtimes import StageRuntimeError, check_stage_runtimes

    check_gpu_layers(gpu_layers)
    try:
        onnx = resolve_device(device)
        check_stage_runtimes(cp_runtime, codec_runtime, deterministic=deterministic)
        codec = check_codec_runtime(codec_runtime, device, deterministic)
    except (OnnxDeviceError, CodecRuntimeError, StageRuntimeError) as e:
        raise DeviceError(str(e)) from e
    onnx_line = onnx.provider + (f" ({onnx.reason})" if onnx.reason else "")
    return describe_plan(gpu_layers, onnx_line, codec=codec, stages=stage_words(
        cp_runtime, codec_runtime, gpu_layers=gpu_layers, onnx_device=onnx.name, deterministic=deterministic))


def stage_words(cp_runtime: str, codec_runtime: str, *, gpu_layers: int, onnx_device: str,
                deterministic: bool) -> dict[str, str]:
    """What runs each stage that is not on ONNX Runtime, in a few words, before a model folder is read
    (`auto`'s code predictor then depends on the folder having its llama stages file: model/stage_runtimes.py)."""
    on = "on the talker's device" if gpu_layers else "on the CPU"
    auto = bool(gpu_layers) and onnx_device == "cpu" and not deterministic
    out = {}
    if cp_runtime == "ggml":
        out["code predictor"] = f"code predictor on the project's ggml graphs {on}"
    elif cp_runtime == "auto" and auto:
        out["code predictor"] = (f"code predictor on the project's ggml graphs {on} where the model folder has "
                                 "its llama stages file (auto)")
    if codec_runtime == "ggml" or (codec_runtime == "auto" and auto):
        out["codec"] = f"codec on the project's ggml graphs {on}" + (" (auto)" if codec_runtime == "auto" else "")
    return out


def describe_plan(gpu_layers: int, onnx_provider: str, runtime: LlamaRuntime | None = None, codec: str = "",
                  stages: dict[str, str] | None = None) -> str:
    """Where each stage runs, in one line; `codec`: the codec's own words when it runs on OpenVINO;
    `stages`: a stage's words when it runs on ggml (`stage_words`)."""
    if not gpu_layers:
        talker = "talker on the CPU"
    else:
        rt = runtime or llama_runtime()
        names = ", ".join(f"{d.name} ({d.description})" for d in rt.gpu_devices) or "no GPU device"
        layers = "all layers" if gpu_layers == GPU_LAYERS_ALL else f"{gpu_layers} layers"
        talker = f"talker: {layers} on {names}"
    stages = dict(stages or {})
    if codec:
        stages["codec"] = codec
    if not stages:
        return f"{talker}; code predictor and codec on {onnx_provider}"
    predictor = stages.get("code predictor", f"code predictor on {onnx_provider}")
    return f"{talker}; {predictor}; {stages.get('codec', f'codec on {onnx_provider}')}"


@dataclass
class Report:
    """What `doctor` prints (also as JSON)."""

    llama: dict
    onnx: dict
    vulkan_devices: list[dict[str, str]]
    plan: dict
    problems: list[str] = field(default_factory=list)
    # --codec-runtime -> version, None: not installed
    codec_runtimes: dict[str, str | None] = field(default_factory=dict)


def report(gpu_layers: int = 0, device: str = "cpu", cp_runtime: str = "auto", codec_runtime: str = "auto") -> Report:
    """Everything `doctor` says, for the device settings given (serve's defaults when none)."""
    import onnxruntime as ort

    from qwen3_tts_gguf.model.onnx_session import OnnxDeviceError, available_devices, resolve_device
    from qwen3_tts_gguf.model.openvino_session import openvino_version

    rt = llama_runtime()
    problems: list[str] = []
    try:
        check_gpu_layers(gpu_layers, rt)
    except DeviceError as e:
        problems.append(str(e))
    try:
        onnx = resolve_device(device)
        onnx_line, onnx_device = onnx.provider + (f" ({onnx.reason})" if onnx.reason else ""), onnx.name
    except OnnxDeviceError as e:
        problems.append(str(e))
        onnx_line, onnx_device = "unavailable", device
    stages = stage_words(cp_runtime, codec_runtime, gpu_layers=gpu_layers, onnx_device=onnx_device,
                         deterministic=False)
    auto = resolve_device("auto")
    ep_devices = []
    if hasattr(ort, "get_ep_devices"):
        try:
            ep_devices = [f"{d.ep_name}: {getattr(d.device, 'type', '?')} {getattr(d.device, 'vendor', '')}".strip()
                          for d in ort.get_ep_devices()]
        except Exception:  # noqa: BLE001 - an older runtime's device API
            ep_devices = []
    llama = L = asdict(rt)
    llama["gpu_devices"] = [d.name for d in rt.gpu_devices]
    llama["gpu_backends"] = list(rt.gpu_backends)
    return Report(
        llama=llama,
        onnx={"version": ort.__version__, "providers": ort.get_available_providers(),
              "devices": available_devices(), "ep_devices": ep_devices,
              "auto": auto.provider + (f" ({auto.reason})" if auto.reason else "")},
        vulkan_devices=vulkan_physical_devices(),
        plan={"gpu_layers": gpu_layers, "device": device, "cp_runtime": cp_runtime, "codec_runtime": codec_runtime,
              "summary": (describe_plan(gpu_layers, onnx_line, rt, stages=stages) if not problems
                          else "refused at start"),
              "env": {k: os.environ[k] for k in ("GGML_VK_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                                                  "LLAMA_CPP_LIB_PATH") if k in os.environ}},
        problems=problems,
        codec_runtimes={"onnxruntime": ort.__version__, "openvino": openvino_version(), "ggml": L["version"]})


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "?"


def format_report(r: Report) -> str:
    L, onnx = r.llama, r.onnx
    lines = [f"llama.cpp (llama-cpp-python {L['version']}, {L['library_dir']})",
             f"  backends: {', '.join(L['backends']) or '?'}; GPU backend: {', '.join(L['gpu_backends']) or 'none'}; "
             f"GPU offload: {'yes' if L['gpu_offload'] else 'no'}"]
    for d in L["devices"]:
        lines.append(f"  device {d['name']}: {d['kind']}, {d['description']}, {_size(d['memory_free'])} free "
                     f"of {_size(d['memory_total'])}")
    lines.append(f"  system info: {L['system_info']}")
    if r.vulkan_devices:
        lines.append("Vulkan loader (vulkaninfo): " + "; ".join(f"{d['index']}: {d['name']} ({d['type']})"
                                                             for d in r.vulkan_devices))
        if any(d["type"] == "cpu" for d in r.vulkan_devices) and "GGML_VK_VISIBLE_DEVICES" not in os.environ:
            lines.append("  CPU-type Vulkan devices (lavapipe) are skipped by llama.cpp unless GGML_VK_VISIBLE_DEVICES "
                         "names their index")
    lines.append(f"ONNX Runtime {onnx['version']}: providers {', '.join(onnx['providers'])}")
    lines.append("  --device: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in onnx["devices"].items())
                 + f"; auto -> {onnx['auto']}")
    if onnx["ep_devices"]:
        lines.append("  device API: " + "; ".join(onnx["ep_devices"]))
    if r.codec_runtimes:
        lines.append("--codec-runtime: " + ", ".join(
            f"{name} {version}" if version else f"{name} not installed (pip install {name})"
            for name, version in r.codec_runtimes.items()))
    lines.append(f"serve with --gpu-layers {r.plan['gpu_layers'] if r.plan['gpu_layers'] != GPU_LAYERS_ALL else 'all'} "
                 f"--device {r.plan['device']} --cp-runtime {r.plan['cp_runtime']} --codec-runtime "
                 f"{r.plan['codec_runtime']}: {r.plan['summary']}")
    lines += [f"problem: {p}" for p in r.problems]
    return "\n".join(lines)
