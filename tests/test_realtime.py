"""WebSocket /v1/realtime (OpenAI's Realtime API, GA) end to end: one real uvicorn server on loopback,
the tiny random model, and two kinds of client: the `openai` SDK (`client.realtime.connect`) and a
raw socket (`websockets`) written from OpenAI's event reference.

The audio is checked against the server's other routes with the same seed (deterministic engine
profile): a complete-text response equals POST /v1/audio/speech, a live-text response
(input_text_buffer) equals /v1/ws. Random weights rarely say EOS, so every response caps
`max_output_tokens` (codec frames here).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import openai
import pytest
import soxr
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from qwen3_tts_gguf.audio.telephony import alaw_to_s16, ulaw_to_s16

from api.ops.lifecycle import PROCESS
from api.testing import ServerThread
from tests.llm_text import llm_deltas
from tests.server_fixtures import server_fixtures
from tests.ws_helpers import (
    KEY,
    SAMPLES_PER_FRAME,
    TIMEOUT,
    event,
    post_speech,
    refused,
    speak_live,
    wait_idle,
)

TEXT = "Hello there, this is a realtime test."
SEED = 5
FRAMES = 12
MAX_STREAMS = 4
RESPONSE_EVENTS = ["response.created", "response.output_item.added", "conversation.item.added",
                   "response.content_part.added", "response.output_audio_transcript.delta",
                   "response.output_audio.delta", "response.output_audio.done",
                   "response.output_audio_transcript.done", "response.content_part.done",
                   "response.output_item.done", "conversation.item.done", "response.done"]
"""A response's events in OpenAI's order (deltas collapsed: audio deltas repeat)."""


registry, server = server_fixtures(MAX_STREAMS)


# -- a raw client ------------------------------------------------------------------------------------


def open_rt(server: ServerThread, key: str | None = KEY, model: str | None = "gpt-realtime",
            **kwargs) -> ClientConnection:
    query = "&".join(f"{k}={v}" for k, v in (("model", model), ("api_key", key)) if v is not None)
    return connect(f"ws://{server.host}:{server.port}/v1/realtime?{query}", proxy=None, open_timeout=TIMEOUT,
                   **kwargs)


def send(ws: ClientConnection, kind: str, **fields) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def created(ws: ClientConnection) -> dict:
    first = event(ws)
    assert first["type"] == "session.created", first
    return first["session"]


def update(ws: ClientConnection, **session) -> dict:
    send(ws, "session.update", session={"type": "realtime", **session})
    updated = event(ws)
    assert updated["type"] == "session.updated", updated
    return updated["session"]


def output(fmt: str = "pcm", voice: str = "ryan", **more) -> dict:
    kind = {"type": f"audio/{fmt}", **({"rate": 24000} if fmt == "pcm" else {})}
    return {"output": {"format": kind, "voice": voice, **more}}


def say(ws: ClientConnection, text: str) -> dict:
    """conversation.item.create with a user message: its added and done events."""
    send(ws, "conversation.item.create",
         item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    added, done = event(ws), event(ws)
    assert (added["type"], done["type"]) == ("conversation.item.added", "conversation.item.done")
    assert added["item"] == done["item"] and added["item"]["content"][0]["text"] == text
    return added["item"]


def until_response_done(ws: ClientConnection) -> tuple[bytes, list[dict]]:
    """The decoded audio of the response and every event up to and including response.done."""
    audio, events = bytearray(), []
    while not events or events[-1]["type"] != "response.done":
        events.append(event(ws))
        if events[-1]["type"] == "response.output_audio.delta":
            audio += base64.b64decode(events[-1]["delta"])
    return bytes(audio), events


def kinds(events: list[dict]) -> list[str]:
    """Event types, runs of the same delta type collapsed."""
    out: list[str] = []
    for e in events:
        if not (out and out[-1] == e["type"] and e["type"].endswith(".delta")):
            out.append(e["type"])
    return out


def expect_error(ws: ClientConnection, code: str, param: str | None = None, event_id: str | None = None) -> dict:
    message = event(ws)
    assert message["type"] == "error", message
    assert message["event_id"].startswith("event_")
    error = message["error"]
    assert set(error) == {"type", "code", "message", "param", "event_id"} and error["message"], error
    assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    assert error["event_id"] == event_id, error
    return error


def speech_pcm(server: ServerThread, text: str, **extra) -> bytes:
    """POST /v1/audio/speech of `text` with this file's seed and max_frames."""
    return post_speech(server, text, **{"seed": SEED, "max_frames": FRAMES, **extra}).content


