"""Opt-in text normalization (written -> spoken: "$5" -> "five dollars") with wetext, piece by piece.

wetext (WeTextProcessing's prebuilt FSTs) always runs with operator "tn". One normalizer handles
one language: zh, en or ja (`LANGUAGES`); `pick_language` maps a request's language to one of them
(or None: not normalized); "auto" lets the first non-space character decide (Han -> zh, kana -> ja,
Hangul -> not normalized, anything else -> en). Mixed zh/en text is normalized by the one language
chosen: zh passes English words through (and reads digits in Chinese), en passes Chinese through.

`StreamingNormalizer` takes raw text in any pieces and commits normalized pieces that will not
change. What wetext's own `StreamNormalizer` does badly, measured with 0.1.8:
- its `feed()` returns committed text plus a provisional render of the rest, and the render
  raises on some partial inputs ("... on 11/"): we never render, only commit;
- its commit point for en scans the whole held-back text on every call (~1 s of CPU for 200
  characters), and en commits only at sentence ends anyway: for en we use our own points only;
  for zh/ja (a few ms per call) we use its commit point (`_safe_position`, pinned version);
- the en FSTs fail on any whitespace run other than one space ("a  b", a newline).
So a piece is committed at: wetext's commit point (zh/ja); ASCII `.?!;` followed by whitespace;
before a whitespace run other than one space (en); and, once the held-back text passes
`MAX_HELD_CHARS`, at its last space (or at the limit) in one forced call. Every piece is spoken
text plus its raw<->spoken spans from ONE `normalize_with_mapping` call, so no wetext call ever
sees more than `MAX_HELD_CHARS` characters (calls cost ~1.5 ms (en) to ~3.5 ms (zh with digits)
per character). A failure is never the stream's: a failing call during the stream holds the text
(it is tried again with more), one in the final or a forced call speaks that piece raw (logged).

Live text (`LiveNormalizer`) is normalized on one shared worker thread, never on the caller's
(the server pushes text from its event loop); each stream has at most one task queued there.
kaldifst holds the GIL inside a call, so a 200-character piece still pauses other Python threads
for up to ~50 ms. Fixed text is normalized by `normalize_text` on the submitting thread.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger("qwen3_tts_gguf.text.normalization")

LANGUAGES = ("zh", "en", "ja")
"""wetext languages we normalize (the API's capability document lists them)."""
TEXT_NORMALIZATION = ("off", "auto")
"""`SynthesisRequest.text_normalization` values."""
MAX_HELD_CHARS = 200
"""Held-back text past this is normalized in one forced call (bounds every wetext call)."""

_REQUEST_LANGUAGES = {"chinese": "zh", "zh": "zh", "english": "en", "en": "en", "japanese": "ja", "ja": "ja"}
_SENTENCE_END = re.compile(r"[.?!;](?=\s)")
_EN_SPACE_BREAK = re.compile(r"[^\S ]| {2,}")  # whitespace the en FSTs cannot take inside a piece
_WETEXT_LOCK = threading.Lock()  # wetext shares cached FSTs between calls: one call at a time


def _script_language(ch: str) -> str | None:
    cp = ord(ch)
    if 0x3040 <= cp <= 0x30FF or 0x31F0 <= cp <= 0x31FF or 0xFF66 <= cp <= 0xFF9D:
        return "ja"  # kana
    if 0x1100 <= cp <= 0x11FF or 0x3130 <= cp <= 0x318F or 0xAC00 <= cp <= 0xD7AF:
        return None  # Hangul: no Korean normalizer
    if (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0xF900 <= cp <= 0xFAFF or 0x20000 <= cp <= 0x3FFFF
            or 0x3000 <= cp <= 0x303F or 0xFF00 <= cp <= 0xFFEF):
        return "zh"  # Han, CJK punctuation, full-width forms
    return "en"


def pick_language(language: str | None, text: str = "") -> str | None:
    """The wetext language for a request language (VoiceSpec.language: "chinese", "english",
    "japanese", "auto", ...; zh/en/ja also accepted); None = not normalized. For "auto" (or None)
    the first non-space character of `text` decides; with none yet, None."""
    lang = (language or "auto").lower()
    if lang != "auto":
        return _REQUEST_LANGUAGES.get(lang)
    first = next((ch for ch in text if not ch.isspace()), None)
    return None if first is None else _script_language(first)


def normalizes(language: str | None) -> bool:
    """Whether a request in this language may be normalized at all ("auto" may)."""
    return (language or "auto").lower() == "auto" or pick_language(language) is not None


@dataclass(frozen=True)
class Span:
    """Raw text [raw_start, raw_end) is spoken as normalized text [norm_start, norm_end) (code points).
    Text outside every span is spoken as written."""

    raw_start: int
    raw_end: int
    norm_start: int
    norm_end: int


@dataclass(frozen=True)
class Piece:
    """A committed piece: raw [raw_start, raw_end) is spoken as `text`, at `norm_start` of the
    normalized text; `spans` (absolute offsets) say what was replaced."""

    raw_start: int
    raw_end: int
    norm_start: int
    text: str
    spans: tuple[Span, ...] = ()


class OffsetMap:
    """Normalized offsets -> raw offsets, growing piece by piece (thread-safe: one writer, readers).

    An offset inside a replaced span maps to the span's raw start: raw text counts as reached once
    its whole spoken form is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self._norm_starts: list[int] = []
        self.raw_len = 0
        self.norm_len = 0

    def add(self, piece: Piece) -> None:
        with self._lock:
            for span in piece.spans:
                self._spans.append(span)
                self._norm_starts.append(span.norm_start)
            self.raw_len = piece.raw_end
            self.norm_len = piece.norm_start + len(piece.text)

    @property
    def spans(self) -> tuple[Span, ...]:
        with self._lock:
            return tuple(self._spans)

    def to_raw(self, offset: int) -> int:
        with self._lock:
            i = bisect.bisect_right(self._norm_starts, offset) - 1
            if i < 0:
                return offset
            span = self._spans[i]
            if offset < span.norm_end:
                return span.raw_start
            return span.raw_end + (offset - span.norm_end)


# -- wetext, one call at a time ------------------------------------------------------------
_NORMALIZERS: dict[str, object] = {}
_STREAMERS: dict[str, object] = {}


def _wetext_normalize(language: str, text: str):
    """One `normalize_with_mapping` call (operator "tn"): a result with output_text and mappings."""
    import wetext

    with _WETEXT_LOCK:
        if language not in _NORMALIZERS:
            _NORMALIZERS[language] = wetext.Normalizer(lang=language, operator="tn")
        return _NORMALIZERS[language].normalize_with_mapping(text)


def _wetext_commit_point(language: str, text: str) -> int:
    """wetext's own commit point in `text` (everything before it will not change)."""
    import wetext

    with _WETEXT_LOCK:
        if language not in _STREAMERS:
            _STREAMERS[language] = wetext.StreamNormalizer(lang=language, operator="tn")
        return int(_STREAMERS[language]._safe_position(text))  # private in 0.1.8 (pinned)


def load_wetext() -> None:
    """Import wetext now (~0.7 s: it loads every FST), e.g. off an event loop."""
    import wetext  # noqa: F401 - loads every FST


class StreamingNormalizer:
    """Raw text in (`feed`, then `close`), committed normalized `Piece`s out; one owner thread.

    `language`: a request language (see `pick_language`); "auto" decides at the first non-space
    character; a language without a normalizer passes text through unchanged. `calls` and
    `largest_call` count what went to wetext; `forced` counts forced cuts."""

    def __init__(self, language: str | None, max_held_chars: int = MAX_HELD_CHARS,
                 normalize: Callable[[str, str], object] | None = None,
                 commit_point: Callable[[str, str], int] | None = None):
        self._request_language = language
        self._auto = (language or "auto").lower() == "auto"
        self.language = None if self._auto else pick_language(language)
        self._decided = not self._auto
        self._max = max_held_chars
        self._normalize = normalize or _wetext_normalize
        self._commit_point_of = commit_point or _wetext_commit_point
        self.map = OffsetMap()
        self._held = ""
        self._spoken = False  # something non-blank was committed (later leading whitespace is kept)
        self.closed = False
        self.calls = 0
        self.largest_call = 0
        self.forced = 0

    @property
    def normalized_chars(self) -> int:
        return self.map.norm_len

    def feed(self, delta: str) -> list[Piece]:
        """Add raw text; returns the pieces committed by it (possibly none)."""
        if self.closed:
            raise ValueError("text was already closed")
        self._held += delta
        if not self._decide():
            return []
        if self.language is None:
            return self._pass_through()
        out: list[Piece] = []
        while self._held:
            window = self._held[:self._max]
            cut, forced = self._commit_point(window), False
            if cut == 0:
                if len(self._held) <= self._max:
                    break
                cut, forced = self._forced_cut(window), True
                self.forced += 1
            piece = self._commit(cut, hold_on_error=not forced and len(self._held) <= self._max)
            if piece is None:
                break
            out.append(piece)
        return out

    def close(self) -> list[Piece]:
        """No more text: commits everything held (trailing whitespace is dropped, as wetext does)."""
        if self.closed:
            return []
        out = self.feed("")
        self.closed = True
        if self._held:
            if self.language is None:
                out += self._pass_through()
            else:
                out.append(self._commit(len(self._held), hold_on_error=False, final=True))
        return out

    # -- where to cut --------------------------------------------------------------------
    def _decide(self) -> bool:
        if not self._decided and self._held.strip():
            self.language, self._decided = pick_language(self._request_language, self._held), True
        return self._decided

    def _commit_point(self, window: str) -> int:
        best = 0
        for m in _SENTENCE_END.finditer(window):
            best = m.end()
        if self.language == "en":  # a piece must not reach over a whitespace break: cut at the first
            best = next((m.start() for m in _EN_SPACE_BREAK.finditer(window) if window[:m.start()].strip()), best)
        else:
            try:
                self._count(window)
                best = max(best, min(self._commit_point_of(self.language, window), len(window)))
            except Exception:
                log.debug("wetext found no commit point in %r", window, exc_info=True)
        while best > 0 and window[best - 1].isspace():  # whitespace stays with the text after it
            best -= 1
        return best

    def _forced_cut(self, window: str) -> int:
        for i in range(len(window) - 1, 0, -1):
            if window[i].isspace() and window[:i].strip():
                return len(window[:i].rstrip())
        return len(window)

    # -- committing ----------------------------------------------------------------------
    def _count(self, text: str) -> None:
        self.calls += 1
        self.largest_call = max(self.largest_call, len(text))

    def _pass_through(self) -> list[Piece]:
        raw, self._held = self._held, ""
        start, norm = self.map.raw_len, self.map.norm_len
        piece = Piece(start, start + len(raw), norm, raw)
        self.map.add(piece)
        return [piece]

    def _commit(self, cut: int, hold_on_error: bool, final: bool = False) -> Piece | None:
        raw = self._held[:cut]
        core = raw.strip()
        lead = raw[:len(raw) - len(raw.lstrip())] if core else raw
        r0, n0 = self.map.raw_len, self.map.norm_len
        spans: list[Span] = []
        keep_lead = self._spoken and not (final and not core)
        text = lead if keep_lead else ""
        if lead and not keep_lead:
            spans.append(Span(r0, r0 + len(lead), n0, n0))
        if core:
            r1, n1 = r0 + len(lead), n0 + len(text)
            spoken = self._normalize_core(core, r1, n1, spans, hold_on_error)
            if spoken is None:
                return None
            text += spoken
            tail = len(raw) - len(lead) - len(core)
            if tail:  # only a final piece has trailing whitespace: dropped
                spans.append(Span(r1 + len(core), r1 + len(core) + tail, n0 + len(text), n0 + len(text)))
            self._spoken = self._spoken or bool(spoken.strip())
        self._held = self._held[cut:]
        piece = Piece(r0, r0 + len(raw), n0, text, tuple(spans))
        self.map.add(piece)
        return piece

    def _normalize_core(self, core: str, r1: int, n1: int, spans: list[Span], hold_on_error: bool) -> str | None:
        """Spoken text of `core` (no outer whitespace), its spans appended; None = hold it."""
        try:
            self._count(core)
            result = self._normalize(self.language, core)
            spoken = result.output_text
            found = sorted((m.input_start, m.input_end, m.output_start, m.output_end)
                           for m in result.mappings if m.kind != "equal")
        except Exception:
            if hold_on_error:
                log.debug("normalization of %r failed; holding it for more text", core, exc_info=True)
                return None
            log.warning("normalization of %d characters failed; they are spoken as written", len(core),
                        exc_info=True)
            return core
        # text between replacements is spoken as written; where it is not (whitespace wetext
        # canonicalized), the gap becomes a span too, so `OffsetMap` stays exact
        raw_at = norm_at = 0
        for a, b, c, d in found + [(len(core), len(core), len(spoken), len(spoken))]:
            if a < raw_at or c < norm_at:
                continue  # overlapping mappings: keep the first
            if core[raw_at:a] != spoken[norm_at:c]:
                spans.append(Span(r1 + raw_at, r1 + a, n1 + norm_at, n1 + c))
            if b > a or d > c:
                spans.append(Span(r1 + a, r1 + b, n1 + c, n1 + d))
            raw_at, norm_at = b, d
        return spoken


@dataclass(frozen=True, eq=False)
class NormalizedText:
    """A whole text and what is spoken for it: `text` (== raw when not normalized) and its spans."""

    raw: str
    text: str
    map: OffsetMap | None = None  # None: not normalized (offsets are raw offsets)

    @property
    def normalized(self) -> bool:
        return self.map is not None

    def to_raw(self, offset: int) -> int:
        if offset >= len(self.text):
            return len(self.raw)
        return offset if self.map is None else self.map.to_raw(offset)

    @classmethod
    def plain(cls, raw: str) -> "NormalizedText":
        return cls(raw, raw)


def normalize_text(raw: str, language: str | None) -> NormalizedText:
    """Fixed text, normalized as live text would be when sent at once (the same pieces)."""
    normalizer = StreamingNormalizer(language)
    pieces = normalizer.feed(raw) + normalizer.close()
    if normalizer.language is None:
        return NormalizedText.plain(raw)
    return NormalizedText(raw, "".join(p.text for p in pieces), normalizer.map)


# -- live text: normalized on a worker thread ------------------------------------------------
_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:  # one thread: wetext runs one call at a time anyway (_WETEXT_LOCK)
            _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwen3-tts-normalize")
        return _EXECUTOR


class LiveNormalizer:
    """Raw deltas in from any thread (cheap: appended and handed to the worker); committed
    normalized text goes to `push`, and `close` once the last piece is out.

    The worker's queue holds at most one task per stream (a stream with a task pending or running
    adds none); the raw text not yet normalized is what the client sent (its limits bound it)."""

    def __init__(self, normalizer: StreamingNormalizer, push: Callable[[str], None], close: Callable[[], None],
                 submit: Callable[[Callable[[], None]], object] | None = None):
        self.normalizer = normalizer
        self._push, self._close = push, close
        self._submit = submit or (lambda fn: _executor().submit(fn))
        self._lock = threading.Lock()
        self._raw: list[str] = []
        self.raw_chars = 0
        self.closed = False  # close() was called
        self._scheduled = False
        self._cancelled = False
        self._broken = False
        self.done = threading.Event()
        """Set once every piece (and the close) reached `push`/`close`."""

    def push(self, delta: str) -> None:
        if not delta:
            return
        with self._lock:
            if self.closed:
                raise ValueError("text was already closed")
            self._raw.append(delta)
            self.raw_chars += len(delta)
            self._schedule()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._schedule()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            self._raw.clear()

    def _schedule(self) -> None:
        if not self._scheduled and not self._cancelled:
            self._scheduled = True
            self._submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                delta, closing = "".join(self._raw), self.closed and not self.done.is_set()
                self._raw.clear()
                if self._cancelled or (not delta and not closing):
                    self._scheduled = False
                    return
            try:
                for text in self._normalized(delta, closing):
                    self._push(text)
                if closing:
                    self._close()
            except Exception:  # (a closed or failed feed): nothing more can be spoken
                log.exception("live text could not be handed on")
                self._cancelled = True
            if closing or self._cancelled:
                self.done.set()

    def _normalized(self, delta: str, closing: bool) -> list[str]:
        if self._broken:
            return [delta]
        try:
            pieces = self.normalizer.feed(delta) if delta else []
            if closing:
                pieces += self.normalizer.close()
            return [p.text for p in pieces]
        except Exception:  # a bug (wetext's own failures are handled inside): speak the rest raw
            log.exception("live text normalization failed; the rest is spoken as written")
            self._broken = True
            return [self.normalizer._held]
