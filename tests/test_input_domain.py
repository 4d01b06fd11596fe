"""Every input has a domain, written in the schema; the OpenAPI document is the truth.

- The speech request's fields: strict types, bounds, lengths; out of range is 400 naming the field.
- Unknown field names never reach a response header unless they are safe (non-Latin-1 names gave a
  500 after the stream started, CR/LF names no response at all).
- Bytes that are not UTF-8 are 400 `invalid_json`; wrong methods are 405 with the right `Allow`,
  also with the web console mounted at `/`.
- Extreme sampling values the schema accepts synthesise to the end (the codec never gets a
  control code, the sampler never a NaN).
- The OpenAPI document: no 422 anywhere, every error status with the envelope's schema, every
  request body (the multipart voice upload too), every bound.
"""

from __future__ import annotations

import json
import re
import sys

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.voicebank.store import NAME_RE

from api import ServerConfig, create_app
from api.errors import validation_error
from api.schemas import NOT_BLANK_PATTERN, VOICE_NAME_PATTERN, SpeechRequest
from api.speaking.plan import ignored_fields_header
from api.testing import ServerThread
from tests.server_fixtures import registry_fixture

BASE = {"model": "tts-1", "input": "Hello there.", "voice": "ryan", "response_format": "pcm", "max_frames": 2,
        "seed": 3}
SAMPLES_PER_FRAME = 1920


def _refusal(body: dict) -> dict:
    try:
        SpeechRequest.model_validate(body)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
        return validation_error(RequestValidationError(errors)).body()["error"]
    raise AssertionError(f"accepted: {body}")


# -- the speech request's domain (no server) ---------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("top_p", False), ("top_p", True), ("top_p", "0.5"), ("top_p", -0.01), ("top_p", 1.01), ("top_p", float("nan")),
    ("temperature", float("inf")), ("temperature", -1), ("temperature", 100.5), ("temperature", "1"),
    ("temperature", [1]),
    ("top_k", 1.0), ("top_k", -1), ("top_k", 1_000_001), ("top_k", True), ("top_k", 10**30),
    ("repetition_penalty", 0), ("repetition_penalty", 0.009), ("repetition_penalty", 100.5),
    ("repetition_penalty", float("-inf")),
    ("max_frames", 2.0), ("max_frames", 0), ("max_frames", 6001), ("max_frames", "2"), ("max_frames", False),
    ("seed", -1), ("seed", 2**53), ("seed", 2**63), ("seed", 1.0), ("seed", "7"),
    ("speed", 0.2), ("speed", 4.01), ("speed", True), ("speed", "1.0"), ("speed", None),
    ("language", "x" * 33), ("language", 5),
    ("model", ""), ("model", "m" * 257), ("model", 1),
    ("voice", ""), ("voice", "v" * 257), ("voice", {"id": ""}), ("voice", {"id": "v" * 257}), ("voice", 3),
    ("input", " \t\u3000\u2028\x1c"), ("input", 5), ("instructions", "i" * 4097),
    ("text_mode", "live"), ("stream_format", "ws"), ("response_format", "ogg"),
])
def test_values_outside_the_domain_are_refused_naming_the_field(field, value):
    error = _refusal({**BASE, field: value})
    assert error["param"] == field and error["type"] == "invalid_request_error"
    assert error["code"] in ("invalid_value", "string_above_max_length")


@pytest.mark.parametrize("field, value", [
    ("temperature", 0), ("temperature", 1), ("temperature", 100), ("temperature", 1e-300), ("top_p", 0),
    ("top_p", 1), ("top_k", 0), ("top_k", 1_000_000), ("repetition_penalty", 0.01), ("repetition_penalty", 100),
    ("max_frames", 1), ("max_frames", 6000), ("seed", 0), ("seed", 2**53 - 1), ("speed", 4), ("speed", 0.25),
    ("language", ""), ("language", "x" * 32), ("model", "m" * 256), ("voice", {"id": "v" * 256}),
    ("input", "x" * 4096), ("input", " \u3000x"), ("temperature", None), ("max_frames", None),
])
def test_values_inside_the_domain_are_accepted(field, value):
    body = SpeechRequest.model_validate({**BASE, field: value})
    got = getattr(body, field)
    assert got == value or (field == "voice" and got.id == value["id"])


