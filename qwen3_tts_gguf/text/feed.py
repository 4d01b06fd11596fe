"""Text that arrives piece by piece (e.g. tokens from an LLM), committed only where it is stable.

Text reaches the model only in pieces whose tokenization cannot change when more text arrives:
BPE never merges across pre-tokenizer pieces, and growing the text only ever changes its last
piece, so every piece but the last is final; each push only looks at the text after the last
committed piece, so a long stream costs linear time. The open tail is held back further when it looks
like an unfinished number, date or URL (digits or / : . @ - since the last space), so e.g.
"2026-11-" is not spoken until it closes. `close()` commits everything. Given `encode_with_ends`,
the feed also knows where in its text each committed token ends (`char_end`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_URLISH = set("/:.@-_")


class TextFeed:
    """Thread-safe text buffer whose committed token ids only ever grow."""

    def __init__(self, encode: Callable[[str], list[int]], pre_tokenize: Callable[[str], list[tuple[str, tuple]]],
                 on_change: Callable[[], None] | None = None,
                 encode_with_ends: Callable[[str], tuple[list[int], list[int]]] | None = None):
        self._encode = encode
        self._encode_with_ends = encode_with_ends
        self._ends: list[int] = []
        self._pre_tokenize = pre_tokenize
        self._on_change = on_change
        self._lock = threading.Lock()
        self._buffer = ""
        self._committed_chars = 0
        self._ids: list[int] = []
        self.closed = False

    def push(self, delta: str) -> None:
        """Append text; commits what has become stable."""
        if not delta:
            return
        with self._lock:
            if self.closed:
                raise ValueError("text was already closed")
            self._buffer += delta
            self._commit(final=False)
        self._notify()

    def close(self) -> None:
        """No more text: commit the tail."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._commit(final=True)
        self._notify()

    def snapshot(self) -> tuple[list[int], bool]:
        """(committed token ids, closed) at this moment."""
        with self._lock:
            return list(self._ids), self.closed

    @property
    def text(self) -> str:
        with self._lock:
            return self._buffer

    @property
    def committed_tokens(self) -> int:
        with self._lock:
            return len(self._ids)

    def char_end(self, tokens: int) -> int:
        """End (code points of `text`) of the text read with the first `tokens` committed tokens
        (needs `encode_with_ends`)."""
        with self._lock:
            tokens = min(tokens, len(self._ends))
            return self._ends[tokens - 1] if tokens > 0 else 0

    def _stable_end(self) -> int:
        # pieces before the committed point are final, so only the open part is pre-tokenized again
        # (a regex match from a piece boundary is the same in the suffix as in the whole text)
        start = self._committed_chars
        pieces = self._pre_tokenize(self._buffer[start:])
        final = [start + p[1][1] for p in pieces[:-1]]  # every piece but the last is final
        last_space = max(self._buffer.rfind(" "), self._buffer.rfind("\n"), self._buffer.rfind("\t"))
        tail = self._buffer[last_space + 1:]
        if any(ch.isdigit() or ch in _URLISH for ch in tail):
            # an open number/date/URL waits for its end; the space before it joins its first piece
            final = [end for end in final if end <= last_space]
        return final[-1] if final else start

    def _commit(self, final: bool) -> None:
        end = len(self._buffer) if final else self._stable_end()
        if end <= self._committed_chars:
            return
        # BPE never crosses a piece boundary: the new pieces' tokens simply follow the old ones
        start = self._committed_chars
        if self._encode_with_ends is None:
            self._ids = self._ids + self._encode(self._buffer[start:end])
        else:
            ids, ends = self._encode_with_ends(self._buffer[start:end])
            self._ids = self._ids + ids
            self._ends.extend(start + e for e in ends)
        self._committed_chars = end

    def _notify(self) -> None:
        if self._on_change is not None:
            self._on_change()
