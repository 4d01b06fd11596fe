"""Voice cloning, model side: reference audio -> (x-vector, reference codes) with the Base model's graphs.

`load_reference_audio` accepts a path, bytes, a binary file object or an `(array, sample_rate)`
tuple, decodes any format FFmpeg knows (PyAV), mixes to mono (mean of the channels, like the
official wrapper), resamples to 24 kHz with soxr "HQ" (what the official `librosa.resample` uses, to
the sample) and enforces limits, raising `ReferenceAudioError` (a ValueError) with a message fit
for an API client.

`resampler="pyav"` (libswresample) is the alternative: it agrees in the pass band (~4e-6 on a
tonal test signal, ~4e-3 max on espeak speech 22.05 -> 24 kHz) but leaks more energy above the
source's Nyquist frequency: for a 22.05 kHz source the top four of the 128 mel bands (> ~11 kHz)
sit at log-mel ~-9 instead of the -11.5 floor, which moves the x-vector (by 9 % relative on a
random-weight test model). 24 kHz input is never resampled.

`VoiceCloner(model_folder)` runs the two graphs a Base conversion writes:

* `speaker_encoder.onnx`: wav -> x-vector [H] (the prompt's speaker row), computed on the reference
  as given (no trailing silence), exactly as `extract_speaker_embedding` does;
* `codec_encoder.onnx`: wav -> codes [T, 16] int64 (T = ceil(N / 1920)), the ICL reference codes,
  computed on the reference plus trailing silence when `trailing_silence` > 0 (default 0.5 s,
  rounded up so the padded clip ends on a 1920-sample frame boundary). The silence stops the
  reference's last phoneme from bleeding into the start of the generated speech (a known ICL
  artefact); set it to 0 for results identical to the official `create_voice_clone_prompt`.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

import numpy as np

from qwen3_tts_gguf.model.manifest import CODEC_ENCODER_FILE, SPEAKER_ENCODER_FILE

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
SILENCE_PEAK = 10 ** (-60 / 20)  # a clip whose peak stays below -60 dBFS is "silent"

AudioSource = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO, tuple]


class ReferenceAudioError(ValueError):
    """Reference audio that cannot be used for voice cloning (the message says why)."""


@dataclass(frozen=True)
class AudioLimits:
    """What `load_reference_audio` accepts."""

    min_seconds: float = 1.0
    max_seconds: float = 30.0
    max_bytes: int = 64 * 1024 * 1024  # encoded size (a file or bytes)


DEFAULT_LIMITS = AudioLimits()


# -- decoding -------------------------------------------------------------------------------
def _open_input(source) -> tuple[object, int | None, str]:
    """(what av.open takes, encoded size if known, a label for messages)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        return io.BytesIO(data), len(data), "audio data"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ReferenceAudioError(f"reference audio {path} does not exist or is not a file")
        return str(path), path.stat().st_size, str(path)
    if hasattr(source, "read"):
        size = None
        try:
            pos = source.tell()
            source.seek(0, io.SEEK_END)
            size = source.tell() - pos
            source.seek(pos)
        except (OSError, AttributeError, ValueError):
            pass
        return source, size, "audio stream"
    raise TypeError(f"unsupported reference audio type {type(source).__name__}; pass a path, bytes, "
                    "a binary file object or an (array, sample_rate) tuple")


def _reason(error: Exception) -> str:
    """FFmpeg's own words for what is wrong with the data (never a path or a class name)."""
    return getattr(error, "strerror", None) or "the data is not audio this server can read"


def decode_audio(source, limits: AudioLimits = DEFAULT_LIMITS) -> tuple[np.ndarray, int]:
    """Decode the first audio stream of a file/bytes/stream: (mono float32 samples, sample rate)."""
    import av
    import av.error

    target, size, label = _open_input(source)
    if size is not None and size > limits.max_bytes:
        raise ReferenceAudioError(f"{label} is {size / 2**20:.1f} MiB; the limit is "
                                  f"{limits.max_bytes / 2**20:.0f} MiB")
    if size == 0:
        raise ReferenceAudioError(f"{label} is empty")
    try:
        container = av.open(target, mode="r")
    except (av.error.FFmpegError, UnicodeDecodeError, OSError) as e:
        raise ReferenceAudioError(f"{label} is not a readable audio file ({_reason(e)})") from e
    try:
        stream = next((s for s in container.streams if s.type == "audio"), None)
        if stream is None:
            raise ReferenceAudioError(f"{label} has no audio stream")
        to_float = av.AudioResampler(format="fltp")  # keeps layout and rate
        chunks: list[np.ndarray] = []
        total = 0
        rate = None
        # decode a little past the limit, then stop: a 10-minute file is refused without decoding it all
        try:
            for frame in container.decode(stream):
                if rate is None:
                    rate = int(frame.sample_rate)
                elif int(frame.sample_rate) != rate:
                    raise ReferenceAudioError(f"{label} changes its sample rate mid-stream")
                for f in to_float.resample(frame):
                    chunks.append(f.to_ndarray().astype(np.float32).mean(axis=0))
                    total += chunks[-1].shape[0]
                if total > (limits.max_seconds + 1.0) * rate:
                    raise ReferenceAudioError(f"{label} is longer than {limits.max_seconds:g} s "
                                              f"(the reference limit)")
            for f in to_float.resample(None):
                chunks.append(f.to_ndarray().astype(np.float32).mean(axis=0))
        except ReferenceAudioError:
            raise
        except (av.error.FFmpegError, ValueError) as e:  # ValueError: format changes mid-stream
            raise ReferenceAudioError(f"{label} could not be decoded ({_reason(e)})") from e
    finally:
        container.close()
    if rate is None or not chunks:
        raise ReferenceAudioError(f"{label} contains no audio samples")
    return np.concatenate(chunks), rate


