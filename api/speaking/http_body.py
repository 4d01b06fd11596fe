"""From an engine stream to a response body: encode chunks as they come, send bytes at once.

Lifecycle of one speech response:

1. `SpeechStream.wait_for_audio` waits for the engine's first event *before* any header is sent,
   so a failure before audio still gets a real status (500/503). A client that leaves during
   that wait (queued behind other requests, say) cancels its engine stream.
2. The body (`audio_body`: the file's bytes; `sse_body`: events) encodes every AudioChunk with the
   request's one StreamingEncoder, in a worker thread so the event loop never encodes, and yields
   bytes as soon as the encoder has any. A format whose header must know the length
   (`WHOLE_FILE_FORMATS`: FLAC) is sent whole instead, in audio mode and SSE alike:
   `SpeechStream.whole_file` encodes it all before any header and writes the final header over the
   streamed one; the audio response carries `Content-Length`, the SSE deltas follow one another at
   once; a failure before it is complete is still a real status.
3. `SpeechResponse` releases the stream whatever happens. A client that disconnects cancels the
   engine stream (the engine frees the slot at its next iteration); the encoder is closed. The
   release also writes the stream's usage-log line (`--usage-log`, `api/speaking/usage.py`), every outcome.

Errors after audio bytes have left: in audio mode the body raises `SynthesisAborted`, so uvicorn
drops the connection without the terminating chunk and a cut-off file never looks whole; in SSE
mode an `error` event ends the stream (no `speech.audio.done`).

A slow reader never stalls the engine or other streams: only this response's body waits for the
socket; the engine pauses a stream whose reader is more than `max_buffered_audio_s` behind (bounded
memory), and a client that reads nothing for `send_timeout_s` is ended.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from qwen3_tts_gguf import AudioChunk, Stream, SynthesisResult, TextProgress

from api.errors import SERVER_ERROR, APIError, error_body, synthesis_failed, unavailable
from api.ops import logs
from api.ops.metrics import Metrics, real_time_factor
from api.schemas import Usage
from api.speaking.progress import chunk_progress, final_progress
from api.speaking.start import OffloadedEncoder
from api.speaking.timings import SubtitleFormat, Timings
from api.speaking.usage import UsageLog
from api.speaking.usage import usage as usage_fields

log = logging.getLogger("api.speaking.http_body")

# OpenAI's Content-Types (openai-tts-api.md §1.4); the engine's own table says audio/ogg for opus
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
SSE_CONTENT_TYPE = "text/event-stream"
WHOLE_FILE_FORMATS = ("flac",)
"""Formats sent whole (audio mode and SSE), not as they are encoded: a streamed FLAC's STREAMINFO cannot say
its length (nor its MD5), and libsndfile (soundfile, sox, Audacity) refuses a FLAC without it; FLAC of
speech is small. The sockets' frames still stream, header unknown (api/README.md, "FLAC")."""
WHOLE_FILE_PIECE = 64 * 1024
"""A whole file leaves in pieces of this many bytes, so `send_timeout_s` bounds each send, not the file's."""
STREAMING_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
ENDED_BADLY = ("error", "cancelled")


class SynthesisAborted(RuntimeError):
    """The engine ended a stream with an error (or was stopped) after audio bytes were sent."""


@dataclass(frozen=True)
class UsageAccounting:
    """Where a speech response's usage goes when it finishes: the usage log, with the request's names."""

    log: UsageLog
    request_id: str | None
    route: str
    stream_format: str
    response_format: str
    voice: str | None
    key_id: str | None = None

    def write(self, model: str, finish_reason: str, usage: dict) -> None:
        self.log.record(request_id=self.request_id, route=self.route, stream_format=self.stream_format,
                        response_format=self.response_format, model=model, voice=self.voice, key_id=self.key_id,
                        finish_reason=finish_reason, usage=usage)


