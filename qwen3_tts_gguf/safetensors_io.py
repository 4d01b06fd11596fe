"""Read `.safetensors` files with numpy alone, BF16 included.

numpy has no bfloat16, so BF16 tensors are widened to float32 by shifting their raw 16-bit
words into the high half of a 32-bit word (exact). Tensors are memory-mapped and materialised
on access, so a 4 GB checkpoint costs only what is read.
"""

from __future__ import annotations

import json
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


class SafetensorsFile(Mapping):
    """A read-only mapping name -> np.ndarray over one .safetensors file (float tensors as f32)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                if header_len > 100_000_000:
                    raise SafetensorsError(f"{self.path}: implausible header length {header_len}")
                header = json.loads(f.read(header_len))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SafetensorsError(f"{self.path}: not a readable safetensors file ({e})") from e
        self.metadata = header.pop("__metadata__", {}) or {}
        self._entries = header
        self._offset = 8 + header_len
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        for name, info in header.items():
            if info.get("dtype") not in _DTYPES:
                raise SafetensorsError(f"{self.path}: tensor {name} has unsupported dtype {info.get('dtype')}")
            start, end = info["data_offsets"]
            if self._offset + end > self._data.size:
                raise SafetensorsError(f"{self.path}: tensor {name} runs past the end of the file (truncated?)")

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
