"""The soak's load phase: polite, probe, disruptive and hostile client loops (see bench/soak/run.py).

Each loop runs until the deadline or its request cap, whichever comes first; requests in flight at
the deadline finish (bounded by the request timeout), then anything left is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx

from bench.common import LATENCY_TEXTS
from bench.soak.clients import (
    FORMATS,
    HOST,
    HTTPResult,
    Recorder,
    Target,
    classify_http,
    describe,
    error_type,
    exception_text,
    http_request_bytes,
    http_speech,
    polite_body,
    probe_body,
    raw_exchange,
    respect_retry_after,
    sdk_speech,
    sse_speech,
    status_of,
    ws_connect,
    ws_recv_json,
    ws_session,
    ws_utterance,
)

MAX_REQUESTS_PER_CLIENT_MIN = 600  # a hard cap per client: per minute of the run


async def _guard(rec: Recorder, kind: str, coro) -> None:
    """Run one request; a bug in the client is recorded (`client_exception`), never ends the loop."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception as e:
        rec.record(kind, "client_exception", request=kind, detail=exception_text(e))
        rec.client_exceptions.append(f"{kind}: {exception_text(e)}")


def _clients(port: int):
    import openai

    try:  # openai>=3 brings httpx2; older stacks use httpx (same API)
        import httpx2 as sdk_httpx
    except ImportError:
        sdk_httpx = httpx
    limits = dict(max_connections=8, max_keepalive_connections=4)
    client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(120.0, connect=10.0),
                               limits=httpx.Limits(**limits))
    sdk = openai.AsyncOpenAI(base_url=f"http://{HOST}:{port}/v1", api_key="soak", max_retries=0,
                             http_client=sdk_httpx.AsyncClient(trust_env=False, timeout=120.0,
                                                               limits=sdk_httpx.Limits(**limits)))
    return client, sdk


# -- polite ---------------------------------------------------------------------------------------

async def polite_loop(i: int, target: Target, rng: random.Random, rec: Recorder, deadline: float, cap: int,
                      client: httpx.AsyncClient, sdk) -> None:
    kinds = ("sdk", "httpx", "sse", "ws")
    n = 0
    while time.monotonic() < deadline and n < cap:
        kind = kinds[(i + n) % len(kinds)] if rng.random() < 0.7 else rng.choice(kinds)
        n += 1
        await _guard(rec, f"polite.{kind}", _polite_once(kind, target, rng, rec, client, sdk))
        await asyncio.sleep(rng.uniform(0.05, 0.5))


async def _polite_once(kind: str, target: Target, rng: random.Random, rec: Recorder, client, sdk) -> None:
    if kind == "sdk":
        await sdk_speech(sdk, target, rng, rec, "polite.sdk_audio")
    elif kind == "httpx":
        fmt = rng.choice(FORMATS)
        body = polite_body(target, rng, fmt)
        res = await http_speech(client, target, body=body)
        classify_http(rec, "polite.httpx_audio", res, describe(body), fmt=fmt, max_frames=target.max_frames,
                      speed=body.get("speed", 1.0))
        await respect_retry_after(res)
    elif kind == "sse":
        await sse_speech(client, target, polite_body(target, rng, rng.choice(FORMATS), stream_format="sse"),
                         rec, "polite.sse")
    else:
        await ws_session(target, rng, rec, "polite.ws_live", utterances=rng.randint(1, 3))


async def probe_loop(target: Target, rec: Recorder, deadline: float, cap: int, client: httpx.AsyncClient) -> None:
    """The baseline's request, again and again under load."""
    n = 0
    body = probe_body(target)
    while time.monotonic() < deadline and n < cap:
        n += 1
        res = await http_speech(client, target, body=body)
        classify_http(rec, "probe", res, describe(body), fmt="pcm", max_frames=target.max_frames)
        await respect_retry_after(res)
        await asyncio.sleep(0.5)


# -- disruptive -----------------------------------------------------------------------------------