class SpeechStream:
    """One admitted request on its way out: engine stream -> encoder -> bytes, with bookkeeping."""

    def __init__(self, model_id: str, stream: Stream, encoder: OffloadedEncoder, sample_rate: int,
                 metrics: Metrics, received_at: float, *, characters: int = 0,
                 accounting: UsageAccounting | None = None, progress: bool = False, speed: float = 1.0,
                 timings: Timings | None = None, word_events: bool = False,
                 subtitles: SubtitleFormat | None = None):
        self.model_id = model_id
        self.progress = progress
        """The client asked for text-progress events (SSE only: `api/speaking/progress.py`)."""
        self.speed = speed
        self.timings = timings
        """The text's timings, fed with every chunk taken (`api/speaking/timings.py`); None: not asked for."""
        self.word_events = word_events
        """SSE `speech.word` events (from `timings`)."""
        self.subtitles = subtitles
        """An SSE `speech.subtitles` event in this format at the end (from `timings`)."""
        self._last_chunk: AudioChunk | None = None  # the chunk of the piece just yielded (None: the tail)
        self.characters = characters
        """Characters of the request's raw text (usage)."""
        self._accounting = accounting
        self._stream = stream
        self._events = stream.__aiter__()
        self._encoder = encoder
        self._sample_rate = sample_rate
        self._metrics = metrics
        self._received_at = received_at
        self._first: AudioChunk | None = None
        self._first_bytes_at: float | None = None
        self._samples = 0
        self._frames = 0  # frames of the chunks taken (usage while the result is unknown)
        self._ended = False  # the engine delivered the stream's result
        self._closed = False

    def usage(self) -> Usage:
        """OpenAI usage (text tokens in, codec frames out) and the rest of `api/speaking/usage.py`'s fields."""
        return Usage(**self.usage_fields())

    def usage_fields(self) -> dict:
        """The usage object (`api/speaking/usage.py`); first audio from the request's arrival."""
        first_audio = None if self._first_bytes_at is None else self._first_bytes_at - self._received_at
        return usage_fields(self._stream.result or self._stream.result_sent, characters=self.characters,
                            samples=self._samples, sample_rate=self._sample_rate, first_audio_s=first_audio,
                            frames_taken=self._frames)

    async def wait_for_audio(self, receive: Receive) -> bool:
        """Wait for the first chunk (or the end); False when the client left first.

        Raises APIError 500/503 when the stream ended badly before any audio.
        """
        try:
            first = await _unless_client_leaves(self._next(), receive)
        except BaseException:  # the server is shutting down this request
            self.close()
            raise
        if first is None:
            self.close()
            return False
        try:
            self._first = first.result()
        except BaseException:
            self.close()
            raise
        if self._first is None and self._stream.result.finish_reason in ENDED_BADLY:
            self.close()
            raise _unserved(self._stream.result)
        return True

    async def audio_pieces(self) -> AsyncIterator[bytes]:
        """The encoded file piece by piece; SynthesisAborted if the engine fails part-way."""
        try:
            async for piece in self._encoded():
                yield self._sending(piece)
        finally:
            self.close()

    async def whole_file(self, receive: Receive) -> bytes | None:
        """The whole encoded file, its header made final (`StreamingEncoder.final_header`: a FLAC's
        length and MD5); None when the client left first. Nothing has been sent yet, so the engine
        failing part-way is an APIError (500/503) here. Its first audio is when the file is whole."""
        async def joined() -> bytearray:
            data = bytearray()
            async with aclosing(self._encoded()) as pieces:
                async for piece in pieces:
                    data += piece
            return data

        try:
            done = await _unless_client_leaves(joined(), receive)
            if done is None:
                return None
            try:
                data = done.result()
            except SynthesisAborted:
                raise _unserved(self._stream.result) from None
            if (header := self._encoder.final_header()) is not None:
                offset, final = header
                data[offset:offset + len(final)] = final
            return self._sending(bytes(data))
        finally:
            self.close()

    async def _encoded(self) -> AsyncIterator[bytes]:
        """The encoder's bytes as the engine's chunks come (usage counted); SynthesisAborted if the engine
        fails part-way."""
        chunk, self._first = self._first, None
        while chunk is not None:
            self._samples += len(chunk.samples)
            self._frames += chunk.n_frames
            if self.timings is not None:
                self.timings.piece(len(chunk.samples) / self._sample_rate / self.speed, chunk.progress)
            data = await self._encoder.encode(chunk.samples)
            if data:
                self._last_chunk = chunk
                yield data
            chunk = await self._next()
        result = self._stream.result
        if result.finish_reason in ENDED_BADLY:
            raise SynthesisAborted(f"synthesis {result.finish_reason} after {result.frames} frames"
                                   + (f": {result.error}" if result.error else ""))
        if self.timings is not None:
            self.timings.rest(result.progress)
        tail = await self._encoder.finish()
        if tail:
            self._last_chunk = None
            yield tail

    def progress_after_piece(self) -> dict | None:
        """The progress event's fields for the audio sent up to the piece just yielded (asked and known)."""
        if not self.progress:
            return None
        return chunk_progress(self._last_chunk, self._samples / self._sample_rate, self.speed)

    def piece_progress(self) -> TextProgress | None:
        """The engine's text progress as of the piece just yielded (the encoder's tail: the final one)."""
        return self._last_chunk.progress if self._last_chunk is not None else self.result_progress()

    def result_progress(self) -> TextProgress | None:
        """The engine's final text progress (None before the stream has ended)."""
        result = self._stream.result
        return None if result is None else result.progress

    def final_progress(self) -> dict | None:
        """The last progress event's fields (basis "final"), when asked for."""
        if not self.progress:
            return None
        return final_progress(self._stream.result, self._samples / self._sample_rate, self.speed)

    def close(self) -> None:
        """Release everything (idempotent): cancel the engine stream unless it ended, close the encoder."""
        if self._closed:
            return
        self._closed = True
        if not self._ended:
            self._stream.cancel()
        self._encoder.close()
        wall_s = time.monotonic() - self._received_at
        reason = self._stream.result.finish_reason if self._ended else "cancelled"
        first_audio = None if self._first_bytes_at is None else self._first_bytes_at - self._received_at
        audio_s = self._samples / self._sample_rate
        self._metrics.stream_finished(self.model_id, reason, audio_s, wall_s, first_audio)
        rtf = real_time_factor(reason, audio_s, wall_s)
        logs.note_stream(model=self.model_id, finish_reason=reason, audio_s=round(audio_s, 4),
                         frames=self._stream.result.frames if self._ended else None,
                         ttfa_s=None if first_audio is None else round(first_audio, 4),
                         rtf=None if rtf is None else round(rtf, 4))
        if reason in ENDED_BADLY and self._ended:
            log.warning("stream %s of %s ended with %s: %s", self._stream.id, self.model_id, reason,
                        self._stream.result.error)
        if self._accounting is not None:
            self._accounting.write(self.model_id, reason, self.usage_fields())

    def _sending(self, data: bytes) -> bytes:
        if self._first_bytes_at is None:
            self._first_bytes_at = time.monotonic()
        return data

    async def _next(self) -> AudioChunk | None:
        try:
            return await self._events.__anext__()
        except StopAsyncIteration:
            self._ended = True
            return None


