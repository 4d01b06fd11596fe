"""G.711 for telephony and OpenAI's Realtime API (`formats.G711_FORMATS`, not speech-route formats): `pcmu`
(mu-law) and `pcma` (A-law), 8 kHz, one byte per sample, no header. The input is resampled to 8 kHz with
soxr's streaming resampler (`StreamResampler`: chunks in, the same samples as one whole-signal resampling out,
its filter state carried across chunks) and encoded with `s16_to_ulaw` / `s16_to_alaw`, the ITU-T G.711 rules
exactly as Python's former `audioop` (`lin2ulaw`/`lin2alaw`: the top 14 / 13 bits of each s16 sample)."""

from __future__ import annotations

import numpy as np

from qwen3_tts_gguf.audio.formats import G711_RATE, to_s16

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


class RateChange:
    """s16 samples at one rate -> s16 at another (`StreamResampler`; the identity when they agree)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._resampler = StreamResampler(in_rate, out_rate) if in_rate != out_rate else None

    def process(self, s16: np.ndarray) -> np.ndarray:
        if self._resampler is None:
            return s16
        return to_s16(self._resampler.process(s16.astype(np.float32) / 32767.0))

    def flush(self) -> np.ndarray:
        return np.zeros(0, np.int16) if self._resampler is None else to_s16(self._resampler.flush())


class G711Encoder:
    """s16 at the encoder's rate -> 8 kHz -> mu-law or A-law bytes."""

    def __init__(self, format: str, sample_rate: int) -> None:
        self._encode = s16_to_ulaw if format == "pcmu" else s16_to_alaw
        self._rate = RateChange(sample_rate, G711_RATE)

    def encode(self, s16: np.ndarray) -> bytes:
        return self._encode(self._rate.process(s16))

    def flush(self) -> bytes:
        tail = self._rate.flush()
        return self._encode(tail) if len(tail) else b""