def test_the_blank_pattern_is_the_validators_rule():
    """The schema's `input` pattern refuses exactly what the server refuses (str.strip semantics)."""
    pattern = re.compile(NOT_BLANK_PATTERN)
    for char in map(chr, range(sys.maxunicode + 1)):
        assert (pattern.search(char) is None) == (char.strip() == ""), hex(ord(char))


def test_the_voice_name_pattern_is_the_stores():
    assert VOICE_NAME_PATTERN == NAME_RE.pattern


def test_ignored_field_names_are_echoed_only_when_header_safe():
    assert ignored_fields_header(("lang_code", "stream")) == "lang_code,stream"
    assert ignored_fields_header(("café", "a\r\nX-Evil: 1", "ok", "a,b", "x" * 65, "")) == "ok,+5 more"
    assert ignored_fields_header(("caf\u00e9\u4e00",)) == "+1 more"
    many = tuple(f"f{i:02d}" for i in range(20))
    assert ignored_fields_header(many) == ",".join(many[:16]) + ",+4 more"
    for value in (ignored_fields_header(("\u4e00" * 100,)), ignored_fields_header(many)):
        value.encode("ascii")
        assert "\r" not in value and "\n" not in value


# -- a live server -------------------------------------------------------------------------------


registry = registry_fixture(settings=EngineSettings(threads=1, max_streams=2, max_pending=4))


@pytest.fixture(scope="module", params=["api-only", "with-console"])
def server(request, registry, tmp_path_factory):
    console = None
    if request.param == "with-console":
        console = tmp_path_factory.mktemp("console")
        (console / "index.html").write_text("<h1>console</h1>")
    with ServerThread(create_app(ServerConfig(webui_dir=console), registry)) as running:
        yield running


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def _post_raw(http, content: bytes):
    return http.post("/v1/audio/speech", content=content, headers={"Content-Type": "application/json"})


def _envelope(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("method, path, allow", [
    ("GET", "/v1/audio/speech", "POST"), ("PUT", "/v1/audio/speech", "POST"), ("GET", "/audio/speech", "POST"),
    ("PUT", "/v1/models", "GET"), ("DELETE", "/v1/models", "GET"), ("POST", "/v1/models/tts-1", "GET"),
    ("POST", "/v1/audio/models", "GET"), ("PATCH", "/v1/audio/voices", "GET, POST"),
    ("GET", "/v1/audio/voices/alice", "DELETE"), ("POST", "/health", "GET"), ("DELETE", "/ready", "GET"),
])
def test_wrong_methods_are_405_with_the_routes_allow_header(http, method, path, allow):
    response = http.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert _envelope(response)["code"] == "method_not_allowed"


@pytest.mark.parametrize("path, param", [("/v1/audio/voices?model=" + "m" * 257, "model"),
                                         ("/v1/models/" + "m" * 257, "model_id")])
def test_query_and_path_parameters_have_bounds_too(http, path, param):
    response = http.get(path)
    assert response.status_code == 400 and _envelope(response)["param"] == param


def test_unknown_paths_stay_404(http, server):
    response = http.get("/v1/nothing-here")
    assert response.status_code == 404 and _envelope(response)["code"] == "not_found"


@pytest.mark.parametrize("content", [
    b'{"model": "tts-1", "input": "caf\xe9", "voice": "ryan"}',  # Latin-1, not UTF-8
    b'{"model": "tts-1", "input": "\xff\xfe", "voice": "ryan"}',
    b'{"model": "tts-1", "input": "x", "voice": "ryan", "seed": ' + b"9" * 5000 + b"}",  # past Python's digits
    b'{"model": "tts-1", "input": "x", "voice": "ryan", "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
])
def test_bodies_json_cannot_read_are_invalid_json(http, content):
    response = _post_raw(http, content)
    assert response.status_code == 400
    error = _envelope(response)
    assert error["code"] == "invalid_json" and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("token, field", [(b"NaN", "temperature"), (b"Infinity", "top_p"), (b"-Infinity", "speed"),
                                          (b"1e999", "repetition_penalty")])
def test_non_finite_json_numbers_are_refused(http, token, field):
    body = json.dumps({**BASE, field: 0.5}).replace("0.5", "@").encode().replace(b"@", token)
    response = _post_raw(http, body)
    assert response.status_code == 400 and _envelope(response)["param"] == field


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None,
                                          "application/json; charset=utf-8"])
