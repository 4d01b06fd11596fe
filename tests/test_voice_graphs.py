"""Voice cloning, model side: speaker encoder and codec encoder graphs against the official code.

* x-vector: our graph (log-mel front end included) vs the official
  `model.model.extract_speaker_embedding(wav, 24000)` in fp32. Bar: max |err| <= 1e-5 * max(1, max|ref|).
  Measured ~1.5e-6..2.6e-6 on |ref| ~2.4..10, which is the fp32 noise floor: the official fp32 result
  itself differs from a float64 run (official network in double on float64 mels) by 1.2e-6..2.4e-6.
* codes: our graph vs the official `speech_tokenizer.encode(wav, sr=24000)`: exact. RVQ nearest
  neighbour could flip on a near-tie with random weights; the check then accepts a differing code
  only where the official distances of both candidates agree to 1e-4 relative (a tie), and reports it.
* reference audio loading and its errors; the runtime `VoiceCloner` on a converted model equals the
  official `create_voice_clone_prompt` (ref_code, ref_spk_embedding) for a 24 kHz WAV file.
Parity inputs are 24 kHz so nothing is resampled (PyAV and librosa resample slightly differently).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnxruntime as ort
import pytest

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.codec_encoder_graph import build_codec_encoder
from qwen3_tts_gguf.convert.speaker_encoder_graph import build_speaker_encoder, log_mel_numpy, slaney_mel_filterbank
from qwen3_tts_gguf.voicebank.clone import (
    AudioLimits,
    ReferenceAudioError,
    VoiceCloner,
    append_silence,
    load_reference_audio,
)

from tests.reference.runner import load_official

SR = 24000
XVEC_RTOL = 1e-5
TIE_RTOL = 1e-4
CHECKPOINTS = ["tiny_base", "tiny0b6_base"]


# -- signals ---------------------------------------------------------------------------------
def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Deterministic speech-like audio at 24 kHz: voiced syllables (gliding F0, moving formants),
    noise bursts (fricatives) and short pauses; peak ~0.5."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * SR))
    t = np.arange(n) / SR
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6)) + 10 * np.sin(2 * np.pi * 3.1 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    formants = [(500 + 250 * np.sin(2 * np.pi * 1.3 * t), 90), (1500 + 600 * np.sin(2 * np.pi * 0.9 * t + 1), 120),
                (2500 + 300 * np.sin(2 * np.pi * 0.5 * t + 2), 180)]
    voiced = np.zeros(n)
    for h in range(1, 40):
        fh = h * f0
        amp = sum(np.exp(-0.5 * ((fh - fc) / bw) ** 2) * (1.0 / k) for k, (fc, bw) in enumerate(formants, 1))
        amp = amp * (fh < 11000) + 0.02 / h
        voiced += amp * np.sin(h * phase)
    syllable = np.clip(np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 6)), 0, None) ** 0.7
    noise = rng.standard_normal(n)
    noise = np.convolve(noise, [1, -0.9], mode="same")  # high-pass: hiss
    fric = (np.sin(2 * np.pi * 1.1 * t + rng.uniform(0, 6)) > 0.85).astype(float)
    pause = (np.sin(2 * np.pi * 0.23 * t + rng.uniform(0, 6)) > -0.9).astype(float)
    x = (voiced * syllable + 0.3 * noise * fric) * pause + 0.001 * rng.standard_normal(n)
    return (0.5 * x / np.max(np.abs(x))).astype(np.float32)


def espeak(text: str, tmp_path) -> np.ndarray | None:
    """Real synthetic speech from espeak-ng resampled to 24 kHz, or None when espeak-ng is missing."""
    if shutil.which("espeak-ng") is None:
        return None
    import librosa
    import soundfile as sf

    out = tmp_path / "espeak.wav"
    subprocess.run(["espeak-ng", "-w", str(out), text], check=True, capture_output=True)
    y, sr = sf.read(out, dtype="float32")
    return librosa.resample(y, orig_sr=sr, target_sr=SR).astype(np.float32)


SIGNALS = {
    "speech_like_3.3s": lambda tmp: speech_like(3.3, seed=1),
    "speech_like_12.3s_beyond_window": lambda tmp: speech_like(12.3, seed=2),
    "espeak": lambda tmp: espeak("The quick brown fox jumps over the lazy dog. Please call Stella.", tmp),
}


# -- fixtures --------------------------------------------------------------------------------
def _session(model) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 2
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # torch runs right after
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def graphs(checkpoint_factory):
    """name -> (speaker session, codec session, official Qwen3TTSModel)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            path = checkpoint_factory(name)
            ckpt = Checkpoint.open(path)
            cache[name] = (_session(build_speaker_encoder(ckpt)), _session(build_codec_encoder(ckpt)),
                           load_official(str(path)))
        return cache[name]

    return get


