"""ElevenLabs' multi-context socket (`api/protocols/elevenlabs_sockets.py`) end to end: a real uvicorn server, the
`websockets` client sending what Pipecat's and LiveKit's ElevenLabs services send (a context opened
with " ", words with their trailing spaces, `flush`, `close_context`, the key as `xi-api-key`).

The proof that nothing is lost or mixed: two contexts interleaved on one socket each give the bytes
of `POST /v1/audio/speech` with the same text, seed and streaming text mode (deterministic profile);
pcm at another rate and mu-law are that audio resampled. The runaway budget is small, so every
context ends within a few dozen frames (random weights rarely say EOS).
"""

from __future__ import annotations

import base64
import contextlib
import json

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from qwen3_tts_gguf.audio.formats import to_s16
from qwen3_tts_gguf.audio.telephony import StreamResampler, s16_to_ulaw

from api.protocols.elevenlabs_sockets import MAX_CONTEXTS
from tests.server_fixtures import server_fixture, short_stream_registries
from tests.ws_helpers import (
    KEY,
    SEED,
    TIMEOUT,
    httpx,
    post_speech,
    run_pipecat,
    serve,
    wait_idle,
)

TEXTS = {"a": "Hello there, this is the first voice.", "b": "And here a second one speaks."}


registry, own_registry = short_stream_registries(max_streams=4, max_pending=8)
server = server_fixture()


def open_socket(server, voice: str = "ryan", key: str | None = KEY, socket: str = "multi-stream-input",
                base: str = "", **query):
    """A socket at `base` (or `/elevenlabs`) with `query` (a None value: left out; `output_format`: pcm_24000
    unless given, the reference's)."""
    query = {"model_id": "eleven_flash_v2_5", "seed": SEED, "output_format": "pcm_24000", **query}
    url = (f"ws://{server.host}:{server.port}{base}/v1/text-to-speech/{voice}/{socket}?"
           + "&".join(f"{k}={v}" for k, v in query.items() if v is not None))
    return connect(url, proxy=None, open_timeout=TIMEOUT, additional_headers={"xi-api-key": key} if key else {})


def send(ws, **message) -> None:
    ws.send(json.dumps(message))


def words(text: str) -> list[str]:
    return [w + " " for w in text.split(" ")]


ALIGNMENTS: dict[str, list[tuple[float, dict | None]]] = {}
"""The last collect()'s audio messages per context: (seconds of pcm_24000 audio, alignment)."""


def collect(ws, contexts: set[str]) -> tuple[dict[str, bytes], list[dict]]:
    """Audio per context until every one of `contexts` said isFinal; also every other message. Each
    audio message's alignment is checked (`check_alignment`) and kept in ALIGNMENTS."""
    audio, others, open_ = {c: b"" for c in contexts}, [], set(contexts)
    ALIGNMENTS.clear()
    while open_:
        message = json.loads(ws.recv(timeout=TIMEOUT))
        if "audio" in message:
            assert message["isFinal"] is False and message["contextId"] in open_, message
            assert message["normalizedAlignment"] == message["alignment"]
            data = base64.b64decode(message["audio"])
            audio[message["contextId"]] += data
            ALIGNMENTS.setdefault(message["contextId"], []).append((len(data) / 48000, message["alignment"]))
        elif message.get("isFinal") is True:
            open_.discard(message["contextId"])
        else:
            others.append(message)
    return audio, others


def check_alignment(messages: list[tuple[float, dict | None]], text: str, tolerance_ms: int = 0) -> str:
    """ElevenLabs' socket alignment: each message's characters spread over its own audio (ms from its
    start, adding up to its length, within `tolerance_ms`: a compressed piece's length is no whole number of
    ms), none repeated, in the order of the text sent, the last message with no audio only when characters
    were left; returns the characters timed."""
    timed = ""
    for i, (seconds, alignment) in enumerate(messages):
        if alignment is None:
            continue
        chars, starts, durations = alignment["chars"], alignment["charStartTimesMs"], alignment["charDurationsMs"]
        assert len(chars) == len(starts) == len(durations) > 0 and all(len(c) == 1 for c in chars)
        assert starts[0] == 0 and all(d >= 0 for d in durations)
        assert all(a + d == b for a, d, b in zip(starts, durations, starts[1:])), alignment
        assert abs(starts[-1] + durations[-1] - round(seconds * 1000)) <= tolerance_ms, (seconds, alignment)
        assert seconds > 0 or i == len(messages) - 1, "only the last message comes without audio"
        timed += "".join(chars)
    assert text.startswith(timed) and timed, (timed, text)
    return timed


