"""`pull` (the model-pull Job's command, and a first `serve` without a model) against a local Hugging
Face-compatible endpoint (issue 49): `HF_ENDPOINT` points huggingface_hub at a small HTTP server in this
test that serves a random checkpoint in the published repository's layout, as the Hub does (the model
API's file list, `resolve/` with `X-Repo-Commit`, `ETag` = the content hash: sha256 for the LFS file
`model.safetensors`, the git blob sha1 for the others, `Range` requests). The server can stall a file
midway (a lost network; the pull is then killed, as a Job's pod would be) or serve it corrupted.

What must hold: the download shows its progress; a second run resumes the interrupted file from where
the first stopped (a `Range` request, not the whole file again) and converts a model identical to one
converted from the checkpoint itself; a corrupted file is caught before conversion and removed from the
cache; the output folder never holds a half model (conversion writes aside and renames).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from qwen3_tts_gguf.convert.download import DownloadError, verify_snapshot

from tests.replica_cluster import httpx
from tests.serve_process import ServeProcess, free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
REPO = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
COMMIT = "5eb4a1c0ffee" * 3 + "5eb4"
MODEL_FILE = "model.safetensors"
STALL_AT = 25 * 1024 * 1024
"""Bytes of model.safetensors (43 MB) sent before the stall: huggingface_hub writes 10 MiB pieces, so
20 MiB are on disk when the pull is killed."""


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's own hash


class Hub(http.server.ThreadingHTTPServer):
    """The Hub's download API for one repository, on 127.0.0.1."""

    daemon_threads = True

    def __init__(self, checkpoint: Path):
        super().__init__(("127.0.0.1", free_port()), HubHandler)
        self.files = {p.relative_to(checkpoint).as_posix(): p.read_bytes()
                      for p in sorted(checkpoint.rglob("*")) if p.is_file()}
        self.files["README.md"] = b"---\nlicense: apache-2.0\n---\n# a random checkpoint\n"  # not pulled (ALLOW)
        self.etags = {name: hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_sha1(data)
                      for name, data in self.files.items()}
        self.requests: list[tuple[str, str, str | None]] = []
        """(method, file or API path, Range header)"""
        self.sent: dict[str, int] = {}
        """Body bytes sent per file."""
        self.stall: dict[str, int] = {}
        """file -> after how many bytes of the file its GET stops sending (until `release`)."""
        self.release = threading.Event()
        self.corrupt: set[str] = set()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def served(self, method: str = "GET") -> list[tuple[str, str | None]]:
        return [(name, rng) for m, name, rng in self.requests if m == method and not name.startswith("/api/")]


def sibling(hub: Hub, name: str) -> dict:
    """A file of the model API's `siblings` (with the sizes `?blobs=true` adds)."""
    data, etag = hub.files[name], hub.etags[name]
    entry = {"rfilename": name, "size": len(data), "blobId": git_blob_sha1(data)}
    if name.endswith(".safetensors"):
        entry["lfs"] = {"sha256": etag, "size": len(data), "pointerSize": 134}
    return entry


