"""Word timings and subtitles (api/speaking/timings.py): words read off the character estimate, each once and
in order; WebVTT and SubRip files FFmpeg (PyAV) reads back cue for cue; and, on a real uvicorn, the speech
route's SSE `speech.word` / `speech.subtitles` events and Kokoro-FastAPI's `POST /dev/captioned_speech`, whose
timings are the ElevenLabs with-timestamps route's (one estimate), with offsets into the text as sent also
when normalization changed it.

The engine is deterministic and every stream short (`short_stream_registries`), so equal requests give equal
bytes and equal timings.
"""

from __future__ import annotations

import base64
import io
import json

import av
import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import TextProgress

from api.speaking.timings import MAX_CUE_CHARS, TimedWord, Timings, subtitles, word_spans
from tests.server_fixtures import server_fixture, short_stream_registries
from tests.ws_helpers import KEY, SEED, TIMEOUT, httpx, post_speech, wait_idle

registry, own_registry = short_stream_registries(max_streams=2, max_pending=4)
server = server_fixture()
TEXT = "Hello there, this is a test of words."
NUMBERS = "It costs 25 dollars, 世界很大。"
RATE = 24000


def progress(spoken: int, basis: str = "frames_per_token") -> TextProgress:
    return TextProgress(spoken, spoken, basis)


# -- the estimate ------------------------------------------------------------------------------------------


def test_words_are_runs_without_spaces_and_each_cjk_character_with_its_punctuation():
    text = "Hello,  world! 世界很大。 It's 25€ (ok)\n👋🏽 end"
    assert [text[a:b] for a, b in word_spans(text)] == [
        "Hello,", "world!", "世", "界", "很", "大。", "It's", "25€", "(ok)", "👋🏽", "end"]
    assert word_spans("") == [] and word_spans(" \n\t") == []


def test_a_word_is_complete_once_its_last_character_is_timed():
    timings = Timings("One two, three")
    timings.piece(0.08, None)  # no progress: the clock moves, nothing is timed
    assert timings.new_words() == [] and timings.new_chars().chars == ""
    timings.piece(0.4, progress(6))  # "One tw": "One" complete, "two," not yet
    [one] = timings.new_words()
    assert one == TimedWord("One", 0.08, pytest.approx(0.08 + 0.4 * 3 / 6), 0, 3, "frames_per_token")
    assert timings.new_chars().chars == "One tw" and timings.new_chars().chars == ""
    timings.piece(0.2, progress(3))  # an estimate never goes back: nothing new
    assert timings.new_words() == []
    timings.rest(progress(14, "final"))  # the rest: at the end, no duration
    two, three = timings.new_words()
    assert (two.word, two.start_s, two.text_start, two.text_end) == ("two,", pytest.approx(0.08 + 0.4 * 4 / 6), 4, 8)
    assert two.end_s == pytest.approx(0.68) and two.basis == "final"  # its last characters came with the rest
    assert three == TimedWord("three", pytest.approx(0.68), pytest.approx(0.68), 9, 14, "final")
    assert timings.new_words() == [] and [w.word for w in timings.words] == ["One", "two,", "three"]


def test_a_dialogue_line_ends_with_all_its_characters():
    timings = Timings("Hi there. Yes.")
    timings.piece(0.16, progress(2))
    timings.up_to(9)  # the first line's end: the rest of it now, with no duration
    assert [(w.word, w.start_s, w.end_s, w.basis) for w in timings.new_words()] == [
        ("Hi", 0.0, pytest.approx(0.16), "frames_per_token"), ("there.", 0.16, 0.16, "final")]
    assert timings.new_chars().chars == "Hi there." and timings.chars.given == 9


def cues(data: str, kind: str) -> list[tuple[float, float, str]]:
    """The cues FFmpeg reads from a WebVTT or SubRip file: (start, end, text)."""
    out = []
    with av.open(io.BytesIO(data.encode()), format={"vtt": "webvtt", "srt": "srt"}[kind]) as container:
        stream = container.streams.subtitles[0]
        for packet in container.demux(stream):
            if packet.size:
                [subtitle] = packet.decode()
                out.append((packet.pts / 1000, (packet.pts + packet.duration) / 1000, subtitle.dialogue.decode()))
    return out


def word(text: str, start: int, end: int, start_s: float, end_s: float) -> TimedWord:
    return TimedWord(text[start:end], start_s, end_s, start, end, "frames_per_token")


