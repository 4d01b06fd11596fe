"""ElevenLabs' HTTP text-to-speech routes: `POST /v1/text-to-speech/{voice}` and `.../{voice}/stream` answer
with the audio, streamed as the speech route streams it (`speech.respond`); `.../{voice}/with-timestamps`
with one JSON object (`{"audio_base64", "alignment", "normalized_alignment"}`: the whole audio and its
character timings) once the audio is complete; `.../{voice}/stream/with-timestamps` with the same as JSON
lines, one per piece of audio. The body: `{"text", "model_id", "language_code", "seed", "voice_settings"
(its `speed` honoured), "apply_text_normalization"}`; what else it carries is accepted and named in
`x-qwen3tts-ignored-fields`; `?output_format=` (default `mp3_44100_128`). Formats, voices, models and keys
as the sockets take them (`api/protocols/elevenlabs_sockets.py`).

Text to dialogue, `POST /v1/text-to-dialogue[/stream][/with-timestamps]` and `.../stream/with-timestamps`,
answers the same ways with the lines of `inputs` as one audio stream (`api/speaking/dialogue.py`; the with-
timestamps shapes add `voice_segments`: docs/protocols.md, "Text to dialogue").
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from qwen3_tts_gguf.audio.formats import G711_MIME_TYPES

from api.errors import error_responses
from api.limits import MAX_DIALOGUE_LINES
from api.ops import headers
from api.ops.clients import client_of
from api.schemas import MAX_ID_CHARS, MAX_INPUT_CHARS, MAX_LANGUAGE_CHARS, MAX_SEED, Identifier, SpokenText
from api.speaking.alignment import TimedChars
from api.speaking.dialogue import LineChain, plan_dialogue
from api.speaking.elevenlabs_fields import HTTP_DEFAULT_FORMAT, OutputFormat, VoiceSettings, speech_fields
from api.speaking.http_body import CONTENT_TYPES, SpeechStream, audio_body
from api.speaking.http_response import answer, respond, usage_accounting
from api.speaking.plan import ignored_fields_header, speech_body
from api.speaking.start import open_speech
from api.speaking.timings import Timings
from api.state import get_state

router = APIRouter(tags=["audio"])

HONOURED = ("text", "model_id", "language_code", "seed", "voice_settings", "apply_text_normalization")


class SpeechBody(BaseModel):
    """The body of ElevenLabs' text-to-speech routes: the fields this server honours, then ElevenLabs' own
    that it cannot (accepted, named in `x-qwen3tts-ignored-fields`, as any other field is)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    text: SpokenText = Field(description="the text to speak (not blank)")
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
        return given_but_ignored(self, HONOURED) + (self.voice_settings.ignored if self.voice_settings else [])


def given_but_ignored(body: BaseModel, honoured: tuple[str, ...]) -> list[str]:
    """The fields of `body` given (not null), its unknown ones too, that are not `honoured`, sorted."""
    given = {**dict(body), **(body.model_extra or {})}
    return sorted(name for name, value in given.items() if name not in honoured and value is not None)


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
    """The audio piece by piece, each with the characters it carried (`timings.py`, timed by the bytes each
    piece holds, so a piece's characters fall within its own audio); those the estimate had not reached when
    the audio ended, last, with no audio."""
    timings, clock = Timings(text), audio.clock()
    async for piece in speech.audio_pieces():
        yield piece, timings.piece(clock.seconds(piece), speech.piece_progress())
    rest = timings.rest(speech.result_progress())
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


def _timed_json(audio: bytes, alignment: dict | None, **more: Any) -> bytes:
    return json.dumps({"audio_base64": base64.b64encode(audio).decode("ascii"), "alignment": alignment,
                       "normalized_alignment": alignment, **more}, separators=(",", ":")).encode()


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


# -- text to dialogue ----------------------------------------------------------------------------------------

DIALOGUE_HONOURED = ("inputs", "model_id", "language_code", "seed", "apply_text_normalization")


class DialogueInput(BaseModel):
    """One line of a dialogue: its text and who speaks it."""

    model_config = ConfigDict(extra="allow")

    text: SpokenText = Field(description="the line (not blank)")
    voice_id: Identifier = Field(description="any voice `GET /v1/audio/voices` lists (on the model that speaks it)")


