"""A dialogue (ElevenLabs' text to dialogue): lines, each in its own voice, spoken as one continuous audio stream.

Each line is a speech request of its own, planned as the speech route plans one (`plan_request`: its voice
on the model that speaks it, `voices.model_for_voice`), all of them before any audio. `LineChain` reads the
lines' engine streams one after the other as one stream (chunks, then a result), so the route's one
`SpeechStream` and one encoder make one file of them, the lines' audio back to back with nothing added
between them: the gap is the silence the model speaks at a line's edges.

The next line is queued as soon as the line before it has its first audio, so its prompt is prefilled, and
its first audio made, while that line still plays; its audio waits in its own engine stream, which the engine
pauses beyond `max_buffered_audio_s` (the bound of every stream). So a dialogue holds at most two engine
streams, each one of its client's speech places; when the client has no place left (or the queue is full)
the next line is queued when it is needed instead. A failure once audio has gone out ends the stream as an
engine failure would (`SpeechStream` cuts the response). A later line starts even while the server drains
(the request is in flight).

Timing (`LineSpan`, `timings.Timings`): each line's chunks carry their text progress moved into the
dialogue's text (the lines' texts joined), and at a line's end the characters its audio did not reach are
timed there, so every line's characters fall within its own audio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from qwen3_tts_gguf import AudioChunk, Stream, SynthesisResult, TextProgress

from api.errors import ELEVENLABS_FIELDS, APIError, invalid_request
from api.ops.clients import Client
from api.speaking.http_body import ENDED_BADLY
from api.speaking.plan import SpeechPlan, speech_body
from api.speaking.start import plan_request, start_stream
from api.speaking.timings import Timings
from api.state import AppState


def plan_dialogue(state: AppState, inputs: Sequence[tuple[str, str]], fields: dict[str, Any]) -> list[DialogueLine]:
    """Each (text, voice) of `inputs` planned as a speech request of `fields` (model, language, seed,
    normalization), within the server's dialogue limits; APIError 400/404 naming the input at fault."""
    limits = state.config.limits
    if len(inputs) > limits.max_dialogue_lines:
        raise invalid_request(f"A dialogue has at most {limits.max_dialogue_lines} lines; this one has {len(inputs)}.",
                              param="inputs", code="too_many_lines")
    chars = sum(len(text) for text, _ in inputs)
    if chars > limits.max_dialogue_chars:
        raise invalid_request(f"A dialogue has at most {limits.max_dialogue_chars} characters in all; this one has "
                              f"{chars}.", param="inputs", code="string_above_max_length")
    voices = len({voice for _, voice in inputs})
    if voices > limits.max_dialogue_voices:
        raise invalid_request(f"A dialogue has at most {limits.max_dialogue_voices} different voices; this one has "
                              f"{voices}.", param="inputs", code="too_many_voices")
    lines: list[DialogueLine] = []
    for index, (text, voice) in enumerate(inputs):
        try:
            plan = plan_request(state, speech_body({**fields, "input": text, "voice": voice, "response_format": "pcm"}))
        except APIError as e:
            if e.param in ("input", "voice"):  # (the others are the body's: errors.ELEVENLABS_FIELDS)
                e.param = f"inputs[{index}].{ELEVENLABS_FIELDS[e.param]}"
            raise
        lines.append(DialogueLine(index, voice, text, plan, lines[-1].text_end if lines else 0))
    rates = {line.plan.served.model.sample_rate for line in lines}
    if len(rates) > 1:
        raise invalid_request(f"The voices speak on models of different sample rates ({sorted(rates)}): one dialogue "
                              "is one audio stream.", param="inputs")
    return lines


@dataclass(frozen=True)
class DialogueLine:
    """One line: its place in the request, voice and text, its plan, and where its text starts in the dialogue's."""

    index: int
    voice_id: str
    text: str
    plan: SpeechPlan
    text_start: int

    @property
    def text_end(self) -> int:
        return self.text_start + len(self.text)


@dataclass
class LineSpan:
    """Where a line's audio lies in the dialogue's, in samples at the model's rate (`end`: None while it speaks)."""

    line: DialogueLine
    start: int
    end: int | None = None
    needed_at: float = 0.0
    """When the dialogue came to this line (the line before it had ended)."""
    first_audio_at: float | None = None
    """When the engine had made the line's first audio (before `needed_at`: made while the line before it played)."""


