"""`python -m qwen3_tts_gguf serve` as a user runs it: a subprocess, its flags, its exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import openai

from tests.serve_process import free_port

ROOT = Path(__file__).resolve().parent.parent


def serve(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "qwen3_tts_gguf", "serve", *args], cwd=ROOT,
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_serve_without_a_model_says_how_to_get_one(tmp_path):
    proc = serve(env={"QTTS_MODEL_BASE": str(tmp_path / "models"), "HF_HUB_OFFLINE": "1",
                      "HF_HOME": str(tmp_path / "hf")})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "downloading Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice" in err  # the first-start auto-pull was tried
    assert "python -m qwen3_tts_gguf pull Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice" in err
    assert "make-random" in err and "convert" in err


def test_serve_refuses_a_voices_folder_that_is_a_file_before_loading_anything(tmp_path):
    """(Every request naming a voice was a 500 on such a server: the profile lookup read `<file>/<voice>.json`.)"""
    blocker = tmp_path / "voices"
    blocker.write_text("not a folder")
    proc = serve("--model", str(tmp_path / "no-model"), "--voices-dir", str(blocker), env={})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and f"error: --voices-dir: {blocker} is not a folder" in err, err


def test_serve_honours_its_flags_and_stops_cleanly(tiny_cv_f32):
    port = free_port()
    proc = serve("--model", str(tiny_cv_f32), "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
                 "--max-streams", "2", "--max-queue", "3", env={"QTTS_API_KEY": "from-env"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)
        assert httpx.get(f"{base}/ready").json()["models"][0]["free_slots"] == 2
        assert httpx.get(f"{base}/v1/models").status_code == 401
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="from-env", max_retries=0)
        audio = client.audio.speech.create(model="tts-1", input="Hello.", voice="alloy", response_format="pcm",
                                           extra_body={"max_frames": 3, "seed": 1})
        assert len(audio.content) == 3 * 1920 * 2
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # SIGINT drains, then exits 0 (api/ops/lifecycle.py)
    assert "Application shutdown complete" in err
    assert f"base_url: http://127.0.0.1:{port}/v1 (API key required)" in err
