"""Scale-out, run for real (issue 49): three `serve` processes behind Debian's HAProxy, configured as
docs/deploy.md prescribes (`tests/replica_cluster.py`), one shared voices folder, a bounded load from
published clients (openai HTTP streams, `websockets` on /v1/ws, wyoming's TCP client), and the faults an
operator meets: a replica added under load, a voice made on one replica and used on the others, a resume
routed to the replica that holds its stream, a replica killed mid-stream, a rolling restart.

The tests share one cluster and run in file order; each first brings the cluster to the shape it needs
(`cluster.ensure`). Every replica is deterministic (batching changes no bit), so every request a client
counts as succeeded is checked byte for byte against a reference made once on one replica. Each client
worker speaks from its own loopback address, which the replicas see through X-Forwarded-For (their per-client
limit of 2 streams would refuse the load otherwise).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import socket
import struct
import threading
import time
from collections import Counter
from pathlib import Path

import openai
import pytest
import soundfile
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from tests.replica_cluster import (
    CHECK_FALL,
    CHECK_INTER_MS,
    CHECK_RISE,
    KEY,
    TIMEOUT_S,
    Balancer,
    ContainerReplica,
    Load,
    Outcome,
    Replica,
    attempt,
    free_ports,
    haproxy_config,
    httpx,
    metric_sum,
    run_async,
    scaling_signal,
)
from tests.test_cli_voices import speechlike
from tests.waiting import wait_until

TEXT = "Hello there, this is one of many requests spread over the replicas."
FRAMES = 32
SEED = 7
PCM_FRAME = 1920 * 2
WYOMING_TEXT = "Turning on the lights."
NAMES = ("r1", "r2", "r3")
LONG_FRAMES = 160
"""A stream a slow reader takes a few seconds over: in flight when a fault comes."""
AUTH = {"Authorization": f"Bearer {KEY}"}


def client_address(kind: str, worker: int) -> str:
    """Each worker speaks from an address of its own (127/8 is this machine)."""
    return f"127.0.{ {'openai': 1, 'ws': 2, 'pinned': 3, 'xff': 4}[kind] }.{10 + worker}"


class Cluster:
    def __init__(self, replicas: dict[str, Replica], balancer: Balancer, port: int, wyoming_port: int):
        self.replicas, self.balancer = replicas, balancer
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}/v1/ws"
        self.port, self.wyoming_port = port, wyoming_port
        self.refs: dict[str, bytes] = {}
        self._openai: dict[str, openai.OpenAI] = {}

    def ensure(self, *names: str) -> None:
        """Exactly `names` run, ready, and UP in HAProxy."""
        for name, replica in self.replicas.items():
            if name in names and not replica.running:
                replica.start()
            elif name not in names and replica.running:
                replica.stop()
        for name in names:
            self.replicas[name].wait_ready()
            self.balancer.set_state(name, "ready")
            self.balancer.wait_status(name, "UP")

    # -- clients, through the balancer ---------------------------------------------------------
    def openai_client(self, address: str) -> openai.OpenAI:
        """The OpenAI SDK from `address`, no retries of its own (a failure must show)."""
        if address not in self._openai:
            transport = httpx.HTTPTransport(local_address=address)
            self._openai[address] = openai.OpenAI(
                base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT_S,
                http_client=openai.DefaultHttpxClient(transport=transport, timeout=TIMEOUT_S))
        return self._openai[address]

    def speech(self, address: str, *, replica: str | None = None, frames: int = FRAMES,
               read: callable = None) -> Outcome:
        """One streamed POST /v1/audio/speech through the balancer (pinned to `replica` by `?replica=`);
        `read(chunk)` is called after each piece (a slow reader sleeps there)."""
        with attempt("openai") as outcome:
            with self.openai_client(address).audio.speech.with_streaming_response.create(
                    model="tts-1", voice="alloy", input=TEXT, response_format="pcm",
                    extra_body={"max_frames": frames, "seed": SEED},
                    extra_query={"replica": replica} if replica else None) as response:
                outcome.replica = response.headers.get("x-served-by")
                outcome.request_id = response.headers.get("x-request-id")
                audio = bytearray()
                for piece in response.iter_bytes(16384):
                    audio += piece
                    if read is not None:
                        read(audio)
            reference = self.refs["openai"] if frames == FRAMES else self.refs.get(f"openai-{frames}")
            outcome.judge(bytes(audio), reference)
        return outcome

    def open_ws(self, address: str, query: str = "") -> ClientConnection:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT_S,
                                        source_address=(address, 0))
        return connect(self.ws_url + query, sock=sock, additional_headers=AUTH, open_timeout=TIMEOUT_S)

    def live(self, address: str) -> Outcome:
        """One /v1/ws utterance through the balancer: start, the text in two parts, stop, audio to `done`."""
        with attempt("ws") as outcome:
            with self.open_ws(address) as ws:
                outcome.replica = ws.response.headers.get("x-served-by")
                audio, done = live_audio(ws)
                outcome.request_id = done["id"]
                outcome.judge(audio, self.refs["ws"])
        return outcome

    def wyoming(self) -> Outcome:
        """One Wyoming synthesis through the balancer's TCP frontend."""
        with attempt("wyoming") as outcome:
            audio = wyoming_audio(self.wyoming_port)
            outcome.audio = len(audio)
            # Wyoming sends no seed: its audio differs per request; whole 80 ms frames, up to audio-stop, and
            # the usage log's seconds (check_wyoming_usage) stand for the reference here
            outcome.ok = len(audio) > 0 and len(audio) % PCM_FRAME == 0
            if not outcome.ok:
                outcome.error = f"not whole frames ({len(audio)} bytes)"
        return outcome

    def load(self, openai_workers: int = 3, ws_workers: int = 2, wyoming_workers: int = 1,
             max_s: float = 120.0) -> Load:
        return Load({"openai": lambda i: self.speech(client_address("openai", i)),
                     "ws": lambda i: self.live(client_address("ws", i)),
                     "wyoming": lambda i: self.wyoming()},
                    {"openai": openai_workers, "ws": ws_workers, "wyoming": wyoming_workers}, max_s=max_s)


