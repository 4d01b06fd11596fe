"""Streaming encoders and the CLI file writer: incremental bytes, decodability, exactness, speed."""

from __future__ import annotations

import io
import struct
import sys
import wave
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from qwen3_tts_gguf.audio.encoding import StreamingEncoder, atempo_factors
from qwen3_tts_gguf.audio.file_writer import AudioFileWriter
from qwen3_tts_gguf.audio.formats import EXTENSIONS, FORMATS, MIME_TYPES, format_from_path, to_s16, wav_header
from qwen3_tts_gguf.audio.telephony import StreamResampler

SR = 24000
CHUNK = 1920  # 80 ms
LOSSLESS = ("flac", "wav", "pcm")
# chunks (of 30) that must yield bytes before finish(); measured: mp3 30, opus 30, aac 29
# (first chunk: encoder lookahead), flac 25 (2304-sample frames), wav 30, pcm 30
MIN_CHUNKS_WITH_BYTES = {"mp3": 27, "opus": 27, "aac": 26, "flac": 20, "wav": 30, "pcm": 30}


def sweep(seconds: float = 2.4) -> np.ndarray:
    """Linear 150 Hz -> 4 kHz sine sweep at 0.6, with a few clipped samples at the start."""
    t = np.arange(int(seconds * SR)) / SR
    f0, f1 = 150.0, 4000.0
    x = 0.6 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) / (2 * seconds) * t**2))
    x[:4] = [1.5, -1.5, 0.5, -0.5]
    return x.astype(np.float32)


def tone(freq: float = 1000.0, seconds: float = 2.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * SR)) / SR)).astype(np.float32)


def encode(fmt: str, signal: np.ndarray, speed: float = 1.0) -> tuple[list[bytes], bytes]:
    enc = StreamingEncoder(fmt, SR, speed)
    parts = [enc.encode(signal[i : i + CHUNK]) for i in range(0, len(signal), CHUNK)]
    return parts, enc.finish()