async def _client_gone(receive: Receive) -> None:
    """Return once the client has disconnected (the request body was already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


T = TypeVar("T")


async def _unless_client_leaves(work: Awaitable[T], receive: Receive) -> asyncio.Future[T] | None:
    """Run `work` until it ends or the client disconnects: its finished future (result or exception),
    or None when the client left first (`work` is then cancelled)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_client_gone(receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    return task if task.done() and not task.cancelled() else None


def _unserved(result: SynthesisResult) -> APIError:
    """The status of a stream that ended badly before any of its bytes were sent: 503 when a retry can
    succeed (the engine restarted or stopped), else 500."""
    if result.retryable:
        return unavailable("The engine failed before this request was served; retry.", retry_after_s=1)
    if result.finish_reason == "error":
        return synthesis_failed(result.error or "unknown error")
    return unavailable("The engine stopped before this request was served; retry.", retry_after_s=1)


def audio_body(speech: SpeechStream) -> AsyncIterator[bytes]:
    """`stream_format: "audio"`: the file itself, chunked."""
    return speech.audio_pieces()


async def whole_body(data: bytes) -> AsyncIterator[bytes]:
    """A whole file (`SpeechStream.whole_file`) as a body, in `WHOLE_FILE_PIECE` pieces."""
    for start in range(0, len(data), WHOLE_FILE_PIECE):
        yield data[start:start + WHOLE_FILE_PIECE]


async def sse_body(speech: SpeechStream, whole: bytes | None = None) -> AsyncIterator[bytes]:
    """`stream_format: "sse"`: `speech.audio.delta` events (base64), each followed by `speech.progress` and
    the `speech.word`s it completed when asked, then `speech.subtitles` when asked and `speech.audio.done`
    with usage. The type is inside each JSON object (no `event:` lines) and there is no `[DONE]`. `whole`: the
    file `SpeechStream.whole_file` made, sent in `WHOLE_FILE_PIECE` deltas (no progress event but the last)."""
    try:
        async for piece in speech.audio_pieces() if whole is None else whole_body(whole):
            yield _sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode("ascii")})
            if whole is None and (progress := speech.progress_after_piece()) is not None:
                yield _sse_event({"type": "speech.progress", **progress})
            for word in _new_words(speech):
                yield word
    except SynthesisAborted as e:
        yield _sse_event({"type": "error", **error_body(str(e), SERVER_ERROR, None, "synthesis_failed")})
        return
    if (progress := speech.final_progress()) is not None:
        yield _sse_event({"type": "speech.progress", **progress})
    for word in _new_words(speech):
        yield word
    if speech.subtitles is not None and speech.timings is not None:
        yield _sse_event({"type": "speech.subtitles", "format": speech.subtitles,
                          "text": speech.timings.subtitles(speech.subtitles)})
    yield _sse_event({"type": "speech.audio.done", "usage": speech.usage().model_dump()})