def reference_pcm(server, text: str) -> bytes:
    """The speech route's audio of what a context was sent: its words, each with a trailing space."""
    return post_speech(server, "".join(words(text)), text_mode="streaming", seed=SEED).content


def test_two_interleaved_contexts_each_equal_the_speech_route(server, registry):
    with open_socket(server) as ws:
        for context in TEXTS:
            send(ws, text=" ", context_id=context, voice_settings={"stability": 0.5}, generation_config={})
        pieces = {c: words(t) for c, t in TEXTS.items()}
        while any(pieces.values()):
            for context, left in pieces.items():
                if left:
                    send(ws, text=left.pop(0), context_id=context)
        send(ws, text="", context_id="a")  # keep-alive
        for context in TEXTS:
            send(ws, context_id=context, flush=True)
            send(ws, context_id=context, close_context=True)
        audio, others = collect(ws, set(TEXTS))
    assert others == []
    for context, text in TEXTS.items():
        assert audio[context] == reference_pcm(server, text), context
        check_alignment(ALIGNMENTS[context], "".join(words(text)))
    assert wait_idle(registry)["active"] == 0


@pytest.mark.parametrize("output_format, rate", [("pcm_16000", 16000), ("pcm_44100", 44100), ("ulaw_8000", 8000)])
def test_other_output_formats_are_the_same_audio_resampled(server, output_format, rate):
    text = TEXTS["a"]
    with open_socket(server, output_format=output_format) as ws:
        for piece in [" ", *words(text)]:
            send(ws, text=piece, context_id="x")
        send(ws, context_id="x", close_context=True)
        audio, _ = collect(ws, {"x"})
    reference = np.frombuffer(reference_pcm(server, text), "<i2").astype(np.float32) / 32767.0
    resampler = StreamResampler(24000, rate)
    expected = to_s16(np.concatenate([resampler.process(reference), resampler.flush()]))
    if output_format == "ulaw_8000":
        assert audio["x"] == s16_to_ulaw(expected)
    else:
        assert audio["x"] == expected.astype("<i2").tobytes()


def refusal(ws) -> tuple[dict, int | None]:
    message = json.loads(ws.recv(timeout=TIMEOUT))
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=TIMEOUT)
    return message, ws.close_code


@pytest.mark.parametrize("voice, key, query, code", [
    ("ryan", KEY, {"output_format": "wav_44100"}, "unsupported_output_format"),
    ("ryan", KEY, {"apply_text_normalization": "always"}, "invalid_value"),
    ("21m00Tcm4TlvDq8ikWAM", KEY, {}, "invalid_value"),  # an ElevenLabs voice id: not a voice here
    ("ryan", KEY, {"model_id": "no-such-model"}, "model_not_found"),
    ("ryan", KEY, {"seed": "-1"}, "invalid_value"),
    ("ryan", "wrong-key", {}, "invalid_api_key"),
    ("ryan", None, {}, "invalid_api_key"),
])
def test_a_bad_handshake_is_told_then_closed(server, voice, key, query, code):
    with open_socket(server, voice=voice, key=key, **query) as ws:
        message, close = refusal(ws)
    assert message["error"] == code and message["message"] and close == 1008


def test_contexts_are_bounded_and_bad_messages_leave_the_socket_open(own_registry):
    registry = own_registry
    with serve(registry, max_requests_per_client=MAX_CONTEXTS + 1) as server, open_socket(server) as ws:
        for i in range(MAX_CONTEXTS):
            send(ws, text=" ", context_id=f"c{i}")
        send(ws, text=" ", context_id="one-too-many")
        assert json.loads(ws.recv(timeout=TIMEOUT)) == {
            "error": "too_many_contexts", "contextId": "one-too-many",
            "message": f"At most {MAX_CONTEXTS} contexts may be open on one socket: close one first."}
        for message, code in (({"context_id": "nope", "close_context": True}, "context_not_found"),
                              ({"context_id": "c0", "text": 5}, "invalid_value"),
                              ({"context_id": "", "text": "hi"}, "invalid_value"),
                              ({"context_id": "c0"}, "invalid_value")):
            send(ws, **message)
            assert json.loads(ws.recv(timeout=TIMEOUT))["error"] == code, message
        ws.send("not json")
        assert json.loads(ws.recv(timeout=TIMEOUT))["error"] == "invalid_json"
        send(ws, close_socket=True)  # contexts without text end at once, each with its isFinal
        finals = [json.loads(ws.recv(timeout=TIMEOUT)) for _ in range(MAX_CONTEXTS)]
        assert {f["contextId"] for f in finals} == {f"c{i}" for i in range(MAX_CONTEXTS)}
        assert all(f == {"isFinal": True, "contextId": f["contextId"]} for f in finals)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=TIMEOUT)
        assert ws.close_code == 1000
    assert wait_idle(registry)["active"] == 0