def wyoming_audio(port: int) -> bytes:
    """The PCM of one Wyoming `synthesize` of WYOMING_TEXT on `port` (the wyoming package's client)."""
    async def speak() -> bytes:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize(text=WYOMING_TEXT).event())
            audio = bytearray()
            while (event := await asyncio.wait_for(client.read_event(), TIMEOUT_S)) is not None:
                if AudioChunk.is_type(event.type):
                    audio += AudioChunk.from_event(event).audio
                elif AudioStop.is_type(event.type):
                    return bytes(audio)
                elif event.type == "error":
                    raise AssertionError(event.data)
            raise ConnectionError("the connection ended before audio-stop")

    return run_async(speak())


def live_audio(ws: ClientConnection, frames: int = FRAMES, **start: object) -> tuple[bytes, dict]:
    """One utterance on `ws`: start, TEXT in two parts, stop; the audio up to `done`, and `done`."""
    ws.send(json.dumps({"type": "start", "voice": "alloy", "format": "pcm", "seed": SEED, "max_frames": frames,
                        **start}))
    started = json.loads(ws.recv(timeout=TIMEOUT_S))
    assert started["type"] == "started", started
    for part in (TEXT[:20], TEXT[20:]):
        ws.send(json.dumps({"type": "text", "text": part}))
    ws.send(json.dumps({"type": "stop"}))
    audio = bytearray()
    while True:
        message = ws.recv(timeout=TIMEOUT_S)
        if isinstance(message, bytes):
            audio += message
        elif (event := json.loads(message))["type"] == "done":
            return bytes(audio), event
        elif event["type"] == "error":
            raise AssertionError(event)


def references(replica: Replica) -> dict[str, bytes]:
    """What each kind of request makes, asked of `replica` directly."""
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm", "max_frames": FRAMES,
            "seed": SEED}
    r = httpx.post(f"{replica.url}/v1/audio/speech", json=body, headers=AUTH, timeout=TIMEOUT_S)
    assert r.status_code == 200 and len(r.content) == FRAMES * PCM_FRAME, r.text
    with connect(f"ws://127.0.0.1:{replica.port}/v1/ws", additional_headers=AUTH, proxy=None) as ws:
        live, _ = live_audio(ws)
    wyoming = wyoming_audio(replica.wyoming_port)  # Wyoming answers (its audio is not seeded: no reference)
    assert wyoming and len(wyoming) % PCM_FRAME == 0
    long = httpx.post(f"{replica.url}/v1/audio/speech", json={**body, "max_frames": LONG_FRAMES}, headers=AUTH,
                      timeout=TIMEOUT_S)
    assert long.status_code == 200 and len(long.content) == LONG_FRAMES * PCM_FRAME, long.text
    return {"openai": r.content, "ws": live, f"openai-{LONG_FRAMES}": long.content}


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if not o.ok]


