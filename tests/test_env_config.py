"""Operators' configuration: every `serve` flag from its environment variable (`--foo-bar` <->
`QTTS_FOO_BAR`), JSON logs with an access record per request and per WebSocket utterance, and the
gauges an autoscaler watches in /metrics."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import pytest
from websockets.sync.client import connect

from qwen3_tts_gguf.cli import build_parser
from qwen3_tts_gguf.env_flags import env_name

from api.cli_args import SERVE_ENV_PREFIX
from tests.serve_process import ROOT, ServeProcess
from tests.waiting import wait_until

TIMEOUT_S = 60.0


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


FLAGS = [a for a in serve_parser()._actions if env_name(a, SERVE_ENV_PREFIX)]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No flag variable from the environment the tests run in."""
    for action in FLAGS:
        monkeypatch.delenv(env_name(action, SERVE_ENV_PREFIX), raising=False)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def sample(action: argparse.Action) -> tuple[str, object]:
    """A valid value for the flag's variable, and what the flag then holds."""
    if action.nargs == 0:
        return "yes", action.const
    if action.choices:
        text = [c for c in action.choices if c != action.default][0]
    else:
        text = "7"
        try:
            action.type and action.type(text)
        except argparse.ArgumentTypeError:  # a count with a floor (--n-ctx: at least 512)
            text = "7000"
    value = action.type(text) if action.type else text
    if isinstance(action, argparse._AppendAction):
        return f"{text}, {text}", [value, value]
    return text, value


def test_every_flag_reads_its_variable(monkeypatch):
    names = {env_name(a, SERVE_ENV_PREFIX) for a in FLAGS}
    assert len(names) == len(FLAGS) == len([a for a in serve_parser()._actions if a.option_strings]) - 1  # not --help
    assert {"QTTS_API_KEY", "QTTS_VOICES_DIR", "QTTS_MODEL_BASE", "QTTS_MAX_STREAMS", "QTTS_DRAIN_TIMEOUT_S",
            "QTTS_LOG_FORMAT"} <= names
    for action in FLAGS:
        name = env_name(action, SERVE_ENV_PREFIX)
        assert name == "QTTS_" + action.option_strings[-1][2:].upper().replace("-", "_")
        text, expected = sample(action)
        monkeypatch.setenv(name, text)
        assert getattr(parse(), action.dest) == expected, name
        monkeypatch.delenv(name)
        assert getattr(parse(), action.dest) == action.default, name


def test_lists_and_switches(monkeypatch):
    monkeypatch.setenv("QTTS_MODEL", " /m/a, /m/b,,/m/c ")
    monkeypatch.setenv("QTTS_CORS_ORIGIN", "https://a.example,https://b.example")
    monkeypatch.setenv("QTTS_TRUSTED_PROXIES", "10.0.0.0/8")
    args = parse()
    assert args.model == [Path("/m/a"), Path("/m/b"), Path("/m/c")]
    assert args.cors_origin == ["https://a.example", "https://b.example"]
    assert args.trusted_proxies == ["10.0.0.0/8"]
    for text, expected in (("1", True), ("true", True), ("YES", True), ("0", False), ("false", False), ("No", False)):
        monkeypatch.setenv("QTTS_DETERMINISTIC", text)
        assert parse().deterministic is expected, text
    monkeypatch.setenv("QTTS_DETERMINISTIC", "")  # empty: unset
    assert parse().deterministic is False


def test_the_command_line_wins(monkeypatch):
    monkeypatch.setenv("QTTS_MAX_STREAMS", "3")
    monkeypatch.setenv("QTTS_MODEL", "/m/a,/m/b")
    monkeypatch.setenv("QTTS_CORS_ORIGIN", "https://a.example")
    monkeypatch.setenv("QTTS_API_KEY", "from-env")
    args = parse("--max-streams", "8", "--model", "/m/c", "--cors-origin", "*", "--api-key", "from-flag")
    assert (args.max_streams, args.model, args.cors_origin, args.api_key) == (8, [Path("/m/c")], ["*"], "from-flag")
    assert parse().max_streams == 3


@pytest.mark.parametrize("name, text", [("QTTS_MAX_STREAMS", "many"), ("QTTS_DETERMINISTIC", "maybe"),
                                        ("QTTS_LOG_FORMAT", "xml"), ("QTTS_DRAIN_TIMEOUT_S", "-1"),
                                        ("QTTS_REPLICA_ID", "r1.west"), ("QTTS_REPLICA_ID", "r" * 64)])
def test_an_invalid_value_is_a_usage_error(monkeypatch, capsys, name, text):
    monkeypatch.setenv(name, text)
    with pytest.raises(SystemExit) as exited:
        parse()
    assert exited.value.code == 2 and name in capsys.readouterr().err


def test_serve_with_an_invalid_variable_exits_2_before_loading_anything():
    proc = subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", "serve"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "QTTS_MAX_QUEUE": "lots"}, timeout=120)
    assert proc.returncode == 2 and "QTTS_MAX_QUEUE='lots'" in proc.stderr


