"""POST /v1/audio/speech (also /audio/speech): OpenAI's create-speech, streamed in every format."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request, Response

from qwen3_tts_gguf.audio_encoding import StreamingEncoder

from .schemas import SpeechRequest
from .state import get_state
from .streaming import (
    CONTENT_TYPES,
    SSE_CONTENT_TYPE,
    OffloadedEncoder,
    SpeechResponse,
    SpeechStream,
    audio_body,
    sse_body,
)
from .synthesis import plan_speech, start_stream
from .voice_profiles import model_for_voice

log = logging.getLogger("api.speech")

router = APIRouter(tags=["audio"])

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client left before the response"


@router.post("/v1/audio/speech", response_class=Response,
             responses={200: {"content": {t: {} for t in (*CONTENT_TYPES.values(), SSE_CONTENT_TYPE)},
                              "description": "the audio file, chunked; or SSE events"}})
@router.post("/audio/speech", response_class=Response, include_in_schema=False)
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    """Speak `input` with `voice`, streaming the `response_format` file (or SSE events) as it is made.

    Headers are sent with the first audio, so errors before it have real status codes; later
    errors abort the connection (audio) or arrive as an `error` event (SSE).
    """
    state = get_state(request)
    received_at = getattr(request.state, "received_at", None) or time.monotonic()
    served = model_for_voice(state.registry, body.model, body.voice_id, state.voice_profiles)
    plan = plan_speech(body, served, state.voice_profiles)
    if plan.voice.instructions_ignored:
        log.info("instructions ignored: model %s cannot take them", plan.served.id)
    encoder = StreamingEncoder(body.response_format, plan.served.model.sample_rate, body.speed)
    try:
        stream = await start_stream(plan)
    except BaseException:
        encoder.close()
        raise
    speech = SpeechStream(plan.served.id, stream, OffloadedEncoder(encoder, state.encoder_pool),
                          plan.served.model.sample_rate, state.metrics, received_at)
    if not await speech.wait_for_audio(request.receive):
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if body.stream_format == "sse":
        return SpeechResponse(speech, sse_body(speech), SSE_CONTENT_TYPE, plan.headers())
    return SpeechResponse(speech, audio_body(speech), CONTENT_TYPES[body.response_format], plan.headers())
