"""The Base models' speaker encoder (ECAPA-TDNN x-vector) with its log-mel front end, as one ONNX graph.

Input `wav` float [1, N]: mono, 24 kHz, float in [-1, 1] (the official code does not normalise; it
only warns outside [-1, 1]); N must exceed 384 (the reflect padding). Output `xvector` float
[enc_dim] (= talker hidden size): the speaker row of the prompt, used as is.

Matches the official `Qwen3TTSForConditionalGeneration.extract_speaker_embedding(audio, sr=24000)`:

front end (`mel_spectrogram`): reflect-pad (n_fft - hop) / 2 = 384 samples on both sides, STFT
n_fft 1024 / hop 256 / periodic Hann window 1024 / no centering, computed here as one strided Conv
with fixed windowed cos and sin kernels; magnitude sqrt(re² + im² + 1e-9); the Slaney mel filterbank
of `librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)` (reimplemented in
numpy below, `slaney_mel_filterbank`); log(max(mel, 1e-5)).

network (`Qwen3TTSSpeakerEncoder`): every Conv1d has a bias, padding "same" with padding_mode
"reflect"; TDNN = conv + ReLU, no BatchNorm; 3 SE-Res2Net blocks, multi-layer aggregation,
attentive statistics pooling, a k1 conv as the final linear layer.
"""

from __future__ import annotations

import numpy as np
import onnx

from qwen3_tts_gguf.convert.checkpoint import Checkpoint, CheckpointError
from qwen3_tts_gguf.convert.onnx_builder import GraphBuilder

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
WIN = 1024
N_MELS = 128
FMIN = 0.0
FMAX = 12000.0
STFT_PAD = (N_FFT - HOP) // 2  # 384, reflect
MAG_EPS = 1e-9
LOG_CLAMP = 1e-5
ASP_EPS = 1e-12
PREFIX = "speaker_encoder."
MIN_SAMPLES = STFT_PAD + 1  # reflect padding needs more input samples than the pad width

DEFAULTS = {  # Qwen3TTSSpeakerEncoderConfig defaults; config.json normally states every field
    "mel_dim": 128, "enc_dim": 1024, "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 128, "enc_res2net_scale": 8, "enc_se_channels": 128, "sample_rate": 24000,
}


# -- Slaney mel filterbank (librosa.filters.mel with htk=False, norm="slaney") -------------------
def _hz_to_mel(frequencies) -> np.ndarray:
    frequencies = np.asanyarray(frequencies, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = frequencies / f_sp
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    if frequencies.ndim:
        log_t = frequencies >= min_log_hz
        mels[log_t] = min_log_mel + np.log(frequencies[log_t] / min_log_hz) / logstep
    elif frequencies >= min_log_hz:
        mels = min_log_mel + np.log(frequencies / min_log_hz) / logstep
    return mels


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    mels = np.asanyarray(mels, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * np.exp(logstep * (mels[log_t] - min_log_mel))
    return freqs


def slaney_mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
                          fmin: float = FMIN, fmax: float | None = FMAX) -> np.ndarray:
    """[n_mels, 1 + n_fft // 2] float32, the same numbers as `librosa.filters.mel` (Slaney scale and norm)."""
    if fmax is None:
        fmax = float(sr) / 2
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, np.newaxis]  # float32 array, float64 factors: same rounding as librosa
    return weights


