"""ElevenLabs' HTTP text-to-speech routes: `POST /v1/text-to-speech/{voice}` and `.../{voice}/stream`
(`{"text", "model_id", "language_code", "seed", "voice_settings" (ignored)}`, `?output_format=`) answer
with the audio, streamed as the speech route streams it (`speech.respond`);
`.../{voice}/stream/with-timestamps` with the same audio as base64 in JSON lines (`{"audio_base64",
"alignment", "normalized_alignment"}`). Formats, voices, models and keys as the sockets take them
(`api/protocols/elevenlabs.py`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from qwen3_tts_gguf.audio.encoding import G711_MIME_TYPES

from api.errors import error_responses
from api.protocols.elevenlabs import OutputFormat, served_model_id, spoken_end
from api.routes.speech import respond
from api.schemas import MAX_ID_CHARS, MAX_INPUT_CHARS, MAX_LANGUAGE_CHARS, MAX_SEED, NOT_BLANK_PATTERN, Identifier
from api.speaking.alignment import CharTimeline, TimedChars
from api.speaking.http_body import SpeechStream
from api.speaking.plan import speech_body
from api.state import get_state
from api.voices import language_of

router = APIRouter(tags=["audio"])


class SpeechBody(BaseModel):
    """The body of ElevenLabs' text-to-speech routes (the fields this server reads; others are ignored)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    text: str = Field(max_length=MAX_INPUT_CHARS, description="the text to speak (not blank)",
                      json_schema_extra={"pattern": NOT_BLANK_PATTERN})
    model_id: Identifier | None = Field(None, description="a served model or alias; `eleven_*`: the default model")
    language_code: str | None = Field(None, max_length=MAX_LANGUAGE_CHARS, description="ISO 639-1: en, zh, ...")
    seed: StrictInt | None = Field(None, ge=0, le=MAX_SEED)
    voice_settings: dict[str, Any] | None = Field(None, description="accepted and ignored")


_AUDIO_RESPONSES = {
    200: {"description": "the audio, chunked as it is made",
          "content": {t: {"schema": {"type": "string", "format": "binary"}}
                      for t in ("audio/pcm", *G711_MIME_TYPES.values())}},
    **error_responses(400, 401, 403, 404, 408, 413, 429, 500, 503)}


_FORMAT_QUERY = Query(None, max_length=32, description="pcm_<rate> (8000-48000), ulaw_8000, alaw_8000; "
                                                      "default pcm_24000")
_VOICE_PATH = Path(max_length=MAX_ID_CHARS)
NDJSON = "application/x-ndjson"


@router.post("/v1/text-to-speech/{voice_id}/stream", response_class=Response, responses=_AUDIO_RESPONSES)
@router.post("/v1/text-to-speech/{voice_id}", response_class=Response, responses=_AUDIO_RESPONSES)
async def text_to_speech(body: SpeechBody, request: Request, voice_id: str = _VOICE_PATH,
                         output_format: str | None = _FORMAT_QUERY) -> Response:
    """ElevenLabs' text to speech: the audio in `output_format`, streamed as it is made."""
    return await _speak(request, body, voice_id, output_format)


@router.post("/v1/text-to-speech/{voice_id}/stream/with-timestamps", response_class=Response, responses={
    200: {"description": "one JSON object a line as the audio is made: `audio_base64`, and `alignment`, "
                         "`normalized_alignment` (the characters it carried, times estimated; or null)",
          "content": {NDJSON: {"schema": {"type": "string"}}}},
    **error_responses(400, 401, 403, 404, 408, 413, 429, 500, 503)})
async def text_to_speech_lines(body: SpeechBody, request: Request, voice_id: str = _VOICE_PATH,
                               output_format: str | None = _FORMAT_QUERY) -> Response:
    """ElevenLabs' text to speech with timestamps (Pipecat's HTTP service): the audio as base64 in JSON lines."""
    return await _speak(request, body, voice_id, output_format, json_lines=True)


async def _json_lines(speech: SpeechStream, text: str, audio: OutputFormat) -> AsyncIterator[bytes]:
    """The audio as base64 in JSON lines, each with the characters it carried (`alignment.py`); those
    the estimate had not reached when the audio ended, in a last line with no audio."""
    timeline = CharTimeline(text)
    async for piece in speech.audio_pieces():
        yield _json_line(piece, timeline.piece(audio.seconds(piece), spoken_end(speech.piece_progress())))
    rest = timeline.rest(spoken_end(speech.result_progress()))
    if rest.chars:
        yield _json_line(b"", rest)


def _json_line(piece: bytes, timed: TimedChars) -> bytes:
    alignment = timed.http_shape()
    return json.dumps({"audio_base64": base64.b64encode(piece).decode("ascii"), "alignment": alignment,
                       "normalized_alignment": alignment}, separators=(",", ":")).encode() + b"\n"


async def _speak(request: Request, body: SpeechBody, voice_id: str, output_format: str | None,
                 json_lines: bool = False) -> Response:
    registry = get_state(request).registry
    speech = speech_body({"model": served_model_id(body.model_id, registry), "input": body.text, "voice": voice_id,
                          "language": language_of(body.language_code), "seed": body.seed, "response_format": "pcm"})
    served = registry.resolve(speech.model)
    audio = OutputFormat.parse(output_format, served.model.sample_rate)
    if json_lines:
        return await respond(request, speech, audio.response_format, NDJSON, pcm_rate=audio.pcm_rate,
                             shape=lambda stream: _json_lines(stream, body.text, audio))
    return await respond(request, speech, audio.response_format, audio.content_type, pcm_rate=audio.pcm_rate)
