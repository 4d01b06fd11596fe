"""OpenAI Realtime (GA) shapes for `/v1/realtime` (`api/protocols/realtime.py`): the session and its updates, the
conversation's items, response settings and the response objects and events this server sends.

Everything here is pure (no socket, no engine): a client's JSON in, a `SessionConfig` or an event out,
or an APIError naming the field at fault in OpenAI's dotted form (`session.audio.output.voice`).
Field names and shapes follow openai-python's `types/realtime` (the GA API); the beta API's flat
fields (`voice`, `output_audio_format`, `modalities`, ...) are answered with `unknown_parameter`
naming the GA field to use, and a beta-shaped session (no `type`) with the GA shape.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api.errors import APIError, invalid_request, validation_error
from api.schemas import MAX_ID_CHARS, MAX_INPUT_CHARS, SpeechRequest

PCM_RATE = 24000
AUDIO_FORMATS = {"audio/pcm": "pcm", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}
"""GA `audio.output.format.type` -> the `StreamingEncoder` format (pcm: s16le mono 24 kHz; G.711 at 8 kHz)."""
MIN_SPEED, MAX_SPEED = 0.25, 1.5
"""The Realtime API's speed range (the speech route's goes to 4.0)."""
MAX_OUTPUT_TOKENS = 4096
"""OpenAI's bound on `max_output_tokens`; here one output token is one codec frame (80 ms)."""
DEFAULT_VOICE = "marin"
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
REALTIME_MODEL_PREFIXES = ("gpt-realtime", "gpt-4o-realtime", "gpt-4o-mini-realtime")
"""`?model=` names that select the default model (what OpenAI clients send)."""

SPEECH_EXTENSIONS = tuple(name for name in ("language", "seed", "temperature", "top_k", "top_p",
                                            "repetition_penalty", "text_mode", "text_normalization",
                                            "progress")
                          if name in SpeechRequest.model_fields)
"""The speech route's extension fields a session (and a response) also takes, at its top level:
sampling, language, `text_mode` (complete text only: live text is always streamed), `text_normalization`
and `progress` (`response.output_audio.progress` events: `api/speaking/progress.py`)."""

BETA_FIELDS = {
    "voice": "audio.output.voice",
    "output_audio_format": "audio.output.format",
    "speed": "audio.output.speed",
    "input_audio_format": "audio.input.format",
    "modalities": "output_modalities",
    "turn_detection": "audio.input.turn_detection",
    "input_audio_transcription": "audio.input.transcription",
    "input_audio_noise_reduction": "audio.input.noise_reduction",
    "max_response_output_tokens": "max_output_tokens",
}
"""Beta (flat) session fields -> where the GA API puts them."""

_INERT = {
    # field -> (values accepted as "nothing to do", the default echoed)
    "tools": (lambda v: v is None or v == [], []),
    "tool_choice": (lambda v: v in (None, "auto", "none"), "auto"),
    "tracing": (lambda v: v is None, None),
    "prompt": (lambda v: v is None, None),
    "include": (lambda v: v is None or v == [], None),
    "reasoning": (lambda v: v is None, None),
    "parallel_tool_calls": (lambda v: v is None or isinstance(v, bool), None),
    "truncation": (lambda v: v is None or isinstance(v, (str, dict)), "auto"),
}
"""GA session fields with nothing to act on in TTS: accepted (and echoed) when they ask for nothing
(no tools, no tracing, ...); anything else is `unsupported_feature`."""
_INPUT_AUDIO_OFF = ("transcription", "noise_reduction", "turn_detection")
"""`audio.input` fields accepted only as null: there is no audio input."""


