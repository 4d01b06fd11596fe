"""Where and how much to compute: the llama.cpp backends and devices of this installation, the ONNX
Runtime providers, and what the engine would use (`python -m qwen3_tts_gguf doctor`).

llama-cpp-python's bindings expose `llama_supports_gpu_offload` and `llama_print_system_info` but not
ggml's backend registry; that is read here through ctypes from the same libggml that llama_cpp loaded
(its `lib/` folder, or LLAMA_CPP_LIB_PATH). A llama.cpp build without a GPU backend, or one whose GPU
backend sees no GPU device, puts every layer on the CPU whatever `n_gpu_layers` says; asking for GPU
layers there is refused at start (`check_gpu_layers`).

Vulkan note: llama.cpp skips CPU-type Vulkan devices (Mesa's lavapipe, "llvmpipe") unless
GGML_VK_VISIBLE_DEVICES names their index; `vulkan_physical_devices` lists what the Vulkan loader
sees (vulkaninfo) so that the report can say so.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .cpus import import_llama

ONNX_DEVICES = ("cpu", "auto", "cuda", "dml", "coreml", "openvino", "webgpu")
"""What `--device` accepts (onnx_session.DEVICE_PROVIDERS maps each to its execution provider)."""

GPU_LAYERS_ALL = -1
"""`--gpu-layers all`: every repeating layer and the output layer (llama.cpp's n_gpu_layers -1)."""

_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}  # enum ggml_backend_dev_type
GPU_KINDS = ("gpu", "igpu")
NON_GPU_BACKENDS = ("CPU", "BLAS", "RPC", "AMX")


class DeviceError(ValueError):
    """A device setting this installation cannot honour (reported as one line at start)."""


@dataclass(frozen=True)
class BackendDevice:
    """One device of ggml's registry."""

    backend: str
    name: str
    description: str
    kind: str  # cpu | gpu | igpu | accel | meta
    memory_total: int
    memory_free: int


@dataclass(frozen=True)
class LlamaRuntime:
    """The llama.cpp this Python loads."""

    version: str
    library_dir: str
    gpu_offload: bool  # llama_supports_gpu_offload(): a GPU device is seen
    backends: tuple[str, ...]
    devices: tuple[BackendDevice, ...]
    system_info: str

    @property
    def gpu_devices(self) -> tuple[BackendDevice, ...]:
        return tuple(d for d in self.devices if d.kind in GPU_KINDS)

    @property
    def gpu_backends(self) -> tuple[str, ...]:
        """Backends of this build that drive a GPU (Vulkan, CUDA, Metal, ...), whether or not they see one.
        (`gpu_offload`, llama.cpp's `llama_supports_gpu_offload`, is only true once a GPU device is seen.)"""
        return tuple(b for b in self.backends if b not in NON_GPU_BACKENDS)


def llama_library_dir() -> Path:
    """The folder llama_cpp loads libllama and libggml from."""
    llama_cpp = import_llama()
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    return Path(override) if override else Path(llama_cpp.__file__).resolve().parent / "lib"


