"""Usage (`api/speaking/usage.py`): the fields of SSE `speech.audio.done` and `/v1/ws` `done`, and the usage log
(`--usage-log`): one JSON line per finished stream across routes, never interleaved.

A real uvicorn server and the tiny random model; every request caps `max_frames` (random weights
rarely say EOS), so each stream makes exactly FRAMES frames.
"""

from __future__ import annotations

import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from qwen3_tts_gguf.model.settings import EngineSettings

from api import ServerConfig
from api.limits import ServerLimits
from api.speaking.usage import USAGE_FIELDS, USAGE_LOG_FIELDS, UsageLog, key_id
from api.testing import ServerThread
from tests.server_fixtures import FixtureValue, server_fixtures
from tests.ws_helpers import httpx, post_speech, speak_live

KEY = "usage-test-key"
TEXT = "Hello there, this is a usage test."
FRAMES = 6
SECONDS_PER_FRAME = 0.08
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def usage_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("usage") / "usage.jsonl"


registry, server = server_fixtures(settings=EngineSettings(threads=1, max_streams=4, max_pending=16), api_key=KEY,
                                   usage_log=FixtureValue("usage_path"),
                                   limits=ServerLimits(max_requests_per_client=16))


def lines(path: Path) -> list[dict]:
    """Every line of the usage log, each of which must be one JSON object."""
    if not path.exists():
        return []
    text = path.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def speech(server: ServerThread, stream_format: str = "audio", text: str = TEXT, **extra) -> httpx.Response:
    """POST /v1/audio/speech of `text` as pcm, FRAMES frames, seed 3; it must be a 200."""
    return post_speech(server, text, KEY, TIMEOUT,
                       **{"stream_format": stream_format, "max_frames": FRAMES, "seed": 3, **extra})


def ws_utterance(server: ServerThread, deltas: list[str]) -> tuple[bytes, dict]:
    """One /v1/ws utterance of `deltas` (FRAMES frames, seed 3): its audio and its `done` event."""
    audio, events = speak_live(server, deltas, KEY, TIMEOUT, max_frames=FRAMES, seed=3)
    return audio, events[-1]


def check_usage(usage: dict, characters: int, audio_bytes: int) -> None:
    assert list(usage) == list(USAGE_FIELDS)
    assert usage["characters"] == characters
    assert usage["frames"] == usage["output_tokens"] == FRAMES
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["audio_seconds"] == pytest.approx(FRAMES * SECONDS_PER_FRAME) == pytest.approx(audio_bytes / 2 / 24000)
    assert 0 < usage["first_audio_s"] < TIMEOUT
    assert usage["normalized_characters"] is None or usage["normalized_characters"] > 0


def test_sse_done_and_ws_done_carry_the_usage_fields(server):
    response = speech(server, "sse")
    events = [json.loads(block[len("data: "):]) for block in response.text.split("\n\n") if block]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert events[-1]["type"] == "speech.audio.done"
    check_usage(events[-1]["usage"], len(TEXT), len(audio))
    audio, done = ws_utterance(server, [TEXT[:7], TEXT[7:20], TEXT[20:]])
    check_usage(done["usage"], len(TEXT), len(audio))
    assert done["usage"]["first_audio_s"] == done["timings"]["first_audio_s"]


def test_the_usage_log_gets_one_line_per_stream_of_every_route(server, usage_path):
    before = len(lines(usage_path))
    audio = speech(server, "audio")
    sse = speech(server, "sse", text="Another text.")
    _, done = ws_utterance(server, ["Hello ", "there."])
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", headers={"Authorization": f"Bearer {KEY}"},
                      timeout=TIMEOUT, json={"model": "tts-1", "input": TEXT, "voice": "ryan", "response_format": "pcm",
                                             "max_frames": 2000}) as leaving:
        next(leaving.iter_bytes())  # some audio, then the client leaves: still accounted (cancelled)
    deadline = threading.Event()
    for _ in range(200):
        if len(lines(usage_path)) >= before + 4:
            break
        deadline.wait(0.05)
    new = lines(usage_path)[before:]
    assert len(new) == 4, new
    for line in new:
        assert list(line) == list(USAGE_LOG_FIELDS) and list(line["usage"]) == list(USAGE_FIELDS)
        assert line["model"] and line["voice"] == "ryan" and line["response_format"] == "pcm"
        assert line["key_id"] == key_id(KEY) and line["time"].endswith("+00:00")
    by_id = {line["request_id"]: line for line in new}
    plain = by_id[audio.headers["x-request-id"]]
    assert (plain["route"], plain["stream_format"], plain["finish_reason"]) == ("/v1/audio/speech", "audio",
                                                                                "max_frames")
    check_usage(plain["usage"], len(TEXT), len(audio.content))
    assert by_id[sse.headers["x-request-id"]]["stream_format"] == "sse"
    assert by_id[sse.headers["x-request-id"]]["usage"]["characters"] == len("Another text.")
    socket_line = by_id[done["id"]]
    assert (socket_line["route"], socket_line["stream_format"]) == ("/v1/ws", None)
    assert socket_line["usage"] == done["usage"]
    cancelled = [line for line in new if line["finish_reason"] == "cancelled"]
    assert len(cancelled) == 1 and cancelled[0]["usage"]["audio_seconds"] > 0
    assert KEY not in usage_path.read_text()  # a fingerprint names the key, never the key


