"""The server's limits on size, time and count: one dataclass, each with its documented default.

Every limit is answered with an OpenAI envelope (`api/errors.py`): 413 for sizes, 429 for counts,
a WebSocket `error` event and close for socket limits. `docs/reliability.md` lists them all.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from qwen3_tts_gguf.flags import COUNT, COUNT0, SECONDS, number

MiB = 1024 * 1024
MAX_DIALOGUE_LINES = 256
"""The most lines one dialogue may have (`max_dialogue_lines`' ceiling, and the body schema's)."""
MAX_RESUME_WINDOW_S = 600.0
"""The longest `resume_window_s`: a lost stream holds its engine slot while it waits."""


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """Addresses or CIDR blocks ("10.0.0.1", "10.0.0.0/8", "::1") as `trusted_proxies` holds them; ValueError for
    anything else."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def resume_window(text: str) -> float:
    """An argparse type: seconds from 0 to `MAX_RESUME_WINDOW_S`."""
    value = float(text)
    if not 0 <= value <= MAX_RESUME_WINDOW_S:
        raise argparse.ArgumentTypeError(f"{text} is out of range (0 to {MAX_RESUME_WINDOW_S:g} seconds)")
    return value


resume_window.__name__ = "float"


def flag(default: Any, help: str, parse: Any = None, *, repeat: str | None = None) -> Any:
    """A limit with its `serve` flag (`--` + the field's name): the flag's help text and argparse type,
    or `repeat`: a repeatable flag with that metavar (`api/cli_args.py` derives the flags from these)."""
    return field(default=default, metadata={"help": help, "parse": parse, "repeat": repeat})


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what one client may send or hold. Each field is a `serve` flag of the same name (`flag`)."""

    # -- HTTP requests ------------------------------------------------------------------------
    max_body_bytes: int = flag(1 * MiB, "bytes of a JSON request body (413 above)", COUNT)
    """A JSON request body (413 above)."""
    max_upload_bytes: int = flag(25 * MiB, "bytes of a voice upload (multipart; 413 above)", COUNT)
    """A multipart body (voice upload: one audio file and a few text fields; OpenAI's 25 MB)."""
    max_form_fields: int = flag(8, "parts of a voice upload, the audio file included (400 above)", COUNT)
    """Parts of a multipart voice upload (one of them a file)."""
    body_timeout_s: float = flag(30.0, "seconds for a request body to arrive after its headers (408)", SECONDS)
    """A request body must arrive within this many seconds of its headers (else 408 / dropped)."""
    header_timeout_s: float = flag(
        10.0, "seconds for a connection to send a complete request head (then closed)", SECONDS)
    """A connection must send a complete request head within this many seconds of opening (or of
    its previous response) or it is closed."""
    max_connections: int = flag(256, "open connections in all (503 above)", COUNT)
    """Open HTTP connections and WebSockets in all (uvicorn's limit_concurrency: 503 above)."""
    max_requests_per_client: int | None = flag(
        None, "speech streams (active + waiting) of one client address (429 above); default: half the default "
              "model's --max-streams, at least 1", COUNT)
    """Active plus waiting speech streams of one client (its address, see `api/ops/clients.py`: the one
    shared API key names no client); None = half the slots of the default model, at least 1 (below
    the slot count, so no client takes them all)."""
    trusted_proxies: tuple[str, ...] = flag(
        (), "proxy address or network whose X-Forwarded-For names the client (repeat; default none)", repeat="ADDRESS")
    """Peer addresses whose `X-Forwarded-For` names the client (a load balancer in front)."""
    allowed_hosts: tuple[str, ...] | None = flag(
        None, "Host name accepted (repeat; '*' = any, '*.example.com' = subdomains); default: the loopback "
              "names when bound to a loopback address, else any", repeat="HOST")
    """`Host` names accepted (DNS-rebinding guard); None = the loopback names when bound to a
    loopback address, any host otherwise. `/health` and `/ready` are exempt."""
    send_timeout_s: float = flag(30.0, "seconds a client may read none of its audio before it is ended", SECONDS)
    """A client that reads none of its audio for this long is ended (HTTP body or WebSocket)."""
    # -- WebSocket ----------------------------------------------------------------------------
    ws_max_message_bytes: int = flag(64 * 1024, "bytes of one WebSocket message", COUNT)
    """One WebSocket message from a client."""
    ws_max_session_chars: int = flag(4096, "characters of text one WebSocket stream may take", COUNT)
    """Text one live session may take (as `input` of the speech route)."""
    ws_max_session_s: float = flag(600.0, "seconds one WebSocket stream may last", SECONDS)
    """A live session's whole length, from `start` to `done`."""
    ws_idle_timeout_s: float = flag(
        30.0, "seconds a WebSocket stream may go without text before it is stopped", SECONDS)
    """A session with no non-empty text for this long is stopped as if `stop` had come."""
    max_sockets: int = flag(64, "open WebSockets in all", COUNT)
    """Open WebSockets in all."""
    max_sockets_per_client: int = flag(8, "open WebSockets of one client", COUNT)
    """Open WebSockets of one client."""
    resume_window_s: float = flag(
        30.0, "seconds a resumable WebSocket stream whose connection was lost waits (paused) for its resume "
              "before it is cancelled; 0 = no resume (0-600)", resume_window)
    """How long a resumable `/v1/ws` stream whose socket was lost waits, paused, for its `resume`
    before it is cancelled (0 to `MAX_RESUME_WINDOW_S`; 0 = streams are never resumable)."""
    max_detached_streams: int = flag(
        16, "resumable WebSocket streams waiting for their resume at once; past it a lost stream is cancelled", COUNT0)
    """Resumable streams waiting for their `resume` at once, in all (each keeps its client's speech
    place and its engine slot); a stream whose socket is lost past this is cancelled at once."""
    # -- text to dialogue --------------------------------------------------------------------
    max_dialogue_lines: int = flag(64, f"lines (`inputs`) of one text-to-dialogue request (400 above; at most "
                                       f"{MAX_DIALOGUE_LINES})", number(int, 1, MAX_DIALOGUE_LINES))
    """Lines of one dialogue: each is an engine stream of its own, spoken one after the other."""
    max_dialogue_chars: int = flag(4096, "characters of one text-to-dialogue request's lines together (400 above)",
                                   COUNT)
    """The text of one dialogue, all lines together (as `input` of the speech route, by default)."""
    max_dialogue_voices: int = flag(10, "different voices in one text-to-dialogue request (400 above)", COUNT)
    """Different voices of one dialogue (ElevenLabs' own bound)."""
    # -- voice work ---------------------------------------------------------------------------
    voice_workers: int = flag(1, "threads that clone and design voices", COUNT)
    """Threads that clone and design voices (apart from the speech path)."""
    voice_queue: int = flag(2, "voice jobs waiting for a worker (429 above)", COUNT0)
    """Voice jobs waiting for a worker before 429."""

    def __post_init__(self) -> None:
        if not 0 <= self.resume_window_s <= MAX_RESUME_WINDOW_S:
            raise ValueError(f"resume_window_s must be 0 to {MAX_RESUME_WINDOW_S:g} seconds, "
                             f"got {self.resume_window_s}")
        if not 1 <= self.max_dialogue_lines <= MAX_DIALOGUE_LINES:
            raise ValueError(f"max_dialogue_lines must be 1 to {MAX_DIALOGUE_LINES}, got {self.max_dialogue_lines}")
        if self.max_detached_streams < 0:
            raise ValueError(f"max_detached_streams must be at least 0, got {self.max_detached_streams}")

    def requests_per_client(self, slots: int) -> int:
        """The per-client cap for a model with `slots` stream slots."""
        if self.max_requests_per_client is not None:
            return self.max_requests_per_client
        return max(1, slots // 2)
