"""Split long input at sentence boundaries into segments the talker takes one at a time.

Up to `max_chars` the text is one talker sequence, as the official implementation does it; past
that it is cut after sentence-ending punctuation (Latin and CJK), packing whole sentences
greedily. A single sentence longer than `max_chars` is cut at a clause mark or space instead.
Segments keep every non-space character in order (only whitespace is dropped), so
`locate_segments` finds where each of their characters came from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SENTENCE_END = re.compile(r"(?<=[.!?。！？…])[\"'”’)\]」』]*\s*|\n+")
_CLAUSE_END = re.compile(r"(?<=[,:;，、：；])\s*|\s+")


def _pieces(text: str, pattern: re.Pattern) -> list[str]:
    out, start = [], 0
    for m in pattern.finditer(text):
        if m.end() > start:
            out.append(text[start:m.end()])
            start = m.end()
    if start < len(text):
        out.append(text[start:])
    return [p for p in out if p.strip()]


def _hard_split(sentence: str, max_chars: int) -> list[str]:
    parts: list[str] = []
    for piece in _pieces(sentence, _CLAUSE_END):
        while len(piece) > max_chars:  # no break at all (e.g. unspaced CJK): cut by length
            parts.append(piece[:max_chars])
            piece = piece[max_chars:]
        parts.append(piece)
    return parts


def split_segments(text: str, max_chars: int) -> list[str]:
    """Segments of at most max_chars characters, never blank. A text that fits is one segment exactly as
    given: the official implementation speaks its leading and trailing whitespace too (so does live
    text, whose tokens must equal the whole text's). Longer text is cut at sentence ends, and each
    segment is whitespace-trimmed."""
    if len(text) <= max_chars:
        return [text] if text.strip() else []
    text = text.strip()
    sentences: list[str] = []
    for s in _pieces(text, _SENTENCE_END):
        sentences.extend(_hard_split(s, max_chars) if len(s) > max_chars else [s])
    segments, current = [], ""
    for s in sentences:
        if current and len(current) + len(s) > max_chars:
            segments.append(current.strip())
            current = ""
        current += s
    if current.strip():
        segments.append(current.strip())
    return segments


def locate_segments(text: str, segments: list[str]) -> list[Sequence[int]]:
    """For each segment (of `split_segments(text, ...)`, possibly split again), the offset in `text`
    of each of its characters, then the offset just past its last one."""
    located: list[Sequence[int]] = []
    pos = 0
    for segment in segments:
        found = text.find(segment, pos)
        if found >= 0 and not text[pos:found].strip():  # a plain substring (the usual case)
            located.append(range(found, found + len(segment) + 1))
            pos = found + len(segment)
            continue
        offsets = []  # a whitespace-only piece was dropped inside it: follow it character by character
        for ch in segment:
            if ch.isspace():
                if pos < len(text) and text[pos].isspace():
                    pos += 1
                offsets.append(max(pos - 1, 0))
                continue
            while pos < len(text) and text[pos] != ch and text[pos].isspace():
                pos += 1
            if pos >= len(text) or text[pos] != ch:  # (not a split of `text`): search forward
                found = text.find(ch, pos)
                pos = found if found >= 0 else pos
            offsets.append(pos)
            pos += 1 if pos < len(text) else 0
        offsets.append(pos)
        located.append(offsets)
    return located
