"""The runaway guard: a segment whose codebook 0 falls into a loop is ended or retried.

A runaway (no end-of-speech token: minutes of babble, or a phrase repeated) shows two ways. A
stretch far past what the text needs is ended by the frame budget (`frame_budget`, the finish
reason "budget"). A loop is found here, while the stream runs: the segment's last codebook-0 codes
equal themselves one period earlier (at `LOOP_SIMILARITY` or more of the frames) over at least
`LOOP_MIN_FRAMES` frames and three occurrences of the period, or more where the text itself repeats
a unit ("ha ha ha ha": `text_repeats`). What the guard then does (`RUNAWAY_ACTIONS`, the
`--runaway` setting): "end" ends the segment where the loop's first occurrence ends (its repeats
not yet decoded are dropped) and goes on with the next one; "retry" goes back there and samples on
with a new random state drawn from the stream's seed and the retry's number (a seed still means the
same audio), codebook 0 sampled with the model's default settings when the request was greedy
(greedy would only repeat the loop), at most `--runaway-retries` times per stream, then "end".
Audio already sent stays sent: only frames not yet decoded can be taken back. docs/reliability.md
says what is detected and what is not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qwen3_tts_gguf.model.settings import RUNAWAY_ACTIONS

LOOP_MIN_FRAMES = 48
"""The shortest stretch judged a loop (3.84 s): real speech holds one code (a pause) for well under it."""
LOOP_MAX_PERIOD = 75
"""The longest loop found (6 s): a phrase repeated; longer repeats are left to the frame budget."""
LOOP_SIMILARITY = 0.85
"""Share of the stretch's frames equal to the frame one period earlier (sampled loops are not exact)."""

RUNAWAY_COUNTS = (("loop", "end"), ("loop", "retry"), ("budget", "end"))
"""(kind, action) of the runaways an engine counts (`Engine.stats["runaway_<kind>_<action>"]`)."""

_UNITS = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]|\w+")


@dataclass(frozen=True)
class Loop:
    """A loop found in a segment: its period, and the segment frame its first occurrence starts at."""

    period: int
    start: int

    @property
    def keep(self) -> int:
        """Segment frames kept: up to the end of the first occurrence."""
        return self.start + self.period


@dataclass(frozen=True)
class RunawayEvent:
    """One runaway of a stream: `kind` "loop" or "budget", what was done ("end" or "retry"), the
    segment and its frame where it was found, the loop's period (frames; 0 for the budget)."""

    kind: str
    action: str
    segment: int
    frame: int
    period: int = 0

    def as_dict(self) -> dict:
        return {"kind": self.kind, "action": self.action, "segment": self.segment, "frame": self.frame,
                "period": self.period}


def text_repeats(text: str, max_unit: int = 8) -> int:
    """The most times in a row the text repeats a unit of 1..`max_unit` words (a CJK character counts
    as a word): 1 for text without repeats, 4 for "ha ha ha ha"."""
    words = [w.lower() for w in _UNITS.findall(text)]
    best = 1
    for size in range(1, max_unit + 1):
        # same[i]: the unit at word i equals the one just before it; a run of `size`-spaced Trues is a repeat
        same = [words[i:i + size] == words[i - size:i] for i in range(size, len(words) - size + 1)]
        for offset in range(size):
            run = 1
            for hit in same[offset::size]:
                run = run + 1 if hit else 1
                best = max(best, run)
    return best


def find_loop(code0: np.ndarray, occurrences: int = 3) -> Loop | None:
    """The shortest period whose repeats cover the end of `code0` (module docstring), else None."""
    n = len(code0)
    for period in range(1, LOOP_MAX_PERIOD + 1):
        span = max(LOOP_MIN_FRAMES, (occurrences - 1) * period)
        if span + period > n:
            break
        now, before = code0[n - span:], code0[n - span - period:n - period]
        if np.count_nonzero(now == before) >= LOOP_SIMILARITY * span:
            start = n - span - period
            while start > 0 and code0[start - 1] == code0[start - 1 + period]:  # where the repeats began
                start -= 1
            return Loop(period, start)
    return None


@dataclass
class RunawayGuard:
    """One stream's guard: its action, retries left, what happened, and where the current segment's
    search starts (after a retry, only the frames made since count)."""

    action: str
    retries: int
    events: list[RunawayEvent] = field(default_factory=list)
    since: int = 0  # segment frames before this are not searched
    _repeats: tuple[str, int] = ("", 1)  # (text, text_repeats) of the last count

    def check(self, text: str, frames: int, code0: Callable[[int], np.ndarray]) -> Loop | None:
        """A loop at the end of the current segment (`frames` frames made; `code0(start)`: its codebook 0 from
        frame `start` on, asked for only when there is enough to judge), or None. The text's repeats are
        counted only when a loop of three occurrences is there (a live text grows)."""
        if self.action == "off" or frames - self.since < LOOP_MIN_FRAMES:
            return None
        recent = code0(self.since)
        found = find_loop(recent)
        if found is not None:
            if self._repeats[0] != text:
                self._repeats = (text, text_repeats(text))
            if self._repeats[1] > 1:
                found = find_loop(recent, self._repeats[1] + 2)
        return None if found is None else Loop(found.period, found.start + self.since)

    def next_segment(self) -> None:
        self.since = 0

    def decide(self) -> str:
        """"retry" while retries are left (one is used), else "end"."""
        if self.action == "retry" and self.retries > 0:
            self.retries -= 1
            return "retry"
        return "end"

    @property
    def retried(self) -> int:
        return sum(e.action == "retry" for e in self.events)


__all__ = ["RUNAWAY_ACTIONS", "RUNAWAY_COUNTS", "Loop", "RunawayEvent", "RunawayGuard", "find_loop", "text_repeats"]
