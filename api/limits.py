"""The server's limits on size, time and count: one dataclass, each with its documented default.

Every limit is answered with an OpenAI envelope (`api/errors.py`): 413 for sizes, 429 for counts,
a WebSocket `error` event and close for socket limits. `docs/reliability.md` lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024
MAX_RESUME_WINDOW_S = 600.0
"""The longest `resume_window_s`: a lost stream holds its engine slot while it waits."""


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what one client may send or hold. `serve` flags set each one."""

    # -- HTTP requests ------------------------------------------------------------------------
    max_body_bytes: int = 1 * MiB
    """A JSON request body (413 above)."""
    max_upload_bytes: int = 25 * MiB
    """A multipart body (voice upload: one audio file and a few text fields; OpenAI's 25 MB)."""
    max_form_fields: int = 8
    """Parts of a multipart voice upload (one of them a file)."""
    body_timeout_s: float = 30.0
    """A request body must arrive within this many seconds of its headers (else 408 / dropped)."""
    header_timeout_s: float = 10.0
    """A connection must send a complete request head within this many seconds of opening (or of
    its previous response) or it is closed."""
    max_connections: int = 256
    """Open HTTP connections and WebSockets in all (uvicorn's limit_concurrency: 503 above)."""
    max_requests_per_client: int | None = None
    """Active plus waiting speech streams of one client (its address, see `api/clients.py`: the one
    shared API key names no client); None = half the slots of the default model, at least 1 (below
    the slot count, so no client takes them all)."""
    trusted_proxies: tuple[str, ...] = ()
    """Peer addresses whose `X-Forwarded-For` names the client (a load balancer in front)."""
    allowed_hosts: tuple[str, ...] | None = None
    """`Host` names accepted (DNS-rebinding guard); None = the loopback names when bound to a
    loopback address, any host otherwise. `/health` and `/ready` are exempt."""
    send_timeout_s: float = 30.0
    """A client that reads none of its audio for this long is ended (HTTP body or WebSocket)."""
    # -- WebSocket ----------------------------------------------------------------------------
    ws_max_message_bytes: int = 64 * 1024
    """One WebSocket message from a client."""
    ws_max_session_chars: int = 4096
    """Text one live session may take (as `input` of the speech route)."""
    ws_max_session_s: float = 600.0
    """A live session's whole length, from `start` to `done`."""
    ws_idle_timeout_s: float = 30.0
    """A session with no non-empty text for this long is stopped as if `stop` had come."""
    max_sockets: int = 64
    """Open WebSockets in all."""
    max_sockets_per_client: int = 8
    """Open WebSockets of one client."""
    resume_window_s: float = 30.0
    """How long a resumable `/v1/ws` stream whose socket was lost waits, paused, for its `resume`
    before it is cancelled (0 to `MAX_RESUME_WINDOW_S`; 0 = streams are never resumable)."""
    max_detached_streams: int = 16
    """Resumable streams waiting for their `resume` at once, in all (each keeps its client's speech
    place and its engine slot); a stream whose socket is lost past this is cancelled at once."""
    # -- voice work ---------------------------------------------------------------------------
    voice_workers: int = 1
    """Threads that clone and design voices (apart from the speech path)."""
    voice_queue: int = 2
    """Voice jobs waiting for a worker before 429."""

    def __post_init__(self) -> None:
        if not 0 <= self.resume_window_s <= MAX_RESUME_WINDOW_S:
            raise ValueError(f"resume_window_s must be 0 to {MAX_RESUME_WINDOW_S:g} seconds, "
                             f"got {self.resume_window_s}")
        if self.max_detached_streams < 0:
            raise ValueError(f"max_detached_streams must be at least 0, got {self.max_detached_streams}")

    def requests_per_client(self, slots: int) -> int:
        """The per-client cap for a model with `slots` stream slots."""
        if self.max_requests_per_client is not None:
            return self.max_requests_per_client
        return max(1, slots // 2)