def decode_av(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Decode with PyAV; returns (mono samples, rate): int16 for s16 codecs, else float."""
    opts = {"format": "s16le", "options": {"sample_rate": str(SR), "ch_layout": "mono"}}
    with av.open(io.BytesIO(data), **(opts if fmt == "pcm" else {})) as c:
        stream = c.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(stream)]
        return np.concatenate(frames), stream.codec_context.sample_rate


def align(decoded: np.ndarray, ref: np.ndarray, max_lag: int = 4096) -> tuple[int, float]:
    """Lag of `ref` inside `decoded` (cross-correlation) and the correlation after aligning."""
    n = len(decoded) + len(ref)
    size = 1 << (n - 1).bit_length()
    xc = np.fft.irfft(np.fft.rfft(decoded, size) * np.conj(np.fft.rfft(ref, size)), size)
    lag = int(np.argmax(xc[: max_lag + 1]))
    seg = decoded[lag : lag + len(ref)]
    return lag, float(np.corrcoef(seg, ref[: len(seg)])[0, 1])


def dominant_freq(x: np.ndarray, rate: int = SR) -> float:
    x = x.astype(np.float64)
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * rate / len(x))


def test_to_s16_rule() -> None:
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0, np.nan, np.inf, -np.inf], np.float32)
    assert to_s16(x).tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767, 0, 32767, -32767]
    # exact ties round half to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2
    ties = np.array([0.5, 1.5, 2.5, -2.5]) / 32767
    assert to_s16(ties).tolist() == [0, 2, 2, -2]
    rng = np.random.default_rng(0)
    r = rng.uniform(-1.2, 1.2, 10_000).astype(np.float32)
    expected = np.rint(np.clip(r.astype(np.float64), -1, 1) * 32767).astype(np.int16)
    assert to_s16(r).dtype == np.int16 and np.array_equal(to_s16(r), expected)
    with pytest.raises(TypeError):
        to_s16(np.zeros(4, np.int16))


def test_format_tables() -> None:
    assert FORMATS == ("mp3", "opus", "aac", "flac", "wav", "pcm")
    assert MIME_TYPES == {
        "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
        "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm",
    }  # fmt: skip
    assert set(EXTENSIONS.values()) == set(FORMATS)
    assert format_from_path("a/b.OGG") == "opus" and format_from_path("x.wav") == "wav"
    with pytest.raises(ValueError):
        format_from_path("speech.m4a")
    assert StreamingEncoder("aac").mime_type == "audio/aac"


@pytest.mark.parametrize("fmt", FORMATS)
def test_streams_incrementally_and_decodes(fmt: str) -> None:
    signal = sweep()
    parts, tail = encode(fmt, signal)
    assert len(parts) == 30
    assert sum(1 for p in parts if p) >= MIN_CHUNKS_WITH_BYTES[fmt]
    data = b"".join(parts) + tail
    decoded, rate = decode_av(data, fmt)
    if fmt in LOSSLESS:
        assert rate == SR and decoded.dtype == np.int16
        assert np.array_equal(decoded, to_s16(signal))
        return
    ref = to_s16(signal) / 32767.0
    if rate != SR:  # Opus decodes at 48 kHz; the sweep is far below 12 kHz
        assert rate % SR == 0
        decoded = decoded[:: rate // SR]
    lag, corr = align(decoded, ref)
    assert lag <= 2048  # encoder delay: mp3 1105, aac 1024, opus 0 (pre-skip is honoured)
    assert corr > 0.9
    assert abs(len(decoded) - lag - len(signal)) <= 1200  # 50 ms: the last frame's padding


def test_wav_stream_header_and_soundfile() -> None:
    signal = sweep()
    parts, tail = encode("wav", signal)
    data = b"".join(parts) + tail
    assert parts[0][:44] == data[:44] == wav_header(SR)
    riff, riff_size, wave_id = struct.unpack("<4sI4s", data[:12])
    assert (riff, riff_size, wave_id) == (b"RIFF", 0xFFFFFFFF, b"WAVE")
    assert data[36:40] == b"data" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    fmt_fields = struct.unpack("<HHIIHH", data[20:36])
    assert fmt_fields == (1, 1, SR, 2 * SR, 2, 16)
    decoded, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == SR and np.array_equal(decoded, to_s16(signal))


def test_empty_stream_and_lifecycle() -> None:
    enc = StreamingEncoder("wav")
    assert enc.finish() == wav_header(SR)  # a valid empty WAV stream
    assert enc.finish() == b""
    with pytest.raises(RuntimeError):
        enc.encode(np.zeros(10, np.float32))
    enc = StreamingEncoder("mp3")
    assert enc.encode(np.zeros(0, np.float32)) == b""
    with pytest.raises(ValueError):
        enc.encode(np.zeros((2, 10), np.float32))
    enc.close()  # abort without flushing


@pytest.mark.parametrize(
    "kwargs",
    [
        {"format": "ogg"},
        {"format": "wma"},
        {"format": "mp3", "speed": 0.2},
        {"format": "mp3", "speed": 4.01},
        {"format": "pcm", "speed": float("nan")},
        {"format": "pcm", "speed": "fast"},
        {"format": "opus", "sample_rate": 44100},
        {"format": "mp3", "out_rate": 11000},
        {"format": "pcm", "out_rate": 4000},
        {"format": "pcm", "out_rate": 200_000},
        {"format": "wav", "out_rate": 16000},
        {"format": "opus", "out_rate": 44100},
        {"format": "mp3", "bit_rate": 4000},
        {"format": "opus", "bit_rate": 600_000},
        {"format": "flac", "bit_rate": 64000},
    ],
)
def test_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        StreamingEncoder(**kwargs)


def test_atempo_factors() -> None:
    assert atempo_factors(1.0) == []
    assert atempo_factors(0.25) == [0.5, 0.5]
    assert atempo_factors(4.0) == [2.0, 2.0]
    for speed in (0.3, 0.7, 1.3, 2.5, 3.9):
        f = atempo_factors(speed)
        assert all(0.5 <= x <= 2.0 for x in f) and np.isclose(np.prod(f), speed)


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_changes_duration_not_pitch(speed: float) -> None:
    signal = tone(1000.0)
    parts, tail = encode("pcm", signal, speed)
    out = np.frombuffer(b"".join(parts) + tail, "<i2")
    assert abs(len(out) / (len(signal) / speed) - 1) < 0.03
    assert abs(dominant_freq(out) / 1000.0 - 1) < 0.02


@pytest.mark.parametrize(
    ("fmt", "speed"), [("mp3", 0.5), ("opus", 2.0), ("aac", 4.0), ("flac", 0.25)]
)
def test_speed_through_codecs(fmt: str, speed: float) -> None:
    signal = tone(600.0)
    parts, tail = encode(fmt, signal, speed)
    decoded, rate = decode_av(b"".join(parts) + tail, fmt)
    seconds = len(decoded) / rate
    # lossy codecs add up to ~0.1 s of delay and padding
    assert abs(seconds - len(signal) / SR / speed) < 0.03 * len(signal) / SR / speed + 0.1
    assert abs(dominant_freq(decoded[:: rate // SR]) / 600.0 - 1) < 0.02


def no_temp_files(folder: Path) -> bool:
    return not list(folder.glob(".*.part"))


@pytest.mark.parametrize("ext", sorted(EXTENSIONS))
def test_file_writer_each_extension(tmp_path: Path, ext: str) -> None:
    signal = sweep(2.0)
    path = tmp_path / f"speech.{ext}"
    with AudioFileWriter(path) as w:
        for i in range(0, len(signal), CHUNK):
            w.write(signal[i : i + CHUNK])
        assert not path.exists()  # the final name appears on close only
    assert path.exists() and no_temp_files(tmp_path)
    fmt = EXTENSIONS[ext]
    decoded, rate = decode_av(path.read_bytes(), fmt)
    if fmt in LOSSLESS:
        assert np.array_equal(decoded, to_s16(signal))
    else:
        assert abs(len(decoded) / rate - 2.0) < 0.1
    if fmt in ("wav", "flac"):  # flac: the writer patches STREAMINFO's length for libsndfile
        data, rate = sf.read(path, dtype="int16")
        assert rate == SR and np.array_equal(data, to_s16(signal))


def test_file_writer_wav_interrupted_is_valid(tmp_path: Path) -> None:
    signal = sweep(2.0)
    path = tmp_path / "out.wav"
    n = 10 * CHUNK
    with pytest.raises(KeyboardInterrupt), AudioFileWriter(path) as w:
        for i in range(0, n, CHUNK):
            w.write(signal[i : i + CHUNK])
        raise KeyboardInterrupt
    assert no_temp_files(tmp_path)
    raw = path.read_bytes()
    assert len(raw) == 44 + 2 * n
    assert struct.unpack("<I", raw[4:8])[0] == 36 + 2 * n  # RIFF size
    assert struct.unpack("<I", raw[40:44])[0] == 2 * n  # data size
    with wave.open(str(path)) as wf:  # the stdlib trusts the header sizes
        assert wf.getnframes() == n and wf.getframerate() == SR
    data, _ = sf.read(path, dtype="int16")
    assert np.array_equal(data, to_s16(signal[:n]))


def test_file_writer_other_formats_interrupted_leave_nothing(tmp_path: Path) -> None:
    path = tmp_path / "out.mp3"
    with pytest.raises(RuntimeError), AudioFileWriter(path) as w:
        w.write(sweep(0.5))
        raise RuntimeError("boom")
    assert not path.exists() and no_temp_files(tmp_path)


def test_file_writer_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stdout:
        buffer = io.BytesIO()

    monkeypatch.setattr(sys, "stdout", Stdout)
    signal = sweep(0.5)
    with AudioFileWriter("-") as w:
        w.write(signal[:CHUNK])
        assert Stdout.buffer.getvalue() == to_s16(signal[:CHUNK]).astype("<i2").tobytes()
        w.write(signal[CHUNK:])
    assert Stdout.buffer.getvalue() == to_s16(signal).astype("<i2").tobytes()


# -- G.711 (pcmu / pcma): the Realtime API's telephony formats -------------------------------------

from qwen3_tts_gguf.audio.formats import G711_FORMATS, G711_RATE  # noqa: E402
from qwen3_tts_gguf.audio.telephony import alaw_to_s16, s16_to_alaw, s16_to_ulaw, ulaw_to_s16  # noqa: E402

# s16 sample -> (mu-law, A-law) code, as Python's audioop (lin2ulaw / lin2alaw, width 2) gives them:
# zero is 0xFF / 0xD5 (ITU-T G.711's idle codes), full scale 0x80 / 0xAA and 0x00 / 0x2A, and the
# top 14 (mu-law) or 13 (A-law) bits decide (s16 >> 2, s16 >> 3: -1 is a negative code).
G711_CODES = {
    0: (0xFF, 0xD5), 1: (0xFF, 0xD5), 3: (0xFF, 0xD5), 4: (0xFE, 0xD5), 8: (0xFE, 0xD5), -1: (0x7E, 0x55),
    -8: (0x7E, 0x55), -9: (0x7D, 0x55), 100: (0xF2, 0xD3), -100: (0x72, 0x53), 1000: (0xCE, 0xFA),
    -1000: (0x4E, 0x7A), 4000: (0xAF, 0x9A), -4000: (0x2F, 0x1A), 8000: (0xA0, 0x8A), -8000: (0x20, 0x0A),
    16000: (0x90, 0xBA), -16000: (0x10, 0x3A), 32124: (0x80, 0xAA), 32767: (0x80, 0xAA), -32124: (0x00, 0x2A),
    -32768: (0x00, 0x2A),
}
# code -> (mu-law, A-law) decoded s16 (audioop's ulaw2lin / alaw2lin)
G711_DECODED = {0x00: (-32124, -5504), 0x0F: (-16764, -6784), 0x2A: (-5372, -32256), 0x55: (-716, -8),
                0x7F: (0, -848), 0x80: (32124, 5504), 0xAA: (5372, 32256), 0xD5: (716, 8), 0xFF: (0, 848)}


def test_g711_known_codes() -> None:
    samples = np.array(list(G711_CODES), np.int16)
    assert list(s16_to_ulaw(samples)) == [u for u, _ in G711_CODES.values()]
    assert list(s16_to_alaw(samples)) == [a for _, a in G711_CODES.values()]
    codes = bytes(G711_DECODED)
    assert ulaw_to_s16(codes).tolist() == [u for u, _ in G711_DECODED.values()]
    assert alaw_to_s16(codes).tolist() == [a for _, a in G711_DECODED.values()]


def test_g711_equals_audioop_for_every_sample_and_code() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # deprecated since 3.11, removed in 3.13
        audioop = pytest.importorskip("audioop")
    every = np.arange(-32768, 32768, dtype=np.int16)
    assert s16_to_ulaw(every) == audioop.lin2ulaw(every.tobytes(), 2)
    assert s16_to_alaw(every) == audioop.lin2alaw(every.tobytes(), 2)
    codes = bytes(range(256))
    assert ulaw_to_s16(codes).tobytes() == audioop.ulaw2lin(codes, 2)
    assert alaw_to_s16(codes).tobytes() == audioop.alaw2lin(codes, 2)


def test_g711_round_trip_error_is_within_its_segment_step() -> None:
    every = np.arange(-32768, 32768, dtype=np.int16)
    bound = np.maximum(16, np.abs(every.astype(np.int64)) // 16)  # 4 mantissa bits per segment
    for encode_, decode_ in ((s16_to_ulaw, ulaw_to_s16), (s16_to_alaw, alaw_to_s16)):
        error = np.abs(decode_(encode_(every)).astype(np.int64) - every)
        assert (error <= bound).all()


@pytest.mark.parametrize("fmt", G711_FORMATS)
def test_g711_streaming_encoder_resamples_to_8k_across_chunks(fmt: str) -> None:
    import soxr

    signal = tone(440.0, 1.0)
    parts, tail = encode(fmt, signal)
    assert sum(1 for p in parts if p) == len(parts)  # bytes with every chunk (soxr's delay is ~6 ms)
    data = b"".join(parts) + tail
    assert len(data) == len(signal) * G711_RATE // SR  # one byte per 8 kHz sample, nothing lost at the end
    whole = StreamingEncoder(fmt, SR)
    assert whole.encode(signal) + whole.finish() == data  # chunking changes no byte
    assert whole.mime_type == f"audio/{fmt}"
    decoded = (ulaw_to_s16 if fmt == "pcmu" else alaw_to_s16)(data) / 32767.0
    reference = soxr.resample(to_s16(signal) / 32767.0, SR, G711_RATE, quality="HQ")
    snr = 10 * np.log10(np.sum(reference**2) / np.sum((reference - decoded) ** 2))
    assert snr > 30  # G.711 gives ~38 dB on a loud tone
    assert abs(dominant_freq(np.repeat(decoded, SR // G711_RATE)) - 440.0) < 5
    faster = b"".join(encode(fmt, signal, speed=1.5)[0]) + encode(fmt, signal, speed=1.5)[1]
    assert abs(len(faster) - len(data) / 1.5) < 200


@pytest.mark.parametrize("rate", [8000, 16000, 44100, 48000])
def test_pcm_at_another_rate_is_one_resampling_of_the_whole_stream(rate: int) -> None:
    signal = tone(440.0, 1.0)
    chunked = StreamingEncoder("pcm", SR, out_rate=rate)
    data = b"".join(chunked.encode(signal[i : i + CHUNK]) for i in range(0, len(signal), CHUNK)) + chunked.finish()
    assert len(data) == 2 * len(signal) * rate // SR  # nothing lost at the end
    resampler = StreamResampler(SR, rate)
    whole = to_s16(np.concatenate([resampler.process(to_s16(signal) / 32767.0), resampler.flush()]))
    assert data == whole.astype("<i2").tobytes()  # the s16 rule, then one resampling: chunking changes no byte
    assert abs(dominant_freq(whole / 32767.0, rate) - 440.0) < 5
    assert StreamingEncoder("pcm", SR, out_rate=SR).encode(signal) == to_s16(signal).astype("<i2").tobytes()


@pytest.mark.parametrize("fmt, rate, bit_rate", [("mp3", 22050, 32_000), ("mp3", 44100, 128_000),
                                                 ("mp3", 24000, 48_000), ("opus", 48000, 64_000)])
def test_mp3_and_opus_at_another_rate_and_bit_rate(fmt: str, rate: int, bit_rate: int) -> None:
    """ElevenLabs' `mp3_22050_32` ... `opus_48000_64`: the chunks resampled to the codec's rate, encoded at the
    bit rate asked; the stream decodes at that rate, as long as the input (plus the codec's delay), same tone."""
    signal = tone(440.0, 2.0)
    enc = StreamingEncoder(fmt, SR, out_rate=rate, bit_rate=bit_rate)
    parts = [enc.encode(signal[i : i + CHUNK]) for i in range(0, len(signal), CHUNK)]
    data = b"".join(parts) + enc.finish()
    assert sum(1 for p in parts if p) >= 20  # still streams
    decoded, decoded_rate = decode_av(data, fmt)
    assert decoded_rate == rate
    assert 0 <= len(decoded) / rate - 2.0 < 0.1
    assert abs(dominant_freq(decoded, rate) - 440.0) < 5
    if fmt == "mp3":  # constant bit rate, no header: the bytes say the length
        assert abs(len(data) * 8 / bit_rate - len(decoded) / rate) < 0.05