def test_a_clients_contexts_count_against_its_speech_places(server, registry):
    with open_socket(server) as ws:  # two places per client here (half of the engine's four slots)
        for context in ("p", "q", "r"):
            send(ws, text=" ", context_id=context)
        assert json.loads(ws.recv(timeout=TIMEOUT))["error"] == "client_limit"
        send(ws, context_id="p", close_context=True)
        assert json.loads(ws.recv(timeout=TIMEOUT)) == {"isFinal": True, "contextId": "p"}
        send(ws, text=" Now there is room.", context_id="r")
        send(ws, close_socket=True)
        audio, _ = collect(ws, {"q", "r"})
    assert audio["q"] == b"" and audio["r"]
    assert wait_idle(registry)["active"] == 0


def test_close_socket_lets_contexts_finish_and_a_client_that_leaves_frees_its_streams(server, registry):
    with open_socket(server) as ws:
        for piece in [" ", *words(TEXTS["b"])]:
            send(ws, text=piece, context_id="last")
        send(ws, close_socket=True)
        audio, _ = collect(ws, {"last"})
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=TIMEOUT)
    assert audio["last"] == reference_pcm(server, TEXTS["b"])
    with contextlib.closing(open_socket(server)) as ws:
        send(ws, text=" A sentence that is never closed because the client", context_id="gone")
        json.loads(ws.recv(timeout=TIMEOUT))  # its first audio: the stream runs; then the client leaves
    assert wait_idle(registry)["active"] == 0


def test_the_single_context_socket_speaks_until_its_empty_text_then_closes(server, registry):
    with open_socket(server, socket="stream-input") as ws:
        send(ws, text=" ", voice_settings={"stability": 0.5}, generation_config={"chunk_length_schedule": [50]})
        for piece in words(TEXTS["a"]):
            send(ws, text=piece, try_trigger_generation=True)
        send(ws, text="")  # the end of the text
        audio, messages = b"", []
        with pytest.raises(ConnectionClosed):
            while True:
                message = json.loads(ws.recv(timeout=TIMEOUT))
                messages.append(message)
                audio += base64.b64decode(message.get("audio") or "")
    assert ws.close_code == 1000 and messages[-1] == {"isFinal": True}
    assert all("contextId" not in m for m in messages) and all(m["isFinal"] is False for m in messages[:-1])
    check_alignment([(len(base64.b64decode(m["audio"])) / 48000, m["alignment"]) for m in messages[:-1]],
                    "".join(words(TEXTS["a"])))
    assert audio == reference_pcm(server, TEXTS["a"])
    assert wait_idle(registry)["active"] == 0


# -- the HTTP routes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/text-to-speech/ryan/stream", "/v1/text-to-speech/ryan",
                                  "/v1/text-to-speech/ryan/stream/with-timestamps"])
def test_the_http_routes_stream_the_speech_routes_audio_in_the_asked_format(server, path):
    text = TEXTS["b"]
    reference = post_speech(server, text, seed=SEED).content  # the model's default text mode, as here
    for output_format in ("pcm_24000", "pcm_16000", "ulaw_8000"):
        response = httpx.post(f"{server.url}{path}", params={"output_format": output_format},
                              headers={"xi-api-key": KEY}, timeout=TIMEOUT,
                              json={"text": text, "model_id": "eleven_multilingual_v2", "seed": SEED,
                                    "voice_settings": {"stability": 0.4}, "previous_text": None})
        assert response.status_code == 200, response.text
        content = response.content
        if path.endswith("with-timestamps"):  # JSON lines of base64 audio
            lines = [json.loads(line) for line in content.splitlines()]
            assert all(set(line) == {"audio_base64", "alignment", "normalized_alignment"} for line in lines)
            content = b"".join(base64.b64decode(line["audio_base64"]) for line in lines)
            check_http_alignment(lines, text, 1 if output_format == "ulaw_8000" else 2,
                                 int(output_format.rsplit("_", 1)[1]))
        if output_format == "pcm_24000":
            assert content == reference
        else:
            rate = 16000 if output_format == "pcm_16000" else 8000
            resampler = StreamResampler(24000, rate)
            samples = np.frombuffer(reference, "<i2").astype(np.float32) / 32767.0
            expected = to_s16(np.concatenate([resampler.process(samples), resampler.flush()]))
            assert content == (s16_to_ulaw(expected) if rate == 8000 else expected.astype("<i2").tobytes())