class HubHandler(http.server.BaseHTTPRequestHandler):
    server: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _file(self) -> str | None:
        prefix = f"/{REPO}/resolve/"
        if not self.path.startswith(prefix):
            return None
        revision, _, name = self.path[len(prefix):].split("?")[0].partition("/")
        return name if revision in ("main", COMMIT) and name in self.server.files else None

    def _headers(self, name: str) -> None:
        data, etag = self.server.files[name], self.server.etags[name]
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Accept-Ranges", "bytes")
        if name.endswith(".safetensors"):  # LFS: the Hub names the linked file's hash and size
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(len(data)))

    def do_HEAD(self) -> None:
        name = self._file()
        self.server.requests.append(("HEAD", name or self.path, None))
        if name is None:
            self.send_error(404)
            return
        self.send_response(200)
        self._headers(name)
        self.send_header("Content-Length", str(len(self.server.files[name])))
        self.end_headers()

    def do_GET(self) -> None:
        hub = self.server
        if self.path.split("?")[0] in (f"/api/models/{REPO}", f"/api/models/{REPO}/revision/main",
                                       f"/api/models/{REPO}/revision/{COMMIT}"):
            hub.requests.append(("GET", "/api/models", None))
            body = json.dumps({"_id": "0" * 24, "id": REPO, "modelId": REPO, "sha": COMMIT, "private": False,
                               "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                               "lastModified": "2026-01-22T00:00:00.000Z",
                               "siblings": [sibling(hub, name) for name in hub.files]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        name = self._file()
        rng = self.headers.get("Range")
        hub.requests.append(("GET", name or self.path, rng))
        if name is None:
            self.send_error(404)
            return
        data = hub.files[name]
        if name in hub.corrupt:  # same size, one byte changed in the middle: a disk or a proxy that lied
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
        start = 0
        if rng and (m := re.fullmatch(r"bytes=(\d+)-", rng.strip())):
            start = int(m.group(1))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self._headers(name)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        stop = hub.stall.get(name, len(data))
        position = start
        while position < len(data):
            if position >= stop:  # a lost network: nothing more comes (the client is killed meanwhile)
                hub.release.wait(120)
                self.close_connection = True
                return
            piece = data[position:min(position + 256 * 1024, len(data), max(stop, position + 1))]
            self.wfile.write(piece)
            position += len(piece)
            hub.sent[name] = hub.sent.get(name, 0) + len(piece)


@pytest.fixture
def hub(tiny_cv):
    server = Hub(tiny_cv)
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def pull_env(hub: Hub, hf_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "QTTS_"))}
    return {**env, "HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "0"}


PULL = [sys.executable, "-m", "qwen3_tts_gguf", "pull", REPO, "--quant", "f32"]


def blobs(hf_home: Path) -> Path:
    return hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs"


def model_folders(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


def test_pull_shows_progress_resumes_an_interrupted_download_and_installs_a_whole_model(hub, tiny_cv, tmp_path):
    out, hf_home = tmp_path / "model-base", tmp_path / "hf"
    name = f"{REPO.split('/')[-1]}-f32"
    hub.stall[MODEL_FILE] = STALL_AT
    log = tmp_path / "first.err"
    with open(log, "wb") as err:
        first = subprocess.Popen([*PULL, "--output", str(out)], cwd=ROOT, env=pull_env(hub, hf_home),
                                 stdout=subprocess.DEVNULL, stderr=err)
        try:
            def partial() -> int:
                return sum(p.stat().st_size for p in blobs(hf_home).glob("*.incomplete")) \
                    if blobs(hf_home).exists() else 0
            def said() -> bool:  # the stall is on: the progress line for the bytes on disk comes within a second
                on_disk = sum(p.stat().st_size for p in blobs(hf_home).iterdir())
                return f"downloading {REPO}: {on_disk / 1e6:.1f} MB of" in log.read_text(errors="replace")

            wait_until(lambda: first.poll() is not None or (partial() >= 20 * 1024 * 1024 and said()),
                       "a partial download", 120)
            assert first.poll() is None, log.read_text()
            assert model_folders(out) == []  # nothing in the output while downloading
            first.send_signal(signal.SIGKILL)  # the Job's pod goes (node drained, OOM, deadline)
            first.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
    hub.release.set()
    resumed_from = partial()
    assert resumed_from >= 20 * 1024 * 1024
    # no terminal (a Job's log): lines of bytes on disk against the total of the files pulled
    progress = log.read_text(errors="replace")
    total = sum(len(data) for name, data in hub.files.items() if name != "README.md") / 1e6
    lines = re.findall(rf"downloading {REPO}: ([\d.]+) MB of {total:.1f} MB \((\d+) %\)", progress)
    assert lines and 0 < float(lines[-1][0]) < total, progress[-2000:]
    assert model_folders(out) == []

    hub.stall.clear()
    hub.requests.clear()
    sent_before = hub.sent.get(MODEL_FILE, 0)
    second = subprocess.run([*PULL, "--output", str(out)], cwd=ROOT, env=pull_env(hub, hf_home),
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"ready: {out / name}" in second.stdout
    assert f"downloading {REPO}: {total:.1f} MB of {total:.1f} MB (100 %)" in second.stderr, second.stderr[-2000:]
    # resumed: one Range request from the bytes on disk, and only the rest of the file sent
    gets = [rng for file, rng in hub.served() if file == MODEL_FILE]
    assert gets == [f"bytes={resumed_from}-"], gets
    size = len(hub.files[MODEL_FILE])
    assert hub.sent[MODEL_FILE] - sent_before == size - resumed_from
    assert "README.md" not in {file for file, _ in hub.served()}  # only what conversion needs
    # whole: the model is the one converted from the checkpoint itself, file for file
    assert model_folders(out) == [name]  # no side folder left
    direct = tmp_path / "direct"
    done = subprocess.run([*PULL, "--from-dir", str(tiny_cv), "--output", str(direct)], cwd=ROOT,
                          env=pull_env(hub, tmp_path / "unused"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    files = json.loads((out / name / "manifest.json").read_text())["files"]
    assert files == json.loads((direct / name / "manifest.json").read_text())["files"]


def test_a_corrupted_file_is_caught_before_conversion_and_downloaded_again_by_the_next_run(hub, tmp_path):
    out, hf_home = tmp_path / "model-base", tmp_path / "hf"
    hub.corrupt.add(MODEL_FILE)
    bad = subprocess.run([*PULL, "--output", str(out)], cwd=ROOT, env=pull_env(hub, hf_home), capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode != 0
    assert f"download of {REPO} is corrupted: {MODEL_FILE} has sha256" in bad.stderr, bad.stderr[-3000:]
    assert hub.etags[MODEL_FILE] in bad.stderr and "run pull again" in bad.stderr
    assert "convert " not in bad.stderr  # caught before conversion began
    assert model_folders(out) == []  # no model, no half model
    assert hub.etags[MODEL_FILE] not in {p.name for p in blobs(hf_home).iterdir()}  # removed from the cache

    hub.corrupt.clear()
    hub.requests.clear()
    good = subprocess.run([*PULL, "--output", str(out)], cwd=ROOT, env=pull_env(hub, hf_home), capture_output=True,
                          text=True, timeout=300)
    assert good.returncode == 0, good.stderr[-3000:]
    assert [file for file, _ in hub.served()] == [MODEL_FILE]  # only the bad file again; the rest was cached
    assert model_folders(out) == [f"{REPO.split('/')[-1]}-f32"]


def test_a_small_file_whose_git_hash_differs_is_caught_too(tmp_path):
    """Files outside LFS are named by their git blob sha1 in the cache; one changed on disk afterwards
    (or served wrong) fails the check the same way, and the file is removed."""
    blob_dir, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / COMMIT
    blob_dir.mkdir()
    snapshot.mkdir(parents=True)
    for name, data in (("config.json", b'{"a": 1}\n'), ("vocab.json", b'{"b": 2}\n')):
        blob = blob_dir / git_blob_sha1(data)
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    verify_snapshot(snapshot, REPO)  # intact: nothing said
    changed = blob_dir / git_blob_sha1(b'{"b": 2}\n')
    changed.write_bytes(b'{"b": 3}\n')
    with pytest.raises(DownloadError, match="vocab.json has git sha1"):
        verify_snapshot(snapshot, REPO)
    assert not changed.exists() and not (snapshot / "vocab.json").is_symlink()
    verify_snapshot(snapshot, REPO)  # what is left is intact


def test_a_first_serve_without_a_model_pulls_the_default_one_from_the_endpoint_and_serves_it(hub, tmp_path):
    """A user's first `scripts/serve.sh` (the README's command; its set-up finds `.venv` current, as the test
    set-up made it): with an empty models folder it downloads the default model (here the random checkpoint
    under its name), converts it and serves it."""
    base = tmp_path / "model-base"
    env = {**pull_env(hub, tmp_path / "hf"), "QTTS_MODEL_BASE": str(base)}
    started = time.monotonic()
    with ServeProcess("--threads", "1", "--warm-up-voices", "none", "--voices-dir", str(tmp_path / "voices"),
                      log_path=tmp_path / "serve.log", env=env,
                      command=(str(ROOT / "scripts" / "serve.sh"),)) as server:
        ready_s = time.monotonic() - started
        models = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models if "0.6B" in m["id"]], models
        speech = httpx.post(f"{server.url}/v1/audio/speech", timeout=60, json={
            "model": "tts-1", "input": "Hello.", "voice": "ryan", "response_format": "pcm", "max_frames": 4})
        assert speech.status_code == 200 and len(speech.content) == 4 * 1920 * 2, speech.text
    log = server.log()
    assert f"downloading {REPO}" in log
    assert sorted(p.name for p in base.iterdir() if not p.name.startswith(".")) == [
        f"{REPO.split('/')[-1]}-q8_0"], log[-2000:]
    print(f"\nfirst serve: pulled, converted and ready in {ready_s:.1f} s")