@pytest.mark.parametrize("kind", ["vtt", "srt"])
def test_subtitles_are_cues_ffmpeg_reads_back(kind):
    text = "Hello <b> & you. A long sentence that goes on and on past the line\nlength here."
    words = [word(text, a, b, i * 0.5, i * 0.5 + 0.4) for i, (a, b) in enumerate(word_spans(text))]
    file = subtitles(words, text, kind)
    assert file.startswith("WEBVTT\n\n" if kind == "vtt" else "1\n00:00:00,000 --> ")
    read = cues(file, kind)
    first = "Hello <b> & you." if kind == "vtt" else "Hello \uff1cb\uff1e & you."  # SubRip has no escapes
    assert [c[2] for c in read] == [first, "A long sentence that goes on and on past", "the line",
                                    "length here."]  # a sentence's end, the line's length, a line break
    assert [c[:2] for c in read] == [(0.0, 1.9), (2.0, 6.4), (6.5, 7.4), (7.5, 8.4)]
    assert all(len(c[2]) <= MAX_CUE_CHARS for c in read)


def test_words_never_reached_join_the_cue_before():
    text = "Spoken here. Never reached. At all."
    words = [word(text, 0, 6, 0.1, 0.5), word(text, 7, 12, 0.5, 1.0)]
    words += [word(text, a, b, 1.0, 1.0) for a, b in word_spans(text)[2:]]
    assert cues(subtitles(words, text, "vtt"), "vtt") == [(0.1, 1.0, "Spoken here. Never reached. At all.")]
    assert subtitles([], text, "vtt") == "WEBVTT\n" and subtitles([], text, "srt") == ""


# -- the routes ----------------------------------------------------------------------------------------------


def sse(server, text: str, **fields) -> list[dict]:
    response = httpx.post(f"{server.url}/v1/audio/speech", headers={"Authorization": f"Bearer {KEY}"},
                          timeout=TIMEOUT, json={"model": "tts-1", "input": text, "voice": "ryan", "seed": SEED,
                                                 "response_format": "pcm", "stream_format": "sse", **fields})
    assert response.status_code == 200, response.text
    return [json.loads(block[len("data: "):]) for block in response.text.split("\n\n") if block]


def check_words(words: list[dict], text: str, audio_s: float) -> None:
    """Every word of `text`, once, in order, its offsets into `text`, its times within the audio and in order."""
    assert [(w["text_start"], w["text_end"]) for w in words] == word_spans(text)
    assert all(text[w["text_start"]:w["text_end"]] == w["word"] for w in words)
    starts = [w["start_s"] for w in words]
    assert starts == sorted(starts) and all(0 <= w["start_s"] <= w["end_s"] <= audio_s + 1e-3 for w in words)
    bases = [w["basis"] for w in words]
    assert set(bases) <= {"frames_per_token", "final"} and bases == sorted(bases, key=lambda b: b == "final")


def test_sse_word_events_and_subtitles_come_with_the_audio(server, registry):
    events = sse(server, TEXT, word_timestamps=True, subtitles="vtt", progress=True)
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["speech.subtitles", "speech.audio.done"] and kinds[0] == "speech.audio.delta"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert audio == post_speech(server, TEXT, seed=SEED).content  # asking for timings changes no byte
    words = [e for e in events if e["type"] == "speech.word"]
    check_words(words, TEXT, len(audio) / 2 / RATE)
    for event in words:  # each word follows the audio that completed it: its start is within the audio sent
        before = kinds[:events.index(event)]
        sent = sum(len(base64.b64decode(e["audio"])) for e in events[:len(before)] if e["type"] == "speech.audio.delta")
        assert event["start_s"] <= sent / 2 / RATE + 1e-3
    read = cues(events[-2]["text"], "vtt")
    assert " ".join(c[2] for c in read) == TEXT and read[0][0] == words[0]["start_s"]
    plain = sse(server, TEXT)
    assert [e["type"] for e in plain if e["type"] not in ("speech.audio.delta",)] == ["speech.audio.done"]
    assert wait_idle(registry)["active"] == 0


def test_word_offsets_point_into_the_text_as_sent_when_normalization_changes_it(server):
    events = sse(server, NUMBERS, word_timestamps=True, subtitles="srt", text_normalization="auto")
    audio_s = sum(len(base64.b64decode(e["audio"])) for e in events if e["type"] == "speech.audio.delta") / 2 / RATE
    words = [e for e in events if e["type"] == "speech.word"]
    check_words(words, NUMBERS, audio_s)
    assert "25" in [w["word"] for w in words]  # spoken as "twenty-five", still the "25" sent
    assert " ".join(c[2] for c in cues(events[-2]["text"], "srt")) == NUMBERS