def test_a_json_body_is_read_as_json_whatever_its_content_type(http, content_type):
    """`curl -d '{...}'` sends application/x-www-form-urlencoded; other clients text/plain or nothing."""
    headers = {"Content-Type": content_type} if content_type else {}
    response = http.post("/v1/audio/speech", content=json.dumps(BASE).encode(), headers=headers)
    assert response.status_code == 200 and len(response.content) == 2 * 2 * SAMPLES_PER_FRAME, response.text
    eleven = http.post("/v1/text-to-speech/ryan", params={"output_format": "pcm_24000"}, headers=headers,
                       content=json.dumps({"text": BASE["input"], "seed": 3}).encode())
    assert eleven.status_code == 200 and eleven.content, eleven.text


@pytest.mark.parametrize("content_type, content, came", [
    ("application/x-www-form-urlencoded", b"model=tts-1&input=Hello&voice=ryan",
     "with Content-Type 'application/x-www-form-urlencoded'"),
    ("multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data; name=\"input\"\r\n\r\nHi\r\n--x--\r\n",
     "with Content-Type 'multipart/form-data; boundary=x'"),
    (None, b"[1, 2]", "without a Content-Type"),
])
def test_a_body_that_is_not_json_is_told_to_send_json(http, content_type, content, came):
    response = http.post("/v1/audio/speech", content=content,
                         headers={"Content-Type": content_type} if content_type else {})
    assert response.status_code == 400
    error = _envelope(response)
    assert error["code"] in ("invalid_json", "invalid_value") and error["param"] is None
    assert f"It came {came}: send a JSON object (as 'Content-Type: application/json')." in error["message"]


def _speak(http, **extra) -> httpx.Response:
    response = http.post("/v1/audio/speech", json={**BASE, **extra})
    assert response.status_code == 200, response.text
    assert len(response.content) == 2 * 2 * SAMPLES_PER_FRAME  # both frames: the stream ended normally
    return response


def test_unsafe_unknown_field_names_never_reach_the_header(http):
    response = _speak(http, **{"caf\u00e9\u4e00": 1, "a\r\nX-Evil: 1": 2, "stream": True, "a b": 3})
    assert response.headers["x-qwen3tts-ignored-fields"] == "stream,+3 more"
    assert "x-evil" not in response.headers
    many = {f"extra_{i:02d}": i for i in range(40)}
    response = _speak(http, **many)
    assert response.headers["x-qwen3tts-ignored-fields"].endswith(",+24 more")


@pytest.mark.parametrize("sampling", [
    {"temperature": 1e-30}, {"temperature": 5e-324}, {"temperature": 100}, {"top_p": 0}, {"top_k": 1_000_000},
    {"top_k": 1}, {"repetition_penalty": 0.01}, {"repetition_penalty": 100},
    {"temperature": 100, "top_k": 0, "top_p": 1, "repetition_penalty": 0.01},
])
def test_extreme_sampling_in_the_domain_speaks_to_the_end(http, sampling):
    _speak(http, **sampling)


# -- the OpenAPI document -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openapi(registry) -> dict:
    return create_app(ServerConfig(webui_dir=None), registry).openapi()


