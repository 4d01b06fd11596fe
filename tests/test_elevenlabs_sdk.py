"""ElevenLabs' official Python SDK (`elevenlabs`) against a real server, its base URL changed as
docs/integrations.md says: speech with no format argument (ElevenLabs' default, mp3 at 44.1 kHz, decoded
here with PyAV), `convert_with_timestamps`, the voice listings (`get_all`, `search`, `get`) and
`models.list()` (the same path as OpenAI's: the SDK's `xi-api-key` header, or the `/elevenlabs` prefix, gets
ElevenLabs' shape; the openai SDK still gets OpenAI's), `apply_text_normalization` and `voice_settings.speed`
honoured, what is not honoured named in `x-qwen3tts-ignored-fields`. The sockets' own default format
(`mp3_44100`) and opus are here too, with the raw client the other socket tests use.

The engine is deterministic and every stream short (`short_stream_registries`), so equal requests give
equal bytes.
"""

from __future__ import annotations

import base64
import io
import json

import av
import numpy as np
import pytest

from api.speaking.elevenlabs_fields import OutputFormat
from tests.server_fixtures import server_fixture, short_stream_registries
from tests.test_elevenlabs import check_alignment, collect, open_socket, send, words
from tests.ws_helpers import KEY, SEED, TIMEOUT, httpx, post_speech, wait_idle

elevenlabs = pytest.importorskip("elevenlabs")
from elevenlabs.client import ElevenLabs  # noqa: E402
from elevenlabs.core.api_error import ApiError  # noqa: E402

registry, own_registry = short_stream_registries(max_streams=4, max_pending=8)
server = server_fixture()
TEXT = "Hello there, this is the first voice."
NUMBERS = "It costs 25 dollars and 40 cents."


def sdk(server, base: str = "", **kwargs) -> ElevenLabs:
    return ElevenLabs(**{"api_key": KEY, **kwargs}, base_url=f"{server.url}{base}", timeout=TIMEOUT)


def decoded(data: bytes) -> tuple[np.ndarray, int, str]:
    """The samples, rate and codec ("mp3" or "opus") of a compressed stream (PyAV)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
        codec = "opus" if container.format.name == "ogg" else container.format.name
        return samples, stream.codec_context.sample_rate, codec


def seconds_of_pcm(data: bytes, rate: int = 24000) -> float:
    return len(data) / 2 / rate


def check_length(data: bytes, reference_s: float, rate: int, codec: str) -> None:
    """`data` decodes as `codec` at `rate`, as long as the reference (plus the codec's delay and padding)."""
    samples, got_rate, got_codec = decoded(data)
    assert (got_rate, got_codec) == (rate, codec)
    assert 0 <= len(samples) / rate - reference_s < 0.1, (len(samples) / rate, reference_s)


# -- speech ----------------------------------------------------------------------------------------------


def test_the_sdks_default_format_is_mp3_at_44100(server, registry):
    client = sdk(server)
    mp3 = b"".join(client.text_to_speech.convert("ryan", text=TEXT, seed=SEED, model_id="eleven_multilingual_v2"))
    reference = post_speech(server, TEXT, seed=SEED).content
    check_length(mp3, seconds_of_pcm(reference), 44100, "mp3")
    assert len(mp3) * 8 / 128_000 == pytest.approx(len(decoded(mp3)[0]) / 44100, abs=0.03)  # 128 kb/s
    streamed = b"".join(client.text_to_speech.stream("ryan", text=TEXT, seed=SEED))
    assert streamed == mp3
    assert wait_idle(registry)["active"] == 0


@pytest.mark.parametrize("output_format, rate, codec", [("mp3_22050_32", 22050, "mp3"),
                                                        ("opus_48000_64", 48000, "opus")])
def test_other_compressed_formats(server, output_format, rate, codec):
    data = b"".join(sdk(server).text_to_speech.convert("ryan", text=TEXT, seed=SEED, output_format=output_format))
    check_length(data, seconds_of_pcm(post_speech(server, TEXT, seed=SEED).content), rate, codec)


def test_convert_with_timestamps_is_the_same_audio_with_its_characters(server):
    client = sdk(server)
    timed = client.text_to_speech.convert_with_timestamps("ryan", text=TEXT, seed=SEED)
    audio = base64.b64decode(timed.audio_base_64)
    assert audio == b"".join(client.text_to_speech.convert("ryan", text=TEXT, seed=SEED))
    alignment = timed.alignment
    assert timed.normalized_alignment == alignment
    chars, starts, ends = (alignment.characters, alignment.character_start_times_seconds,
                           alignment.character_end_times_seconds)
    assert chars and TEXT.startswith("".join(chars)) and len(chars) == len(starts) == len(ends)
    assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends))
    assert ends[-1] <= len(decoded(audio)[0]) / 44100 + 1e-3  # within the audio
    pcm = sdk(server).text_to_speech.convert_with_timestamps("ryan", text=TEXT, seed=SEED, output_format="pcm_24000")
    assert base64.b64decode(pcm.audio_base_64) == post_speech(server, TEXT, seed=SEED).content


