"""ElevenLabs' text to dialogue (api/speaking/dialogue.py, api/routes/elevenlabs.py) through the official
`elevenlabs` SDK against a real uvicorn: `text_to_dialogue.convert`, `.stream`, `.convert_with_timestamps` and
`.stream_with_timestamps`, also under `/elevenlabs`; the web console's raw PCM request; the lines back to back
at the sample level (the dialogue's PCM is each line's own speech-route PCM, joined: no sample added or lost
between them); the next line made while the one before it plays (its first audio exists before the dialogue
needs it, unless its client has no place for it early); a client that leaves freeing every line; and the
limits and refusals in the envelope, with ElevenLabs' `detail` beside it.

The engine is deterministic and every stream short (`short_stream_registries`): equal requests, equal bytes.
"""

from __future__ import annotations

import asyncio
import base64
import io

import av
import numpy as np
import pytest
import soundfile

from qwen3_tts_gguf.engine.request import SynthesisResult
from qwen3_tts_gguf.model.settings import EngineSettings

from api import ServerConfig
from api.limits import ServerLimits
from api.ops.clients import Client, ClientLimiter
from api.speaking.dialogue import DialogueLine, LineChain, _joined, plan_dialogue
from api.speaking.start import start_stream
from api.state import AppState
from tests.server_fixtures import FixtureValue, registry_fixture, server_fixture, short_stream_registries
from tests.test_cli_voices import speechlike
from tests.ws_helpers import KEY, SEED, TIMEOUT, httpx, post_speech, run_async, wait_idle

elevenlabs = pytest.importorskip("elevenlabs")
from elevenlabs.client import ElevenLabs  # noqa: E402
from elevenlabs.core.api_error import ApiError  # noqa: E402
from elevenlabs.types import DialogueInput  # noqa: E402

registry, own_registry = short_stream_registries(max_streams=4, max_pending=8)
server = server_fixture()
mixed_registry = registry_fixture(settings=EngineSettings(threads=1, deterministic=True, max_streams=4, max_pending=8,
                                                          budget_base_frames=6, budget_frames_per_token=1),
                                  models=("tiny_cv", "tiny_base"), name="mixed_registry")
mixed = server_fixture(name="mixed", registry="mixed_registry", voices_dir=FixtureValue("voices_dir"))
small = server_fixture(name="small", limits=ServerLimits(max_dialogue_lines=3, max_dialogue_chars=60,
                                                         max_dialogue_voices=2))
LINES = [("Hello there, how are you today?", "ryan"), ("Fine, thank you.", "vivian"), ("Good to hear it.", "serena")]
TEXT = "".join(text for text, _ in LINES)
RATE = 24000


def sdk(server, base: str = "") -> ElevenLabs:
    return ElevenLabs(api_key=KEY, base_url=f"{server.url}{base}", timeout=TIMEOUT)


def inputs(lines=LINES) -> list[DialogueInput]:
    return [DialogueInput(text=text, voice_id=voice) for text, voice in lines]


def line_pcm(server) -> list[bytes]:
    """Each line alone through the speech route, in its voice, with the dialogue's seed."""
    return [post_speech(server, text, voice=voice, seed=SEED).content for text, voice in LINES]


def test_the_lines_back_to_back_in_their_voices(server, registry):
    client, alone = sdk(server), line_pcm(server)
    assert len(set(alone)) == len(alone)  # three voices, three different sounds
    pcm = b"".join(client.text_to_dialogue.stream(inputs=inputs(), seed=SEED, output_format="pcm_24000"))
    assert pcm == b"".join(alone)  # sample for sample: nothing added or lost between the lines
    mp3 = b"".join(client.text_to_dialogue.convert(inputs=inputs(), seed=SEED, model_id="eleven_v3"))
    with av.open(io.BytesIO(mp3)) as container:  # ElevenLabs' default: mp3 at 44.1 kHz, 128 kb/s
        assert container.streams.audio[0].codec_context.sample_rate == 44100
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert 0 <= len(samples) / 44100 - len(pcm) / 2 / RATE < 0.1
    assert b"".join(sdk(server, "/elevenlabs").text_to_dialogue.convert(inputs=inputs(), seed=SEED)) == mp3
    # the web console's request: raw PCM s16le at 24 kHz
    response = httpx.post(f"{server.url}/v1/text-to-dialogue/stream", params={"output_format": "pcm_24000"},
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT,
                          json={"inputs": [{"text": t, "voice_id": v} for t, v in LINES], "model_id": "tts-1",
                                "seed": SEED})
    assert response.status_code == 200 and response.content == pcm
    assert response.headers["content-type"] == "audio/pcm"
    assert response.headers["x-qwen3tts-voice"] == "ryan,vivian,serena"
    assert wait_idle(registry)["active"] == 0


