"""Streaming audio encoders for the engine's output (24 kHz mono float32 chunks).

One rule turns float samples into 16-bit integers everywhere (`to_s16`), so `pcm`, `wav` and
`flac` output is bit-exact to it. On top of that:

- `StreamingEncoder`: one per request. `encode(chunk)` returns the bytes that are ready now
  (possibly ``b""``), `finish()` returns the rest. The byte stream is one continuous file in the
  requested format (OpenAI `response_format`):

  =====  ===========================================  ==============
  mp3    MPEG Layer III, libmp3lame CBR, no ID3/Xing   audio/mpeg
  opus   Opus (libopus) in Ogg, one page per ~20 ms    audio/ogg
  aac    AAC-LC (FFmpeg native) in ADTS framing        audio/aac
  flac   FLAC stream (STREAMINFO length = 0, unknown;  audio/flac
         `final_header` after `finish`: the true one)
  wav    44-byte RIFF header with 0xFFFFFFFF sizes     audio/wav
         (the streaming convention), then s16le
  pcm    raw s16le mono, no header                     audio/pcm
  =====  ===========================================  ==============

  The compressed formats are muxed by PyAV (bundled FFmpeg) into a write-only sink, so the muxers
  never seek back and every byte can leave as soon as it is written. A FLAC's STREAMINFO (total
  samples, frame sizes, MD5) is known only at the end: `final_header()` gives it then, for whoever
  holds the whole file (`AudioFileWriter`, the speech route's FLAC) to write over the streamed one.

- G.711 for telephony and OpenAI's Realtime API (`G711_FORMATS`, not speech-route formats): `pcmu`
  (mu-law) and `pcma` (A-law), 8 kHz, one byte per sample, no header. The encoder resamples its
  input to 8 kHz with soxr's streaming resampler (`StreamResampler`: chunks in, the same samples as
  one whole-signal resampling out, its filter state carried across chunks) and encodes with
  `s16_to_ulaw` / `s16_to_alaw`, the ITU-T G.711 rules exactly as Python's former `audioop`
  (`lin2ulaw`/`lin2alaw`: the top 14 / 13 bits of each s16 sample).

- `speed` (0.25-4.0) changes tempo without changing pitch with FFmpeg's ``atempo`` filter (one
  instance per factor of 2, see `atempo_factors`); 1.0 bypasses the filter.

- `AudioFileWriter`: the CLI's file output; writes while audio is generated, through a temp file
  that takes the final name on close (a WAV also on interruption, with a header patched to the true
  length).
"""

from __future__ import annotations

import os
import secrets
import struct
import sys
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import av
import av.error
import av.filter
import numpy as np

__all__ = [
    "FORMATS",
    "G711_FORMATS",
    "G711_RATE",
    "MIME_TYPES",
    "G711_MIME_TYPES",
    "EXTENSIONS",
    "SAMPLE_RATE",
    "MIN_SPEED",
    "MAX_SPEED",
    "to_s16",
    "s16_to_ulaw",
    "s16_to_alaw",
    "ulaw_to_s16",
    "alaw_to_s16",
    "StreamResampler",
    "wav_header",
    "format_from_path",
    "atempo_factors",
    "StreamingEncoder",
    "AudioFileWriter",
]

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

# format -> (PyAV container format, codec, codec sample format, bit rate, muxer options)
_CODECS: dict[str, tuple[str, str, str, int | None, dict[str, str]]] = {
    # no ID3v2 tag and no Xing/LAME frame: a plain CBR frame stream, nothing to patch at the end
    "mp3": ("mp3", "libmp3lame", "s16p", 64_000, {"id3v2_version": "0", "write_xing": "0"}),
    # the Ogg muxer buffers ~1 s per page by default; 20 ms (µs units) flushes every Opus packet
    "opus": ("ogg", "libopus", "s16", 32_000, {"page_duration": "20000"}),
    "aac": ("adts", "aac", "fltp", 64_000, {}),
    # no 8 KiB PADDING block: nobody will edit the tags of a stream
    "flac": ("flac", "flac", "s16", None, {"metadata_header_padding": "0"}),
}

_RESAMPLED = ("pcm", "mp3", "opus")
"""Formats `StreamingEncoder` writes at another rate than its input's (`out_rate`)."""
_BIT_RATES = {"mp3": (8_000, 320_000), "opus": (6_000, 510_000)}
"""Formats whose bit rate a caller may choose, and its bounds (those of libmp3lame and libopus)."""