def _signal(key: str, tmp_path) -> np.ndarray:
    wav = SIGNALS[key](tmp_path)
    if wav is None:
        pytest.skip("espeak-ng is not installed")
    return wav


# -- front end -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000),  # the speaker encoder's
    dict(sr=22050, n_fft=2048, n_mels=80, fmin=0, fmax=None),
    dict(sr=16000, n_fft=512, n_mels=40, fmin=50, fmax=7600),
])
def test_slaney_filterbank_equals_librosa(kwargs):
    import librosa

    ours = slaney_mel_filterbank(**kwargs)
    ref = librosa.filters.mel(**kwargs)
    assert ours.dtype == ref.dtype == np.float32 and ours.shape == ref.shape
    assert np.max(np.abs(ours - ref)) <= 1e-6


def test_log_mel_reference_equals_official():
    import torch

    from tests.reference.official import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    wav = speech_like(1.5, seed=3)
    ref = mel_spectrogram(torch.from_numpy(wav)[None], n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256,
                          win_size=1024, fmin=0, fmax=12000)[0].numpy()
    ours = log_mel_numpy(wav)
    assert ours.shape == ref.shape
    assert np.max(np.abs(ours - ref)) < 1e-3  # log domain; fp32 torch STFT vs float64 numpy


# -- x-vector --------------------------------------------------------------------------------
@pytest.mark.parametrize("signal", ["speech_like_3.3s", "espeak"])
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_xvector_matches_official(graphs, name, signal, tmp_path):
    speaker, _, tts = graphs(name)
    wav = _signal(signal, tmp_path)
    (ours,) = speaker.run(None, {"wav": wav[None]})
    ref = tts.model.extract_speaker_embedding(wav, SR).float().numpy()
    assert ours.shape == ref.shape == (tts.model.config.talker_config.hidden_size,)
    err = float(np.max(np.abs(ours - ref)))
    bar = XVEC_RTOL * max(1.0, float(np.max(np.abs(ref))))
    print(f"{name} {signal}: x-vector max|err| {err:.2e} (bar {bar:.1e}, max|ref| {np.max(np.abs(ref)):.2f})")
    assert err <= bar


def test_float64_graphs_are_exact(checkpoint_factory):
    """The same builders in float64 under onnx.reference: the x-vector equals the official network run in
    double on float64 log-mels to ~1e-14 (so the construction is exact, not just close), and the codes
    equal the official fp32 codes."""
    import copy

    import torch
    from onnx.reference import ReferenceEvaluator

    path = checkpoint_factory("tiny_base")
    ckpt = Checkpoint.open(path)
    tts = load_official(str(path))
    wav = speech_like(0.8, seed=12).astype(np.float64)
    (ours,) = ReferenceEvaluator(build_speaker_encoder(ckpt, np.float64)).run(None, {"wav": wav[None]})
    net = copy.deepcopy(tts.model.speaker_encoder).double()
    with torch.no_grad():
        ref = net(torch.from_numpy(log_mel_numpy(wav).T[None]))[0].numpy()
    assert ours.dtype == np.float64 and np.max(np.abs(ours - ref)) < 1e-10
    (codes,) = ReferenceEvaluator(build_codec_encoder(ckpt, np.float64)).run(None, {"wav": wav[None]})
    ref_codes = tts.model.speech_tokenizer.encode(wav.astype(np.float32), sr=SR).audio_codes[0].numpy()
    assert np.array_equal(codes, ref_codes)