def check_http_alignment(lines: list[dict], text: str, sample_bytes: int, rate: int) -> None:
    """ElevenLabs' HTTP alignment: seconds from the start of the response's audio, each line's
    characters within its own audio, in the order of the text, none repeated."""
    timed, audio_s = "", 0.0
    for i, line in enumerate(lines):
        assert line["normalized_alignment"] == line["alignment"]
        seconds = len(base64.b64decode(line["audio_base64"])) / sample_bytes / rate
        if line["alignment"] is not None:
            a = line["alignment"]
            chars, starts, ends = a["characters"], a["character_start_times_seconds"], a["character_end_times_seconds"]
            assert len(chars) == len(starts) == len(ends) > 0
            assert all(audio_s - 1e-3 <= t <= audio_s + seconds + 1e-3 for t in starts + ends), (audio_s, seconds, a)
            assert all(x <= y for x, y in zip(starts, ends)) and starts == sorted(starts)
            timed += "".join(chars)
        assert seconds > 0 or i == len(lines) - 1, "only the last line comes without audio"
        audio_s += seconds
    assert timed and text.startswith(timed), (timed, text)


@pytest.mark.parametrize("query, body, headers, status, code", [
    ({"output_format": "wav_44100"}, {"text": "Hi."}, {"xi-api-key": KEY}, 400, "unsupported_output_format"),
    ({}, {"text": "Hi.", "apply_text_normalization": "always"}, {"xi-api-key": KEY}, 400, None),
    ({}, {"text": "Hi.", "voice_settings": {"speed": 9.0}}, {"xi-api-key": KEY}, 400, None),
    ({}, {"text": "   "}, {"xi-api-key": KEY}, 400, None),
    ({}, {"text": "Hi.", "model_id": "no-such-model"}, {"xi-api-key": KEY}, 404, "model_not_found"),
    ({}, {"text": "Hi.", "seed": -1}, {"xi-api-key": KEY}, 400, None),
    ({}, {"text": "Hi."}, {"xi-api-key": "wrong"}, 401, "invalid_api_key"),
    ({}, {"text": "Hi."}, {}, 401, None),
])
def test_the_http_routes_refuse_what_they_cannot_serve(server, query, body, headers, status, code):
    response = httpx.post(f"{server.url}/v1/text-to-speech/ryan/stream", params=query, json=body, headers=headers,
                          timeout=TIMEOUT)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and (code is None or error["code"] == code)


# -- a published client ---------------------------------------------------------------------------------


@pytest.mark.parametrize("service_name", ["ElevenLabsTTSService", "ElevenLabsHttpTTSService"])
def test_pipecats_elevenlabs_services_speak_here(server, registry, monkeypatch, service_name):
    """Pipecat's own ElevenLabs services (pipecat-ai), their address changed, in a pipeline run by its own
    test runner: the socket service (tokens in as they come) and the HTTP one (`/stream/with-timestamps`).
    A spoken sentence comes back as audio frames at the pipeline's 16 kHz between the started and stopped
    frames (their seed is the server's choice: the bytes are not compared)."""
    pytest.importorskip("pipecat")
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSStartedFrame, TTSStoppedFrame, TTSTextFrame
    from pipecat.services.elevenlabs import tts

    service_class = getattr(tts, service_name)
    settings = service_class.Settings(voice="ryan", model="tts-1")

    def make_service(session):
        if service_class is tts.ElevenLabsTTSService:
            return service_class(api_key=KEY, url=f"ws://{server.host}:{server.port}", settings=settings)
        return service_class(api_key=KEY, base_url=server.url, aiohttp_session=session, settings=settings)

    down, up = run_pipecat(make_service, TEXTS["a"], 16000, monkeypatch)
    assert not [f for f in [*down, *up] if isinstance(f, ErrorFrame)], [*down, *up]
    kinds = [type(f) for f in down if isinstance(f, (TTSStartedFrame, TTSAudioRawFrame, TTSStoppedFrame))]
    assert kinds[0] is TTSStartedFrame and kinds[-1] is TTSStoppedFrame and TTSAudioRawFrame in kinds
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert all(f.sample_rate == 16000 and f.num_channels == 1 for f in audio)
    assert sum(len(f.audio) for f in audio) >= 2 * 16000 * 6 // 25  # at least the budget's 6 frames of 80 ms
    # the words said, each timed by the alignment (without one, Pipecat gives the whole text at the end)
    spoken = [f for f in down if isinstance(f, TTSTextFrame)]
    assert " ".join(f.text for f in spoken) == TEXTS["a"]
    assert [f.pts for f in spoken] == sorted(f.pts for f in spoken) and spoken[0].pts < spoken[1].pts
    assert wait_idle(registry)["active"] == 0
