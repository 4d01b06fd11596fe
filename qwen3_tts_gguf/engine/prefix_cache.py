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

import numpy as np

from qwen3_tts_gguf.engine.active import ActiveStream
from qwen3_tts_gguf.model.talker import DecodeItem, TalkerError

log = logging.getLogger("qwen3_tts_gguf.engine")


def prefix_key(rows: np.ndarray) -> str:
    """The prefix cache's key for a voice prefix's rows."""
    return hashlib.sha1(np.ascontiguousarray(rows).tobytes()).hexdigest()


class PrefixCache:
    """Part of `Engine` (`scheduler.py`): these methods run on its worker thread, on its state."""

    def _prefill_item(self, act: ActiveStream) -> DecodeItem:
        """The prompt rows to decode for a stream; a cached voice prefix is loaded, not recomputed."""
        rows, prefix = act.text.prefill_rows(), act.text.prefix_len()
        if not self._prefix_room or not 0 < prefix < len(rows):
            return DecodeItem(act.seq, 0, rows)
        key = prefix_key(rows[:prefix])
        cached = self._prefixes.get(key)
        if cached is not None:
            try:
                self.model.talker.load(act.seq, cached)
            except TalkerError:  # no run of free cells holds it (a fragmented cache): prefill it
                cached = None
        if cached is None:
            act.new_prefix = (key, prefix)
            return DecodeItem(act.seq, 0, rows)
        self._prefixes.move_to_end(key)
        self.stats["prefix_hits"] += 1
        return DecodeItem(act.seq, prefix, rows[prefix:])

    def _keep_prefix(self, act: ActiveStream) -> None:
        """After a prefill: save its voice prefix (the rows shared with the scratch sequence for a moment)."""
        key, rows = act.new_prefix
        act.new_prefix = None
        if key in self._prefixes:
            return
        talker = self.model.talker
        talker.copy(act.seq, self._scratch_seq, rows)
        try:
            self._remember(key, talker.save(self._scratch_seq))
        except TalkerError:
            log.warning("saving a voice prefix of %s failed", self.model.name, exc_info=True)
        finally:
            talker.drop(self._scratch_seq)

    def _remember(self, key: str, state: bytes) -> None:
        self._prefixes[key] = state  # most recently used last
        while len(self._prefixes) > self._prefix_room:
            self._prefixes.popitem(last=False)

    def _unwarmed_prefixes(self) -> dict[str, np.ndarray]:
        """Voice prefixes of live streams waiting for their first words, not cached yet: each stream's
        is tried once, and no more at a time than the cache holds (more would evict each other)."""
        if not self._prefix_room:
            return {}
        out = {}
        for stream in self._waiting_text:
            if id(stream) in self._warm_tried:
                continue
            self._warm_tried.add(id(stream))
            rows = stream.text.prefix_rows()
            key = prefix_key(rows)
            if not stream.cancelled and len(rows) and key not in self._prefixes and len(out) < self._prefix_room:
                out[key] = rows
        return out

    def _warm_prefixes(self, prefixes: dict[str, np.ndarray]) -> None:
        """Prefill each prefix in the scratch sequence and save it (its stream's words then prefill only
        themselves); never in cells the running streams' reservations hold."""
        talker = self.model.talker
        for key, rows in prefixes.items():  # (none is cached: only this thread adds to the cache)
            if self._cells_in_use() + len(rows) > self.settings.kv_cells:
                continue
            try:
                talker.decode([DecodeItem(self._scratch_seq, 0, rows)])
                self._remember(key, talker.save(self._scratch_seq))
            except Exception:  # the stream's own prefill will do it; nothing else is touched
                log.warning("prefilling a voice prefix of %s failed", self.model.name, exc_info=True)
                continue
            finally:
                talker.drop(self._scratch_seq)
            self.stats["prefixes_warmed"] += 1
