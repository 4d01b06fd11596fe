"""The one way into the engine, for every protocol: a request's plan (the model for its voice, then
voice, language and sampling), then its engine stream and the encoder of its audio.

    plan = plan_request(state, body)                       # APIError 400/404 before anything starts
    speech = await open_speech(state, plan, "mp3", speed, client=client_of(request))
    ... speech.stream (engine chunks) -> speech.encoder (bytes) ...

The HTTP routes (`api/speaking/http_body.py`) and every socket's utterance (`api/speaking/utterance.py`)
start speech here: one place for the drain, the client's places and the engine's refusals; the encoder is
made once the engine has taken the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace

import numpy as np

from qwen3_tts_gguf import Stream, SynthesisRequest
from qwen3_tts_gguf.audio.encoding import StreamingEncoder

from api.errors import engine_refusal
from api.ops.clients import Client
from api.ops.lifecycle import PROCESS
from api.schemas import SpeechRequest
from api.speaking.plan import SpeechPlan, plan_speech
from api.state import AppState
from api.voice_resolution import model_for_voice


def plan_request(state: AppState, body: SpeechRequest, ignored_fields: Sequence[str] | None = None) -> SpeechPlan:
    """`body` planned on the model that speaks its voice (`voices.model_for_voice`): voice, language and
    sampling resolved, or APIError 400/404 naming the field. `ignored_fields`: what the protocol did not
    take from the client (default: the body's own unknown fields)."""
    served = model_for_voice(state.registry, body.model, body.voice_id, state.voice_profiles)
    plan = plan_speech(body, served, state.voice_profiles)
    return plan if ignored_fields is None else replace(plan, ignored_fields=tuple(ignored_fields))


@dataclass(frozen=True)
class OpenedSpeech:
    """A started engine stream and the encoder of its audio (both the caller's to close)."""

    plan: SpeechPlan
    stream: Stream
    encoder: OffloadedEncoder


async def open_speech(state: AppState, plan: SpeechPlan, response_format: str, speed: float = 1.0, *,
                      client: Client | None = None, live: bool = False, out_rate: int | None = None,
                      bit_rate: int | None = None) -> OpenedSpeech:
    """Start `plan` on its engine with an encoder for `response_format` (`out_rate`: pcm, mp3 or opus
    resampled to that rate; `bit_rate`: mp3's or opus's; `speed`: atempo). `live`: a streaming-text stream whose
    text comes later (`Stream.push_text`).
    `client` holds one of its speech places while the stream lives. The encoder is made once the engine has
    taken the stream; should it fail, the stream is cancelled. Engine refusals are APIErrors (see `start_stream`)."""
    live_request = replace(plan.request, text="", text_mode="streaming") if live else None
    stream = await start_stream(plan, live_request, client=client)
    try:
        encoder = StreamingEncoder(response_format, plan.served.model.sample_rate, speed, out_rate=out_rate,
                                   bit_rate=bit_rate)
    except BaseException:
        stream.cancel()
        raise
    return OpenedSpeech(plan, stream, OffloadedEncoder(encoder, state.encoder_pool))


class OffloadedEncoder:
    """A StreamingEncoder whose calls run one at a time on a worker thread.

    `close()` may come while an encode is still running (the client left): the encoder is then
    closed right after that call finishes, never concurrently with it.
    """

    def __init__(self, encoder: StreamingEncoder, executor: Executor):
        self._encoder = encoder
        self._executor = executor
        self._last: Future | None = None

    async def encode(self, samples: np.ndarray) -> bytes:
        return await self._run(self._encoder.encode, samples)

    async def finish(self) -> bytes:
        return await self._run(self._encoder.finish)

    def final_header(self) -> tuple[int, bytes] | None:
        """`StreamingEncoder.final_header` (after `finish`: no encoder call runs any more)."""
        return self._encoder.final_header()

    def close(self) -> None:
        if self._last is None:
            self._encoder.close()
        else:
            self._last.add_done_callback(lambda _: self._encoder.close())

    async def _run(self, fn: Callable, *args) -> bytes:
        self._last = self._executor.submit(fn, *args)
        return await asyncio.wrap_future(self._last)


async def start_stream(plan: SpeechPlan, live_request: SynthesisRequest | None = None, *,
                       client: Client | None = None, in_flight: bool = False) -> Stream:
    """Queue `plan.request` on its model's engine, or with `live_request` open a stream whose text
    arrives later; the prompt is built off the event loop. Engine refusals become API errors.

    `client` (`clients.client_of(request)`; None = not limited) holds one of its places for as long
    as the stream lives: 429 `client_limit` when it has none left. While the server drains, 503
    (`lifecycle.draining_error`): every protocol starts its streams here, so every one drains.
    `in_flight`: a later part of a request already served (a dialogue's next line), which the drain lets finish.
    """
    if not in_flight:
        PROCESS.refuse_if_draining()
    if client is not None:
        client.acquire()
    try:
        stream = await _queue(plan, live_request)
    except BaseException:
        if client is not None:
            client.release()
        raise
    if client is not None:
        stream.add_done_callback(lambda _: client.release())  # however the stream ends
    return stream


async def _queue(plan: SpeechPlan, live_request: SynthesisRequest | None) -> Stream:
    engine = plan.served.engine
    loop = asyncio.get_running_loop()
    if live_request is None:
        queued = asyncio.ensure_future(asyncio.to_thread(engine.submit, plan.request, loop))
    else:
        queued = asyncio.ensure_future(asyncio.to_thread(engine.open_text_stream, live_request, loop))
    try:
        return await asyncio.shield(queued)
    except asyncio.CancelledError:  # the caller went away: a stream queued meanwhile must not run orphaned
        queued.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().cancel())
        raise
    except Exception as e:
        refusal = engine_refusal(e, engine)
        if refusal is None:
            raise
        raise refusal from None
