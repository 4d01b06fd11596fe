"""Several `serve` processes behind a real HAProxy on this machine (issue 49): the replicated topology of
docs/deploy.md, *Many machines*, with loopback addresses only. `tests/test_replicas.py` runs it.

- `Replica`: `python -m qwen3_tts_gguf serve` on a fixed port (so that HAProxy's configuration can name it
  before it runs, and a restart comes back on the same address), `--replica-id` its name, one shared
  voices folder, a usage log and a JSON log of its own; started, drained, killed and started again.
- `Balancer`: HAProxy (Debian's package) from `haproxy_config`, run in the foreground; its runtime API
  (a UNIX socket) says each server's state and takes it out of and back into rotation.
- `Load`: a bounded load from published clients (openai's HTTP streams, `websockets` on `/v1/ws`,
  wyoming's TCP client), each worker from its own loopback address, that stops by itself; every
  outcome says which replica served it (HAProxy's `X-Served-By`) and whether its audio is whole.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.serve_process import free_port, stop_gracefully
from tests.waiting import wait_until

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

ROOT = Path(__file__).resolve().parent.parent
KEY = "replicas-test-key"
TIMEOUT_S = 30.0
"""Every client read is bounded by this: a stream cut by a fault must end well before it."""

CHECK_INTER_MS = 300
CHECK_FALL = 2
CHECK_RISE = 2


def free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        ports += [port for port in [free_port()] if port not in ports]
    return ports


@dataclass(frozen=True)
class Server:
    """A replica as the balancer names it: its name (= its --replica-id), address, HTTP and Wyoming ports."""

    name: str
    address: str
    port: int
    wyoming_port: int


def haproxy_config(*, port: int, wyoming_port: int, stats_socket: Path | str, servers: Iterable[Server],
                   address: str = "127.0.0.1") -> str:
    """The balancer as docs/deploy.md prescribes it (and shows it: `test_the_docs_show_the_tested_config`):
    health check on /ready (a drain takes a replica out within CHECK_FALL checks, and its streams in flight
    go on: no `on-marked-down shutdown-sessions`), long-lived sockets (`timeout tunnel`), the client's address
    in X-Forwarded-For, a retry elsewhere of a request a replica refused before answering (connection
    refused, or 503 from a drain the checks have not seen yet), and a resume routed on `?replica=` (the part
    of its token before the dot)."""
    servers = list(servers)
    checks = f"check inter {CHECK_INTER_MS}ms fall {CHECK_FALL} rise {CHECK_RISE}"
    pins = "\n".join(f"    use-server {s.name} if {{ urlp(replica) -m str {s.name} }}" for s in servers)
    http_servers = "\n".join(f"    server {s.name} {s.address}:{s.port}" for s in servers)
    wyoming_servers = "\n".join(f"    server {s.name} {s.address}:{s.wyoming_port} port {s.port}" for s in servers)
    return f"""\
global
    maxconn 2000
    # the runtime API: `set server replicas/r1 state drain` takes a replica out before it stops
    stats socket {stats_socket} mode 600 level admin
    hard-stop-after 5s

defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
    timeout http-request 10s
    timeout http-keep-alive 10s
    # WebSockets (/v1/ws) and Wyoming sit idle between utterances: an hour, not the 10 s above
    timeout tunnel 1h
    timeout client-fin 5s
    timeout check 2s
    # a request a replica refused before answering goes to another one (below: retry-on)
    retries 2
    option redispatch 1

frontend tts
    bind {address}:{port}
    # the client's address for the per-client limits: the replicas trust it from here (QTTS_TRUSTED_PROXIES)
    option forwardfor
    default_backend replicas

