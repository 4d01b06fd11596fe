"""`python -m qwen3_tts_gguf serve` as an operator runs it: a subprocess on a free port, its log in a file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_gracefully(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if `proc` is still there after `timeout_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ServeProcess:
    """`serve *args` on 127.0.0.1 and a free port, stdout and stderr in `log_path`; a context manager
    that waits for `/ready` and kills the process if a test leaves it running."""

    def __init__(self, *args: str, log_path: Path, env: dict[str, str] | None = None,
                 command: tuple[str, ...] = (sys.executable, "-m", "qwen3_tts_gguf", "serve")):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/ws"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(self.port), *args],
            cwd=ROOT, env={**os.environ, **(env or {})}, stdout=self._log, stderr=subprocess.STDOUT)

    def __enter__(self) -> ServeProcess:
        wait_until(lambda: self.proc.poll() is not None or self.ready_status() == 200, "the server to be ready",
                   STARTUP_TIMEOUT_S)
        assert self.proc.poll() is None, self.log()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()

    def ready_status(self) -> int | None:
        """GET /ready's status, None when nothing answers."""
        try:
            return httpx.get(f"{self.url}/ready", timeout=5).status_code
        except httpx.TransportError:
            return None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float = 120.0) -> int:
        """The exit code (TimeoutExpired when it does not end within `timeout_s`)."""
        return self.proc.wait(timeout=timeout_s)

    def log(self) -> str:
        """What the server wrote so far."""
        return self.log_path.read_text()
