"""WebSocket /v1/ws end to end: a real uvicorn server, the `websockets` client library.

The proof that live text loses nothing: text sent in 1-3 character deltas (with pauses that let
the engine run dry) gives the same PCM bytes as POST /v1/audio/speech with the whole text in the
streaming text mode, same seed and max_frames (deterministic engine profile). Random weights rarely
say EOS, so every session caps `max_frames`.
"""

from __future__ import annotations

import socket
import time

import pytest
from websockets.sync.client import connect

from qwen3_tts_gguf.audio.encoding import StreamingEncoder

from tests.llm_text import PAUSE_S, llm_deltas
from tests.server_fixtures import server_fixtures
from tests.ws_helpers import (
    KEY,
    SAMPLES_PER_FRAME,
    TEXT,
    TIMEOUT,
    expect_error,
    open_ws,
    refused,
    say_and_stop,
    send,
    start,
    until_done,
    wait_idle,
    whole_text_pcm,
)

MAX_STREAMS = 4


registry, server = server_fixtures(MAX_STREAMS)


# -- live text equals the whole text -------------------------------------------------------------


def test_deltas_of_one_to_three_characters_give_the_bytes_of_the_whole_text(server, registry):
    reference = whole_text_pcm(server, TEXT)
    with open_ws(server) as ws:
        started = start(ws)
        assert started["model"] == registry.default.id and started["voice"] == "ryan"
        assert (started["sample_rate"], started["channels"], started["format"]) == (24000, 1, "pcm")
        half, i = len(TEXT) // 2, 0
        for delta, pause in llm_deltas(TEXT):
            send(ws, type="text", text=delta)
            i += len(delta)
            if pause:
                time.sleep(PAUSE_S)
            if half <= i < half + len(delta):
                # synthesis starts before the sentence is complete: audio arrives with half the text
                assert isinstance(first := ws.recv(timeout=TIMEOUT), bytes)
        send(ws, type="stop")
        audio, events = until_done(ws)
    audio = first + audio
    assert audio == reference
    done = events[-1]
    text_tokens = len(registry.default.model.prompts.text_ids(TEXT))
    assert done["finish_reason"] in ("max_frames", "eos")
    frames = len(audio) // 2 // SAMPLES_PER_FRAME
    assert done["usage"] == {"input_tokens": text_tokens, "output_tokens": frames, "total_tokens": text_tokens + frames,
                             "characters": len(TEXT),
                             "normalized_characters": done["usage"]["normalized_characters"],  # None unless normalized
                             "audio_seconds": pytest.approx(len(audio) / 2 / 24000), "frames": frames,
                             "first_audio_s": done["timings"]["first_audio_s"], "runaways": 0, "runaway_retries": 0}
    assert done["audio_s"] == pytest.approx(len(audio) / 2 / 24000)
    assert done["timings"]["first_audio_s"] > 0 and done["id"] == started["id"]


# -- cancel, reuse, disconnect ---------------------------------------------------------------------


def test_cancel_frees_the_slot_and_the_socket_takes_another_start(server, registry):
    with open_ws(server) as ws:
        start(ws, max_frames=400)
        send(ws, type="text", text="Hello there, this is a sentence that is never finished")
        assert isinstance(ws.recv(timeout=TIMEOUT), bytes)
        assert registry.default.engine.load()["active"] == 1
        send(ws, type="cancel")
        _, events = until_done(ws)
        assert events[-1]["finish_reason"] == "cancelled"
        load = wait_idle(registry)
        assert (load["active"], load["waiting"], load["free_slots"]) == (0, 0, MAX_STREAMS)
        # the same socket, the next utterance
        start(ws, max_frames=3)
        send(ws, type="text", text="Second one.")
        send(ws, type="stop")
        audio, events = until_done(ws)
        assert events[-1]["finish_reason"] in ("max_frames", "eos") and 0 < len(audio) <= 3 * 2 * SAMPLES_PER_FRAME
        send(ws, type="cancel")  # nothing to cancel any more: a no-op, no error
        start(ws, max_frames=1, format="wav")
        send(ws, type="text", text="Third.")
        send(ws, type="stop")
        audio, events = until_done(ws)
        assert [e["type"] for e in events] == ["done"]
        assert audio[:4] == b"RIFF" and len(audio) == 44 + 2 * SAMPLES_PER_FRAME


