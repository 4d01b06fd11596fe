"""Exceptions: every failure the SDK reports is a `QTTSError`."""

from __future__ import annotations

from typing import Any, Dict, Optional


class QTTSError(Exception):
    """Base class of the SDK's exceptions."""


class APIError(QTTSError):
    """The server refused or failed something; carries its OpenAI error envelope.

    `status` is the HTTP status (None for a WebSocket `error` event, which carries `event`).
    """

    def __init__(self, message: str, *, type: Optional[str] = None, param: Optional[str] = None,
                 code: Optional[str] = None, status: Optional[int] = None,
                 body: Optional[Dict[str, Any]] = None, event: Optional[Dict[str, Any]] = None,
                 retry_after: Optional[float] = None):
        super().__init__(message)
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.status = status
        self.body = body
        """The whole envelope, `{"error": {"message", "type", "param", "code"}}` (HTTP) or the event."""
        self.event = event
        self.retry_after = retry_after

    @classmethod
    def from_envelope(cls, envelope: Any, *, status: Optional[int] = None, event: Optional[Dict[str, Any]] = None,
                      retry_after: Optional[float] = None, fallback: str = "") -> "APIError":
        """The right subclass for an envelope (`{"error": {...}}`; anything else keeps `fallback` as message)."""
        error = envelope.get("error") if isinstance(envelope, dict) else None
        if not isinstance(error, dict):
            error = {}
        code = error.get("code") if isinstance(error.get("code"), str) else None
        kind = _class_for(status, code, error.get("type"))
        return kind(str(error.get("message") or fallback or f"HTTP {status}"), type=error.get("type"),
                    param=error.get("param"), code=code, status=status,
                    body=envelope if isinstance(envelope, dict) else None, event=event, retry_after=retry_after)

    def __str__(self) -> str:
        where = f"{self.status} " if self.status is not None else ""
        return f"{where}{self.code or self.type or 'error'}: {self.message}"


class AuthenticationError(APIError):
    """A missing or wrong API key (401, `invalid_api_key`)."""


class NotFoundError(APIError):
    """An unknown model, voice or path (404)."""


class RateLimitError(APIError):
    """The server or this client is at a limit (429, `rate_limit_error`); `retry_after` says when to retry."""


class ResumeFailed(APIError):
    """The server refused to resume a cut stream (`resume_failed`: unknown or expired token)."""


class TransportError(QTTSError):
    """The server could not be reached, or the connection was lost and could not be resumed."""


class ProtocolError(QTTSError):
    """The server sent something this SDK does not understand, or lacks a protocol it needs."""


def _class_for(status: Optional[int], code: Optional[str], type_: Any) -> type:
    if code == "resume_failed":
        return ResumeFailed
    if status == 401 or code == "invalid_api_key":
        return AuthenticationError
    if status == 429 or type_ == "rate_limit_error":
        return RateLimitError
    if status == 404:
        return NotFoundError
    return APIError
