"""Admission: a request checked, fitted to one stream's context, queued, and placed in a slot
with its KV cells reserved for its worst case.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from qwen3_tts_gguf.engine.active import ActiveStream
from qwen3_tts_gguf.engine.chunking import ChunkPlan
from qwen3_tts_gguf.engine.health import EngineBusy, EngineStopped
from qwen3_tts_gguf.engine.request import SynthesisRequest
from qwen3_tts_gguf.engine.runaway import RunawayGuard
from qwen3_tts_gguf.engine.stream import Stream
from qwen3_tts_gguf.engine.text_sources import FedText, frame_budget
from qwen3_tts_gguf.model.codec import MAX_CALL_FRAMES
from qwen3_tts_gguf.model.prompt import ContextLengthExceeded, PromptError
from qwen3_tts_gguf.text.segments import split_segments

HEAD_BYPASS_LIMIT = 4
"""Admissions that may pass a waiting stream too large for the free KV cells; then the engine
admits nothing else until it fits (small requests never wait behind a large one for long, and a
large one is never starved)."""
MIN_SEGMENT_CHARS = 16
"""A segment is split no further than this to make it fit the context."""


class Admission:
    """Part of `Engine` (`scheduler.py`): these methods run on its worker thread, on its state."""

    def _check_request(self, request: SynthesisRequest) -> None:
        health = self.health()
        if health.status == "dead":
            raise EngineStopped(f"the engine failed: {health.reason}", retry_after_s=None)
        if health.status == "failed":
            raise EngineStopped("the engine is restarting", retry_after_s=1)
        if health.status != "running":
            raise EngineStopped("the engine is not running")
        if request.max_frames is not None and request.max_frames < 1:
            raise PromptError(f"max_frames must be >= 1, got {request.max_frames}")
        seed = request.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise PromptError(f"seed must be a whole number of at least 0, got {seed!r}")

    def _budget(self, tokens: int) -> int:
        return frame_budget(self.settings.budget_base_frames, self.settings.budget_frames_per_token, tokens)

    @staticmethod
    def _min_frames(tokens: int) -> int:
        """Frames a segment needs at the least to say its text (one per token, and EOS)."""
        return tokens + 2

    def _too_long(self, rows: int) -> str:
        return (f"The prompt needs {rows} positions of the model's context, and one stream has "
                f"{self.model.talker.cells_per_stream}: shorten the instructions or the voice reference.")

    def _fit_segments(self, text: str, fixed_rows: int) -> tuple[list[str], list[int]]:
        """Segments of `text` that each fit one stream's context with the fixed rows (instructions,
        voice); a segment that does not fit is split again. ContextLengthExceeded if none can."""
        cells = self.model.talker.cells_per_stream
        if fixed_rows + self._min_frames(1) + 1 > cells:
            raise ContextLengthExceeded(self._too_long(fixed_rows), param="instructions")
        body_ids = self.model.prompts.body_ids
        todo = split_segments(text, self.settings.max_segment_chars) or [text]
        segments: list[str] = []
        tokens: list[int] = []
        while todo:
            segment = todo.pop(0)
            n = len(body_ids(segment))  # every segment checked now (cheap)
            if fixed_rows + 1 + n + self._min_frames(n) <= cells or len(segment) <= MIN_SEGMENT_CHARS:
                if fixed_rows + 1 + n + self._min_frames(n) > cells:
                    raise ContextLengthExceeded(self._too_long(fixed_rows + 1 + n))
                segments.append(segment)
                tokens.append(n)
                continue
            half = max(MIN_SEGMENT_CHARS, len(segment) // 2)
            todo[:0] = split_segments(segment, half) or [segment[:half], segment[half:]]
        return segments, tokens

    def _reservation(self, act: ActiveStream) -> int:
        cap = act.stream.request.max_frames

        def frames(tokens: int) -> int:
            return self._budget(tokens) if cap is None else min(cap, self._budget(tokens))

        return act.text.worst_cells(frames, self.model.talker.cells_per_stream)

    def _cells_in_use(self) -> int:
        return sum(a.reserved for a in self._active.values())

    def _shared_pool(self) -> bool:
        return self.model.talker.cells_per_stream == self.settings.kv_cells

    def _make_room(self, need: int) -> bool:
        """Whether `need` more cells fit the shared pool (cached prefixes hold none: prefix_cache.py)."""
        return not self._shared_pool() or self._cells_in_use() + need <= self.settings.kv_cells

    def _enqueue(self, stream: Stream) -> Stream:
        """Queue a stream: a live one without a final token waits apart (bounded by max_pending_live)
        and joins the queue when its first token comes, so the queue holds at most max_pending +
        max_pending_live streams."""
        with self._wake:
            if isinstance(stream.text, FedText) and not stream.text.ready():
                if len(self._waiting_text) >= self.settings.max_pending_live:
                    raise EngineBusy(f"{len(self._waiting_text)} live streams are already waiting for text")
                self._waiting_text.append(stream)
            else:
                if len(self._waiting) >= self.settings.max_pending:
                    raise EngineBusy(f"{len(self._waiting)} requests are already waiting")
                self._waiting.append(stream)
                self._room_changed = True
            self._wake.notify_all()
        return stream

    def _admit(self) -> list[ActiveStream]:
        self._room_changed = False
        admitted, skipped = [], deque()
        try:
            while self._waiting and self._free_seqs:
                stream = self._waiting[0]  # queued until placed: should the loop break, it fails with the rest
                if stream.cancelled or stream.text.empty():
                    self._waiting.popleft()
                    if stream.cancelled:
                        self._end_unstarted(stream, "cancelled")
                    else:
                        self._end_unstarted(stream, "error", "input text is empty")
                    continue
                try:
                    act = self._new_active(stream)
                except Exception as e:  # this stream's own state could not be set up: it alone ends
                    self._waiting.popleft()
                    self._fault("admission", e)
                    self._count_error()
                    self._end_unstarted(stream, "error", "the admission failed for this stream")
                    continue
                if not self._make_room(act.reserved):
                    skipped.append(self._waiting.popleft())  # waits until running streams free their cells
                    if self._bypassed >= HEAD_BYPASS_LIMIT:
                        break  # the first of them has been passed often enough: nothing else goes first
                    continue
                self._bypassed = self._bypassed + 1 if skipped else 0
                act.seq = self._free_seqs.pop(0)
                self._active[act.seq] = act
                self._waiting.popleft()
                admitted.append(act)
        finally:
            self._waiting.extendleft(reversed(skipped))
        return admitted

    def _new_active(self, stream: Stream) -> ActiveStream:
        """A queued stream's engine state (its random generator, chunk plan and KV reservation), before
        it has a slot."""
        req = stream.request
        seed = req.seed if req.seed is not None else int(np.random.SeedSequence().entropy % (2**63))
        # a seeded stream's codec calls follow its grid, so that timing cannot change its audio's bits
        grid = getattr(self.model.codec, "max_call_frames", MAX_CALL_FRAMES) if req.seed is not None else 0
        guard = RunawayGuard("off" if req.ignore_eos else self.settings.runaway, self.settings.runaway_retries)
        act = ActiveStream(stream=stream, seq=-1, rng=np.random.default_rng(seed), seed=seed, guard=guard,
                      chunks=ChunkPlan(self.settings.chunk_frames, self._frame_s,
                                       adaptive=self.settings.adaptive_chunks and not self.settings.deterministic,
                                       grid=grid))
        act.reserved = self._reservation(act)
        return act
