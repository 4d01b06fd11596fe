"""ElevenLabs' HTTP text-to-speech routes: `POST /v1/text-to-speech/{voice}` and `.../{voice}/stream` answer
with the audio, streamed as the speech route streams it (`speech.respond`); `.../{voice}/with-timestamps`
with one JSON object (`{"audio_base64", "alignment", "normalized_alignment"}`: the whole audio and its
character timings) once the audio is complete; `.../{voice}/stream/with-timestamps` with the same as JSON
lines, one per piece of audio. The body: `{"text", "model_id", "language_code", "seed", "voice_settings"
(its `speed` honoured), "apply_text_normalization"}`; what else it carries is accepted and named in
`x-qwen3tts-ignored-fields`; `?output_format=` (default `mp3_44100_128`). Formats, voices, models and keys
as the sockets take them (`api/protocols/elevenlabs.py`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from qwen3_tts_gguf.audio.encoding import G711_MIME_TYPES

from api.errors import error_responses
from api.protocols.elevenlabs import HTTP_DEFAULT_FORMAT, OutputFormat, VoiceSettings, speech_fields, spoken_end
from api.routes.speech import respond
from api.schemas import MAX_ID_CHARS, MAX_INPUT_CHARS, MAX_LANGUAGE_CHARS, MAX_SEED, NOT_BLANK_PATTERN, Identifier
from api.speaking.alignment import CharTimeline, TimedChars
from api.speaking.http_body import CONTENT_TYPES, SpeechStream
from api.speaking.plan import speech_body
from api.state import get_state

router = APIRouter(tags=["audio"])

HONOURED = ("text", "model_id", "language_code", "seed", "voice_settings", "apply_text_normalization")


class SpeechBody(BaseModel):
    """The body of ElevenLabs' text-to-speech routes: the fields this server honours, then ElevenLabs' own
    that it cannot (accepted, named in `x-qwen3tts-ignored-fields`, as any other field is)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    text: str = Field(max_length=MAX_INPUT_CHARS, description="the text to speak (not blank)",
                      json_schema_extra={"pattern": NOT_BLANK_PATTERN})
    model_id: Identifier | None = Field(None, description="a served model or alias; `eleven_*`: the default model")
    language_code: str | None = Field(None, max_length=MAX_LANGUAGE_CHARS, description="ISO 639-1: en, zh, ...")
    seed: StrictInt | None = Field(None, ge=0, le=MAX_SEED)
    voice_settings: VoiceSettings | None = Field(None, description="`speed` honoured; the others ignored")
    apply_text_normalization: Literal["auto", "on", "off"] | None = Field(
        None, description="`on`: numbers, dates ... spoken as words (`text_normalization: auto`); `auto` "
                          "(default), `off`: the text as written")
    previous_text: str | None = Field(None, max_length=MAX_INPUT_CHARS, description="ignored")
    next_text: str | None = Field(None, max_length=MAX_INPUT_CHARS, description="ignored")

    @property
    def ignored_fields(self) -> list[str]:
        """What was given (not null) that this server does not honour: fields, then voice settings."""
        given = {**dict(self), **(self.model_extra or {})}
        ignored = sorted(name for name, value in given.items() if name not in HONOURED and value is not None)
        return ignored + (self.voice_settings.ignored if self.voice_settings is not None else [])


_ERRORS = error_responses(400, 401, 403, 404, 408, 413, 429, 500, 503)
_HEADERS = {"x-qwen3tts-ignored-fields": {"description": "body fields and voice settings that were ignored",
                                          "required": False, "schema": {"type": "string"}}}
_AUDIO_RESPONSES = {
    200: {"description": "the audio, chunked as it is made",
          "content": {t: {"schema": {"type": "string", "format": "binary"}}
                      for t in ("audio/pcm", *G711_MIME_TYPES.values(), CONTENT_TYPES["mp3"], CONTENT_TYPES["opus"])},
          "headers": _HEADERS},
    **_ERRORS}
_ALIGNMENT = {"type": ["object", "null"], "required": ["characters", "character_start_times_seconds",
                                                       "character_end_times_seconds"], "properties": {
    "characters": {"type": "array", "items": {"type": "string"}},
    "character_start_times_seconds": {"type": "array", "items": {"type": "number", "minimum": 0}},
    "character_end_times_seconds": {"type": "array", "items": {"type": "number", "minimum": 0}}}}
_TIMED_AUDIO = {"type": "object", "required": ["audio_base64", "alignment", "normalized_alignment"], "properties": {
    "audio_base64": {"type": "string", "contentEncoding": "base64"}, "alignment": _ALIGNMENT,
    "normalized_alignment": _ALIGNMENT}}


_FORMAT_QUERY = Query(None, max_length=32, description=f"default {HTTP_DEFAULT_FORMAT}",
                      json_schema_extra={"enum": list(OutputFormat.NAMES)})