def served_by(outcomes: list[Outcome]) -> Counter:
    return Counter(o.replica for o in outcomes if o.ok and o.replica)


def check_usage(cluster: Cluster, outcomes: list[Outcome]) -> None:
    """Every request a client saw succeed (HTTP or /v1/ws: by request id) is in the usage log of the replica
    that served it, exactly once over every replica's log."""
    wanted = [o for o in outcomes if o.ok and o.request_id]

    def logged() -> tuple[Counter, dict[str, set[str]]]:
        per = {name: {line["request_id"] for line in r.usage_lines()} for name, r in cluster.replicas.items()}
        every = Counter(line["request_id"] for r in cluster.replicas.values() for line in r.usage_lines())
        return every, per

    wait_until(lambda: all(logged()[0][o.request_id] >= 1 for o in wanted), "every usage line", 10)
    every, per = logged()
    for o in wanted:
        assert every[o.request_id] == 1, (o, every[o.request_id])
        assert o.request_id in per[o.replica], o


# -- the cluster -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(converted_factory, tmp_path_factory):
    assert shutil.which("haproxy"), "HAProxy is needed: apt-get install haproxy (.ci/run installs it)"
    root = tmp_path_factory.mktemp("replicas")
    voices = root / "voices"
    voices.mkdir()
    models = [converted_factory("tiny_cv", "f32"), converted_factory("tiny_base", "f32")]
    image = os.environ.get("QTTS_REPLICA_IMAGE")  # scripts/test-container-replicas.sh: containers of that image
    if image:
        os.chown(voices, ContainerReplica.UID, ContainerReplica.UID)
        copies = root / "models"  # readable by the image's user (the cache may hold files of mode 0600)
        models = [Path(shutil.copytree(model, copies / model.name)) for model in models]
        for path in copies.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        copies.chmod(0o755)
        global_args = os.environ.get("QTTS_REPLICA_PODMAN_ARGS", "").split()
        run_args = os.environ.get("QTTS_REPLICA_RUN_ARGS", "").split()
        replicas = {name: ContainerReplica(name, models, voices, root, image, global_args, run_args) for name in NAMES}
    else:
        replicas = {name: Replica(name, models, voices, root) for name in NAMES}
    port, wyoming_port = free_ports(2)
    balancer = Balancer(haproxy_config(port=port, wyoming_port=wyoming_port, stats_socket=root / "haproxy.sock",
                                       servers=[r.server for r in replicas.values()]), root, root / "haproxy.sock")
    cluster = Cluster(replicas, balancer, port, wyoming_port)
    try:
        for name in ("r1", "r2"):  # r3 comes later, under load
            replicas[name].start()
        cluster.ensure("r1", "r2")
        # the references, on r1; r2 makes the same bytes (deterministic replicas)
        cluster.refs = references(replicas["r1"])
        assert references(replicas["r2"]) == cluster.refs
        yield cluster
    finally:
        for replica in replicas.values():
            replica.stop()
        balancer.stop()


# -- a replica added under load ---------------------------------------------------------------------


