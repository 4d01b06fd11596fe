"""`synth` on the command line: files of every format, stdout, codes, Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf

from tests.conftest import ROOT

BASE = ["--seed", "5", "--ignore-eos"]


def _synth(model, *args, **kw):
    return subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", "synth", "Hello there.", "--model", str(model),
                           *map(str, args)], cwd=ROOT, capture_output=True, **kw)


def test_stdout_codes_and_wav_agree(tiny_cv_f32, tmp_path):
    raw = _synth(tiny_cv_f32, *BASE, "--max-frames", 5, "-o", "-", "--codes-out", tmp_path / "c.npy", check=True)
    pcm = np.frombuffer(raw.stdout, dtype="<i2")
    assert len(pcm) == 5 * 1920
    assert np.load(tmp_path / "c.npy").shape == (5, 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy"]  # written through a temporary file, renamed
    _synth(tiny_cv_f32, *BASE, "--max-frames", 5, "-o", tmp_path / "a.wav", check=True)
    wav, rate = sf.read(tmp_path / "a.wav", dtype="int16")
    assert rate == 24000
    np.testing.assert_array_equal(wav, pcm)  # same seed, same samples, one s16 rule


@pytest.mark.parametrize("ext", ["flac", "mp3", "opus"])
def test_formats_from_extension(tiny_cv_f32, tmp_path, ext):
    _synth(tiny_cv_f32, *BASE, "--max-frames", 8, "-o", tmp_path / f"a.{ext}", check=True)
    import av

    with av.open(str(tmp_path / f"a.{ext}")) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
        rate = container.streams.audio[0].rate
    assert abs(samples / rate - 8 * 0.08) < 0.1


def test_bad_input_errors(tiny_cv_f32):
    r = _synth(tiny_cv_f32, "--voice", "nobody", text=True)
    assert r.returncode == 2 and "unknown speaker 'nobody'; valid: vivian" in r.stderr
    r = _synth(tiny_cv_f32, "--language", "elvish", text=True)
    assert r.returncode == 2 and "unknown language 'elvish'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", "synth", "   ", "--model", str(tiny_cv_f32)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "empty" in r.stderr and "Traceback" not in r.stderr


def test_places_it_cannot_write_are_one_line_errors(tiny_cv_f32, tmp_path):
    r = _synth(tiny_cv_f32, *BASE, "--max-frames", 3, "-o", tmp_path / "missing" / "a.wav", text=True)
    assert r.returncode == 2 and f"{tmp_path / 'missing' / 'a.wav'}: No such file or directory" in r.stderr
    assert "Traceback" not in r.stderr
    r = _synth(tiny_cv_f32, *BASE, "--max-frames", 3, "-o", tmp_path / "a.wav", "--codes-out",
               tmp_path / "missing" / "c.npy", text=True)
    assert r.returncode == 2 and "--codes-out" in r.stderr and "no such folder" in r.stderr
    assert not (tmp_path / "a.wav").exists()  # refused before any synthesis
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_leaves_a_valid_wav(tiny_cv_f32, tmp_path):
    out = tmp_path / "long.wav"
    # long enough that the runaway budget (frames per text token) cannot end it before the signal: the
    # tiny model makes a short sentence's ~130 frames in about a second (12 repeats, ~1500 frames, once
    # ended before the first poll saw its file)
    text = "A long utterance that goes on and on, " * 48
    proc = subprocess.Popen([sys.executable, "-m", "qwen3_tts_gguf", "synth", text, "--model",
                             str(tiny_cv_f32), *BASE, "--max-frames", "100000", "-o", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:  # wait until audio is being written
        parts = list(tmp_path.glob(".long.wav*"))
        if parts and parts[0].stat().st_size > 44 + 8 * 1920 * 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    audio, rate = sf.read(out, dtype="int16")
    assert rate == 24000 and len(audio) >= 8 * 1920 and len(audio) % 1920 == 0
    assert not list(tmp_path.glob(".long.wav*"))