class DialogueSettings(BaseModel):
    """ElevenLabs' dialogue `settings`: they steer its own models; accepted within their domain, ignored."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    stability: StrictFloat | None = Field(None, ge=0, le=1)
    similarity: StrictFloat | None = Field(None, ge=0, le=1)
    clone_strength: StrictFloat | None = Field(None, ge=0, le=1)


class DialogueBody(BaseModel):
    """The body of ElevenLabs' text-to-dialogue routes (`api/speaking/dialogue.py`): the lines, then what applies
    to every line; ElevenLabs' other fields are accepted and named in `x-qwen3tts-ignored-fields`."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    inputs: list[DialogueInput] = Field(min_length=1, max_length=MAX_DIALOGUE_LINES,
                                        description="the lines, spoken in order (at most --max-dialogue-lines, "
                                                    "--max-dialogue-chars in all, --max-dialogue-voices voices)")
    model_id: Identifier | None = Field(None, description="a served model or alias; `eleven_*`: the default model "
                                                          "(a voice profile speaks on its own Base model)")
    language_code: str | None = Field(None, max_length=MAX_LANGUAGE_CHARS, description="ISO 639-1: en, zh, ...")
    seed: StrictInt | None = Field(None, ge=0, le=MAX_SEED, description="every line sampled with this seed")
    settings: DialogueSettings | None = Field(None, description="ignored")
    apply_text_normalization: Literal["auto", "on", "off"] | None = Field(
        None, description="`on`: numbers, dates ... spoken as words; `auto` (default), `off`: the text as written")
    previous_text: str | None = Field(None, max_length=MAX_INPUT_CHARS, description="ignored")
    future_text: str | None = Field(None, max_length=MAX_INPUT_CHARS, description="ignored")

    @property
    def ignored_fields(self) -> list[str]:
        """What was given (not null) that this server does not honour: fields, then settings."""
        settings = self.settings.model_dump(exclude_none=True) if self.settings is not None else {}
        return given_but_ignored(self, (*DIALOGUE_HONOURED, "settings")) + [f"settings.{name}" for name in settings]


_VOICE_SEGMENTS = {"type": "array", "items": {"type": "object", "required": [
    "voice_id", "start_time_seconds", "end_time_seconds", "character_start_index", "character_end_index",
    "dialogue_input_index"], "properties": {
    "voice_id": {"type": "string"}, "start_time_seconds": {"type": "number", "minimum": 0},
    "end_time_seconds": {"type": "number", "minimum": 0}, "character_start_index": {"type": "integer", "minimum": 0},
    "character_end_index": {"type": "integer", "minimum": 0}, "dialogue_input_index": {"type": "integer",
                                                                                       "minimum": 0}}}}
_TIMED_DIALOGUE = {**_TIMED_AUDIO, "required": [*_TIMED_AUDIO["required"], "voice_segments"],
                   "properties": {**_TIMED_AUDIO["properties"], "voice_segments": _VOICE_SEGMENTS}}


@router.post("/v1/text-to-dialogue/stream", response_class=Response, responses=_AUDIO_RESPONSES)
@router.post("/v1/text-to-dialogue", response_class=Response, responses=_AUDIO_RESPONSES)
async def text_to_dialogue(body: DialogueBody, request: Request, output_format: str | None = _FORMAT_QUERY
                           ) -> Response:
    """ElevenLabs' text to dialogue: the lines, each in its voice, as one audio stream in `output_format`."""
    return await _dialogue(request, body, output_format)


@router.post("/v1/text-to-dialogue/with-timestamps", response_class=Response, responses={
    200: {"description": "the whole audio as base64, its characters (the lines' texts joined, times estimated) "
                         "and `voice_segments` (where each line starts and ends), once the audio is complete",
          "content": {"application/json": {"schema": _TIMED_DIALOGUE}}, "headers": _HEADERS},
    **_ERRORS})
async def text_to_dialogue_timed(body: DialogueBody, request: Request, output_format: str | None = _FORMAT_QUERY
                                 ) -> Response:
    """ElevenLabs' text to dialogue with timestamps (the SDK's `convert_with_timestamps`): one JSON object."""
    return await _dialogue(request, body, output_format, "application/json", _dialogue_whole)


@router.post("/v1/text-to-dialogue/stream/with-timestamps", response_class=Response, responses={
    200: {"description": "one JSON object a line as the audio is made: `audio_base64`, the characters it carried "
                         "and `voice_segments` (the lines they belong to; indices into this line's characters)",
          "content": {NDJSON: {"itemSchema": _TIMED_DIALOGUE}}, "headers": _HEADERS},
    **_ERRORS})