async def disrupt_once(case: str, target: Target, rng: random.Random, rec: Recorder, client, sdk) -> None:
    kind = f"disrupt.{case}"
    body = polite_body(target, rng, rng.choice(FORMATS))
    raw_body = json.dumps(body).encode()
    if case == "httpx_close_mid_stream":
        res = await http_speech(client, target, body=body, close_after_bytes=rng.choice([1, 2000, 20000]))
        classify_http(rec, kind, res, describe(body), fmt=None, max_frames=None, meant_to_leave=True)
        await respect_retry_after(res)
    elif case == "sdk_close_mid_stream":
        await sdk_speech(sdk, target, rng, rec, kind, leave_after_bytes=rng.choice([1, 5000]))
    elif case == "sse_close_after_delta":
        body["stream_format"] = "sse"
        await sse_speech(client, target, body, rec, kind, leave_after_deltas=rng.randint(1, 2))
    elif case.startswith("raw_"):
        request = http_request_bytes(target, raw_body)
        if case == "raw_close_during_body":
            got, ended = await raw_exchange(target, request[:len(request) - len(raw_body) // 2], read_until="nothing",
                                            pause=rng.uniform(0, 0.3))
        elif case == "raw_close_while_waiting":  # request complete, leave before the first audio
            got, ended = await raw_exchange(target, request, read_until="nothing", pause=rng.uniform(0, 0.4))
        elif case == "raw_close_after_status":
            got, ended = await raw_exchange(target, request, read_until="status", timeout=target.timeout_s)
        else:  # raw_rst_mid_body
            got, ended = await raw_exchange(target, request, read_until="body", rst=True, timeout=target.timeout_s)
        status = status_of(got)
        if status is not None and status >= 500:
            rec.record(kind, "http_5xx", request=describe(body), detail=got[:600].decode("utf-8", "replace"))
        elif ended == "timeout":
            rec.record(kind, "timeout", request=describe(body), detail=f"read {len(got)} bytes")
        elif status == 429:
            rec.record(kind, "rate_limited")
        elif case in ("raw_close_after_status", "raw_rst_mid_body") and ended == "closed by server" and status != 200:
            rec.record(kind, "unexpected_status", request=describe(body), detail=got[:400].decode("utf-8", "replace"))
        else:
            rec.record(kind, "cancelled")
    elif case.startswith("ws_"):
        try:
            async with ws_connect(target) as ws:
                if case == "ws_cancel":
                    outcome, detail, _ = await ws_utterance(ws, target, rng, fmt=rng.choice(FORMATS),
                                                            cancel_after_audio=True)
                    rec.record(kind, outcome, request="WS cancel after the first audio", detail=detail)
                    if outcome == "cancelled":  # the socket must take the next utterance
                        outcome, detail, first = await ws_utterance(ws, target, rng)
                        rec.record("disrupt.ws_after_cancel", outcome, ttfa=first,
                                   request="WS utterance after a cancel", detail=detail)
                else:
                    stage = case[len("ws_leave_"):]
                    outcome, detail, _ = await ws_utterance(ws, target, rng, leave=stage)
                    if outcome != "leave":
                        rec.record(kind, outcome, request=f"WS leave {stage}", detail=detail)
                        return
                    if rng.random() < 0.5:  # no close frame: the TCP connection just ends
                        ws.transport.abort()
                    rec.record(kind, "cancelled")
        except TimeoutError:
            rec.record(kind, "timeout", request=case)
        except Exception as e:
            rec.record(kind, "dropped", request=case, detail=exception_text(e))


DISRUPT_CASES = ("httpx_close_mid_stream", "sdk_close_mid_stream", "sse_close_after_delta", "raw_close_during_body",
                 "raw_close_while_waiting", "raw_close_after_status", "raw_rst_mid_body", "ws_cancel",
                 "ws_leave_after_started", "ws_leave_after_text", "ws_leave_after_audio")


async def disrupt_loop(target: Target, rng: random.Random, rec: Recorder, deadline: float, cap: int, client,
                       sdk) -> None:
    n = 0
    while time.monotonic() < deadline and n < cap:
        case = DISRUPT_CASES[n % len(DISRUPT_CASES)] if rng.random() < 0.5 else rng.choice(DISRUPT_CASES)
        n += 1
        await _guard(rec, f"disrupt.{case}", disrupt_once(case, target, rng, rec, client, sdk))
        await asyncio.sleep(rng.uniform(0.1, 0.6))


# -- hostile --------------------------------------------------------------------------------------

def _out_of_range(model: str) -> list[tuple[str, object, tuple[int, ...]]]:
    """(field, value, statuses accepted); `raw:` values are JSON text spliced in as written."""
    return [
        ("speed", 0.1, (400,)), ("speed", 4.5, (400,)), ("speed", -1, (400,)), ("speed", "fast", (400,)),
        ("speed", None, (400,)), ("speed", "raw:NaN", (400,)), ("speed", "raw:Infinity", (400,)),
        ("speed", "raw:1e400", (400,)), ("temperature", -1, (400,)), ("temperature", 1e308, (200, 400)),
        ("top_p", 1.5, (400,)), ("top_k", -3, (400,)), ("top_k", 2 ** 63, (200, 400)),
        ("top_k", 10 ** 30, (200, 400)), ("max_frames", 0, (400,)), ("max_frames", -5, (400,)),
        ("max_frames", 1.5, (400,)), ("max_frames", 2 ** 64, (200, 400)), ("max_frames", "12", (200, 400)),
        ("seed", -1, (400,)), ("seed", 2 ** 64, (200, 400)), ("seed", 10 ** 40, (200, 400)),
        ("repetition_penalty", 0, (400,)), ("repetition_penalty", 1e308, (200, 400)),
        ("response_format", "ogg", (400,)), ("response_format", "", (400,)), ("stream_format", "chunked", (400,)),
        ("voice", "", (400, 404)), ("voice", {"id": ""}, (400,)), ("voice", {"name": "x"}, (400,)),
        ("voice", 42, (400,)), ("voice", "nobody-here", (400, 404)), ("voice", ["ryan"], (400,)),
        ("input", "", (400,)), ("input", "   \n\t", (400,)), ("input", None, (400,)), ("input", 42, (400,)),
        ("input", "x" * 4097, (400,)), ("model", "", (400,)), ("model", "no-such-model", (404,)),
        ("model", None, (400,)), ("language", "klingon", (200, 400)), ("text_mode", "fast", (400,)),
        ("instructions", "y" * 4097, (400,)), ("instructions", 7, (400,)),
        ("input", "\ud800 lone surrogate", (200, 400)), ("input", "\u0000\u0001 control", (200, 400)),
        ("voice", "raw:\"\\ud800\"", (400, 404)),
    ]


ODD_NAMES = ("", " ", "\u0000", "\r\nX-Injected: yes", "ü-ñ", "🙂", "a" * 300, "$ref", "__proto__",
             "constructor", "x-qwen3tts-model", "Content-Length", "line\nbreak", "tab\there", "é" * 50,
             "日本語", "\\", "\"quoted\"", "semi;colon,comma")


def _body_with(target: Target, field: str, value) -> bytes:
    body = {"model": target.model, "input": "Hello there.", "voice": "ryan", "response_format": "pcm",
            "max_frames": target.max_frames}
    if isinstance(value, str) and value.startswith("raw:"):
        body[field] = "@@RAW@@"
        return json.dumps(body).replace('"@@RAW@@"', value[4:]).encode()
    body[field] = value
    return json.dumps(body).encode()


async def _expect_refusal(kind: str, rec: Recorder, target: Target, client, content: bytes, accepted: tuple,
                          description: str, *, headers: dict | None = None, drop_ok: bool = False) -> None:
    res = await http_speech(client, target, content=content, headers=headers, close_after_bytes=1)
    _judge_refusal(kind, rec, res, accepted, description, drop_ok=drop_ok)


def _judge_refusal(kind: str, rec: Recorder, res: HTTPResult, accepted: tuple, description: str, *,
                   drop_ok: bool = False) -> None:
    if res.status is not None and res.status >= 500:
        rec.record(kind, "http_5xx", request=description,
                   detail=f"{res.status}: {res.data[:800].decode('utf-8', 'replace')}")
    elif res.timed_out:
        rec.record(kind, "timeout", request=description, detail=res.error or "")
    elif res.status is None:
        rec.record(kind, "closed" if drop_ok else "dropped", request=description, detail=res.error or "")
    elif res.status == 429:
        rec.record(kind, "rate_limited")
    elif res.status == 422:
        rec.record(kind, "bad_response", request=description, detail=f"422 (the API promises 400): {res.data[:400]!r}")
    elif res.status in accepted:
        if res.status >= 400 and error_type(res.data) is None:
            rec.record(kind, "bad_response", request=description, detail=f"{res.status} without the OpenAI error "
                                                                         f"envelope: {res.data[:300]!r}")
        else:
            rec.record(kind, "accepted" if res.status == 200 else "ok")
    elif res.status == 200:
        rec.record(kind, "unexpected_status", request=description,
                   detail="200: accepted a request expected to be refused")
    else:
        rec.record(kind, "unexpected_status", request=description,
                   detail=f"{res.status} (expected {accepted}): {res.data[:400].decode('utf-8', 'replace')}")


async def _slow_chunks(data: bytes, pieces: int, pause: float):
    step = max(1, len(data) // pieces)
    for i in range(0, len(data), step):
        yield data[i:i + step]
        await asyncio.sleep(pause)


async def hostile_http(case: str, target: Target, rng: random.Random, rec: Recorder, client) -> None:
    kind = f"hostile.{case}"
    if case == "bad_json":
        content = rng.choice([b'{"model": "tts-1", "input": "hi", ', b'{model: tts-1}', b'{"a":1}}', b"\x00\x01",
                              b'{"input": "hi", "voice": "ryan", "model": "tts-1",}', b"[1, 2, 3]", b'"just a string"',
                              b"null", b"123", b"{" * 50])
        await _expect_refusal(kind, rec, target, client, content, (400,), describe(None, content))
    elif case == "invalid_utf8":
        content = rng.choice([
            b'{"model":"tts-1","input":"\xff\xfe bad","voice":"ryan","max_frames":4}',
            b'{"model":"tts-1","input":"ok","voice":"ry\xc3\x28an","max_frames":4}',
            b'{"model":"tts-1","\xed\xa0\x80":"surrogate key","input":"hi","voice":"ryan","max_frames":4}',
            b'\xef\xbb\xbf{"model":"tts-1","input":"BOM first","voice":"ryan","max_frames":4}'])
        await _expect_refusal(kind, rec, target, client, content, (200, 400), describe(None, content))
    elif case == "oversized_body":
        size = rng.choice([1_100_000, 2_000_000, 5_000_000])
        content = _body_with(target, "input", "z" * size)
        desc = f"POST /v1/audio/speech, {len(content)}-byte body (input of that many characters)"
        res = await http_speech(client, target, content=content, close_after_bytes=1)
        if (res.status is None and res.error
                and res.error.startswith(("ReadError", "WriteError", "RemoteProtocolError"))):
            # the server answers 413 from Content-Length and closes; the rest of the body then meets a reset
            rec.record(kind, "reset_on_upload", request=desc, detail=res.error)
        else:
            _judge_refusal(kind, rec, res, (400, 413), desc)
    elif case == "oversized_declared":  # Content-Length far above the limit, body never sent
        request = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: {HOST}:{target.port}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {50 * 1024 * 1024}\r\n\r\n").encode() + b'{"model":'
        got, ended = await raw_exchange(target, request, read_until="status", timeout=45)
        _judge_raw(kind, rec, got, ended, (408, 413, 400), "Content-Length 50 MiB, 9 body bytes, then silence")
    elif case == "out_of_range":
        field, value, accepted = rng.choice(_out_of_range(target.model))
        content = _body_with(target, field, value)
        await _expect_refusal(kind, rec, target, client, content, accepted, describe(None, content))
    elif case == "odd_unknown_fields":
        body = polite_body(target, rng, "pcm")
        for name in rng.sample(ODD_NAMES, rng.randint(1, 4)):
            body[name] = rng.choice([1, "v", None, {"nested": [1, 2]}, "\u0000", "x" * 1000])
        content = json.dumps(body).encode()
        res = await http_speech(client, target, content=content)
        desc = "POST /v1/audio/speech with unknown fields " + json.dumps([k for k in body if k not in
                                                                         polite_body(target, random.Random(0), "pcm")])
        classify_http(rec, kind, res, desc, fmt="pcm", max_frames=target.max_frames, speed=body.get("speed", 1.0))
        if res.status == 200 and res.complete and "x-qwen3tts-ignored-fields" not in res.headers:
            rec.record(kind + ".header", "bad_response", request=desc, detail="no x-qwen3tts-ignored-fields header")
    elif case == "deep_nesting":
        depth = rng.choice([200, 5000, 100000])
        content = (b'{"model":"tts-1","input":"hi","voice":"ryan","max_frames":4,"deep":' + b"[" * depth
                   + b"]" * depth + b"}")
        await _expect_refusal(kind, rec, target, client, content, (200, 400, 413),
                              f"POST /v1/audio/speech with an unknown field nested {depth} arrays deep")
    elif case == "wrong_content_type":
        content = _body_with(target, "seed", 3)
        ctype = rng.choice(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                            "application/json; charset=latin-1", ""])
        await _expect_refusal(kind, rec, target, client, content, (200, 400, 415),
                              f"POST /v1/audio/speech, Content-Type {ctype!r}", headers={"Content-Type": ctype})
    elif case == "empty_body":
        await _expect_refusal(kind, rec, target, client, b"", (400,), "POST /v1/audio/speech, empty body")
    elif case == "chunked_request_body":  # no Content-Length, the body in pieces
        body = polite_body(target, rng, "wav")
        content = json.dumps(body).encode()
        res = await _stream_upload(client, target, _slow_chunks(content, 5, 0.05))
        classify_http(rec, kind, res, "chunked upload " + describe(body), fmt="wav", max_frames=target.max_frames,
                      speed=body.get("speed", 1.0))
    elif case == "slow_sender":  # the body trickles in over a few seconds (below the body timeout)
        body = polite_body(target, rng, "pcm")
        content = json.dumps(body).encode()
        res = await _stream_upload(client, target, _slow_chunks(content, 10, rng.uniform(0.2, 0.5)))
        classify_http(rec, kind, res, "slow upload " + describe(body), fmt="pcm", max_frames=target.max_frames,
                      speed=body.get("speed", 1.0))
    elif case == "slow_reader":  # read a little, pause, resume: the whole file must still come
        body = polite_body(target, rng, rng.choice(FORMATS))
        body["max_frames"] = target.max_frames * 2
        pause = rng.uniform(2.0, 8.0)
        res = await http_speech(client, target, body=body, pause_after_first=pause)
        classify_http(rec, kind, res, f"{describe(body)}, reader pauses {pause:.1f} s after the first bytes",
                      fmt=body["response_format"], max_frames=body["max_frames"], speed=body.get("speed", 1.0))
    elif case == "wrong_method_or_path":
        method, path, accepted = rng.choice([("GET", "/v1/audio/speech", (405,)), ("PUT", "/v1/audio/speech", (405,)),
                                             ("POST", "/v1/audio/nope", (404,)), ("DELETE", "/v1/models", (405,)),
                                             ("GET", "/v1/models/%00%ff", (404, 400)),
                                             ("GET", "/v1/models/" + "m" * 5000, (404, 414, 400)),
                                             ("POST", "/v1/audio/speech/../../ready", (404, 405, 200))])
        try:
            r = await client.request(method, f"{target.base}{path}", content=b"{}",
                                     headers={"Content-Type": "application/json"}, timeout=30)
            res = HTTPResult(status=r.status_code, data=r.content, complete=True)
        except httpx.HTTPError as e:
            res = HTTPResult(error=exception_text(e))
        _judge_refusal(kind, rec, res, accepted, f"{method} {path[:80]}")
    elif case == "malformed_http":
        data = rng.choice([b"GARBAGE\r\n\r\n", b"POST /v1/audio/speech HTTP/9.9\r\nHost: x\r\n\r\n",
                           b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                           b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: 5\r\nContent-Length: 9\r\n\r\n{}",
                           b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nX-Big: " + b"h" * 70000 + b"\r\n\r\n",
                           b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n"])
        got, ended = await raw_exchange(target, data, read_until="status", timeout=30)
        _judge_raw(kind, rec, got, ended, (400, 411, 413, 414, 431, 505), repr(data[:90]))
    elif case in ("idle_connection", "partial_headers"):
        data = b"" if case == "idle_connection" else f"POST /v1/audio/speech HTTP/1.1\r\nHost: {HOST}\r\n".encode()
        t0 = time.monotonic()
        got, ended = await raw_exchange(target, data, read_until="eof", timeout=40)
        held = time.monotonic() - t0
        desc = ("a TCP connection that sends nothing" if case == "idle_connection"
                else "a request head that never ends") + f" (held {held:.1f} s)"
        if ended == "timeout":
            rec.record(kind, "unexpected_status", request=desc, detail="the server kept the connection open 40 s")
        else:
            status = status_of(got)
            if status is not None and status >= 500:
                rec.record(kind, "http_5xx", request=desc, detail=got[:300].decode("utf-8", "replace"))
            else:
                rec.record(kind, "ok")


def _judge_raw(kind: str, rec: Recorder, got: bytes, ended: str, accepted: tuple, desc: str) -> None:
    status = status_of(got)
    if status is not None and status >= 500:
        rec.record(kind, "http_5xx", request=desc, detail=got[:400].decode("utf-8", "replace"))
    elif status in accepted:
        rec.record(kind, "ok")
    elif status is None and ended != "timeout":
        rec.record(kind, "closed")
    elif status is None:
        rec.record(kind, "timeout", request=desc, detail="no answer and the connection stayed open")
    else:
        rec.record(kind, "unexpected_status", request=desc, detail=got[:400].decode("utf-8", "replace"))


async def _stream_upload(client, target: Target, chunks) -> HTTPResult:
    res = HTTPResult()
    start = time.perf_counter()
    try:
        async with asyncio.timeout(target.timeout_s):
            async with client.stream("POST", f"{target.base}/v1/audio/speech", content=chunks,
                                     headers={"Content-Type": "application/json"}) as r:
                res.status, res.headers = r.status_code, dict(r.headers)
                async for piece in r.aiter_raw():
                    if piece and res.first_s is None:
                        res.first_s = time.perf_counter() - start
                    res.data += piece
                res.complete = True
    except TimeoutError:
        res.timed_out = True
    except httpx.HTTPError as e:
        res.error = exception_text(e)
    return res


# WebSocket messages that must each get an `error` event (never server_error) and leave the socket usable
WS_BAD_MESSAGES = (
    ("text", "not json{"), ("text", "[1, 2]"), ("text", "42"), ("text", '{"type": "dance"}'),
    ("text", '{"no": "type"}'),
    ("bytes", b"\x00\x01\x02"), ("text", '{"type": "text", "text": "hi"}'), ("text", '{"type": "stop"}'),
    ("text", '{"type": "start", "speed": 99}'), ("text", '{"type": "start", "voice": 42}'),
    ("text", '{"type": "start", "model": "no-such-model"}'), ("text", '{"type": "start", "format": "ogg"}'),
    ("text", '{"type": "start", "max_frames": -1}'), ("text", '{"type": "start", "temperature": "hot"}'),
    ("text", '{"type": "start", "speed": NaN}'), ("text", '{"type": null}'), ("text", '{"type": ["start"]}'),
    ("text", '{"type": {"start": 1}}'), ("text", ""),
)


async def hostile_ws(case: str, target: Target, rng: random.Random, rec: Recorder, deadline: float) -> None:
    kind = f"hostile.{case}"
    try:
        async with ws_connect(target) as ws:
            if case == "ws_bad_messages":
                for how, msg in rng.sample(WS_BAD_MESSAGES, rng.randint(3, 6)):
                    await ws.send(msg)  # str: a text frame; bytes: a binary frame
                    event = await ws_recv_json(ws, 30, skip_codes=())
                    desc = f"WS message {msg!r:.120}"
                    if event.get("type") != "error":
                        rec.record(kind, "bad_response", request=desc, detail=f"expected an error event: {event}")
                    elif (event.get("error") or {}).get("type") == "server_error":
                        rec.record(kind, "server_error_event", request=desc, detail=json.dumps(event))
                    else:
                        rec.record(kind, "ok")
                await _ws_then_valid(ws, target, rng, rec, kind)
            elif case == "ws_bad_in_session":  # errors while an utterance runs must not end it
                start = {"type": "start", "voice": "ryan", "format": "pcm", "max_frames": target.max_frames,
                         "seed": 7, rng.choice(ODD_NAMES): 1}
                await ws.send(json.dumps(start))
                event = await ws_recv_json(ws, target.timeout_s, skip_codes=())
                if event.get("type") != "started":
                    _ws_refused(rec, kind, event, "WS start with an odd unknown field")
                    return
                for msg in rng.sample(['{"type":"start"}', '{"type":"text","text":5}', '{"type":"text"}',
                                       json.dumps({"type": "text", "text": "w" * 4097}), "{bad"], 3):
                    await ws.send(msg)
                await ws.send(json.dumps({"type": "text", "text": "Hello from the soak."}))
                await ws.send('{"type":"stop"}')
                errors, done = 0, None
                async with asyncio.timeout(target.timeout_s):
                    while done is None:
                        msg = await ws.recv()
                        if isinstance(msg, bytes):
                            continue
                        event = json.loads(msg)
                        if event.get("type") == "error":
                            if (event.get("error") or {}).get("type") == "server_error":
                                rec.record(kind, "server_error_event", request="WS bad messages in a session",
                                           detail=json.dumps(event))
                                return
                            errors += 1
                        elif event.get("type") == "done":
                            done = event
                if done.get("finish_reason") in ("eos", "max_frames", "budget") and errors >= 3:
                    rec.record(kind, "ok")
                else:
                    rec.record(kind, "bad_response", request="WS bad messages in a session",
                               detail=f"{errors} error events (3 expected), done {done}")
            elif case == "ws_closing_messages":  # messages a server may answer by closing the socket
                how, msg = rng.choice([("text", json.dumps({"type": "text", "text": "q" * 100_000})),
                                       ("bytes_as_text", b'{"type":"start","voice":"\xff\xfe"}'),
                                       ("bytes", b"\x00" * 200_000),
                                       ("text", json.dumps({"type": "start", "voice": "ryan", "pad": "p" * 70_000}))])
                if how == "bytes_as_text":
                    await ws.send(msg, text=True)  # a text frame that is not UTF-8
                else:
                    await ws.send(msg)
                desc = f"WS {how} message of {len(msg)} bytes"
                try:
                    event = await ws_recv_json(ws, 30, skip_codes=())
                except Exception as e:  # closed: fine when the close code says why
                    code = getattr(getattr(e, "rcvd", None), "code", None)
                    if code in (1007, 1008, 1009, 1003):
                        rec.record(kind, "closed")
                    else:
                        rec.record(kind, "dropped", request=desc, detail=f"{exception_text(e)} (close code {code})")
                    return
                if event.get("type") == "started":  # accepted: end it politely
                    await ws.send('{"type":"cancel"}')
                    await ws_recv_json(ws, target.timeout_s, skip_codes=())
                    rec.record(kind, "accepted")
                elif event.get("type") == "error" and (event.get("error") or {}).get("type") != "server_error":
                    rec.record(kind, "ok")
                else:
                    rec.record(kind, "server_error_event" if event.get("type") == "error" else "bad_response",
                               request=desc, detail=json.dumps(event)[:600])
            elif case == "ws_idle_connect":  # an idle socket (no start), then a normal utterance
                await asyncio.sleep(min(rng.uniform(5, 12), max(0.0, deadline - time.monotonic())))
                await _ws_then_valid(ws, target, rng, rec, kind)
            elif case == "ws_idle_session":  # a started session that goes quiet: the server must end it
                with_text = rng.random() < 0.6
                await ws.send(json.dumps({"type": "start", "voice": "ryan", "format": "pcm",
                                          "max_frames": target.max_frames}))
                event = await ws_recv_json(ws, target.timeout_s, skip_codes=())
                if event.get("type") != "started":
                    _ws_refused(rec, kind, event, "WS idle session start")
                    return
                if with_text:
                    await ws.send(json.dumps({"type": "text", "text": rng.choice(LATENCY_TEXTS)[:20]}))
                t0 = time.monotonic()
                try:
                    done = await ws_recv_json(ws, 75, skip_codes=())
                except TimeoutError:
                    rec.record(kind, "timeout", request=f"WS started session, {'one text' if with_text else 'no text'},"
                                                         " then silence", detail="no done within 75 s")
                    return
                desc = f"WS started session, {'one text' if with_text else 'no text'}, then silence"
                want = ("eos", "max_frames", "budget") if with_text else ("cancelled",)
                if done.get("type") == "done" and done.get("idle_timeout") and done.get("finish_reason") in want:
                    rec.record(kind, "ok")
                elif done.get("type") == "done" and with_text and done.get("finish_reason") in want:
                    rec.record(kind, "ok")  # the text ended by max_frames before the idle timeout
                else:
                    rec.record(kind, "bad_response", request=desc,
                               detail=f"after {time.monotonic() - t0:.1f} s: {json.dumps(done)[:500]}")
    except TimeoutError:
        rec.record(kind, "timeout", request=case)
    except Exception as e:
        rec.record(kind, "dropped", request=case, detail=exception_text(e))


def _ws_refused(rec: Recorder, kind: str, event: dict, desc: str) -> None:
    err = event.get("error") or {}
    if err.get("type") == "rate_limit_error":
        rec.record(kind, "rate_limited")
    elif err.get("type") == "server_error":
        rec.record(kind, "server_error_event", request=desc, detail=json.dumps(event))
    else:
        rec.record(kind, "bad_response", request=desc, detail=f"expected started: {json.dumps(event)[:500]}")


async def _ws_then_valid(ws, target: Target, rng: random.Random, rec: Recorder, kind: str) -> None:
    outcome, detail, first = await ws_utterance(ws, target, rng, fmt=rng.choice(FORMATS))
    rec.record(kind + ".then_valid", outcome, request="WS utterance after hostile/idle traffic", detail=detail)


HOSTILE_CASES = {  # case: weight
    "bad_json": 3, "invalid_utf8": 2, "oversized_body": 1, "oversized_declared": 1, "out_of_range": 6,
    "odd_unknown_fields": 3, "deep_nesting": 1, "wrong_content_type": 1, "empty_body": 1, "chunked_request_body": 1,
    "slow_sender": 1, "slow_reader": 2, "wrong_method_or_path": 2, "malformed_http": 2, "idle_connection": 1,
    "partial_headers": 1, "ws_bad_messages": 3, "ws_bad_in_session": 2, "ws_closing_messages": 2,
    "ws_idle_connect": 1, "ws_idle_session": 1,
}
LONG_CASES = {"idle_connection", "partial_headers", "ws_idle_session", "oversized_declared"}
"""Cases that hold a connection for tens of seconds: one at a time, and not in the last minute."""


async def hostile_loop(target: Target, rng: random.Random, rec: Recorder, deadline: float, cap: int, client,
                       long_lock: asyncio.Lock) -> None:
    names, weights = list(HOSTILE_CASES), list(HOSTILE_CASES.values())
    n = 0
    while time.monotonic() < deadline and n < cap:
        case = rng.choices(names, weights)[0]
        n += 1
        if case in LONG_CASES:
            if long_lock.locked() or deadline - time.monotonic() < 80:
                continue
            async with long_lock:
                await _guard(rec, f"hostile.{case}", _hostile_case(case, target, rng, rec, client, deadline))
        else:
            await _guard(rec, f"hostile.{case}", _hostile_case(case, target, rng, rec, client, deadline))
        await asyncio.sleep(rng.uniform(0.1, 0.5))


async def _hostile_case(case, target, rng, rec, client, deadline) -> None:
    if case.startswith("ws_"):
        await hostile_ws(case, target, rng, rec, deadline)
    else:
        await hostile_http(case, target, rng, rec, client)


# -- all together -----------------------------------------------------------------------------------

async def run_clients(target: Target, args, rec: Recorder, deadline: float) -> dict:
    client, sdk = _clients(target.port)
    cap = max(10, int(args.minutes * MAX_REQUESTS_PER_CLIENT_MIN))
    long_lock = asyncio.Lock()
    tasks = []
    for i in range(args.polite):
        tasks.append(asyncio.create_task(polite_loop(i, target, random.Random(f"{args.seed}-polite-{i}"), rec,
                                                     deadline, cap, client, sdk), name=f"polite-{i}"))
    if not args.no_probe:
        tasks.append(asyncio.create_task(probe_loop(target, rec, deadline, cap, client), name="probe"))
    for i in range(args.disrupt):
        tasks.append(asyncio.create_task(disrupt_loop(target, random.Random(f"{args.seed}-disrupt-{i}"), rec,
                                                      deadline, cap, client, sdk), name=f"disrupt-{i}"))
    for i in range(args.hostile):
        tasks.append(asyncio.create_task(hostile_loop(target, random.Random(f"{args.seed}-hostile-{i}"), rec,
                                                      deadline, cap, client, long_lock), name=f"hostile-{i}"))
    grace = target.timeout_s + 90  # the last requests finish; idle sessions end on the server's timeout
    done, pending = await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()) + grace)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    crashed = {t.get_name(): exception_text(t.exception())
               for t in done if not t.cancelled() and t.exception() is not None}
    await client.aclose()
    await sdk.close()
    return {"clients": [t.get_name() for t in tasks], "cut_at_end": [t.get_name() for t in pending],
            "client_crashes": crashed, "late_s": round(max(0.0, time.monotonic() - deadline), 1)}
