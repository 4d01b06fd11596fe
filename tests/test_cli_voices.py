"""`voice create | design | list | delete` and speaking with a profile by name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from qwen3_tts_gguf.model.manifest import load_manifest
from qwen3_tts_gguf.voicebank.store import VoiceStore

from tests.conftest import ROOT


def _cli(*args, env=None, check=False):
    return subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, check=check, env={**os.environ, **(env or {})})


def speechlike(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """A voiced, amplitude-modulated harmonic signal (deterministic)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 3.1 * t)) ** 2
    return (0.2 * voiced * envelope + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


@pytest.fixture(scope="module")
def base_home(converted_factory, tmp_path_factory):
    """A model-base/ holding one converted Base model, and an empty voices/ folder."""
    home = tmp_path_factory.mktemp("home")
    shutil.copytree(converted_factory("tiny_base", "f32"), home / "models" / "tiny-base")
    (home / "voices").mkdir()
    stereo = np.stack([speechlike(2.5, 22050), speechlike(2.5, 22050, seed=1)], axis=1)
    sf.write(home / "clip.wav", stereo, 22050)
    return home


def env_for(home):
    return {"QTTS_MODEL_BASE": str(home / "models"), "QTTS_VOICES_DIR": str(home / "voices")}


def test_create_list_speak_delete(base_home, tmp_path):
    env = env_for(base_home)
    r = _cli("voice", "create", "alice", "--audio", base_home / "clip.wav", "--text", "Exactly what alice says.",
             env=env)
    assert r.returncode == 0, r.stderr
    profile = VoiceStore(base_home / "voices").get("alice")
    model_name = load_manifest(base_home / "models" / "tiny-base").name
    assert profile.mode == "icl" and profile.model == model_name and profile.ref_codes.shape[1] == 16
    r = _cli("voice", "create", "bob", "--audio", base_home / "clip.wav", env=env)  # no transcript: x-vector only
    assert r.returncode == 0 and VoiceStore(base_home / "voices").get("bob").mode == "xvector"
    listing = _cli("voice", "list", env=env).stdout
    assert f"alice\ticl clone\t{model_name}" in listing and "bob\txvector clone" in listing
    for name in ("alice", "bob"):  # the profile names its model: no --model needed
        r = _cli("synth", "Hi, I'm speaking.", "--voice", name, "--max-frames", "5", "--ignore-eos", "--seed", "1",
                 "-o", tmp_path / f"{name}.wav", env=env)
        assert r.returncode == 0, r.stderr
        assert len(sf.read(tmp_path / f"{name}.wav")[0]) == 5 * 1920
    r = _cli("voice", "create", "alice", "--audio", base_home / "clip.wav", env=env)
    assert r.returncode == 2 and "exists already" in r.stderr
    assert _cli("voice", "delete", "alice", env=env).returncode == 0
    assert _cli("voice", "delete", "bob", env=env).returncode == 0
    assert VoiceStore(base_home / "voices").list() == []


def test_bad_references_and_names(base_home, tmp_path):
    env = env_for(base_home)
    (tmp_path / "notes.wav").write_text("this is not audio")
    sf.write(tmp_path / "short.wav", speechlike(0.2, 24000), 24000)
    sf.write(tmp_path / "silent.wav", np.zeros(48000, np.float32), 24000)
    cases = [
        (("voice", "create", "x1", "--audio", tmp_path / "notes.wav"), "audio"),
        (("voice", "create", "x2", "--audio", tmp_path / "short.wav"), "short"),
        (("voice", "create", "x3", "--audio", tmp_path / "silent.wav"), "silent"),
        (("voice", "create", "../evil", "--audio", base_home / "clip.wav"), "invalid voice name"),
        (("voice", "delete", "nobody"), "nobody"),
    ]
    for args, message in cases:
        r = _cli(*args, env=env)
        assert r.returncode == 2 and message in r.stderr.lower() + r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert VoiceStore(base_home / "voices").list() == []


def test_design_then_clone(base_home, converted_factory):
    env = env_for(base_home)
    r = _cli("voice", "design", "narrator", "--instructions", "A calm, low elderly voice.",
             "--design-model", converted_factory("tiny_vd", "f32"), "--max-frames", "20", "--language", "english",
             env=env)
    assert r.returncode == 0, r.stderr
    profile = VoiceStore(base_home / "voices").get("narrator")
    assert profile.mode == "icl" and "weather" in profile.ref_text
    assert _cli("voice", "delete", "narrator", env=env).returncode == 0


def test_a_voices_folder_that_is_a_file_is_refused(tmp_path):
    blocker = tmp_path / "voices"
    blocker.write_text("not a folder")
    for args in (["list"], ["delete", "v1"]):
        r = _cli("voice", *args, "--voices-dir", blocker)
        assert r.returncode == 2 and f"--voices-dir: {blocker} is not a folder" in r.stderr, (args, r.stderr)