EXPECTED_ERRORS = {
    ("post", "/v1/audio/speech"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/v1/text-to-speech/{voice_id}"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/v1/text-to-speech/{voice_id}/stream"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/v1/text-to-speech/{voice_id}/stream/with-timestamps"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/v1/text-to-speech/{voice_id}/with-timestamps"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/v1/text-to-dialogue"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/v1/text-to-dialogue/stream"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/v1/text-to-dialogue/with-timestamps"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/v1/text-to-dialogue/stream/with-timestamps"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("post", "/dev/captioned_speech"): {400, 401, 403, 404, 408, 413, 429, 500, 503},
    ("get", "/v1/voices"): {400, 401},
    ("get", "/v1/voices/{voice_id}"): {400, 401, 404},
    ("get", "/v2/voices"): {400, 401},
    ("get", "/v1/models"): {400, 401},
    ("get", "/v1/capabilities"): {400, 401},
    ("get", "/v1/models/{model_id}"): {400, 401, 404},
    ("get", "/v1/audio/models"): {400, 401},
    ("get", "/v1/audio/voices"): {400, 401, 404},
    ("post", "/v1/audio/voices"): {400, 401, 403, 404, 408, 409, 413, 429, 500, 503},
    ("delete", "/v1/audio/voices/{voice_id}"): {400, 401, 403, 404},
    ("get", "/health"): {503},
    ("get", "/ready"): {503},
}


def test_openapi_documents_every_status_with_the_envelope_and_never_422(openapi):
    operations = {(method, path): op for path, ops in openapi["paths"].items() for method, op in ops.items()}
    assert set(operations) == set(EXPECTED_ERRORS)
    for key, op in operations.items():
        statuses = {int(s) for s in op["responses"]}
        assert statuses == {200} | EXPECTED_ERRORS[key], key
        for status in EXPECTED_ERRORS[key]:
            schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (key, status)
        if key[0] in ("post", "put", "patch"):
            assert op["requestBody"]["required"] is True, key
    schemas = openapi["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert "422" not in json.dumps(openapi["paths"])
    error = schemas["ErrorDetail"]
    assert set(error["required"]) == {"message", "type", "param", "code"}


def test_openapi_states_every_bound_of_the_speech_request(openapi):
    props = openapi["components"]["schemas"]["SpeechRequest"]["properties"]

    def variant(field: str) -> dict:
        spec = props[field]
        return next(s for s in spec.get("anyOf", [spec]) if s.get("type") != "null")

    for field in ("speed", "temperature", "top_p", "repetition_penalty", "seed", "top_k", "max_frames"):
        spec = variant(field)
        assert "minimum" in spec and "maximum" in spec, field
    assert variant("max_frames") == {"type": "integer", "minimum": 1, "maximum": 6000}
    assert variant("seed")["maximum"] == 2**53 - 1 and variant("top_k")["type"] == "integer"
    for field in ("model", "input", "instructions", "language"):
        assert "maxLength" in variant(field), field
    assert props["input"]["pattern"] == NOT_BLANK_PATTERN
    voice = props["voice"]["anyOf"]
    assert voice[0] == {"type": "string", "minLength": 1, "maxLength": 256}


def test_openapi_documents_the_multipart_voice_upload(openapi):
    body = openapi["paths"]["/v1/audio/voices"]["post"]["requestBody"]
    schema = body["content"]["multipart/form-data"]["schema"]
    props = schema["properties"]
    assert set(props) == {"name", "audio_sample", "audio", "text", "instructions", "model", "language", "overwrite",
                          "consent"}
    assert schema["required"] == ["name"]
    assert props["audio_sample"]["format"] == "binary" and props["overwrite"]["type"] == "boolean"
    assert props["name"]["pattern"] == VOICE_NAME_PATTERN and props["name"]["maxLength"] == 64
    assert all("maxLength" in props[f] for f in ("text", "instructions", "model", "language"))
