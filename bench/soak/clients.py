"""The soak's clients (`bench/soak/run.py`): polite, disruptive and hostile, all against 127.0.0.1 only.

Every client is an asyncio task that loops until its deadline (or its request count) and records
one outcome per request in a `Recorder`. Outcomes:

| outcome | meaning | counts as a server error |
|---|---|---|
| `ok` | answered as expected: complete, well-formed audio / events, or the expected 4xx refusal | no |
| `cancelled` | the client meant to leave early (cancel, disconnect) and did | no |
| `rate_limited` | 429 (every slot busy, or the per-client cap) | no |
| `accepted` | a hostile request answered 200 (it was within what the server takes) | no |
| `closed` | a malformed exchange the server ended by closing the connection | no |
| `http_5xx` | any 5xx status | **yes** |
| `dropped` | the connection ended before a request that should have been answered was | **yes** |
| `server_error_event` | an SSE or WebSocket `error` event of type `server_error` | **yes** |
| `timeout` | no (complete) answer within the request timeout | **yes** |
| `bad_response` | an answer that breaks the documented protocol (bad audio head, no `done`, 422, ...) | finding |
| `unexpected_status` | a status other than the documented one (not 5xx) | finding |
| `reset_on_upload` | an oversized body whose connection was reset while it was still being sent, so its early 413 \
never reached the client | finding |

Nothing here ever connects anywhere but `HOST`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import socket
import struct
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import httpx

from bench.common import LATENCY_TEXTS, TEXT

HOST = "127.0.0.1"  # the only address the soak ever talks to
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
ERROR_OUTCOMES = ("http_5xx", "dropped", "server_error_event", "timeout")
FINDING_OUTCOMES = ("bad_response", "unexpected_status", "reset_on_upload")
VOICES = ("ryan", "aiden", "serena", "vivian", "alloy", "nova", "echo", "ash")
FRAME_BYTES_PCM = 1920 * 2  # one 80 ms frame at 24 kHz, s16


@dataclass
class Target:
    port: int
    model: str  # the served model's id
    max_frames: int = 12
    timeout_s: float = 120.0  # one request, start to end

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{HOST}:{self.port}/v1/ws"


@dataclass
class Recorder:
    """Outcome counts per client kind, first-audio times, and the details of every error/finding."""

    t0: float = field(default_factory=time.monotonic)
    counts: dict = field(default_factory=lambda: defaultdict(Counter))
    ttfa: dict = field(default_factory=lambda: defaultdict(list))
    events: list = field(default_factory=list)  # errors and findings (capped)
    client_exceptions: list = field(default_factory=list)  # bugs of the soak itself
    max_events: int = 200

    def record(self, kind: str, outcome: str, *, ttfa: float | None = None, request: str = "",
               detail: str = "") -> None:
        self.counts[kind][outcome] += 1
        if ttfa is not None and outcome == "ok":
            self.ttfa[kind].append(ttfa)
        if outcome in ERROR_OUTCOMES + FINDING_OUTCOMES and len(self.events) < self.max_events:
            self.events.append({"t_s": round(time.monotonic() - self.t0, 2), "kind": kind, "outcome": outcome,
                                "request": request[:600], "detail": detail[:1500]})

    def total(self, outcomes: tuple[str, ...]) -> int:
        return sum(c[o] for c in self.counts.values() for o in outcomes)


# -- checks ---------------------------------------------------------------------------------------

def audio_head_ok(fmt: str, data: bytes, max_frames: int | None, speed: float = 1.0) -> str | None:
    """None when `data` looks like a whole `fmt` file; else what is wrong."""
    if not data:
        return "empty body"
    if fmt == "pcm":
        if len(data) % 2:
            return f"odd pcm length {len(data)}"
        if max_frames and len(data) > max_frames * FRAME_BYTES_PCM / min(speed, 1.0) + 4096:
            return f"pcm longer than max_frames allows ({len(data)} bytes)"
        return None
    heads = {"wav": (b"RIFF",), "flac": (b"fLaC",), "opus": (b"OggS",), "mp3": (b"ID3", b"\xff\xfb", b"\xff\xf3",
                                                                                b"\xff\xf2", b"\xff\xe3")}
    if fmt == "aac":
        return None if len(data) > 1 and data[0] == 0xFF and data[1] & 0xF0 == 0xF0 else f"no ADTS sync: {data[:8]!r}"
    if fmt == "mp3" and len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0:
        return None
    if not data.startswith(heads[fmt]):
        return f"bad {fmt} head {data[:12]!r}"
    if fmt == "wav" and data[8:12] != b"WAVE":
        return f"bad wav head {data[:12]!r}"
    return None


def exception_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _body_text(data: bytes) -> str:
    return data[:800].decode("utf-8", "replace")


def error_type(data: bytes) -> str | None:
    try:
        return json.loads(data)["error"]["type"]
    except Exception:
        return None


def polite_body(target: Target, rng: random.Random, fmt: str, **extra) -> dict:
    body = {"model": rng.choice([target.model, target.model, "tts-1", "gpt-4o-mini-tts"]),
            "input": rng.choice(LATENCY_TEXTS), "voice": rng.choice(VOICES), "response_format": fmt,
            "max_frames": target.max_frames, "seed": rng.randrange(1 << 30)}
    if rng.random() < 0.25:
        body["speed"] = rng.choice([0.75, 1.25, 1.5])
    if rng.random() < 0.2:
        body["language"] = "english"
    if rng.random() < 0.1:
        body["instructions"] = "Speak calmly."
    body.update(extra)
    return body


def probe_body(target: Target) -> dict:
    """The fixed request whose first-audio time is compared unloaded vs under load."""
    return {"model": target.model, "input": TEXT, "voice": "ryan", "response_format": "pcm",
            "language": "english", "seed": 1, "max_frames": target.max_frames}


# -- HTTP speech over httpx ------------------------------------------------------------------------

@dataclass
class HTTPResult:
    status: int | None = None
    headers: dict = field(default_factory=dict)
    first_s: float | None = None  # request sent -> first body byte (200 only)
    data: bytes = b""
    complete: bool = False
    error: str | None = None  # transport problem (dropped, timeout)
    timed_out: bool = False


async def http_speech(client: httpx.AsyncClient, target: Target, *, body: dict | None = None,
                      content: bytes | None = None, headers: dict | None = None, pause_after_first: float = 0.0,
                      close_after_bytes: int | None = None, keep: int = 1 << 22) -> HTTPResult:
    """POST /v1/audio/speech and read the answer as it streams (raw bytes)."""
    res = HTTPResult()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    payload = content if content is not None else json.dumps(body).encode()
    start = time.perf_counter()
    try:
        async with asyncio.timeout(target.timeout_s):
            async with client.stream("POST", f"{target.base}/v1/audio/speech", content=payload,
                                     headers=hdrs) as r:
                res.status, res.headers = r.status_code, dict(r.headers)
                got = 0
                async for piece in r.aiter_raw():
                    if not piece:
                        continue
                    if res.first_s is None:
                        res.first_s = time.perf_counter() - start
                        if pause_after_first:
                            await asyncio.sleep(pause_after_first)
                    got += len(piece)
                    if len(res.data) < keep:
                        res.data += piece[:keep - len(res.data)]
                    if close_after_bytes is not None and got >= close_after_bytes:
                        return res  # leaving the block closes the response mid-stream
                res.complete = True
    except TimeoutError:
        res.timed_out, res.error = True, f"no complete answer within {target.timeout_s:.0f} s"
    except httpx.HTTPError as e:
        res.error = exception_text(e)
    return res


def describe(body: dict | None, content: bytes | None = None) -> str:
    if body is not None:
        short = {k: (v[:60] + f"...({len(v)} chars)" if isinstance(v, str) and len(v) > 80 else v)
                 for k, v in body.items()}
        return "POST /v1/audio/speech " + json.dumps(short, ensure_ascii=True)[:500]
    return f"POST /v1/audio/speech raw {content[:120]!r}" + (f"...({len(content)} bytes)" if content and
                                                               len(content) > 120 else "")


def classify_http(rec: Recorder, kind: str, res: HTTPResult, request: str, *, fmt: str | None,
                  max_frames: int | None, speed: float = 1.0, meant_to_leave: bool = False) -> str:
    """Record one speech answer that should have been 200 with audio."""
    if res.status is not None and res.status >= 500:
        outcome, detail = "http_5xx", f"{res.status}: {_body_text(res.data)}"
    elif res.status == 429:
        outcome, detail = "rate_limited", ""
    elif res.timed_out:
        outcome, detail = "timeout", res.error or ""
    elif res.error is not None and not meant_to_leave:
        outcome, detail = "dropped", f"status {res.status}, {len(res.data)} bytes, {res.error}"
    elif res.status != 200:
        outcome, detail = "unexpected_status", f"{res.status}: {_body_text(res.data)}"
    elif meant_to_leave and not res.complete:
        outcome, detail = "cancelled", ""
    else:
        problem = audio_head_ok(fmt, res.data, max_frames, speed) if fmt else None
        outcome, detail = ("bad_response", problem) if problem else ("ok", "")
    rec.record(kind, outcome, ttfa=res.first_s if not meant_to_leave else None, request=request, detail=detail)
    return outcome


async def respect_retry_after(res: HTTPResult, cap: float = 2.0) -> None:
    if res.status == 429:
        try:
            wait = float(res.headers.get("retry-after", "1"))
        except ValueError:
            wait = 1.0
        await asyncio.sleep(min(max(wait, 0.2), cap))


# -- SSE -----------------------------------------------------------------------------------------

async def sse_speech(client: httpx.AsyncClient, target: Target, body: dict, rec: Recorder, kind: str,
                     leave_after_deltas: int | None = None) -> None:
    request = describe(body)
    start = time.perf_counter()
    first, deltas, done, status, events = None, 0, None, None, []
    try:
        async with asyncio.timeout(target.timeout_s):
            async with client.stream("POST", f"{target.base}/v1/audio/speech", json=body) as r:
                status = r.status_code
                if status != 200:
                    data = await r.aread()
                    res = HTTPResult(status=status, data=data, headers=dict(r.headers))
                    classify_http(rec, kind, res, request, fmt=None, max_frames=None)
                    await respect_retry_after(res)
                    return
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    if not line.startswith("data: "):
                        rec.record(kind, "bad_response", request=request, detail=f"non-data SSE line {line[:200]!r}")
                        return
                    event = json.loads(line[6:])
                    events.append(event.get("type"))
                    if done is not None:
                        rec.record(kind, "bad_response", request=request, detail=f"event after done: {line[:200]}")
                        return
                    if event.get("type") == "speech.audio.delta":
                        base64.b64decode(event["audio"], validate=True)
                        deltas += 1
                        if first is None:
                            first = time.perf_counter() - start
                        if leave_after_deltas is not None and deltas >= leave_after_deltas:
                            rec.record(kind, "cancelled")
                            return
                    elif event.get("type") == "speech.audio.done":
                        done = event
                    elif event.get("type") == "error":
                        etype = (event.get("error") or {}).get("type")
                        rec.record(kind, "server_error_event" if etype == "server_error" else "bad_response",
                                   request=request, detail=line[:800])
                        return
                    else:
                        rec.record(kind, "bad_response", request=request, detail=f"unknown event {line[:200]}")
                        return
    except TimeoutError:
        rec.record(kind, "timeout", request=request, detail=f"{deltas} deltas, events {events[-3:]}")
        return
    except (httpx.HTTPError, ValueError) as e:
        rec.record(kind, "dropped" if isinstance(e, httpx.HTTPError) else "bad_response", request=request,
                   detail=f"{deltas} deltas; {exception_text(e)}")
        return
    if done is None or not deltas or "usage" not in done:
        rec.record(kind, "bad_response", request=request, detail=f"{deltas} deltas, done={done}")
    else:
        rec.record(kind, "ok", ttfa=first)


# -- OpenAI SDK ----------------------------------------------------------------------------------

async def sdk_speech(sdk, target: Target, rng: random.Random, rec: Recorder, kind: str,
                     leave_after_bytes: int | None = None) -> None:
    import openai

    fmt = rng.choice(FORMATS)
    body = polite_body(target, rng, fmt)
    extra = {k: body.pop(k) for k in ("max_frames", "seed", "language") if k in body}
    request = "openai SDK audio.speech " + json.dumps({**body, "extra_body": extra})
    res = HTTPResult()
    start = time.perf_counter()
    try:
        async with asyncio.timeout(target.timeout_s):
            async with sdk.audio.speech.with_streaming_response.create(extra_body=extra, **body) as resp:
                res.status = resp.status_code
                async for piece in resp.iter_bytes():
                    if not piece:
                        continue
                    if res.first_s is None:
                        res.first_s = time.perf_counter() - start
                    res.data += piece
                    if leave_after_bytes is not None and len(res.data) >= leave_after_bytes:
                        break
                else:
                    res.complete = True
    except TimeoutError:
        res.timed_out, res.error = True, "timeout"
    except openai.APIStatusError as e:
        res.status, res.data = e.status_code, (e.response.text if e.response is not None else str(e)).encode()
        res.headers = dict(e.response.headers) if e.response is not None else {}
    except (openai.APIConnectionError, openai.APIError) as e:
        res.error = exception_text(e)
    except Exception as e:  # httpx2 transport errors raised from iter_bytes
        res.error = exception_text(e)
    classify_http(rec, kind, res, request, fmt=fmt, max_frames=target.max_frames, speed=body.get("speed", 1.0),
                  meant_to_leave=leave_after_bytes is not None)
    await respect_retry_after(res)


# -- WebSocket -----------------------------------------------------------------------------------

def ws_connect(target: Target, **kw):
    from websockets.asyncio.client import connect

    return connect(target.ws_url, proxy=None, open_timeout=20, close_timeout=5, max_size=1 << 24, **kw)


async def ws_recv_json(ws, timeout: float, skip_codes: tuple = ("no_active_stream", "stream_closed")) -> dict:
    """The next JSON event (binary frames before it are skipped); stale benign errors skipped."""
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                continue
            event = json.loads(msg)
            if event.get("type") == "error" and (event.get("error") or {}).get("code") in skip_codes:
                continue
            return event


async def ws_utterance(ws, target: Target, rng: random.Random, *, fmt: str = "pcm", leave: str | None = None,
                       cancel_after_audio: bool = False) -> tuple[str, str, float | None]:
    """One live-text utterance on an open socket: (outcome, detail, first audio s from first text).

    leave: None, or where to drop the socket ("after_started", "after_text", "after_audio")."""
    start = {"type": "start", "voice": rng.choice(VOICES), "format": fmt, "max_frames": target.max_frames,
             "seed": rng.randrange(1 << 30)}
    if rng.random() < 0.2:
        start["language"] = "english"
    await ws.send(json.dumps(start))
    event = await ws_recv_json(ws, target.timeout_s)
    if event.get("type") == "error":
        err = event.get("error") or {}
        if err.get("code") in ("queue_full", "rate_limited") or err.get("type") == "rate_limit_error":
            return "rate_limited", "", None
        return (("server_error_event" if err.get("type") == "server_error" else "unexpected_status"),
                json.dumps(event), None)
    if event.get("type") != "started":
        return "bad_response", f"expected started, got {event}", None
    if leave == "after_started":
        return "leave", "", None
    text = rng.choice(LATENCY_TEXTS)
    done = asyncio.Event()
    sent_at: list[float] = []

    async def sender() -> None:
        i = 0
        while i < len(text) and not done.is_set():
            n = rng.randint(1, 5)
            await ws.send(json.dumps({"type": "text", "text": text[i:i + n]}))
            if not sent_at:
                sent_at.append(time.perf_counter())
            i += n
            await asyncio.sleep(rng.uniform(0.01, 0.06))
        if not done.is_set():
            await ws.send('{"type":"stop"}')

    async def receiver() -> tuple[str, str, float | None]:
        first, nbytes, head = None, 0, b""
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                if first is None:
                    first = time.perf_counter() - (sent_at[0] if sent_at else time.perf_counter())
                    if cancel_after_audio:
                        await ws.send('{"type":"cancel"}')
                nbytes += len(msg)
                if len(head) < 64:
                    head += msg[:64]
                continue
            event = json.loads(msg)
            kind = event.get("type")
            if kind == "error":
                err = event.get("error") or {}
                if err.get("type") == "server_error":
                    done.set()
                    return "server_error_event", json.dumps(event), None
                if err.get("code") in ("no_active_stream", "stream_closed"):
                    continue  # a text/stop that crossed max_frames' end: benign
                done.set()
                return "bad_response", f"unexpected error event {json.dumps(event)}", None
            if kind == "done":
                done.set()
                reason = event.get("finish_reason")
                if cancel_after_audio and reason in ("cancelled", "eos", "max_frames", "budget"):
                    return "cancelled", "", None
                if reason not in ("eos", "max_frames", "budget"):
                    return "bad_response", f"done with {reason}: {json.dumps(event)}", None
                if nbytes == 0 and reason != "eos":
                    return "bad_response", f"no audio before done: {json.dumps(event)}", None
                problem = audio_head_ok(fmt, head, None) if nbytes and fmt != "pcm" else None
                return ("bad_response", problem, None) if problem else ("ok", "", first)
            return "bad_response", f"unexpected event {msg[:300]}", None

    if leave in ("after_text", "after_audio"):
        await ws.send(json.dumps({"type": "text", "text": text[:12]}))
        if leave == "after_audio":
            async with asyncio.timeout(target.timeout_s):
                while not isinstance(await ws.recv(), bytes):
                    pass
        return "leave", "", None
    async with asyncio.timeout(target.timeout_s):
        send_task = asyncio.ensure_future(sender())
        try:
            result = await receiver()
        finally:
            done.set()
            await asyncio.gather(send_task, return_exceptions=True)
    return result


async def ws_session(target: Target, rng: random.Random, rec: Recorder, kind: str, utterances: int = 2) -> None:
    """A polite socket: a few utterances in a row, each in a random format."""
    request = "WS /v1/ws live text"
    try:
        async with ws_connect(target) as ws:
            for _ in range(utterances):
                fmt = rng.choice(FORMATS)
                outcome, detail, first = await ws_utterance(ws, target, rng, fmt=fmt)
                rec.record(kind, outcome, ttfa=first, request=f"{request} ({fmt})", detail=detail)
                if outcome == "rate_limited":
                    await asyncio.sleep(1.0)
                if outcome not in ("ok", "rate_limited"):
                    return
    except TimeoutError:
        rec.record(kind, "timeout", request=request, detail="no done within the request timeout")
    except Exception as e:  # ConnectionClosed, OSError
        rec.record(kind, "dropped", request=request, detail=exception_text(e))


# -- raw sockets (disconnects at chosen stages, malformed HTTP) ------------------------------------

async def raw_exchange(target: Target, data: bytes, *, read_until: str = "status", pause: float = 0.0,
                       rst: bool = False, timeout: float = 30.0) -> tuple[bytes, str]:
    """Send `data` on a fresh connection, read until `read_until` ("nothing", "status", "body",
    "eof"), then close (with an RST when `rst`). Returns (bytes read, how it ended)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, target.port), 10)
    got, ended = b"", "closed by client"
    try:
        if data:
            writer.write(data)
            await writer.drain()
        if pause:
            await asyncio.sleep(pause)
        if read_until != "nothing":
            async with asyncio.timeout(timeout):
                while True:
                    piece = await reader.read(65536)
                    if not piece:
                        ended = "closed by server"
                        break
                    got += piece
                    if read_until == "status" and b"\r\n" in got:
                        break
                    if read_until == "body" and b"\r\n\r\n" in got and len(got.split(b"\r\n\r\n", 1)[1]) > 0:
                        break
    except TimeoutError:
        ended = "timeout"
    except (ConnectionError, OSError) as e:
        ended = f"reset ({type(e).__name__})"
    finally:
        if rst:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 5)
        except (TimeoutError, ConnectionError, OSError):
            pass
    return got, ended


def http_request_bytes(target: Target, body: bytes, *, content_length: int | None = None,
                       extra: str = "", path: str = "/v1/audio/speech") -> bytes:
    length = len(body) if content_length is None else content_length
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}:{target.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n")
    return head.encode() + body


def status_of(raw: bytes) -> int | None:
    try:
        return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/") else None
    except (IndexError, ValueError):
        return None
