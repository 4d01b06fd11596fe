"""heap.py: glibc maps large blocks on their own once the engine sets its threshold (checked on the block
itself, in a fresh process each: the setting is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qwen3_tts_gguf.host.heap import MAP_THRESHOLD

PROBE = """
import ctypes, sys
from qwen3_tts_gguf.host.heap import map_large_blocks
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
was_set = map_large_blocks(int(sys.argv[1]))
libc.free(libc.malloc(4 << 20))  # glibc's dynamic threshold rises to this block's size when it is freed
block = libc.malloc(4 << 20)
mapped = bool(ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value & 2)  # IS_MMAPPED
print(was_set, mapped)
"""


def _probe(threshold: int, **env: str) -> tuple[str, str]:
    import os

    out = subprocess.run([sys.executable, "-c", PROBE, str(threshold)], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}, timeout=60)
    was_set, mapped = out.stdout.split()
    return was_set, mapped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc")
def test_large_blocks_are_mapped_once_the_threshold_is_fixed():
    assert _probe(MAP_THRESHOLD) == ("True", "True")
    assert _probe(0) == ("False", "False")  # glibc's own: the freed block raised its threshold
    assert _probe(8 << 20) == ("True", "False")  # below the threshold: from the heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc")
def test_the_environment_wins():
    assert _probe(MAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_=str(64 << 20))[0] == "False"
    assert _probe(MAP_THRESHOLD, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=16777216") == ("False", "False")
