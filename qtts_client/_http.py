"""HTTP with the standard library only (urllib): JSON and audio bodies, the error envelope."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from .errors import APIError, ProtocolError, TransportError

DEFAULT_BASE_URL = "http://127.0.0.1:8100"
BASE_URL_ENV = "QTTS_BASE_URL"
API_KEY_ENV = "QTTS_API_KEY"
USER_AGENT = "qtts-client/0.1"
MAX_ERROR_BODY = 64 * 1024


Verify = Union[bool, str, "os.PathLike[str]", ssl.SSLContext]
"""How an https:// server's certificate is checked: True (the system's CAs), a CA file (PEM) to trust,
an `ssl.SSLContext` of your own, or False (not at all: only for a test bench)."""


def tls_context(verify: Verify) -> ssl.SSLContext:
    """The TLS context `verify` asks for (HTTP and the WebSocket use the same)."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if verify is True:
        return ssl.create_default_context()
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=os.fspath(verify))


@dataclass(frozen=True)
class Endpoint:
    """Where the server is and how to reach it.

    `base_url` is the server root (`http://host:port`, `https://example.com/tts` behind a proxy's path
    prefix; a trailing `/v1`, as OpenAI clients write it, is accepted). `proxy` is an HTTP proxy URL for
    both HTTP and the WebSocket; None = direct. `tls` is the TLS context of an https:// server (None for
    http://).
    """

    base_url: str
    api_key: Optional[str] = None
    timeout: float = 60.0
    proxy: Optional[str] = None
    tls: Optional[ssl.SSLContext] = None

    @classmethod
    def make(cls, base_url: Optional[str] = None, api_key: Optional[str] = None, timeout: float = 60.0,
             proxy: Optional[str] = None, verify: Verify = True) -> "Endpoint":
        """`base_url` and `api_key` default to $QTTS_BASE_URL (else 127.0.0.1:8100) and $QTTS_API_KEY;
        `verify`: see `Verify`."""
        url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        return cls(url, key, timeout, proxy, tls_context(verify) if scheme == "https" else None)

    def http_url(self, path: str) -> str:
        return self.base_url + path

    def ws_url(self, path: str, key_in_query: bool = False) -> str:
        url = "ws" + self.base_url[len("http"):] + path
        if key_in_query and self.api_key:
            url += "?" + urllib.parse.urlencode({"api_key": self.api_key})
        return url

    def headers(self) -> Dict[str, str]:
        headers = {"User-Agent": USER_AGENT}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def request(endpoint: Endpoint, method: str, path: str, body: Optional[Dict[str, Any]] = None,
            accept: str = "application/json") -> bytes:
    """The response body of `method path` (APIError for an error status, TransportError when unreachable)."""
    headers = {**endpoint.headers(), "Accept": accept}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(endpoint.http_url(path), data=data, method=method, headers=headers)
    proxies = {"http": endpoint.proxy, "https": endpoint.proxy} if endpoint.proxy else {}
    handlers: list = [urllib.request.ProxyHandler(proxies)]
    if endpoint.tls is not None:
        handlers.append(urllib.request.HTTPSHandler(context=endpoint.tls))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(req, timeout=endpoint.timeout) as response:
            return response.read()
    except urllib.error.HTTPError as e:
        raise _api_error(e) from None
    except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out, cut mid-body
        reason = getattr(e, "reason", e)
        raise TransportError(f"{method} {endpoint.http_url(path)} failed: {reason}") from e


def get_json(endpoint: Endpoint, path: str) -> Dict[str, Any]:
    raw = request(endpoint, "GET", path)
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ProtocolError(f"GET {path} did not answer a JSON object")
    return doc


def _api_error(e: urllib.error.HTTPError) -> APIError:
    try:
        raw = e.read(MAX_ERROR_BODY)
    except OSError:
        raw = b""
    finally:
        e.close()
    try:
        envelope = json.loads(raw)
    except ValueError:
        envelope = None
    retry_after = None
    header = e.headers.get("Retry-After") if e.headers is not None else None
    if header:
        try:
            retry_after = float(header)
        except ValueError:
            pass
    fallback = raw.decode("utf-8", "replace")[:200] or str(e.reason)
    return APIError.from_envelope(envelope, status=e.code, retry_after=retry_after, fallback=fallback)