_WAV_UNKNOWN_SIZE = 0xFFFFFFFF
_FLAC_STREAMINFO_AT, _FLAC_STREAMINFO_BYTES = 8, 34
"""A FLAC file: "fLaC", the 4-byte header of its first metadata block, which is always STREAMINFO
(34 bytes: block sizes, frame sizes, rate, channels, bits, the 36-bit total samples, the MD5 of the samples)."""


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


# -- G.711 (ITU-T G.711, as Sun's g711.c and Python's audioop implement it) ------------------------

_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _ulaw_codes(s16: np.ndarray) -> np.ndarray:
    """mu-law of s16 values (any int dtype): the 14-bit sample (s16 >> 2) biased by 33, its segment
    and 4 mantissa bits, every bit inverted (zero -> 0xFF)."""
    pcm = s16.astype(np.int32) >> 2
    negative = pcm < 0
    magnitude = np.minimum(np.where(negative, -pcm, pcm), 8159) + 33
    segment = np.searchsorted(_ULAW_SEG_END, magnitude)
    code = np.where(segment >= 8, 0x7F, (segment << 4) | ((magnitude >> (segment + 1)) & 0x0F))
    return (code ^ np.where(negative, 0x7F, 0xFF)).astype(np.uint8)


def _alaw_codes(s16: np.ndarray) -> np.ndarray:
    """A-law of s16 values: the 13-bit sample (s16 >> 3), its segment and 4 mantissa bits, even bits
    inverted (zero -> 0xD5)."""
    pcm = s16.astype(np.int32) >> 3
    negative = pcm < 0
    magnitude = np.where(negative, -pcm - 1, pcm)
    segment = np.searchsorted(_ALAW_SEG_END, magnitude)
    mantissa = np.where(segment < 2, magnitude >> 1, magnitude >> np.maximum(segment, 1)) & 0x0F
    code = np.where(segment >= 8, 0x7F, (segment << 4) | mantissa)
    return (code ^ np.where(negative, 0x55, 0xD5)).astype(np.uint8)


