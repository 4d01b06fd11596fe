"""The HTTP side of the server's limits, end to end on a real uvicorn: body sizes (413), multipart
uploads, slow bodies (408) and slow request heads (closed), the connection limit (503), the
per-client stream cap (429), the voice jobs' queue (429) and their cancellation, Host and Origin
checks, and error bodies that never show paths, class names or tracebacks.

Random tiny models; every speech request caps `max_frames`. Timeouts are configured small and the
tests check what happens, never how long it took.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading

import pytest
import soundfile

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.voicebank.store import VoiceStore

from api import ServerConfig
from api.limits import ServerLimits
from api.voice_resolution import StoredVoiceProfiles
from tests.server_fixtures import FixtureValue, server_fixtures
from tests.test_cli_voices import speechlike
from tests.waiting import wait_until

SLOW = ServerLimits(body_timeout_s=0.3, header_timeout_s=0.3)
LIMITS = ServerLimits(max_body_bytes=4096, max_upload_bytes=100_000, max_form_fields=4, max_connections=6,
                      trusted_proxies=("127.0.0.1",), voice_workers=1, voice_queue=0)
"""max_streams=2 below: one stream per client (half the slots); 127.0.0.1 is a trusted proxy, so
`X-Forwarded-For` names the client."""


def wav_bytes(seconds: float, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, speechlike(seconds, 24000, seed), 24000, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


registry, server = server_fixtures(2, models=("tiny_cv", "tiny_base"), api_key=None,
                                   voices_dir=FixtureValue("voices_dir"), limits=LIMITS)
slow_registry, slow_server = server_fixtures(2, api_key=None, limits=SLOW, names=("slow_registry", "slow_server"))


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def speech(frames: int = 2, text: str = "Hello.") -> dict:
    return {"model": "tts-1", "input": text, "voice": "ryan", "response_format": "pcm", "max_frames": frames,
            "seed": 1}


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def raw_request(server, data: bytes, *, wait_s: float = 30.0) -> bytes:
    """Send `data` on a fresh connection; everything the server sends until it closes it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait_s) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# -- request bodies ------------------------------------------------------------------------------


