"""Word and character timings of one response, and subtitles made of them: one estimate for every route
that times its text (SSE word events, `POST /dev/captioned_speech`, ElevenLabs' with-timestamps routes,
text to dialogue; docs/protocols.md "Word timings and subtitles").

`Timings` feeds the characters' timeline (`alignment.CharTimeline`: the engine's `spoken_end_estimate`
after each step, its characters spread evenly over the step's audio, what the estimate had not reached
at the end given last with no duration) and reads words off it: a word's start is its first
character's, its end its last one's, and it is complete once its last character is timed. Offsets are
code points of the text the client sent (the engine's progress maps normalized text back to it), so
a normalized "25" is one word, timed by the spoken "twenty-five". Each word carries the `basis` of
the progress that completed it: "frames_per_token" (the heuristic) or "final" (the engine's values
at the end). An estimate, not a forced alignment: enough for captions and highlighting, not for lip sync.

A word is a run of characters other than white space, with one exception: each Chinese or Japanese
character is a word of its own (with the punctuation after it), as those scripts write no spaces.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any, Literal

from qwen3_tts_gguf import TextProgress

from api.speaking.alignment import CharTimeline, TimedChars

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
"""Hiragana, katakana and the CJK ideographs: scripts written without spaces between words."""
WORD = re.compile(rf"[{_CJK}][^\s\w]*|[^\s{_CJK}]+")
SENTENCE_END = re.compile(r"[.!?\u2026\u3002\uff01\uff1f][\"'\u201d\u2019)\]\u300d\u300f]*$")
"""A word that ends a sentence (. ! ? … 。 ！ ？, a closing quote or bracket after it): it ends a cue."""
MAX_CUE_CHARS = 42
"""Characters of text one subtitle cue shows at most (unless one word is longer): the common line length."""

SubtitleFormat = Literal["vtt", "srt"]
SUBTITLE_TYPES: dict[str, str] = {"vtt": "text/vtt", "srt": "application/x-subrip"}


def word_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of each word of `text` (module docstring)."""
    return [m.span() for m in WORD.finditer(text)]


@dataclass(frozen=True)
class TimedWord:
    """One word and its estimated [start, end) in seconds of the response's audio (as played)."""

    word: str
    start_s: float
    end_s: float
    text_start: int
    """Code points into the text the client sent: `text[text_start:text_end] == word`."""
    text_end: int
    basis: str

    def fields(self) -> dict[str, Any]:
        """The SSE `speech.word` event's fields."""
        return {"word": self.word, "start_s": round(self.start_s, 3), "end_s": round(self.end_s, 3),
                "text_start": self.text_start, "text_end": self.text_end, "basis": self.basis}

    def kokoro(self) -> dict[str, Any]:
        """Kokoro-FastAPI's `WordTimestamp`."""
        return {"word": self.word, "start_time": round(self.start_s, 3), "end_time": round(self.end_s, 3)}


def spoken_end(progress: TextProgress | None) -> int | None:
    return None if progress is None else progress.spoken_end_estimate