def test_with_timestamps_says_where_each_line_starts_and_ends(server):
    client, alone = sdk(server), line_pcm(server)
    timed = client.text_to_dialogue.convert_with_timestamps(inputs=inputs(), seed=SEED, output_format="pcm_24000")
    assert base64.b64decode(timed.audio_base_64) == b"".join(alone)
    chars = timed.alignment.characters
    assert "".join(chars) == TEXT and timed.normalized_alignment == timed.alignment
    starts, ends = timed.alignment.character_start_times_seconds, timed.alignment.character_end_times_seconds
    assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends))
    edges = np.cumsum([0] + [len(pcm) // 2 for pcm in alone]) / RATE
    offsets = np.cumsum([0] + [len(text) for text, _ in LINES])
    segments = timed.voice_segments
    assert [(s.dialogue_input_index, s.voice_id) for s in segments] == [(i, v) for i, (_, v) in enumerate(LINES)]
    for i, segment in enumerate(segments):
        assert (segment.start_time_seconds, segment.end_time_seconds) == (round(edges[i], 3), round(edges[i + 1], 3))
        assert (segment.character_start_index, segment.character_end_index) == (offsets[i], offsets[i + 1])
        span = range(segment.character_start_index, segment.character_end_index)
        assert all(segment.start_time_seconds <= starts[c] <= ends[c] <= segment.end_time_seconds for c in span)

    chunks = list(client.text_to_dialogue.stream_with_timestamps(inputs=inputs(), seed=SEED,
                                                                 output_format="pcm_24000"))
    assert b"".join(base64.b64decode(c.audio_base_64) for c in chunks) == b"".join(alone)
    streamed, at = "", 0
    for chunk in chunks:
        carried = chunk.alignment.characters if chunk.alignment else []
        for segment in chunk.voice_segments:  # indices into this chunk's characters, each in its own line
            assert 0 <= segment.character_start_index < segment.character_end_index <= len(carried)
            line = segment.dialogue_input_index
            assert offsets[line] <= at + segment.character_start_index < at + segment.character_end_index \
                <= offsets[line + 1] and segment.voice_id == LINES[line][1]
        streamed += "".join(carried)
        at += len(carried)
    assert streamed == TEXT


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


def test_a_voice_profile_speaks_its_lines_on_its_base_model(mixed):
    clip = io.BytesIO()
    soundfile.write(clip, speechlike(2.0, RATE, 0), RATE, format="WAV")
    made = httpx.post(f"{mixed.url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT,
                      data={"name": "carol"}, files={"audio_sample": ("clip.wav", clip.getvalue(), "audio/wav")})
    assert made.status_code == 200, made.text
    lines = [("Hello Carol.", "ryan"), ("Hello Ryan, nice to meet you.", "carol")]
    response = httpx.post(f"{mixed.url}/v1/text-to-dialogue", params={"output_format": "pcm_24000"},
                          headers={"xi-api-key": KEY}, timeout=TIMEOUT,
                          json={"inputs": [{"text": t, "voice_id": v} for t, v in lines], "seed": SEED})
    assert response.status_code == 200, response.text
    models = response.headers["x-qwen3tts-model"].split(",")
    assert [m.split("-")[0] for m in models] == ["tiny_cv", "tiny_base"]  # each voice on the model that speaks it
    alone = [post_speech(mixed, text, voice=voice, seed=SEED) for text, voice in lines]
    assert [r.headers["x-qwen3tts-model"] for r in alone] == models
    assert response.content == b"".join(r.content for r in alone)


def run_chain(registry, client: Client | None) -> LineChain:
    """The dialogue of LINES read to its end by a player: each chunk takes as long as its audio plays."""
    state = AppState(ServerConfig(), registry)

    async def play() -> LineChain:
        lines = plan_dialogue(state, [(t, v) for t, v in LINES], {"model": "tts-1", "seed": SEED})
        chain = LineChain(lines, await start_stream(lines[0].plan, client=client), client)
        async for chunk in chain:
            await asyncio.sleep(len(chunk.samples) / RATE)
        return chain

    return run_async(play())


def test_the_next_line_is_made_while_the_line_before_it_plays(server, registry):
    chain = run_chain(registry, None)
    assert chain.result.finish_reason != "error" and [s.line.index for s in chain.spans] == [0, 1, 2]
    for span in chain.spans[1:]:  # its first audio was there before the line before it had ended
        assert span.first_audio_at is not None and span.first_audio_at <= span.needed_at, span
    limiter = ClientLimiter(1)  # a client with one place: the next line is queued only when it is needed
    late = run_chain(registry, Client("one-place", limiter))
    for span in late.spans[1:]:
        assert span.first_audio_at > span.needed_at, span
    assert [s.end - s.start for s in late.spans] == [s.end - s.start for s in chain.spans]  # the same audio
    assert limiter.held("one-place") == 0 and wait_idle(registry)["active"] == 0


def test_a_client_that_leaves_frees_every_line(server, registry):
    long_lines = [{"text": "This line is long enough to be still speaking when its client leaves. " * 3,
                   "voice_id": voice} for voice in ("ryan", "vivian", "ryan")]
    with httpx.stream("POST", f"{server.url}/v1/text-to-dialogue/stream", params={"output_format": "pcm_24000"},
                      headers={"xi-api-key": KEY}, json={"inputs": long_lines}, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        next(response.iter_bytes())
    load = wait_idle(registry)
    assert (load["active"], load["waiting"]) == (0, 0)


def refusal(server, body: dict, query: dict | None = None) -> tuple[int, dict]:
    response = httpx.post(f"{server.url}/v1/text-to-dialogue", params=query or {}, headers={"xi-api-key": KEY},
                          json=body, timeout=TIMEOUT)
    return response.status_code, response.json()


TWO = [{"text": "One.", "voice_id": "ryan"}, {"text": "Two.", "voice_id": "vivian"}]


@pytest.mark.parametrize("body, query, status, param, code", [
    ({"inputs": []}, None, 400, "inputs", None),
    ({"inputs": TWO * 2}, None, 400, "inputs", "too_many_lines"),  # --max-dialogue-lines 3
    ({"inputs": [{"text": "word " * 13, "voice_id": "ryan"}]}, None, 400, "inputs", "string_above_max_length"),
    ({"inputs": [*TWO, {"text": "Three.", "voice_id": "serena"}]}, None, 400, "inputs", "too_many_voices"),
    ({"inputs": [TWO[0], {"text": "Two.", "voice_id": "21m00Tcm4TlvDq8ikWAM"}]}, None, 400, "inputs[1].voice_id",
     None),
    ({"inputs": [{"text": " \n", "voice_id": "ryan"}]}, None, 400, "inputs[0].text", None),
    ({"inputs": TWO, "model_id": "no-such-model"}, None, 404, "model_id", "model_not_found"),
    ({"inputs": TWO}, {"output_format": "wav_44100"}, 400, "output_format", "unsupported_output_format"),
    ({"inputs": TWO, "seed": -1}, None, 400, "seed", None),
    ({"inputs": TWO, "settings": {"stability": 2}}, None, 400, "settings.stability", None),
    ({"inputs": [{"text": "x" * 4097, "voice_id": "ryan"}]}, None, 400, "inputs[0].text", "string_above_max_length"),
    ({"inputs": [{"text": "Hi."}]}, None, 400, "inputs[0].voice_id", "missing_required_parameter"),
])
def test_refusals_in_the_envelope_and_elevenlabs_detail(small, body, query, status, param, code):
    got, answer = refusal(small, body, query)
    error = answer["error"]
    assert got == status and error["param"] == param and (code is None or error["code"] == code), answer
    assert answer["detail"] == {"status": error["code"], "message": error["message"]}


@pytest.mark.parametrize("headers, body, status, code", [
    ({}, {"inputs": TWO}, 401, "invalid_api_key"),  # the middleware's refusals carry it too
    ({"xi-api-key": KEY}, {"inputs": [{"text": "x" * (1 << 20), "voice_id": "ryan"}]}, 413, "payload_too_large"),
])
def test_the_middlewares_refusals_carry_elevenlabs_detail_too(small, headers, body, status, code):
    for path in ("/v1/text-to-dialogue", "/elevenlabs/v1/text-to-speech/ryan"):
        response = httpx.post(f"{small.url}{path}", headers=headers, json=body, timeout=TIMEOUT)
        answer = response.json()
        assert response.status_code == status and answer["error"]["code"] == code, answer
        assert answer["detail"] == {"status": code, "message": answer["error"]["message"]}
    assert "detail" not in httpx.post(f"{small.url}/v1/audio/speech", headers=headers, json=body,
                                      timeout=TIMEOUT).json()  # OpenAI's routes: the envelope alone


def test_the_sdk_sees_the_refusal_and_what_is_ignored_is_named(small):
    with pytest.raises(ApiError) as refused:
        three = [("One.", "ryan"), ("Two.", "vivian"), ("Three.", "serena")]  # two voices allowed
        b"".join(sdk(small).text_to_dialogue.convert(inputs=inputs(three)))
    assert refused.value.status_code == 400 and refused.value.body["detail"]["status"] == "too_many_voices"
    response = httpx.post(f"{small.url}/elevenlabs/v1/text-to-dialogue/with-timestamps", headers={"xi-api-key": KEY},
                          timeout=TIMEOUT, json={"inputs": TWO, "settings": {"stability": 0.5}, "previous_text": "x",
                                                 "use_pvc_as_ivc": False})
    assert response.status_code == 200, response.text
    assert response.headers["x-qwen3tts-ignored-fields"] == "previous_text,use_pvc_as_ivc,settings.stability"


def test_the_joined_result_keeps_every_lines_runaways():
    loop = {"kind": "loop", "action": "retry", "segment": 0, "frame": 60, "period": 4}
    budget = {"kind": "budget", "action": "end", "segment": 0, "frame": 90, "period": 0}
    results = [SynthesisResult(10, 3, "eos", runaway=[loop]), SynthesisResult(20, 4, "budget", runaway=[budget])]
    lines = [DialogueLine(0, "ryan", "Hello", None, 0), DialogueLine(1, "vivian", "there.", None, 5)]
    joined = _joined(results, lines)
    assert (joined.frames, joined.finish_reason, joined.runaway) == (30, "budget", [loop, budget])