_ALL_S16 = np.arange(-32768, 32768, dtype=np.int32)
_ULAW_OF = np.roll(_ulaw_codes(_ALL_S16), -32768)  # indexed by the s16 value's uint16 bits
_ALAW_OF = np.roll(_alaw_codes(_ALL_S16), -32768)
del _ALL_S16


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256) ^ 0x55
    segment = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(segment == 0, t + 8, (t + 0x108) << np.maximum(segment - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_S16_OF_ULAW = _ulaw_decode_table()
_S16_OF_ALAW = _alaw_decode_table()


def s16_to_ulaw(s16: np.ndarray) -> bytes:
    """G.711 mu-law bytes of int16 samples (= `audioop.lin2ulaw(s16.tobytes(), 2)`)."""
    return _ULAW_OF[np.asarray(s16, np.int16).view(np.uint16)].tobytes()


def s16_to_alaw(s16: np.ndarray) -> bytes:
    """G.711 A-law bytes of int16 samples (= `audioop.lin2alaw(s16.tobytes(), 2)`)."""
    return _ALAW_OF[np.asarray(s16, np.int16).view(np.uint16)].tobytes()


def ulaw_to_s16(data: bytes) -> np.ndarray:
    """int16 samples of G.711 mu-law bytes (= `audioop.ulaw2lin(data, 2)`)."""
    return _S16_OF_ULAW[np.frombuffer(data, np.uint8)]


def alaw_to_s16(data: bytes) -> np.ndarray:
    """int16 samples of G.711 A-law bytes (= `audioop.alaw2lin(data, 2)`)."""
    return _S16_OF_ALAW[np.frombuffer(data, np.uint8)]


class StreamResampler:
    """float32 mono chunks at `in_rate` -> `out_rate`, with soxr's streaming resampler ("HQ", as
    `voice_clone.resample`): the filter's state is carried across chunks, so the chunks' outputs
    joined are one resampling of the joined input; `flush()` returns the filter's tail."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        import soxr  # a requirement of the package; imported where it is used (as voice_clone does)

        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def process(self, samples: np.ndarray) -> np.ndarray:
        return self._stream.resample_chunk(np.asarray(samples, np.float32))

    def flush(self) -> np.ndarray:
        return self._stream.resample_chunk(np.zeros(0, np.float32), last=True)


class _RateChange:
    """s16 samples at one rate -> s16 at another (`StreamResampler`; the identity when they agree)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._resampler = StreamResampler(in_rate, out_rate) if in_rate != out_rate else None

    def process(self, s16: np.ndarray) -> np.ndarray:
        if self._resampler is None:
            return s16
        return to_s16(self._resampler.process(s16.astype(np.float32) / 32767.0))

    def flush(self) -> np.ndarray:
        return np.zeros(0, np.int16) if self._resampler is None else to_s16(self._resampler.flush())


class _G711:
    """s16 at the encoder's rate -> 8 kHz -> mu-law or A-law bytes."""

    def __init__(self, format: str, sample_rate: int) -> None:
        self._encode = s16_to_ulaw if format == "pcmu" else s16_to_alaw
        self._rate = _RateChange(sample_rate, G711_RATE)

    def encode(self, s16: np.ndarray) -> bytes:
        return self._encode(self._rate.process(s16))

    def flush(self) -> bytes:
        tail = self._rate.flush()
        return self._encode(tail) if len(tail) else b""


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


def _check_format(format: str) -> str:
    if format not in FORMATS:
        expected = ", ".join(FORMATS)
        raise ValueError(f"unsupported audio format {format!r}; expected one of {expected}")
    return format


def _check_speed(speed: float) -> float:
    try:
        value = float(speed)
    except (TypeError, ValueError):
        raise ValueError(f"speed must be a number, got {speed!r}") from None
    if not (MIN_SPEED <= value <= MAX_SPEED):  # also rejects NaN
        raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed!r}")
    return value


def atempo_factors(speed: float) -> list[float]:
    """Split ``speed`` into ``atempo`` factors, each within [0.5, 2.0]; [] for 1.0.

    The bundled FFmpeg (libavfilter 11) accepts 0.5-100 per instance, but above 2.0 atempo drops
    samples instead of blending them, so factors are kept within 0.5-2.0 (FFmpeg's own advice).
    """
    speed = _check_speed(speed)
    factors: list[float] = []
    while speed > 2.0:
        factors.append(2.0)
        speed /= 2.0
    while speed < 0.5:
        factors.append(0.5)
        speed /= 0.5
    if speed != 1.0:
        factors.append(speed)
    return factors


class _WriteOnlySink:
    """File-like object with only ``write``: PyAV sees it as non-seekable, so muxers never seek."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def take(self) -> bytes:
        data = bytes(self._buf)
        self._buf.clear()
        return data


class _Tempo:
    """s16 mono -> s16 mono through a chain of ``atempo`` filters."""

    def __init__(self, factors: list[float], sample_rate: int) -> None:
        self._rate = sample_rate
        self._pts = 0
        graph = av.filter.Graph()
        nodes = [graph.add_abuffer(sample_rate=sample_rate, format="s16", layout="mono",
                                   time_base=Fraction(1, sample_rate))]
        nodes += [graph.add("atempo", f"{f:.9g}") for f in factors]
        nodes.append(graph.add("aformat", sample_fmts="s16", channel_layouts="mono",
                               sample_rates=str(sample_rate)))
        nodes.append(graph.add("abuffersink"))
        graph.link_nodes(*nodes).configure()
        self._graph = graph

    def process(self, s16: np.ndarray) -> np.ndarray:
        frame = av.AudioFrame.from_ndarray(s16[None, :], format="s16", layout="mono")
        frame.sample_rate = self._rate
        frame.time_base = Fraction(1, self._rate)
        frame.pts = self._pts
        self._pts += len(s16)
        self._graph.push(frame)
        return self._pull()

    def flush(self) -> np.ndarray:
        self._graph.push(None)
        return self._pull()

    def _pull(self) -> np.ndarray:
        out = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.error.BlockingIOError, av.error.EOFError):
                break
            out.append(frame.to_ndarray().reshape(-1))
        return np.concatenate(out) if out else np.zeros(0, np.int16)


class StreamingEncoder:
    """Encode one request's audio chunks into one continuous byte stream.

    Args:
        format: one of `FORMATS`, or of `G711_FORMATS` (8 kHz output whatever the input rate).
        sample_rate: rate of the incoming float chunks (and of the output, but for G.711 and
            `out_rate`).
        speed: tempo factor in [0.25, 4.0] (pitch kept); 1.0 = unchanged.
        out_rate: `pcm`, `mp3` or `opus`: the output's rate, resampled from `sample_rate` (soxr);
            None: the same. mp3 takes 8-48 kHz (MPEG's rates), opus 8/12/16/24/48 kHz.
        bit_rate: `mp3` or `opus`: bits a second; None: the format's own (64 / 32 kb/s).

    Not thread-safe; use one encoder per request. ValueError on a bad format, rate or speed.
    """

    def __init__(self, format: str, sample_rate: int = SAMPLE_RATE, speed: float = 1.0,
                 out_rate: int | None = None, bit_rate: int | None = None) -> None:
        self.format = format if format in G711_FORMATS else _check_format(format)
        self.sample_rate = int(sample_rate)
        if self.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate!r}")
        if out_rate is not None and (format not in _RESAMPLED or not 8000 <= out_rate <= 192000):
            raise ValueError(f"out_rate is for {', '.join(_RESAMPLED)} output at 8000-192000 Hz, "
                             f"got {out_rate!r} for {format}")
        if bit_rate is not None and (format not in _BIT_RATES or not _BIT_RATES[format][0] <= bit_rate
                                     <= _BIT_RATES[format][1]):
            raise ValueError(f"bit_rate is for {', '.join(_BIT_RATES)} output within their bounds, "
                             f"got {bit_rate!r} for {format}")
        self.out_rate = int(out_rate or self.sample_rate)
        self._bit_rate = bit_rate
        self._pcm_rate = _RateChange(self.sample_rate, self.out_rate) if out_rate else None
        self._out_samples = 0  # samples handed to a codec, at out_rate (its frames' timestamps)
        self.speed = _check_speed(speed)
        self.mime_type = G711_MIME_TYPES.get(format) or MIME_TYPES[format]
        self._g711 = _G711(format, self.sample_rate) if format in G711_FORMATS else None
        self._samples = 0
        self._finished = False
        self._header_sent = False
        self._final_header: tuple[int, bytes] | None = None
        factors = atempo_factors(self.speed)
        self._tempo = _Tempo(factors, self.sample_rate) if factors else None
        self._container = self._stream = self._sink = None
        if format in _CODECS:
            self._open_codec()

    def _open_codec(self) -> None:
        container_format, codec, sample_format, bit_rate, options = _CODECS[self.format]
        rates = av.codec.Codec(codec, "w").audio_rates
        if rates and self.out_rate not in rates:
            raise ValueError(
                f"{self.format} cannot encode at {self.out_rate} Hz; supported: {sorted(rates)}"
            )
        self._sink = _WriteOnlySink()
        self._container = av.open(self._sink, "w", format=container_format, options=options)
        stream = self._container.add_stream(codec, rate=self.out_rate, layout="mono")
        stream.format = sample_format
        if self._bit_rate or bit_rate:
            stream.bit_rate = self._bit_rate or bit_rate
        self._stream = stream

    @property
    def num_samples(self) -> int:
        """Samples handed to the format so far (after the speed change)."""
        return self._samples

    def encode(self, chunk: np.ndarray) -> bytes:
        """Add a chunk of float mono samples; return the bytes that are ready now (maybe b"")."""
        if self._finished:
            raise RuntimeError("encoder already finished")
        samples = np.asarray(chunk)
        if samples.ndim != 1:
            raise ValueError(f"expected a 1-D mono chunk, got shape {samples.shape}")
        s16 = to_s16(samples)
        if self._tempo is not None and len(s16):
            s16 = self._tempo.process(s16)
        return self._emit(s16)

    def finish(self) -> bytes:
        """Flush the tempo filter, encoder and muxer; return the last bytes. Later calls: b""."""
        if self._finished:
            return b""
        rest = self._tempo.flush() if self._tempo is not None else np.zeros(0, np.int16)
        out = self._emit(rest)  # also a wav header when nothing was encoded
        if self._g711 is not None:
            out += self._g711.flush()
        if self._pcm_rate is not None:
            rest = self._pcm_rate.flush()
            out += self._encode_frame(rest) if self._container is not None else rest.astype("<i2").tobytes()
        self._finished = True
        if self._container is not None:
            for packet in self._stream.encode(None):
                # FFmpeg's FLAC encoder hands its final STREAMINFO on with its last packet (its codec
                # context's extradata is rewritten again after that, with an MD5 finalized twice)
                if self.format == "flac" and packet.has_sidedata("new_extradata"):
                    streaminfo = bytes(packet.get_sidedata("new_extradata"))
                    if len(streaminfo) == _FLAC_STREAMINFO_BYTES:
                        self._final_header = (_FLAC_STREAMINFO_AT, streaminfo)
                self._container.mux(packet)
            self._container.close()
            out += self._sink.take()
        self._release()
        return out

    def final_header(self) -> tuple[int, bytes] | None:
        """After `finish()`: the header the output would have had if its length had been known when it
        began, as (offset, bytes) to write over the output there; None when there is nothing to write.

        FLAC: the STREAMINFO with the total samples, frame sizes and MD5 (0 in the streamed one, which
        readers that size their output from it, libsndfile among them, refuse).
        """
        return self._final_header

    def close(self) -> None:
        """Drop the encoder without flushing (e.g. the client went away)."""
        if not self._finished:
            self._finished = True
            if self._container is not None:
                try:
                    self._container.close()
                except av.error.FFmpegError:
                    pass
            self._release()

    def _release(self) -> None:
        self._container = self._stream = self._sink = self._tempo = self._g711 = self._pcm_rate = None

    def _emit(self, s16: np.ndarray) -> bytes:
        header = b""
        if self.format == "wav" and not self._header_sent:
            header = wav_header(self.sample_rate)
            self._header_sent = True
        if not len(s16):
            return header
        self._samples += len(s16)
        if self._g711 is not None:
            return self._g711.encode(s16)
        if self._pcm_rate is not None:
            s16 = self._pcm_rate.process(s16)
        if self._container is None:  # wav / pcm
            return header + s16.astype("<i2", copy=False).tobytes()
        return self._encode_frame(s16)

    def _encode_frame(self, s16: np.ndarray) -> bytes:
        if not len(s16):
            return b""
        frame = av.AudioFrame.from_ndarray(s16[None, :], format="s16", layout="mono")
        frame.sample_rate = self.out_rate
        frame.time_base = Fraction(1, self.out_rate)
        frame.pts = self._out_samples
        self._out_samples += len(s16)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()


class AudioFileWriter:
    """Write generated audio to a file as it comes (the CLI's output).

    Args:
        path: output file, or "-" for stdout (raw s16le unless ``format`` is given, flushed per
            chunk).
        format: one of `FORMATS`; None = from the extension (`EXTENSIONS`).
        sample_rate: rate of the incoming chunks.
        speed: tempo factor, as in `StreamingEncoder`.

    Bytes go to a temp file next to ``path`` (``.<name>.*.part``) that is renamed to ``path`` by
    `close()`, so a half-written file never takes the final name. Used as a context manager,
    leaving on an exception (KeyboardInterrupt included) discards the temp file, except for WAV:
    the WAV is finished with what was made, its header patched to the true length, and renamed.
    A WAV's header carries 0xFFFFFFFF sizes until then, so even a killed run's ``.part`` decodes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: str | None = None,
        sample_rate: int = SAMPLE_RATE,
        *,
        speed: float = 1.0,
    ) -> None:
        self.path = path if path == "-" else Path(path)
        if format is None:
            format = "pcm" if path == "-" else format_from_path(path)
        self.format = _check_format(format)
        self._encoder = StreamingEncoder(format, sample_rate, speed)
        self._tmp: Path | None = None
        self._closed = False
        if self.path == "-":
            self._file: BinaryIO = sys.stdout.buffer
        else:
            # not mkstemp: its 0600 mode would stick to the final file; "x" still never clobbers
            target = self.path.absolute()
            self._tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
            self._file = open(self._tmp, "x+b")

    @property
    def num_samples(self) -> int:
        """Samples written so far (after the speed change)."""
        return self._encoder.num_samples

    def write(self, chunk: np.ndarray) -> None:
        """Encode and write one chunk of float mono samples."""
        if self._closed:
            raise RuntimeError("writer is closed")
        data = self._encoder.encode(chunk)
        if data:
            self._file.write(data)
            if self._tmp is None:
                self._file.flush()

    def close(self) -> None:
        """Flush everything and give the file its final name. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._file.write(self._encoder.finish())
            self._finalize()
        except BaseException:
            self._discard()
            raise

    def abort(self) -> None:
        """Stop after an interruption: keep a WAV (valid, true length), discard other formats."""
        if self._closed:
            return
        self._closed = True
        if self.format == "wav" and self._tmp is not None:
            try:
                self._file.write(self._encoder.finish())
            except Exception:  # keep what is already in the file
                self._encoder.close()
            try:
                self._finalize()
                return
            except Exception:
                pass
        self._encoder.close()
        if self._tmp is None:  # stdout: pass on what was made, if the reader is still there
            try:
                self._file.flush()
            except OSError:
                pass
        self._discard()

    def __enter__(self) -> AudioFileWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _finalize(self) -> None:
        if self._tmp is None:
            self._file.flush()
            return
        if self.format == "wav":
            # whole samples only: the encoder never writes half of one
            size = self._file.seek(0, os.SEEK_END)
            self._file.seek(0)
            self._file.write(wav_header(self._encoder.sample_rate, (size - 44) // 2))
        elif (header := self._encoder.final_header()) is not None:
            self._file.seek(header[0])
            self._file.write(header[1])
        self._file.close()
        os.replace(self._tmp, self.path)
        self._tmp = None

    def _discard(self) -> None:
        if self._tmp is None:
            return
        self._file.close()
        self._tmp.unlink(missing_ok=True)
        self._tmp = None
