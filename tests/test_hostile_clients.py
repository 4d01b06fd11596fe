"""Hostile clients next to polite ones (Reliability issue, item 11).

One real uvicorn server (a key set; a CustomVoice and a Base tiny model; a temporary voices
folder). While polite clients stream (the OpenAI SDK, SSE over httpx, a WebSocket, plain httpx),
hostile ones send every class of bad input, disconnect at every stage, stop reading, hold idle
sockets and flood the queue. Each hostile request must get a clean answer: a 4xx (429 included)
in OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`, or a complete 200; never a
5xx, never a cut-off body. The polite streams' audio must equal what each got alone on the same
server while it was quiet (deterministic engine profile, fixed seeds, pcm). Afterwards nothing is
left: every engine idle, no WebSocket, connection, stream place or voice job left, no thread
beyond the baseline (pool workers within their pools' sizes), no temporary file in the voices
folder.

Each client connects from its own loopback address (127.0.0.N): the server's per-client caps see
separate clients without any proxy header. No assertion measures time: conditions are awaited
with a bound (`wait_until`), and the server's timeouts are set small so that they end what they
must end quickly.

Problems are collected (`tests/hostile.py` `Audit`) and reported together at the end of each test,
each with its request and the server's answer.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import soundfile
from websockets.exceptions import ConnectionClosed

from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.voicebank.store import VoiceStore

from api import ModelRegistry, ServerConfig, create_app
from api.limits import ServerLimits
from api.testing import ServerThread
from tests.hostile import (
    KEY,
    TIMEOUT,
    VERBOSE,
    Audit,
    RawReader,
    expect,
    http_client,
    ip,
    raw_exchange,
    raw_socket,
    request_bytes,
    reset,
    sdk_client,
    short,
    sse_audio,
    wait_until,
    ws_next,
    ws_open,
    ws_send,
    ws_until_done,
)
from tests.test_cli_voices import speechlike

MAX_STREAMS = 4
MAX_PENDING = 16
PER_CLIENT = MAX_STREAMS // 2  # ServerLimits.requests_per_client's default
SAMPLES_PER_FRAME = 1920
LIMITS = ServerLimits(ws_idle_timeout_s=1.0, header_timeout_s=2.0, body_timeout_s=2.0, max_upload_bytes=300_000,
                      send_timeout_s=300.0)
"""Small timeouts end idle sockets, sessions and bodies quickly; the send timeout is long, so a
stalled reader stays stalled (its stream paused) for as long as a test holds it."""
ENGINE = EngineSettings(threads=1, deterministic=True, max_streams=MAX_STREAMS, max_pending=MAX_PENDING,
                        max_buffered_audio_s=2.0)
LONG_TEXT = ("This sentence is long enough that the engine would speak for a good while if nobody stopped it, "
             "which is exactly what a disconnecting client should do. ") * 4
HUGE_TEXT = (LONG_TEXT * 8)[:4000]
"""Text that would keep a stream busy for thousands of frames: a stream that was not cancelled
when its client left would hold its place far past the bounded waits that check it ended."""
OVERFLOW_INSTRUCTIONS = "\U0001F600" * 4000
"""4000 characters (within the 4096 allowed), one text token each: more than one stream's context
(n_ctx / max_streams = 2048 cells in the deterministic profile; the test checks)."""


# -- the server ------------------------------------------------------------------------------------


@dataclass
class Served:
    server: ServerThread
    registry: ModelRegistry
    voices_dir: Path
    solos: dict[str, bytes]
    baseline: set[threading.Thread]


@dataclass(frozen=True)
class Polite:
    """A well-behaved client: one request, read at once, same seed every time."""

    name: str
    address: str
    text: str
    voice: str
    seed: int
    frames: int

    def body(self, **extra) -> dict:
        return {"model": "tts-1", "input": self.text, "voice": self.voice, "response_format": "pcm",
                "seed": self.seed, "max_frames": self.frames, **extra}

    def run(self, server: ServerThread) -> bytes:
        return getattr(self, f"_{self.name}")(server)

    def _sdk(self, server: ServerThread) -> bytes:
        client, http = sdk_client(server, self.address)
        with http, client.audio.speech.with_streaming_response.create(
                model="tts-1", input=self.text, voice=self.voice, response_format="pcm",
                extra_body={"seed": self.seed, "max_frames": self.frames}) as response:
            return b"".join(response.iter_bytes())

    def _sse(self, server: ServerThread) -> bytes:
        with http_client(server, self.address) as http, \
                http.stream("POST", "/v1/audio/speech", json=self.body(stream_format="sse")) as response:
            text = response.read().decode()
            assert response.status_code == 200, f"{response.status_code} {short(text)}"
        audio, events = sse_audio(text)
        assert events and events[-1]["type"] == "speech.audio.done", short(text)
        return audio

    def _ws(self, server: ServerThread) -> bytes:
        with ws_open(server, self.address) as ws:
            # everything at once (messages are handled in order): no pause for the idle timeout to end
            ws_send(ws, type="start", voice=self.voice, seed=self.seed, max_frames=self.frames, format="pcm")
            for i in range(0, len(self.text), 3):
                ws_send(ws, type="text", text=self.text[i:i + 3])
            ws_send(ws, type="stop")
            audio, events = ws_until_done(ws)
        assert [e["type"] for e in events] == ["started", "done"], events
        assert events[-1]["finish_reason"] in ("eos", "max_frames"), events
        return audio

    def _http(self, server: ServerThread) -> bytes:
        with http_client(server, self.address) as http:
            response = http.post("/v1/audio/speech", json=self.body())
        assert response.status_code == 200, f"{response.status_code} {short(response.content)}"
        return response.content


POLITE = (
    Polite("sdk", ip(10), "Polite client one reads the news aloud.", "ryan", 101, 18),
    Polite("sse", ip(11), "Polite client two streams its events.", "serena", 102, 16),
    Polite("ws", ip(12), "Polite client three types live text.", "vivian", 103, 14),
    Polite("http", ip(13), "Polite client four asks plainly.", "aiden", 104, 20),
)


@pytest.fixture(scope="module")
def served(converted_factory, tmp_path_factory):
    voices_dir = tmp_path_factory.mktemp("hostile-voices")
    registry = ModelRegistry.load([converted_factory("tiny_cv", "f32"), converted_factory("tiny_base", "f32")],
                                  ENGINE)
    app = create_app(ServerConfig(api_key=KEY, webui_dir=None, voices_dir=voices_dir, limits=LIMITS), registry)
    try:
        with ServerThread(app) as server:
            # accepted sockets inherit the listener's buffer sizes: a client that stops reading stalls
            # the server's send within a few frames, not after megabytes of kernel buffer
            server.server.servers[0].sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            solos = {p.name: p.run(server) for p in POLITE}  # alone, on a quiet server
            for p in POLITE:
                assert 0 < len(solos[p.name]) <= p.frames * SAMPLES_PER_FRAME * 2, p
            yield Served(server, registry, voices_dir, solos, set(threading.enumerate()))
    finally:
        registry.close()


# -- what "nothing left" means ----------------------------------------------------------------------


def idle(engine) -> bool:
    load = engine.load()
    return (load["active"], load["waiting"], load["waiting_text"], load["paused"], load["free_slots"]) == \
        (0, 0, 0, 0, engine.settings.max_streams)


def extra_threads(s: Served) -> list[str]:
    """Threads alive now that were not before, other than idle workers of the server's bounded pools
    (each pool within its size)."""
    app = s.server.app
    pools = {
        "qtts-encode": app.state.qtts.encoder_pool._max_workers,
        "qtts-voice": LIMITS.voice_workers,
        "qwen3-tts-prompts": len(s.registry.models),
        "asyncio_": min(32, (os.cpu_count() or 1) + 4),  # the event loop's default executor (to_thread)
        "AnyIO worker thread": 40,  # starlette's run_in_threadpool (form files); idle ones end by themselves
    }
    alive = [t for t in threading.enumerate() if t.is_alive()]
    problems = []
    for t in alive:
        if t not in s.baseline and not any(t.name.startswith(prefix) for prefix in pools):
            problems.append(f"thread {t.name!r} (daemon={t.daemon})")
    counts = Counter(next((p for p in pools if t.name.startswith(p)), None) for t in alive)
    problems += [f"{counts[p]} {p!r} threads, more than its pool's {n}" for p, n in pools.items() if counts[p] > n]
    return problems


def leftovers(s: Served, audit: Audit) -> None:
    """Record in `audit` everything a test left behind (after waiting, bounded, for it to go)."""
    app = s.server.app

    def settled(what: str, check, timeout_s: float = 30.0) -> None:
        try:
            wait_until(check, what, timeout_s)
        except AssertionError as e:
            audit.problem("cleanup", str(e))

    for model in s.registry.models:
        settled(f"the engine of {model.id} to be idle (load: see below)", lambda m=model: idle(m.engine))
        if not idle(model.engine):
            audit.problem("cleanup", f"{model.id} load {model.engine.load()}")
    settled("every WebSocket to close", lambda: getattr(getattr(app.state, "qtts_sockets", None), "total", 0) == 0)
    settled("every client's stream places to be given back", lambda: not app.state.client_limiter._held)
    if app.state.client_limiter._held:
        audit.problem("cleanup", f"stream places still held: {dict(app.state.client_limiter._held)}")
    settled("every voice job to end", lambda: app.state.voice_jobs.jobs == 0)
    settled("every connection to close", lambda: not s.server.server.server_state.connections)
    settled("no threads beyond the baseline", lambda: not extra_threads(s))
    for problem in extra_threads(s):
        audit.problem("cleanup", problem)
    temps = [p.name for p in s.voices_dir.iterdir() if p.name.startswith(".") or p.suffix != ".json"]
    if temps:
        audit.problem("cleanup", f"files left in the voices folder: {temps}")
    stored = {p.stem for p in s.voices_dir.glob("*.json")}
    if stored != set(VoiceStore(s.voices_dir).list()):
        audit.problem("cleanup", f"voice files that are no readable profile: {stored} vs "
                                 f"{VoiceStore(s.voices_dir).list()}")


def server_errors(s: Served) -> Counter:
    """5xx responses by (route, status), as the server counted them (also those no client saw)."""
    values = s.server.app.state.qtts.metrics.requests.values
    return Counter({(dict(k).get("path"), dict(k).get("status")): v for k, v in values.items()
                    if str(dict(k).get("status", "")).startswith("5")})


def server_faults(s: Served, audit: Audit, before: Counter, caplog) -> None:
    """Record 5xx answers the server counted since `before`, and every ERROR it logged."""
    for (path, status), n in (server_errors(s) - before).items():
        audit.problem("server", f"{n:g} responses with status {status} on {path} (the server's own count)")
    for record in caplog.records:
        if record.levelno >= logging.ERROR:
            exc = f" ({record.exc_info[0].__name__}: {record.exc_info[1]})" if record.exc_info else ""
            audit.problem("server log", f"{record.name}: {short(record.getMessage(), 200)}{exc}")


def test_the_server_starts_clean(served):
    """The baseline: the solo runs left nothing behind."""
    audit = Audit()
    leftovers(served, audit)
    audit.assert_clean()


# -- hostile HTTP requests: bad input of every class -----------------------------------------------


BASE = {"model": "tts-1", "input": "Hostile input.", "voice": "ryan", "response_format": "pcm", "max_frames": 2}
DROP = object()


def with_(**changes) -> dict:
    body = dict(BASE)
    for name, value in changes.items():
        if value is DROP:
            body.pop(name, None)
        else:
            body[name] = value
    return body


def raw_json(**literals: str) -> bytes:
    """BASE with fields whose JSON text is given literally (NaN, Infinity, huge numbers, ...)."""
    text = json.dumps(BASE)[:-1]
    for name, literal in literals.items():
        text += f', "{name}": {literal}'
    return (text + "}").encode()


def bad_input_cases(cells_per_stream: int) -> list[tuple[str, dict, object]]:
    """(label, httpx request arguments, Expect): every class of bad input on the speech route."""
    cases: list[tuple[str, dict, object]] = []

    def post(label, want, body=None, content=None, headers=None, path="/v1/audio/speech", method="POST",
             auth: str | bytes | None = f"Bearer {KEY}"):
        args = {"method": method, "url": path, "headers": {"Connection": "close", **(headers or {})}}
        if auth is not None:
            args["headers"]["Authorization"] = auth
        if body is not None:
            args["json"] = body
        if content is not None:
            args["content"] = content
            args["headers"].setdefault("Content-Type", "application/json")
        cases.append((label, args, want))

    # malformed JSON, bodies that are no object, bytes that are no UTF-8
    for raw in (b'{"model": "tts-1", "input": ', b'{"model":"tts-1",}', b"{'model': 'tts-1'}", b'{"a":1}{"b":2}',
                b'{"input": "\\x41"}', b"[" * 100_000 + b"]" * 100_000):
        post(f"bad JSON {short(raw, 40)!r}", expect(400, code="invalid_json"), content=raw)
    post("a 5000-digit seed (past Python's int parsing limit)", expect(400, code=("invalid_json", "invalid_value")),
         content=raw_json(seed="9" * 5000))
    post("empty body", expect(400), content=b"")
    for raw in (b"[]", b"null", b'"speak this"', b"42", b"true"):
        post(f"JSON {raw!r} instead of an object", expect(400, code=("invalid_value", "invalid_json"), param=None),
             content=raw)
    for raw in (b'{"model":"tts-1","input":"\xff\xfe","voice":"ryan"}', b'{"\xc3\x28":1,"model":"tts-1"}',
                b'{"model":"tts-1","input":"\xc0\xaf\xed\xa0\x80","voice":"ryan"}'):
        post(f"invalid UTF-8 {raw!r}", expect(400, code="invalid_json"), content=raw)
    post("a lone surrogate escape in input", expect(400, param="input"),
         content=b'{"model":"tts-1","input":"\\ud800","voice":"ryan"}')
    post("UTF-16 body with a BOM", expect(200, 400), content=json.dumps(BASE).encode("utf-16"))
    post("UTF-8 BOM before the JSON", expect(200, 400), content=b"\xef\xbb\xbf" + json.dumps(BASE).encode())

    # wrong types
    for name, value in (("top_p", False), ("top_p", True), ("top_p", "0.5"), ("max_frames", 2.0), ("max_frames", "2"),
                        ("max_frames", True), ("temperature", "hot"), ("temperature", [0.5]),
                        ("temperature", {"v": 1}), ("seed", 1.5), ("seed", "1"), ("seed", False), ("speed", "1.0"),
                        ("speed", True), ("top_k", 2.5), ("top_k", "40"), ("repetition_penalty", "1.1"),
                        ("voice", 42), ("voice", ["ryan"]), ("voice", {"id": "ryan", "x": 1}), ("voice", {"id": 5}),
                        ("voice", None), ("input", 42), ("input", ["a"]), ("input", None), ("model", 7),
                        ("model", None), ("response_format", "ogg"), ("response_format", 1), ("stream_format", "ws"),
                        ("language", 5), ("text_mode", "fast"), ("instructions", 5), ("instructions", ["x"])):
        post(f"{name}={value!r}", expect(400, code="invalid_value", param=name), with_(**{name: value}))
    for name in ("model", "input", "voice"):
        post(f"no {name}", expect(400, code="missing_required_parameter", param=name), with_(**{name: DROP}))

    # NaN and Infinity literals (Python's json reads them)
    for name, literal in (("temperature", "NaN"), ("top_p", "Infinity"), ("speed", "-Infinity"),
                          ("repetition_penalty", "NaN"), ("max_frames", "NaN"), ("seed", "Infinity"),
                          ("top_k", "-Infinity"), ("temperature", "1e999"), ("speed", "-1e999")):
        post(f"{name}: {literal}", expect(400, param=name), content=raw_json(**{name: literal}))

    # out of range
    for name, value in (("temperature", 1e308), ("temperature", 100.5), ("temperature", -1.0), ("temperature", -1e-300),
                        ("top_k", -1), ("top_k", 1_000_001), ("top_k", 2**63), ("top_k", 10**30),
                        ("top_p", 1.0000001), ("top_p", -1e-9), ("top_p", 2.0), ("repetition_penalty", 0.0),
                        ("repetition_penalty", -1.0), ("repetition_penalty", 0.001), ("repetition_penalty", 1e9),
                        ("repetition_penalty", 100.1), ("max_frames", 0), ("max_frames", -1), ("max_frames", 6001),
                        ("max_frames", 10**20), ("seed", -1), ("seed", 2**63), ("seed", 2**64), ("speed", 0.0),
                        ("speed", 0.24), ("speed", 4.01), ("speed", 1e308), ("speed", -1.0)):
        post(f"{name}={value!r}", expect(400, code="invalid_value", param=name), with_(**{name: value}))
    # extreme but in the domain: served whole, or refused cleanly
    for changes in ({"temperature": 5e-324}, {"temperature": 1e-300}, {"temperature": 100.0}, {"temperature": -0.0},
                    {"top_k": 1}, {"top_k": 1_000_000}, {"top_k": 0}, {"top_p": 5e-324}, {"top_p": 0.0},
                    {"top_p": 1.0}, {"repetition_penalty": 0.01}, {"repetition_penalty": 100.0},
                    {"temperature": 100.0, "top_k": 1_000_000, "top_p": 1.0, "repetition_penalty": 0.01},
                    {"seed": 0}, {"seed": 2**63 - 1}, {"speed": 0.25}, {"speed": 4.0}, {"max_frames": 1}):
        post(f"extreme {changes}", expect(200, 400), with_(**changes))

    # blank and odd input
    for text in ("", " ", "\n\t\r", "\u3000\u2028", "\x85\xa0"):
        post(f"blank input {text!r}", expect(400, param="input"), with_(input=text))
    for text in ("\u200b", "\x00\x01\x02", "\ufeff", "\u202e\u202d", "\U0001F600" * 50, "a\u0301" * 200):
        post(f"odd input {text[:6]!r}", expect(200, 400), with_(input=text))

    # too long, and a prompt that cannot fit the context
    post("input of 4097 characters", expect(400, code="string_above_max_length", param="input"),
         with_(input="x" * 4097))
    post("instructions of 4097 characters", expect(400, code="string_above_max_length", param="instructions"),
         with_(instructions="x" * 4097))
    post("model id of 257 characters", expect(400, param="model"), with_(model="m" * 257))
    post("voice of 257 characters", expect(400, param="voice"), with_(voice="v" * 257))
    post("language of 33 characters", expect(400, param="language"), with_(language="l" * 33))
    post(f"instructions past the context ({cells_per_stream} cells per stream)",
         expect(400, code="context_length_exceeded"), with_(instructions=OVERFLOW_INSTRUCTIONS))

    # unknown fields with odd names: ignored, and no header is broken or injected
    odd = {"ünknown": 1, "名前": 2, "x\r\nX-Injected: yes": 3, "a\x00b": 4, "": 5, "k" * 5000: 6, "\u2028": 7,
           "stream": True}
    post("unknown fields with odd names", expect(200), with_(**odd))

    # sizes
    post("a 2 MiB body", expect(413, code="payload_too_large"), with_(input="x" * (2 * 1024 * 1024)))

    def chunks():
        data = json.dumps(with_(input="x" * (2 * 1024 * 1024))).encode()
        for i in range(0, len(data), 65536):
            yield data[i:i + 65536]

    post("a 2 MiB chunked body", expect(413, code="payload_too_large"), content=chunks())

    # methods and paths
    for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS"):
        post(f"{method} /v1/audio/speech", expect(405, code="method_not_allowed", allow="POST"), method=method)
    for method in ("POST", "PUT", "DELETE"):
        post(f"{method} /v1/models", expect(405, code="method_not_allowed", allow="GET"), method=method,
             path="/v1/models", content=b"{}")
    post("POST /v1/audio/voices/x", expect(405, code="method_not_allowed", allow="DELETE"),
         path="/v1/audio/voices/x", content=b"{}")
    for path in ("/v1/nope", "/v1/audio/speech/more", "/v2/audio/speech", "/v1/audio/speech%00"):
        post(f"POST {path}", expect(404, code="not_found"), path=path, content=json.dumps(BASE).encode())
    post("GET /v1/ws without an upgrade", expect(400, 404, 405, 426), method="GET", path="/v1/ws")

    # unknown model and voice
    post("model gpt-5", expect(404, code="model_not_found", param="model"), with_(model="gpt-5"))
    post("model ''", expect(400, 404, param="model"), with_(model=""))
    for voice in ("nobody", {"id": "nobody"}, "../../etc/passwd", "ryan\x00", "..", "/etc/passwd"):
        post(f"voice {voice!r}", expect(400, 404, param="voice"), with_(voice=voice))

    # keys, hosts, origins, content types
    for label, auth in (("no key", None), ("wrong key", "Bearer wrong"), ("Basic auth", "Basic Zm9vOmJhcg=="),
                        ("a bare Bearer", "Bearer"), ("key plus a byte", f"Bearer {KEY}x"),
                        ("an 8000-byte key", "Bearer " + "k" * 8000),
                        ("a Latin-1 key", "Bearer cl\xe9".encode("latin-1"))):
        post(label, expect(401, code="invalid_api_key", www_authenticate="Bearer"), BASE, auth=auth)
    post("wrong key on GET /v1/models", expect(401, code="invalid_api_key"), method="GET", path="/v1/models",
         auth="Bearer nope")
    post("Host evil.example", expect(400, code="host_not_allowed"), BASE, headers={"Host": "evil.example"})
    post("a cross-site Origin", expect(403, code="origin_not_allowed"), BASE,
         headers={"Origin": "http://evil.example"})
    post("Sec-Fetch-Site: cross-site", expect(403, code="origin_not_allowed"), BASE,
         headers={"Sec-Fetch-Site": "cross-site"})
    post("JSON sent as text/plain", expect(200, 400, 415), content=json.dumps(BASE).encode(),
         headers={"Content-Type": "text/plain"})
    post("a urlencoded form", expect(400, 415), content=b"model=tts-1&input=hi&voice=ryan",
         headers={"Content-Type": "application/x-www-form-urlencoded"})
    post("a multipart form", expect(400, 415), content=b"--b\r\nContent-Disposition: form-data; name=\"input\"\r\n\r\n"
         b"hi\r\n--b--\r\n", headers={"Content-Type": "multipart/form-data; boundary=b"})
    return cases


AUTH = f"Authorization: Bearer {KEY}\r\n".encode()
FRAMING = (
    ("Content-Length: abc", b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n" + AUTH +
     b"Content-Length: abc\r\n\r\n{}"),
    ("two Content-Lengths", b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n" + AUTH +
     b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
    ("chunked and Content-Length (smuggling)", b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n" + AUTH +
     b"Content-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("a header line without a colon", b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + AUTH +
     b"no colon here\r\n\r\n"),
    ("a garbage request line", b"GARBAGE\r\n\r\n"),
    ("a bad chunk size", b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n" + AUTH +
     b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
    ("a bad chunk size, no key", b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
     b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
    ("a 100 KB URL (served or refused)", b"GET /v1/models?" + b"q" * 100_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
     AUTH + b"\r\n"),
    ("a 200 KB header", b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + AUTH + b"X-Big: " + b"a" * 200_000 +
     b"\r\n\r\n"),
)
"""Requests that break HTTP/1.1 framing (with the right key, so the framing is what is judged)."""


def validation_barrage(s: Served, audit: Audit) -> None:
    """Every bad-input class, one after another (with the right key, from one address)."""
    cells = s.registry.default.model.talker.cells_per_stream
    tokens = len(s.registry.default.model.prompts.text_ids(OVERFLOW_INSTRUCTIONS))
    if tokens <= cells:
        audit.problem("context overflow", f"the test's instructions ({tokens} tokens) fit {cells} cells: "
                                          "make them longer")
    with http_client(s.server, ip(66), key=None) as http:
        for label, args, want in bad_input_cases(cells):
            response = audit.httpx(label, lambda a=args: http.request(**a), want)
            if response is None or response.status_code != 200 or args["url"] != "/v1/audio/speech":
                continue
            if "x-injected" in response.headers:
                audit.problem(label, f"a header was injected: {dict(response.headers)}")
            sent = args.get("json") or BASE
            frames, speed = sent.get("max_frames") or BASE["max_frames"], sent.get("speed") or 1.0
            if not response.content or len(response.content) % 2 or \
                    len(response.content) > frames * SAMPLES_PER_FRAME * 2 / speed + 4096:  # (atempo's rounding)
                audit.problem(label, f"{len(response.content)} bytes of pcm for max_frames {frames}, speed {speed}")
    port = s.server.port
    for label, data in FRAMING:
        audit.raw(f"malformed HTTP: {label}", audit.guard(label, lambda d=data: raw_exchange(port, ip(66), d)),
                  expect(200, 400, 414, 431) if "URL" in label else expect(400, 413, 431))
    audit.raw("HTTP/1.0 without Host", audit.guard("HTTP/1.0", lambda: raw_exchange(
        port, ip(66), b"GET /v1/models HTTP/1.0\r\n" + AUTH + b"\r\n")), expect(400, code="host_not_allowed"))
    # a Content-Length far past the cap, no body sent: answered at once, from the header
    data = request_bytes("POST", "/v1/audio/speech", headers={"Content-Length": "1000000000000"}, content_length=False)
    audit.raw("Content-Length: 10^12", audit.guard("Content-Length: 10^12", lambda: raw_exchange(port, ip(66), data)),
              expect(413, code="payload_too_large"))
    data = request_bytes("POST", "/v1/audio/speech", headers={"Content-Length": "9" * 40}, content_length=False)
    audit.raw("Content-Length: 9*40", audit.guard("Content-Length: 9*40", lambda: raw_exchange(port, ip(66), data)),
              expect(400, 413))


def sdk_hostiles(s: Served, audit: Audit) -> None:
    """The real OpenAI SDK sending what it should not; its errors carry the envelope."""

    def call(label, fn, want, key=KEY):
        client, http = sdk_client(s.server, ip(67), key)
        with http:
            try:
                result = fn(client)
            except openai.APIStatusError as e:
                audit.response(label, e.status_code, e.response.headers, e.response.content, want)
                return
            except openai.APIError as e:
                audit.problem(label, f"no answer: {type(e).__name__}: {e}")
                return
        audit.response(label, 200, {}, result, want)
        if label.endswith("SSE"):
            audio, events = sse_audio(result.decode())
            if not events or events[-1].get("type") != "speech.audio.done" or not audio:
                audit.problem(label, f"an SSE body without audio or its done event: {short(result)}")
        elif not result or len(result) % 2:
            audit.problem(label, f"{len(result)} bytes of pcm")

    def speak(**kwargs):
        args = {"model": "tts-1", "input": "Hostile SDK.", "voice": "ryan", "response_format": "pcm",
                "extra_body": {"max_frames": 2}}
        args.update(kwargs)
        return lambda client: client.audio.speech.create(**args).content

    call("SDK: wrong key", speak(), expect(401, code="invalid_api_key"), key="wrong")
    call("SDK: model gpt-5", speak(model="gpt-5"), expect(404, code="model_not_found", param="model"))
    call("SDK: voice nobody", speak(voice="nobody"), expect(400, param="voice"))
    call("SDK: blank input", speak(input="   "), expect(400, param="input"))
    call("SDK: speed 100", speak(speed=100), expect(400, param="speed"))
    call("SDK: response_format ogg", speak(response_format="ogg"), expect(400, param="response_format"))
    call("SDK: temperature 'hot'", speak(extra_body={"temperature": "hot", "max_frames": 2}),
         expect(400, param="temperature"))
    call("SDK: top_k -1", speak(extra_body={"top_k": -1, "max_frames": 2}), expect(400, param="top_k"))
    call("SDK: instructions past the context", speak(instructions=OVERFLOW_INSTRUCTIONS),
         expect(400, code="context_length_exceeded"))
    call("SDK: input of 4097 characters", speak(input="y" * 4097), expect(400, code="string_above_max_length"))
    call("SDK: odd extra fields", speak(extra_body={"max_frames": 3, "名前": 1, "x\r\ny": 2, "stream": True}),
         expect(200))
    call("SDK: SSE", lambda client: client.audio.speech.create(
        model="tts-1", input="Hostile SSE.", voice="ryan", response_format="pcm", stream_format="sse",
        extra_body={"max_frames": 2}).content, expect(200))


# -- disconnects at every stage, stalled readers, idle sockets ---------------------------------------


def speech_request(frames: int = 6000, sse: bool = False, text: str = HUGE_TEXT, key: str | None = KEY) -> bytes:
    body = {"model": "tts-1", "input": text, "voice": "ryan", "response_format": "pcm", "seed": 5,
            "max_frames": frames}
    if sse:
        body["stream_format"] = "sse"
    return request_bytes("POST", "/v1/audio/speech", json.dumps(body).encode(), key=key)


def disconnects(s: Served, audit: Audit) -> None:
    """Clients that leave at every stage of an HTTP request (FIN and RST); they get nothing, the
    server must free whatever they held: each one's stream (thousands of frames long) must end,
    giving back its place, before the next one starts (and `leftovers` checks the rest)."""
    port, me = s.server.port, ip(70)
    full = speech_request()
    head, body = full.split(b"\r\n\r\n", 1)
    head += b"\r\n\r\n"

    limiter = s.server.app.state.client_limiter

    def leave(label, send: bytes, *, read: str = "nothing", rst: bool = False):
        def run():
            # the streams of earlier leavers end (asynchronously) before this one needs a place
            wait_until(lambda: limiter.held(me) == 0, "the client's earlier streams to end")
            sock = raw_socket(port, me)
            try:
                if send:
                    sock.sendall(send)
                reader = RawReader(sock)
                if read in ("head", "body", "event"):
                    got = reader.head()
                    if got is None:
                        audit.problem(label, "the server closed the connection without an answer")
                        return
                    if got[0] != 200:
                        audit.problem(label, f"expected 200 before leaving, got {got[0]} {short(reader.some_body(1))}")
                        return
                if read == "body":
                    reader.some_body(8192)
                if read == "event":
                    while b"\n\n" not in reader.buf and reader._fill():
                        pass
            finally:
                reset(sock) if rst else sock.close()
        audit.guard(label, run)

    leave("connect and close", b"")
    leave("connect and reset", b"", rst=True)
    leave("half a request head", head[:30])
    leave("head, then close before the body", head)
    leave("head, then reset before the body", head, rst=True)
    leave("half the body, then close", head + body[:len(body) // 2])
    leave("half the body, then reset", head + body[:len(body) // 2], rst=True)
    chunked = head.replace(b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked")
    leave("a chunked body cut mid-chunk", chunked + b"%x\r\n" % len(body) + body[:20])
    expect_continue = head.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n")
    leave("Expect: 100-continue, then close", expect_continue)
    leave("the whole request, then close at once (queued or starting)", full)
    leave("the whole request, then reset at once", full, rst=True)
    leave("close right after the headers", full, read="head")
    leave("reset right after the headers", full, read="head", rst=True)
    leave("close mid-stream (audio)", full, read="body")
    leave("reset mid-stream (audio)", full, read="body", rst=True)
    leave("close mid-stream (SSE)", speech_request(sse=True), read="event")
    leave("reset mid-stream (SSE)", speech_request(sse=True), read="event", rst=True)
    leave("close right after the headers (SSE)", speech_request(sse=True), read="head")
    leave("two pipelined requests, close after the first head", full + full, read="head")
    audit.guard("the last leaver's stream", lambda: wait_until(lambda: limiter.held(me) == 0,
                                                               "the client's last stream to end"))


def idle_sockets(s: Served, audit: Audit) -> None:
    """HTTP connections that send nothing, half a head, or half a body, and never close: the
    server's head and body timeouts end them (a 408 envelope where a request was under way)."""
    port, me = s.server.port, ip(71)
    full = speech_request(frames=4)
    head, body = full.split(b"\r\n\r\n", 1)
    head += b"\r\n\r\n"

    def answered_then_closed(label, sock, want, idle: str) -> None:
        """Read the answer `want` describes (if any), then wait for the server to close `sock`."""
        reader = RawReader(sock)
        if want is not None:
            got = reader.head()
            if got is None:
                audit.problem(label, "closed without the expected answer")
                return
            status, _, headers = got
            data, complete = reader.body(headers)
            audit.response(label, status, headers, data, want, complete)
        try:
            while reader._fill():
                pass
        except TimeoutError:
            audit.problem(label, f"the server never closed {idle}")

    def closed_by_server(label, send: bytes, want=None):
        def run():
            with raw_socket(port, me, timeout=TIMEOUT) as sock:
                if send:
                    sock.sendall(send)
                answered_then_closed(label, sock, want, f"the idle connection ({TIMEOUT:g} s)")
        audit.guard(label, run)

    def trickle(label, first: bytes, data: bytes, want=None):
        """Send `first`, then `data` a byte every 0.2 s (each one would reset a naive timer) until
        the server ends it."""
        def run():
            with raw_socket(port, me, timeout=TIMEOUT) as sock:
                deadline = time.monotonic() + TIMEOUT
                sock.sendall(first)
                for byte in data:
                    try:
                        sock.sendall(bytes([byte]))
                    except OSError:
                        break  # closed by the server
                    if time.monotonic() > deadline:
                        audit.problem(label, f"the server took the trickle for {TIMEOUT:g} s")
                        return
                    sock.settimeout(0.2)
                    try:
                        if sock.recv(1, socket.MSG_PEEK) == b"":
                            break  # closed by the server
                        break  # an answer came
                    except TimeoutError:
                        pass
                    except OSError:
                        break
                sock.settimeout(TIMEOUT)
                answered_then_closed(label, sock, want, "the connection")
        audit.guard(label, run)

    with ThreadPoolExecutor(7) as pool:
        pool.submit(trickle, "a request head trickled a byte at a time", b"", head * 4)
        pool.submit(trickle, "a body trickled a byte at a time", head, body * 4, expect(408, code="request_timeout"))
        for args in (("an idle connection", b""),
                     ("half a head, held", head[:40]),
                     ("a head and half the body, held", head + body[:10], expect(408, code="request_timeout")),
                     ("Expect: 100-continue, no body, held",
                      head.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"),
                      expect(408, code="request_timeout")),
                     ("a kept-alive connection left idle",
                      request_bytes("GET", "/v1/models"), expect(200))):
            pool.submit(closed_by_server, *args)


