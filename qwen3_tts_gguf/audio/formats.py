"""The audio formats this project writes and the one rule that turns float samples into 16-bit integers
(`to_s16`: `pcm`, `wav` and `flac` output is bit-exact to it): names, MIME types, file extensions, the WAV
header, the speed domain. The encoders: `encoding.py` (streams), `file_writer.py` (the CLI's files),
`telephony.py` (G.711 and resampling)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

SAMPLE_RATE = 24000
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MIME_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # Opus in an Ogg container
    "aac": "audio/aac",  # ADTS
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",  # s16le mono at the encoder's sample rate (24 kHz by default)
}
G711_FORMATS = ("pcmu", "pcma")
"""Formats `StreamingEncoder` also writes (not the speech route's): G.711 mu-law and A-law at 8 kHz."""
G711_RATE = 8000
G711_MIME_TYPES = {"pcmu": "audio/pcmu", "pcma": "audio/pcma"}  # RFC 3551's PCMU / PCMA
# file extension (lower case, no dot) -> format
EXTENSIONS = {
    "wav": "wav",
    "flac": "flac",
    "mp3": "mp3",
    "opus": "opus",
    "ogg": "opus",
    "aac": "aac",
    "pcm": "pcm",
}
MIN_SPEED = 0.25
MAX_SPEED = 4.0

_WAV_UNKNOWN_SIZE = 0xFFFFFFFF


def to_s16(samples: np.ndarray) -> np.ndarray:
    """Convert float samples to int16 with the project's one rule.

    Rule: clip to [-1, 1], multiply by 32767, round half to even (``np.rint``). The product is
    formed in float64, where it is exact for float32 input, so the rounding is exact too. NaN
    becomes 0 and +-inf becomes +-32767. Integer input is rejected (it is not in [-1, 1] scale).
    """
    x = np.asarray(samples)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"to_s16 expects float samples in [-1, 1], got dtype {x.dtype}")
    x = np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.rint(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


def wav_header(sample_rate: int = SAMPLE_RATE, num_samples: int | None = None) -> bytes:
    """44-byte RIFF/WAVE header for s16le mono.

    ``num_samples=None`` writes the streaming convention: RIFF and data sizes = 0xFFFFFFFF
    ("unknown"); otherwise the true sizes (clamped to 0xFFFFFFFF for files over 4 GiB).
    """
    if num_samples is None:
        riff_size = data_size = _WAV_UNKNOWN_SIZE
    else:
        data_size = min(2 * num_samples, _WAV_UNKNOWN_SIZE - 36)
        riff_size = 36 + data_size
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", riff_size, b"WAVE",
        b"fmt ", 16, 1, 1, sample_rate, 2 * sample_rate, 2, 16,
        b"data", data_size,
    )  # fmt: skip


def format_from_path(path: str | os.PathLike[str]) -> str:
    """Output format for a file name by its extension (see `EXTENSIONS`); ValueError if unknown."""
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in EXTENSIONS:
        known = ", ".join(f".{e}" for e in EXTENSIONS)
        raise ValueError(f"cannot tell the audio format of {str(path)!r}: use one of {known}")
    return EXTENSIONS[ext]


def check_format(format: str) -> str:
    if format not in FORMATS:
        expected = ", ".join(FORMATS)
        raise ValueError(f"unsupported audio format {format!r}; expected one of {expected}")
    return format


def check_speed(speed: float) -> float:
    try:
        value = float(speed)
    except (TypeError, ValueError):
        raise ValueError(f"speed must be a number, got {speed!r}") from None
    if not (MIN_SPEED <= value <= MAX_SPEED):  # also rejects NaN
        raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed!r}")
    return value
