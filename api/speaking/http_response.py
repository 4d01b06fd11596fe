"""An engine stream as the HTTP response every route that speaks answers with (`routes/speech.py`,
`routes/elevenlabs.py`, `routes/captions.py`): plan and start it (`start.py`), wait for its first audio (a failure
before it is a real status), then its body (`http_body.py`), and the usage log's names for it."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Literal

from fastapi import Request, Response

from api.config import ServerConfig
from api.errors import CLIENT_CLOSED_REQUEST
from api.ops.clients import client_of
from api.schemas import SpeechRequest
from api.speaking.http_body import (
    SSE_CONTENT_TYPE,
    WHOLE_FILE_FORMATS,
    SpeechResponse,
    SpeechStream,
    UsageAccounting,
    audio_body,
    sse_body,
    whole_body,
)
from api.speaking.start import open_speech, plan_request
from api.speaking.timings import Timings
from api.speaking.usage import key_id, usage_log
from api.state import get_state

log = logging.getLogger("api.routes.speech")  # the name operators filter on since before this module


async def respond(request: Request, body: SpeechRequest, audio_format: str, content_type: str,
                  out_rate: int | None = None, bit_rate: int | None = None,
                  ignored_fields: Sequence[str] | None = None,
                  shape: Callable[[SpeechStream], AsyncIterator[bytes]] = audio_body,
                  timings: Timings | None = None) -> Response:
    """The speech route's response for `body`, its audio encoded as `audio_format` (a speech-route format,
    or G.711; `out_rate`, `bit_rate`: as `open_speech` takes them) and sent as `content_type`, in the body
    `shape` makes of the stream (the audio itself by default): what every HTTP route that speaks
    (`elevenlabs.py` too) answers with. `ignored_fields`: what the client sent that is not honoured
    (default: `body`'s unknown fields), named in `x-qwen3tts-ignored-fields`. `timings`: fed with every chunk
    (`api/speaking/timings.py`): SSE word events and subtitles when `body` asks, or what `shape` reads."""
    state = get_state(request)
    received_at = getattr(request.state, "received_at", None) or time.monotonic()
    plan = plan_request(state, body, ignored_fields)
    if plan.voice.instructions_ignored:
        log.info("instructions ignored: model %s cannot take them", plan.served.id)
    opened = await open_speech(state, plan, audio_format, body.speed, client=client_of(request), out_rate=out_rate,
                               bit_rate=bit_rate)
    sse = body.stream_format == "sse"
    speech = SpeechStream(plan.served.id, opened.stream, opened.encoder,
                          plan.served.model.sample_rate, state.metrics, received_at, characters=len(body.input),
                          accounting=usage_accounting(request, state.config, body.stream_format, body.response_format,
                                                      plan.voice.label),
                          progress=body.progress and sse, speed=body.speed, timings=timings,
                          word_events=sse and body.word_timestamps, subtitles=body.subtitles if sse else None)
    return await answer(request, speech, plan.headers(), content_type, "sse" if sse else shape,
                        whole=audio_format in WHOLE_FILE_FORMATS and (sse or shape is audio_body))


async def answer(request: Request, speech: SpeechStream, headers: dict[str, str], content_type: str,
                 shape: Callable[[SpeechStream], AsyncIterator[bytes]] | Literal["sse"], whole: bool = False
                 ) -> Response:
    """The response for a started `speech`, once its first audio is there (a failure before it is a real
    status): the body `shape` makes of it ("sse": SSE events); with `whole`, of the file made whole before
    any of it is sent (`SpeechStream.whole_file`). `speech` is released whatever happens."""
    try:  # until the response owns the stream, any failure here must release it
        if not await speech.wait_for_audio(request.receive):
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        timeout = get_state(request).config.limits.send_timeout_s
        data = await speech.whole_file(request.receive) if whole else None
        if whole and data is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        if shape == "sse":
            return SpeechResponse(speech, sse_body(speech, data), SSE_CONTENT_TYPE, headers, timeout)
        if data is not None:
            return SpeechResponse(speech, whole_body(data), content_type,
                                  {**headers, "Content-Length": str(len(data))}, timeout)
        return SpeechResponse(speech, shape(speech), content_type, headers, timeout)
    except BaseException:
        speech.close()
        raise


def usage_accounting(request: Request, config: ServerConfig, stream_format: str, response_format: str,
                     voice: str) -> UsageAccounting | None:
    """The usage-log line's names for this request (None without `--usage-log`)."""
    writer = usage_log(config.usage_log)
    if writer is None:
        return None
    route = getattr(request.scope.get("route"), "path", None) or request.url.path
    return UsageAccounting(writer, getattr(request.state, "request_id", None), route, stream_format,
                           response_format, voice, key_id(config.api_key))
