"""ONNX Runtime sessions for the code predictor and codec graphs: devices, providers and threads in one place.

`--device` names an ONNX Runtime execution provider by a short name (`DEVICE_PROVIDERS`); only
providers this installation has can be chosen, and asking for one it lacks is an error at start (ONNX
Runtime itself would fall back to the CPU with a warning). `auto` takes the first of `AUTO_ORDER`
that is installed and says which (`resolve_device(...).reason`).

Two kinds of provider: built into the onnxruntime package (CPU; CUDA in onnxruntime-gpu; DirectML,
CoreML, OpenVINO in their own builds), listed by `get_available_providers()` and chosen by name; and
plugin providers shipped as a separate library (`onnxruntime-ep-webgpu`: WebGPU through Dawn, on Vulkan
under Linux), registered with `register_execution_provider_library` and chosen through the device API
(`get_ep_devices()` + `SessionOptions.add_provider_for_devices`), never by a provider name.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from qwen3_tts_gguf.host.cpus import default_threads
from qwen3_tts_gguf.host.devices import ONNX_DEVICES

DEVICE_PROVIDERS: dict[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",        # onnxruntime-gpu (NVIDIA)
    "dml": "DmlExecutionProvider",          # onnxruntime-directml (Windows)
    "coreml": "CoreMLExecutionProvider",    # macOS wheels
    "openvino": "OpenVINOExecutionProvider",  # onnxruntime-openvino (pins its own ONNX Runtime version)
    "webgpu": "WebGpuExecutionProvider",    # plugin: onnxruntime-ep-webgpu
}
DEVICES: tuple[str, ...] = ONNX_DEVICES
"""What `--device` accepts (also without importing onnxruntime: devices.ONNX_DEVICES)."""

AUTO_ORDER: tuple[str, ...] = ("cuda", "dml", "coreml", "cpu")
"""`auto`'s preference. WebGPU and OpenVINO are used only when asked for: neither has run these graphs
in this project (docs/gpu.md); auto keeps to providers built into ONNX Runtime's own packages."""

PLUGIN_PACKAGES: dict[str, str] = {"webgpu": "onnxruntime_ep_webgpu"}
"""Plugin providers: device name -> the Python package that ships the library."""

_registered: dict[str, str] = {}  # device -> registration name (one registration per process)
_register_lock = threading.Lock()


class OnnxDeviceError(ValueError):
    """The device asked for is not available in this ONNX Runtime installation."""


@dataclass(frozen=True)
class OnnxDevice:
    """A resolved `--device`: which device, its provider list, and why (for `auto`)."""

    name: str
    providers: tuple[str, ...]
    reason: str = ""
    plugin: bool = False

    @property
    def provider(self) -> str:
        return self.providers[0]


def _plugin_module(device: str):
    try:
        return importlib.import_module(PLUGIN_PACKAGES[device])
    except ImportError:
        return None


def _register_plugin(device: str) -> bool:
    """Register a plugin provider's library once; False when its package is not installed or ONNX Runtime
    refuses it (too old, a library that does not load)."""
    with _register_lock:
        if device in _registered:
            return True
        module = _plugin_module(device)
        if module is None or not hasattr(ort, "register_execution_provider_library"):
            return False
        name = f"qtts-{device}"
        try:
            ort.register_execution_provider_library(name, module.get_library_path())
        except Exception:  # noqa: BLE001 - an incompatible runtime or a library that does not load
            return False
        _registered[device] = name
        return True


def plugin_ep_devices(device: str) -> list:
    """The OrtEpDevice entries of a plugin provider (registering it first); [] when it has none."""
    if device not in PLUGIN_PACKAGES or not _register_plugin(device):
        return []
    ep_name = DEVICE_PROVIDERS[device]
    return [d for d in ort.get_ep_devices() if d.ep_name == ep_name]


def available_devices() -> dict[str, bool]:
    """Every device name of `DEVICE_PROVIDERS` -> whether this installation offers it (for a plugin:
    its package is installed, registers, and reports at least one device)."""
    built_in = set(ort.get_available_providers())
    return {name: (bool(plugin_ep_devices(name)) if name in PLUGIN_PACKAGES else provider in built_in)
            for name, provider in DEVICE_PROVIDERS.items()}