class Timings:
    """The timings of one text, fed step by step (`piece`, then `rest`); characters are returned by each
    call, words collected until `new_words` takes them."""

    def __init__(self, text: str):
        self.chars = CharTimeline(text)
        self.words: list[TimedWord] = []
        """Every word completed so far, in order."""
        self._spans = word_spans(text)
        self._next = 0  # the first word not yet complete
        self._taken = 0  # words already returned by `new_words`
        self._chars_taken = 0  # characters already returned by `new_chars`
        self._starts: list[float] = []  # each timed character's start, end and basis
        self._ends: list[float] = []
        self._bases: list[str] = []

    @property
    def text(self) -> str:
        return self.chars.text

    def piece(self, seconds: float, progress: TextProgress | None) -> TimedChars:
        """A step of `seconds` of audio, made as of `progress` (None: no new characters)."""
        return self._note(self.chars.piece(seconds, spoken_end(progress)),
                          progress.basis if progress is not None else "frames_per_token")

    def rest(self, progress: TextProgress | None) -> TimedChars:
        """After the last step: the characters up to the final progress that no step carried."""
        return self._note(self.chars.rest(spoken_end(progress)), "final")

    def up_to(self, end: int) -> TimedChars:
        """Every character before `end` not yet timed, now, with no duration (a dialogue line's end)."""
        return self._note(self.chars.rest(end), "final")

    def new_chars(self) -> TimedChars:
        """The characters timed since the last call (for a reader of what `piece` and `rest` were fed elsewhere)."""
        start, end = self._chars_taken, self.chars.given
        self._chars_taken = end
        return TimedChars(self.text[start:end], self._starts[start:end], self._ends[start:end],
                          self._starts[start] if end > start else self.chars.audio_s)

    def new_words(self) -> list[TimedWord]:
        """The words completed since the last call."""
        taken, self._taken = self.words[self._taken:], len(self.words)
        return taken

    def subtitles(self, kind: SubtitleFormat) -> str:
        """Every word completed so far as a WebVTT or SubRip file (`subtitles`)."""
        return subtitles(self.words, self.text, kind)

    def _note(self, timed: TimedChars, basis: str) -> TimedChars:
        self._starts += timed.starts
        self._ends += timed.ends
        self._bases += [basis] * len(timed.chars)
        given = self.chars.given
        while self._next < len(self._spans) and self._spans[self._next][1] <= given:
            start, end = self._spans[self._next]
            self.words.append(TimedWord(self.text[start:end], self._starts[start], self._ends[end - 1], start, end,
                                        self._bases[end - 1]))
            self._next += 1
        return timed


@dataclass
class _Cue:
    start_s: float
    end_s: float
    text: str


def subtitles(words: list[TimedWord], text: str, kind: SubtitleFormat) -> str:
    """`words` (of `text`) as WebVTT (`vtt`) or SubRip (`srt`): cues of at most `MAX_CUE_CHARS` characters,
    a sentence's end or a line break ending a cue, each cue the text as sent (white space as one space).
    Words the estimate never reached (timed at the audio's end, with no duration) join the cue before."""
    cues: list[_Cue] = []
    group: list[TimedWord] = []

    def flush() -> None:
        if not group:
            return
        cue = _Cue(group[0].start_s, group[-1].end_s, " ".join(text[group[0].text_start:group[-1].text_end].split()))
        if cue.end_s <= cue.start_s and cues:
            cues[-1].text += " " + cue.text
            cues[-1].end_s = max(cues[-1].end_s, cue.end_s)
        else:
            cues.append(cue)
        group.clear()

    for word in words:
        if group and (word.text_end - group[0].text_start > MAX_CUE_CHARS
                      or "\n" in text[group[-1].text_end:word.text_start]):
            flush()
        group.append(word)
        if SENTENCE_END.search(word.word):
            flush()
    flush()
    if kind == "vtt":
        # WebVTT's cue text escapes `&`, `<` and `>` as HTML does (so no "-->" either)
        blocks = [f"{_time(c.start_s, '.')} --> {_time(c.end_s, '.')}\n{html.escape(c.text, quote=False)}"
                  for c in cues]
        return "\n\n".join(["WEBVTT", *blocks]) + "\n"
    return "".join(f"{i}\n{_time(c.start_s, ',')} --> {_time(c.end_s, ',')}\n{c.text.translate(_SRT_TEXT)}\n\n"
                   for i, c in enumerate(cues, 1))


def _time(seconds: float, decimal: str) -> str:
    ms = round(max(seconds, 0.0) * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{decimal}{ms % 1000:03d}"


_SRT_TEXT = str.maketrans("<>{}", "\uff1c\uff1e\uff5b\uff5d")
"""SubRip has no escapes, and its players read `<...>` as tags and `{...}` as overrides: those characters are
shown as their fullwidth forms (so no "-->" either)."""