_VOICE_PATH = Path(max_length=MAX_ID_CHARS)
NDJSON = "application/x-ndjson"


@router.post("/v1/text-to-speech/{voice_id}/stream", response_class=Response, responses=_AUDIO_RESPONSES)
@router.post("/v1/text-to-speech/{voice_id}", response_class=Response, responses=_AUDIO_RESPONSES)
async def text_to_speech(body: SpeechBody, request: Request, voice_id: str = _VOICE_PATH,
                         output_format: str | None = _FORMAT_QUERY) -> Response:
    """ElevenLabs' text to speech: the audio in `output_format`, streamed as it is made."""
    return await _speak(request, body, voice_id, output_format)


@router.post("/v1/text-to-speech/{voice_id}/with-timestamps", response_class=Response, responses={
    200: {"description": "the whole audio as base64, and `alignment`, `normalized_alignment` (its characters, "
                         "times estimated; or null), once the audio is complete",
          "content": {"application/json": {"schema": _TIMED_AUDIO}}, "headers": _HEADERS},
    **_ERRORS})
async def text_to_speech_timed(body: SpeechBody, request: Request, voice_id: str = _VOICE_PATH,
                               output_format: str | None = _FORMAT_QUERY) -> Response:
    """ElevenLabs' text to speech with timestamps (the SDK's `convert_with_timestamps`): one JSON object."""
    return await _speak(request, body, voice_id, output_format, "application/json", _whole)


@router.post("/v1/text-to-speech/{voice_id}/stream/with-timestamps", response_class=Response, responses={
    200: {"description": "one JSON object a line as the audio is made: `audio_base64`, and `alignment`, "
                         "`normalized_alignment` (the characters it carried, times estimated; or null)",
          "content": {NDJSON: {"itemSchema": _TIMED_AUDIO}}, "headers": _HEADERS},
    **_ERRORS})
async def text_to_speech_lines(body: SpeechBody, request: Request, voice_id: str = _VOICE_PATH,
                               output_format: str | None = _FORMAT_QUERY) -> Response:
    """ElevenLabs' text to speech with timestamps (Pipecat's HTTP service): the audio as base64 in JSON lines."""
    return await _speak(request, body, voice_id, output_format, NDJSON, _json_lines)


async def _timed_pieces(speech: SpeechStream, text: str, audio: OutputFormat
                        ) -> AsyncIterator[tuple[bytes, TimedChars]]:
    """The audio piece by piece, each with the characters it carried (`alignment.py`); those the estimate had
    not reached when the audio ended, last, with no audio."""
    timeline, clock = CharTimeline(text), audio.clock()
    async for piece in speech.audio_pieces():
        yield piece, timeline.piece(clock.seconds(piece), spoken_end(speech.piece_progress()))
    rest = timeline.rest(spoken_end(speech.result_progress()))
    if rest.chars:
        yield b"", rest


async def _json_lines(speech: SpeechStream, text: str, audio: OutputFormat) -> AsyncIterator[bytes]:
    async for piece, timed in _timed_pieces(speech, text, audio):
        yield _timed_json(piece, timed.http_shape()) + b"\n"


async def _whole(speech: SpeechStream, text: str, audio: OutputFormat) -> AsyncIterator[bytes]:
    pieces, timed = [], []
    async for piece, chars in _timed_pieces(speech, text, audio):
        pieces.append(piece)
        timed.append(chars)
    yield _timed_json(b"".join(pieces), TimedChars.joined(timed).http_shape())


def _timed_json(audio: bytes, alignment: dict | None) -> bytes:
    return json.dumps({"audio_base64": base64.b64encode(audio).decode("ascii"), "alignment": alignment,
                       "normalized_alignment": alignment}, separators=(",", ":")).encode()


Shape = Callable[[SpeechStream, str, OutputFormat], AsyncIterator[bytes]]
"""A body made of the speech, its text and its format (None: the audio itself)."""


async def _speak(request: Request, body: SpeechBody, voice_id: str, output_format: str | None,
                 content_type: str | None = None, shape: Shape | None = None) -> Response:
    registry = get_state(request).registry
    speed = body.voice_settings.speed if body.voice_settings is not None else None
    speech = speech_body({**speech_fields(voice_id, body.model_id, body.language_code, body.apply_text_normalization,
                                          registry),
                          "input": body.text, "seed": body.seed, "speed": speed or 1.0, "response_format": "pcm"})
    audio = OutputFormat.parse(output_format, registry.resolve(speech.model).model.sample_rate)
    options = dict(out_rate=audio.out_rate, bit_rate=audio.bit_rate, ignored_fields=body.ignored_fields)
    if shape is None:
        return await respond(request, speech, audio.response_format, audio.content_type, **options)
    return await respond(request, speech, audio.response_format, content_type, **options,
                         shape=lambda stream: shape(stream, body.text, audio))