def test_a_replica_added_under_load_takes_new_work_once_ready_and_none_before(cluster):
    cluster.ensure("r1", "r2")
    r3, balancer = cluster.replicas["r3"], cluster.balancer
    assert balancer.status("r3") == "DOWN"
    seen: list[tuple[str, int, int]] = []  # HAProxy's view of r3 while it starts: status, sessions, errors
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            row = balancer.stats()[("replicas", "r3")]
            seen.append((row["status"].split()[0], int(row["stot"] or 0), int(row["econ"] or 0)))
            time.sleep(0.02)

    with cluster.load(openai_workers=3, ws_workers=1, wyoming_workers=1, max_s=60) as load:
        wait_until(lambda: load.count() >= 6, "the load to run", 30)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        r3.start()
        ready_at = r3.wait_ready()
        up_at = balancer.wait_status("r3", "UP")
        wait_until(lambda: served_by(load.outcomes)["r3"] >= 3, "r3 to take new work", 30)
        watching.set()
        watcher.join(5)
        outcomes = load.stop()
    assert not failures(outcomes), failures(outcomes)[:5]
    # none before: while HAProxy saw r3 down it sent it nothing (no session, no connection error)
    assert seen and all(sessions == 0 and errors == 0 for status, sessions, errors in seen if status != "UP"), seen
    row = balancer.stats()[("replicas", "r3")]
    assert (int(row["econ"] or 0), int(row["wretr"] or 0), int(row["wredis"] or 0)) == (0, 0, 0), row
    # once ready: within the balancer's rise checks, and new work reaches it
    assert up_at - ready_at < (CHECK_RISE + 2) * CHECK_INTER_MS / 1000 + 1.0, (ready_at, up_at)
    first = min(o.started for o in outcomes if o.replica == "r3")
    assert first - up_at < 5.0
    check_usage(cluster, outcomes)
    print(f"\nadded: r3 ready -> UP in HAProxy {up_at - ready_at:.2f} s, its first request {first - up_at:.2f} s "
          f"later; {len(outcomes)} requests, none failed, spread {dict(served_by(outcomes))}")


# -- steady load: spread, forwarded, accounted, scaled on --------------------------------------------


