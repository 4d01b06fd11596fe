"""The HTTP layer's pure parts: tables, validation envelope, metrics text, config, import direction."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import get_args

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from qwen3_tts_gguf.audio.formats import FORMATS

from api.config import ServerConfig
from api.errors import validation_error
from api.ops.metrics import Histogram, Metrics
from api.schemas import ResponseFormat, SpeechRequest
from api.speaking.http_body import CONTENT_TYPES
from api.voice_resolution import OFFICIAL_SPEAKERS, OPENAI_VOICES

OPENAI_VOICE_NAMES = {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
                      "verse", "marin", "cedar"}


def test_api_formats_are_the_encoder_formats():
    assert set(get_args(ResponseFormat)) == set(FORMATS) == set(CONTENT_TYPES)


def test_openai_voice_table_covers_the_13_names_with_plain_speakers():
    assert set(OPENAI_VOICES) == OPENAI_VOICE_NAMES
    for name, voice in OPENAI_VOICES.items():
        info = OFFICIAL_SPEAKERS[voice.speaker]
        assert "dialect" not in info.language, f"{name} maps to a dialect speaker"
        assert voice.description


def _validation(body: dict) -> dict:
    try:
        SpeechRequest.model_validate(body)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
        return validation_error(RequestValidationError(errors)).body()["error"]
    raise AssertionError("expected a validation error")


@pytest.mark.parametrize("body, param, code", [
    ({"input": "hi", "voice": "ryan"}, "model", "missing_required_parameter"),
    ({"model": "m", "input": " \n", "voice": "ryan"}, "input", "invalid_value"),
    ({"model": "m", "input": "x" * 4097, "voice": "ryan"}, "input", "string_above_max_length"),
    ({"model": "m", "input": "hi", "voice": {"name": "ryan"}}, "voice", "invalid_value"),
    ({"model": "m", "input": "hi", "voice": "ryan", "speed": 0.2}, "speed", "invalid_value"),
    ({"model": "m", "input": "hi", "voice": "ryan", "response_format": "ogg"}, "response_format", "invalid_value"),
    ({"model": "m", "input": "hi", "voice": "ryan", "temperature": float("inf")}, "temperature", "invalid_value"),
])
def test_validation_errors_name_the_parameter(body, param, code):
    error = _validation(body)
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert param in error["message"]


def test_speech_request_accepts_the_openai_shapes_and_lists_unknown_fields():
    body = SpeechRequest.model_validate({"model": "tts-1", "input": "x" * 4096, "voice": {"id": "ryan"},
                                         "stream": True, "lang_code": "a"})
    assert body.voice_id == "ryan" and body.response_format == "mp3" and body.speed == 1.0
    assert body.ignored_fields == ("lang_code", "stream")


def test_histogram_text_is_cumulative():
    hist = Histogram("h_seconds", "help", (0.1, 1.0))
    for value in (0.05, 0.5, 0.5, 3.0):
        hist.observe(value, model="m")
    lines = list(hist.render())
    assert 'h_seconds_bucket{model="m",le="0.1"} 1' in lines
    assert 'h_seconds_bucket{model="m",le="1"} 3' in lines
    assert 'h_seconds_bucket{model="m",le="+Inf"} 4' in lines
    assert 'h_seconds_count{model="m"} 4' in lines
    assert 'h_seconds_sum{model="m"} 4.05' in lines


def test_stream_metrics_skip_rtf_for_cut_streams():
    metrics = Metrics()
    metrics.stream_finished("m", "eos", audio_s=2.0, wall_s=1.0, first_audio_s=0.1)
    metrics.stream_finished("m", "cancelled", audio_s=1.0, wall_s=5.0, first_audio_s=0.2)
    assert metrics.real_time_factor.series[(("model", "m"),)][0][3] == 1  # one observation of 0.5
    assert metrics.first_audio.series[(("model", "m"),)][1] == pytest.approx(0.3)
    assert metrics.streams.values[(("model", "m"), ("reason", "cancelled"))] == 1


def test_server_config_takes_the_key_from_the_environment():
    args = argparse.Namespace(host="0.0.0.0", port=1, api_key=None, cors_origin=["*"], voices_dir=None)
    assert ServerConfig.from_args(args, {"QTTS_API_KEY": "env-key"}).api_key == "env-key"
    assert ServerConfig.from_args(argparse.Namespace(**{**vars(args), "api_key": "flag"}),
                                  {"QTTS_API_KEY": "env-key"}).api_key == "flag"
    assert ServerConfig.from_args(args, {}).api_key is None
    assert ServerConfig.from_args(args, {}).cors_origins == ("*",)


def test_engine_never_imports_the_server():
    code = ("import sys, qwen3_tts_gguf.cli, qwen3_tts_gguf.engine.scheduler, qwen3_tts_gguf.audio.encoding; "
            "bad = [m for m in ('api', 'fastapi', 'uvicorn', 'starlette') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