# -- codes -----------------------------------------------------------------------------------
def _official_distances(tts, wav: np.ndarray, frame: int, book: int, codes: np.ndarray) -> np.ndarray:
    """Official Euclidean distances of `frame` to every entry of codebook `book` (residual built
    from the official codes of the earlier books)."""
    import torch

    enc = tts.model.speech_tokenizer.model.encoder
    with torch.no_grad():
        x = torch.from_numpy(wav)[None, None]
        emb = enc.encoder(x)
        h = enc.encoder_transformer(emb.transpose(1, 2), return_dict=True).last_hidden_state.transpose(1, 2)
        h = enc.downsample(h)
        rvq = (enc.quantizer.semantic_residual_vector_quantizer if book == 0
               else enc.quantizer.acoustic_residual_vector_quantizer)
        r = rvq.input_proj(h)[0, :, frame]
        first = 0 if book == 0 else 1
        for k in range(first, book):
            r = r - rvq.layers[k - first].codebook.embed[int(codes[frame, k])]
        table = rvq.layers[book - first].codebook.embed
        return torch.cdist(r[None].float(), table.float())[0].numpy()


def assert_codes_equal(ours: np.ndarray, ref: np.ndarray, tts, wav: np.ndarray) -> None:
    assert ours.shape == ref.shape and ours.dtype == np.int64
    diff = np.argwhere(ours != ref)
    ties = []
    for frame in sorted(set(diff[:, 0].tolist())):
        book = int(diff[diff[:, 0] == frame, 1].min())  # later books of that frame follow the flip
        d = _official_distances(tts, wav, frame, book, ref)
        a, b = d[ref[frame, book]], d[ours[frame, book]]
        margin = abs(b - a) / max(a, 1e-12)
        ties.append((frame, book, margin))
        assert margin <= TIE_RTOL, f"frame {frame} codebook {book}: {ours[frame, book]} vs official " \
                                   f"{ref[frame, book]} is not a near-tie (relative gap {margin:.2e})"
    if ties:
        print(f"near-tie flips (frame, codebook, relative distance gap): {ties}")


