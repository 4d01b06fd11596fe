"""Split long input at sentence boundaries into segments the talker takes one at a time.

Up to `max_chars` the text is one talker sequence, as the official implementation does it; past
that it is cut after sentence-ending punctuation (Latin and CJK), packing whole sentences
greedily. A single sentence longer than `max_chars` is cut at a clause mark or space instead.
"""

from __future__ import annotations

import re

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
    """Segments of at most max_chars characters (whitespace-trimmed, never empty)."""
    text = text.strip()
    if len(text) <= max_chars:
        return [text] if text else []
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