def resolve_device(device: str = "cpu") -> OnnxDevice:
    """`--device` -> the device to use. OnnxDeviceError for an unknown name or one not installed."""
    if device not in DEVICES:
        raise OnnxDeviceError(f"unknown ONNX device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        built_in = set(ort.get_available_providers())
        for name in AUTO_ORDER:
            if DEVICE_PROVIDERS[name] in built_in:
                skipped = AUTO_ORDER[:AUTO_ORDER.index(name)]
                why = "auto" + (f"; not installed: {', '.join(skipped)}" if skipped else "")
                return _device(name, why)
        raise OnnxDeviceError("auto: this ONNX Runtime offers none of " + ", ".join(AUTO_ORDER))
    if device in PLUGIN_PACKAGES:
        if _plugin_module(device) is None:
            raise OnnxDeviceError(f"--device {device} needs the {PLUGIN_PACKAGES[device].replace('_', '-')} package "
                                  "(a plugin execution provider for ONNX Runtime)")
        if not plugin_ep_devices(device):
            raise OnnxDeviceError(f"--device {device}: the {DEVICE_PROVIDERS[device]} plugin is installed but "
                                  "reports no device (on Linux it needs a Vulkan driver and loader, libvulkan.so.1)")
        return OnnxDevice(device, (DEVICE_PROVIDERS[device], "CPUExecutionProvider"), plugin=True)
    installed = ort.get_available_providers()
    if DEVICE_PROVIDERS[device] not in installed:
        hint = {"cuda": " (install onnxruntime-gpu in place of onnxruntime)",
                "openvino": " (onnxruntime-openvino, which pins its own ONNX Runtime version)",
                "dml": " (onnxruntime-directml, Windows)"}.get(device, "")
        raise OnnxDeviceError(f"--device {device}: this ONNX Runtime has no {DEVICE_PROVIDERS[device]}{hint}; "
                              f"installed: {', '.join(installed)}")
    return _device(device, "")


def _device(name: str, reason: str) -> OnnxDevice:
    providers = (DEVICE_PROVIDERS[name],) if name == "cpu" else (DEVICE_PROVIDERS[name], "CPUExecutionProvider")
    return OnnxDevice(name, providers, reason)


def resolve_providers(device: str = "cpu") -> list[str]:
    """Execution providers for a device setting (kept for callers that only need the names)."""
    return list(resolve_device(device).providers)


def session_options(threads: int | None = None) -> ort.SessionOptions:
    """Full graph optimisation, `threads` intra-op threads (default: the usable CPUs), no spinning."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = default_threads(threads)
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # idle ORT threads must not spin: llama.cpp runs right after on the same cores (measured: talker
    # step in the engine loop 38 -> 19 ms, real-time factor 2.00 -> 1.68 on 2 cores); spinning only
    # within a run (`session.force_spinning_stop`) made a code predictor call faster (64 -> 53 ms) but
    # fought the overlapped codec: one stream's RTF 1.45 -> 1.47, eight streams' 0.83 -> 0.97
    # (`python -m bench.experiments codec-overlap` with those entries, 2026-12-01 18:14)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # ORT's dynamic block sizing (`session.dynamic_block_base` 4 or 8) made a code predictor call alone
    # 10-20 % faster (68 -> 55-61 ms) but the engine no faster: one stream's RTF 1.77 / 1.67 / 1.73 and
    # 1.77 / 1.80 / 1.78 (default / 4 / 8, 0.6B, two runs of 6 and 8 alternating rounds, 2026-12-02 13:09)
    # no CPU arena: it kept the codec's largest activations for good (+130 MB resident at 0.6B) and
    # measured no faster for either graph (docs/benchmarks.md, Memory)
    opts.enable_cpu_mem_arena = False
    return opts


def make_session(path: str | Path, *, threads: int | None = None,
                 device: str | OnnxDevice = "cpu") -> ort.InferenceSession:
    """An InferenceSession for `path` on `device`. When ONNX Runtime does not put the graph on the
    provider asked for (a provider library that fails to load makes it fall back to the CPU with only a
    warning), this raises OnnxDeviceError rather than run somewhere else silently."""
    dev = device if isinstance(device, OnnxDevice) else resolve_device(device)
    opts = session_options(threads)
    if dev.plugin:
        opts.add_provider_for_devices(plugin_ep_devices(dev.name)[:1], {})
        session = ort.InferenceSession(str(path), sess_options=opts)
    else:
        session = ort.InferenceSession(str(path), sess_options=opts, providers=list(dev.providers))
    used = session.get_providers()
    if dev.provider not in used:
        raise OnnxDeviceError(f"{Path(path).name}: ONNX Runtime did not use {dev.provider} (session providers: "
                              f"{', '.join(used)}); see `python -m qwen3_tts_gguf doctor`")
    if dev.name == "cpu":
        return session
    from qwen3_tts_gguf.host.locks import onnx_device_lock

    lock = onnx_device_lock(dev.name, dev.provider)
    return DeviceSession(session, lock) if lock is not None else session


class DeviceSession:
    """An InferenceSession on a GPU device whose `run` holds that device's lock (locks.DeviceLock);
    everything else is the session's own."""

    def __init__(self, session: ort.InferenceSession, lock):
        self._session = session
        self.device_lock = lock

    def run(self, *args, **kwargs):
        with self.device_lock.hold():
            return self._session.run(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._session, name)