def test_a_steady_load_is_spread_whole_accounted_once_and_its_scaling_signal_rises_and_falls(cluster):
    cluster.ensure(*NAMES)
    replicas = list(cluster.replicas.values())
    before = {r.name: r.metrics() for r in replicas}
    usage_before = {r.name: len(r.usage_lines()) for r in replicas}
    signal: list[tuple[float, float]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            value = scaling_signal(replicas)
            signal.append((time.monotonic(), value))  # the time the scrape ended
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    idle = cluster.open_ws("127.0.5.10")  # opened before the load, idle longer than `timeout client`
    idle_since = time.monotonic()
    time.sleep(1.0)
    load_at = time.monotonic()
    with cluster.load(openai_workers=4, ws_workers=2, wyoming_workers=1, max_s=60) as load:
        wait_until(lambda: load.count() >= 60 and time.monotonic() - idle_since > 11, "the load", 60)
    outcomes = load.outcomes
    end_at = time.monotonic()
    wait_until(lambda: signal[-1][0] > end_at and signal[-1][1] == 0, "the signal to fall", 15)
    fell_at = time.monotonic()
    sampling.set()
    sampler.join(5)

    assert not failures(outcomes), failures(outcomes)[:5]
    assert Counter(o.kind for o in outcomes).keys() == {"openai", "ws", "wyoming"}
    spread = served_by(outcomes)
    assert set(spread) == set(NAMES) and min(spread.values()) >= 5, spread
    # a WebSocket idle for longer than the balancer's client and server timeouts is still open (tunnel)
    assert time.monotonic() - idle_since > 11
    with idle:
        audio, done = live_audio(idle)
    assert audio == cluster.refs["ws"]
    socket_outcome = Outcome("ws", idle_since, ok=True, replica=idle.response.headers["x-served-by"],
                             request_id=done["id"], audio=len(audio))
    outcomes = [*outcomes, socket_outcome]

    # the usage logs: every request exactly once, in its replica's log; Wyoming's lines by count
    check_usage(cluster, outcomes)
    new_lines = [line for r in replicas for line in r.usage_lines()[usage_before[r.name]:]]
    assert len(new_lines) == len(outcomes)
    assert sorted(round(line["usage"]["audio_seconds"] * 48000) for line in new_lines if line["route"] == "wyoming") \
        == sorted(o.audio for o in outcomes if o.kind == "wyoming")  # each Wyoming synthesis whole

    # /metrics summed over the replicas = what the clients saw
    after = {r.name: r.metrics() for r in replicas}

    def delta(name: str, **labels: str) -> float:
        return sum(metric_sum(after[n], name, **labels) - metric_sum(before[n], name, **labels) for n in after)

    assert delta("qtts_speech_streams_total") == len(outcomes)
    assert delta("qtts_http_requests_total", path="/v1/audio/speech", status="200") == \
        sum(o.kind == "openai" for o in outcomes)
    assert delta("qtts_audio_seconds_total") == pytest.approx(sum(o.audio for o in outcomes) / 48000, abs=1e-3)

    # the autoscaler's signal (the KEDA query over every replica's /metrics): 0 before, up under the load,
    # 0 again after it
    quiet = [value for at, value in signal if at < load_at]
    busy = [value for at, value in signal if load_at + 0.5 < at < end_at - 0.5]
    after_load = [value for at, value in signal if at > end_at]
    assert quiet and max(quiet) == 0, quiet
    assert busy and max(busy) >= 3 and sum(busy) / len(busy) >= 1, busy
    assert after_load and after_load[-1] == 0 and fell_at - end_at < 5.0
    print(f"\nscaling signal: quiet max {max(quiet):g}, under load mean {sum(busy) / len(busy):.2f} "
          f"max {max(busy):g} ({len(busy)} samples), after {after_load[-1]:g}; {len(outcomes)} requests, "
          f"spread {dict(spread)}")


def test_the_client_address_reaches_the_replicas_through_x_forwarded_for(cluster):
    """Each replica allows 2 speech streams per client address: two live streams from one address, held
    open waiting for more text, fill it; a third request from that address is refused (429), one from
    another address is served; all through the balancer, whose own address is the replicas' peer."""
    cluster.ensure(*NAMES)
    with cluster.open_ws("127.0.4.10", "?replica=r1") as one, cluster.open_ws("127.0.4.10", "?replica=r1") as two:
        for ws in (one, two):
            assert ws.response.headers["x-served-by"] == "r1"
            ws.send(json.dumps({"type": "start", "voice": "alloy", "format": "pcm", "seed": SEED,
                                "max_frames": FRAMES}))
            assert json.loads(ws.recv(timeout=TIMEOUT_S))["type"] == "started"
            ws.send(json.dumps({"type": "text", "text": "Waiting for more words"}))
            assert isinstance(ws.recv(timeout=TIMEOUT_S), bytes)  # speaking, and holding its place
        with pytest.raises(openai.RateLimitError) as refused:
            cluster.openai_client("127.0.4.10").audio.speech.create(
                model="tts-1", voice="alloy", input=TEXT, response_format="pcm",
                extra_body={"max_frames": FRAMES, "seed": SEED}, extra_query={"replica": "r1"})
        assert refused.value.response.headers["x-served-by"] == "r1"
        other = cluster.speech("127.0.4.11", replica="r1")
        assert other.ok and other.replica == "r1", other
        for ws in (one, two):
            ws.send(json.dumps({"type": "cancel"}))


# -- voices on shared storage ---------------------------------------------------------------------------


def wav_bytes(seed: int, seconds: float = 2.0, rate: int = 24000) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, speechlike(seconds, rate, seed), rate, format="WAV")
    return buf.getvalue()


def test_a_voice_made_on_one_replica_is_spoken_on_another_at_once_then_replaced_and_deleted_on_a_third(cluster):
    cluster.ensure(*NAMES)
    voices = cluster.replicas["r1"].voices
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=60) as http:
        def create(replica: str, seed: int, **fields: str) -> httpx.Response:
            r = http.post(f"/v1/audio/voices?replica={replica}",
                          data={"name": "shared-alice", "consent": "yes", **fields},
                          files={"audio_sample": ("clip.wav", wav_bytes(seed), "audio/wav")})
            assert r.status_code == 200 and r.headers["x-served-by"] == replica, r.text
            return r

        def speak(replica: str) -> httpx.Response:
            r = http.post(f"/v1/audio/speech?replica={replica}", json={
                "model": "tts-1", "input": "Hello from another replica.", "voice": "shared-alice",
                "response_format": "pcm", "max_frames": 6, "seed": 3})
            assert r.headers["x-served-by"] == replica
            return r

        assert create("r1", 0, text="Exactly what alice says in the clip.").json()["mode"] == "icl"
        first = speak("r2")  # at once, on another replica
        assert first.status_code == 200 and first.headers["x-qwen3tts-model"].startswith("tiny_base"), first.text
        assert len(first.content) == 6 * PCM_FRAME and speak("r1").content == first.content
        assert create("r3", 1, overwrite="true").json()["mode"] == "xvector"  # replaced through a third
        replaced = speak("r1")
        assert replaced.status_code == 200 and replaced.content != first.content
        assert speak("r2").content == replaced.content
        assert http.delete("/v1/audio/voices/shared-alice?replica=r3").status_code == 200  # deleted there too
        for replica in ("r1", "r2"):
            gone = speak(replica)
            assert gone.status_code == 400 and gone.json()["error"]["param"] == "voice", gone.text
            listed = http.get(f"/v1/audio/voices?replica={replica}").json()["voices"]
            assert "shared-alice" not in {v["id"] for v in listed}
    assert sorted(p.name for p in voices.iterdir()) == []  # no temporary or lock file left


