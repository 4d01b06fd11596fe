"""Where a stream's text rows come from: text known up front, or text arriving live.

Both answer the engine's questions the same way: is the stream ready to start, what does it
prefill, which text row goes with decode step k, how many KV cells may it need, and is there a
next segment. The engine (`scheduler.py`) never looks inside.

They also say how far the text has got (`frame_made` after each frame, `progress` as of the last
one, `final_progress` at the end; request.TextProgress). Frame k of a segment is made after the
talker read its first (text rows paired in the prefill) + k text tokens; offsets are code points
of the raw text, mapped back through the segments and, when on, the normalization spans. The
spoken estimate assumes SPOKEN_FRAMES_PER_TOKEN frames per token from the segment's start.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from qwen3_tts_gguf.engine.request import TextProgress
from qwen3_tts_gguf.model.prompt import Prompt, PromptBuilder, VoiceSpec
from qwen3_tts_gguf.text.feed import TextFeed
from qwen3_tts_gguf.text.normalization import (
    LiveNormalizer,
    NormalizedText,
    StreamingNormalizer,
    load_wetext,
    normalizes,
)
from qwen3_tts_gguf.text.segments import locate_segments

log = logging.getLogger("qwen3_tts_gguf.engine")

SPOKEN_FRAMES_PER_TOKEN = 4
"""Assumed speaking rate for `spoken_end_estimate`: ~3 tokens/s at 12.5 frames/s (English at
~150 words/min is ~3.3 tokens/s, Chinese at ~4.5 characters/s ~3.2). A heuristic, not a measurement."""


def frame_budget(base_frames: int, frames_per_token: int, tokens: int) -> int:
    """Runaway protection: the frames a segment of `tokens` text tokens may make."""
    return base_frames + frames_per_token * max(tokens, 1)


class _Progress:
    """A stream's progress values, kept monotonic; a failure turns progress off (never the stream's)."""

    def __init__(self, normalized: bool):
        self.normalized = normalized
        self.last: TextProgress | None = None
        self.failed = False

    def update(self, fed: tuple[int, int], spoken: tuple[int, int], basis: str) -> TextProgress:
        """fed / spoken: (raw, normalized) offsets."""
        if self.last is not None:
            last = self.last
            fed = (max(fed[0], last.text_fed_end), max(fed[1], last.normalized_text_fed_end or 0))
            spoken = (max(spoken[0], last.spoken_end_estimate),
                      max(spoken[1], last.normalized_spoken_end_estimate or 0))
        spoken = (min(spoken[0], fed[0]), min(spoken[1], fed[1]))
        self.last = TextProgress(fed[0], spoken[0], basis, *((fed[1], spoken[1]) if self.normalized else (None, None)))
        return self.last

    def guard(self, fn: Callable[[], None]) -> None:
        if self.failed:
            return
        try:
            fn()
        except Exception:
            self.failed = True
            log.exception("text progress failed; this stream reports none")


def _spoken_tokens(fed: int, frames: int) -> int:
    return min(fed, frames // SPOKEN_FRAMES_PER_TOKEN)


class _TextSource(ABC):
    """What both sources share: progress after each frame and at the end, guarded (`_Progress`)."""

    _progress: _Progress

    @property
    def progress(self) -> TextProgress | None:
        """As of the last frame made."""
        return None if self._progress.failed else self._progress.last

    def frame_made(self, frames: int) -> None:
        """The current segment has made `frames` frames (the last one just now)."""
        self._progress.guard(lambda: self._frame_made(frames))

    def final_progress(self, reason: str, started: bool = True) -> TextProgress | None:
        """The values at the end: the whole text after EOS or once all of it was read."""
        result: list[TextProgress] = []

        def final() -> None:
            end = self._final_end(reason) if started else (0, 0)
            result.append(self._progress.update(end, end, "final"))

        self._progress.guard(final)
        return result[0] if result else None

    @abstractmethod
    def _frame_made(self, frames: int) -> None:
        """Update progress for a frame just made (`frame_made`, guarded)."""

    @abstractmethod
    def _final_end(self, reason: str) -> tuple[int, int]:
        """(raw, normalized) offsets the text has been read to when the stream ends for `reason`."""


class FixedText(_TextSource):
    """Text known up front: one prompt per segment (long input is split at sentence ends).

    The first segment's prompt is built at submit (its errors reach the caller); each later one is
    built in the background while the segment before it speaks (`prepare` returns a Future), so
    neither the first audio nor the engine loop waits for the text rows of a long input.
    `prefill_sizes` are the prefill rows of every segment (exact for the first, an upper bound
    for the others), so the engine can reserve a stream's worst case before it starts.
    `text`: the input and what is spoken for it (the segments split `text.text`); progress is
    reported per frame and finally in every text mode (non-streaming: each segment's text is all
    read by its prefill, so only the spoken estimate moves)."""

    def __init__(self, segments: list[str], tokens: list[int], prefill_sizes: list[int],
                 build: Callable[[str], Prompt], prepare: Callable[[str], Future],
                 text: NormalizedText | None = None, streaming: bool = False):
        self._segments, self._tokens, self._prepare = segments, tokens, prepare
        self.prompts = [build(segments[0])]
        self.prefill_sizes = [len(self.prompts[0].rows), *prefill_sizes[1:]]
        self._next = prepare(segments[1]) if len(segments) > 1 else None
        self.segment = 0
        self._text = text if text is not None else NormalizedText.plain("".join(segments))
        self._located = locate_segments(self._text.text, segments)
        self._streaming = streaming
        self._progress = _Progress(self._text.normalized)
        self._read = (0, 0)  # (segment, body tokens) the talker had read at the last frame

    @property
    def raw_chars(self) -> int:
        return len(self._text.raw)

    @property
    def normalized_chars(self) -> int | None:
        return len(self._text.text) if self._text.normalized else None

    def _frame_made(self, frames: int) -> None:
        p = self.prompt
        fed = min(max(p.body_in_prefill() + frames - 1, 0), p.text_tokens)
        self._read = (self.segment, fed)
        self._progress.update(self._ends(self.segment, fed), self._ends(self.segment, _spoken_tokens(fed, frames)),
                              "frames_per_token")

    def _final_end(self, reason: str) -> tuple[int, int]:
        if reason == "eos":
            return len(self._text.raw), len(self._text.text)
        segment, read = self._read if self._streaming else (self.segment, self.prompt.text_tokens)
        return self._ends(segment, read)

    def _ends(self, segment: int, tokens: int) -> tuple[int, int]:
        """(raw, spoken) offsets just past the first `tokens` body tokens of `segment`."""
        prompt = self.prompts[segment]
        if segment == len(self._segments) - 1 and tokens >= prompt.text_tokens:
            return len(self._text.raw), len(self._text.text)
        located = self._located[segment]
        pos = prompt.text_ends[min(tokens, prompt.text_tokens) - 1] if tokens > 0 else 0
        if pos > 0:
            at = located[pos - 1] + 1
        else:
            at = self._located[segment - 1][-1] if segment > 0 else 0
        return self._text.to_raw(at), at

    @property
    def prompt(self) -> Prompt:
        return self.prompts[self.segment]

    def ready(self) -> bool:
        return True

    def empty(self) -> bool:
        return False

    def prefill_rows(self) -> np.ndarray:
        return self.prompt.rows

    def prefill_len(self) -> int:
        return len(self.prompt.rows)

    def prefix_len(self) -> int:
        return self.prompt.prefix_len

    def row(self, step: int) -> np.ndarray | None:
        p = self.prompt
        return p.trailing[step] if step < len(p.trailing) else p.pad_row

    def has_row(self, step: int) -> bool:
        return True

    def segment_tokens(self) -> int:
        return self._tokens[self.segment]

    def segment_text(self) -> str:
        return self._segments[self.segment]

    def worst_cells(self, budget: Callable[[int], int], cap: int) -> int:
        """KV cells the stream may need at most: its largest segment's prefill + frame budget."""
        return min(cap, max(rows + budget(tokens) for rows, tokens in zip(self.prefill_sizes, self._tokens)))

    @property
    def text_tokens(self) -> int:
        return sum(self._tokens)

    def next_segment(self) -> bool:
        """Move to the next segment (its prompt may raise here if building it failed)."""
        if self._next is None:
            return False
        self.prompts.append(self._next.result())
        self.segment += 1
        following = self.segment + 1
        self._next = self._prepare(self._segments[following]) if following < len(self._segments) else None
        return True

    def cancel(self) -> None:
        """Stop building prompts nobody will speak."""
        if self._next is not None:
            self._next.cancel()


