"""Time to first audio through the HTTP server (`python -m qwen3_tts_gguf serve`).

Starts the server on a free local port with one model (its warm-up speaking the bench's voice and
language), waits until `GET /ready` answers 200, then POSTs OpenAI-style `/v1/audio/speech` requests with
`response_format: "pcm"` and measures request sent -> first PCM byte received, and the whole response. Only runs
when `api.server` is importable (the orchestrator checks).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

from bench.common import LANGUAGE, ROOT, SAMPLE_RATE, SPEAKER, TEXT, TEXT_MODE, Meter, http_get, median, wait_for_quiet


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def _speech(port: int, body: dict) -> tuple[float | None, float, int]:
    """POST /v1/audio/speech; (first body byte s, whole response s, bytes) from the moment the request is sent."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        payload = json.dumps(body).encode()
        start = time.perf_counter()
        conn.request("POST", "/v1/audio/speech", body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"/v1/audio/speech answered {resp.status}: {resp.read()[:300]!r}")
        first, nbytes = None, 0
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            if first is None:
                first = time.perf_counter() - start
            nbytes += len(chunk)
        return first, time.perf_counter() - start, nbytes
    finally:
        conn.close()


def run(model_dir: str, threads: int, frames: int, reps: int, quiet_s: float = 0.0, progress=None) -> dict:
    port = _free_port()
    cmd = [sys.executable, "-m", "qwen3_tts_gguf", "serve", "--model", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--threads", str(threads), "--warm-up-voices", f"{SPEAKER}:{LANGUAGE}"]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        if progress:
            progress("http: starting the server")
        t0 = time.perf_counter()
        model_id = None
        while time.perf_counter() - t0 < 180:
            if server.poll() is not None:
                raise RuntimeError(f"server exited with {server.returncode}: "
                                   f"{server.stderr.read().decode(errors='replace')[-800:]}")
            try:
                if http_get(port, "/ready")[0] == 200:
                    status, data = http_get(port, "/v1/models")
                    if status == 200:
                        model_id = json.loads(data)["data"][0]["id"]
                        break
            except OSError:
                pass
            time.sleep(0.5)
        if model_id is None:
            raise RuntimeError("the server was not ready within 180 s")
        startup_s = time.perf_counter() - t0
        body = {"model": model_id, "input": TEXT, "voice": SPEAKER, "response_format": "pcm",
                "language": LANGUAGE, "text_mode": TEXT_MODE, "seed": 1, "max_frames": frames}
        runs, first_request = [], None
        for r in range(reps + 1):  # the first, kept apart: what a client meets right after the start
            if progress:
                progress(f"http request {r}/{reps}" if r else "http warm-up")
            quiet = wait_for_quiet(quiet_s, pids=(server.pid,)) if r and quiet_s else {}
            with Meter(pids=(server.pid,)) as m:
                first, total, nbytes = _speech(port, body)
            if not r:
                first_request = {"first_audio_s": first, "total_s": total, "background": m.background}
            else:
                audio_s = nbytes / 2 / SAMPLE_RATE
                runs.append({"first_audio_s": first, "total_s": total, "audio_s": audio_s,
                             "rtf": total / audio_s if audio_s else None, "background": m.background, **quiet})
        return {"startup_s": startup_s, "runs": runs, "first_request": first_request,
                "first_audio_s_median": median([r["first_audio_s"] for r in runs]),
                "threads": threads, "frames": frames, "model_id": model_id}
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)  # the server we started (its own process group)
            server.wait(timeout=20)
        except Exception:
            server.kill()