backend replicas
    # streams last seconds to minutes: the replica with the fewest connections takes the next one
    balance leastconn
    # /ready: 503 while a replica drains or restarts an engine; a replica marked down keeps its
    # streams in flight (no on-marked-down shutdown-sessions), it only gets no new ones
    option httpchk GET /ready
    http-check expect status 200
    default-server {checks}
    # refused before any answer (not listening yet, gone, or draining before the checks saw it)
    retry-on conn-failure empty-response 503
    # which replica served a request (the tests read it)
    http-response set-header X-Served-By %s
    # a resume opened as /v1/ws?replica=NAME (its token's prefix) goes to that replica while it is up
{pins}
{http_servers}

frontend wyoming
    mode tcp
    bind {address}:{wyoming_port}
    timeout client 1h
    default_backend wyoming

backend wyoming
    mode tcp
    balance leastconn
    timeout server 1h
    # Wyoming has no health route of its own: check the replica's HTTP port
    option httpchk GET /ready
    http-check expect status 200
    default-server {checks}
{wyoming_servers}
"""


class Replica:
    """One `serve` process on fixed ports, restartable; its usage log and voices folder outlive it."""

    def __init__(self, name: str, models: list[Path], voices: Path, root: Path, *extra: str):
        self.name = name
        self.port, self.wyoming_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.port}"
        self.models, self.voices, self.root, self.extra = models, voices, root, extra
        self.usage_log = root / f"usage-{name}.jsonl"
        self.proc: subprocess.Popen | None = None
        self.generation = 0
        self.log_path = root / f"{name}-0.log"
        self.server = Server(name, "127.0.0.1", self.port, self.wyoming_port)

    # -- the process --------------------------------------------------------------------------
    def start(self) -> Replica:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        self.generation += 1
        self.log_path = self.root / f"{self.name}-{self.generation}.log"
        args = [sys.executable, "-m", "qwen3_tts_gguf", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--wyoming-port", str(self.wyoming_port), "--voices-dir", str(self.voices),
                "--threads", "1", "--deterministic", "--max-streams", "4", "--max-buffered-audio-s", "1",
                "--warm-up-voices", "none", "--drain-timeout-s", "30", "--usage-log", str(self.usage_log),
                "--log-format", "json", *self.extra]
        for model in self.models:
            args += ["--model", str(model)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("QTTS_")}
        env.update(HF_HUB_OFFLINE="1", QTTS_API_KEY=KEY, QTTS_REPLICA_ID=self.name, QTTS_TRUSTED_PROXIES="127.0.0.1")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready_status(self) -> int | None:
        try:
            return httpx.get(f"{self.url}/ready", timeout=2).status_code
        except httpx.TransportError:
            return None

    def wait_ready(self, timeout_s: float = 120.0) -> float:
        """Waits for /ready 200; the moment it was first seen (time.monotonic())."""
        wait_until(lambda: not self.running or self.ready_status() == 200, f"{self.name} to be ready", timeout_s)
        assert self.running, f"{self.name} exited:\n{self.log_tail()}"
        return time.monotonic()

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        """At the end: SIGTERM (a drain), then SIGKILL if it is still there after 40 s."""
        if self.running:
            self.terminate()
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    # -- what it says ---------------------------------------------------------------------------
    def metrics(self) -> str:
        r = httpx.get(f"{self.url}/metrics", timeout=5)
        assert r.status_code == 200, r.text
        return r.text

    def usage_lines(self) -> list[dict]:
        if not self.usage_log.exists():
            return []
        text = self.usage_log.read_text()
        assert text == "" or text.endswith("\n"), f"{self.usage_log}: a cut line"
        return [json.loads(line) for line in text.splitlines()]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith((name + " ", name + "{")):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def scaling_signal(replicas: Iterable[Replica]) -> float:
    """The KEDA trigger's query (deploy/kubernetes/base/autoscaler.yaml) computed from each replica's
    /metrics: sum(qtts_active_streams) + sum(qtts_queue_depth) over the running replicas."""
    total = 0.0
    for replica in replicas:
        if replica.running:
            try:
                text = replica.metrics()
            except (httpx.TransportError, AssertionError):  # between a drain and its exit
                continue
            total += metric_sum(text, "qtts_active_streams") + metric_sum(text, "qtts_queue_depth")
    return total


class Balancer:
    """HAProxy in the foreground on `config`; its runtime API on a UNIX socket."""

    def __init__(self, config: str, folder: Path, stats_socket: Path):
        self.config_path = folder / "haproxy.cfg"
        self.config_path.write_text(config)
        self.stats_socket = stats_socket
        self.log_path = folder / "haproxy.log"
        checked = subprocess.run(["haproxy", "-c", "-f", str(self.config_path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.config_path)], stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: self.proc.poll() is not None or stats_socket.exists(), "HAProxy's stats socket", 20)
        assert self.proc.poll() is None, self.log_path.read_text()

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.stats_socket))
            s.sendall(line.encode() + b"\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        return out.decode()

    def stats(self) -> dict[tuple[str, str], dict[str, str]]:
        """`show stat`: (proxy, server) -> its CSV row."""
        text = self.command("show stat").lstrip("# ")
        return {(row["pxname"], row["svname"]): row for row in csv.DictReader(io.StringIO(text))}

    def status(self, server: str, backend: str = "replicas") -> str:
        """UP, DOWN, DRAIN, MAINT, ... (`UP 1/2` while rising reads as its first word)."""
        return self.stats()[(backend, server)]["status"].split()[0]

    def wait_status(self, server: str, wanted: str, timeout_s: float = 20.0,
                    backends: tuple[str, ...] = ("replicas", "wyoming")) -> float:
        wait_until(lambda: all(self.status(server, b) == wanted for b in backends),
                   f"HAProxy to see {server} {wanted}", timeout_s)
        return time.monotonic()

    def set_state(self, server: str, state: str) -> None:
        """`ready`, `drain` (no new connections: the operator takes it out) or `maint`, in both backends."""
        for backend in ("replicas", "wyoming"):
            out = self.command(f"set server {backend}/{server} state {state}")
            assert out.strip() == "", out

    def stop(self) -> None:
        stop_gracefully(self.proc, 10)
        self._log.close()


# -- the load --------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One request as its client saw it."""

    kind: str
    """openai, ws, wyoming, or a test's own name."""
    started: float
    ended: float = 0.0
    ok: bool = False
    """Whole: the client counts it as succeeded (its audio is the reference's, byte for byte)."""
    replica: str | None = None
    """X-Served-By (HTTP and /v1/ws); None for Wyoming (a TCP proxy adds no header)."""
    request_id: str | None = None
    audio: int = 0
    error: str | None = None

    def judge(self, audio: bytes, reference: bytes | None) -> None:
        """Whole when `audio` is `reference`, byte for byte (no reference: not whole)."""
        self.audio = len(audio)
        self.ok = reference is not None and audio == reference
        if not self.ok:
            self.error = f"audio differs from the reference ({len(audio)} bytes)"


