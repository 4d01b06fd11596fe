"""OpenAI's error envelope and the one place that maps problems to status codes.

Every error leaves as `{"error": {"message", "type", "param", "code"}}` (all four keys, `param` and
`code` may be null). Routes raise `APIError` (or one of the constructors below); FastAPI's own
validation errors become 400 in the same envelope, never 422 `{"detail": ...}` (and the OpenAPI
document lists no 422: `document_errors`; routes list their statuses with `error_responses`). A body
that is not UTF-8 is 400 `invalid_json`; one sent as something else than JSON (read as JSON all the
same: `api/ops/middleware.read_as_json`) that is not JSON says what to send. A wrong method is 405
with the path's `Allow`, also where the web console's mount at `/` would have answered 404 or its own 405.
On ElevenLabs' routes (`ELEVENLABS_PATHS`) the body also carries ElevenLabs' own `"detail": {"status",
"message"}` (`status`: the envelope's code), so clients written for either shape read it, and `param` names
ElevenLabs' field (`error_response`; the middleware's refusals too: a missing key, asked for as `xi-api-key`, a
body too large or too slow); one of its routes not served here is 404 saying what to use instead.

Retry semantics for the OpenAI SDK (it retries 408/409/429/5xx twice by default), decided here
and nowhere else:
- `x-should-retry: false` goes on every error a retry cannot fix (4xx other than 408/409/429).
- 429 (busy) always carries `Retry-After`.
- 503 carries `Retry-After` when a retry can cure it: the engine is starting or restarting, the
  server is draining (a load balancer sends the retry to another instance). A 503 for an engine
  that failed for good carries none (the orchestrator's liveness probe replaces the process).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import get_route_path

from api.schemas import ErrorResponse

INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"
CLIENT_CLOSED_REQUEST = 499
"""nginx's status for "the client left before the response": what a route answers to nobody."""

_RETRYABLE_STATUS = {408, 409, 429, 503}