def new_id(prefix: str) -> str:
    """An id in OpenAI's style (`event_...`, `resp_...`, `item_...`): prefix + 20 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


# -- errors -----------------------------------------------------------------------------------------


GA_API = "This server speaks the GA Realtime API"


def unknown_parameter(param: str, use: str | None = None) -> APIError:
    hint = f" {GA_API}: use '{use}'." if use else ""
    return invalid_request(f"Unknown parameter: '{param}'.{hint}", param=param, code="unknown_parameter")


def missing_session_type(session: dict) -> APIError:
    """A session without `type`: what the beta API's clients send (`client.beta.realtime`, flat `voice`,
    `modalities`, ...), so the message says the GA shape, and where each beta field it has goes."""
    moves = [f"'session.{name}' goes in 'session.{ga}'" for name, ga in BETA_FIELDS.items() if name in session]
    return invalid_request(f"Missing required parameter: 'session.type'. {GA_API}: 'session.type' is required "
                           f"(\"realtime\"){'; ' + ', '.join(moves) if moves else ''}.", param="session.type",
                           code="missing_required_parameter")


def unsupported(param: str | None, message: str) -> APIError:
    return invalid_request(message, param=param, code="unsupported_feature")


def _invalid(param: str, message: str) -> APIError:
    return invalid_request(f"Invalid value for '{param}': {message}", param=param)


def _check_keys(value: dict, allowed: Iterable[str], where: str, beta: dict[str, str] | None = None) -> None:
    allowed = set(allowed)
    for key in value:
        if key not in allowed:
            use = (beta or {}).get(key)
            raise unknown_parameter(f"{where}.{key}", f"{where}.{use}" if use else None)


def _object(value: Any, param: str) -> dict:
    if not isinstance(value, dict):
        raise _invalid(param, "expected an object.")
    return value


# -- session ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionConfig:
    """What a response speaks with: the session's settings, or a response's overrides of them."""

    model: str
    """The served model's id (chosen by `?model=` when the socket opens)."""
    format: str = "pcm"
    voice: str | dict = DEFAULT_VOICE
    speed: float = 1.0
    instructions: str = ""
    """The speech route's style instructions (how to speak), not a system prompt."""
    max_output_tokens: int | str = "inf"
    input_format: str = "pcm"
    extensions: dict[str, Any] = field(default_factory=dict)
    inert: dict[str, Any] = field(default_factory=dict)

    def speech_fields(self) -> dict[str, Any]:
        """This config as SpeechRequest fields (all but `input` and `response_format`)."""
        fields: dict[str, Any] = {"model": self.model, "voice": self.voice, "speed": float(self.speed),
                                  "instructions": self.instructions or None, **self.extensions}
        if self.max_output_tokens != "inf":
            fields["max_frames"] = self.max_output_tokens
        return fields


def format_object(encoder_format: str) -> dict[str, Any]:
    kind = next(k for k, v in AUDIO_FORMATS.items() if v == encoder_format)
    return {"type": kind, "rate": PCM_RATE} if encoder_format == "pcm" else {"type": kind}


def session_object(config: SessionConfig, session_id: str) -> dict[str, Any]:
    """The full GA session (`session.created` / `session.updated`)."""
    inert = {name: config.inert.get(name, default) for name, (_, default) in _INERT.items()}
    return {
        "type": "realtime", "object": "realtime.session", "id": session_id, "model": config.model,
        "output_modalities": ["audio"], "instructions": config.instructions,
        "audio": {
            "input": {"format": format_object(config.input_format), "transcription": None,
                      "noise_reduction": None, "turn_detection": None},
            "output": {"format": format_object(config.format), "voice": config.voice, "speed": config.speed},
        },
        "max_output_tokens": config.max_output_tokens, "expires_at": 0, **inert,
        **{name: config.extensions.get(name) for name in SPEECH_EXTENSIONS},  # extensions (null: the default)
    }


def parse_format(value: Any, param: str) -> str:
    """A GA audio format object -> the encoder format."""
    if isinstance(value, str):
        raise _invalid(param, 'formats are objects in the GA API: {"type": "audio/pcm", "rate": 24000}, '
                              '{"type": "audio/pcmu"} or {"type": "audio/pcma"}.')
    value = _object(value, param)
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in AUDIO_FORMATS:
        raise _invalid(f"{param}.type", f"expected one of {', '.join(AUDIO_FORMATS)}.")
    _check_keys(value, ("type", "rate") if kind == "audio/pcm" else ("type",), param)
    if kind == "audio/pcm" and value.get("rate", PCM_RATE) != PCM_RATE:
        raise _invalid(f"{param}.rate", f"audio/pcm is only offered at {PCM_RATE} Hz.")
    return AUDIO_FORMATS[kind]


def parse_voice(value: Any, param: str) -> str | dict:
    """A voice name or `{"id": ...}` (resolved later, with the model: `voices.resolve_voice`)."""
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS:
        return value
    if isinstance(value, dict) and set(value) == {"id"} and isinstance(value["id"], str) \
            and 0 < len(value["id"]) <= MAX_ID_CHARS:
        return {"id": value["id"]}
    raise _invalid(param, 'expected a voice name or {"id": "<voice id>"}.')


