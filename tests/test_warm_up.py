"""`serve --warm-up-voices`: before the port opens, each voice speaks through the engine, so the
first real request in that voice finds its prompt prefix cached; bad names never stop the server."""

from __future__ import annotations

import logging

import httpx
import pytest

from qwen3_tts_gguf.cli import build_parser
from qwen3_tts_gguf.model.settings import EngineSettings

from api import ModelRegistry, ServerConfig, create_app
from api.config import SERVE_WARM_UP_VOICES
from api.testing import ServerThread


def first_request_prefix_hits(model, voices: tuple[str, ...], asked: tuple[str, ...] = ("alloy",),
                              **settings) -> tuple[dict, int]:
    """Engine stats when the server is up (before any request), and the prefix hits after one request in
    each `asked` voice."""
    registry = ModelRegistry.load([model], EngineSettings(threads=1, max_streams=2, **settings))
    try:
        with ServerThread(create_app(ServerConfig(webui_dir=None, warm_up_voices=voices), registry)) as server:
            engine = registry.default.engine
            before = dict(engine.stats)
            with httpx.Client(base_url=server.url, timeout=60) as http:
                for voice in asked:
                    r = http.post("/v1/audio/speech", json={"model": "tts-1", "input": "The first request.",
                                                            "voice": voice, "response_format": "pcm", "max_frames": 2})
                    assert r.status_code == 200 and len(r.content) > 0
            return before, engine.stats["prefix_hits"]
    finally:
        registry.close()


def test_a_warmed_voice_finds_its_prefix_cached(tiny_cv_f32, caplog):
    with caplog.at_level(logging.INFO, logger="api.speaking.warm_up"):
        before, hits = first_request_prefix_hits(tiny_cv_f32, ("alloy", "no-such-voice", "alloy:klingon"))
    assert before["streams_done"] == 1 and before["frames"] == 2  # the warm-up, and nothing else
    assert hits == 1
    assert "warm-up: voice alloy on model" in caplog.text
    assert "warm-up: voice no-such-voice fits no served model; skipped" in caplog.text
    assert "warm-up: voice alloy:klingon fits no served model; skipped" in caplog.text
    before, hits = first_request_prefix_hits(tiny_cv_f32, ())  # the control: no warm-up
    assert before["streams_done"] == 0 and hits == 0
    before, hits = first_request_prefix_hits(tiny_cv_f32, ("alloy:chinese",))  # another language, another prefix
    assert before["streams_done"] == 1 and hits == 0


def test_all_warms_every_speaker_up_to_the_prefix_cache(tiny_cv_f32, caplog):
    speakers = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
    before, hits = first_request_prefix_hits(tiny_cv_f32, ("all",), asked=speakers[::-1])
    assert before["streams_done"] == len(speakers) and hits == len(speakers)  # each voice's first request
    with caplog.at_level(logging.INFO, logger="api.speaking.warm_up"):
        before, hits = first_request_prefix_hits(tiny_cv_f32, ("all",), asked=speakers, prefix_cache=3)
    assert before["streams_done"] == 3 and hits == 3  # the first three: a fourth would evict one of them
    assert "has 9 voices and a prefix cache of 3; warming vivian, serena, uncle_fu" in caplog.text
    before, hits = first_request_prefix_hits(tiny_cv_f32, ("all",), asked=speakers[:1], prefix_cache=0)
    assert before["streams_done"] == 1 and hits == 0  # no cache: one voice still warms the runtimes


def test_a_failing_warm_up_does_not_stop_the_server(tiny_cv_f32, caplog):
    registry = ModelRegistry.load([tiny_cv_f32], EngineSettings(threads=1, max_streams=2))
    real = registry.default.engine.submit

    def broken(request, loop=None):
        registry.default.engine.submit = real
        raise RuntimeError("injected")

    registry.default.engine.submit = broken
    try:
        with caplog.at_level(logging.INFO, logger="api.speaking.warm_up"):
            with ServerThread(create_app(ServerConfig(webui_dir=None, warm_up_voices=("ryan",)), registry)) as server:
                assert httpx.get(server.url + "/ready", timeout=10).status_code == 200
        assert "warm-up: voice ryan on model" in caplog.text and "failed: injected" in caplog.text
    finally:
        registry.close()


def parse_serve(*argv: str) -> ServerConfig:
    return ServerConfig.from_args(build_parser().parse_args(["serve", *argv]), environ={})


def test_the_flag_takes_a_list_or_none(monkeypatch, capsys):
    monkeypatch.delenv("QTTS_WARM_UP_VOICES", raising=False)
    assert parse_serve().warm_up_voices == SERVE_WARM_UP_VOICES == ("alloy",)
    assert parse_serve("--warm-up-voices", "ryan, alloy,,").warm_up_voices == ("ryan", "alloy")
    assert parse_serve("--warm-up-voices", "none").warm_up_voices == ()
    assert parse_serve("--warm-up-voices", "").warm_up_voices == ()
    monkeypatch.setenv("QTTS_WARM_UP_VOICES", "serena")
    assert parse_serve().warm_up_voices == ("serena",)
    assert ServerConfig().warm_up_voices == ()  # an app made in code does not warm up unless asked
    with pytest.raises(SystemExit):
        parse_serve("--warm-up-voices", ",".join(f"v{i}" for i in range(17)))
    assert "at most 16 voice names" in capsys.readouterr().err


def test_the_prefix_cache_is_a_serve_knob(monkeypatch):
    from api.config import engine_settings_from_args

    monkeypatch.delenv("QTTS_PREFIX_CACHE", raising=False)

    def settings(*argv):
        return engine_settings_from_args(build_parser().parse_args(["serve", *argv]), check_devices=False)

    assert settings().prefix_cache == EngineSettings.prefix_cache == 16
    assert settings("--prefix-cache", "0").prefix_cache == 0
    monkeypatch.setenv("QTTS_PREFIX_CACHE", "40")
    assert settings().prefix_cache == 40