class LineChain:
    """The engine streams of a dialogue's lines, read as one stream (what `SpeechStream` reads): the chunks of
    each line in turn, then one result for all of them. `first` is the first line's stream, already queued."""

    def __init__(self, lines: Sequence[DialogueLine], first: Stream, client: Client | None = None,
                 timings: Timings | None = None):
        self.lines = list(lines)
        self.id = first.id
        self.client = client
        self.timings = timings
        self.spans: list[LineSpan] = []
        """The lines begun, in order."""
        self.samples = 0
        """Samples of the chunks read so far (all lines)."""
        self.result: SynthesisResult | None = None
        self.result_sent: SynthesisResult | None = None
        self._first: Stream | None = first
        self._current: Stream | None = None
        self._ahead: tuple[int, asyncio.Future[Stream | None]] | None = None
        self._cancelled = False

    @property
    def sample_rate(self) -> int:
        """The rate of every line's audio (`plan_dialogue` checks they agree)."""
        return self.lines[0].plan.served.model.sample_rate

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._chunks()

    def cancel(self) -> None:
        """Stop the line speaking and the one queued ahead (their places and slots freed at once)."""
        self._cancelled = True
        for stream in (self._first, self._current):
            if stream is not None:
                stream.cancel()
        self._drop_ahead()

    async def _chunks(self) -> AsyncIterator[AudioChunk]:
        results: list[SynthesisResult] = []
        try:
            for line in self.lines:
                needed_at = time.monotonic()
                try:
                    stream = await self._stream_of(line.index)
                except APIError as e:
                    results.append(SynthesisResult(0, 0, "error", error=f"line {line.index}: {e.message}",
                                                   retryable=e.status_code in (429, 503)))
                    break
                self._current = stream
                if self._cancelled:
                    stream.cancel()
                span = LineSpan(line, self.samples, needed_at=needed_at)
                self.spans.append(span)
                async for chunk in stream:
                    if self._ahead is None and line.index + 1 < len(self.lines) and not self._cancelled:
                        self._look_ahead(line.index + 1)
                    self.samples += len(chunk.samples)
                    yield replace(chunk, progress=_moved(chunk.progress, line))
                span.end, span.first_audio_at = self.samples, stream.first_audio_at
                if self.timings is not None:
                    self.timings.up_to(line.text_end)
                results.append(stream.result)
                if stream.result.finish_reason in ENDED_BADLY:
                    break
        finally:
            self._drop_ahead()
        self.result = self.result_sent = _joined(results, self.lines)

    async def _stream_of(self, index: int) -> Stream:
        if index == 0 and self._first is not None:
            stream, self._first = self._first, None
            return stream
        if self._ahead is not None and self._ahead[0] == index:
            future, self._ahead = self._ahead[1], None
            stream = await future
            if stream is not None:
                return stream
        return await self._open(index, early=False)

    def _look_ahead(self, index: int) -> None:
        self._ahead = (index, asyncio.ensure_future(self._open(index, early=True)))

    async def _open(self, index: int, early: bool) -> Stream | None:
        """Queue line `index`; early (ahead of need), a refusal for want of a place is None: it is queued later."""
        try:
            return await start_stream(self.lines[index].plan, client=self.client, in_flight=True)
        except APIError as e:
            if early and e.status_code == 429:
                return None
            raise

    def _drop_ahead(self) -> None:
        """Cancel the line queued ahead when it will not be read (however its queueing ends)."""
        if self._ahead is None:
            return
        future, self._ahead = self._ahead[1], None

        def cancel(done: asyncio.Future[Stream | None]) -> None:
            if not done.cancelled() and done.exception() is None and done.result() is not None:
                done.result().cancel()

        future.add_done_callback(cancel)


def _moved(progress: TextProgress | None, line: DialogueLine) -> TextProgress | None:
    """A line's progress as offsets into the dialogue's text (the normalized offsets dropped: per line only)."""
    if progress is None:
        return None
    return TextProgress(line.text_start + progress.text_fed_end, line.text_start + progress.spoken_end_estimate,
                        progress.basis)


def _joined(results: list[SynthesisResult], lines: list[DialogueLine]) -> SynthesisResult:
    """One result for the lines spoken: frames and tokens added up, the last line's ending (or the failure)."""
    last = results[-1]
    normalized = [r.normalized_chars for r in results]
    return SynthesisResult(
        frames=sum(r.frames for r in results), text_tokens=sum(r.text_tokens for r in results),
        finish_reason=last.finish_reason, error=last.error, retryable=last.retryable,
        progress=_moved(last.progress, lines[len(results) - 1]), text_chars=sum(r.text_chars for r in results),
        normalized_chars=None if None in normalized else sum(normalized),
        runaway=[event for r in results for event in r.runaway])