async def text_to_dialogue_lines(body: DialogueBody, request: Request, output_format: str | None = _FORMAT_QUERY
                                 ) -> Response:
    """ElevenLabs' text to dialogue with timestamps (the SDK's `stream_with_timestamps`): JSON lines."""
    return await _dialogue(request, body, output_format, NDJSON, _dialogue_lines)


DialogueShape = Callable[[SpeechStream, LineChain], AsyncIterator[bytes]]


async def _dialogue(request: Request, body: DialogueBody, output_format: str | None, content_type: str | None = None,
                    shape: DialogueShape | None = None) -> Response:
    state = get_state(request)
    received_at = getattr(request.state, "received_at", None) or time.monotonic()
    fields = speech_fields(body.inputs[0].voice_id, body.model_id, body.language_code, body.apply_text_normalization,
                           state.registry)
    lines = plan_dialogue(state, [(line.text, line.voice_id) for line in body.inputs], {**fields, "seed": body.seed})
    first = lines[0].plan
    audio = OutputFormat.parse(output_format, first.served.model.sample_rate)
    text = "".join(line.text for line in body.inputs)
    timings = Timings(text) if shape is not None else None
    client = client_of(request)
    opened = await open_speech(state, first, audio.response_format, client=client, out_rate=audio.out_rate,
                               bit_rate=audio.bit_rate)
    chain = LineChain(lines, opened.stream, client, timings)
    models = ",".join(dict.fromkeys(line.plan.served.id for line in lines))
    voices = ",".join(dict.fromkeys(line.plan.voice.label for line in lines))
    speech = SpeechStream(first.served.id, chain, opened.encoder, first.served.model.sample_rate, state.metrics,
                          received_at, characters=len(text), timings=timings,
                          accounting=usage_accounting(request, state.config, "audio", audio.name, voices))
    answered = {headers.MODEL: models, headers.VOICE: voices}
    if body.ignored_fields:
        answered[headers.IGNORED_FIELDS] = ignored_fields_header(body.ignored_fields)
    if shape is None:
        return await answer(request, speech, answered, audio.content_type, audio_body)
    return await answer(request, speech, answered, content_type or NDJSON, lambda stream: shape(stream, chain))


async def _timed_lines(speech: SpeechStream) -> AsyncIterator[tuple[bytes, TimedChars, int]]:
    """The audio piece by piece, each with the characters timed since the piece before (and where they begin in
    the dialogue's text); those timed at the very end last, with no audio."""
    assert speech.timings is not None
    offset = 0
    async for piece in speech.audio_pieces():
        timed = speech.timings.new_chars()
        yield piece, timed, offset
        offset += len(timed.chars)
    rest = speech.timings.new_chars()
    if rest.chars:
        yield b"", rest, offset


def _voice_segments(chain: LineChain, timed: TimedChars, offset: int) -> list[dict]:
    """ElevenLabs' `voice_segments` of the lines whose characters `timed` (from `offset` in the dialogue's text)
    carries: each line's audio (so far, while it speaks), its characters as indices into `timed`'s."""
    rate, segments = chain.sample_rate, []
    for span in chain.spans:
        start, end = max(span.line.text_start, offset), min(span.line.text_end, offset + len(timed.chars))
        if start < end:
            segments.append({"voice_id": span.line.voice_id, "start_time_seconds": round(span.start / rate, 3),
                             "end_time_seconds": round((chain.samples if span.end is None else span.end) / rate, 3),
                             "character_start_index": start - offset, "character_end_index": end - offset,
                             "dialogue_input_index": span.line.index})
    return segments


async def _dialogue_lines(speech: SpeechStream, chain: LineChain) -> AsyncIterator[bytes]:
    async for piece, timed, offset in _timed_lines(speech):
        yield _timed_json(piece, timed.http_shape(), voice_segments=_voice_segments(chain, timed, offset)) + b"\n"


async def _dialogue_whole(speech: SpeechStream, chain: LineChain) -> AsyncIterator[bytes]:
    pieces, timed = [], []
    async for piece, chars, _ in _timed_lines(speech):
        pieces.append(piece)
        timed.append(chars)
    joined = TimedChars.joined(timed)
    yield _timed_json(b"".join(pieces), joined.http_shape(), voice_segments=_voice_segments(chain, joined, 0))
