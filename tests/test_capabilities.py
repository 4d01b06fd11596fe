"""GET /v1/capabilities end to end: a real uvicorn server (`ServerThread`) on loopback.

Two tiny converted models are served, a CustomVoice (default; its official text mode is
non-streaming) and a Base model (streaming), with limits off their defaults, so every value of the
document is seen to come from the server's own settings. The document must validate against the
schema the OpenAPI document gives it, and needs the key when the server has one.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import get_args

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import jsonschema
import pytest

from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.text.normalization import LANGUAGES

from api import ModelRegistry, ServerConfig, create_app
from api.limits import ServerLimits
from api.routes.capabilities import Capabilities
from api.schemas import MAX_INPUT_CHARS, ResponseFormat
from api.testing import ServerThread
from tests.server_fixtures import registry_fixture

KEY = "caps-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMITS = ServerLimits(max_body_bytes=512 * 1024, ws_max_message_bytes=32 * 1024, ws_max_session_chars=1234,
                      ws_idle_timeout_s=7.5, ws_max_session_s=90.0, send_timeout_s=12.0, max_sockets_per_client=3)
BUFFERED_S = 4.5


registry = registry_fixture(settings=EngineSettings(threads=1, max_streams=2, max_buffered_audio_s=BUFFERED_S),
                            models=("tiny_cv", "tiny_base"))


@contextlib.contextmanager
def serving(registry: ModelRegistry, api_key: str | None = KEY):
    """A server on `registry` (one at a time: each starts and stops the registry's engines)."""
    app = create_app(ServerConfig(api_key=api_key, webui_dir=None, limits=LIMITS), registry)
    with ServerThread(app) as running:
        yield running


@pytest.fixture
def server(registry):
    with serving(registry) as running:
        yield running


def expected_languages() -> list[str]:
    return list(LANGUAGES)


def component_validator(openapi: dict, name: str) -> jsonschema.protocols.Validator:
    """A JSON Schema validator for `#/components/schemas/<name>` of an OpenAPI 3.1 document."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": openapi["components"]}
    cls = jsonschema.validators.validator_for({"$schema": "https://json-schema.org/draft/2020-12/schema"})
    return cls(schema)


def test_the_document_says_what_this_server_offers_and_validates_against_its_schema(server, registry):
    response = httpx.get(f"{server.url}/v1/capabilities", headers=AUTH)
    assert response.status_code == 200, response.text
    doc = response.json()
    openapi = httpx.get(f"{server.url}/openapi.json").json()
    component_validator(openapi, "Capabilities").validate(doc)
    Capabilities.model_validate(doc)  # extra="forbid": nothing the schema does not name
    assert set(doc) == {"protocols", "formats", "limits", "normalization", "models"}

    protocols = {p["name"]: p for p in doc["protocols"]}
    assert list(protocols) == ["openai-speech", "qtts", "openai-realtime", "elevenlabs-multi-context"]
    assert protocols["openai-speech"] == {
        "name": "openai-speech", "path": "/v1/audio/speech", "subprotocol": None, "version": "v1",
        "features": ["sse", "stream_format", "instructions", "speed", "progress", "text_normalization",
                     "word_timestamps", "subtitles"]}
    assert protocols["qtts"] == {"name": "qtts", "path": "/v1/ws", "subprotocol": "qtts.v1", "version": "1.1",
                                 "features": ["live_text", "resume", "progress", "text_normalization", "usage"]}
    assert protocols["openai-realtime"] == {
        "name": "openai-realtime", "path": "/v1/realtime", "subprotocol": "realtime", "version": "ga",
        "features": ["input_text_buffer", "audio/pcm", "audio/pcmu", "audio/pcma", "progress", "text_normalization"]}
    assert protocols["elevenlabs-multi-context"] == {
        "name": "elevenlabs-multi-context", "path": "/v1/text-to-speech/{voice_id}/multi-stream-input",
        "subprotocol": None, "version": "v1",
        "features": ["contexts", "stream-input", "http", "with-timestamps", "pcm_8000-48000", "ulaw_8000",
                     "alaw_8000", "mp3", "opus", "voices", "models", "speed", "apply_text_normalization",
                     "dialogue"]}

    assert doc["formats"] == list(get_args(ResponseFormat)) == ["mp3", "opus", "aac", "flac", "wav", "pcm"]
    limits = doc["limits"]
    expected = {"max_input_chars": MAX_INPUT_CHARS, "max_body_bytes": 512 * 1024, "ws_max_message_bytes": 32 * 1024,
                "ws_max_session_chars": 1234, "ws_idle_timeout_s": 7.5, "ws_max_session_s": 90.0,
                "max_buffered_audio_s": BUFFERED_S, "send_timeout_s": 12.0, "max_sockets_per_client": 3}
    if hasattr(LIMITS, "resume_window_s"):  # the resume limit is there once the server side of resume is
        expected["resume_window_s"] = LIMITS.resume_window_s
    assert limits == expected
    assert doc["normalization"] == {"languages": expected_languages()}
    assert doc["models"] == [
        {"id": registry.models[0].id, "type": "custom_voice", "default_text_mode": "non-streaming"},
        {"id": registry.models[1].id, "type": "base", "default_text_mode": "streaming"}]
    assert [m["default_text_mode"] for m in doc["models"]] == [m.manifest.default_text_mode for m in registry.models]


def test_resume_window_is_listed_only_where_the_limits_have_it(registry):
    from api.routes.capabilities import client_limits

    without = client_limits(ServerLimits(), 10.0).model_dump(exclude_unset=True)
    assert ("resume_window_s" in without) == hasattr(ServerLimits(), "resume_window_s")

    class WithWindow:  # a ServerLimits that has the field (whatever its default here)
        def __getattr__(self, name):
            return 45.0 if name == "resume_window_s" else getattr(ServerLimits(), name)

    assert client_limits(WithWindow(), 10.0).model_dump(exclude_unset=True)["resume_window_s"] == 45.0


def test_the_route_is_in_the_openapi_document_with_its_response_model(server):
    openapi = httpx.get(f"{server.url}/openapi.json").json()
    operation = openapi["paths"]["/v1/capabilities"]["get"]
    assert set(operation["responses"]) == {"200", "400", "401"}
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Capabilities"}
    for status in ("400", "401"):
        assert operation["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorResponse"}
    schemas = openapi["components"]["schemas"]
    assert set(schemas["Capabilities"]["required"]) == {"protocols", "formats", "limits", "normalization", "models"}
    assert "resume_window_s" not in schemas["Limits"]["required"]
    assert schemas["Protocol"]["properties"]["subprotocol"]["anyOf"] == [{"type": "string"}, {"type": "null"}]


def test_the_key_is_needed_when_the_server_has_one(registry):
    with serving(registry) as keyed:
        for headers, code in (({}, "invalid_api_key"), ({"Authorization": "Bearer wrong"}, "invalid_api_key")):
            response = httpx.get(f"{keyed.url}/v1/capabilities", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == code
        assert httpx.get(f"{keyed.url}/v1/capabilities", headers=AUTH).status_code == 200
    with serving(registry, api_key=None) as open_server:
        response = httpx.get(f"{open_server.url}/v1/capabilities")
        assert response.status_code == 200 and response.json()["models"][0]["id"] == registry.default.id


def test_default_limits_come_through_unchanged(registry):
    """Default limits (what `serve` runs without flags) come through unchanged."""
    defaults = ServerLimits()
    app = create_app(ServerConfig(api_key=None, webui_dir=None, limits=replace(defaults)), registry)
    with ServerThread(app) as running:
        limits = httpx.get(f"{running.url}/v1/capabilities").json()["limits"]
    assert limits["ws_max_session_chars"] == defaults.ws_max_session_chars
    assert limits["ws_idle_timeout_s"] == defaults.ws_idle_timeout_s
    assert limits["max_buffered_audio_s"] == BUFFERED_S  # the engine's setting