def test_apply_text_normalization_and_speed_are_honoured(server):
    client = sdk(server)

    def pcm(**fields) -> bytes:
        return b"".join(client.text_to_speech.convert("ryan", text=NUMBERS, seed=SEED, output_format="pcm_24000",
                                                      **fields))

    assert pcm(apply_text_normalization="on") == post_speech(server, NUMBERS, seed=SEED,
                                                              text_normalization="auto").content
    written = post_speech(server, NUMBERS, seed=SEED).content
    assert pcm(apply_text_normalization="off") == pcm(apply_text_normalization="auto") == pcm() == written
    assert pcm(apply_text_normalization="on") != written
    assert pcm(voice_settings={"speed": 1.5, "stability": 0.5}) == post_speech(server, NUMBERS, seed=SEED,
                                                                                speed=1.5).content


def test_what_is_not_honoured_is_named_in_the_header(server):
    client = sdk(server)
    with client.text_to_speech.with_raw_response.convert(
            "ryan", text=TEXT, seed=SEED, previous_text="Before.", next_text="After.", output_format="pcm_24000",
            voice_settings={"stability": 0.5, "similarity_boost": 0.7, "speed": 1.0}) as response:
        ignored = response.headers["x-qwen3tts-ignored-fields"]
        assert b"".join(response.data)
    assert ignored == "next_text,previous_text,voice_settings.stability,voice_settings.similarity_boost"
    timed = client.text_to_speech.with_raw_response.convert_with_timestamps("ryan", text=TEXT, seed=SEED,
                                                                              previous_request_ids=["r1"])
    assert timed.headers["x-qwen3tts-ignored-fields"] == "previous_request_ids"
    with client.text_to_speech.with_raw_response.convert("ryan", text=TEXT, seed=SEED) as plain:
        assert "x-qwen3tts-ignored-fields" not in plain.headers


# -- voices and models ---------------------------------------------------------------------------------


def test_the_voice_listings_are_the_servers_catalogue(server):
    client = sdk(server)
    catalogue = httpx.get(f"{server.url}/v1/audio/voices", headers={"xi-api-key": KEY}, timeout=TIMEOUT).json()
    ids = [v["id"] for v in catalogue["voices"]]
    voices = client.voices.get_all().voices
    assert [v.voice_id for v in voices] == ids and len(ids) > 10
    ryan = client.voices.get("ryan")
    assert (ryan.voice_id, ryan.name, ryan.category) == ("ryan", "Ryan", "premade")
    assert ryan.labels == {"gender": "male", "language": "en"} and ryan.description
    assert ryan == next(v for v in voices if v.voice_id == "ryan")
    with pytest.raises(ApiError) as refused:
        client.voices.get("21m00Tcm4TlvDq8ikWAM")
    assert refused.value.status_code == 404 and refused.value.body["error"]["code"] == "voice_not_found"

    page, seen = client.voices.search(), []  # ElevenLabs' default page of 10, then the rest by its token
    assert page.total_count == len(ids) and page.has_more and len(page.voices) == 10
    while True:
        seen += [v.voice_id for v in page.voices]
        if not page.has_more:
            break
        page = client.voices.search(next_page_token=page.next_page_token)
    assert seen == ids and page.next_page_token is None
    assert [v.voice_id for v in client.voices.search(search="RYAN").voices] == ["ryan"]
    by_name = client.voices.search(sort="name", sort_direction="asc", page_size=100, voice_type="default").voices
    assert [v.name for v in by_name] == sorted((v.name for v in voices), key=str.lower)
    assert client.voices.search(voice_type="personal").total_count == 0  # no profiles on this server
    assert [v.voice_id for v in client.voices.search(voice_ids=["ryan", "alloy"]).voices] == ["ryan", "alloy"]


