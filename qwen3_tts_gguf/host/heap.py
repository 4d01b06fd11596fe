"""The process heap under glibc's malloc: where large blocks go, and giving freed heap back.

glibc keeps a freed block in its heap for reuse, and after each large block freed it raises the size
from which blocks are mapped on their own (its dynamic mmap threshold, up to 32 MiB). The ONNX
Runtime calls' activations (a codec call's are tens of MiB) then stay in the heaps of every thread
that ran one: with eight streams about 250 MiB more at the peak than is ever in use at once. A fixed
threshold of 1 MiB maps those blocks and unmaps them when freed, for no loss of speed measured that
day (`python -m bench.experiments malloc`, 2026-12-01 22:27-22:36, side by side: 0.6B default preset,
eight streams' RTF 0.87 -> 0.85, peak 2212 -> 1955 MiB; `--preset fast` with KV cache q4_0 0.81 ->
0.82, 1756 -> 1503 MiB). At 128 KiB the page faults of every mid-sized block cost eight streams
about 15 % (0.86 -> 0.99, 20:47). On another day's host the same comparison went both ways
(2026-12-02, glibc's threshold -> 1 MiB): `--preset fast`, twice (runs saved at 04:24 and 04:26), one
stream 1.22 -> 1.26 and 1.39 -> 1.40, eight streams 0.95 -> 1.08 and 0.94 -> 1.07, peak 1760 -> 1674
and 1786 -> 1674 MiB; the default preset (saved at 04:29) one stream 1.75 -> 1.74, eight streams 0.97
-> 0.93, peak 2027 -> 1929 MiB. The bound on memory stays the default; `--heap-map-threshold 0` gives
glibc's choice back. Nothing happens where there is no glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("qwen3_tts_gguf.host.heap")

MAP_THRESHOLD = 1 << 20
"""Bytes from which glibc maps a block on its own (EngineSettings.heap_map_threshold's default)."""

MAX_MAP_THRESHOLD = 32 << 20
"""The largest threshold asked (glibc's own dynamic threshold stops there on 64-bit systems)."""

_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def _set_by_environment() -> bool:
    """Whether glibc read a threshold from the environment at start (its own two ways)."""
    return bool(os.environ.get("MALLOC_MMAP_THRESHOLD_")) or "malloc.mmap_threshold" in os.environ.get(
        "GLIBC_TUNABLES", "")


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def map_large_blocks(threshold: int = MAP_THRESHOLD) -> bool:
    """Have glibc map every block of at least `threshold` bytes on its own and unmap it when freed, for
    the whole process; 0, or a threshold the environment already sets (MALLOC_MMAP_THRESHOLD_,
    GLIBC_TUNABLES' glibc.malloc.mmap_threshold), leaves malloc as it is. True if it was set."""
    if threshold <= 0:
        return False
    if _set_by_environment():
        log.info("malloc's mmap threshold is set by the environment; leaving it")
        return False
    libc = _libc()
    try:
        return bool(libc and libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(threshold)))
    except AttributeError:  # a libc without mallopt
        return False


def release_freed_heap() -> None:
    """Give the heap that loading freed back to the system: glibc keeps it otherwise (ONNX Runtime's
    load-time copies; about 60 MiB at 0.6B)."""
    libc = _libc()
    try:
        if libc:
            libc.malloc_trim(0)
    except AttributeError:
        pass
