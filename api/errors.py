"""OpenAI's error envelope and the one place that maps problems to status codes.

Every error leaves as `{"error": {"message", "type", "param", "code"}}` (all four keys, `param` and
`code` may be null). Routes raise `APIError` (or one of the constructors below); FastAPI's own
validation errors become 400 in the same envelope, never 422 `{"detail": ...}`.

Retry semantics for the OpenAI SDK (it retries 408/409/429/5xx twice by default):
`x-should-retry: false` goes on every error a retry cannot fix; 429 carries `Retry-After`; 503
(engine stopping) carries neither, so a retry may find another instance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"

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

    def response(self) -> JSONResponse:
        headers = dict(self.headers)
        if self.status_code not in _RETRYABLE_STATUS:
            headers.setdefault("x-should-retry", "false")
        return JSONResponse(self.body(), status_code=self.status_code, headers=headers)


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


def unavailable(message: str) -> APIError:
    """503: the engine is not running (starting or shutting down)."""
    return APIError(message, status_code=503, type=SERVER_ERROR, code="unavailable")


def synthesis_failed(message: str) -> APIError:
    """500: the engine failed this request; retrying the same input is unlikely to help."""
    return APIError(f"Synthesis failed: {message}", status_code=500, type=SERVER_ERROR, code="synthesis_failed")


# -- request validation --------------------------------------------------------------------------

_VALIDATION_CODES = {
    "missing": "missing_required_parameter",
    "string_too_long": "string_above_max_length",
    "json_invalid": "invalid_json",
}


def validation_error(exc: RequestValidationError) -> APIError:
    """The first problem of a request body, as OpenAI words it ("Invalid value for 'speed': ...")."""
    errors = exc.errors()
    if not errors:
        return invalid_request("Invalid request.")
    first = errors[0]
    kind = first.get("type", "")
    loc = [part for part in first.get("loc", ()) if part != "body"]
    param = str(loc[0]) if loc and isinstance(loc[0], str) else None
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


# -- handlers ------------------------------------------------------------------------------------


async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return validation_error(exc).response()


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return APIError(message, status_code=exc.status_code, code=code, headers=exc.headers).response()


async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this response is sent, so uvicorn logs the traceback once
    return APIError("The server had an error while processing your request.", status_code=500,
                    type=SERVER_ERROR, code="internal_error").response()


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error, FastAPI's and Starlette's included, with the OpenAI envelope."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
