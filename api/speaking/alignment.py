"""Character timings in ElevenLabs' `alignment` shapes, estimated from the engine's text progress.

The engine says after each chunk how far the text has probably been spoken (`TextProgress
.spoken_end_estimate`: a frames-per-token heuristic, docs/protocols.md "Text progress") and, at
the end, how far it got. Each audio piece carries the characters whose estimated speech ended
within it, spread evenly over the piece; characters the estimate had not reached when the audio
ended come last, at its end, with no duration. An estimate, not a forced alignment: enough for
what agent frameworks do with it (captions in step with the audio, the words spoken before an
interruption), not for lip sync.

    socket (per message, from the message's audio start):
        {"chars": [...], "charStartTimesMs": [...], "charDurationsMs": [...]}
    HTTP with timestamps (from the start of the response's audio; per line, or the whole text at once):
        {"characters": [...], "character_start_times_seconds": [...], "character_end_times_seconds": [...]}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimedChars:
    """Characters and their [start, end) in seconds, from the start of the utterance's audio."""

    chars: str
    starts: list[float]
    ends: list[float]
    piece_start: float
    """Where the audio piece they came with starts."""

    @classmethod
    def joined(cls, pieces: list[TimedChars]) -> TimedChars:
        """The characters of consecutive pieces as one (from the first piece's start)."""
        return cls("".join(p.chars for p in pieces), [t for p in pieces for t in p.starts],
                   [t for p in pieces for t in p.ends], pieces[0].piece_start if pieces else 0.0)

    def socket_shape(self) -> dict[str, Any] | None:
        """ElevenLabs' socket alignment (milliseconds from the piece's start; the durations add up to
        the piece's span, so a client's clock that advances by it follows the audio); None: no characters."""
        if not self.chars:
            return None
        starts = [round((s - self.piece_start) * 1000) for s in self.starts]
        ends = [round((e - self.piece_start) * 1000) for e in self.ends]
        return {"chars": list(self.chars), "charStartTimesMs": starts,
                "charDurationsMs": [e - s for s, e in zip(starts, ends)]}

    def http_shape(self) -> dict[str, Any] | None:
        """ElevenLabs' HTTP alignment (seconds from the start of the response's audio); None: no characters."""
        if not self.chars:
            return None
        return {"characters": list(self.chars), "character_start_times_seconds": [round(s, 3) for s in self.starts],
                "character_end_times_seconds": [round(e, 3) for e in self.ends]}


@dataclass
class CharTimeline:
    """One utterance's characters given out piece by piece, each once, in order.

    `text` is the raw text the engine's progress counts in (code points: as given, or every
    pushed delta joined); it may grow while the utterance speaks."""

    text: str = ""
    given: int = 0
    """Characters already timed."""
    audio_s: float = 0.0
    """Audio already timed, in seconds."""

    def piece(self, seconds: float, spoken_end: int | None) -> TimedChars:
        """The characters up to `spoken_end` not yet given, spread evenly over a piece of `seconds`
        of audio (None: no progress known with this piece, so no new characters)."""
        start = self.audio_s
        self.audio_s += seconds
        return self._take(spoken_end, start, seconds)

    def rest(self, final_end: int | None) -> TimedChars:
        """After the last piece: the characters up to `final_end` (the engine's final progress) that
        no piece carried, at the end of the audio."""
        return self._take(final_end, self.audio_s, 0.0)

    def _take(self, end: int | None, start: float, seconds: float) -> TimedChars:
        end = self.given if end is None else min(max(end, self.given), len(self.text))
        chars, self.given = self.text[self.given:end], end
        n = len(chars)
        return TimedChars(chars, [start + seconds * i / n for i in range(n)],
                          [start + seconds * (i + 1) / n for i in range(n)], start)