@pytest.mark.parametrize("how", ["close", "drop"])
def test_a_client_that_disconnects_cancels_its_stream(server, registry, how):
    """A clean close and a dropped TCP connection alike."""
    engine = registry.default.engine
    cancelled_before = engine.stats["cancelled"]
    with open_ws(server) as ws:
        start(ws, max_frames=400)
        send(ws, type="text", text="Hello there, this text keeps the stream waiting for more")
        assert isinstance(ws.recv(timeout=TIMEOUT), bytes)
        ws.close() if how == "close" else ws.close_socket()
        load = wait_idle(registry)
        assert (load["active"], load["waiting"], load["free_slots"]) == (0, 0, MAX_STREAMS)
    assert engine.stats["cancelled"] == cancelled_before + 1


# -- bad messages ------------------------------------------------------------------------------------


def test_bad_messages_get_error_events_and_the_socket_keeps_working(server, registry):
    with open_ws(server) as ws:
        ws.send("not json")
        assert expect_error(ws, "invalid_json")["type"] == "invalid_request_error"
        ws.send("[" * 50_000)  # nested past the parser's depth: still just invalid JSON
        expect_error(ws, "invalid_json")
        ws.send("[1, 2]")
        expect_error(ws, "invalid_value", "type")
        send(ws, type="speak")
        expect_error(ws, "invalid_value", "type")
        for kind in (["start"], {"start": 1}, None, 7):  # not a string: never a server error
            send(ws, type=kind)
            assert expect_error(ws, "invalid_value", "type")["type"] == "invalid_request_error"
        ws.send(b"\x00\x01")
        expect_error(ws, "unsupported_message")
        send(ws, type="text", text="early")
        expect_error(ws, "no_active_stream")
        send(ws, type="stop")
        expect_error(ws, "no_active_stream")
        send(ws, type="start", voice="nobody")
        expect_error(ws, "invalid_value", "voice")
        send(ws, type="start", voice="ryan", model="no-such-model")
        expect_error(ws, "model_not_found", "model")
        send(ws, type="start")
        expect_error(ws, "missing_required_parameter", "voice")
        send(ws, type="start", voice="ryan", temperature=-1)
        expect_error(ws, "invalid_value", "temperature")
        send(ws, type="start", voice="ryan", format="ogg")
        expect_error(ws, "invalid_value", "response_format")
        # a stream: a second start, a text without text, stop, then text after stop
        started = start(ws, max_frames=2)
        send(ws, type="start", voice="ryan")
        expect_error(ws, "stream_active")
        send(ws, type="text", text=42)
        expect_error(ws, "invalid_value", "text")
        send(ws, type="text", text="x" * 4097)
        expect_error(ws, "string_above_max_length", "text")
        send(ws, type="text", text="Fine.")
        send(ws, type="stop")
        send(ws, type="text", text="late")
        audio, events = until_done(ws)
        assert [e["type"] for e in events] == ["error", "done"] and events[0]["error"]["code"] == "stream_closed"
        assert events[1]["id"] == started["id"] and len(audio) == 2 * 2 * SAMPLES_PER_FRAME
        # stop without any text: the session fails cleanly
        start(ws)
        send(ws, type="stop")
        _, events = until_done(ws)
        assert [e["type"] for e in events] == ["error", "done"]
        assert events[0]["error"]["code"] == "empty_input" and events[1]["finish_reason"] == "error"
    assert wait_idle(registry)["active"] == 0


