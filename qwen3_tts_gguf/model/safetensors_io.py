"""Read `.safetensors` files with numpy alone, BF16 included.

numpy has no bfloat16, so BF16 tensors are widened to float32 by shifting their raw 16-bit
words into the high half of a 32-bit word (exact). Tensors are memory-mapped and materialised
on access, so a 4 GB checkpoint costs only what is read.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


class SafetensorsError(ValueError):
    """A safetensors file that cannot be read."""


def bf16_to_f32(words: np.ndarray) -> np.ndarray:
    """Widen raw BF16 words (uint16) to float32, exactly."""
    return (words.astype(np.uint32) << 16).view(np.float32)


_MAX_HEADER = 100_000_000  # bytes of JSON header; real checkpoints have well under 1 MB


def _read_header(path: Path) -> tuple[dict, int]:
    """The header's JSON object and its length, checked against the file's size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(_MAX_HEADER, size - 8):
            raise SafetensorsError(f"{path}: header length {header_len} is implausible for a {size}-byte file")
        header = json.loads(f.read(header_len))
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object")
    return header, header_len


def _check_entry(path: Path, name: str, info: object, data_size: int) -> None:
    """One tensor's header entry: known dtype, non-negative shape, offsets that exactly hold it."""
    def ints(v: object, n: int | None = None) -> bool:
        return isinstance(v, list) and (n is None or len(v) == n) and all(type(x) is int for x in v)

    if not isinstance(info, dict) or not ints(info.get("shape")) or not ints(info.get("data_offsets"), 2):
        raise SafetensorsError(f"{path}: tensor {name} has a malformed header entry {info!r}")
    dtype, shape, (start, end) = info.get("dtype"), info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {dtype}")
    if any(d < 0 for d in shape):
        raise SafetensorsError(f"{path}: tensor {name} has a negative dimension in shape {shape}")
    if not 0 <= start <= end:
        raise SafetensorsError(f"{path}: tensor {name} has data offsets [{start}, {end}] out of order")
    if end > data_size:
        raise SafetensorsError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
    expected = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if end - start != expected:
        raise SafetensorsError(f"{path}: tensor {name} has {end - start} bytes of data but {dtype} {shape} "
                               f"needs {expected}")


class SafetensorsFile(Mapping):
    """A read-only mapping name -> np.ndarray over one .safetensors file (float tensors as f32).

    Opening checks the whole header (raising SafetensorsError, a ValueError, naming the tensor), so
    a damaged or hostile file fails here rather than in a reshape later."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            header, header_len = _read_header(self.path)
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SafetensorsError(f"{self.path}: not a readable safetensors file ({e})") from e
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise SafetensorsError(f"{self.path}: __metadata__ is not a JSON object")
        self.metadata = metadata
        self._entries = header
        self._offset = 8 + header_len
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        for name, info in header.items():
            _check_entry(self.path, name, info, self._data.size - self._offset)

    def dtype_of(self, name: str) -> str:
        """The stored dtype name (e.g. "BF16", "F32")."""
        return self._entries[name]["dtype"]

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def raw(self, name: str) -> np.ndarray:
        """The stored array as a read-only memory map (BF16 as raw uint16 words)."""
        info = self._entries[name]
        start, end = info["data_offsets"]
        raw = self._data[self._offset + start : self._offset + end]
        return raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])

    def __getitem__(self, name: str) -> np.ndarray:
        info = self._entries[name]
        arr = self.raw(name)
        if info["dtype"] == "BF16":
            return bf16_to_f32(arr)
        if info["dtype"] in ("F16", "F64"):
            return arr.astype(np.float32)
        return np.asarray(arr)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def write_safetensors(path: str | Path, tensors: Mapping[str, np.ndarray], metadata: dict | None = None) -> None:
    """Write tensors (f32/f16/int arrays, or ("BF16", uint16 array) pairs) to a .safetensors file."""
    names = {v: k for k, v in _DTYPES.items() if k != "BF16"}
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    blobs = []
    for name, value in tensors.items():
        if isinstance(value, tuple):
            dtype, arr = value
        else:
            arr = np.ascontiguousarray(value)
            dtype = names[arr.dtype.type]
        nbytes = arr.nbytes
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + nbytes]}
        blobs.append(np.ascontiguousarray(arr))
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob.tobytes())
