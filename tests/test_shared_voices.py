"""Voice profiles shared by replicas: two real server processes on one voices folder (as two
Kubernetes replicas on one ReadWriteMany volume). A voice created, replaced or deleted through one
is seen by the other on its next request; concurrent creates of one name through both let exactly
one win. Nothing is cached per process: profiles are read from disk on each request. Run twice: on
a file system with hard links (creates link their finished file to its name), and as one without
(os.link fails in both servers: the exclusive-create fallback, an O_EXCL lock file per name)."""

from __future__ import annotations

import concurrent.futures
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from tests.serve_process import free_port, stop_gracefully
from tests.test_cli_voices import speechlike

ROOT = Path(__file__).resolve().parent.parent
FRAMES = 6


def wav_bytes(seed: int, seconds: float = 2.0, rate: int = 24000) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, speechlike(seconds, rate, seed), rate, format="WAV")
    return buf.getvalue()


class Replica:
    """`python -m qwen3_tts_gguf serve` in a subprocess, its log in a file."""

    def __init__(self, name: str, port: int, models: list[Path], voices: Path, log_dir: Path,
                 extra_env: dict[str, str]):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        args = [sys.executable, "-m", "qwen3_tts_gguf", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--voices-dir", str(voices), "--threads", "1", "--max-streams", "2", "--deterministic"]
        for model in models:
            args += ["--model", str(model)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("QTTS_")}  # only the flags above
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=ROOT, env={**env, "HF_HUB_OFFLINE": "1", **extra_env}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self, deadline: float) -> None:
        while True:
            assert self.proc.poll() is None, f"{self.name} exited {self.proc.returncode}:\n{self.log_tail()}"
            try:
                if self.http.get("/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{self.name} did not become ready:\n{self.log_tail()}"
            time.sleep(0.1)

    def stop(self) -> None:
        self.http.close()
        stop_gracefully(self.proc, 90)

    # -- the API ----------------------------------------------------------------------------
    def create(self, name: str, seed: int, **fields) -> httpx.Response:
        return self.http.post("/v1/audio/voices", data={"name": name, "consent": "yes", **fields},
                              files={"audio_sample": ("clip.wav", wav_bytes(seed), "audio/wav")})

    def voices(self) -> dict[str, dict]:
        r = self.http.get("/v1/audio/voices")
        assert r.status_code == 200, r.text
        return {v["id"]: v for v in r.json()["voices"]}

    def speak(self, voice: str) -> httpx.Response:
        # tts-1 is the default (CustomVoice) model's alias, as in the Deployment: a profile speaks
        # with its own Base model
        return self.http.post("/v1/audio/speech", json={
            "model": "tts-1", "input": "Hello from the other replica.", "voice": voice, "response_format": "pcm",
            "max_frames": FRAMES, "seed": 3})


NO_LINKS = """\
import errno, os
def _no_link(*args, **kwargs):  # a file system without hard links (SMB shares, ...)
    with open(os.environ["SHARED_VOICES_LINK_CALLS"], "a") as f:
        f.write("link\\n")
    raise OSError(errno.EPERM, "hard links are not supported here")
os.link = _no_link
"""


@pytest.fixture(scope="module", params=["hard-links", "no-hard-links"])
def file_system(request, tmp_path_factory) -> dict:
    """The shared folder, and for the servers the environment that takes hard links away."""
    root = tmp_path_factory.mktemp(request.param)
    voices = root / "voices"
    voices.mkdir()
    if request.param == "hard-links":
        return {"voices": voices, "env": {}, "link_calls": None}
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(NO_LINKS)  # imported at interpreter start-up
    calls = root / "link-calls"
    path = os.pathsep.join(filter(None, [str(root / "site"), os.environ.get("PYTHONPATH")]))
    return {"voices": voices, "env": {"PYTHONPATH": path, "SHARED_VOICES_LINK_CALLS": str(calls)},
            "link_calls": calls}


@pytest.fixture(scope="module")
def voices_dir(file_system) -> Path:
    return file_system["voices"]


@pytest.fixture(scope="module")
def replicas(converted_factory, file_system, voices_dir, tmp_path_factory):
    models = [converted_factory("tiny_cv", "f32"), converted_factory("tiny_base", "f32")]
    logs = tmp_path_factory.mktemp("replica-logs")
    ports = [free_port()]
    while len(ports) < 2:
        ports += [port for port in [free_port()] if port not in ports]
    started = [Replica(name, port, models, voices_dir, logs, file_system["env"]) for name, port in zip("ab", ports)]
    try:
        deadline = time.monotonic() + 180
        for replica in started:
            replica.wait_ready(deadline)
        yield started
    finally:
        for replica in started:
            replica.stop()
    if file_system["link_calls"] is not None:  # the fallback ran, in the servers
        assert file_system["link_calls"].read_text().count("link") >= 2


def audio(response: httpx.Response) -> bytes:
    assert response.status_code == 200, response.text
    assert response.headers["x-qwen3tts-model"].startswith("tiny_base")
    assert len(response.content) == FRAMES * 1920 * 2
    return response.content


def test_a_voice_made_through_one_replica_speaks_on_the_other(replicas, voices_dir):
    a, b = replicas
    r = a.create("alice", seed=0, text="Exactly what alice says in the clip.")
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "icl"

    # the other replica lists it and speaks it on its next request, exactly as the one that made it
    listed = b.voices()["alice"]
    assert listed == a.voices()["alice"] and listed["mode"] == "icl"
    first = audio(b.speak("alice"))
    assert audio(a.speak("alice")) == first  # deterministic profile: same profile, same audio

    # replaced through b (a different clip, x-vector only): a speaks the new one
    r = b.create("alice", seed=1, overwrite="true")
    assert r.status_code == 200, r.text
    assert a.voices()["alice"]["mode"] == "xvector"
    replaced = audio(a.speak("alice"))
    assert replaced != first and audio(b.speak("alice")) == replaced

    # deleted through a: gone on b at once
    assert a.http.delete("/v1/audio/voices/alice").status_code == 200
    assert "alice" not in b.voices()
    r = b.speak("alice")
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice", r.text
    assert b.http.delete("/v1/audio/voices/alice").status_code == 404
    assert sorted(p.name for p in voices_dir.iterdir()) == []  # no temporary or lock file left


def test_concurrent_creates_of_one_name_through_both_replicas(replicas, voices_dir):
    a, b = replicas
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: ((a, b)[i % 2].name, (a, b)[i % 2].create("carol", seed=2 + i)),
                                range(4)))
    statuses = sorted(r.status_code for _, r in results)
    assert statuses == [200, 409, 409, 409], [(name, r.status_code, r.text) for name, r in results]
    winner = next(name for name, r in results if r.status_code == 200)
    # both replicas list the winner's voice (one file, written once, never half-written)
    assert a.voices()["carol"] == b.voices()["carol"]
    assert audio(a.speak("carol")) == audio(b.speak("carol"))
    assert (b if winner == "a" else a).http.delete("/v1/audio/voices/carol").status_code == 200
    assert sorted(p.name for p in voices_dir.iterdir()) == []
