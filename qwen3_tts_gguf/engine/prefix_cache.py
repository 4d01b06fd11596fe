"""The voice-prefix cache: role, speaker and language rows kept prefilled in the KV cache for the
next stream of that voice (fast profile).
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np

from qwen3_tts_gguf.engine.active import ActiveStream
from qwen3_tts_gguf.model.talker import DecodeItem

log = logging.getLogger("qwen3_tts_gguf.engine")


def prefix_key(rows: np.ndarray) -> str:
    """The prefix cache's key for a voice prefix's rows."""
    return hashlib.sha1(np.ascontiguousarray(rows).tobytes()).hexdigest()


class PrefixCache:
    """Part of `Engine` (`scheduler.py`): these methods run on its worker thread, on its state."""

    def _prefill_item(self, act: ActiveStream) -> DecodeItem:
        """The prompt rows to decode for a stream; a cached voice prefix is copied in, not recomputed."""
        rows, prefix = act.text.prefill_rows(), act.text.prefix_len()
        if not self._prefix_seqs or not 0 < prefix < len(rows):
            return DecodeItem(act.seq, 0, rows)
        key = prefix_key(rows[:prefix])
        cached = self._prefixes.get(key)
        if cached is None:
            act.new_prefix = (key, prefix)
            return DecodeItem(act.seq, 0, rows)
        self._prefixes.move_to_end(key)
        self.model.talker.copy(cached[0], act.seq, prefix)
        self.stats["prefix_hits"] += 1
        return DecodeItem(act.seq, prefix, rows[prefix:])

    def _keep_prefix(self, act: ActiveStream) -> None:
        """After a prefill: keep its voice prefix (shared cells, no copy) for the next stream."""
        key, rows = act.new_prefix
        act.new_prefix = None
        if key in self._prefixes:
            return
        seq = self._prefix_slot(rows)
        if seq is not None:
            self.model.talker.copy(act.seq, seq, rows)
            self._prefixes[key] = (seq, rows)

    def _prefix_slot(self, rows: int) -> int | None:
        """A free prefix sequence for `rows` cells (the least recently used prefix evicted when all
        are taken); None when the pool has no room: reservations come first."""
        if len(self._prefixes) >= len(self._prefix_seqs):
            self._evict_oldest_prefix()
        if self._cells_in_use() + rows > self.settings.kv_cells:
            return None
        return next(s for s in self._prefix_seqs if s not in {v[0] for v in self._prefixes.values()})

    def _unwarmed_prefixes(self) -> dict[str, np.ndarray]:
        """Voice prefixes of live streams waiting for their first words, not cached yet: each stream's
        is tried once, and no more at a time than the cache holds (more would evict each other)."""
        if not self._prefix_seqs:
            return {}
        out = {}
        for stream in self._waiting_text:
            if id(stream) in self._warm_tried:
                continue
            self._warm_tried.add(id(stream))
            rows = stream.text.prefix_rows()
            key = prefix_key(rows)
            if not stream.cancelled and len(rows) and key not in self._prefixes and len(out) < len(self._prefix_seqs):
                out[key] = rows
        return out

    def _warm_prefixes(self, prefixes: dict[str, np.ndarray]) -> None:
        """Prefill each prefix into the prefix cache (its stream's words then prefill only themselves)."""
        for key, rows in prefixes.items():  # (none is cached: only this thread adds to the cache)
            seq = self._prefix_slot(len(rows))
            if seq is None:
                continue
            try:
                self.model.talker.decode([DecodeItem(seq, 0, rows)])
            except Exception:  # the stream's own prefill will do it; nothing else is touched
                log.warning("prefilling a voice prefix of %s failed", self.model.name, exc_info=True)
                self.model.talker.drop(seq)
                continue
            self._prefixes[key] = (seq, len(rows))
            self.stats["prefixes_warmed"] += 1