def ws_pcm(server: ServerThread, deltas: list[str]) -> bytes:
    """The same text as live deltas through /v1/ws (qtts.v1)."""
    return speak_live(server, deltas, seed=SEED, max_frames=FRAMES, format="pcm")[0]


# -- the openai SDK ------------------------------------------------------------------------------------


def sdk_client(server: ServerThread, cls=openai.OpenAI):
    # websocket_base_url: older SDKs (1.107 at least) connect with wss:// (TLS) whatever base_url says
    return cls(base_url=server.api_url, api_key=KEY, websocket_base_url=f"ws://{server.host}:{server.port}/v1")


SDK_SESSION = {"type": "realtime", "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000},
                                                        "voice": "ryan"}},
               "max_output_tokens": FRAMES, "seed": SEED}
SDK_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT}]}


def test_openai_sdk_speaks_what_the_speech_route_speaks(server, registry):
    reference = speech_pcm(server, TEXT)  # the model's default text mode, as a response's
    client = sdk_client(server)
    audio, types = bytearray(), []
    with client.realtime.connect(model="gpt-realtime") as conn:
        conn.session.update(session=SDK_SESSION)
        conn.conversation.item.create(item=SDK_ITEM)
        conn.response.create()
        for ev in conn:
            types.append(ev.type)
            if ev.type == "session.created":
                assert ev.session.type == "realtime" and ev.session.output_modalities == ["audio"]
            elif ev.type == "session.updated":
                assert ev.session.audio.output.voice == "ryan" and ev.session.max_output_tokens == FRAMES
            elif ev.type == "response.output_audio.delta":
                audio += base64.b64decode(ev.delta)
            elif ev.type == "response.output_audio_transcript.done":
                assert ev.transcript == TEXT
            elif ev.type == "error":
                pytest.fail(f"error event: {ev.error}")
            elif ev.type == "response.done":
                done = ev.response
                break
    assert types[:4] == ["session.created", "session.updated", "conversation.item.added", "conversation.item.done"]
    assert kinds([{"type": t} for t in types[4:]]) == RESPONSE_EVENTS
    assert done.status in ("completed", "incomplete") and done.usage.output_tokens <= FRAMES
    assert len(audio) == done.usage.output_tokens * SAMPLES_PER_FRAME * 2  # s16le mono 24 kHz
    assert done.usage.input_tokens == len(registry.default.model.prompts.text_ids(TEXT))
    assert done.output[0].role == "assistant" and done.output[0].content[0].type == "output_audio"
    assert bytes(audio) == reference


def test_openai_async_sdk(server):
    async def run() -> tuple[bytes, str]:
        audio = bytearray()
        async with sdk_client(server, openai.AsyncOpenAI).realtime.connect(model="gpt-realtime") as conn:
            await conn.session.update(session={**SDK_SESSION, "max_output_tokens": 2})
            await conn.conversation.item.create(item=SDK_ITEM)
            await conn.response.create()
            async for ev in conn:
                if ev.type == "response.output_audio.delta":
                    audio += base64.b64decode(ev.delta)
                elif ev.type == "response.done":
                    return bytes(audio), ev.response.status

    audio, status = asyncio.run(asyncio.wait_for(run(), TIMEOUT))
    assert status in ("completed", "incomplete") and 0 < len(audio) <= 2 * SAMPLES_PER_FRAME * 2


