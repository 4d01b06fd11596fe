"""Admission: a request fitted to one stream's context, queued, and placed in a slot with its KV cells reserved
for its worst case (`Admission`, the engine's `self.admission`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from qwen3_tts_gguf.engine.active import ActiveStream
from qwen3_tts_gguf.engine.chunking import ChunkPlan
from qwen3_tts_gguf.engine.health import EngineBusy
from qwen3_tts_gguf.engine.runaway import RunawayGuard
from qwen3_tts_gguf.engine.stream import Stream
from qwen3_tts_gguf.engine.text_sources import FedText, frame_budget
from qwen3_tts_gguf.model.codec import MAX_CALL_FRAMES
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import ContextLengthExceeded
from qwen3_tts_gguf.text.segments import split_segments

HEAD_BYPASS_LIMIT = 4
"""Admissions that may pass a waiting stream too large for the free KV cells; then the engine
admits nothing else until it fits (small requests never wait behind a large one for long, and a
large one is never starved)."""
MIN_SEGMENT_CHARS = 16
"""A segment is split no further than this to make it fit the context."""


class Admission:
    """The waiting queues, the slots (one talker sequence each) and the active streams in them, and the KV
    cells each holds for its worst case. Runs on the engine's worker thread, but `enqueue`, which a caller of
    `submit` runs holding the engine's lock.

    `end_unstarted(stream, reason, error)` ends a stream that never started; `failed(stream, error)` ends one
    whose admission failed (its fault logged and counted): the engine's."""

    def __init__(self, model: LoadedModel, end_unstarted: Callable[..., None],
                 failed: Callable[[Stream, Exception], None]):
        self.model = model
        self.settings = model.settings
        self.frame_s = model.codec.samples_per_frame / model.codec.sample_rate
        self.waiting: deque[Stream] = deque()
        self.waiting_text: list[Stream] = []  # live streams without a final token (apart from the queue)
        self.active: dict[int, ActiveStream] = {}
        self.free_seqs = list(range(self.settings.max_streams))
        self.room_changed = True  # something may fit now (a stream came or went): try admitting
        self._bypassed = 0  # admissions that passed the stream at the head of the queue
        self._end_unstarted = end_unstarted
        self._failed = failed

    # -- sizes ---------------------------------------------------------------------------------------
    def budget(self, tokens: int) -> int:
        return frame_budget(self.settings.budget_base_frames, self.settings.budget_frames_per_token, tokens)

    @staticmethod
    def min_frames(tokens: int) -> int:
        """Frames a segment needs at the least to say its text (one per token, and EOS)."""
        return tokens + 2

    def too_long(self, rows: int) -> str:
        return (f"The prompt needs {rows} positions of the model's context, and one stream has "
                f"{self.model.talker.cells_per_stream}: shorten the instructions or the voice reference.")

    def fit_segments(self, text: str, fixed_rows: int) -> tuple[list[str], list[int]]:
        """Segments of `text` that each fit one stream's context with the fixed rows (instructions,
        voice); a segment that does not fit is split again. ContextLengthExceeded if none can."""
        cells = self.model.talker.cells_per_stream
        if fixed_rows + self.min_frames(1) + 1 > cells:
            raise ContextLengthExceeded(self.too_long(fixed_rows), param="instructions")
        body_ids = self.model.prompts.body_ids
        todo = split_segments(text, self.settings.max_segment_chars) or [text]
        segments: list[str] = []
        tokens: list[int] = []
        while todo:
            segment = todo.pop(0)
            n = len(body_ids(segment))  # every segment checked now (cheap)
            if fixed_rows + 1 + n + self.min_frames(n) <= cells or len(segment) <= MIN_SEGMENT_CHARS:
                if fixed_rows + 1 + n + self.min_frames(n) > cells:
                    raise ContextLengthExceeded(self.too_long(fixed_rows + 1 + n))
                segments.append(segment)
                tokens.append(n)
                continue
            half = max(MIN_SEGMENT_CHARS, len(segment) // 2)
            todo[:0] = split_segments(segment, half) or [segment[:half], segment[half:]]
        return segments, tokens

    def reservation(self, act: ActiveStream) -> int:
        cap = act.stream.request.max_frames

        def frames(tokens: int) -> int:
            return self.budget(tokens) if cap is None else min(cap, self.budget(tokens))

        return act.text.worst_cells(frames, self.model.talker.cells_per_stream)

    def cells_in_use(self) -> int:
        return sum(a.reserved for a in self.active.values())

    def free_cells(self) -> int:
        """KV cells no running stream's reservation holds."""
        return self.settings.kv_cells - self.cells_in_use()

    def shared_pool(self) -> bool:
        return self.model.talker.cells_per_stream == self.settings.kv_cells

    def make_room(self, need: int) -> bool:
        """Whether `need` more cells fit the shared pool (cached prefixes hold none: prefix_cache.py)."""
        return not self.shared_pool() or self.cells_in_use() + need <= self.settings.kv_cells

    def grow(self, act: ActiveStream) -> None:
        """Live text grows: reserve cells for what has arrived, as far as the pool has room."""
        want = self.reservation(act)
        if want > act.reserved:
            act.reserved += max(0, min(want - act.reserved, self.free_cells())
                                if self.shared_pool() else want - act.reserved)

    # -- queues and slots ----------------------------------------------------------------------------
    def enqueue(self, stream: Stream) -> None:
        """Queue a stream (the caller holds the engine's lock): a live one without a final token waits apart
        (bounded by max_pending_live) and joins the queue when its first token comes, so the queue holds at most
        max_pending + max_pending_live streams. EngineBusy when its queue is full."""
        if isinstance(stream.text, FedText) and not stream.text.ready():
            if len(self.waiting_text) >= self.settings.max_pending_live:
                raise EngineBusy(f"{len(self.waiting_text)} live streams are already waiting for text")
            self.waiting_text.append(stream)
        else:
            if len(self.waiting) >= self.settings.max_pending:
                raise EngineBusy(f"{len(self.waiting)} requests are already waiting")
            self.waiting.append(stream)
            self.room_changed = True

    def sweep(self) -> tuple[list[Stream], list[Stream]]:
        """Cancelled streams taken out of both queues, and live streams whose first token came moved into the
        queue: (cancelled, moved), each in queue order."""
        cancelled = [s for s in self.waiting if s.cancelled]
        for stream in cancelled:
            self.waiting.remove(stream)
            self.room_changed = True  # it may have been the one the others waited behind
        moved = []
        for stream in list(self.waiting_text):
            if stream.cancelled:
                self.waiting_text.remove(stream)
                cancelled.append(stream)
            elif stream.text.ready():
                self.waiting_text.remove(stream)
                self.waiting.append(stream)
                self.room_changed = True
                moved.append(stream)
        return cancelled, moved

    def take_waiting(self) -> list[Stream]:
        """Every waiting stream (the queue's, then the live ones'), both queues emptied."""
        streams = [*self.waiting, *self.waiting_text]
        self.waiting.clear()
        self.waiting_text.clear()
        return streams

    def admit(self) -> list[ActiveStream]:
        """Waiting streams placed in free slots, in order, as far as their KV reservations fit (a stream too large
        for the free cells may be passed HEAD_BYPASS_LIMIT times)."""
        self.room_changed = False
        admitted, skipped = [], deque()
        try:
            while self.waiting and self.free_seqs:
                stream = self.waiting[0]  # queued until placed: should the loop break, it fails with the rest
                if stream.cancelled or stream.text.empty():
                    self.waiting.popleft()
                    if stream.cancelled:
                        self._end_unstarted(stream, "cancelled")
                    else:
                        self._end_unstarted(stream, "error", "input text is empty")
                    continue
                try:
                    act = self._new_active(stream)
                except Exception as e:  # this stream's own state could not be set up: it alone ends
                    self.waiting.popleft()
                    self._failed(stream, e)
                    continue
                if not self.make_room(act.reserved):
                    skipped.append(self.waiting.popleft())  # waits until running streams free their cells
                    if self._bypassed >= HEAD_BYPASS_LIMIT:
                        break  # the first of them has been passed often enough: nothing else goes first
                    continue
                self._bypassed = self._bypassed + 1 if skipped else 0
                act.seq = self.free_seqs.pop(0)
                self.active[act.seq] = act
                self.waiting.popleft()
                admitted.append(act)
        finally:
            self.waiting.extendleft(reversed(skipped))
        return admitted

    def may_admit(self) -> bool:
        """Whether a waiting stream may fit a free slot now (never spin on one that cannot fit)."""
        return bool(self.waiting and self.free_seqs and self.room_changed)

    def idle(self) -> bool:
        """No stream active or waiting."""
        return not (self.active or self.waiting or self.waiting_text)

    def holds(self, act: ActiveStream) -> bool:
        """Whether `act` still has its slot."""
        return self.active.get(act.seq) is act

    def release(self, act: ActiveStream) -> None:
        """`act`'s slot is free again (if it still held it)."""
        if self.holds(act):
            self.active.pop(act.seq)
            self.free_seqs.append(act.seq)
            self.free_seqs.sort()
            self.room_changed = True

    def reset(self) -> None:
        """After a failure: every slot free, no stream active."""
        self.active.clear()
        self.free_seqs = list(range(self.settings.max_streams))
        self._bypassed = 0
        self.room_changed = True

    def _new_active(self, stream: Stream) -> ActiveStream:
        """A queued stream's engine state (its random generator, chunk plan and KV reservation), before
        it has a slot."""
        req = stream.request
        seed = req.seed if req.seed is not None else int(np.random.SeedSequence().entropy % (2**63))
        # a seeded stream's codec calls follow its grid, so that timing cannot change its audio's bits
        grid = getattr(self.model.codec, "max_call_frames", MAX_CALL_FRAMES) if req.seed is not None else 0
        guard = RunawayGuard("off" if req.ignore_eos else self.settings.runaway, self.settings.runaway_retries)
        act = ActiveStream(stream=stream, seq=-1, rng=np.random.default_rng(seed), seed=seed, guard=guard,
                           chunks=ChunkPlan(self.settings.chunk_frames, self.frame_s,
                                            adaptive=self.settings.adaptive_chunks and not self.settings.deterministic,
                                            grid=grid))
        act.reserved = self.reservation(act)
        return act