def resample(wav: np.ndarray, rate: int, target: int = SAMPLE_RATE, *, method: str = "soxr") -> np.ndarray:
    """Mono float32 resampled to `target`; identity when rate == target.

    method "soxr" (default): soxr in its "HQ" mode, padded/trimmed to ceil(n * target / rate)
    samples, i.e. exactly what the official code's `librosa.resample` does. "pyav": libswresample
    through PyAV (see the module docstring for how it differs).
    """
    wav = np.ascontiguousarray(wav, dtype=np.float32)
    if rate == target:
        return wav
    if method == "soxr":
        try:
            import soxr
        except ImportError as e:
            raise ImportError("resampling method 'soxr' needs the soxr package (pip install soxr)") from e
        out = np.asarray(soxr.resample(wav, int(rate), int(target), quality="soxr_hq"), np.float32)
        n = int(math.ceil(wav.shape[0] * (float(target) / rate)))  # librosa's float arithmetic, to the sample
        return np.pad(out, (0, max(0, n - out.shape[0])))[:n]
    if method != "pyav":
        raise ValueError(f"unknown resampling method {method!r}; choose pyav or soxr")
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=target)
    frame = av.AudioFrame.from_ndarray(wav[None, :], format="flt", layout="mono")
    frame.sample_rate = int(rate)
    out = resampler.resample(frame) + resampler.resample(None)
    if not out:
        return np.zeros(0, np.float32)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in out]).astype(np.float32)