def _new_words(speech: SpeechStream) -> list[bytes]:
    """`speech.word` events of the words completed since the last call (when asked)."""
    if not speech.word_events or speech.timings is None:
        return []
    return [_sse_event({"type": "speech.word", **word.fields()}) for word in speech.timings.new_words()]


def _sse_event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class ClientStalled(Exception):
    """The client read none of its response for `send_timeout_s`."""


class SpeechResponse(StreamingResponse):
    """A StreamingResponse that always releases its SpeechStream, also when the client leaves
    while a chunk is being sent (Starlette then cancels the body mid-`send`), or stops reading:
    a send that cannot complete within `send_timeout_s` ends the response and the connection."""

    def __init__(self, speech: SpeechStream, content: AsyncIterator[bytes], media_type: str,
                 headers: dict[str, str], send_timeout_s: float | None = None):
        super().__init__(content, media_type=media_type, headers={**STREAMING_HEADERS, **headers})
        self.speech = speech
        self.send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_or_give_up(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self.send_timeout_s)
            except asyncio.TimeoutError:
                raise ClientStalled() from None

        try:
            await super().__call__(scope, receive, send_or_give_up if self.send_timeout_s else send)
        except ClientStalled:  # uvicorn closes a connection whose response did not complete
            log.warning("stream %s of %s: the client read nothing for %s s; ending it", self.speech._stream.id,
                        self.speech.model_id, self.send_timeout_s)
        finally:
            self.speech.close()