def start_stalled(s: Served, address: str, *, sse: bool = False, rst: bool = False) -> socket.socket:
    """A client that reads the response head and then nothing more (a tiny receive buffer)."""
    sock = raw_socket(s.server.port, address, rcvbuf=4096)
    body = {"model": "tts-1", "input": LONG_TEXT, "voice": "uncle_fu", "response_format": "pcm", "seed": 9,
            "max_frames": 3000}
    if sse:
        body["stream_format"] = "sse"
    sock.sendall(request_bytes("POST", "/v1/audio/speech", json.dumps(body).encode()))
    head = RawReader(sock).head()
    assert head is not None and head[0] == 200, head
    return sock


# -- floods ------------------------------------------------------------------------------------------


def floods(s: Served, audit: Audit) -> None:
    """One client at its cap (two stalled streams of ip(60)) floods: every request is refused with
    429 `client_limit`. Another floods from nothing: each request is served whole or refused with a
    429. (`Retry-After` on every 429.)"""
    speak = {"model": "tts-1", "input": "Flood!", "voice": "sohee", "response_format": "pcm", "max_frames": 6}

    def one(label, address, want, via_sdk):
        if via_sdk:
            client, http = sdk_client(s.server, address)
            with http:
                try:
                    data = client.audio.speech.create(model="tts-1", input="Flood!", voice="sohee",
                                                      response_format="pcm", extra_body={"max_frames": 6}).content
                except openai.APIStatusError as e:
                    audit.response(label, e.status_code, e.response.headers, e.response.content, want)
                    return
            audit.response(label, 200, {}, data, want)
        else:
            with http_client(s.server, address) as http:
                audit.httpx(label, lambda: http.post("/v1/audio/speech", json=speak), want)

    at_cap = expect(429, code="client_limit", retry_after="")
    anything = expect(200, 429, code=("client_limit", "queue_full"), retry_after="")
    for address, want, n in ((ip(60), at_cap, 12), (ip(78), anything, 10)):
        barrier = threading.Barrier(n)

        def go(i, address=address, want=want, barrier=barrier):
            barrier.wait(timeout=TIMEOUT)
            one(f"flood from {address} #{i} ({'SDK' if i % 2 else 'httpx'})", address, want, bool(i % 2))

        with ThreadPoolExecutor(n) as pool:
            list(pool.map(go, range(n)))


