"""One utterance on a socket: an engine stream, its encoder, its text limits, its audio pump and its
accounting. Every socket protocol (`/v1/ws`, `/v1/realtime`) speaks through this; each only shapes
the events around it.

    utterance = await open_utterance(connection, plan, encoder_format, speed, live=True)
    utterance.push("Hel"); utterance.push("lo."); utterance.stop()       # live text
    ending = await pump(utterance, deliver)     # engine chunks -> encoder -> deliver(bytes)
    record(state, utterance, ending, route)     # metrics + access log

Limits on live text (`api/limits.py`): `ws_max_session_chars` (`check_text`), `ws_idle_timeout_s` and
`ws_max_session_s` (`watch`: a session without non-blank text for this long, or this old, is stopped
as if `stop` had come — cancelled when it never got any text — and its `limit` says which). While an
utterance is `detached` (a resumable `/v1/ws` stream whose socket was lost, `api/protocols/resume.py`) the idle
timeout does not run; `restart_watch` restarts it when the utterance is detached or re-attached.

`Utterance.usage()` is the usage object of every socket protocol (`api/speaking/usage.py`); `record` also
writes the usage-log line (`--usage-log`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from qwen3_tts_gguf import AudioChunk, Stream

from api.errors import APIError, invalid_request, synthesis_failed
from api.limits import ServerLimits
from api.ops import logs
from api.ops.clients import Client
from api.speaking.plan import SpeechPlan
from api.speaking.progress import chunk_progress, final_progress
from api.speaking.start import OffloadedEncoder, open_speech
from api.speaking.usage import key_id, usage_log
from api.speaking.usage import usage as usage_fields
from api.state import AppState

log = logging.getLogger("api.speaking.utterance")


@dataclass
class Utterance:
    """One `start` .. `done`: the engine stream, its encoder and what the client is told at the end."""

    id: str
    plan: SpeechPlan
    stream: Stream
    encoder: OffloadedEncoder
    response_format: str
    started_at: float
    live: bool = True
    """Text arrives in deltas (else the plan's text was given whole)."""
    chars: int = 0
    has_text: bool = False
    """Some text that is not blank came (blank deltas are spoken but keep no session alive)."""
    first_text_at: float | None = None
    first_audio_at: float | None = None
    samples: int = 0
    frames: int = 0
    """Codec frames of the chunks taken (usage while the engine's result is not known yet)."""
    stopped: bool = False
    cancelled: bool = False
    limit: str | None = None
    """The server limit that ended the text: "idle_timeout" or "session_length"."""
    last_text_at: float = 0.0
    pump: asyncio.Task | None = None
    watchdog: asyncio.Task | None = None
    detached: bool = False
    """Its socket was lost and it waits, paused, for a `resume` (`api/protocols/resume.py`): no idle timeout."""
    resume: Any = None
    """The `api/resume.Resumable` of a resumable `/v1/ws` stream (None: ends with its socket)."""
    speed: float = 1.0
    progress: bool = False
    """The client asked for text-progress events (`api/speaking/progress.py`)."""

    @property
    def sample_rate(self) -> int:
        return self.plan.served.model.sample_rate

    @property
    def closed(self) -> bool:
        """No more text is taken (stopped or cancelled)."""
        return self.stopped or self.cancelled

    def check_text(self, delta: str, limits: ServerLimits, param: str = "text") -> None:
        """APIError unless `delta` may be added (the utterance is open and stays within its characters)."""
        if self.closed:
            raise invalid_request(f"This stream was already {'stopped' if self.stopped else 'cancelled'}: "
                                  "wait for it to end and start a new one.", code="stream_closed")
        limit = limits.ws_max_session_chars
        if self.chars + len(delta) > limit:
            raise invalid_request(f"A stream takes at most {limit} characters of text; this text was not added "
                                  "(stop this stream, then send the rest in a new one).", param=param,
                                  code="string_above_max_length")

    def push(self, delta: str) -> None:
        now = time.monotonic()
        if self.first_text_at is None:
            self.first_text_at = now
        if delta.strip():
            self.last_text_at = now
            self.has_text = True
        self.chars += len(delta)
        self.stream.push_text(delta)

    def stop(self) -> None:
        """No more text: speak what came."""
        if not self.closed:
            self.stopped = True
            if self.live:
                self.stream.close_text()

    def cancel(self) -> None:
        """Stop at once; the engine frees the slot at its next iteration."""
        if not self.cancelled:
            self.cancelled = True
            self.stream.cancel()
            if self.resume is not None:
                self.resume.on_cancel()  # no resume any more; wakes a pump waiting for one

    @property
    def characters(self) -> int:
        """Characters of raw text taken: the deltas of a live utterance, else the whole text."""
        return self.chars if self.live else len(self.plan.request.text)

    def progress_after(self, chunk: AudioChunk | None) -> dict[str, Any] | None:
        """Progress-event fields for the audio sent up to the end of `chunk`, when asked for and known."""
        return chunk_progress(chunk, self.samples / self.sample_rate, self.speed) if self.progress else None

    def final_progress(self) -> dict[str, Any] | None:
        """The last progress event's fields (basis "final"), when asked for."""
        if not self.progress:
            return None
        return final_progress(self.stream.result, self.samples / self.sample_rate, self.speed)

    def first_audio_s(self) -> float | None:
        """From the first text to the first audio sent."""
        if self.first_audio_at is None or self.first_text_at is None:
            return None
        return round(self.first_audio_at - self.first_text_at, 4)

    def usage(self) -> dict[str, Any]:
        """The usage object (`api/speaking/usage.py`): token counts in OpenAI's names (text tokens in, codec
        frames out), characters, audio seconds, frames, first audio (from the first text)."""
        return usage_fields(self.stream.result or self.stream.result_sent, characters=self.characters,
                            samples=self.samples, sample_rate=self.sample_rate, first_audio_s=self.first_audio_s(),
                            frames_taken=self.frames)

    def timings(self) -> dict[str, float | None]:
        timings = self.stream.result.timings if self.stream.result else {}
        return {
            "first_audio_s": self.first_audio_s(),
            "elapsed_s": round(time.monotonic() - self.started_at, 4),
            "compute_s": round(sum(timings.get(k, 0.0) for k in ("talker_s", "predictor_s", "codec_s")), 4),
        }

    @property
    def audio_s(self) -> float:
        return round(self.samples / self.sample_rate, 4)


@dataclass(frozen=True)
class Ending:
    """How an utterance ended: the engine's finish reason, and the error to tell the client (if any)."""

    reason: str
    error: APIError | None = None


async def open_utterance(client: Client | None, state: AppState, plan: SpeechPlan, response_format: str,
                         speed: float, *, live: bool, progress: bool = False, out_rate: int | None = None,
                         bit_rate: int | None = None) -> Utterance:
    """Start `plan` on its engine (`live`: text comes later by `push`) with an encoder for
    `response_format` (`out_rate`, `bit_rate`: as `open_speech` takes them); the socket's `client`
    (`clients.client_of`) holds one of its speech places until the stream ends. `progress`: the
    protocol sends text-progress events."""
    opened = await open_speech(state, plan, response_format, speed, client=client, live=live, out_rate=out_rate,
                               bit_rate=bit_rate)
    now = time.monotonic()
    return Utterance(id=uuid.uuid4().hex, plan=plan, stream=opened.stream,
                     encoder=opened.encoder, response_format=response_format,
                     started_at=now, live=live, last_text_at=now, first_text_at=None if live else now,
                     speed=speed, progress=progress)


async def pump(utterance: Utterance, deliver: Callable[[bytes, AudioChunk | None], Awaitable[None]]) -> Ending:
    """Engine chunks -> encoder -> `deliver(bytes, chunk)` (chunk None for the encoder's tail), until the
    stream ends. Never raises for the engine or the encoder: the Ending says what happened."""
    try:
        async for chunk in utterance.stream:
            if utterance.cancelled:
                continue  # drain to the result without sending what the client no longer wants
            utterance.samples += len(chunk.samples)
            utterance.frames += chunk.n_frames
            data = await utterance.encoder.encode(chunk.samples)
            if data:
                await _deliver(utterance, deliver, data, chunk)
        reason = utterance.stream.result.finish_reason
        if reason != "error":
            tail = await utterance.encoder.finish()
            if tail and not utterance.cancelled:
                await _deliver(utterance, deliver, tail, None)
            return Ending(reason)
        if utterance.live and not utterance.has_text:
            return Ending(reason, invalid_request("No text was sent before the stream was stopped.",
                                                  param="text", code="empty_input"))
        # the engine's text is for the log (`record`), not for the client
        return Ending(reason, synthesis_failed(f"the engine failed while speaking stream {utterance.id}."))
    except Exception:  # an encoder failure: end this utterance, keep the socket
        log.exception("stream %s: encoding failed", utterance.id)
        utterance.cancel()
        return Ending("error", synthesis_failed(f"the audio of stream {utterance.id} could not be encoded."))
    finally:
        utterance.encoder.close()
        if utterance.watchdog is not None:
            utterance.watchdog.cancel()


async def _deliver(utterance: Utterance, deliver: Callable[[bytes, AudioChunk | None], Awaitable[None]],
                   data: bytes, chunk: AudioChunk | None) -> None:
    if utterance.first_audio_at is None:
        utterance.first_audio_at = time.monotonic()
    await deliver(data, chunk)


async def watch(utterance: Utterance, limits: ServerLimits) -> None:
    """Stop `utterance` at its idle timeout or its length limit (a forgotten or endless session must
    not hold its engine slot): as `stop` does, or as `cancel` when it got no text to speak."""
    idle, longest = limits.ws_idle_timeout_s, limits.ws_max_session_s
    while not utterance.closed:
        idle_at = utterance.last_text_at + idle if idle and not utterance.detached else math.inf
        end_at = utterance.started_at + longest if longest else math.inf
        wait = min(idle_at, end_at) - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        utterance.limit = "session_length" if end_at <= idle_at else "idle_timeout"
        log.info("stream %s reached its %s limit: stopping it", utterance.id, utterance.limit)
        if utterance.has_text:
            utterance.stop()
        else:
            utterance.cancel()


def start_watch(utterance: Utterance, limits: ServerLimits) -> None:
    """Run `watch` beside a live utterance when a limit is set."""
    if utterance.live and (limits.ws_idle_timeout_s or limits.ws_max_session_s):
        utterance.watchdog = asyncio.create_task(watch(utterance, limits), name=f"watch-{utterance.id[:8]}")


def restart_watch(utterance: Utterance, limits: ServerLimits) -> None:
    """Start `watch` afresh (the utterance was detached or re-attached: its idle clock changed), unless
    its pump has ended."""
    if utterance.watchdog is not None:
        utterance.watchdog.cancel()
        utterance.watchdog = None
    if utterance.pump is None or not utterance.pump.done():
        start_watch(utterance, limits)


async def settle(utterance: Utterance | None) -> None:
    """The socket is over: cancel `utterance` and wait (bounded) for its pump to finish."""
    if utterance is None:
        return
    utterance.cancel()
    if utterance.pump is None:
        return
    try:
        await asyncio.wait_for(asyncio.shield(utterance.pump), timeout=10)
    except asyncio.TimeoutError:  # the engine did not answer the cancel: never hang the server
        log.warning("stream %s did not end after its client left", utterance.id)
        utterance.pump.cancel()
    except asyncio.CancelledError:  # the server is shutting down this connection
        utterance.pump.cancel()
        raise


def record(state: AppState, utterance: Utterance, ending: Ending, route: str, *, method: str = "WS",
           status: int | None = 101) -> None:
    """Metrics (streams by finish reason, audio seconds, time from first text to first audio), the
    access record and the usage-log line (`--usage-log`). (No real-time factor: a live stream's wall
    time is the writer's typing speed.)"""
    metrics, model = state.metrics, utterance.plan.served.id
    metrics.streams.inc(model=model, reason=ending.reason)
    if utterance.samples:
        metrics.audio_seconds.inc(utterance.samples / utterance.sample_rate, model=model)
    first_audio = utterance.first_audio_s()
    if first_audio is not None:
        metrics.first_audio.observe(first_audio, model=model)
    if ending.reason == "error":
        log.warning("stream %s of %s ended with an error: %s", utterance.id, model,
                    utterance.stream.result.error if utterance.stream.result else "encoder failure")
    timings = utterance.timings()
    logs.log_access(logs.access_record(
        request_id=utterance.id, method=method, route=route, status=status, model=model,
        voice=utterance.plan.voice.label, finish_reason=ending.reason, frames=utterance.usage()["output_tokens"],
        audio_s=utterance.audio_s, ttfa_s=first_audio, elapsed_s=timings["elapsed_s"]))
    writer = usage_log(state.config.usage_log)
    if writer is not None:
        writer.record(request_id=utterance.id, route=route, model=model, voice=utterance.plan.voice.label,
                      response_format=utterance.response_format, finish_reason=ending.reason,
                      usage=utterance.usage(), key_id=key_id(state.config.api_key))
