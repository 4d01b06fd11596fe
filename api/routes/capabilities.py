"""GET /v1/capabilities: what a client may use here, in one document (keyed like `/v1/models`).

    {"protocols": [{"name", "path", "subprotocol", "version", "features"}, ...],
     "formats": ["mp3", ...], "limits": {...}, "normalization": {"languages": [...]},
     "models": [{"id", "type", "default_text_mode"}, ...]}

`protocols` are those of the app `create_app` builds (`ROUTERS`). `limits` are the client-relevant `ServerLimits`
plus the speech route's input bound and the engine's `max_buffered_audio_s`.
`models` are the served models, the default first (OpenAI's aliases name it; `/v1/models` lists them).
"""

from __future__ import annotations

from typing import get_args

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from wyoming import __version__ as wyoming_version_string

from qwen3_tts_gguf.text.normalization import LANGUAGES

from api.errors import error_responses
from api.limits import ServerLimits
from api.protocols import elevenlabs_sockets, native, realtime
from api.protocols.wyoming import WyomingServer
from api.schemas import MAX_INPUT_CHARS, ResponseFormat
from api.state import get_state

router = APIRouter(tags=["models"])

PATH = "/v1/capabilities"


class Protocol(BaseModel):
    """One way to ask for speech."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="openai-speech, qtts, openai-realtime, elevenlabs-multi-context or wyoming",
                      examples=["qtts"])
    path: str = Field(description="the route (HTTP POST or WebSocket), or wyoming's tcp://host:port",
                      examples=["/v1/ws"])
    subprotocol: str | None = Field(description="the WebSocket subprotocol to offer; null: none (or HTTP)")
    version: str = Field(description="the protocol's version as this server speaks it")
    features: list[str] = Field(description="optional parts this server implements")


class Limits(BaseModel):
    """The bounds a client meets (`api/limits.py`; each a `serve` flag of the same name)."""

    model_config = ConfigDict(extra="forbid")

    max_input_chars: int = Field(description="`input` of the speech route, in characters")
    max_body_bytes: int = Field(description="a JSON request body")
    ws_max_message_bytes: int = Field(description="one WebSocket message from the client (UTF-8 bytes)")
    ws_max_session_chars: int = Field(description="text one live utterance may take")
    ws_idle_timeout_s: float = Field(description="a live utterance without new text is stopped after this; 0: off")
    ws_max_session_s: float = Field(description="a live utterance's whole length; 0: off")
    resume_window_s: float | None = Field(
        None, description="how long a cut live utterance waits for its `resume` (present where resume is served)")
    max_buffered_audio_s: float = Field(description="audio made ahead of a slow reader before its stream pauses")
    send_timeout_s: float = Field(description="a client that reads nothing for this long is ended")
    max_sockets_per_client: int = Field(description="open WebSockets of one client")


class Normalization(BaseModel):
    model_config = ConfigDict(extra="forbid")

    languages: list[str] = Field(description="languages whose numbers, dates, units ... are written out as words")


class ModelSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    type: str = Field(description="custom_voice, voice_design or base (the manifest's model type)")
    default_text_mode: str = Field(description="the `text_mode` the speech route uses when a request names none")


class Capabilities(BaseModel):
    """GET /v1/capabilities."""

    model_config = ConfigDict(extra="forbid")

    protocols: list[Protocol]
    formats: list[str] = Field(description="`response_format` values of the speech route")
    limits: Limits
    normalization: Normalization
    models: list[ModelSummary] = Field(description="served models, the default first")


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol(name="openai-speech", path="/v1/audio/speech", subprotocol=None, version="v1",
             features=["sse", "stream_format", "instructions", "speed", "progress", "text_normalization",
                       "word_timestamps", "subtitles"]),
    Protocol(name="qtts", path=native.PATH, subprotocol=native.SUBPROTOCOL, version="1.1",
             features=["live_text", "resume", "progress", "text_normalization", "usage"]),
    Protocol(name="openai-realtime", path=realtime.PATH, subprotocol=realtime.SUBPROTOCOL, version="ga",
             features=["input_text_buffer", "audio/pcm", "audio/pcmu", "audio/pcma", "progress",
                       "text_normalization"]),
    Protocol(name="elevenlabs-multi-context", path=elevenlabs_sockets.PATH, subprotocol=None, version="v1",
             features=["contexts", "stream-input", "http", "with-timestamps", "pcm_8000-48000", "ulaw_8000",
                       "alaw_8000", "mp3", "opus", "voices", "models", "speed", "apply_text_normalization",
                       "dialogue"]),
)


def wyoming_protocol(server: WyomingServer, host: str) -> Protocol:
    """Wyoming's entry: its own TCP port (`api/protocols/wyoming.py`)."""
    return Protocol(name="wyoming", path=f"tcp://{host}:{server.port}", subprotocol=None,
                    version=wyoming_version_string, features=["synthesize", "synthesize_streaming"])


def client_limits(limits: ServerLimits, max_buffered_audio_s: float) -> Limits:
    """The client-relevant limits."""
    return Limits(
        max_input_chars=MAX_INPUT_CHARS, max_body_bytes=limits.max_body_bytes,
        ws_max_message_bytes=limits.ws_max_message_bytes, ws_max_session_chars=limits.ws_max_session_chars,
        ws_idle_timeout_s=limits.ws_idle_timeout_s, ws_max_session_s=limits.ws_max_session_s,
        resume_window_s=limits.resume_window_s, max_buffered_audio_s=max_buffered_audio_s,
        send_timeout_s=limits.send_timeout_s, max_sockets_per_client=limits.max_sockets_per_client)


@router.get(PATH, response_model=Capabilities, response_model_exclude_unset=True,
            responses=error_responses(400, 401))
async def capabilities(request: Request) -> Capabilities:
    """Protocols, formats, limits, text normalization and models: what a client may use here."""
    state = get_state(request)
    registry = state.registry
    wyoming = getattr(request.app.state, "wyoming", None)
    return Capabilities(
        protocols=list(PROTOCOLS) + ([wyoming_protocol(wyoming, state.config.wyoming_host or state.config.host)]
                                     if wyoming is not None else []),
        formats=list(get_args(ResponseFormat)),
        limits=client_limits(state.config.limits, registry.default.model.settings.max_buffered_audio_s),
        normalization=Normalization(languages=list(LANGUAGES)),
        models=[ModelSummary(id=m.id, type=m.manifest.model_type, default_text_mode=m.manifest.default_text_mode)
                for m in registry.models])
