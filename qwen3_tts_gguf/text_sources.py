"""Where a stream's text rows come from: text known up front, or text arriving live.

Both answer the engine's questions the same way: is the stream ready to start, what does it
prefill, which text row goes with decode step k, how many KV cells may it need, and is there a
next segment. The engine (`scheduler.py`) never looks inside.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from .prompt import Prompt, PromptBuilder, VoiceSpec
from .text_feed import TextFeed


def frame_budget(base_frames: int, frames_per_token: int, tokens: int) -> int:
    """Runaway protection: the frames a segment of `tokens` text tokens may make."""
    return base_frames + frames_per_token * max(tokens, 1)


class FixedText:
    """Text known up front: one prompt per segment (long input is split at sentence ends).

    The first segment's prompt is built at submit (its errors reach the caller); each later one is
    built in the background while the segment before it speaks (`prepare` returns a Future), so
    neither the first audio nor the engine loop waits for the text rows of a long input.
    `prefill_sizes` are the prefill rows of every segment (exact for the first, an upper bound
    for the others), so the engine can reserve a stream's worst case before it starts."""

    def __init__(self, segments: list[str], tokens: list[int], prefill_sizes: list[int],
                 build: Callable[[str], Prompt], prepare: Callable[[str], Future]):
        self._segments, self._tokens, self._prepare = segments, tokens, prepare
        self.prompts = [build(segments[0])]
        self.prefill_sizes = [len(self.prompts[0].rows), *prefill_sizes[1:]]
        self._next = prepare(segments[1]) if len(segments) > 1 else None
        self.segment = 0

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


class FedText:
    """Text arriving live (streaming text mode): rows are made as tokens are committed.

    The streaming layout pairs the first Nc text rows with Nc codec rows in the prompt: Nc = 1
    (codec_bos) for a plain voice; for an in-context clone the text rows start with the reference
    transcript and the codec rows are codec_bos + one per reference frame, so the stream starts
    once Nc text rows are known (or at close, padding with <tts_pad> as the official layout does).
    Text row Nc + k is added to decode step k; after the text (and its EOS) comes <tts_pad>.
    """

    def __init__(self, prompts: PromptBuilder, voice: VoiceSpec, on_change: Callable[[], None]):
        self._prompts = prompts
        self._prefix = prompts.prefix_rows(voice)  # validates the voice now
        self._ref_ids, self._codec_rows = prompts.reference_track(voice)
        tokenizer = prompts.tokenizer
        # plain encode of each new run of pieces = the template's body ids (text not starting with a newline)
        self.feed = TextFeed(tokenizer.encode, tokenizer.pieces, on_change=on_change)

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

    def worst_cells(self, budget: Callable[[int], int], cap: int) -> int:
        """KV cells for the text committed so far (live text grows: the engine re-asks each step)."""
        return min(cap, self.prefill_len() + budget(self.segment_tokens()))

    @property
    def text_tokens(self) -> int:
        return len(self.feed.snapshot()[0])

    def next_segment(self) -> bool:
        return False

    def cancel(self) -> None:
        pass


TextSource = FixedText | FedText