def test_an_engine_failure_mid_stream_is_an_error_then_done(server, registry, failing_codec, monkeypatch):
    failing_codec(registry.default.model.codec)  # patched through this test's monkeypatch
    with open_ws(server) as ws:
        start(ws)
        audio, events = say_and_stop(ws, [TEXT])
        monkeypatch.undo()
        assert len(audio) == 2 * SAMPLES_PER_FRAME  # the first chunk (1 frame) got out
        assert [e["type"] for e in events] == ["error", "done"]
        error = events[0]["error"]
        assert error["type"] == "server_error" and error["code"] == "synthesis_failed"
        assert events[1]["finish_reason"] == "error"
        # the engine's exception stays in the server log: the client is told the session id only
        assert "exploded" not in error["message"] and "Error" not in error["message"]
        assert events[0]["id"] in error["message"]
        start(ws, max_frames=1)  # the socket lives on
        send(ws, type="text", text="Again.")
        send(ws, type="stop")
        assert until_done(ws)[1][-1]["finish_reason"] in ("max_frames", "eos")


def test_an_encoder_failure_is_an_error_without_its_exception_text(server, registry, monkeypatch):
    def explode(self, samples):
        raise RuntimeError("/secret/path exploded")

    monkeypatch.setattr(StreamingEncoder, "encode", explode)
    with open_ws(server) as ws:
        start(ws)
        audio, events = say_and_stop(ws, [TEXT])
        monkeypatch.undo()
        assert audio == b"" and [e["type"] for e in events] == ["error", "done"]
        error = events[0]["error"]
        assert error["code"] == "synthesis_failed" and events[1]["finish_reason"] == "error"
        assert "secret" not in error["message"] and "RuntimeError" not in error["message"]
    assert wait_idle(registry)["active"] == 0


def test_start_reports_fields_that_do_not_apply(server):
    with open_ws(server) as ws:
        started = start(ws, max_frames=1, input="ignored", text_mode="non-streaming", lang_code="a")
        assert started["ignored_fields"] == ["input", "lang_code", "text_mode"]
        send(ws, type="cancel")
        until_done(ws)


# -- authentication and origins ----------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "wrong"])
def test_a_missing_or_wrong_key_is_refused(server, key):
    with open_ws(server, key) as ws:
        message, code = refused(ws)
    assert message["type"] == "error" and message["error"]["code"] == "invalid_api_key" and code == 1008


def test_the_key_as_query_parameter_subprotocol_or_header(server):
    for kwargs, key in (({}, KEY),
                        ({"subprotocols": ["qtts.v1", f"bearer.{KEY}"]}, None),
                        ({"additional_headers": {"Authorization": f"Bearer {KEY}"}}, None)):
        with open_ws(server, key, **kwargs) as ws:
            if "subprotocols" in kwargs:
                assert ws.subprotocol == "qtts.v1"
            start(ws, max_frames=1)
            send(ws, type="cancel")
            assert until_done(ws)[1][-1]["type"] == "done"


def test_browser_origins_other_than_the_server_itself_are_refused(server):
    with open_ws(server, origin="http://evil.example") as ws:
        message, code = refused(ws)
    assert message["error"]["code"] == "origin_not_allowed" and code == 1008
    with open_ws(server, origin=f"http://{server.host}:{server.port}") as ws:  # the web console
        start(ws, max_frames=1)
        send(ws, type="cancel")
        until_done(ws)


def test_a_host_not_served_here_is_refused(server):
    """DNS rebinding: a page on evil.example resolved to 127.0.0.1 sends its own name as Host (and
    as Origin, so the origin check alone would pass it)."""
    sock = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
    url = f"ws://evil.example:{server.port}/v1/ws?api_key={KEY}"
    with connect(url, sock=sock, origin=f"http://evil.example:{server.port}", open_timeout=TIMEOUT) as ws:
        message, code = refused(ws)
    assert message["error"]["code"] == "host_not_allowed" and code == 1008