# -- WebSockets --------------------------------------------------------------------------------------


def closed_code(ws) -> int | None:
    """Read (audio discarded) until the server closes; its close code."""
    try:
        while True:
            ws.recv(timeout=TIMEOUT)
    except ConnectionClosed:
        return ws.close_code
    except TimeoutError:
        return None


def ws_hostiles(s: Served, audit: Audit) -> None:
    server, me = s.server, ip(80)
    limiter = server.app.state.client_limiter

    def places_back() -> None:
        """This client's earlier sessions (dropped ones included) have ended and given back their
        stream places: a new start is not refused for the per-client cap."""
        wait_until(lambda: limiter.held(me) == 0, "the client's earlier sessions to end")

    def refused(label, code, close, **kwargs):
        def run():
            with ws_open(server, me, **kwargs) as ws:
                audit.ws_error(label, ws_next(ws), code)
                if (got := closed_code(ws)) != close:
                    audit.problem(label, f"expected close code {close}, got {got}")
        audit.guard(label, run)

    refused("WS: no key", "invalid_api_key", 1008, key=None)
    refused("WS: wrong key", "invalid_api_key", 1008, key="wrong")
    refused("WS: a cross-site Origin", "origin_not_allowed", 1008, origin="http://evil.example")

    def open_and_leave(rst: bool):
        ws = ws_open(server, me)
        ws.close_socket() if rst else ws.close()

    audit.guard("WS: open and close", lambda: open_and_leave(False))
    audit.guard("WS: open and drop", lambda: open_and_leave(True))

    def garbage():
        places_back()
        with ws_open(server, me) as ws:
            def bad(label, send, code, param=...):
                ws.send(send)
                audit.ws_error(f"WS: {label}", ws_next(ws), code, param)

            bad("not JSON", "not json", "invalid_json")
            bad("deep nesting", "[" * 60_000, "invalid_json")  # (within the 64 KiB message cap)
            bad("binary", b"\x00\xff", "unsupported_message")
            bad("a JSON array", "[1]", "invalid_value", "type")
            bad("an unknown type", '{"type": "speak"}', "invalid_value", "type")
            bad("type null", '{"type": null}', "invalid_value", "type")
            bad("text before start", '{"type": "text", "text": "hi"}', "no_active_stream")
            bad("stop before start", '{"type": "stop"}', "no_active_stream")
            bad("start with temperature NaN", '{"type":"start","voice":"ryan","temperature":NaN}', "invalid_value",
                "temperature")
            bad("start with top_p Infinity", '{"type":"start","voice":"ryan","top_p":Infinity}', "invalid_value",
                "top_p")
            bad("start with max_frames 2.0", '{"type":"start","voice":"ryan","max_frames":2.0}', "invalid_value",
                "max_frames")
            bad("start with top_p false", '{"type":"start","voice":"ryan","top_p":false}', "invalid_value", "top_p")
            bad("start with repetition_penalty 0", '{"type":"start","voice":"ryan","repetition_penalty":0}',
                "invalid_value", "repetition_penalty")
            bad("start with voice nobody", '{"type":"start","voice":"nobody"}', "invalid_value", "voice")
            bad("start with model gpt-5", '{"type":"start","voice":"ryan","model":"gpt-5"}', "model_not_found", "model")
            bad("start with a format both ways",
                '{"type":"start","voice":"ryan","format":"pcm","response_format":"wav"}', "invalid_value")
            bad("start with instructions past the context",
                json.dumps({"type": "start", "voice": "ryan", "instructions": OVERFLOW_INSTRUCTIONS}),
                "context_length_exceeded")
            # a start with odd unknown fields works; then bad texts, then cancel
            ws_send(ws, **{"type": "start", "voice": "ryan", "max_frames": 400, "名前": 1, "x\r\ny": 2, "": 3})
            started = ws_next(ws)
            if not (isinstance(started, dict) and started.get("type") == "started"):
                audit.problem("WS: start with odd fields", f"expected started, got {short(repr(started))}")
                return
            bad("a second start", '{"type":"start","voice":"ryan"}', "stream_active")
            bad("text 42", '{"type":"text","text":42}', "invalid_value", "text")
            bad("text missing", '{"type":"text"}', "missing_required_parameter", "text")
            bad("5000 characters of text", json.dumps({"type": "text", "text": "z" * 5000}), "string_above_max_length",
                "text")
            ws_send(ws, type="cancel")
            _, events = ws_until_done(ws)
            if events[-1].get("finish_reason") != "cancelled" or len(events) != 1:
                audit.problem("WS: cancel", f"expected one done (cancelled), got {events}")
        # (leaving the `with` closes it)

    audit.guard("WS: garbage", garbage)

    def idle_session(label, deltas: tuple[str, ...]):
        def run():
            places_back()
            with ws_open(server, me) as ws:
                ws_send(ws, type="start", voice="ryan", max_frames=400)
                started = ws_next(ws)
                if not (isinstance(started, dict) and started.get("type") == "started"):
                    audit.problem(label, f"expected started, got {short(repr(started))}")
                    return
                events: list[dict] = []
                deadline = time.monotonic() + TIMEOUT
                i = 0
                while not events or events[-1].get("type") != "done":
                    if time.monotonic() > deadline:
                        audit.problem(label, f"the idle session was never ended ({TIMEOUT:g} s; "
                                             f"ws_idle_timeout_s={LIMITS.ws_idle_timeout_s})")
                        return
                    if deltas:
                        ws_send(ws, type="text", text=deltas[i % len(deltas)])
                        i += 1
                    try:
                        message = ws.recv(timeout=0.05)
                    except TimeoutError:
                        continue
                    if isinstance(message, str):
                        events.append(json.loads(message))
                done = events[-1]
                if done.get("finish_reason") != "cancelled" or done.get("limit") != "idle_timeout" \
                        or done.get("idle_timeout") is not True:
                    audit.problem(label, f"expected done cancelled by idle_timeout, got {done}")
                for e in events[:-1]:  # blank deltas racing the end: refused as late text, nothing else
                    audit.ws_error(label, e, ("stream_closed", "no_active_stream"))
        audit.guard(label, run)

    idle_session("WS: start, then nothing", ())
    idle_session("WS: start, then only empty deltas", ("", " ", "\n", "\t "))

    def leave(label, after: str, rst: bool):
        def run():
            places_back()
            ws = ws_open(server, me)
            try:
                ws_send(ws, type="start", voice="ryan", max_frames=6000)
                if not (isinstance(started := ws_next(ws), dict) and started.get("type") == "started"):
                    audit.problem(label, f"expected started, got {short(repr(started))}")
                    return
                if after in ("text", "audio", "stop"):
                    ws_send(ws, type="text", text=HUGE_TEXT)
                if after == "stop":
                    ws_send(ws, type="stop")
                if after in ("audio", "stop"):
                    if not isinstance(first := ws_next(ws), bytes):
                        audit.problem(label, f"expected audio, got {short(repr(first))}")
            finally:
                ws.close_socket() if rst else ws.close()
        audit.guard(label, run)

    leave("WS: leave after started", "started", False)
    leave("WS: drop after started", "started", True)
    leave("WS: leave after text, before audio", "text", False)
    leave("WS: drop mid-stream", "audio", True)
    leave("WS: leave mid-stream", "audio", False)
    leave("WS: drop after stop, before done", "stop", True)

    def too_big():
        places_back()
        with ws_open(server, me) as ws:
            ws_send(ws, type="start", voice="ryan", max_frames=400)
            if not (isinstance(started := ws_next(ws), dict) and started.get("type") == "started"):
                audit.problem("WS: a 70 KiB message", f"expected started, got {short(repr(started))}")
                return
            ws.send(json.dumps({"type": "text", "text": "q" * (70 * 1024)}))
            audit.ws_error("WS: a 70 KiB message", ws_next(ws), "payload_too_large")
            if (got := closed_code(ws)) != 1009:
                audit.problem("WS: a 70 KiB message", f"expected close code 1009, got {got}")

    audit.guard("WS: a 70 KiB message", too_big)

    def too_many():
        crowd = []
        try:
            for _ in range(LIMITS.max_sockets_per_client):
                ws = ws_open(server, ip(81))
                crowd.append(ws)
                ws_send(ws, type="stop")  # admitted: answered with no_active_stream
                audit.ws_error("WS: admitted socket", ws_next(ws), "no_active_stream")
            extra = ws_open(server, ip(81))
            crowd.append(extra)
            audit.ws_error("WS: one socket too many", ws_next(extra), "too_many_sockets")
            if (got := closed_code(extra)) != 1013:
                audit.problem("WS: one socket too many", f"expected close code 1013, got {got}")
        finally:
            for ws in crowd:
                ws.close()

    audit.guard("WS: sockets per client", too_many)


