"""POST /v1/audio/speech (also /audio/speech): OpenAI's create-speech, streamed in every format."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api.errors import error_responses, invalid_request
from api.schemas import SpeechRequest, speech_sse_openapi
from api.speaking.http_body import CONTENT_TYPES, SSE_CONTENT_TYPE
from api.speaking.http_response import respond
from api.speaking.timings import Timings

router = APIRouter(tags=["audio"])


@router.post("/v1/audio/speech", response_class=Response, responses={
    200: {"description": "the audio file, chunked as it is encoded (`response_format`; flac: sent whole, with "
                         "Content-Length); or SSE events (`stream_format: sse`; flac: once the file is whole)",
          "content": {**{t: {"schema": {"type": "string", "format": "binary"}} for t in CONTENT_TYPES.values()},
                      SSE_CONTENT_TYPE: speech_sse_openapi()},
          "headers": {name: {"description": description, "required": required, "schema": {"type": "string"}}
                      for name, description, required in (
                          ("x-qwen3tts-model", "the served model (aliases resolved)", True),
                          ("x-qwen3tts-voice", "the speaker, the profile, or `instructions`", True),
                          ("x-qwen3tts-instructions-ignored", "`true` when the model ignored the instructions",
                           False),
                          ("x-qwen3tts-voice-ignored", "`true` when `voice` was ignored", False),
                          ("x-qwen3tts-ignored-fields", "unknown request fields that were ignored", False))}},
    **error_responses(400, 401, 403, 404, 408, 413, 429, 500, 503)})
@router.post("/audio/speech", response_class=Response, include_in_schema=False)
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    """Speak `input` with `voice`, streaming the `response_format` file (or SSE events) as it is made.

    Headers are sent with the first audio (FLAC, in either stream format: once the file is whole), so errors
    before it have real status codes; later errors abort the connection (audio) or arrive as an `error` event
    (SSE).
    """
    for name in ("word_timestamps", "subtitles"):
        if getattr(body, name) and body.stream_format != "sse":
            raise invalid_request(f"'{name}' arrive as SSE events: ask for stream_format 'sse'.", param=name)
    timings = Timings(body.input) if body.word_timestamps or body.subtitles is not None else None
    return await respond(request, body, body.response_format, CONTENT_TYPES[body.response_format], timings=timings)