@pytest.mark.parametrize("signal", list(SIGNALS))
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_codes_match_official(graphs, name, signal, tmp_path):
    _, codec, tts = graphs(name)
    wav = _signal(signal, tmp_path)
    (ours,) = codec.run(None, {"wav": wav[None]})
    ref = tts.model.speech_tokenizer.encode(wav, sr=SR).audio_codes[0].numpy()
    assert ours.shape == (-(-len(wav) // 1920), 16)
    assert_codes_equal(ours, ref, tts, wav)


@pytest.mark.parametrize("n", [1, 1919, 1920, 1921, 24000 + 77])
def test_code_count_is_ceil_n_over_1920(graphs, n):
    _, codec, tts = graphs("tiny_base")
    wav = speech_like(2.0, seed=4)[:n]
    (ours,) = codec.run(None, {"wav": wav[None]})
    ref = tts.model.speech_tokenizer.encode(wav, sr=SR).audio_codes[0].numpy()
    assert ours.shape == ref.shape == (-(-n // 1920), 16)
    assert_codes_equal(ours, ref, tts, wav)


def test_official_encoder_ignores_the_sliding_window(graphs, checkpoint_factory):
    """The config's sliding_window (250 frames at 25 Hz) is not applied by the official whole-clip
    encode (use_cache=False -> plain causal mask); the windowed build differs past 10 s."""
    wav = speech_like(12.3, seed=2)
    _, codec, _ = graphs("tiny_base")
    windowed = _session(build_codec_encoder(Checkpoint.open(checkpoint_factory("tiny_base")), sliding_window=250))
    (full,) = codec.run(None, {"wav": wav[None]})
    (win,) = windowed.run(None, {"wav": wav[None]})
    differs = np.nonzero((full != win).any(axis=1))[0]
    assert differs.size and differs.min() >= 125  # identical within the first 250 frames at 25 Hz


# -- runtime: VoiceCloner on a converted model ---------------------------------------------------
@pytest.fixture(scope="module")
def base_model(converted_factory):
    return converted_factory("tiny_base", "f32")


def test_voice_cloner_equals_official_prompt(base_model, checkpoint_factory, tmp_path):
    import soundfile as sf

    wav = speech_like(2.7, seed=5)
    path = tmp_path / "ref.wav"
    sf.write(path, wav, SR, subtype="FLOAT")
    xvec, codes = VoiceCloner(base_model).extract(str(path), trailing_silence=0)
    tts = load_official(str(checkpoint_factory("tiny_base")))
    item = tts.create_voice_clone_prompt(ref_audio=str(path), ref_text="hello there")[0]
    ref_codes = item.ref_code.numpy()
    ref_x = item.ref_spk_embedding.float().numpy()
    assert codes.dtype == np.int64 and ref_codes.dtype == np.int64 and codes.shape == ref_codes.shape
    assert_codes_equal(codes, ref_codes, tts, wav)
    assert xvec.dtype == np.float32
    assert np.max(np.abs(xvec - ref_x)) <= XVEC_RTOL * max(1.0, float(np.max(np.abs(ref_x))))


def test_soxr_resampling_reproduces_the_official_prompt(base_model, checkpoint_factory, tmp_path):
    """A 22.05 kHz stereo file: resampler="soxr" is the official librosa resampling, so both outputs match."""
    pytest.importorskip("soxr")
    import soundfile as sf

    stereo = np.stack([speech_like(2.5, seed=10), speech_like(2.5, seed=11)], axis=1)
    path = tmp_path / "ref22k.wav"
    sf.write(path, stereo[: int(2.5 * 22050)], 22050, subtype="PCM_16")
    xvec, codes = VoiceCloner(base_model, resampler="soxr").extract(str(path), trailing_silence=0)
    tts = load_official(str(checkpoint_factory("tiny_base")))
    item = tts.create_voice_clone_prompt(ref_audio=str(path), ref_text="hello there")[0]
    ref_x = item.ref_spk_embedding.float().numpy()
    assert np.array_equal(codes, item.ref_code.numpy())
    assert np.max(np.abs(xvec - ref_x)) <= XVEC_RTOL * max(1.0, float(np.max(np.abs(ref_x))))
    # the default PyAV resampler: same length, pass band close (the codes usually agree; not asserted)
    wav_pyav = load_reference_audio(path)
    wav_soxr = load_reference_audio(path, resampler="soxr")
    assert abs(len(wav_pyav) - len(wav_soxr)) <= 1


def test_trailing_silence_pads_codes_only(base_model):
    cloner = VoiceCloner(base_model)
    wav = speech_like(2.0, seed=6)
    x0, c0 = cloner.extract((wav, SR), trailing_silence=0)
    x1, c1 = cloner.extract((wav, SR))  # default 0.5 s
    assert np.array_equal(x0, x1)
    padded = append_silence(wav, 0.5)
    assert len(padded) % 1920 == 0 and len(padded) >= len(wav) + 12000
    assert c1.shape == (len(padded) // 1920, 16)
    assert np.array_equal(c1[:len(wav) // 1920], c0[:len(wav) // 1920])  # causal encoder: prefix unchanged


def test_voice_cloner_refuses_non_base(converted_factory):
    from qwen3_tts_gguf.model.manifest import ModelFolderError

    with pytest.raises(ModelFolderError, match="Base"):
        VoiceCloner(converted_factory("tiny_cv", "f32"))


# -- reference audio ---------------------------------------------------------------------------
def test_reference_audio_formats(tmp_path):
    import soundfile as sf

    stereo = np.stack([speech_like(2.0, seed=7), 0.5 * speech_like(2.0, seed=8)], axis=1)
    sf.write(tmp_path / "ref.flac", stereo, SR, subtype="PCM_24")
    wav = load_reference_audio(tmp_path / "ref.flac")
    assert wav.dtype == np.float32 and wav.shape == (2 * SR,)
    assert np.max(np.abs(wav - stereo.mean(axis=1))) < 1e-5  # mean of channels, 24-bit quantisation
    down = speech_like(2.0, seed=9)
    sf.write(tmp_path / "ref44.wav", down[:44100], 44100, subtype="PCM_16")  # 1 s at 44.1 kHz
    wav44 = load_reference_audio((tmp_path / "ref44.wav").read_bytes())
    assert abs(len(wav44) - SR) <= 1
    from_array = load_reference_audio((stereo, SR))
    assert np.allclose(from_array, stereo.mean(axis=1), atol=1e-7)
    pcm16 = (stereo[:, 0] * 32767).astype(np.int16)
    assert np.max(np.abs(load_reference_audio((pcm16, SR)) - stereo[:, 0])) < 1e-4


def test_reference_audio_errors(tmp_path):
    import soundfile as sf

    with pytest.raises(ReferenceAudioError, match="silent"):
        load_reference_audio((np.zeros(3 * SR, np.float32), SR))
    with pytest.raises(ReferenceAudioError, match="silent"):
        load_reference_audio((np.full(3 * SR, 1e-5, np.float32), SR))
    with pytest.raises(ReferenceAudioError, match=r"0\.20 s long; at least 1 s"):
        load_reference_audio((speech_like(0.2), SR))
    long = tmp_path / "ten_minutes.wav"
    sf.write(long, np.tile((speech_like(1.0) * 32767).astype(np.int16), 600), SR, subtype="PCM_16")
    with pytest.raises(ReferenceAudioError, match="longer than 30 s"):
        load_reference_audio(long)
    with pytest.raises(ReferenceAudioError, match="limit is 30 s"):
        load_reference_audio((np.tile(speech_like(1.0), 600), SR))
    text = tmp_path / "notes.wav"
    text.write_text("this is a text file, not audio\n" * 20)
    with pytest.raises(ReferenceAudioError, match="not a readable audio file"):
        load_reference_audio(text)
    with pytest.raises(ReferenceAudioError, match="empty"):
        load_reference_audio(b"")
    with pytest.raises(ReferenceAudioError, match="does not exist"):
        load_reference_audio(tmp_path / "missing.wav")
    with pytest.raises(ReferenceAudioError, match="MiB"):
        load_reference_audio(long, limits=AudioLimits(max_bytes=1024))
    with pytest.raises(ReferenceAudioError, match="NaN"):
        load_reference_audio((np.full(2 * SR, np.nan, np.float32), SR))
    assert issubclass(ReferenceAudioError, ValueError)


# -- real shapes (opt-in: QTTS_SLOW=1, ~30 s) -------------------------------------------------------
@pytest.mark.skipif(not __import__("os").environ.get("QTTS_SLOW"), reason="set QTTS_SLOW=1 for real-shape parity")
def test_real_shape_parity(tmp_path):
    """Random weights in the published 1.7B shapes (speaker encoder 512/1536 channels, enc_dim 2048; Mimi
    encoder 64 filters, 8 x 512-d layers, 256-d codebooks), official modules vs our graphs, 15 s input
    (past the 250-frame window). Measured: x-vector max|err| 5.7e-6 on |ref| 6.2; codes identical."""
    import json
    import types

    import torch

    from qwen3_tts_gguf.convert.model_shapes import checkpoint_configs

    from tests.reference.checkpoints import _randomise
    from tests.reference.official import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder, mel_spectrogram
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    cfgs = checkpoint_configs("1.7b", "base")
    gen = torch.Generator().manual_seed(0)
    spk_cfg = cfgs["config.json"]["speaker_encoder_config"]
    se = Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**spk_cfg)).eval()
    _randomise(se, gen)
    codec = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**cfgs["speech_tokenizer/config.json"])).eval()
    _randomise(codec, gen)
    (tmp_path / "speech_tokenizer").mkdir()
    (tmp_path / "speech_tokenizer" / "config.json").write_text(json.dumps(cfgs["speech_tokenizer/config.json"]))
    ckpt = types.SimpleNamespace(
        path=tmp_path,
        config=types.SimpleNamespace(model_type="base", speaker_encoder=spk_cfg, raw=cfgs["config.json"]),
        weights={"speaker_encoder." + k: v.numpy() for k, v in se.state_dict().items()},
        codec_weights={k: v.numpy() for k, v in codec.state_dict().items()})
    wav = speech_like(15.0, seed=13)
    (xvec,) = _session(build_speaker_encoder(ckpt)).run(None, {"wav": wav[None]})
    (codes,) = _session(build_codec_encoder(ckpt)).run(None, {"wav": wav[None]})
    with torch.no_grad():
        mels = mel_spectrogram(torch.from_numpy(wav)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                               hop_size=256, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)
        ref_x = se(mels)[0].numpy()
        ref_codes = codec.encode(torch.from_numpy(wav)[None], torch.ones(1, len(wav), dtype=torch.long)).audio_codes[0]
    assert np.max(np.abs(xvec - ref_x)) <= XVEC_RTOL * max(1.0, float(np.max(np.abs(ref_x))))
    assert np.array_equal(codes, ref_codes.numpy())