@contextmanager
def attempt(kind: str) -> Iterator[Outcome]:
    """One request as an Outcome: any exception its client raises is its error (every failure is an outcome),
    and its end is stamped whatever happened."""
    outcome = Outcome(kind, time.monotonic())
    try:
        yield outcome
    except Exception as e:  # noqa: BLE001
        outcome.error = repr(e)
    outcome.ended = time.monotonic()


@dataclass
class Load:
    """Workers that each send one kind of request again and again through the balancer until `stop`, or
    until `max_s` (the load stops by itself). `speak[kind](worker) -> Outcome`."""

    speak: dict[str, Callable[[int], Outcome]]
    workers: dict[str, int]
    max_s: float = 120.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, args=(kind, i), daemon=True)
                         for kind, n in self.workers.items() for i in range(n)]

    def __enter__(self) -> Load:
        self.deadline = time.monotonic() + self.max_s
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _work(self, kind: str, worker: int) -> None:
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            outcome = self.speak[kind](worker)
            with self._lock:
                self.outcomes.append(outcome)

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(TIMEOUT_S * 2)
            assert not thread.is_alive(), "a load worker hung past its read timeouts"
        return list(self.outcomes)

    def count(self) -> int:
        with self._lock:
            return len(self.outcomes)


def run_async(coro: Any, timeout: float = TIMEOUT_S * 2) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