def test_json_body_over_the_cap_gets_413_with_or_without_a_length(server, http):
    big = speech(text="word " * 1000)  # ~5 KB > 4096
    r = http.post("/v1/audio/speech", json=big)
    assert r.status_code == 413 and r.headers["connection"] == "close" and r.headers["x-request-id"]
    assert error_of(r)["code"] == "payload_too_large"

    def chunks():  # no Content-Length: Transfer-Encoding chunked, counted as it arrives
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i:i + 1000]

    r = http.post("/v1/audio/speech", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"
    assert http.post("/v1/audio/speech", json=speech()).status_code == 200  # a normal body still passes


def test_a_client_still_sending_a_big_body_reads_its_413(server):
    """A body well over the cap (but under the drain bound) is read and dropped before the answer:
    closing on a client that is still sending would reset the connection instead of answering."""
    data = b'{"input": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    chunked = iter([data[i:i + 65536] for i in range(0, len(data), 65536)])  # no Content-Length
    for content in (data, chunked):
        r = httpx.post(f"{server.url}/v1/audio/speech", content=content,
                       headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"


def test_content_length_with_transfer_encoding_is_refused(server):
    body = b'{"model": "tts-1"}'
    answer = raw_request(server, b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 b"Content-Type: application/json\r\nContent-Length: 18\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n12\r\n" + body + b"\r\n0\r\n\r\n")
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b'"invalid_http"' in payload


def test_an_unknown_api_path_is_404_for_every_method(server, http):
    for method in ("GET", "POST", "DELETE"):
        r = http.request(method, "/v1/audio/nope")
        assert r.status_code == 404 and error_of(r)["code"] == "not_found", method


def test_multipart_upload_limits(server, http, voices_dir):
    def create(name, files=None, **fields):
        return http.post("/v1/audio/voices", data={"name": name, **fields}, files=files)

    clip = ("clip.wav", wav_bytes(1.5), "audio/wav")  # 72 KB: fits the 100 KB upload cap
    r = create("big", files={"audio_sample": ("clip.wav", wav_bytes(3.0), "audio/wav")})  # 144 KB
    assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"
    tiny = ("c.wav", b"RIFF", "audio/wav")
    r = create("two", files=[("audio_sample", tiny), ("audio", tiny)])
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_form"
    r = create("many", files={"audio_sample": clip}, text="a", language="english", model="tiny_base", extra="x")
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_form"  # 6 parts > 4
    r = create("long", files={"audio_sample": clip}, text="x" * 4097)
    assert r.status_code == 400 and error_of(r)["param"] == "text"
    assert error_of(r)["code"] == "string_above_max_length"
    r = create("klingon", files={"audio_sample": clip}, language="klingon")
    assert r.status_code == 400 and error_of(r)["param"] == "language"
    r = http.post("/v1/audio/voices", content=b"--x\r\nnot a form", headers={"content-type": "multipart/form-data"})
    error = error_of(r)
    assert r.status_code == 400 and error["code"] == "invalid_form" and "boundary" not in error["message"]
    assert VoiceStore(voices_dir).list() == []  # nothing refused was saved


def test_a_profile_that_could_not_be_read_back_is_never_saved(tmp_path):
    import numpy as np

    from qwen3_tts_gguf.voicebank.store import VoiceProfile, VoiceProfileError

    profile = VoiceProfile.create(name="wordy", model_size="0.6b", hidden_size=8, speaker_embedding=np.zeros(8),
                                  mode="icl", ref_text="x" * (5 * 1024 * 1024), ref_codes=np.zeros((2, 16), np.int64))
    store = VoiceStore(tmp_path)
    with pytest.raises(VoiceProfileError, match="at most"):
        store.save(profile)
    assert store.list() == [] and list(tmp_path.iterdir()) == []


def test_a_body_that_does_not_arrive_gets_408_and_the_connection_closes(slow_server):
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n{\"model\": ")
    reply = raw_request(slow_server, head)  # returns once the server closes the connection
    status, _, rest = reply.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408"), reply
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def test_a_request_head_that_does_not_complete_is_closed(slow_server):
    with socket.create_connection(("127.0.0.1", slow_server.port), timeout=30) as sock:
        assert sock.recv(1) == b""  # nothing sent at all: closed, no answer
    with socket.create_connection(("127.0.0.1", slow_server.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        sock.settimeout(0.05)
        closed = False
        for _ in range(2000):  # trickle a header byte at a time: bytes never extend the deadline
            try:
                sock.sendall(b"X")
                closed = sock.recv(1) == b""
            except socket.timeout:
                continue
            except OSError:  # reset: closed
                closed = True
            if closed:
                break
        assert closed
    # a keep-alive connection gets the same deadline after each response
    with socket.create_connection(("127.0.0.1", slow_server.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = b""
        while not reply.endswith(b'{"status":"ok"}') and (chunk := sock.recv(4096)):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"status":"ok"}')
        assert sock.recv(1) == b""


def test_open_connections_are_bounded_with_an_envelope(server):
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(LIMITS.max_connections)]
    try:
        reply = raw_request(server, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 503"), reply
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "unavailable"
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: httpx.get(f"{server.url}/v1/models").status_code == 200, "a free connection")


# -- per-client cap --------------------------------------------------------------------------------


def test_one_client_holds_its_share_and_others_still_get_through(server, http):
    limiter = server.app.state.client_limiter
    alice, bob = {"X-Forwarded-For": "203.0.113.9, 10.0.0.1"}, {"X-Forwarded-For": "10.0.0.2"}
    assert limiter.cap == 1
    with http.stream("POST", "/v1/audio/speech", json=speech(frames=3000), headers=alice) as held:
        pieces = held.iter_bytes()
        next(pieces)  # streaming: alice holds her one place
        assert limiter.held("10.0.0.1") == 1
        again = http.post("/v1/audio/speech", json=speech(), headers=alice)
        assert again.status_code == 429 and again.headers["retry-after"]
        assert error_of(again)["code"] == "client_limit" and error_of(again)["type"] == "rate_limit_error"
        other = http.post("/v1/audio/speech", json=speech(), headers=bob)
        assert other.status_code == 200 and len(other.content) == 2 * 1920 * 2
    # leaving cancels her stream; the engine ends it and her place comes back
    wait_until(lambda: limiter.held("10.0.0.1") == 0, "alice's place to come back")
    assert http.post("/v1/audio/speech", json=speech(), headers=alice).status_code == 200
    assert limiter.held("10.0.0.2") == 0


def test_client_address_behind_trusted_proxies():
    from api.limits import parse_networks
    from api.ops.clients import client_address

    trusted = parse_networks(["10.0.0.0/8", "::1"])

    def scope(peer, *forwarded):
        return {"client": (peer, 1234), "headers": [(b"x-forwarded-for", f.encode()) for f in forwarded]}

    assert client_address(scope("198.51.100.7", "1.2.3.4")) == "198.51.100.7"  # no trusted proxies: the peer
    assert client_address(scope("198.51.100.7", "1.2.3.4"), trusted) == "198.51.100.7"  # peer is no proxy
    assert client_address(scope("10.0.0.5", "6.6.6.6, 1.2.3.4, 10.0.0.9"), trusted) == "1.2.3.4"
    assert client_address(scope("::1", "6.6.6.6", "1.2.3.4"), trusted) == "1.2.3.4"  # two headers: one list
    assert client_address(scope("10.0.0.5"), trusted) == "10.0.0.5"
    assert client_address({"client": None, "headers": []}) == "unknown"


# -- voice jobs ------------------------------------------------------------------------------------


@pytest.fixture
def gated_cloner(monkeypatch):
    """Voice jobs block in `cloner` until the gate opens (a controlled slow job)."""
    started, gate = threading.Event(), threading.Event()
    real = StoredVoiceProfiles.cloner

    def slow(self, served):
        started.set()
        assert gate.wait(timeout=60)
        return real(self, served)

    monkeypatch.setattr(StoredVoiceProfiles, "cloner", slow)
    yield started, gate
    gate.set()


def multipart(name: str, clip: bytes) -> bytes:
    """A raw HTTP request creating voice `name` from `clip`."""
    boundary = "qttsboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\n{name}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"audio_sample\"; filename=\"c.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode() + clip + f"\r\n--{boundary}--\r\n".encode()
    return (f"POST /v1/audio/voices HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n").encode() + body


def test_voice_jobs_run_apart_and_a_full_queue_answers_429(server, http, voices_dir, gated_cloner):
    started, gate = gated_cloner
    jobs = server.app.state.voice_jobs
    clip = ("clip.wav", wav_bytes(1.5), "audio/wav")
    results: list = []
    with httpx.Client(base_url=server.url, timeout=60) as other:
        first = threading.Thread(target=lambda: results.append(
            other.post("/v1/audio/voices", data={"name": "first"}, files={"audio_sample": clip})))
        first.start()
        assert started.wait(timeout=30)  # the one worker is busy; the queue holds none
        busy = http.post("/v1/audio/voices", data={"name": "second"}, files={"audio_sample": clip})
        assert busy.status_code == 429 and busy.headers["retry-after"] and error_of(busy)["code"] == "queue_full"
        assert http.post("/v1/audio/speech", json=speech()).status_code == 200  # speech is not held up
        gate.set()
        first.join(timeout=60)
    assert results[0].status_code == 200, results[0].text
    assert jobs.jobs == 0 and VoiceStore(voices_dir).list() == ["first"]
    assert http.delete("/v1/audio/voices/first").status_code == 200


def test_a_client_that_leaves_cancels_its_voice_job(server, voices_dir, gated_cloner):
    started, gate = gated_cloner
    jobs = server.app.state.voice_jobs
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(multipart("leaver", wav_bytes(1.5)))
        assert started.wait(timeout=30)
    # the client is gone while its job runs: the job stops after its current step, saving nothing
    wait_until(lambda: 'path="/v1/audio/voices",status="499"' in httpx.get(f"{server.url}/metrics").text,
               "the server to see the client leave")
    gate.set()
    wait_until(lambda: jobs.jobs == 0, "the job to end")
    assert "leaver" not in VoiceStore(voices_dir).list()


def test_a_design_is_cancelled_through_its_engine_stream(converted_factory):
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.voicebank.design import Cancellation, Cancelled, speak_reference

    model = LoadedModel(converted_factory("tiny_vd", "f32"), EngineSettings(threads=1, max_streams=1))
    try:
        with Engine(model) as engine:
            cancel = Cancellation()
            cancel.set()
            with pytest.raises(Cancelled):  # set before: nothing is queued
                speak_reference(engine, "A calm voice.", "Hello.", cancel=cancel)
            assert engine.stats["streams_done"] == 0
            cancel = Cancellation()
            threading.Thread(target=lambda: (wait_until(lambda: engine.load()["active"] == 1, "the design"),
                                             cancel.set()), daemon=True).start()
            with pytest.raises(Cancelled):  # set while it speaks: its engine stream is cancelled
                speak_reference(engine, "A calm voice.", "Hello there. " * 40, max_frames=100000, cancel=cancel)
            assert engine.stats["cancelled"] == 1 and engine.load()["active"] == 0
    finally:
        model.close()


# -- browsers: Host and Origin ------------------------------------------------------------------


def test_cross_site_posts_are_refused(server, http):
    clip = ("clip.wav", wav_bytes(1.5), "audio/wav")
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}):
        r = http.post("/v1/audio/voices", data={"name": "evil"}, files={"audio_sample": clip}, headers=headers)
        assert r.status_code == 403 and error_of(r)["code"] == "origin_not_allowed", headers
        plain = {**headers, "content-type": "text/plain"}
        r = http.post("/v1/audio/speech", content=json.dumps(speech()), headers=plain)
        assert r.status_code == 403, headers
        assert http.delete("/v1/audio/voices/any", headers=headers).status_code == 403
    assert http.get("/v1/models", headers={"Origin": "http://evil.example"}).status_code == 200  # reads pass
    own = http.post("/v1/audio/speech", json=speech(), headers={"Origin": server.url, "Sec-Fetch-Site": "same-origin"})
    assert own.status_code == 200  # the server's own pages (the web console)


def test_only_loopback_host_names_are_served_on_loopback(server, http):
    r = http.get("/v1/models", headers={"Host": "rebound.evil.example"})
    assert r.status_code == 400 and error_of(r)["code"] == "host_not_allowed"
    assert http.post("/v1/audio/speech", json=speech(), headers={"Host": "evil.example:80"}).status_code == 400
    assert http.get("/health", headers={"Host": "rebound.evil.example"}).status_code == 200  # probes: exempt
    for host in (f"localhost:{server.port}", "127.0.0.1", f"[::1]:{server.port}"):
        assert http.get("/v1/models", headers={"Host": host}).status_code == 200, host


def test_host_rules():
    from api.ops.hosts import allowed_hosts, host_matches

    assert allowed_hosts(ServerConfig(host="0.0.0.0")) is None  # not loopback: any host
    listed = allowed_hosts(ServerConfig(host="0.0.0.0", limits=ServerLimits(allowed_hosts=("tts.example",
                                                                                          "*.corp.example"))))
    assert host_matches("TTS.example:8100", listed) and host_matches("a.corp.example", listed)
    assert not host_matches("corp.example", listed) and not host_matches("evil.example", listed)
    assert not host_matches(None, listed)
    assert allowed_hosts(ServerConfig(limits=ServerLimits(allowed_hosts=("*",)))) is None


# -- error hygiene ---------------------------------------------------------------------------------


def test_error_bodies_show_no_paths_class_names_or_tracebacks(server, http, voices_dir, monkeypatch, caplog):
    r = http.delete("/v1/audio/voices/nobody")
    assert r.status_code == 404 and str(voices_dir) not in r.text and "nobody" in error_of(r)["message"]
    (voices_dir / "broken.json").write_text("{not json")
    try:
        r = http.post("/v1/audio/speech", json={**speech(), "voice": "broken"})
        assert r.status_code == 400 and str(voices_dir) not in r.text
    finally:
        (voices_dir / "broken.json").unlink()

    def explode(self):
        raise RuntimeError(f"secret state in {voices_dir}")

    monkeypatch.setattr(StoredVoiceProfiles, "entries", explode)
    with caplog.at_level(logging.ERROR, logger="api.requests"):
        r = http.get("/v1/audio/voices")
    assert r.status_code == 500 and error_of(r)["code"] == "internal_error"
    for secret in (str(voices_dir), "RuntimeError", "Traceback", "secret"):
        assert secret not in r.text
    assert any(r.headers["x-request-id"] in record.getMessage() and record.exc_info for record in caplog.records)


# -- configuration ---------------------------------------------------------------------------------


def test_every_limit_has_a_serve_flag_with_its_default_in_the_help(capsys):
    from dataclasses import fields

    from qwen3_tts_gguf.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["serve", "--max-body-bytes", "10", "--trusted-proxies", "10.0.0.0/8",
                              "--allowed-hosts", "a.example", "--allowed-hosts", "b.example", "--voice-queue", "0"])
    limits = ServerConfig.from_args(args, {}).limits
    assert limits == ServerLimits(max_body_bytes=10, trusted_proxies=("10.0.0.0/8",),
                                  allowed_hosts=("a.example", "b.example"), voice_queue=0)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for field in fields(ServerLimits):
        assert f"--{field.name.replace('_', '-')}" in help_text
    assert "(default 1 MiB)" in help_text and "(default 30)" in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--body-timeout-s", "0"])


def test_a_public_bind_without_a_key_warns(caplog):
    from types import SimpleNamespace

    from api.server import _announce

    nothing = SimpleNamespace(models=(), default=None, aliases=())
    with caplog.at_level(logging.WARNING, logger="api.server"):
        _announce(ServerConfig(host="0.0.0.0"), nothing)
        _announce(ServerConfig(host="127.0.0.1"), nothing)
        _announce(ServerConfig(host="0.0.0.0", api_key="k"), nothing)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "0.0.0.0" in warnings[0].getMessage()