def test_a_beta_sdk_session_is_told_the_ga_shape(server):
    """The beta API's client (`client.beta.realtime`: flat `voice`, `modalities`, no `session.type`) gets
    an error that names the GA shape and where its fields go; the socket goes on."""
    beta_session = {"voice": "ryan", "modalities": ["audio", "text"], "output_audio_format": "pcm16"}
    beta = getattr(getattr(sdk_client(server).beta, "realtime", None), "connect", None)
    if beta is None:  # an SDK without the beta client: its message, raw
        with open_rt(server) as ws:
            created(ws)
            send(ws, "session.update", session=beta_session)
            error = expect_error(ws, "missing_required_parameter", "session.type")
            assert update(ws, audio=output())["type"] == "realtime"
    else:
        with beta(model="gpt-realtime") as conn:
            conn.session.update(session=beta_session)
            error = next(ev.error for ev in conn if ev.type == "error").model_dump()
            conn.session.update(session=SDK_SESSION)
            assert next(ev.type for ev in conn if ev.type in ("session.updated", "error")) == "session.updated"
    assert (error["code"], error["param"]) == ("missing_required_parameter", "session.type")
    message = error["message"]
    assert "GA Realtime API" in message and "'session.type' is required (\"realtime\")" in message
    for beta_field, ga in (("voice", "audio.output.voice"), ("modalities", "output_modalities"),
                           ("output_audio_format", "audio.output.format")):
        assert f"'session.{beta_field}' goes in 'session.{ga}'" in message


# -- raw socket: events, formats, live text ------------------------------------------------------------