# -- voice uploads -----------------------------------------------------------------------------------


def wav(seconds: float, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, speechlike(seconds, 24000, seed), 24000, format="WAV")
    return buf.getvalue()


def multipart_request(fields: dict[str, str], clip: bytes | None, boundary: str = "hostileboundary") -> bytes:
    parts = [f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode()
             for k, v in fields.items()]
    if clip is not None:
        parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"audio_sample\"; filename=\"c.wav\"\r\n"
                     "Content-Type: audio/wav\r\n\r\n".encode() + clip + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return request_bytes("POST", "/v1/audio/voices", body, content_type=f"multipart/form-data; boundary={boundary}")


def voice_hostiles(s: Served, audit: Audit) -> None:
    """Voice uploads that are malformed, too big, racing, or abandoned; the voices folder keeps
    complete profiles only."""
    clip = wav(1.5)
    busy_ok = (429,)  # one voice worker and a short queue: a busy server may refuse with 429

    with http_client(s.server, ip(90)) as http:
        def create(label, want, name="hostile_ok", files=None, **fields):
            files = {"audio_sample": ("c.wav", clip, "audio/wav")} if files is None else files
            return audit.httpx(label, lambda: http.post("/v1/audio/voices", data={"name": name, **fields},
                                                        files=files or None, headers={"Connection": "close"}), want)

        for name in ("../evil", ".hidden", "a/b", "名前", "x" * 65, "con\x00", "a..b"):
            create(f"voice name {name[:12]!r}", expect(400, *busy_ok), name=name)
        create("voice without a name", expect(400, *busy_ok), name="")
        create("voice without audio or instructions", expect(400, code="missing_required_parameter"), files={})
        create("voice from garbage bytes", expect(400, *busy_ok, param="audio_sample"),
               files={"audio_sample": ("c.wav", b"not audio at all " * 64, "audio/wav")})
        create("voice from 0.1 s", expect(400, *busy_ok, param="audio_sample"),
               files={"audio_sample": ("c.wav", wav(0.1), "audio/wav")})
        create("voice over the upload cap", expect(413, code="payload_too_large"),
               files={"audio_sample": ("c.wav", wav(10.0), "audio/wav")})
        create("voice with instructions but no VoiceDesign model", expect(400, *busy_ok, param="instructions"),
               files={}, instructions="a calm voice")
        create("voice with an unknown model", expect(400, 404, *busy_ok), model="gpt-5")
        audit.httpx("malformed multipart", lambda: http.post(
            "/v1/audio/voices", content=b"--x\r\nnot a form",
            headers={"Content-Type": "multipart/form-data; boundary=x", "Connection": "close"}),
            expect(400, code="invalid_form"))
        audit.httpx("multipart without a boundary", lambda: http.post(
            "/v1/audio/voices", content=b"--x\r\n\r\n", headers={"Content-Type": "multipart/form-data",
                                                                  "Connection": "close"}), expect(400))
        audit.httpx("JSON to the voices route", lambda: http.post(
            "/v1/audio/voices", json={"name": "j"}, headers={"Connection": "close"}), expect(400, 415))

        made = create("a valid voice", expect(200, *busy_ok))
        if made is not None and made.status_code == 200:
            create("the same name again", expect(409, code="voice_exists"))
            audit.httpx("delete it", lambda: http.delete("/v1/audio/voices/hostile_ok"), expect(200))
            audit.httpx("delete it again", lambda: http.delete("/v1/audio/voices/hostile_ok"),
                        expect(404, code="voice_not_found"))
        for path in ("/v1/audio/voices/..%2F..%2Fetc%2Fpasswd", "/v1/audio/voices/%2e%2e", "/v1/audio/voices/.hidden",
                     "/v1/audio/voices/" + "n" * 300):
            audit.httpx(f"DELETE {path[:40]}", lambda p=path: http.delete(p), expect(400, 404))

        # three creates of one name at once: at most one wins; the others 409 (or 429: busy)
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda i: create(f"racing create #{i}", expect(200, 409, *busy_ok), name="race"),
                                    range(3)))
        if sum(1 for r in results if r is not None and r.status_code == 200) > 1:
            audit.problem("racing creates", "more than one create of 'race' succeeded: "
                                            f"{[r.status_code for r in results if r]}")

    port = s.server.port

    def abandon(label, data: bytes, rst: bool = False):
        def run():
            sock = raw_socket(port, ip(91))
            sock.sendall(data)
            reset(sock) if rst else sock.close()
        audit.guard(label, run)

    upload = multipart_request({"name": "leaver"}, clip)
    abandon("voice upload: close mid-upload", upload[:len(upload) // 2])
    abandon("voice upload: reset mid-upload", upload[:len(upload) // 2], rst=True)
    abandon("voice upload: close right after the upload", upload)

    def slow_upload():  # half an upload, held: the body timeout answers 408
        with raw_socket(port, ip(92)) as sock:
            sock.sendall(multipart_request({"name": "slowpoke"}, clip)[:2000])
            reader = RawReader(sock)
            got = reader.head()
            if got is None:
                audit.problem("voice upload: held half-way", "closed without an answer")
                return
            data, complete = reader.body(got[2])
            audit.response("voice upload: held half-way", got[0], got[2], data, expect(408, code="request_timeout"),
                           complete)

    audit.guard("voice upload: held half-way", slow_upload)
    # what the abandoned or racing uploads may have saved goes (complete profiles only)
    wait_until(lambda: s.server.app.state.voice_jobs.jobs == 0, "the voice jobs to end")
    with http_client(s.server, ip(90)) as http:
        for name in VoiceStore(s.voices_dir).list():
            audit.httpx(f"delete {name}", lambda n=name: http.delete(f"/v1/audio/voices/{n}"), expect(200))


# -- the tests ---------------------------------------------------------------------------------------


HOSTILES = (validation_barrage, sdk_hostiles, disconnects, idle_sockets, floods, ws_hostiles, voice_hostiles)


def test_hostile_clients_get_clean_answers_while_polite_streams_match_solo(served, caplog):
    """Four polite clients repeat their requests (each must equal its solo audio) for as long as
    every hostile script runs beside them: bad input, disconnects, idle and trickling sockets,
    floods, WebSocket abuse, voice-upload abuse; three stalled readers hold streams throughout.
    No 5xx (counted by the server too), no ERROR in its log, every refusal in the envelope, and
    nothing left afterwards."""
    s, audit = served, Audit()
    errors_before = server_errors(s)
    engine = s.registry.default.engine
    # one client (ip 60) holds its two stream places with readers that stopped reading
    stalled = [start_stalled(s, ip(60)), start_stalled(s, ip(60), sse=True)]
    # and a live session whose client reads nothing (a tiny receive buffer, a one-message queue)
    stalled_ws = ws_open(s.server, ip(61), rcvbuf=4096, max_queue=1, ping_interval=None)
    ws_send(stalled_ws, type="start", voice="sohee", max_frames=3000)
    ws_send(stalled_ws, type="text", text=LONG_TEXT)
    ws_send(stalled_ws, type="stop")
    hostile_done = threading.Event()
    heard: dict[str, list[bytes]] = {p.name: [] for p in POLITE}

    def polite_loop(p: Polite) -> None:
        rounds = 0
        while rounds < 2 or (not hostile_done.is_set() and rounds < 40):
            try:
                heard[p.name].append(p.run(s.server))
            except Exception as e:  # noqa: BLE001 - a polite failure is a problem, reported with the rest
                audit.problem(f"polite {p.name}", f"round {rounds}: {type(e).__name__}: {short(str(e))}")
            rounds += 1

    try:
        with ThreadPoolExecutor(len(POLITE) + len(HOSTILES)) as pool:
            polite = [pool.submit(polite_loop, p) for p in POLITE]
            hostile = [pool.submit(audit.guard, job.__name__, lambda job=job: job(s, audit)) for job in HOSTILES]
            for future in hostile:
                future.result()
            hostile_done.set()
            for future in polite:
                future.result()
        # the stalled readers never stalled anyone else; their streams wait, paused, for a reader
        try:
            wait_until(lambda: engine.load()["paused"] == len(stalled) + 1, "the stalled readers' streams to pause")
        except AssertionError as e:
            audit.problem("stalled readers", f"{e}: load {engine.load()}")
    finally:
        stalled[0].close()
        reset(stalled[1])
        stalled_ws.close_socket()
        hostile_done.set()
    if VERBOSE:
        print("POLITE rounds", {name: len(got) for name, got in heard.items()})
    for p in POLITE:
        solo = s.solos[p.name]
        for i, got in enumerate(heard[p.name]):
            if got != solo:
                audit.problem(f"polite {p.name}", f"round {i}: {len(got)} bytes differ from the solo's {len(solo)}")
        if not heard[p.name]:
            audit.problem(f"polite {p.name}", "never served")
    server_faults(s, audit, errors_before, caplog)
    leftovers(s, audit)
    audit.assert_clean()


def test_a_saturated_server_queues_refuses_and_forgets_clients_that_leave(served, caplog):
    """Every slot held by a stalled reader (paused, so the engine has nothing to do), the queue
    filled by clients that then leave: the excess is refused with 429 (`client_limit` for a client
    at its cap, `queue_full` otherwise; the SDK raises RateLimitError), the leavers' places free up,
    the next client is queued and, once the slots free, served whole."""
    s, audit = served, Audit()
    errors_before = server_errors(s)
    engine, port = s.registry.default.engine, s.server.port
    holders: list[socket.socket] = []
    queued: list[socket.socket] = []
    try:
        for i in range(MAX_STREAMS):
            holders.append(start_stalled(s, ip(100 + i // PER_CLIENT), sse=bool(i % 2)))
        wait_until(lambda: engine.load()["paused"] == MAX_STREAMS, "every slot held by a paused stream")
        # fill the queue from clients at their cap (half SSE)
        fillers = [ip(110 + i // PER_CLIENT) for i in range(MAX_PENDING)]
        for i, address in enumerate(fillers):
            sock = raw_socket(port, address)
            sock.sendall(speech_request(frames=4, sse=bool(i % 2), text="Queued."))
            queued.append(sock)
        wait_until(lambda: engine.load()["waiting"] == MAX_PENDING, "a full queue")

        client, http = sdk_client(s.server, ip(119))
        with http:
            try:
                client.audio.speech.create(model="tts-1", input="One too many.", voice="ryan", response_format="pcm",
                                           extra_body={"max_frames": 4})
                audit.problem("a full queue", "the SDK's request was served")
            except openai.RateLimitError as e:
                audit.response("a full queue (SDK)", e.status_code, e.response.headers, e.response.content,
                               expect(429, code="queue_full", retry_after=""))
            except openai.APIError as e:
                audit.problem("a full queue (SDK)", f"{type(e).__name__}: {e}")
        with http_client(s.server, fillers[0]) as http:
            audit.httpx("a client at its cap", lambda: http.post("/v1/audio/speech", json=BASE),
                        expect(429, code="client_limit", retry_after=""))

        # a live session that queues, then leaves; one that never sends text, then leaves
        def ws_queued_then_gone(with_text: bool):
            ws = ws_open(s.server, ip(120 if with_text else 121))
            try:
                ws_send(ws, type="start", voice="ryan", max_frames=4)
                started = ws_next(ws)
                if isinstance(started, dict) and started.get("type") == "error":
                    audit.ws_error("WS start on a full server", started, ("queue_full",))
                    return
                if with_text:
                    ws_send(ws, type="text", text="Hello there, queued.")
                wait_until(lambda: engine.load()["waiting"] + engine.load()["waiting_text"] > MAX_PENDING,
                           "the live session to wait")
            finally:
                ws.close_socket()

        audit.guard("WS queued, then dropped", lambda: ws_queued_then_gone(True))
        audit.guard("WS waiting for text, then dropped", lambda: ws_queued_then_gone(False))

        # everyone in the queue leaves (half FIN, half RST)
        for i, sock in enumerate(queued):
            reset(sock) if i % 2 else sock.close()
        queued.clear()
        try:
            wait_until(lambda: engine.load()["waiting"] == 0 and engine.load()["waiting_text"] == 0,
                       "the queue to empty once its clients left")
            wait_until(lambda: all(s.server.app.state.client_limiter.held(a) == 0 for a in set(fillers)),
                       "the leavers' stream places to be given back")
        except AssertionError as e:
            audit.problem("clients that left the queue", f"{e}: load {engine.load()}, places "
                                                         f"{dict(s.server.app.state.client_limiter._held)}")
        # the next client is queued (not refused), and served whole once the slots free
        late = raw_socket(port, ip(122))
        try:
            late.sendall(speech_request(frames=4, text="Finally my turn."))
            try:
                wait_until(lambda: engine.load()["waiting"] == 1, "the next client to be queued")
            except AssertionError as e:
                audit.problem("the next client", f"{e}: load {engine.load()}")
            for i, sock in enumerate(holders):
                reset(sock) if i % 2 else sock.close()
            holders.clear()
            reader = RawReader(late)
            head = reader.head()
            if head is None:
                audit.problem("the next client", "closed without an answer")
            else:
                data, complete = reader.body(head[2])
                audit.response("the next client", head[0], head[2], data, expect(200), complete)
                if head[0] == 200 and (not data or len(data) > 4 * SAMPLES_PER_FRAME * 2 or len(data) % 2):
                    audit.problem("the next client", f"{len(data)} bytes of pcm for max_frames 4")
        finally:
            late.close()
    finally:
        for sock in holders + queued:
            sock.close()
    server_faults(s, audit, errors_before, caplog)
    leftovers(s, audit)
    audit.assert_clean()