def stft_kernels(n_fft: int = N_FFT, win: int = WIN) -> np.ndarray:
    """Conv weights [2 * (n_fft//2 + 1), 1, n_fft]: windowed cos rows (real part), then -sin rows (imaginary)."""
    if win != n_fft:
        raise ValueError("window length must equal n_fft here")
    n = np.arange(n_fft, dtype=np.float64)
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / n_fft)  # torch.hann_window(periodic=True)
    k = np.arange(n_fft // 2 + 1, dtype=np.float64)[:, None]
    # exact integer phase (k*n mod n_fft) keeps the float64 angles small and accurate
    phase = 2.0 * np.pi * ((k * n) % n_fft) / n_fft
    kernels = np.concatenate([np.cos(phase) * window, -np.sin(phase) * window], axis=0)
    return kernels[:, None, :]


def log_mel_numpy(wav: np.ndarray) -> np.ndarray:
    """Float64 numpy reference of the front end: [n_mels, frames] for a 1-D wav (for tests)."""
    y = np.pad(np.asarray(wav, np.float64), (STFT_PAD, STFT_PAD), mode="reflect")
    frames = 1 + (len(y) - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)
    spec = np.fft.rfft(y[idx] * window, axis=-1)
    mag = np.sqrt(spec.real ** 2 + spec.imag ** 2 + MAG_EPS)
    return np.log(np.maximum(slaney_mel_filterbank().astype(np.float64) @ mag.T, LOG_CLAMP))


# -- graph --------------------------------------------------------------------------------------
class _SpeakerEncoderBuilder:
    def __init__(self, ckpt: Checkpoint, float_type):
        cfg = ckpt.config.speaker_encoder
        if ckpt.config.model_type != "base" or cfg is None:
            raise CheckpointError(f"only Base checkpoints have a speaker encoder (this one is "
                                  f"{ckpt.config.model_type!r})")
        self.cfg = {**DEFAULTS, **cfg}
        if int(self.cfg["sample_rate"]) != SAMPLE_RATE or int(self.cfg["mel_dim"]) != N_MELS:
            raise CheckpointError(f"speaker encoder with sample_rate {self.cfg['sample_rate']} / mel_dim "
                                  f"{self.cfg['mel_dim']} is not supported (expected {SAMPLE_RATE} / {N_MELS})")
        self.weights = ckpt.weights
        self.g = GraphBuilder("qwen3_tts_speaker_encoder", float_type)

    def w(self, name: str) -> np.ndarray:
        key = PREFIX + name
        if key not in self.weights:
            raise CheckpointError(f"model.safetensors has no tensor {key}")
        return np.asarray(self.weights[key], dtype=np.float32)

    def conv(self, x: str, name: str, dilation: int = 1) -> str:
        """Conv1d(padding="same", padding_mode="reflect") with bias, weights `<name>.weight/.bias`."""
        g = self.g
        weight = self.w(name + ".weight")
        k = weight.shape[-1]
        total = dilation * (k - 1)
        left = total // 2  # torch "same": left = total // 2, right = the rest
        if total:
            pads = g.const(np.array([0, 0, left, 0, 0, total - left], np.int64))
            x = g.op("Pad", x, pads, mode="reflect")
        w = g.weight(PREFIX + name + ".weight", weight)
        b = g.weight(PREFIX + name + ".bias", self.w(name + ".bias"))
        return g.op("Conv", x, w, b, dilations=[dilation], kernel_shape=[k])

    def tdnn(self, x: str, name: str, dilation: int = 1) -> str:
        return self.g.op("Relu", self.conv(x, name + ".conv", dilation))

    def front_end(self, wav: str) -> str:
        g = self.g
        y = g.op("Pad", wav, g.const(np.array([0, STFT_PAD, 0, STFT_PAD], np.int64)), mode="reflect")
        y = g.op("Unsqueeze", y, g.const(np.array([1], np.int64)))  # [1, 1, N + 768]
        kernels = stft_kernels()
        spec = g.op("Conv", y, g.weight("stft_kernels", kernels), kernel_shape=[N_FFT], strides=[HOP])
        bins = N_FFT // 2 + 1
        sq = g.op("Reshape", g.op("Mul", spec, spec), g.const(np.array([1, 2, bins, -1], np.int64)))
        power = g.op("ReduceSum", sq, g.const(np.array([1], np.int64)), keepdims=0)  # re² + im²: [1, bins, F]
        mag = g.op("Sqrt", g.op("Add", power, g.const(MAG_EPS)))
        mel = g.op("MatMul", g.weight("mel_filterbank", slaney_mel_filterbank()), mag)  # [1, 128, F]
        return g.op("Log", g.op("Max", mel, g.const(LOG_CLAMP)))

    def se_res2net(self, x: str, i: int) -> str:
        g, c = self.g, self.cfg
        p = f"blocks.{i}"
        scale = int(c["enc_res2net_scale"])
        channels = int(c["enc_channels"][i])
        if channels % scale:
            raise CheckpointError(f"enc_channels[{i}] = {channels} is not divisible by res2net scale {scale}")
        dilation = int(c["enc_dilations"][i])
        y = self.tdnn(x, f"{p}.tdnn1")
        parts = g.op("Split", y, g.const(np.full(scale, channels // scale, np.int64)), axis=1, outputs=scale)
        outs = [parts[0]]
        prev = None
        for j in range(1, scale):
            inp = parts[j] if j == 1 else g.op("Add", parts[j], prev)
            prev = self.tdnn(inp, f"{p}.res2net_block.blocks.{j - 1}", dilation)
            outs.append(prev)
        y = self.tdnn(g.op("Concat", *outs, axis=1), f"{p}.tdnn2")
        s = g.op("ReduceMean", y, axes=[2], keepdims=1)
        s = g.op("Relu", self.conv(s, f"{p}.se_block.conv1"))
        s = g.op("Sigmoid", self.conv(s, f"{p}.se_block.conv2"))
        return g.op("Add", g.op("Mul", y, s), x)

    def stats(self, x: str, weights: str | None) -> tuple[str, str]:
        """(mean, std) over time, [1, C, 1] each; plain mean when weights is None."""
        g = self.g
        axes = g.const(np.array([2], np.int64))
        if weights is None:
            mean = g.op("ReduceMean", x, axes=[2], keepdims=1)
        else:
            mean = g.op("ReduceSum", g.op("Mul", weights, x), axes, keepdims=1)
        d = g.op("Sub", x, mean)
        d2 = g.op("Mul", d, d)
        if weights is None:
            var = g.op("ReduceMean", d2, axes=[2], keepdims=1)
        else:
            var = g.op("ReduceSum", g.op("Mul", weights, d2), axes, keepdims=1)
        return mean, g.op("Sqrt", g.op("Max", var, g.const(ASP_EPS)))

    def build(self) -> onnx.ModelProto:
        g, c = self.g, self.cfg
        n_blocks = len(c["enc_channels"])
        if not (n_blocks == len(c["enc_kernel_sizes"]) == len(c["enc_dilations"])) or n_blocks < 3:
            raise CheckpointError("speaker encoder config: enc_channels, enc_kernel_sizes and enc_dilations "
                                  "must have the same length (>= 3)")
        wav = g.input("wav", "float", [1, "N"])
        x = self.front_end(wav)  # [1, 128, F]
        x = self.tdnn(x, "blocks.0", int(c["enc_dilations"][0]))
        feats = []
        for i in range(1, n_blocks - 1):
            x = self.se_res2net(x, i)
            feats.append(x)
        m = self.tdnn(g.op("Concat", *feats, axis=1), "mfa", int(c["enc_dilations"][-1]))
        # attentive statistics pooling
        mean, std = self.stats(m, None)
        shape = g.op("Shape", m)
        att_in = g.op("Concat", m, g.op("Expand", mean, shape), g.op("Expand", std, shape), axis=1)
        att = self.conv(g.op("Tanh", self.tdnn(att_in, "asp.tdnn")), "asp.conv")
        att = g.op("Softmax", att, axis=2)
        mean_w, std_w = self.stats(m, att)
        pooled = g.op("Concat", mean_w, std_w, axis=1)  # [1, 2C, 1]
        xvec = self.conv(pooled, "fc")  # [1, enc_dim, 1]
        enc_dim = int(c["enc_dim"])
        xvec = g.op("Reshape", xvec, g.const(np.array([enc_dim], np.int64)))
        g.output(xvec, "xvector", "float", [enc_dim])
        return g.model(
            metadata={"sample_rate": SAMPLE_RATE, "enc_dim": enc_dim, "min_samples": MIN_SAMPLES,
                      "front_end": "reflect384-stft1024/256-hann-slaney128-log"},
            doc="Qwen3-TTS Base speaker encoder: wav [1, N] at 24 kHz -> x-vector [enc_dim]",
        )


def build_speaker_encoder(ckpt: Checkpoint, float_type=np.float32) -> onnx.ModelProto:
    """ONNX graph wav float [1, N] (24 kHz mono, N > 384) -> xvector float [enc_dim]."""
    return _SpeakerEncoderBuilder(ckpt, float_type).build()


__all__ = ["build_speaker_encoder", "slaney_mel_filterbank", "stft_kernels", "log_mel_numpy", "SAMPLE_RATE",
           "MIN_SAMPLES"]
