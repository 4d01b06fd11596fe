"""The voice-prefix cache: role, speaker and language rows kept prefilled for the next stream of that
voice (fast profile).

A cached prefix is a saved copy of its KV rows (`Talker.save`), not cells kept in the KV cache: a hit
loads them into the stream's own sequence, in the lowest free cells, and its text rows follow them, as a
prefill of the whole prompt would place them. llama.cpp's flash attention sums a row's cells in the order
they lie in the cache, so a prefix kept in cells of its own, above cells freed after it was cached, gave
the next stream of that voice its text rows below its prefix and other numbers than a fresh prefill
(0.6B, q8_0 cache: other codes from the first frame). Cached this way, a stream that runs alone always
starts on an empty cache and its rows lie in position order, whatever ran before. A state is about 60 KiB
per row at 0.6B (q8_0), some 0.7 MiB per prefix, saved in under a millisecond and loaded in a quarter.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from qwen3_tts_gguf.engine.active import ActiveStream
from qwen3_tts_gguf.engine.stream import Stream
from qwen3_tts_gguf.model.talker import DecodeItem, Talker, TalkerError

log = logging.getLogger("qwen3_tts_gguf.engine")


def prefix_key(rows: np.ndarray) -> str:
    """The prefix cache's key for a voice prefix's rows."""
    return hashlib.sha1(np.ascontiguousarray(rows).tobytes()).hexdigest()


class PrefixCache:
    """Voice prefixes kept as saved KV rows, least recently used first, at most `room` of them (0: off).

    Runs on the engine's worker thread, but `clear`, which any thread may ask for: the worker forgets the
    prefixes before its next admission (`forget_if_asked`). `counts` is the engine's stats dict, where the
    cache counts its hits and the prefixes it warmed."""

    def __init__(self, talker: Talker, room: int, scratch_seq: int, counts: dict[str, int], name: str = ""):
        self.talker = talker
        self.name = name  # the model's, for the log
        self.room = room
        self.scratch_seq = scratch_seq
        """The sequence prefixes are prefilled in and saved from (none of a stream's)."""
        self.entries: OrderedDict[str, bytes] = OrderedDict()
        self._counts = counts
        self._forget = False
        self._tried: set[int] = set()  # ids of live streams waiting for text whose prefix was tried

    # -- any thread ----------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget every prefix before the next admission (the caller wakes the worker)."""
        self._forget = True

    # -- the worker thread ----------------------------------------------------------------------
    def forget_if_asked(self) -> None:
        if self._forget:
            self.entries.clear()
            self._forget = False

    def reset(self) -> None:
        """After a failure: no prefix kept."""
        self.entries.clear()

    def streams_gone(self) -> None:
        """Every waiting live stream ended (the worker stops or died)."""
        self._tried.clear()

    def untried(self, waiting_text: list[Stream]) -> bool:
        """Whether a live stream waiting for its first words has a prefix not tried yet."""
        return bool(self.room) and any(id(s) not in self._tried for s in waiting_text)

    def stream_left(self, stream: Stream) -> None:
        """A live stream left the wait for its first words (it started, or was cancelled)."""
        self._tried.discard(id(stream))

    def prefill_item(self, act: ActiveStream) -> DecodeItem:
        """The prompt rows to decode for a stream; a cached voice prefix is loaded, not recomputed."""
        rows, prefix = act.text.prefill_rows(), act.text.prefix_len()
        if not self.room or not 0 < prefix < len(rows):
            return DecodeItem(act.seq, 0, rows)
        key = prefix_key(rows[:prefix])
        cached = self.entries.get(key)
        if cached is not None:
            try:
                self.talker.load(act.seq, cached)
            except TalkerError:  # no run of free cells holds it (a fragmented cache): prefill it
                cached = None
        if cached is None:
            act.new_prefix = (key, prefix)
            return DecodeItem(act.seq, 0, rows)
        self.entries.move_to_end(key)
        self._counts["prefix_hits"] += 1
        return DecodeItem(act.seq, prefix, rows[prefix:])

    def keep(self, act: ActiveStream) -> None:
        """After a prefill: save its voice prefix (the rows shared with the scratch sequence for a moment)."""
        key, rows = act.new_prefix
        act.new_prefix = None
        if key in self.entries:
            return
        talker = self.talker
        talker.copy(act.seq, self.scratch_seq, rows)
        try:
            self._remember(key, talker.save(self.scratch_seq))
        except TalkerError:
            log.warning("saving a voice prefix of %s failed", self.name, exc_info=True)
        finally:
            talker.drop(self.scratch_seq)

    def _remember(self, key: str, state: bytes) -> None:
        self.entries[key] = state  # most recently used last
        while len(self.entries) > self.room:
            self.entries.popitem(last=False)

    def unwarmed(self, waiting_text: list[Stream]) -> dict[str, np.ndarray]:
        """Voice prefixes of live streams waiting for their first words, not cached yet: each stream's
        is tried once, and no more at a time than the cache holds (more would evict each other)."""
        if not self.room:
            return {}
        out = {}
        for stream in waiting_text:
            if id(stream) in self._tried:
                continue
            self._tried.add(id(stream))
            rows = stream.text.prefix_rows()
            key = prefix_key(rows)
            if not stream.cancelled and len(rows) and key not in self.entries and len(out) < self.room:
                out[key] = rows
        return out

    def warm(self, prefixes: dict[str, np.ndarray], free_cells: Callable[[], int]) -> None:
        """Prefill each prefix in the scratch sequence and save it (its stream's words then prefill only
        themselves); never in cells the running streams' reservations hold (`free_cells`)."""
        talker = self.talker
        for key, rows in prefixes.items():  # (none is cached: only this thread adds to the cache)
            if len(rows) > free_cells():
                continue
            try:
                talker.decode([DecodeItem(self.scratch_seq, 0, rows)])
                self._remember(key, talker.save(self.scratch_seq))
            except Exception:  # the stream's own prefill will do it; nothing else is touched
                log.warning("prefilling a voice prefix of %s failed", self.name, exc_info=True)
                continue
            finally:
                talker.drop(self.scratch_seq)
            self._counts["prefixes_warmed"] += 1