def test_concurrent_streams_write_whole_lines(server, usage_path):
    before = len(lines(usage_path))
    with ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(speech, server, ("audio", "sse")[i % 2], f"Text number {i}.") for i in range(10)]
        jobs += [pool.submit(ws_utterance, server, [f"Socket {i} ", "speaks."]) for i in range(4)]
        for job in jobs:
            job.result()
    new = lines(usage_path)[before:]  # every line parses: none was cut or interleaved
    assert len(new) == 14
    assert sorted(line["usage"]["characters"] for line in new) == sorted(
        [len(f"Text number {i}.") for i in range(10)] + [len(f"Socket {i} speaks.") for i in range(4)])


def test_usage_log_appends_whole_lines_from_many_threads(tmp_path):
    """Lines far longer than a pipe's atomic size, from 16 threads (and two UsageLog objects on the
    same file, as two processes would be): every line intact."""
    path = tmp_path / "usage.jsonl"
    logs = [UsageLog(path), UsageLog(path)]

    def write(worker: int) -> None:
        for i in range(100):
            logs[worker % 2].write({"worker": worker, "i": i, "pad": chr(65 + worker) * 9000})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(write, range(16)))
    written = lines(path)
    assert len(written) == 1600
    assert all(line["pad"] == chr(65 + line["worker"]) * 9000 for line in written)
    assert sorted((line["worker"], line["i"]) for line in written) == [(w, i) for w in range(16) for i in range(100)]


def test_an_unwritable_usage_log_is_logged_not_raised(tmp_path, caplog):
    log = UsageLog(tmp_path / "missing-dir" / "usage.jsonl")
    with pytest.raises(OSError):
        log.check()
    log.write({"a": 1})
    log.write({"a": 2})
    assert sum("cannot append" in r.getMessage() for r in caplog.records) == 1


def test_usage_log_flag_and_variable(monkeypatch, tmp_path):
    from qwen3_tts_gguf.cli import build_parser

    args = build_parser().parse_args(["serve", "--usage-log", str(tmp_path / "u.jsonl")])
    assert ServerConfig.from_args(args, {}).usage_log == tmp_path / "u.jsonl"
    monkeypatch.setenv("QTTS_USAGE_LOG", str(tmp_path / "v.jsonl"))
    assert ServerConfig.from_args(build_parser().parse_args(["serve"]), {}).usage_log == tmp_path / "v.jsonl"
    monkeypatch.delenv("QTTS_USAGE_LOG")
    assert ServerConfig.from_args(build_parser().parse_args(["serve"]), {}).usage_log is None


def test_record_writes_the_line_of_any_socket_route(tmp_path):
    """`utterance.record` accounts every socket protocol's utterances (`/v1/realtime` included)."""
    from types import SimpleNamespace

    import numpy as np

    from qwen3_tts_gguf.engine.request import SynthesisResult

    from api.ops.metrics import Metrics
    from api.speaking.utterance import Ending, Utterance, record

    path = tmp_path / "usage.jsonl"
    state = SimpleNamespace(metrics=Metrics(), config=ServerConfig(usage_log=path, api_key=None))
    plan = SimpleNamespace(served=SimpleNamespace(id="m", model=SimpleNamespace(sample_rate=24000)),
                           voice=SimpleNamespace(label="ryan"), request=SimpleNamespace(text="Whole text."))
    result = SynthesisResult(frames=5, text_tokens=3, finish_reason="eos", codes=np.zeros((5, 16), np.int64))
    utterance = Utterance(id="resp_1", plan=plan, stream=SimpleNamespace(result=result, result_sent=result),
                          encoder=None, response_format="pcm", started_at=0.0, live=False, samples=5 * 1920,
                          first_text_at=1.0, first_audio_at=1.25)
    record(state, utterance, Ending("eos"), "/v1/realtime")
    [line] = lines(path)
    assert (line["request_id"], line["route"], line["key_id"], line["finish_reason"]) == ("resp_1", "/v1/realtime",
                                                                                          None, "eos")
    assert line["usage"] == {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8, "characters": len("Whole text."),
                             "normalized_characters": None, "audio_seconds": 0.4, "frames": 5, "first_audio_s": 0.25,
                             "runaways": 0, "runaway_retries": 0}


def test_normalized_characters_come_from_the_engine_result():
    from types import SimpleNamespace

    from api.speaking.usage import usage

    result = SimpleNamespace(text_tokens=4, frames=10, normalized_chars=None)
    assert usage(result, characters=7, samples=0, sample_rate=24000, first_audio_s=None)["normalized_characters"] \
        is None
    result.normalized_chars = 21  # "$5 on 2026-11-30" spoken as words
    assert usage(result, characters=7, samples=0, sample_rate=24000, first_audio_s=None) == {
        "input_tokens": 4, "output_tokens": 10, "total_tokens": 14, "characters": 7, "normalized_characters": 21,
        "audio_seconds": 0.0, "frames": 10, "first_audio_s": None, "runaways": 0, "runaway_retries": 0}
    # the result not known yet (a client that left): the frames of the audio taken stand in
    assert usage(None, characters=3, samples=1920, sample_rate=24000, first_audio_s=0.5, frames_taken=1)[
        "frames"] == 1