@pytest.mark.parametrize("base, kwargs", [
    ("", {}),  # the SDK sends its key as xi-api-key: /v1/models answers in ElevenLabs' shape
    ("/elevenlabs", {"api_key": None, "headers": {"Authorization": f"Bearer {KEY}"}}),  # the prefix, no xi-api-key
])
def test_models_list_in_elevenlabs_shape_and_openais_still_works(server, registry, base, kwargs):
    models = sdk(server, base, **kwargs).models.list()
    openai_ids = [m["id"] for m in httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                                             timeout=TIMEOUT).json()["data"]]
    assert [m.model_id for m in models] == openai_ids
    first = models[0]
    assert first.model_id == registry.default.id and first.can_do_text_to_speech is True
    assert {lang.language_id for lang in first.languages} >= {"en", "zh"}
    from openai import OpenAI

    listed = OpenAI(base_url=f"{server.url}/v1", api_key=KEY).models.list()
    assert [m.id for m in listed.data] == openai_ids


def test_every_elevenlabs_route_is_also_under_the_prefix(server):
    client = sdk(server, "/elevenlabs")
    assert b"".join(client.text_to_speech.convert("ryan", text=TEXT, seed=SEED)) == \
        b"".join(sdk(server).text_to_speech.convert("ryan", text=TEXT, seed=SEED))
    assert client.voices.get_all() == sdk(server).voices.get_all()
    for path in ("/v2/voices", "/v1/voices/ryan", "/elevenlabs/v1/voices", "/elevenlabs/v2/voices",
                 "/elevenlabs/v1/models"):
        assert httpx.get(f"{server.url}{path}", timeout=TIMEOUT).status_code == 401, path  # the key is needed
    assert httpx.post(f"{server.url}/elevenlabs/v1/audio/speech", headers={"xi-api-key": KEY},
                      timeout=TIMEOUT).status_code == 404  # OpenAI's routes are not under it
    with open_socket(server, base="/elevenlabs") as ws:
        for piece in [" ", *words(TEXT)]:
            send(ws, text=piece, context_id="x")
        send(ws, context_id="x", close_context=True)
        assert collect(ws, {"x"})[0]["x"]


# -- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("voice, fields, status, param", [
    ("ryan", {"text": " \n"}, 400, "text"),
    ("ryan", {"text": TEXT, "voice_settings": {"speed": 9.0}}, 400, "voice_settings.speed"),
    ("ryan", {"text": TEXT, "model_id": "no-such-model"}, 404, "model_id"),
    ("nobody", {"text": TEXT}, 400, "voice_id"),
])
def test_refusals_name_elevenlabs_fields(server, voice, fields, status, param):
    with pytest.raises(ApiError) as refused:
        b"".join(sdk(server).text_to_speech.convert(voice, **fields))
    error = refused.value.body["error"]
    assert refused.value.status_code == status and error["param"] == param, error
    assert refused.value.body["detail"] == {"status": error["code"], "message": error["message"]}
    assert "'input'" not in error["message"] and "'speed'" not in error["message"]


def test_a_missing_key_is_asked_for_in_elevenlabs_header(server):
    with pytest.raises(ApiError) as refused:
        b"".join(sdk(server, api_key=None).text_to_speech.convert("ryan", text=TEXT))
    assert refused.value.status_code == 401 and "'xi-api-key: <key>'" in refused.value.body["detail"]["message"]
    for socket in ("multi-stream-input", "stream-input"):
        with open_socket(server, key=None, socket=socket) as ws:
            assert "'xi-api-key: <key>'" in json.loads(ws.recv(timeout=TIMEOUT))["message"]