def test_a_response_sends_openais_events_in_order(server, registry):
    with open_rt(server) as ws:
        session = created(ws)
        assert session["type"] == "realtime" and session["model"] == registry.default.id
        assert session["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin",
                                              "speed": 1.0}
        session = update(ws, audio=output(), max_output_tokens=FRAMES, seed=SEED, instructions="Calm.")
        assert session["audio"]["output"]["voice"] == "ryan" and session["instructions"] == "Calm."
        user = say(ws, TEXT)
        send(ws, "response.create", event_id="evt_1")
        audio, events = until_response_done(ws)
    assert kinds(events) == RESPONSE_EVENTS
    assert len({e["event_id"] for e in events}) == len(events)  # unique server event ids
    response, item = events[0]["response"], events[1]["item"]
    assert response["status"] == "in_progress" and response["object"] == "realtime.response"
    assert item["role"] == "assistant" and item["type"] == "message" and item["status"] == "in_progress"
    assert events[2]["previous_item_id"] == user["id"] and events[2]["item"]["id"] == item["id"]
    for e in events[3:-1]:
        if "content_index" in e:
            assert (e["response_id"], e["item_id"], e["output_index"], e["content_index"]) == \
                (response["id"], item["id"], 0, 0)
    assert events[3]["part"] == {"type": "audio", "transcript": ""}
    assert events[4]["delta"] == TEXT  # complete text: the transcript first, whole
    done = events[-1]["response"]
    assert done["id"] == response["id"] and done["status"] == "incomplete"  # random weights: no EOS
    assert done["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    usage = done["usage"]
    assert usage["output_tokens"] == FRAMES and usage["input_token_details"]["text_tokens"] == usage["input_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_token_details"] == {"text_tokens": 0, "audio_tokens": FRAMES}
    assert len(audio) == FRAMES * SAMPLES_PER_FRAME * 2
    assert done["output"] == [{"id": item["id"], "object": "realtime.item", "type": "message", "status": "incomplete",
                               "role": "assistant", "content": [{"type": "output_audio", "transcript": TEXT}]}]
    assert audio == speech_pcm(server, TEXT, instructions="Calm.")


def snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    n = min(len(reference), len(decoded))
    return float(10 * np.log10(np.sum(reference[:n] ** 2) / np.sum((reference[:n] - decoded[:n]) ** 2)))


def test_g711_output_is_8k_one_byte_a_sample_and_decodes_to_the_pcm(server):
    with open_rt(server) as ws:
        created(ws)
        update(ws, audio=output("pcma"), max_output_tokens=FRAMES, seed=SEED)
        say(ws, TEXT)
        send(ws, "response.create", response={"conversation": "none", "input": [], "audio": output("pcm")})
        expect_error(ws, "empty_input", "response.input")  # an empty input speaks nothing
        send(ws, "response.create", response={"conversation": "none", "audio": output("pcm")})
        pcm, _ = until_response_done(ws)  # out of band: the message stays unspoken
        send(ws, "response.create", response={"conversation": "none", "audio": output("pcmu")})
        pcmu, events = until_response_done(ws)
        assert events[0]["response"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        assert events[0]["response"]["conversation_id"] is None and "conversation.item.added" not in kinds(events)
        send(ws, "response.create")  # the session's format, and the message is spoken (consumed)
        pcma, _ = until_response_done(ws)
        send(ws, "response.create")
        expect_error(ws, "empty_input")
    samples = FRAMES * SAMPLES_PER_FRAME
    assert len(pcm) == 2 * samples and len(pcmu) == len(pcma) == samples // 3
    reference = soxr.resample(np.frombuffer(pcm, np.int16) / 32767.0, 24000, 8000, quality="HQ")
    for data, decode in ((pcmu, ulaw_to_s16), (pcma, alaw_to_s16)):
        assert snr_db(reference, decode(data) / 32767.0) > 25


def test_live_text_speaks_as_the_ws_route_does(server, registry):
    deltas = [delta for delta, _ in llm_deltas(TEXT, seed=1)]
    reference = ws_pcm(server, deltas)
    with open_rt(server) as ws:
        created(ws)
        update(ws, audio=output(), max_output_tokens=FRAMES, seed=SEED)
        for j, delta in enumerate(deltas):
            send(ws, "input_text_buffer.append", delta=delta)
            if j == 0:
                opening = [event(ws) for _ in range(4)]
                assert kinds(opening) == RESPONSE_EVENTS[:4]
        send(ws, "input_text_buffer.commit")
        send(ws, "input_text_buffer.append", delta="late", event_id="late_1")
        audio, events = until_response_done(ws)
    errors = [e for e in events if e["type"] == "error"]
    assert [e["error"]["code"] for e in errors] == ["stream_closed"] and errors[0]["error"]["event_id"] == "late_1"
    events = [e for e in events if e["type"] != "error"]
    transcript = [e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"]
    assert transcript == deltas  # each append, as it was pushed
    assert [e for e in events if e["type"] == "response.output_audio_transcript.done"][0]["transcript"] == TEXT
    assert kinds(events)[-6:] == RESPONSE_EVENTS[-6:]
    assert audio == reference and events[-1]["response"]["usage"]["output_tokens"] == FRAMES
    assert wait_idle(registry)["active"] == 0


def test_cancel_and_one_response_at_a_time(server, registry):
    with open_rt(server) as ws:
        created(ws)
        update(ws, audio=output(), max_output_tokens=400, seed=SEED)
        say(ws, TEXT)
        send(ws, "response.create")
        while event(ws)["type"] != "response.output_audio.delta":
            pass
        send(ws, "response.create", event_id="second")
        send(ws, "input_text_buffer.append", delta="more", event_id="third")
        send(ws, "response.cancel", event_id="cancel")
        _, events = until_response_done(ws)
        errors = [e["error"] for e in events if e["type"] == "error"]
        assert [(e["code"], e["event_id"]) for e in errors] == [
            ("conversation_already_has_active_response", "second"),
            ("conversation_already_has_active_response", "third")]
        done = events[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        assert done["output"][0]["status"] == "incomplete"
        assert kinds([e for e in events if e["type"] != "error"])[-6:] == RESPONSE_EVENTS[-6:]
        load = wait_idle(registry)
        assert (load["active"], load["waiting"], load["free_slots"]) == (0, 0, MAX_STREAMS)
        send(ws, "response.cancel", event_id="nothing")
        expect_error(ws, "response_cancel_not_active", event_id="nothing")
        # a live response cancelled before its commit
        send(ws, "input_text_buffer.append", delta="Hello there, never finished")
        send(ws, "response.cancel")
        _, events = until_response_done(ws)
        assert events[-1]["response"]["status"] == "cancelled"
        send(ws, "input_text_buffer.commit", event_id="c")
        expect_error(ws, "input_text_buffer_commit_empty", event_id="c")


def test_an_engine_failure_fails_the_response_and_the_socket_goes_on(server, registry, failing_codec, monkeypatch):
    failing_codec(registry.default.model.codec)
    with open_rt(server) as ws:
        created(ws)
        update(ws, audio=output(), max_output_tokens=FRAMES, seed=SEED)
        say(ws, TEXT)
        send(ws, "response.create")
        _, events = until_response_done(ws)
        monkeypatch.undo()
        done = events[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "synthesis_failed"
        assert "exploded" not in done["status_details"]["error"]["message"]
        say(ws, "Again.")
        send(ws, "response.create", response={"max_output_tokens": 1})
        _, events = until_response_done(ws)
        assert events[-1]["response"]["status"] in ("completed", "incomplete")


# -- what is refused -----------------------------------------------------------------------------------


def test_beta_fields_unsupported_features_and_bad_values_are_error_events(server):
    with open_rt(server) as ws:
        created(ws)
        for field, ga in (("voice", "session.audio.output.voice"),
                          ("output_audio_format", "session.audio.output.format"),
                          ("modalities", "session.output_modalities"),
                          ("input_audio_format", "session.audio.input.format"),
                          ("turn_detection", "session.audio.input.turn_detection")):
            send(ws, "session.update", event_id=f"u_{field}", session={"type": "realtime", field: "x"})
            error = expect_error(ws, "unknown_parameter", f"session.{field}", event_id=f"u_{field}")
            assert f"'{ga}'" in error["message"]
        send(ws, "response.create", response={"voice": "ash"})
        assert "'response.audio.output.voice'" in expect_error(ws, "unknown_parameter", "response.voice")["message"]
        unsupported = [
            ("input_audio_buffer.append", {"audio": "AAAA"}, "type"),
            ("input_audio_buffer.commit", {}, "type"),
            ("output_audio_buffer.clear", {}, "type"),
            ("session.update", {"session": {"type": "transcription"}}, "session.type"),
            ("session.update", {"session": {"type": "realtime", "output_modalities": ["text"]}},
             "session.output_modalities"),
            ("session.update", {"session": {"type": "realtime", "tools": [{"type": "function", "name": "f"}]}},
             "session.tools"),
            ("session.update", {"session": {"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "server_vad"}}}}}, "session.audio.input.turn_detection"),
            ("conversation.item.create", {"item": {"type": "function_call", "name": "f", "arguments": "{}"}},
             "item.type"),
            ("conversation.item.create", {"item": {"type": "message", "role": "system", "content": [
                {"type": "input_text", "text": "Be brief."}]}}, "item.role"),
            ("conversation.item.create", {"item": {"type": "message", "role": "user", "content": [
                {"type": "input_audio", "audio": "AAAA"}]}}, "item.content[0].type"),
        ]
        for i, (kind, fields, param) in enumerate(unsupported):
            send(ws, kind, event_id=f"e{i}", **fields)
            expect_error(ws, "unsupported_feature", param, event_id=f"e{i}")
        bad = [
            ({"audio": output(voice="nobody")}, "session.audio.output.voice"),
            ({"audio": output(speed=1.6)}, "session.audio.output.speed"),
            ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
             "session.audio.output.format.rate"),
            ({"audio": {"output": {"format": "pcm16"}}}, "session.audio.output.format"),
            ({"max_output_tokens": 0}, "session.max_output_tokens"),
            ({"temperature": -1.0}, "session.temperature"),
            ({"instructions": 7}, "session.instructions"),
        ]
        for fields, param in bad:
            send(ws, "session.update", session={"type": "realtime", **fields})
            expect_error(ws, "invalid_value", param)
        send(ws, "session.update", session={"audio": output()})
        expect_error(ws, "missing_required_parameter", "session.type")
        send(ws, "session.update", session={"type": "realtime", "model": "no-such-model"})
        expect_error(ws, "model_not_found", "session.model")
        send(ws, "speak.now", event_id="what")
        expect_error(ws, "invalid_value", "type", event_id="what")
        ws.send("not json")
        expect_error(ws, "invalid_json")
        send(ws, "response.create", event_id="r")
        expect_error(ws, "empty_input", event_id="r")
        # nothing above changed the session: the defaults are still in force, and it still takes updates
        assert update(ws, audio=output(speed=1.5))["audio"]["output"] == {
            "format": {"type": "audio/pcm", "rate": 24000}, "voice": "ryan", "speed": 1.5}


def test_conversation_items_can_be_retrieved_deleted_and_referenced(server):
    with open_rt(server) as ws:
        created(ws)
        update(ws, audio=output(), max_output_tokens=1, seed=SEED)
        first, second = say(ws, "First."), say(ws, "Second.")
        send(ws, "conversation.item.retrieve", item_id=first["id"])
        retrieved = event(ws)
        assert retrieved["type"] == "conversation.item.retrieved" and retrieved["item"] == first
        send(ws, "conversation.item.delete", item_id=first["id"])
        assert event(ws)["type"] == "conversation.item.deleted"
        send(ws, "conversation.item.retrieve", item_id=first["id"], event_id="gone")
        expect_error(ws, "item_not_found", "item_id", event_id="gone")
        send(ws, "response.create", response={"conversation": "none", "input": [
            {"type": "item_reference", "id": second["id"]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Third."}]}]})
        _, events = until_response_done(ws)
        assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == "Second. Third."
        send(ws, "response.create", response={"metadata": {"turn": "1"}})
        _, events = until_response_done(ws)
        done = events[-1]["response"]
        assert done["output"][0]["content"][0]["transcript"] == "Second." and done["metadata"] == {"turn": "1"}
        send(ws, "conversation.item.truncate", item_id=done["output"][0]["id"], content_index=0, audio_end_ms=40)
        assert event(ws)["type"] == "conversation.item.truncated"


# -- handshake -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "wrong"])
def test_a_missing_or_wrong_key_is_an_error_then_close_1008(server, key):
    with open_rt(server, key) as ws:
        message, code = refused(ws)
    assert message["type"] == "error" and message["error"]["code"] == "invalid_api_key" and code == 1008
    assert message["event_id"].startswith("event_") and message["error"]["event_id"] is None


def test_the_key_as_a_subprotocol_and_models(server, registry):
    with open_rt(server, None, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"  # browsers need one of their protocols echoed
        created(ws)
    with open_rt(server, None, model=registry.default.id, subprotocols=[f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == f"openai-insecure-api-key.{KEY}"
        assert created(ws)["model"] == registry.default.id
    with open_rt(server, model=None) as ws:
        assert created(ws)["model"] == registry.default.id  # no model: the default
    with open_rt(server, model="tts-1") as ws:
        assert created(ws)["model"] == registry.default.id
    with open_rt(server, model="no-such-model") as ws:
        message, code = refused(ws)
    assert message["error"]["code"] == "model_not_found" and code == 1008


def test_the_drain_lets_a_response_finish_then_closes_1012(server, registry):
    loop = server.server.servers[0].get_loop()
    with open_rt(server) as ws:
        created(ws)
        update(ws, audio=output(), max_output_tokens=4, seed=SEED)
        send(ws, "input_text_buffer.append", delta="Hello there,")
        assert kinds([event(ws) for _ in range(4)]) == RESPONSE_EVENTS[:4]
        draining = asyncio.run_coroutine_threadsafe(PROCESS.drain(20.0), loop)
        try:
            deadline = time.monotonic() + TIMEOUT
            while not PROCESS.draining and time.monotonic() < deadline:
                time.sleep(0.01)
            with open_rt(server) as other:  # new sockets are refused at once
                message, code = refused(other)
            assert message["error"]["code"] == "unavailable" and code == 1012
            send(ws, "input_text_buffer.append", delta=" the end.")
            send(ws, "input_text_buffer.commit")
            _, events = until_response_done(ws)  # the response in flight finishes
            assert events[-1]["response"]["status"] in ("completed", "incomplete")
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=TIMEOUT)
            assert closed.value.rcvd.code == 1012
            draining.result(TIMEOUT)
        finally:
            PROCESS.draining = False
    assert wait_idle(registry)["active"] == 0