def _ggml() -> ctypes.CDLL:
    """libggml (the registry), after llama_cpp has loaded it: the same library, so the same registry."""
    import_llama()  # loads libllama and its libggml first

    folder = llama_library_dir()
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (folder / name).exists():
            lib = ctypes.CDLL(str(folder / name))
            break
    else:
        raise OSError(f"no libggml in {folder}")
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for fn, args, res in (("ggml_backend_reg_count", [], sz), ("ggml_backend_reg_get", [sz], vp),
                          ("ggml_backend_reg_name", [vp], ctypes.c_char_p),
                          ("ggml_backend_dev_count", [], sz), ("ggml_backend_dev_get", [sz], vp),
                          ("ggml_backend_dev_name", [vp], ctypes.c_char_p),
                          ("ggml_backend_dev_description", [vp], ctypes.c_char_p),
                          ("ggml_backend_dev_type", [vp], ctypes.c_int),
                          ("ggml_backend_dev_backend_reg", [vp], vp),
                          ("ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None)):
        f = getattr(lib, fn)
        f.argtypes, f.restype = args, res
    return lib


def llama_runtime() -> LlamaRuntime:
    """Backends and devices of the llama.cpp this Python loads (the registry is filled on first use)."""
    from .talker import quiet_llama_logs

    L = import_llama()

    quiet_llama_logs()  # also llama_backend_init
    backends: list[str] = []
    devices: list[BackendDevice] = []
    try:
        g = _ggml()
        backends = [g.ggml_backend_reg_name(g.ggml_backend_reg_get(i)).decode() for i in range(g.ggml_backend_reg_count())]
        for i in range(g.ggml_backend_dev_count()):
            d = g.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
            devices.append(BackendDevice(
                backend=g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(d)).decode(),
                name=g.ggml_backend_dev_name(d).decode(), description=(g.ggml_backend_dev_description(d) or b"").decode(),
                kind=_DEVICE_TYPES.get(g.ggml_backend_dev_type(d), "unknown"),
                memory_total=total.value, memory_free=free.value))
    except (OSError, AttributeError):  # a libggml without the registry API: system info only
        pass
    return LlamaRuntime(version=getattr(L, "__version__", "?"), library_dir=str(llama_library_dir()),
                        gpu_offload=bool(L.llama_supports_gpu_offload()), backends=tuple(backends),
                        devices=tuple(devices), system_info=L.llama_print_system_info().decode().strip())


def vulkan_physical_devices() -> list[dict[str, str]]:
    """What the Vulkan loader sees (`vulkaninfo --summary`), in its order: index, name, type.
    [] when vulkaninfo is not installed or finds nothing."""
    exe = shutil.which("vulkaninfo")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--summary"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found: list[dict[str, str]] = []
    for block in re.split(r"\n(?=GPU\d+:)", out):
        m = re.match(r"GPU(\d+):", block.strip())
        if not m:
            continue
        info = dict(re.findall(r"^\s*(\w+)\s*=\s*(.*)$", block, re.M))
        found.append({"index": m.group(1), "name": info.get("deviceName", "?"),
                      "type": info.get("deviceType", "?").replace("PHYSICAL_DEVICE_TYPE_", "").lower()})
    return found


def lavapipe_index() -> int | None:
    """The Vulkan index of Mesa's software device (llvmpipe), or None."""
    for d in vulkan_physical_devices():
        if "llvmpipe" in d["name"].lower():
            return int(d["index"])
    return None


def parse_gpu_layers(text: str) -> int:
    """`--gpu-layers`: a count >= 0, or `all` (-1)."""
    import argparse

    if text.strip().lower() in ("all", "-1"):
        return GPU_LAYERS_ALL
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a layer count or 'all'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is out of range (0 or more, or 'all')")
    return value


def _no_gpu_hint() -> str:
    hint = ""
    found = vulkan_physical_devices()
    if found and all(d.get("type") == "cpu" for d in found):
        idx = lavapipe_index()
        hint = (f"; the Vulkan loader sees only a CPU-type device (lavapipe, index {idx}), which llama.cpp "
                f"uses only when GGML_VK_VISIBLE_DEVICES={idx} is set")
    return hint


def check_gpu_layers(gpu_layers: int, runtime: LlamaRuntime | None = None) -> None:
    """DeviceError when GPU layers are asked for but this llama.cpp cannot offload: no GPU backend in
    the build, or a GPU backend that sees no GPU device (llama.cpp would silently run on the CPU)."""
    if not gpu_layers:
        return
    rt = runtime or llama_runtime()
    asked = "all" if gpu_layers == GPU_LAYERS_ALL else str(gpu_layers)
    if not rt.gpu_backends:
        raise DeviceError(
            f"--gpu-layers {asked}: this llama.cpp build has no GPU backend (backends: "
            f"{', '.join(rt.backends) or 'CPU'}; {rt.library_dir}). Build one: scripts/build-vulkan.sh "
            "(Vulkan, into .venv-vulkan), or CMAKE_ARGS=-DGGML_CUDA=on pip install --no-cache-dir "
            "--force-reinstall llama-cpp-python (README, GPU backends); or drop --gpu-layers")
    if not rt.gpu_devices:
        raise DeviceError(f"--gpu-layers {asked}: this llama.cpp's GPU backend ({', '.join(rt.gpu_backends)}) sees "
                          f"no GPU device{_no_gpu_hint()}")


def check_device_settings(gpu_layers: int, device: str, codec_runtime: str = "onnxruntime",
                          deterministic: bool = False) -> str:
    """The device settings checked at start (serve, synth): DeviceError (a ValueError) naming what is
    missing; otherwise one line saying where the work will run."""
    from .onnx_session import OnnxDeviceError, resolve_device
    from .openvino_session import CodecRuntimeError, check_codec_runtime

    check_gpu_layers(gpu_layers)
    try:
        onnx = resolve_device(device)
        codec = check_codec_runtime(codec_runtime, device, deterministic)
    except (OnnxDeviceError, CodecRuntimeError) as e:
        raise DeviceError(str(e)) from e
    return describe_plan(gpu_layers, onnx.provider + (f" ({onnx.reason})" if onnx.reason else ""), codec=codec)


def describe_plan(gpu_layers: int, onnx_provider: str, runtime: LlamaRuntime | None = None, codec: str = "") -> str:
    """Where each stage runs, in one line; `codec`: the codec's own words when it does not run on ONNX Runtime."""
    if not gpu_layers:
        talker = "talker on the CPU"
    else:
        rt = runtime or llama_runtime()
        names = ", ".join(f"{d.name} ({d.description})" for d in rt.gpu_devices) or "no GPU device"
        layers = "all layers" if gpu_layers == GPU_LAYERS_ALL else f"{gpu_layers} layers"
        talker = f"talker: {layers} on {names}"
    if codec:
        return f"{talker}; code predictor on {onnx_provider}; {codec}"
    return f"{talker}; code predictor and codec on {onnx_provider}"


@dataclass
class Report:
    """What `doctor` prints (also as JSON)."""

    llama: dict
    onnx: dict
    vulkan_devices: list[dict[str, str]]
    plan: dict
    problems: list[str] = field(default_factory=list)
    codec_runtimes: dict[str, str | None] = field(default_factory=dict)  # --codec-runtime -> version, None: not installed


def report(gpu_layers: int = 0, device: str = "cpu") -> Report:
    """Everything `doctor` says, for the device settings given (serve's defaults when none)."""
    import onnxruntime as ort

    from .onnx_session import OnnxDeviceError, available_devices, resolve_device
    from .openvino_session import openvino_version

    rt = llama_runtime()
    problems: list[str] = []
    try:
        check_gpu_layers(gpu_layers, rt)
    except DeviceError as e:
        problems.append(str(e))
    try:
        onnx = resolve_device(device)
        onnx_line = onnx.provider + (f" ({onnx.reason})" if onnx.reason else "")
    except OnnxDeviceError as e:
        problems.append(str(e))
        onnx_line = "unavailable"
    auto = resolve_device("auto")
    ep_devices = []
    if hasattr(ort, "get_ep_devices"):
        try:
            ep_devices = [f"{d.ep_name}: {getattr(d.device, 'type', '?')} {getattr(d.device, 'vendor', '')}".strip()
                          for d in ort.get_ep_devices()]
        except Exception:  # noqa: BLE001 - an older runtime's device API
            ep_devices = []
    llama = asdict(rt)
    llama["gpu_devices"] = [d.name for d in rt.gpu_devices]
    llama["gpu_backends"] = list(rt.gpu_backends)
    return Report(
        llama=llama,
        onnx={"version": ort.__version__, "providers": ort.get_available_providers(),
              "devices": available_devices(), "ep_devices": ep_devices,
              "auto": auto.provider + (f" ({auto.reason})" if auto.reason else "")},
        vulkan_devices=vulkan_physical_devices(),
        plan={"gpu_layers": gpu_layers, "device": device,
              "summary": describe_plan(gpu_layers, onnx_line, rt) if not problems else "refused at start",
              "env": {k: os.environ[k] for k in ("GGML_VK_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                                                  "LLAMA_CPP_LIB_PATH") if k in os.environ}},
        problems=problems,
        codec_runtimes={"onnxruntime": ort.__version__, "openvino": openvino_version()})


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "?"


def format_report(r: Report) -> str:
    L, O = r.llama, r.onnx
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
    lines.append(f"ONNX Runtime {O['version']}: providers {', '.join(O['providers'])}")
    lines.append("  --device: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in O["devices"].items())
                 + f"; auto -> {O['auto']}")
    if O["ep_devices"]:
        lines.append("  device API: " + "; ".join(O["ep_devices"]))
    if r.codec_runtimes:
        lines.append("--codec-runtime: " + ", ".join(
            f"{name} {version}" if version else f"{name} not installed (pip install {name})"
            for name, version in r.codec_runtimes.items()))
    lines.append(f"serve with --gpu-layers {r.plan['gpu_layers'] if r.plan['gpu_layers'] != GPU_LAYERS_ALL else 'all'} "
                 f"--device {r.plan['device']}: {r.plan['summary']}")
    lines += [f"problem: {p}" for p in r.problems]
    return "\n".join(lines)


# -- one lock per GPU device -------------------------------------------------------------------------------
class DeviceLock:
    """Serialises the work of every model in the process on one GPU device: the talker's decodes and
    the ONNX sessions' runs on it take this lock, so kernels of several served models never interleave
    or oversubscribe the device. CPU work takes no lock (CPU overlap stays). Counts how long work
    waited for the device and held it (`device_lock_stats`, for /metrics)."""

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._stats = threading.Lock()
        self.acquisitions = 0
        self.waited_s = 0.0
        self.held_s = 0.0
        self.max_wait_s = 0.0

    @contextmanager
    def hold(self) -> Iterator[None]:
        t0 = time.perf_counter()
        self._lock.acquire()
        t1 = time.perf_counter()
        try:
            yield
        finally:
            t2 = time.perf_counter()
            self._lock.release()
            with self._stats:
                self.acquisitions += 1
                self.waited_s += t1 - t0
                self.held_s += t2 - t1
                self.max_wait_s = max(self.max_wait_s, t1 - t0)


_DEVICE_LOCKS: dict[str, DeviceLock] = {}
_DEVICE_LOCKS_GUARD = threading.Lock()


def device_lock(name: str) -> DeviceLock:
    """The process-wide lock of GPU device `name` (llama.cpp's device names: Vulkan0, CUDA0, ...)."""
    with _DEVICE_LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(name, DeviceLock(name))


@contextmanager
def hold_devices(locks: Sequence[DeviceLock]) -> Iterator[None]:
    """Hold several device locks (a talker split over GPUs), always in name order (no deadlock)."""
    with ExitStack() as stack:
        for lock in sorted(locks, key=lambda d: d.name):
            stack.enter_context(lock.hold())
        yield


def talker_device_locks(gpu_layers: int) -> tuple[DeviceLock, ...]:
    """The locks of the devices llama.cpp offloads to (all GPU devices it sees); none on the CPU."""
    if not gpu_layers:
        return ()
    return tuple(device_lock(d.name) for d in llama_runtime().gpu_devices)


def onnx_device_lock(device_name: str, provider: str) -> DeviceLock | None:
    """The lock an ONNX Runtime session on `device_name` takes (None on the CPU). CUDA's device 0 is
    llama.cpp's CUDA0 and WebGPU runs on the first Vulkan device, so talker and graphs share a lock
    when they share a device."""
    if device_name == "cpu":
        return None
    if device_name == "cuda":
        return device_lock("CUDA0")
    if device_name == "webgpu":
        try:
            vulkan = [d.name for d in llama_runtime().gpu_devices if d.backend.lower().startswith("vulkan")]
        except (ImportError, OSError):
            vulkan = []
        return device_lock(vulkan[0] if vulkan else "WebGPU0")
    return device_lock(provider.removesuffix("ExecutionProvider") + "0")


def device_lock_stats() -> dict[str, dict[str, float]]:
    """Per GPU device: acquisitions, seconds waited and held in all, the longest wait."""
    with _DEVICE_LOCKS_GUARD:
        locks = list(_DEVICE_LOCKS.values())
    out = {}
    for lock in locks:
        with lock._stats:
            out[lock.name] = {"acquisitions": lock.acquisitions, "waited_s": lock.waited_s,
                              "held_s": lock.held_s, "max_wait_s": lock.max_wait_s}
    return out


def prometheus_lines() -> list[str]:
    """The device-lock counters in Prometheus' text format (for api/metrics.py to append)."""
    stats = device_lock_stats()
    lines: list[str] = []
    for metric, key, kind, text in (
            ("qtts_device_wait_seconds_total", "waited_s", "counter", "seconds work waited for a GPU device's lock"),
            ("qtts_device_busy_seconds_total", "held_s", "counter", "seconds a GPU device's lock was held"),
            ("qtts_device_acquisitions_total", "acquisitions", "counter", "times a GPU device's lock was taken"),
            ("qtts_device_max_wait_seconds", "max_wait_s", "gauge", "longest single wait for a GPU device's lock")):
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
        lines += [f'{metric}{{device="{name}"}} {values[key]!r}' for name, values in sorted(stats.items())]
    return lines