# -- resume across replicas ------------------------------------------------------------------------------


def cut(ws: ClientConnection) -> None:
    """Drop the TCP connection at once (an RST, no close frame): a lost network."""
    ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.close_socket()


def detached(replica: Replica) -> float:
    return metric_sum(replica.metrics(), "qtts_detached_streams")


def test_a_cut_stream_resumes_on_the_replica_its_token_names_and_fails_by_name_elsewhere(cluster):
    cluster.ensure(*NAMES)
    address = "127.0.6.10"
    ws = cluster.open_ws(address)
    holder = ws.response.headers["x-served-by"]
    ws.send(json.dumps({"type": "start", "voice": "alloy", "format": "pcm", "seed": SEED, "max_frames": FRAMES,
                        "resumable": True}))
    started = json.loads(ws.recv(timeout=TIMEOUT_S))
    token = started["resume_token"]
    assert token.startswith(holder + "."), (holder, token)
    ws.send(json.dumps({"type": "text", "text": TEXT[:20], "seq": 1}))
    got = bytearray()
    while len(got) < PCM_FRAME:
        got += ws.recv(timeout=TIMEOUT_S)
    cut(ws)
    wait_until(lambda: detached(cluster.replicas[holder]) == 1, "the stream to wait for its resume", 10)

    for other in (name for name in NAMES if name != holder):  # routed to another replica: refused by name
        with cluster.open_ws(address, f"?replica={other}") as wrong:
            assert wrong.response.headers["x-served-by"] == other
            wrong.send(json.dumps({"type": "resume", "resume_token": token, "audio_bytes": len(got)}))
            reply = json.loads(wrong.recv(timeout=TIMEOUT_S))
            assert reply["type"] == "error" and reply["error"]["code"] == "resume_failed", reply
            assert f"held by replica {holder!r}" in reply["error"]["message"], reply
            with pytest.raises(ConnectionClosed):
                wrong.recv(timeout=TIMEOUT_S)
            assert wrong.close_code == 1008
    assert detached(cluster.replicas[holder]) == 1  # the refusals spent nothing

    with cluster.open_ws(address, f"?replica={holder}") as right:  # the balancer routes on ?replica=
        assert right.response.headers["x-served-by"] == holder
        right.send(json.dumps({"type": "resume", "resume_token": token, "audio_bytes": len(got)}))
        resumed = json.loads(right.recv(timeout=TIMEOUT_S))
        assert resumed["type"] == "resumed" and resumed["id"] == started["id"], resumed
        assert resumed["resume_token"].startswith(holder + ".")
        right.send(json.dumps({"type": "text", "text": TEXT[20:], "seq": 2}))
        right.send(json.dumps({"type": "stop"}))
        rest = bytearray()
        while isinstance(message := right.recv(timeout=TIMEOUT_S), bytes) or json.loads(message)["type"] != "done":
            if isinstance(message, bytes):
                rest += message
    assert bytes(got + rest) == cluster.refs["ws"]  # nothing lost, nothing twice