def test_elevenlabs_routes_not_served_answer_404_with_what_to_use_instead(server):
    """404 where the path is none of this server's (`/v1/voices/add` only looks like a voice's); a voice is one,
    so deleting it is 405 (with `Allow`), saying what to use instead all the same."""
    client = sdk(server)
    for call, status, instead in [
            (lambda: client.voices.ivc.create(name="mine", files=[("clip.wav", io.BytesIO(b"RIFF"), "audio/wav")]),
             404, "POST /v1/audio/voices (multipart: name, audio_sample"),  # instant voice cloning
            (lambda: client.text_to_voice.design(voice_description="A calm, deep voice, speaking slowly and warmly."),
             404, "POST /v1/audio/voices (multipart: name, instructions"),
            (lambda: client.speech_to_text.convert(model_id="scribe_v1", file=io.BytesIO(b"RIFF")),
             404, "POST /v1/text-to-speech/{voice_id}"),
            (lambda: client.voices.delete("ryan"), 405, "DELETE /v1/audio/voices/{id}")]:
        with pytest.raises(ApiError) as refused:
            call()
        detail = refused.value.body["detail"]
        assert refused.value.status_code == status and instead in detail["message"], detail
        assert detail["status"] == {404: "not_found", 405: "method_not_allowed"}[status]
        assert refused.value.body["error"]["message"] == detail["message"]
        assert status == 404 or refused.value.headers["allow"] == "GET"
    assert client.voices.get("ryan").voice_id == "ryan"  # (what is served still is)


# -- the sockets' formats -------------------------------------------------------------------------------


@pytest.mark.parametrize("output_format, rate, codec", [(None, 44100, "mp3"), ("opus_48000_32", 48000, "opus"),
                                                        ("mp3_22050_32", 22050, "mp3")])
@pytest.mark.parametrize("socket", ["multi-stream-input", "stream-input"])
def test_the_sockets_compressed_formats(server, registry, socket, output_format, rate, codec):
    """No `output_format`: ElevenLabs' socket default, mp3 at 44.1 kHz. Each message is the next bytes of one
    stream; its characters are timed by the audio those bytes carry (`AudioClock`)."""
    audio, messages = b"", []
    with open_socket(server, socket=socket, output_format=output_format, apply_text_normalization="off") as ws:
        for piece in [" ", *words(TEXT)]:
            send(ws, text=piece, **({"context_id": "x"} if socket == "multi-stream-input" else {}))
        send(ws, **({"context_id": "x", "close_context": True} if socket == "multi-stream-input" else {"text": ""}))
        while True:
            message = json.loads(ws.recv(timeout=TIMEOUT))
            if message.get("isFinal"):
                break
            messages.append(message)
            audio += base64.b64decode(message["audio"])
    clock = OutputFormat.parse(output_format, 24000, "mp3_44100").clock()
    check_alignment([(clock.seconds(base64.b64decode(m["audio"])), m["alignment"]) for m in messages],
                    "".join(words(TEXT)), tolerance_ms=1)
    reference = post_speech(server, "".join(words(TEXT)), text_mode="streaming", seed=SEED).content
    check_length(audio, seconds_of_pcm(reference), rate, codec)
    assert wait_idle(registry)["active"] == 0


def test_a_contexts_voice_settings_speed_is_honoured(server):
    with open_socket(server) as ws:
        send(ws, text=" ", context_id="fast", voice_settings={"speed": 2.0, "stability": 0.3})
        send(ws, text=" ", context_id="bad", voice_settings={"speed": "fast"})
        assert json.loads(ws.recv(timeout=TIMEOUT))["error"] == "invalid_value"
        for piece in words(TEXT):
            send(ws, text=piece, context_id="fast")
        send(ws, context_id="fast", close_context=True)
        audio, _ = collect(ws, {"fast"})
    reference = post_speech(server, "".join(words(TEXT)), text_mode="streaming", seed=SEED, speed=2.0).content
    assert audio["fast"] == reference


@pytest.mark.parametrize("normalization, expected", [("on", "auto"), ("auto", "off")])
def test_the_sockets_apply_text_normalization(server, normalization, expected):
    with open_socket(server, apply_text_normalization=normalization) as ws:
        for piece in [" ", *words(NUMBERS)]:
            send(ws, text=piece, context_id="n")
        send(ws, context_id="n", close_context=True)
        audio, _ = collect(ws, {"n"})
    assert audio["n"] == post_speech(server, "".join(words(NUMBERS)), text_mode="streaming", seed=SEED,
                                     text_normalization=expected).content