def error_body(message: str, type: str = INVALID_REQUEST, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI envelope (also used in-band as the SSE `error` event's payload)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """A problem answered with the OpenAI envelope and a status code."""

    def __init__(self, message: str, *, status_code: int = 400, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, elevenlabs: bool = False) -> JSONResponse:
        """The answer; `elevenlabs`: with ElevenLabs' own `"detail": {"status", "message"}` beside the envelope."""
        headers = dict(self.headers)
        if self.status_code not in _RETRYABLE_STATUS:
            headers.setdefault("x-should-retry", "false")
        body = self.body()
        if elevenlabs:
            body["detail"] = {"status": self.code or self.type, "message": self.message}
        return JSONResponse(body, status_code=self.status_code, headers=headers)


def invalid_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    """400: the request cannot be served as written."""
    return APIError(message, param=param, code=code)


def model_not_found(model_id: str, available: Sequence[str]) -> APIError:
    """404: no served model (or alias, or folder name) has this id."""
    return APIError(f"The model '{model_id}' does not exist. Available models: {', '.join(available)}.",
                    status_code=404, param="model", code="model_not_found")


def queue_full(waiting: int, retry_after_s: int = 1) -> APIError:
    """429: every slot is busy and the admission queue is full."""
    return APIError(f"The server is busy ({waiting} requests are already waiting); retry shortly.",
                    status_code=429, type=RATE_LIMIT, code="queue_full",
                    headers={"Retry-After": str(retry_after_s)})


def unauthorized(message: str) -> APIError:
    """401: a missing or wrong API key."""
    return APIError(message, status_code=401, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def unavailable(message: str, retry_after_s: int | None = None) -> APIError:
    """503: the engine is not running. `retry_after_s` when a retry can cure it (starting,
    restarting, draining); None when it cannot (the engine failed for good)."""
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return APIError(message, status_code=503, type=SERVER_ERROR, code="unavailable", headers=headers)


def context_length_exceeded(message: str, param: str | None = "input") -> APIError:
    """400: instructions + input + voice reference do not fit one stream's talker context."""
    return APIError(message, param=param, code="context_length_exceeded")


def payload_too_large(message: str, param: str | None = None) -> APIError:
    """413: a request body, form part or message over its size limit."""
    return APIError(message, status_code=413, param=param, code="payload_too_large")


def synthesis_failed(message: str) -> APIError:
    """500: the engine failed this request; retrying the same input is unlikely to help."""
    return APIError(f"Synthesis failed: {message}", status_code=500, type=SERVER_ERROR, code="synthesis_failed")


def engine_refusal(error: BaseException, engine: Any, *, subject: str = "The engine", reason: bool = True,
                   prompt_param: str | None = None) -> APIError | None:
    """The one map from an engine's refusal to the APIError every protocol answers with (each in its own
    envelope); None for any other exception. `engine` (its queue's length for 429), `subject` and `reason` (what is
    not running, and whether its reason is told) and `prompt_param` (the field a PromptError names; None: a
    context overflow is `context_length_exceeded`) are the caller's."""
    from qwen3_tts_gguf import ContextLengthExceeded, EngineBusy, EngineStopped, PromptError

    if isinstance(error, EngineBusy):
        return queue_full(engine.load()["waiting"])
    if isinstance(error, EngineStopped):
        told = f" ({error})" if reason else ""
        return unavailable(f"{subject} is not running{told}; retry.", retry_after_s=error.retry_after_s)
    if isinstance(error, ContextLengthExceeded) and prompt_param is None:
        return context_length_exceeded(str(error), param=error.param)
    if isinstance(error, PromptError):
        return invalid_request(str(error), param=prompt_param)
    return None


# -- request validation --------------------------------------------------------------------------

_VALIDATION_CODES = {
    "missing": "missing_required_parameter",
    "string_too_long": "string_above_max_length",
    "json_invalid": "invalid_json",
}


def validation_error(exc: RequestValidationError) -> APIError:
    """The first problem of a request body, as OpenAI words it ("Invalid value for 'speed': ..."); `param` is
    the field's path (`voice_settings.speed`, `inputs[2].text`)."""
    errors = exc.errors()
    if not errors:
        return invalid_request("Invalid request.")
    first = errors[0]
    kind = first.get("type", "")
    loc = list(first.get("loc", ()))
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    param = _field_path(loc)
    code = _VALIDATION_CODES.get(kind, "invalid_value")
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return invalid_request(f"The request body is not valid JSON{f' ({detail})' if detail else ''}.",
                               code=code)
    if param is None:
        return invalid_request(f"Invalid request body: {first.get('msg', 'invalid value')}.", code=code)
    if kind == "missing":
        return invalid_request(f"Missing required parameter: '{param}'.", param=param, code=code)
    return invalid_request(f"Invalid value for '{param}': {first.get('msg', 'invalid value')}.",
                           param=param, code=code)


def _field_path(loc: Sequence[str | int]) -> str | None:
    """`voice_settings.speed`, `inputs[2].text` of a pydantic location; None when it names no field. A union's
    member tags (`VoiceRef`, `constrained-str`: not lower-case identifiers) are left out."""
    path = ""
    for part in loc:
        if isinstance(part, int) and path:
            path += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier() and part.islower():
            path += f".{part}" if path else part
    return path or None


# -- ElevenLabs' envelope ------------------------------------------------------------------------

ELEVENLABS_PATHS = re.compile(
    r"^(/elevenlabs/|/v2/voices(/|$)|/v1/(text-to-(speech|dialogue|voice|sound-effects)|voices|voice-generation|"
    r"speech-to-(speech|text)|sound-generation|audio-isolation|audio-native|similar-voices|shared-voices|user|history|"
    r"usage|workspace|dubbing|studio|projects|pronunciation-dictionaries|convai|forced-alignment|music|"
    r"single-use-token)(/|$))")
"""ElevenLabs' routes, served here or not (its resources, the `/elevenlabs` prefix): their errors carry ElevenLabs'
`detail`, name ElevenLabs' fields and its key header, and a route not served says what to use instead."""
ELEVENLABS_FIELDS = {"input": "text", "voice": "voice_id", "model": "model_id", "language": "language_code",
                     "speed": "voice_settings.speed", "text_normalization": "apply_text_normalization"}
"""A speech request's fields (`schemas.SpeechRequest`) as ElevenLabs' bodies name them."""
ELEVENLABS_INSTEAD = (
    ("POST", re.compile(r"/v1/voices/(add|pvc)(/.*)?"), 404,
     "a voice is cloned here with POST /v1/audio/voices (multipart: name, audio_sample: a clip of 1-30 s, "
     "optional text: its transcript; a Base model must be served)"),
    (None, re.compile(r"/v1/(text-to-voice|voice-generation)(/.*)?"), 404,
     "a voice is designed here with POST /v1/audio/voices (multipart: name, instructions: the description; "
     "VoiceDesign and Base models must be served)"),
    ("DELETE", re.compile(r"/v1/voices/[^/]+"), 405, "a voice profile is deleted with DELETE /v1/audio/voices/{id}"),
)
"""(method or None: any, path, status, what to use instead) of ElevenLabs' routes not served here that this server
has an answer for: 404 where its path is no resource here (`/v1/voices/add` only looks like a voice's), 405 where
it is one (a voice: it is read here, not deleted)."""
ELEVENLABS_SERVED = ("this server serves ElevenLabs' text to speech (POST /v1/text-to-speech/{voice_id}, /stream, "
                     "/with-timestamps, /stream/with-timestamps; the stream-input and multi-stream-input sockets), "
                     "text to dialogue (POST /v1/text-to-dialogue[/stream][/with-timestamps]) and the voice and "
                     "model lists (GET /v1/voices, /v1/voices/{voice_id}, /v2/voices, /v1/models); its voices are "
                     "made with POST /v1/audio/voices")


def elevenlabs_route(scope: Mapping[str, Any]) -> bool:
    """Whether the request (or socket) of `scope` is on one of ElevenLabs' routes."""
    return bool(ELEVENLABS_PATHS.match(get_route_path(scope)))


def elevenlabs_not_served(method: str, path: str, allowed: Sequence[str]) -> APIError:
    """ElevenLabs' `method` `path` (the route path, `/elevenlabs` too), which no route here takes (`allowed`: the
    methods its path takes), saying what to use instead: 405 where the path is served (`ELEVENLABS_INSTEAD`
    may say otherwise), else 404."""
    route = path.removeprefix("/elevenlabs")
    status, instead = next(((status, text) for wanted, pattern, status, text in ELEVENLABS_INSTEAD
                            if wanted in (None, method) and pattern.fullmatch(route)), (None, None))
    if allowed and status != 404:
        error = method_not_allowed(method, allowed)
        error.message += f" ElevenLabs' {method} {path[:200]} is not served: {instead}." if instead else ""
        return error
    return APIError(f"ElevenLabs' {method} {path[:200]} is not served here: {instead or ELEVENLABS_SERVED}.",
                    status_code=404, code="not_found")


def no_key(scope: Mapping[str, Any], ways: Sequence[str] = ("'Authorization: Bearer <key>'",)) -> APIError:
    """401 for a request or socket that presented no key, saying how to send one (`ways`): on ElevenLabs' routes
    its own header first."""
    if elevenlabs_route(scope):
        ways = ("'xi-api-key: <key>'", *ways)
    return unauthorized(f"You didn't provide an API key: send {', or '.join(ways)}.")


# -- handlers ------------------------------------------------------------------------------------


def error_response(scope: Mapping[str, Any], error: APIError) -> JSONResponse:
    """`error`'s response to the request of `scope`: on ElevenLabs' routes with ElevenLabs' `detail`, `param`
    naming ElevenLabs' field (`ELEVENLABS_FIELDS`)."""
    if not elevenlabs_route(scope):
        return error.response()
    error.param = ELEVENLABS_FIELDS.get(error.param or "", error.param)
    return error.response(elevenlabs=True)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return error_response(request.scope, exc)


SENT_CONTENT_TYPE = "sent_content_type"
"""`scope["state"]` key (`api/ops/middleware.read_as_json`): the Content-Type a body read as JSON came with,
when it was not JSON's ("" for none)."""


def _body_not_json(request: Request, error: APIError) -> APIError:
    """`error` about the body as a whole, saying what to send when the body came as something else than JSON."""
    sent = request.scope.get("state", {}).get(SENT_CONTENT_TYPE)
    if sent is not None and error.param is None:
        came = f"with Content-Type '{sent[:100]}'" if sent else "without a Content-Type"
        error.message += f" It came {came}: send a JSON object (as 'Content-Type: application/json')."
    return error


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(request.scope, _body_not_json(request, validation_error(exc)))


API_PREFIXES = ("/v1/", "/v2/", "/audio/", "/elevenlabs/", "/dev/")
"""Paths that belong to the API (anything else may be a file of the web console): ElevenLabs' `/v2/voices`
and its routes again under `/elevenlabs/` (`api/protocols/elevenlabs_sockets.py`) too, and Kokoro-FastAPI's
`/dev/captioned_speech` (`api/routes/captions.py`)."""
_BODY_PARSE_ERROR = "There was an error parsing the body"  # FastAPI's 400 for a body json.loads refused


def allowed_methods(request: Request) -> list[str]:
    """The methods the app's routes answer at this request's path (empty: no route has the path).

    Starlette answers a wrong method with 405 only when no other route matches the path fully, and
    the web console mounted at `/` matches every path: this recovers the API routes' methods."""
    try:  # recent FastAPI keeps included routers as branches; this walks down to the routes
        from fastapi.routing import iter_route_contexts
        routes = list(iter_route_contexts(request.app.routes))
    except ImportError:  # pragma: no cover - older FastAPI: the app's routes are flat
        routes = list(request.app.routes)
    path = get_route_path(request.scope)
    methods: set[str] = set()
    for route in routes:
        regex, route_methods = getattr(route, "path_regex", None), getattr(route, "methods", None)
        if regex is not None and route_methods and regex.match(path):
            methods.update(route_methods)
    return sorted(methods)


def method_not_allowed(method: str, allowed: Sequence[str]) -> APIError:
    """405 with the `Allow` header listing what the path takes."""
    allow = ", ".join(allowed)
    return APIError(f"Method {method} is not allowed here; use {allow}.", status_code=405,
                    code="method_not_allowed", headers={"Allow": allow})


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code in (404, 405):
        allowed, path = allowed_methods(request), get_route_path(request.scope)
        if request.method not in allowed and elevenlabs_route(request.scope):
            return error_response(request.scope, elevenlabs_not_served(request.method, path, allowed))
        if allowed and request.method not in allowed:
            return error_response(request.scope, method_not_allowed(request.method, allowed))
        if not allowed and path.startswith(API_PREFIXES):  # the console's mount said 405
            return error_response(request.scope, APIError(f"No API route at {request.url.path}.", status_code=404,
                                                   code="not_found"))
    if exc.status_code == 400 and exc.detail == _BODY_PARSE_ERROR:
        # json.loads raised something other than a syntax error: bytes that are not UTF-8, a number
        # past Python's digit limit, nesting past the recursion limit
        reason = "it is not UTF-8 text" if isinstance(exc.__cause__, UnicodeDecodeError) else "it cannot be parsed"
        return error_response(request.scope, _body_not_json(request, invalid_request(
            f"The request body is not valid JSON ({reason}).", code="invalid_json")))
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(exc.status_code)
    return error_response(request.scope, APIError(message, status_code=exc.status_code, code=code, headers=exc.headers))


async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this response is sent, so uvicorn logs the traceback once
    return APIError("The server had an error while processing your request.", status_code=500,
                    type=SERVER_ERROR, code="internal_error").response()


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error, FastAPI's and Starlette's included, with the OpenAI envelope; and keep
    the OpenAPI document true to that (`document_errors`)."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    document_errors(app)


# -- the OpenAPI document -------------------------------------------------------------------------

_ERROR_DESCRIPTIONS = {
    400: "Invalid request: a value outside its domain, malformed JSON, or what the model cannot do "
         "(`param` names the field)",
    401: "Missing or wrong API key (servers started with --api-key)",
    403: "A browser's cross-site request from an origin that is not allowed (`origin_not_allowed`)",
    404: "Unknown model (`model_not_found`), voice profile or path",
    408: "The request body did not arrive in time",
    409: "A voice profile of that name exists already",
    413: "The request body or a form part is over its size limit",
    429: "Busy: every slot is taken and the queue is full, or this client's own limit is reached; "
         "see Retry-After",
    500: "The engine failed before any audio was sent",
    503: "The engine is not running (starting, restarting or stopping); see Retry-After when a retry helps",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route decorator: each status with the error envelope's schema."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        response: dict[str, Any] = {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[status]}
        if status in (429, 503):
            response["headers"] = {"Retry-After": {"description": "seconds to wait before retrying",
                                                   "schema": {"type": "string"}}}
        out[status] = response
    return out


def document_errors(app: FastAPI) -> None:
    """Drop FastAPI's automatic 422 "Validation Error" from the OpenAPI document: validation
    problems are answered 400 in the envelope (routes list that with `error_responses`)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                if isinstance(operation, dict):
                    operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