def test_the_estimate_is_one_for_sse_kokoro_and_elevenlabs(server):
    """For pcm at the model's rate every route's clock is the same samples: the same words, the same times."""
    words = [e for e in sse(server, TEXT, word_timestamps=True) if e["type"] == "speech.word"]
    lines = [json.loads(line) for line in httpx.post(
        f"{server.url}/dev/captioned_speech", headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT,
        json={"model": "tts-1", "input": TEXT, "voice": "ryan", "seed": SEED, "response_format": "pcm"}
    ).content.splitlines()]
    kokoro = [w for line in lines for w in line["timestamps"]]
    assert kokoro == [{"word": w["word"], "start_time": w["start_s"], "end_time": w["end_s"]} for w in words]
    timed = httpx.post(f"{server.url}/v1/text-to-speech/ryan/with-timestamps", params={"output_format": "pcm_24000"},
                       headers={"xi-api-key": KEY}, timeout=TIMEOUT, json={"text": TEXT, "seed": SEED}).json()
    starts = timed["alignment"]["character_start_times_seconds"]
    assert [starts[w["text_start"]] for w in words] == [w["start_s"] for w in words]


def test_kokoro_captioned_speech_in_both_shapes(server):
    def post(**fields) -> httpx.Response:
        response = httpx.post(f"{server.url}/dev/captioned_speech", headers={"Authorization": f"Bearer {KEY}"},
                              timeout=TIMEOUT, json={"model": "tts-1", "input": TEXT, "voice": "ryan", "seed": SEED,
                                                     "response_format": "mp3", "lang_code": "a", **fields})
        assert response.status_code == 200, response.text
        return response

    streamed = post()
    assert streamed.headers["content-type"] == "application/x-ndjson"
    assert streamed.headers["x-qwen3tts-ignored-fields"] == "lang_code"
    lines = [json.loads(line) for line in streamed.content.splitlines()]
    assert all(line["audio_format"] == "audio/mpeg" for line in lines) and lines[-1]["audio"] == ""
    mp3 = b"".join(base64.b64decode(line["audio"]) for line in lines)
    whole = post(stream=False, subtitles="vtt").json()
    assert base64.b64decode(whole["audio"]) == mp3
    assert whole["timestamps"] == [w for line in lines for w in line["timestamps"]]
    assert [w["word"] for w in whole["timestamps"]] == TEXT.split()
    with av.open(io.BytesIO(mp3)) as container:  # the words lie within the audio
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert whole["timestamps"][-1]["end_time"] <= len(samples) / 24000
    assert " ".join(c[2] for c in cues(whole["subtitles"], "vtt")) == TEXT
    assert all(line["timestamps"] == [] for line in
               (json.loads(x) for x in post(return_timestamps=False).content.splitlines()))


@pytest.mark.parametrize("fields, param", [
    ({"word_timestamps": True}, "word_timestamps"),  # SSE only
    ({"subtitles": "vtt"}, "subtitles"),
    ({"subtitles": "ass", "stream_format": "sse"}, "subtitles"),
    ({"word_timestamps": 1, "stream_format": "sse"}, "word_timestamps"),
])
def test_refusals_name_the_field(server, fields, param):
    response = httpx.post(f"{server.url}/v1/audio/speech", headers={"Authorization": f"Bearer {KEY}"},
                          timeout=TIMEOUT, json={"model": "tts-1", "input": TEXT, "voice": "ryan", **fields})
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    kokoro = httpx.post(f"{server.url}/dev/captioned_speech", headers={"Authorization": f"Bearer {KEY}"},
                        timeout=TIMEOUT, json={"model": "tts-1", "input": " ", "voice": "ryan", "stream": "yes"})
    assert kokoro.status_code == 400 and kokoro.json()["error"]["param"] in ("input", "stream")


def test_captioned_speech_needs_the_key(server):
    body = {"model": "tts-1", "input": TEXT, "voice": "ryan"}
    response = httpx.post(f"{server.url}/dev/captioned_speech", json=body, timeout=TIMEOUT)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/dev/captioned_speech", headers={"Authorization": f"Bearer {KEY}"},
                     timeout=TIMEOUT).status_code == 405