class FedText(_TextSource):
    """Text arriving live (streaming text mode): rows are made as tokens are committed.

    The streaming layout pairs the first Nc text rows with Nc codec rows in the prompt: Nc = 1
    (codec_bos) for a plain voice; for an in-context clone the text rows start with the reference
    transcript and the codec rows are codec_bos + one per reference frame, so the stream starts
    once Nc text rows are known (or at close, padding with <tts_pad> as the official layout does).
    Text row Nc + k is added to decode step k; after the text (and its EOS) comes <tts_pad>.
    With `normalize`, pushed text is normalized on a worker thread (`LiveNormalizer`) and what it
    commits goes into `feed`; offsets still count in the raw text pushed.
    """

    def __init__(self, prompts: PromptBuilder, voice: VoiceSpec, on_change: Callable[[], None],
                 normalize: bool = False):
        self._prompts = prompts
        self._prefix = prompts.prefix_rows(voice)  # validates the voice now
        self._ref_ids, self._codec_rows = prompts.reference_track(voice)
        tokenizer = prompts.tokenizer
        # plain encode of each new run of pieces = the template's body ids (text not starting with a newline)
        self.feed = TextFeed(tokenizer.encode, tokenizer.pieces, on_change=on_change,
                             encode_with_ends=tokenizer.encode_with_ends)
        self.normalizer: LiveNormalizer | None = None
        if normalize and normalizes(voice.language):
            load_wetext()  # (here, on the opening thread: not on the pushing one)
            self.normalizer = LiveNormalizer(StreamingNormalizer(voice.language), self.feed.push, self.feed.close)
        self._progress = _Progress(self.normalizer is not None)
        self._read = 0  # body tokens the talker had read at the last frame

    def push(self, delta: str) -> None:
        """Append raw text (cheap with normalization: the worker does it)."""
        (self.normalizer or self.feed).push(delta)

    def close(self) -> None:
        (self.normalizer or self.feed).close()

    @property
    def raw_chars(self) -> int:
        return self.normalizer.raw_chars if self.normalizer is not None else len(self.feed.text)

    @property
    def normalized_chars(self) -> int | None:
        if self.normalizer is None or self.normalizer.normalizer.language is None:
            return None
        return self.normalizer.normalizer.normalized_chars

    def _frame_made(self, frames: int) -> None:
        committed = self.feed.committed_tokens
        fed = min(max(len(self._codec_rows) + frames - 1 - len(self._ref_ids), 0), committed)
        self._read = fed
        self._progress.update(self._ends(fed, committed), self._ends(_spoken_tokens(fed, frames), committed),
                              "frames_per_token")

    def _final_end(self, reason: str) -> tuple[int, int]:
        committed = self.feed.committed_tokens
        read = committed if reason == "eos" and self.feed.closed else self._read  # all of it only once closed
        return self._ends(read, committed)

    def _ends(self, tokens: int, committed: int) -> tuple[int, int]:
        """(raw, spoken) offsets just past the first `tokens` committed body tokens."""
        if self.feed.closed and tokens >= committed:
            spoken = len(self.feed.text)
            return (self.raw_chars, spoken) if self.normalizer is not None else (spoken, spoken)
        spoken = self.feed.char_end(tokens)
        if self.normalizer is None:
            return spoken, spoken
        return self.normalizer.normalizer.map.to_raw(spoken), spoken

    def _text(self) -> tuple[list[int], bool]:
        """(reference transcript + committed body ids, closed)."""
        ids, closed = self.feed.snapshot()
        return self._ref_ids + ids, closed

    def _text_row(self, index: int, ids: list[int], closed: bool) -> np.ndarray | None:
        if index < len(ids):
            return self._prompts.tables.text_rows([ids[index]])[0]
        if not closed:
            return None
        return self._prompts.eos_row if index == len(ids) else self._prompts.pad_row

    def ready(self) -> bool:
        ids, closed = self._text()
        return closed or len(ids) >= len(self._codec_rows)

    def empty(self) -> bool:
        ids, closed = self.feed.snapshot()
        return closed and not ids

    def prefill_rows(self) -> np.ndarray:
        ids, closed = self._text()
        text = np.stack([self._text_row(i, ids, closed) for i in range(len(self._codec_rows))])
        return np.concatenate([self._prefix, text + self._codec_rows]).astype(np.float32)

    def prefill_len(self) -> int:
        return len(self._prefix) + len(self._codec_rows)

    def prefix_len(self) -> int:
        return len(self._prefix)

    def prefix_rows(self) -> np.ndarray:
        """The voice's prompt prefix (role, speaker, language rows; as `prefill_rows` begins): known
        before any text."""
        return self._prefix.astype(np.float32, copy=False)

    def row(self, step: int) -> np.ndarray | None:
        """Text part of decode step `step`; None = that text has not arrived yet."""
        ids, closed = self._text()
        return self._text_row(len(self._codec_rows) + step, ids, closed)

    def has_row(self, step: int) -> bool:
        """Whether `row(step)` is there, without projecting it."""
        ids, closed = self._text()
        return closed or len(self._codec_rows) + step < len(ids)

    def segment_tokens(self) -> int:
        return max(len(self.feed.snapshot()[0]), 1)

    def segment_text(self) -> str:
        return self.feed.text

    def worst_cells(self, budget: Callable[[int], int], cap: int) -> int:
        """KV cells for the text committed so far (live text grows: the engine re-asks each step)."""
        return min(cap, self.prefill_len() + budget(self.segment_tokens()))

    @property
    def text_tokens(self) -> int:
        return len(self.feed.snapshot()[0])

    def next_segment(self) -> bool:
        return False

    def cancel(self) -> None:
        if self.normalizer is not None:
            self.normalizer.cancel()


TextSource = FixedText | FedText