def parse_speed(value: Any, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not MIN_SPEED <= value <= MAX_SPEED:
        raise _invalid(param, f"expected a number from {MIN_SPEED} to {MAX_SPEED}.")
    return float(value)


def parse_max_output_tokens(value: Any, param: str) -> int | str:
    if value == "inf" or value is None:
        return "inf"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise _invalid(param, f'expected an integer from 1 to {MAX_OUTPUT_TOKENS} or "inf".')
    return value


def parse_modalities(value: Any, param: str) -> None:
    if value is None or value == ["audio"]:
        return
    if isinstance(value, list) and "text" in value:
        raise unsupported(param, "This server only speaks: output_modalities must be [\"audio\"] (audio "
                                 "with its transcript); text-only responses are not offered.")
    raise _invalid(param, 'expected ["audio"].')


def _parse_inert(name: str, value: Any, param: str) -> Any:
    accepted, _ = _INERT[name]
    if not accepted(value):
        what = {"tools": "tools and function calls", "tool_choice": "tools", "tracing": "tracing",
                "prompt": "prompt templates", "include": "input transcription logprobs",
                "reasoning": "reasoning"}.get(name, name)
        raise unsupported(param, f"This server is a text-to-speech engine: {what} are not supported "
                                 f"('{param}' must be empty or null).")
    return value


def _apply_output(config: SessionConfig, output: Any, where: str) -> SessionConfig:
    output = _object(output, where)
    _check_keys(output, ("format", "voice", "speed"), where)
    changes: dict[str, Any] = {}
    if "format" in output:
        changes["format"] = parse_format(output["format"], f"{where}.format")
    if "voice" in output:
        changes["voice"] = parse_voice(output["voice"], f"{where}.voice")
    if "speed" in output:
        changes["speed"] = parse_speed(output["speed"], f"{where}.speed")
    return replace(config, **changes)


def _apply_common(config: SessionConfig, fields: dict, where: str) -> SessionConfig:
    """Fields a session and a response share: instructions, max_output_tokens, output_modalities,
    the inert ones and the extensions."""
    changes: dict[str, Any] = {}
    extensions, inert = dict(config.extensions), dict(config.inert)
    for name, value in fields.items():
        param = f"{where}.{name}"
        if name == "instructions":
            if value is not None and not isinstance(value, str):
                raise _invalid(param, "expected a string.")
            changes["instructions"] = value or ""
        elif name == "max_output_tokens":
            changes["max_output_tokens"] = parse_max_output_tokens(value, param)
        elif name == "output_modalities":
            parse_modalities(value, param)
        elif name in _INERT:
            inert[name] = _parse_inert(name, value, param)
        elif name in SPEECH_EXTENSIONS:
            if value is None:
                extensions.pop(name, None)
            else:
                extensions[name] = value
    return replace(config, extensions=extensions, inert=inert, **changes)


SESSION_FIELDS = ("type", "model", "audio", "instructions", "max_output_tokens", "output_modalities",
                  *_INERT, *SPEECH_EXTENSIONS)


def updated_session(config: SessionConfig, session: Any) -> tuple[SessionConfig, str | None]:
    """A `session.update`'s `session` applied to `config` (all or nothing): (new config, the model
    named, if any, for the caller to check). APIError naming the first field at fault."""
    if session is None:
        raise invalid_request("Missing required parameter: 'session'.", param="session",
                              code="missing_required_parameter")
    session = _object(session, "session")
    kind = session.get("type")
    if kind is None:
        raise missing_session_type(session)
    if kind == "transcription":
        raise unsupported("session.type", "Transcription sessions are not offered: this server speaks text "
                                          "(session.type must be \"realtime\").")
    if kind != "realtime":
        raise _invalid("session.type", 'expected "realtime".')
    _check_keys(session, SESSION_FIELDS, "session", BETA_FIELDS)
    model = session.get("model")
    if model is not None and not isinstance(model, str):
        raise _invalid("session.model", "expected a string.")
    config = _apply_common(config, session, "session")
    if "audio" in session:
        audio = _object(session["audio"], "session.audio")
        _check_keys(audio, ("input", "output"), "session.audio")
        if audio.get("output") is not None:
            config = _apply_output(config, audio["output"], "session.audio.output")
        if audio.get("input") is not None:
            audio_in = _object(audio["input"], "session.audio.input")
            _check_keys(audio_in, ("format", *_INPUT_AUDIO_OFF), "session.audio.input")
            for name in _INPUT_AUDIO_OFF:
                if audio_in.get(name) is not None:
                    raise unsupported(f"session.audio.input.{name}", "This server takes no audio input: "
                                      f"'session.audio.input.{name}' must be null (send text instead).")
            if "format" in audio_in:
                config = replace(config, input_format=parse_format(audio_in["format"], "session.audio.input.format"))
    return config, model


# -- responses ----------------------------------------------------------------------------------------

RESPONSE_FIELDS = ("conversation", "input", "instructions", "audio", "max_output_tokens", "metadata",
                   "output_modalities", *(k for k in _INERT if k not in ("tracing", "include", "truncation")),
                   *SPEECH_EXTENSIONS)


@dataclass(frozen=True)
class ResponseSettings:
    config: SessionConfig
    conversation: bool
    """The response's item goes into the default conversation (`conversation: "auto"`)."""
    input: list | None
    metadata: dict | None


def response_settings(config: SessionConfig, response: Any) -> ResponseSettings:
    """A `response.create`'s `response` over the session's config. APIError naming the field."""
    if response is None:
        return ResponseSettings(config, True, None, None)
    response = _object(response, "response")
    _check_keys(response, RESPONSE_FIELDS, "response", BETA_FIELDS)
    conversation = response.get("conversation", "auto")
    if conversation not in ("auto", "none", None):
        raise _invalid("response.conversation", 'expected "auto" or "none".')
    config = _apply_common(config, response, "response")
    if response.get("audio") is not None:
        audio = _object(response["audio"], "response.audio")
        _check_keys(audio, ("output",), "response.audio")
        if audio.get("output") is not None:
            config = _apply_output(config, audio["output"], "response.audio.output")
    items = response.get("input")
    if items is not None and not isinstance(items, list):
        raise _invalid("response.input", "expected a list of items.")
    return ResponseSettings(config, conversation != "none", items, parse_metadata(response.get("metadata")))


def parse_metadata(value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY_CHARS
            and len(v) <= MAX_METADATA_VALUE_CHARS for k, v in value.items()):
        raise _invalid("response.metadata", f"expected up to {MAX_METADATA_KEYS} string keys "
                                            f"(<= {MAX_METADATA_KEY_CHARS} characters) with string values "
                                            f"(<= {MAX_METADATA_VALUE_CHARS}).")
    return value


_SPEECH_PARAMS = {"voice": "audio.output.voice", "speed": "audio.output.speed", "max_frames": "max_output_tokens"}


def realtime_error(error: APIError, where: str) -> APIError:
    """`error` (the speech route's, naming a SpeechRequest field) naming the Realtime field instead."""
    if error.param and not error.param.startswith(("session.", "response.")):
        name = _SPEECH_PARAMS.get(error.param, error.param)
        error.message = error.message.replace(f"'{error.param}'", f"'{where}.{name}'")
        error.param = f"{where}.{name}"
    return error


def speech_request(config: SessionConfig, text: str, where: str) -> SpeechRequest:
    """`config` with `text` as the speech route's request (every value checked as the route checks it)."""
    try:
        return SpeechRequest.model_validate({**config.speech_fields(), "input": text, "response_format": "pcm"})
    except ValidationError as e:
        raise realtime_error(validation_error(RequestValidationError(e.errors())), where) from None


# -- conversation items -------------------------------------------------------------------------------

ITEM_FIELDS = ("id", "type", "object", "role", "content", "status")


def user_item(item: Any, param: str = "item") -> dict[str, Any]:
    """A user message whose content is `input_text` parts (what is spoken), normalized; every other
    item (system or assistant messages, function calls, audio or image content) is refused."""
    if item is None:
        raise invalid_request(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    item = _object(item, param)
    kind = item.get("type")
    if kind != "message":
        if isinstance(kind, str) and kind.startswith(("function_call", "mcp_")):
            raise unsupported(f"{param}.type", "This server is a text-to-speech engine: function calls and "
                                               "tools are not supported. Send user messages with input_text.")
        raise _invalid(f"{param}.type", 'expected "message" (a user message with input_text content).')
    _check_keys(item, ITEM_FIELDS, param)
    if item.get("role") != "user":
        if item.get("role") in ("system", "assistant"):
            raise unsupported(f"{param}.role", "Only user messages are spoken (their input_text, verbatim). "
                                               "Style instructions go in session.instructions.")
        raise _invalid(f"{param}.role", 'expected "user".')
    item_id = item.get("id")
    if item_id is not None and not (isinstance(item_id, str) and 0 < len(item_id) <= MAX_ID_CHARS):
        raise _invalid(f"{param}.id", f"expected a string of 1 to {MAX_ID_CHARS} characters.")
    content = item.get("content")
    if not isinstance(content, list):
        raise _invalid(f"{param}.content", "expected a list of content parts.")
    parts = []
    for i, part in enumerate(content):
        where = f"{param}.content[{i}]"
        part = _object(part, where)
        if part.get("type") in ("input_audio", "input_image", "audio", "image"):
            raise unsupported(f"{where}.type", "This server takes text only: content parts must be input_text.")
        if part.get("type") != "input_text":
            raise _invalid(f"{where}.type", 'expected "input_text".')
        _check_keys(part, ("type", "text"), where)
        if not isinstance(part.get("text"), str):
            raise _invalid(f"{where}.text", "expected a string.")
        parts.append({"type": "input_text", "text": part["text"]})
    return {"id": item_id or new_id("item"), "object": "realtime.item", "type": "message", "status": "completed",
            "role": "user", "content": parts}


def item_text(item: dict[str, Any]) -> str:
    """What a user item says: its input_text parts joined (`join_text`)."""
    return join_text(part.get("text", "") for part in item.get("content", ()) if part.get("type") == "input_text")


def join_text(pieces: Iterable[str]) -> str:
    """Pieces of text joined verbatim, with one space where two would otherwise run together
    ("Hello." + "Bye." -> "Hello. Bye."; "Hel" + " lo" stays "Hel lo")."""
    out = ""
    for piece in pieces:
        if out and piece and not out[-1].isspace() and not piece[0].isspace():
            out += " "
        out += piece
    return out


def check_text_length(text: str, param: str) -> None:
    if len(text) > MAX_INPUT_CHARS:
        raise invalid_request(f"A response speaks at most {MAX_INPUT_CHARS} characters of text; this one would "
                              f"have {len(text)}. Speak some of it first (response.create), or stream long text "
                              "with input_text_buffer.append.", param=param, code="string_above_max_length")


def assistant_item(item_id: str, status: str, transcript: str | None) -> dict[str, Any]:
    """The response's output item: an assistant message with one `output_audio` part (its transcript;
    the audio itself went out in deltas and is not kept)."""
    content = [] if transcript is None else [{"type": "output_audio", "transcript": transcript}]
    return {"id": item_id, "object": "realtime.item", "type": "message", "status": status, "role": "assistant",
            "content": content}


# -- response objects ---------------------------------------------------------------------------------


def response_status(reason: str, limit: str | None, error: APIError | None,
                    cancel_requested: bool) -> tuple[str, dict[str, Any] | None]:
    """The engine's finish reason -> the GA response status and status_details.

    eos -> completed; cancelled -> cancelled (reason client_cancelled when the client asked);
    error -> failed (with the error); max_frames -> incomplete (max_output_tokens); budget,
    runaway, context_full and the live-text limits (idle_timeout, session_length) -> incomplete with that reason.
    """
    if reason == "error":
        detail = {"type": error.type, "code": error.code, "message": error.message} if error else None
        return "failed", {"type": "failed", "error": detail}
    if limit is not None:
        return "incomplete", {"type": "incomplete", "reason": limit}
    if reason == "cancelled":
        return "cancelled", {"type": "cancelled", "reason": "client_cancelled" if cancel_requested else None}
    if reason == "max_frames":
        return "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
    if reason != "eos":
        return "incomplete", {"type": "incomplete", "reason": reason}
    return "completed", None


def usage_object(usage: dict[str, Any]) -> dict[str, Any]:
    """`Utterance.usage()` (text tokens in, codec frames out, and whatever else it counts) with
    OpenAI's token details: the input is text, the output audio."""
    inputs, outputs = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    return {"total_tokens": usage.get("total_tokens", inputs + outputs), "input_tokens": inputs,
            "output_tokens": outputs,
            "input_token_details": {"text_tokens": inputs, "audio_tokens": 0, "image_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": 0, "audio_tokens": outputs},
            **{k: v for k, v in usage.items() if k not in ("total_tokens", "input_tokens", "output_tokens")}}


def response_object(response_id: str, config: SessionConfig, *, status: str, conversation_id: str | None,
                    metadata: dict | None, output: list | None = None, status_details: dict | None = None,
                    usage: dict | None = None) -> dict[str, Any]:
    return {
        "object": "realtime.response", "id": response_id, "status": status, "status_details": status_details,
        "output": output or [], "conversation_id": conversation_id, "output_modalities": ["audio"],
        "max_output_tokens": config.max_output_tokens,
        "audio": {"output": {"format": format_object(config.format), "voice": config.voice}},
        "usage": usage, "metadata": metadata,
    }
