"""POST /dev/captioned_speech: Kokoro-FastAPI's captioned speech, for the clients written against it: the speech
route's request with Kokoro's `stream` and `return_timestamps`, answered with the audio as base64 and its words
timed by the estimate every route shares (`api/speaking/timings.py`); streamed as JSON lines, the last one with
empty audio and the words timed at the end (and `subtitles` when asked), or as one JSON object.
docs/protocols.md, "Word timings and subtitles", has the shapes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response
from pydantic import Field, StrictBool

from api.errors import error_responses
from api.schemas import SpeechRequest
from api.speaking.http_body import CONTENT_TYPES, SpeechStream
from api.speaking.http_response import respond
from api.speaking.timings import Timings

router = APIRouter(tags=["audio"])
NDJSON = "application/x-ndjson"


class CaptionedSpeechRequest(SpeechRequest):
    """POST /dev/captioned_speech: the speech request and Kokoro-FastAPI's two fields."""

    stream: StrictBool = Field(True, description="JSON lines as the audio is made; false: one JSON object at the "
                                                 "end")
    return_timestamps: StrictBool = Field(True, description="words in `timestamps` (false: empty lists)")


_WORD = {"type": "object", "required": ["word", "start_time", "end_time"], "properties": {
    "word": {"type": "string"}, "start_time": {"type": "number", "minimum": 0},
    "end_time": {"type": "number", "minimum": 0}}}
_CAPTIONED = {"type": "object", "required": ["audio", "audio_format", "timestamps"], "properties": {
    "audio": {"type": "string", "contentEncoding": "base64"}, "audio_format": {"type": "string"},
    "timestamps": {"type": "array", "items": _WORD},
    "subtitles": {"type": "string", "description": "the WebVTT or SubRip file (`subtitles`), in the last object"}}}


@router.post("/dev/captioned_speech", response_class=Response, responses={
    200: {"description": "the audio as base64 with its words, estimated: JSON lines as it is made (`stream`, the "
                         "default), or one JSON object once it is complete",
          "content": {NDJSON: {"itemSchema": _CAPTIONED}, "application/json": {"schema": _CAPTIONED}}},
    **error_responses(400, 401, 403, 404, 408, 413, 429, 500, 503)})
async def captioned_speech(body: CaptionedSpeechRequest, request: Request) -> Response:
    """Kokoro-FastAPI's captioned speech: the audio as base64 with word timestamps (see the module docstring)."""
    audio = body.model_copy(update={"stream_format": "audio"})
    shape = _lines if body.stream else _whole
    return await respond(request, audio, body.response_format, NDJSON if body.stream else "application/json",
                         shape=lambda speech: shape(speech, body), timings=Timings(body.input))


def _object(audio: bytes, speech: SpeechStream, body: CaptionedSpeechRequest, last: bool = False) -> bytes:
    words = speech.timings.new_words() if speech.timings is not None else []
    out = {"audio": base64.b64encode(audio).decode("ascii"), "audio_format": CONTENT_TYPES[body.response_format],
           "timestamps": [w.kokoro() for w in words] if body.return_timestamps else []}
    if last and body.subtitles is not None and speech.timings is not None:
        out["subtitles"] = speech.timings.subtitles(body.subtitles)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


async def _lines(speech: SpeechStream, body: CaptionedSpeechRequest) -> AsyncIterator[bytes]:
    async for piece in speech.audio_pieces():
        yield _object(piece, speech, body) + b"\n"
    yield _object(b"", speech, body, last=True) + b"\n"


async def _whole(speech: SpeechStream, body: CaptionedSpeechRequest) -> AsyncIterator[bytes]:
    audio = bytearray()
    async for piece in speech.audio_pieces():
        audio += piece
    yield _object(bytes(audio), speech, body, last=True)
