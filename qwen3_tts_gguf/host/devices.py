"""Which devices this installation has: the llama.cpp backends and devices, the Vulkan loader's view,
and the checks of `--gpu-layers` (the `doctor` report is `qwen3_tts_gguf/doctor.py`; the per-device
locks `host/locks.py`).

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
from dataclasses import dataclass
from pathlib import Path

from qwen3_tts_gguf.host.cpus import import_llama

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
    from qwen3_tts_gguf.host.cpus import quiet_llama_logs

    L = import_llama()

    quiet_llama_logs()  # also llama_backend_init
    backends: list[str] = []
    devices: list[BackendDevice] = []
    try:
        g = _ggml()
        backends = [g.ggml_backend_reg_name(g.ggml_backend_reg_get(i)).decode()
                    for i in range(g.ggml_backend_reg_count())]
        for i in range(g.ggml_backend_dev_count()):
            d = g.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
            devices.append(BackendDevice(
                backend=g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(d)).decode(),
                name=g.ggml_backend_dev_name(d).decode(),
                description=(g.ggml_backend_dev_description(d) or b"").decode(),
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
