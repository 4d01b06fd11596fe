"""One lock per GPU device: talker, code predictor and codec on one device never interleave their work."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext

from qwen3_tts_gguf.host.devices import llama_runtime


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


def hold_devices(locks: Sequence[DeviceLock]) -> AbstractContextManager[None]:
    """Hold several device locks (a talker split over GPUs), always in name order (no deadlock); none (a
    model on the CPU): nothing to hold, at no cost."""
    return _hold_all(locks) if locks else nullcontext()


@contextmanager
def _hold_all(locks: Sequence[DeviceLock]) -> Iterator[None]:
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