def gauge(metrics: str, name: str) -> float:
    """The value of `name` (summed over its labels)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith((name + " ", name + "{"))]
    assert values, f"{name} missing from /metrics"
    return sum(values)


def test_json_logs_access_records_and_gauges(tiny_cv_f32, tmp_path):
    env = {"QTTS_LOG_FORMAT": "json", "QTTS_MODEL": str(tiny_cv_f32), "QTTS_THREADS": "1", "QTTS_DETERMINISTIC": "1",
           "QTTS_VOICES_DIR": str(tmp_path / "voices")}
    with ServeProcess(log_path=tmp_path / "server.log", env=env) as server, \
            httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
        speech = http.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hello there.", "voice": "alloy",
                                                     "response_format": "pcm", "seed": 1, "max_frames": 4})
        assert speech.status_code == 200
        with connect(server.ws_url, proxy=None, open_timeout=TIMEOUT_S) as ws:
            ws.send(json.dumps({"type": "start", "voice": "alloy", "seed": 1, "max_frames": 4}))
            started = json.loads(ws.recv(timeout=TIMEOUT_S))
            wait_until(lambda: gauge(http.get("/metrics").text, "qtts_streams_waiting_for_text") == 1,
                       "the live stream to wait for text")
            metrics = http.get("/metrics").text
            assert gauge(metrics, "qtts_websocket_sessions") == 1 and gauge(metrics, "qtts_draining") == 0
            for kept in ("qtts_active_streams", "qtts_queue_depth", "qtts_free_slots"):
                gauge(metrics, kept)
            ws.send(json.dumps({"type": "text", "text": "Hello there."}))
            ws.send(json.dumps({"type": "stop"}))
            while not isinstance(message := ws.recv(timeout=TIMEOUT_S), str) or json.loads(message)["type"] != "done":
                pass
        wait_until(lambda: gauge(http.get("/metrics").text, "qtts_websocket_sessions") == 0, "the socket to close")
        server.signal()
        assert server.wait_exit(TIMEOUT_S) == 0

    records = [json.loads(line) for line in server.log().splitlines() if line.strip()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    access = [r for r in records if r["logger"] == "api.access"]
    http_record = next(r for r in access if r["request_id"] == speech.headers["x-request-id"])
    expected = {"method": "POST", "route": "/v1/audio/speech", "status": 200, "voice": "serena", "frames": 4,
                "model": speech.headers["x-qwen3tts-model"], "finish_reason": "max_frames", "audio_s": 0.32}
    assert {key: http_record[key] for key in expected} == expected
    assert http_record["ttfa_s"] > 0 and http_record["rtf"] > 0 and http_record["elapsed_s"] > 0
    ws_record = next(r for r in access if r["request_id"] == started["id"])
    assert ws_record["route"] == "/v1/ws" and ws_record["status"] == 101 and ws_record["voice"] == "serena"
    assert ws_record["frames"] == 4 and ws_record["finish_reason"] == "max_frames" and ws_record["ttfa_s"] > 0
    assert ws_record["rtf"] is None  # a live stream goes at the writer's pace


def numeric_flags(parser: argparse.ArgumentParser | None = None, command: str = ""):
    """(command, action) for every flag of every command whose value is a number."""
    for action in (parser or build_parser())._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from numeric_flags(sub, f"{command} {name}".strip())
        elif action.option_strings and action.type is not None and not action.choices \
                and getattr(action.type, "__name__", "") in ("int", "float"):
            yield command, action


def test_every_numeric_flag_of_every_command_has_a_domain():
    flags = list(numeric_flags())
    assert {(c, a.option_strings[-1]) for c, a in flags} >= {("serve", "--max-streams"), ("serve", "--port"),
                                                             ("synth", "--seed"), ("voice create", "--threads")}
    for command, action in flags:
        name = f"{command} {action.option_strings[-1]}"
        assert action.type not in (int, float), f"{name}: a plain {action.type.__name__} has no domain"
        for text in ("nan", "inf", "-inf", "-1"):
            with pytest.raises((argparse.ArgumentTypeError, ValueError)):
                action.type(text)
                pytest.fail(f"{name} took {text}")


@pytest.mark.parametrize("argv", [
    ["serve", "--max-streams", "0"], ["serve", "--max-streams", "300"],  # llama.cpp holds at most 256 sequences
    ["serve", "--max-queue", "-1"], ["serve", "--threads", "-3"], ["serve", "--max-buffered-audio-s", "nan"],
    ["serve", "--port", "99999"], ["synth", "hello", "--seed", "-1"], ["synth", "hello", "--threads", "100000"],
    ["voice", "create", "v", "--audio", "a.wav", "--trailing-silence", "-1"], ["make-random", "out", "--seed", "-5"],
])
def test_a_number_outside_its_domain_is_a_usage_error(capsys, argv):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2 and f"argument {argv[-2]}: {argv[-1]} is out of range" in capsys.readouterr().err


def test_engine_settings_keep_their_domains():
    from qwen3_tts_gguf.model.settings import MAX_KV_CELLS, MAX_STREAMS, EngineSettings

    EngineSettings(threads=0, max_streams=MAX_STREAMS, max_pending=0, max_pending_live=0, prefix_cache=0)
    for bad in (dict(threads=-1), dict(max_streams=0), dict(max_streams=MAX_STREAMS + 1), dict(max_pending=-1),
                dict(max_buffered_audio_s=float("nan")), dict(max_buffered_audio_s=0.0), dict(prefix_cache=-1),
                dict(codec_threads=-2), dict(n_ctx=-1), dict(n_ctx=MAX_KV_CELLS + 1),
                dict(chunk_frames=()), dict(chunk_frames=(1, 0)), dict(chunk_frames=(17,)), dict(budget_base_frames=0),
                dict(budget_frames_per_token=-1), dict(max_segment_chars=0),  # 0 made submit loop forever
                dict(heap_map_threshold=-5)):
        field = next(iter(bad))
        with pytest.raises(ValueError, match=field):
            EngineSettings(**bad)