def _array_to_mono(array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype.kind in "iu":  # integer PCM: scale to [-1, 1) (the official code would not)
        info = np.iinfo(a.dtype)
        a = (a.astype(np.float64) - (info.max + 1 + info.min) / 2) / ((info.max - info.min + 1) / 2)
    elif a.dtype.kind != "f":
        raise ReferenceAudioError(f"reference audio array has dtype {a.dtype}; expected float or integer PCM")
    if a.ndim == 2:
        # [samples, channels] like soundfile and the official wrapper; [channels, samples] when obvious
        axis = 0 if (a.shape[0] <= 8 < a.shape[1]) else 1
        a = a.mean(axis=axis)
    elif a.ndim != 1:
        raise ReferenceAudioError(f"reference audio array has shape {a.shape}; expected [samples] or "
                                  "[samples, channels]")
    return a.astype(np.float32)


def check_reference(wav: np.ndarray, limits: AudioLimits = DEFAULT_LIMITS, label: str = "reference audio") -> None:
    """Raise ReferenceAudioError unless `wav` (24 kHz mono) is usable."""
    if wav.size == 0:
        raise ReferenceAudioError(f"{label} contains no audio samples")
    if not np.all(np.isfinite(wav)):
        raise ReferenceAudioError(f"{label} contains NaN or infinite samples")
    seconds = wav.shape[0] / SAMPLE_RATE
    if seconds < limits.min_seconds:
        raise ReferenceAudioError(f"{label} is {seconds:.2f} s long; at least {limits.min_seconds:g} s is "
                                  "needed (3-10 s of clean speech works best)")
    if seconds > limits.max_seconds:
        raise ReferenceAudioError(f"{label} is {seconds:.1f} s long; the limit is {limits.max_seconds:g} s "
                                  "(3-10 s of clean speech works best)")
    peak = float(np.max(np.abs(wav)))
    if peak < SILENCE_PEAK:
        raise ReferenceAudioError(f"{label} is silent (peak {20 * math.log10(max(peak, 1e-12)):.0f} dBFS)")


def load_reference_audio(source: AudioSource, *, limits: AudioLimits = DEFAULT_LIMITS,
                         resampler: str = "soxr") -> np.ndarray:
    """Reference audio -> mono float32 at 24 kHz, checked against `limits` (no silence appended).

    `source`: a path, bytes, a binary file object (any format FFmpeg decodes), or a tuple
    `(array, sample_rate)` with a float array ([samples] or [samples, channels]) or integer PCM.
    Samples are not normalised (the official code does not normalise either). `resampler`: see
    `resample` ("soxr" reproduces the official librosa resampling exactly).
    """
    if isinstance(source, tuple):
        if len(source) != 2:
            raise TypeError("an array reference must be a tuple (array, sample_rate)")
        array, rate = source
        mono, rate = _array_to_mono(array), int(rate)
        if rate <= 0:
            raise ReferenceAudioError(f"invalid sample rate {rate}")
        if mono.shape[0] > (limits.max_seconds + 1.0) * rate:
            raise ReferenceAudioError(f"reference audio is {mono.shape[0] / rate:.1f} s long; the limit is "
                                      f"{limits.max_seconds:g} s")
        label = "reference audio"
    elif isinstance(source, np.ndarray):
        raise TypeError("for a numpy waveform pass a tuple (array, sample_rate)")
    else:
        mono, rate = decode_audio(source, limits)
        label = str(source) if isinstance(source, (str, os.PathLike)) else "reference audio"
    wav = resample(mono, rate, method=resampler)
    check_reference(wav, limits, label)
    return wav


def append_silence(wav: np.ndarray, seconds: float) -> np.ndarray:
    """wav + at least `seconds` of zeros, rounded up so the result is a whole number of codec frames."""
    if seconds <= 0:
        return wav
    n = wav.shape[0] + int(round(seconds * SAMPLE_RATE))
    n = -(-n // SAMPLES_PER_FRAME) * SAMPLES_PER_FRAME
    return np.concatenate([wav, np.zeros(n - wav.shape[0], np.float32)])


# -- the graphs -------------------------------------------------------------------------------
class VoiceCloner:
    """Runs a converted Base model's speaker encoder and codec encoder on reference audio."""

    def __init__(self, model_folder: str | os.PathLike, *, threads: int | None = None, device: str = "cpu",
                 limits: AudioLimits = DEFAULT_LIMITS, resampler: str = "soxr"):
        from qwen3_tts_gguf.model.manifest import ModelFolderError, load_manifest
        from qwen3_tts_gguf.model.onnx_session import make_session

        self.folder = Path(model_folder)
        self.manifest = load_manifest(self.folder)
        if self.manifest.model_type != "base":
            raise ModelFolderError(f"{self.folder} is a {self.manifest.model_type} model; voice cloning needs a "
                                   "Base model (tts_model_type 'base')")
        for name in (SPEAKER_ENCODER_FILE, CODEC_ENCODER_FILE):
            if not (self.folder / name).is_file():
                raise ModelFolderError(f"{self.folder} has no {name}; convert the Base checkpoint again with "
                                       "this version to get the voice-cloning encoders")
        self.limits = limits
        self.resampler = resampler
        self.hidden_size = int(self.manifest.talker["hidden_size"])
        self._speaker = make_session(self.folder / SPEAKER_ENCODER_FILE, threads=threads, device=device)
        self._codec = make_session(self.folder / CODEC_ENCODER_FILE, threads=threads, device=device)

    def speaker_embedding(self, wav: np.ndarray) -> np.ndarray:
        """x-vector [H] float32 of a 24 kHz mono clip."""
        wav = np.ascontiguousarray(wav, dtype=np.float32)
        (xvec,) = self._speaker.run(None, {"wav": wav[None, :]})
        return np.asarray(xvec, np.float32)

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """Codes [ceil(N / 1920), 16] int64 of a 24 kHz mono clip."""
        wav = np.ascontiguousarray(wav, dtype=np.float32)
        (codes,) = self._codec.run(None, {"wav": wav[None, :]})
        return np.asarray(codes, np.int64)

    def extract(self, audio: AudioSource, *, trailing_silence: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
        """(x-vector [H] float32, reference codes [T, 16] int64) of reference audio.

        `audio`: anything `load_reference_audio` takes. `trailing_silence` seconds of zeros are
        appended before the codec encoder only (0 = the official computation).
        """
        wav = load_reference_audio(audio, limits=self.limits, resampler=self.resampler)
        return self.speaker_embedding(wav), self.encode(append_silence(wav, trailing_silence))

    def create_profile(self, name: str, audio: AudioSource, *, ref_text: str | None = None,
                       language: str = "auto", trailing_silence: float = 0.5):
        """A `voices.VoiceProfile` for this model: ICL when `ref_text` is given, else x-vector only."""
        from qwen3_tts_gguf.voicebank.store import VoiceProfile

        xvec, codes = self.extract(audio, trailing_silence=trailing_silence)
        icl = bool(ref_text and ref_text.strip())
        return VoiceProfile.create(
            name=name, model_size=self.manifest.model_size, hidden_size=self.hidden_size, language=language,
            mode="icl" if icl else "xvector", ref_text=ref_text if icl else None,
            ref_codes=codes if icl else None, speaker_embedding=xvec, model=self.manifest.name,
        )


__all__ = [
    "SAMPLE_RATE", "SPEAKER_ENCODER_FILE", "CODEC_ENCODER_FILE", "ReferenceAudioError", "AudioLimits",
    "DEFAULT_LIMITS", "decode_audio", "resample", "check_reference", "load_reference_audio",
    "append_silence", "VoiceCloner",
]