class ContainerReplica(Replica):
    """The same replica as a container of `image` (`QTTS_REPLICA_IMAGE`: scripts/test-container-replicas.sh),
    its ports published on 127.0.0.1, the models mounted read-only, the shared voices folder and a usage
    log folder of its own mounted read-write (owned by the image's uid 10001), the settings in the
    environment as the Kubernetes manifests give them. `podman` with `runtime` args (runc and ulimits
    where podman's default fails here)."""

    UID = 10001
    CONTAINER_NETWORKS = "10.88.0.0/16,10.89.0.0/16"
    """Rootful podman's bridge networks: published ports reach the server from the bridge's gateway,
    which is the balancer's hop here (QTTS_TRUSTED_PROXIES)."""

    def __init__(self, name: str, models: list[Path], voices: Path, root: Path, image: str,
                 global_args: list[str], run_args: list[str]):
        super().__init__(name, models, voices, root)
        self.image, self.global_args, self.run_args = image, global_args, run_args
        self.container = f"qtts-replica-{name}-{os.getpid()}"
        usage_dir = root / f"usage-{name}"
        usage_dir.mkdir(exist_ok=True)
        os.chown(usage_dir, self.UID, self.UID)
        self.usage_log = usage_dir / "usage.jsonl"
        self._started = False

    def _podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *self.global_args, *args], capture_output=True, text=True, timeout=timeout)

    def start(self) -> Replica:
        self._podman("rm", "-f", "-v", "-t", "0", self.container)
        self.generation += 1
        mounts = ["-v", f"{self.voices}:/data/voices", "-v", f"{self.usage_log.parent}:/data/usage"]
        for model in self.models:
            mounts += ["-v", f"{model}:/data/model-base/{model.name}:ro"]
        env = {"QTTS_API_KEY": KEY, "QTTS_REPLICA_ID": self.name,
               "QTTS_TRUSTED_PROXIES": f"127.0.0.1,{self.CONTAINER_NETWORKS}",
               "QTTS_MODEL": ",".join(f"/data/model-base/{m.name}" for m in self.models),
               "QTTS_WYOMING_PORT": "10200", "QTTS_THREADS": "1", "QTTS_DETERMINISTIC": "1",
               "QTTS_MAX_STREAMS": "4", "QTTS_MAX_BUFFERED_AUDIO_S": "1", "QTTS_WARM_UP_VOICES": "none",
               "QTTS_DRAIN_TIMEOUT_S": "30", "QTTS_USAGE_LOG": "/data/usage/usage.jsonl", "QTTS_LOG_FORMAT": "json"}
        args = ["run", "-d", "--name", self.container, *self.run_args, *mounts,
                "-p", f"127.0.0.1:{self.port}:8100", "-p", f"127.0.0.1:{self.wyoming_port}:10200"]
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        done = self._podman(*args, self.image)
        assert done.returncode == 0, done.stderr
        self._started = True
        return self

    @property
    def running(self) -> bool:
        if not self._started:
            return False
        state = self._podman("inspect", self.container, "--format", "{{.State.Running}}")
        return state.returncode == 0 and state.stdout.strip() == "true"

    def terminate(self) -> None:
        self._podman("kill", "-s", "TERM", self.container)

    def kill(self) -> None:
        self._podman("kill", "-s", "KILL", self.container)
        self._podman("wait", self.container)

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        done = self._podman("wait", self.container, timeout=timeout_s)
        return int(done.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        if self._started:
            self._podman("stop", "-t", "40", self.container, timeout=60)
            self._podman("rm", "-f", "-v", "-t", "0", self.container)
            self._started = False

    def log_tail(self) -> str:
        logs = self._podman("logs", "--tail", "40", self.container)
        return (logs.stdout + logs.stderr)[-4000:]