def test_the_python_sdk_resumes_through_the_balancer(cluster):
    """qtts_client opens its resume socket with `?replica=` (its token's prefix): three cut utterances,
    each resumed on its replica (without the parameter, least-connections would send most elsewhere)."""
    from qtts_client import Audio, Client, Done, Resumed

    cluster.ensure(*NAMES)
    with Client(cluster.url, api_key=KEY, timeout=TIMEOUT_S) as client:
        for _ in range(3):
            with client.stream("alloy", seed=SEED, max_frames=FRAMES, resumable=True) as utterance:
                holder = utterance.resume_token.split(".")[0]
                utterance.send_text(TEXT[:20])
                received = []
                while not any(isinstance(e, Audio) for e in received):
                    received.append(next(utterance))
                utterance._runner.call(utterance._async.socket._ws.transport.abort)  # the network fails
                utterance.send_text(TEXT[20:])
                utterance.finish()
                received += list(utterance)
            assert [type(e) for e in received if isinstance(e, Resumed)] == [Resumed]
            assert isinstance(received[-1], Done) and utterance.resume_token.startswith(holder + ".")
            assert b"".join(e.data for e in received if isinstance(e, Audio)) == cluster.refs["ws"]


# -- faults under load ----------------------------------------------------------------------------------



class LongStreams:
    """Slow HTTP streams of LONG_FRAMES through the balancer, one per `pins` entry (label -> replica), each
    in a thread; `wait_audio` until each has received audio (mid-stream), `join` for their outcomes."""

    def __init__(self, cluster: Cluster, pins: dict[str, str], pause_s: float = 0.05):
        self.outcomes: dict[str, Outcome] = {}
        self.audio = {label: threading.Event() for label in pins}
        self.threads = []
        for i, (label, replica) in enumerate(pins.items()):
            def read(audio: bytearray, label: str = label) -> None:
                self.audio[label].set()
                time.sleep(pause_s)

            def run(label: str = label, replica: str = replica, i: int = i, read=read) -> None:
                self.outcomes[label] = cluster.speech(client_address("pinned", i), replica=replica,
                                                      frames=LONG_FRAMES, read=read)
            self.threads.append(threading.Thread(target=run, daemon=True))
        for thread in self.threads:
            thread.start()

    def wait_audio(self) -> None:
        for label, event in self.audio.items():
            assert event.wait(TIMEOUT_S), f"no audio on the long stream {label}"

    def join(self) -> dict[str, Outcome]:
        for thread in self.threads:
            thread.join(TIMEOUT_S * 2)
            assert not thread.is_alive()
        return self.outcomes


def test_a_replica_killed_mid_stream_ends_its_streams_cleanly_and_the_others_go_on(cluster):
    cluster.ensure(*NAMES)
    balancer, victim = cluster.balancer, cluster.replicas["r2"]
    with cluster.load(openai_workers=3, ws_workers=1, wyoming_workers=1, max_s=60) as load:
        wait_until(lambda: load.count() >= 6, "the load to run", 30)
        streams = LongStreams(cluster, {"victim-1": "r2", "victim-2": "r2", "other-1": "r1", "other-3": "r3"})
        held = cluster.open_ws("127.0.6.20", "?replica=r2")  # a live stream on r2, waiting for more words
        held.send(json.dumps({"type": "start", "voice": "alloy", "format": "pcm", "seed": SEED, "max_frames": 500}))
        assert json.loads(held.recv(timeout=TIMEOUT_S))["type"] == "started"
        held.send(json.dumps({"type": "text", "text": "Waiting for more words"}))
        assert isinstance(held.recv(timeout=TIMEOUT_S), bytes)
        streams.wait_audio()  # each long stream is mid-stream
        killed_at = time.monotonic()
        victim.kill()
        down_at = balancer.wait_status("r2", "DOWN", 10)
        with pytest.raises(ConnectionClosed):  # the live stream's client: a closed connection, at once
            while True:
                held.recv(timeout=TIMEOUT_S)
        held_ended = time.monotonic()
        long = streams.join()
        after = load.count()
        wait_until(lambda: load.count() >= after + 10, "new requests after the kill", 30)
        outcomes = load.stop()
    # the balancer saw it within its check interval (CHECK_FALL failed checks)
    assert down_at - killed_at < CHECK_FALL * CHECK_INTER_MS / 1000 + 1.5, down_at - killed_at
    # its clients got a clean end (an error or a closed connection), well before their read timeout
    for label in ("victim-1", "victim-2"):
        outcome = long[label]
        assert not outcome.ok and outcome.error and outcome.replica == "r2", outcome
        assert outcome.ended - killed_at < 5.0, outcome
    assert held_ended - killed_at < 5.0
    # the other replicas' streams in flight: untouched, whole
    for label in ("other-1", "other-3"):
        assert long[label].ok and long[label].replica == label.replace("other-", "r"), long[label]
    # the load: failed only what was in flight on r2 when it died; everything asked after the kill was
    # served (a connection refused is retried elsewhere until the checks take r2 out), none by r2 after
    failed = failures(outcomes)
    assert all(o.started < killed_at and o.ended - killed_at < 5.0 for o in failed), failed
    assert all(o.ok and o.replica != "r2" for o in outcomes if o.started > killed_at), \
        [o for o in outcomes if o.started > killed_at and not (o.ok and o.replica != "r2")]
    check_usage(cluster, [*outcomes, *long.values()])
    print(f"\nkilled: r2 DOWN in HAProxy {down_at - killed_at:.2f} s after SIGKILL; its clients' ends after "
          f"{', '.join(f'{long[k].ended - killed_at:.2f}' for k in ('victim-1', 'victim-2'))} s (HTTP), "
          f"{held_ended - killed_at:.2f} s (/v1/ws); load: {len(failed)} in flight on r2 failed, "
          f"{sum(o.started > killed_at for o in outcomes)} asked after the kill all served; errors seen: "
          f"{sorted({(o.error or '')[:60] for o in [*failed, long['victim-1'], long['victim-2']]})}")


