"""The streaming audio encoder for the engine's output (24 kHz mono float32 chunks), on the one s16 rule
(`formats.to_s16`, so `pcm`, `wav` and `flac` output is bit-exact to it):

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

- G.711 (`pcmu`, `pcma`; `telephony.py`), resampled to 8 kHz; `out_rate` resamples pcm, mp3 and opus.

- `speed` (0.25-4.0) changes tempo without changing pitch with FFmpeg's ``atempo`` filter (one
  instance per factor of 2, see `atempo_factors`); 1.0 bypasses the filter.
"""

from __future__ import annotations

from fractions import Fraction

import av
import av.error
import av.filter
import numpy as np

from qwen3_tts_gguf.audio.formats import (
    G711_FORMATS,
    G711_MIME_TYPES,
    MIME_TYPES,
    SAMPLE_RATE,
    check_format,
    check_speed,
    to_s16,
    wav_header,
)
from qwen3_tts_gguf.audio.telephony import G711Encoder, RateChange

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
_FLAC_STREAMINFO_AT, _FLAC_STREAMINFO_BYTES = 8, 34
"""A FLAC file: "fLaC", the 4-byte header of its first metadata block, which is always STREAMINFO
(34 bytes: block sizes, frame sizes, rate, channels, bits, the 36-bit total samples, the MD5 of the samples)."""


def atempo_factors(speed: float) -> list[float]:
    """Split ``speed`` into ``atempo`` factors, each within [0.5, 2.0]; [] for 1.0.

    The bundled FFmpeg (libavfilter 11) accepts 0.5-100 per instance, but above 2.0 atempo drops
    samples instead of blending them, so factors are kept within 0.5-2.0 (FFmpeg's own advice).
    """
    speed = check_speed(speed)
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
        self.format = format if format in G711_FORMATS else check_format(format)
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
        self._pcm_rate = RateChange(self.sample_rate, self.out_rate) if out_rate else None
        self._out_samples = 0  # samples handed to a codec, at out_rate (its frames' timestamps)
        self.speed = check_speed(speed)
        self.mime_type = G711_MIME_TYPES.get(format) or MIME_TYPES[format]
        self._g711 = G711Encoder(format, self.sample_rate) if format in G711_FORMATS else None
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