def test_a_rolling_restart_under_load_fails_no_new_request_and_finishes_every_stream_in_flight(cluster):
    """Each replica in turn, as a Deployment's rolling update (with the preStop pause) does it: out of the
    balancer (HAProxy's `drain` state, no new work), SIGTERM (the server drains: /ready 503, its streams in
    flight finish), exit 0, started again, ready, back in the balancer, taking work again."""
    cluster.ensure(*NAMES)
    balancer = cluster.balancer
    kept: list[Outcome] = []
    steps: list[str] = []
    with cluster.load(openai_workers=3, ws_workers=2, wyoming_workers=1, max_s=120) as load:
        wait_until(lambda: load.count() >= 6, "the load to run", 30)
        for name in NAMES:
            replica = cluster.replicas[name]
            streams = LongStreams(cluster, {f"{name}-a": name, f"{name}-b": name})
            streams.wait_audio()
            balancer.set_state(name, "drain")  # out of the balancer: no new work from here
            balancer.wait_status(name, "DRAIN")
            stopped_at = time.monotonic()
            replica.terminate()
            assert replica.wait_exit(60) == 0, replica.log_tail()
            exited_at = time.monotonic()
            kept += streams.join().values()
            replica.start()
            ready_at = replica.wait_ready()
            balancer.set_state(name, "ready")  # back in the balancer: its checks decide from here
            back_at = balancer.wait_status(name, "UP")
            steps.append(f"{name}: drained and exited in {exited_at - stopped_at:.2f} s, ready "
                         f"{ready_at - exited_at:.2f} s after, UP {back_at - ready_at:.2f} s later")
            wait_until(lambda: any(o.replica == name and o.started > back_at for o in list(load.outcomes)),
                       f"{name} to take work again", 30)
        outcomes = load.stop()
    assert not failures(outcomes), failures(outcomes)[:5]
    assert all(o.ok for o in kept), [o for o in kept if not o.ok]  # the streams in flight: whole
    check_usage(cluster, [*outcomes, *kept])
    row = balancer.stats()[("replicas", "BACKEND")]
    print(f"\nrolling restart: {'; '.join(steps)}; {len(outcomes)} requests and {len(kept)} long streams in "
          f"flight, none failed; HAProxy retried {row['wretr']} and redispatched {row['wredis']} in all")


def test_the_docs_show_the_tested_config():
    """docs/deploy.md's HAProxy example is this module's configuration, rendered for three replicas at
    10.0.0.11-13: what the docs prescribe is what ran."""
    from tests.replica_cluster import ROOT, Server

    config = haproxy_config(port=8100, wyoming_port=10200, stats_socket="/run/haproxy/admin.sock",
                            address="0.0.0.0",
                            servers=[Server(f"r{i}", f"10.0.0.1{i}", 8100, 10200) for i in (1, 2, 3)])
    assert f"```haproxy\n{config}```" in (ROOT / "docs" / "deploy.md").read_text()
