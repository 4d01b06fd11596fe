"""The engine worker: one thread owns llama.cpp and ONNX Runtime and steps every stream together.

Each iteration (continuous batching; one stream is the special case):
  1. drop cancelled streams; admit waiting requests into free slots (their prompt rows join step 5);
  2. sample codebook 0 of every stream that can step; EOS or a limit ends a stream (or its segment);
  3. one batched code-predictor call for all of them -> codebooks 1..15 + the next input rows;
  4. each stream's codec state decodes its pending frames once a chunk is due (`chunking.py`: the
     1, 2, 4, 8, 8, ... ramp, or sooner when a player would run dry), before the talker step, so a
     chunk's latency does not include it. In the fast profile on two or more threads the codec runs
     on threads of its own (`LoadedModel.codec_overlap`) while the talker and code predictor make
     the next frames: one call in flight per stream, in order, each stream on one lane (a thread)
     and several streams' calls side by side in the lanes (`cpus.stage_threads`); frames due
     meanwhile join the next call; a stream's result follows its last chunk through its lane;
  5. one multi-sequence talker decode: new prompts and every stream's next row.
A stream steps only when it can: a live-text stream whose next text row has not arrived, or one
whose reader is more than `max_buffered_audio_s` behind, keeps its state and waits.

Faults stay in their stream: whatever fails while building, sampling, predicting or decoding one
stream ends that stream alone (finish_reason "error"); a failed batched call (code predictor,
talker decode) is retried stream by stream, with each stream's random state and KV cells rewound,
so the others produce exactly what they would have. An exception that escapes an iteration (a bug)
fails the streams it touched and resets the engine's state; if the worker thread dies, `health()`
says so, waiting requests are failed, and `restart()` starts a new worker (`api/registry.py`
supervises). KV cells are reserved per stream for its worst case before it starts; a prompt that
cannot fit one stream's context is refused at submit (`ContextLengthExceeded`).
Voice prefixes (role, speaker, language rows) stay in the KV cache for later streams of the same
voice (fast profile); a live stream still waiting for its first words has its voice prefix prefilled
meanwhile, so its words only prefill themselves.
The engine knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from . import heap
from .chunking import ChunkPlan
from .codec import CodecState
from .model import LoadedModel
from .prompt import ContextLengthExceeded, Prompt, PromptError
from .request import AudioChunk, SynthesisRequest, SynthesisResult
from .sampler import sample_code0
from .stream import Stream
from .talker import DecodeItem, Talker
from .text_normalization import NormalizedText, normalize_text
from .text_segments import split_segments
from .text_sources import FedText, FixedText, frame_budget

log = logging.getLogger("qwen3_tts_gguf.engine")

HEAD_BYPASS_LIMIT = 4
"""Admissions that may pass a waiting stream too large for the free KV cells; then the engine
admits nothing else until it fits (small requests never wait behind a large one for long, and a
large one is never starved)."""
IDLE_TRIM_S = 2.0
"""Seconds without streams after which the engine gives the heap they freed back (`heap.release_freed_heap`)."""
MAX_PENDING_FRAMES = 16
"""A stream with this many frames waiting for the codec (its call in a codec lane still running)
makes no more until they are decoded: one codec call never grows past it."""
MIN_SEGMENT_CHARS = 16
"""A segment is split no further than this to make it fit the context."""


def _prefix_key(rows: np.ndarray) -> str:
    """The prefix cache's key for a voice prefix's rows."""
    return hashlib.sha1(np.ascontiguousarray(rows).tobytes()).hexdigest()


class EngineBusy(RuntimeError):
    """Too many requests are waiting for a slot."""


class EngineStopped(RuntimeError):
    """The engine is not running. `retry_after_s`: when a retry may succeed (None: it will not)."""

    def __init__(self, message: str = "the engine is not running", retry_after_s: int | None = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class EngineHealth:
    """What the supervisor and `/ready` need: is the worker serving, and if not, why."""

    status: str  # "running" | "stopped" | "failed" (worker died: restart it) | "dead" (gave up)
    reason: str | None = None
    restarts: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "running"


class _StreamFault(Exception):
    """One stream's work failed: end that stream alone (`stage` names what failed, for its client)."""

    def __init__(self, stage: str):
        super().__init__(stage)
        self.stage = stage


@dataclass(eq=False)
class _Active:
    """Engine-side state of one admitted stream."""

    stream: Stream
    seq: int
    rng: np.random.Generator
    segment_frames: int = 0
    pos: int = 0  # next talker position
    reserved: int = 0  # KV cells held for this stream's worst case
    logits: np.ndarray | None = None
    hidden: np.ndarray | None = None
    history: set = field(default_factory=set)  # codebook-0 ids of the current segment
    codes: list = field(default_factory=list)
    pending: list = field(default_factory=list)  # frames not yet decoded to audio
    chunks: ChunkPlan | None = None
    decoded_frames: int = 0
    codec_state: CodecState | None = None
    codec_busy: bool = False  # a codec call of this stream is queued or running in its codec lane
    codec_lane: int | None = None  # the codec lane that decodes this stream (overlapped), once it has one
    codec_fault: BaseException | None = None  # that call failed: the engine ends the stream
    new_prefix: tuple[str, int] | None = None  # (key, rows) to cache after this stream's prefill
    timings: dict = field(default_factory=lambda: {"talker_s": 0.0, "predictor_s": 0.0, "codec_s": 0.0})

    @property
    def text(self) -> FixedText | FedText:
        return self.stream.text


class Engine:
    """Owns a LoadedModel on a worker thread; `submit` requests, iterate their streams."""

    def __init__(self, model: LoadedModel):
        self.model = model
        self.settings = model.settings
        self._waiting: deque[Stream] = deque()
        self._waiting_text: list[Stream] = []  # live streams without a final token (apart from the queue)
        self._active: dict[int, _Active] = {}
        self._free_seqs = list(range(self.settings.max_streams))
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._failure: str | None = None
        self._dead: str | None = None
        self._restarts = 0
        self._bypassed = 0  # admissions that passed the stream at the head of the queue
        self._room_changed = True  # something may fit now (a stream came or went): try admitting
        self.heartbeat = time.monotonic()
        """Updated by the worker at least every 0.25 s while it is not inside one model call."""
        self.stats = {"iterations": 0, "frames": 0, "streams_done": 0, "cancelled": 0, "errors": 0,
                      "prefix_hits": 0, "prefixes_warmed": 0, "paused": 0}
        self._primed: dict[str, CodecState] = {}
        # voice prefixes kept in the KV cache: key -> (sequence, rows), least recently used first
        self._prefixes: OrderedDict[str, tuple[int, int]] = OrderedDict()
        first = self.settings.max_streams
        self._prefix_seqs = list(range(first, first + Talker.prefix_slots(model.talker.settings)))
        self._forget_prefixes = False
        self._warm_tried: set[int] = set()  # ids of live streams waiting for text whose prefix was tried
        self._prompt_pool: ThreadPoolExecutor | None = None  # later segments' prompts, built off both threads
        self._codec_lanes: list[ThreadPoolExecutor] = []  # the overlapped codec: one thread each, jobs in order
        self._stats_lock = threading.Lock()  # the codec lanes count errors too
        self._primed_lock = threading.Lock()
        self._heap_used = False  # streams ran since the heap was last given back (_give_back_heap_when_idle)
        self._lanes_drained: list[Future] | None = None  # the codec lanes' jobs queued before going idle
        self._idle_since: float | None = None  # when those were done
        self.clock = time.monotonic
        """The chunk plans' clock (a test may drive it)."""
        self._frame_s = model.codec.samples_per_frame / model.codec.sample_rate

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "Engine":
        if self._thread is None:
            self._stopping = False
            self._failure = None
            self._prompt_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwen3-tts-prompts")
            if self.model.codec_overlap and not self._codec_lanes:
                self._codec_lanes = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"qwen3-tts-codec-{i}")
                                     for i in range(self.model.stage_threads.codec_lanes)]
            self._thread = threading.Thread(target=self._worker, name="qwen3-tts-engine", daemon=True)
            self.heartbeat = time.monotonic()
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=None if self._dead is None else 5)  # a stuck worker is left behind
            self._thread = None
        if self._prompt_pool is not None:
            self._prompt_pool.shutdown(wait=False, cancel_futures=True)
            self._prompt_pool = None
        for lane in self._codec_lanes:  # the streams' last chunks and results are in them: deliver them
            lane.shutdown(wait=self._dead is None)  # (unless a call there is stuck)
        self._codec_lanes = []

    def restart(self) -> None:
        """Start a new worker after the old one died (its streams were failed when it died)."""
        with self._wake:
            if self._dead is not None:
                raise EngineStopped(self._dead, retry_after_s=None)
            old, self._thread = self._thread, None
        if old is not None:
            old.join(timeout=5)
            if old.is_alive():
                self.give_up("the engine worker is stuck and cannot be restarted")
                raise EngineStopped(self._dead, retry_after_s=None)
        if self._prompt_pool is not None:
            self._prompt_pool.shutdown(wait=False, cancel_futures=True)
            self._prompt_pool = None
        self._reset_state()
        self._restarts += 1
        log.warning("restarting the engine of %s (restart %d)", self.model.name, self._restarts)
        self.start()

    def give_up(self, reason: str) -> None:
        """Mark the engine as beyond repair: requests get 503 without Retry-After; health says dead."""
        with self._wake:
            self._dead = reason
            self._stopping = True
            self._wake.notify_all()
        log.error("engine of %s gave up: %s", self.model.name, reason)

    def health(self) -> EngineHealth:
        """running, stopped, failed (the worker died; restartable) or dead."""
        if self._dead is not None:
            return EngineHealth("dead", self._dead, self._restarts)
        if self._failure is not None or (self._thread is not None and not self._thread.is_alive()):
            return EngineHealth("failed", self._failure or "the engine worker stopped", self._restarts)
        if self._thread is None or self._stopping:
            return EngineHealth("stopped", "the engine is not running", self._restarts)
        return EngineHealth("running", None, self._restarts)

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- requests -----------------------------------------------------------------------
    def submit(self, request: SynthesisRequest, loop: asyncio.AbstractEventLoop | None = None) -> Stream:
        """Validate and queue a request. Raises PromptError for bad input (ContextLengthExceeded
        when it cannot fit one stream's context), EngineBusy when full, EngineStopped."""
        self._check_request(request)
        text_mode = request.text_mode or self.model.manifest.default_text_mode
        builder = self.model.prompts
        fixed = builder.fixed_rows(request.voice)  # also validates the voice
        spoken = (normalize_text(request.text, request.voice.language) if request.text_normalization == "auto"
                  else NormalizedText.plain(request.text))
        segments, tokens = self._fit_segments(spoken.text, fixed)

        def build(text: str) -> Prompt:
            return builder.build(text, request.voice, text_mode)

        text = FixedText(segments, tokens, [fixed + 1 + n for n in tokens], build,
                         lambda t: self._prompt_pool.submit(build, t), spoken, text_mode == "streaming")
        return self._enqueue(self._new_stream(request, text, loop))

    def open_text_stream(self, request: SynthesisRequest, loop: asyncio.AbstractEventLoop | None = None) -> Stream:
        """A streaming-text-mode stream whose text arrives later through `push_text`/`close_text`.

        `request.text` is ignored. Synthesis starts as soon as the first token is final.
        """
        self._check_request(request)
        text = FedText(self.model.prompts, request.voice, on_change=self._notify,
                       normalize=request.text_normalization == "auto")
        if text.prefill_len() + self._min_frames(1) > self.model.talker.cells_per_stream:
            raise ContextLengthExceeded(self._too_long(text.prefill_len()), param="instructions")
        return self._enqueue(self._new_stream(request, text, loop))

    def _new_stream(self, request: SynthesisRequest, text, loop) -> Stream:
        backlog = int(self.settings.max_buffered_audio_s * self.model.sample_rate)
        return Stream(request, text, loop, wake=self._notify, max_backlog_samples=backlog)

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

    # -- capacity -------------------------------------------------------------------------
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

    def _reservation(self, act: _Active) -> int:
        cap = act.stream.request.max_frames

        def frames(tokens: int) -> int:
            return self._budget(tokens) if cap is None else min(cap, self._budget(tokens))

        return act.text.worst_cells(frames, self.model.talker.cells_per_stream)

    def _cells_in_use(self) -> int:
        return sum(a.reserved for a in self._active.values()) + sum(rows for _, rows in self._prefixes.values())

    def _shared_pool(self) -> bool:
        return self.model.talker.cells_per_stream == self.settings.kv_cells

    def _make_room(self, need: int) -> bool:
        """Whether `need` more cells fit the shared pool, evicting cached prefixes if that helps."""
        if not self._shared_pool():
            return True
        while self._cells_in_use() + need > self.settings.kv_cells and self._prefixes:
            self._evict_oldest_prefix()
        return self._cells_in_use() + need <= self.settings.kv_cells

    def _evict_oldest_prefix(self) -> None:
        _, (seq, _) = self._prefixes.popitem(last=False)
        self.model.talker.drop(seq)

    # -- queue --------------------------------------------------------------------------
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

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    @property
    def prefix_slots(self) -> int:
        """Voice prefixes the engine keeps prefilled (0 in the deterministic profile)."""
        return len(self._prefix_seqs)

    def clear_prefix_cache(self) -> None:
        """Forget every cached voice prefix (the engine thread frees their KV cells before it
        admits the next request), e.g. to measure a voice's first request."""
        with self._wake:
            self._forget_prefixes = True
            self._wake.notify_all()

    @property
    def running(self) -> bool:
        return self.health().ok

    def load(self) -> dict:
        """Active streams, waiting requests, live streams waiting for text, paused streams and free
        slots (for health and metrics)."""
        with self._wake:
            return {"active": len(self._active), "waiting": len(self._waiting),
                    "waiting_text": len(self._waiting_text), "free_slots": len(self._free_seqs),
                    "paused": sum(a.stream.paused for a in self._active.values())}

    # -- worker -------------------------------------------------------------------------
    def _can_step(self, act: _Active) -> bool:
        if act.logits is None or len(act.pending) >= MAX_PENDING_FRAMES:  # (its codec lane is behind)
            return False
        if act.stream.backlogged():
            if not act.stream.paused:
                act.stream.paused = True
                self.stats["paused"] += 1
            return False
        act.stream.paused = False
        return act.text.has_row(act.segment_frames)  # (the row itself is projected once, when it steps)

    def _runnable(self) -> bool:
        if any(s.cancelled for s in self._waiting_text):
            return True
        if self._prefix_seqs and any(id(s) not in self._warm_tried for s in self._waiting_text):
            return True
        if any(a.codec_fault is not None or (a.pending and not a.codec_busy and a.chunks.due(len(a.pending), self.clock()))
               for a in self._active.values()):
            return True
        if self._waiting and self._free_seqs and self._room_changed:  # (never spin on one that cannot fit)
            return True
        return any(a.stream.cancelled or a.logits is None or self._can_step(a) for a in self._active.values())

    def _give_back_heap_when_idle(self) -> None:
        """Once no stream is left and the codec lanes' last calls have been done for IDLE_TRIM_S, the heap
        that the streams' calls freed goes back to the system (glibc keeps it otherwise: about 100 MiB
        after eight 0.6B streams), on the prompt thread (it takes ~10 ms). Not at once: a request that
        follows at once would fault those pages in again before its first audio."""
        if not self._heap_used or self._active or self._waiting or self._waiting_text or not self._prompt_pool:
            self._lanes_drained = self._idle_since = None
            return
        if self._lanes_drained is None:
            self._lanes_drained = [lane.submit(lambda: None) for lane in self._codec_lanes]
        if not all(done.done() for done in self._lanes_drained):
            return
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since >= IDLE_TRIM_S:
            self._heap_used, self._lanes_drained, self._idle_since = False, None, None
            self._prompt_pool.submit(heap.release_freed_heap)

    def _sweep_waiting(self) -> None:
        """End cancelled waiting streams; move live streams whose first token came into the queue."""
        for stream in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(stream)
            self._end_unstarted(stream, "cancelled")
            self._room_changed = True  # it may have been the one the others waited behind
        for stream in list(self._waiting_text):
            if stream.cancelled:
                self._waiting_text.remove(stream)
                self._warm_tried.discard(id(stream))
                self._end_unstarted(stream, "cancelled")
            elif stream.text.ready():
                self._waiting_text.remove(stream)
                self._warm_tried.discard(id(stream))
                self._waiting.append(stream)
                self._room_changed = True

    def _end_unstarted(self, stream: Stream, reason: str, error: str | None = None,
                       retryable: bool = False) -> None:
        stream.text.cancel()
        text = stream.text
        stream._put(SynthesisResult(0, text.text_tokens, reason, error=error, retryable=retryable,
                                    progress=text.final_progress(reason, started=False),
                                    text_chars=text.raw_chars, normalized_chars=text.normalized_chars))

    def _worker(self) -> None:
        try:
            self._run()
        except BaseException as e:  # the loop itself broke: fail everything, let the supervisor restart
            log.exception("the engine worker of %s died", self.model.name)
            self._died(f"the engine worker stopped unexpectedly ({type(e).__name__})")

    def _died(self, reason: str) -> None:
        with self._wake:
            self._failure = reason
            self._end_all("error", "the engine failed; retry", retryable=True)

    def _end_all(self, reason: str, error: str | None = None, retryable: bool = False) -> None:
        """End every running and waiting stream (the worker is stopping or died)."""
        for act in list(self._active.values()):
            self._finish(act, reason, error=error, flush=False, retryable=retryable)
        for stream in [*self._waiting, *self._waiting_text]:
            self._end_unstarted(stream, reason, error, retryable=retryable)
        self._waiting.clear()
        self._waiting_text.clear()
        self._warm_tried.clear()

    def _reset_state(self) -> None:
        """After a failure: every KV cell, slot, cached prefix and decoder state forgotten."""
        self.model.talker.clear()
        self._active.clear()
        self._free_seqs = list(range(self.settings.max_streams))
        self._prefixes.clear()
        with self._primed_lock:
            self._primed.clear()
        self._bypassed = 0
        self._room_changed = True

    def _run(self) -> None:
        while True:
            with self._wake:
                self._sweep_waiting()
                while not self._stopping and not self._runnable():
                    self._give_back_heap_when_idle()
                    self.heartbeat = time.monotonic()
                    self._wake.wait(timeout=0.25)
                    self._sweep_waiting()
                self.heartbeat = time.monotonic()
                if self._stopping:
                    break
                if self._forget_prefixes:
                    for seq, _ in self._prefixes.values():
                        self.model.talker.drop(seq)
                    self._prefixes.clear()
                    self._forget_prefixes = False
                    self._room_changed = True
                admitted = self._admit()
                unwarmed = self._unwarmed_prefixes()
            try:
                self._warm_prefixes(unwarmed)
                self._iterate(admitted)
                self._heap_used = True
            except Exception:  # a bug outside any one stream's work: its state is unknown, start clean
                log.exception("engine iteration of %s failed; ending its streams", self.model.name)
                with self._wake:
                    for act in list(self._active.values()):
                        self._finish(act, "error", error="the engine failed while serving this stream; retry",
                                     flush=False, retryable=True)
                    self._reset_state()
        self._end_all("cancelled")

    def _frame_limit(self, act: _Active) -> tuple[int, str]:
        """Frames the current segment may make, and the finish reason when it hits that."""
        req = act.stream.request
        limit, reason = self._budget(act.text.segment_tokens()), "budget"
        if req.max_frames is not None and req.max_frames - len(act.codes) + act.segment_frames <= limit:
            limit, reason = req.max_frames - len(act.codes) + act.segment_frames, "max_frames"
        room = act.reserved - act.text.prefill_len()
        if limit > room:
            limit, reason = max(room, 1), "context_full"
        return limit, reason

    def _grow(self, act: _Active) -> None:
        """Live text grows: reserve cells for what has arrived, as far as the pool has room."""
        want = self._reservation(act)
        if want > act.reserved:
            act.reserved += max(0, min(want - act.reserved, self.settings.kv_cells - self._cells_in_use())
                                if self._shared_pool() else want - act.reserved)

    def _prefill_item(self, act: _Active) -> DecodeItem:
        """The prompt rows to decode for a stream; a cached voice prefix is copied in, not recomputed."""
        rows, prefix = act.text.prefill_rows(), act.text.prefix_len()
        if not self._prefix_seqs or not 0 < prefix < len(rows):
            return DecodeItem(act.seq, 0, rows)
        key = _prefix_key(rows[:prefix])
        cached = self._prefixes.get(key)
        if cached is None:
            act.new_prefix = (key, prefix)
            return DecodeItem(act.seq, 0, rows)
        self._prefixes.move_to_end(key)
        self.model.talker.copy(cached[0], act.seq, prefix)
        self.stats["prefix_hits"] += 1
        return DecodeItem(act.seq, prefix, rows[prefix:])

    def _keep_prefix(self, act: _Active) -> None:
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
            key = _prefix_key(rows)
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

    def _admit(self) -> list[_Active]:
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

    def _new_active(self, stream: Stream) -> _Active:
        """A queued stream's engine state (its random generator, chunk plan and KV reservation), before
        it has a slot."""
        req = stream.request
        seed = req.seed if req.seed is not None else int(np.random.SeedSequence().entropy % (2**63))
        act = _Active(stream=stream, seq=-1, rng=np.random.default_rng(seed),
                      chunks=ChunkPlan(self.settings.chunk_frames, self._frame_s,
                                       adaptive=self.settings.adaptive_chunks and not self.settings.deterministic))
        act.reserved = self._reservation(act)
        return act

    def _next_segment(self, act: _Active) -> bool:
        """Move a stream whose segment ended to its next segment (codec state carries over)."""
        req = act.stream.request
        if req.max_frames is not None and len(act.codes) >= req.max_frames:
            return False
        try:
            if not act.text.next_segment():
                return False
        except Exception as e:
            raise self._fault("prompt", e) from None
        self.model.talker.drop(act.seq)
        act.segment_frames, act.pos, act.logits, act.hidden, act.history = 0, 0, None, None, set()
        return True

    def _fault(self, stage: str, error: BaseException, act: _Active | None = None) -> _StreamFault:
        log.error("stream %s of %s: the %s failed", act.stream.id if act else "?", self.model.name, stage,
                  exc_info=(type(error), error, error.__traceback__))
        return _StreamFault(stage)

    def _count_error(self) -> None:
        with self._stats_lock:
            self.stats["errors"] += 1

    def _fail(self, act: _Active, fault: _StreamFault) -> None:
        self._count_error()
        self._finish(act, "error", error=f"the {fault.stage} failed for this stream", flush=False)

    def _sample(self, act: _Active, eos: int) -> tuple[int, np.ndarray] | None:
        """(codebook 0, text row) of a stream's next frame; None when its segment ended."""
        row = act.text.row(act.segment_frames)
        req = act.stream.request
        try:
            c0 = sample_code0(act.logits, act.history, act.segment_frames, req.talker, act.rng, eos_id=eos,
                              allow_eos=not req.ignore_eos)
            if not 0 <= c0 < len(act.logits):
                raise ValueError(f"sampled code {c0} is out of range")
        except Exception as e:
            raise self._fault("sampler", e, act) from None
        return (c0, row) if c0 != eos else None

    def _predict(self, stepping: list[_Active], code0: list[int]):
        """Codes and frame embeddings of every stepping stream: one batched call, or, if that
        fails, one call per stream with its random state rewound (only the culprit fails).
        Yields (act, codes[15], frame embedding) or (act, _StreamFault)."""
        predictor = self.model.predictor
        states = [a.rng.bit_generator.state for a in stepping]
        t0 = time.perf_counter()
        try:
            out = predictor.predict(np.stack([a.hidden for a in stepping]), np.array(code0, np.int64),
                                    [a.stream.request.code_predictor for a in stepping], rngs=[a.rng for a in stepping])
            self._check_codes(out.codes)
        except Exception as e:
            if len(stepping) == 1:
                yield stepping[0], self._fault("code predictor", e, stepping[0])
                return
            for act, state, c0 in zip(stepping, states, code0):
                act.rng.bit_generator.state = state
                yield from self._predict([act], [c0])
            return
        dt = (time.perf_counter() - t0) / len(stepping)
        for k, act in enumerate(stepping):
            act.timings["predictor_s"] += dt
            yield act, (out.codes[k], out.frame_embedding[k])

    def _check_codes(self, codes: np.ndarray) -> None:
        size = self.model.codec.codebook_size
        if codes.size and (codes.min() < 0 or codes.max() >= size):
            raise ValueError(f"code predictor made a code outside [0, {size})")

    def _codec_in_flight(self) -> bool:
        """Whether a codec call of any active stream is queued or running in its lane."""
        return any(a.codec_busy for a in self._active.values())

    def _decode(self, items: list[DecodeItem], owners: list[_Active]) -> None:
        """One talker decode for every item; if it fails, each item alone (KV cells rewound)."""
        talker = self.model.talker
        threads = self.model.stage_threads
        if threads.talker_step < threads.talker_batch:
            # a step leaves a core to the codec lanes only while one of their calls is in flight (a
            # lane call starts only from this thread, so none starts during the decode)
            busy = self._codec_in_flight()
            talker.set_step_threads(threads.talker_step if busy else threads.talker_batch)
        t0 = time.perf_counter()
        try:
            results = list(zip(*talker.decode(items)))
        except Exception as e:
            if len(items) == 1:
                talker.truncate(items[0].seq, items[0].pos)
                self._fail(owners[0], self._fault("talker decode", e, owners[0]))
                return
            for item in items:
                talker.truncate(item.seq, item.pos)
            for item, act in zip(items, owners):
                if act.seq in self._active and self._active[act.seq] is act:
                    self._decode([item], [act])
            return
        dt = (time.perf_counter() - t0) / len(items)
        for item, act, (logits, hidden) in zip(items, owners, results):
            if not (np.isfinite(logits).all() and np.isfinite(hidden).all()):
                talker.truncate(item.seq, item.pos)
                self._fail(act, self._fault("talker decode", FloatingPointError("non-finite output"), act))
                continue
            act.logits, act.hidden = logits, hidden
            act.pos = item.pos + len(item.rows)
            act.timings["talker_s"] += dt
            if act.new_prefix is not None:
                self._keep_prefix(act)

    def _iterate(self, admitted: list[_Active]) -> None:
        eos = self.model.manifest.codec_ids["eos"]
        for act in [a for a in self._active.values() if a.stream.cancelled]:
            self._finish(act, "cancelled", flush=False)
        for act in [a for a in self._active.values() if a.codec_fault is not None]:
            self._fail(act, self._fault("codec", act.codec_fault, act))
        prefill = [a for a in admitted if a.seq in self._active]
        # 2. codebook 0 for every stream that can step (logits there, text row there, reader keeping up)
        stepping, code0, text_rows = [], [], []
        for act in list(self._active.values()):
            if act in prefill or not self._can_step(act):
                continue
            try:
                if isinstance(act.text, FedText):
                    self._grow(act)
                sampled = self._sample(act, eos)
                if sampled is None:
                    if self._next_segment(act):
                        prefill.append(act)
                    else:
                        self._finish(act, "eos")
                    continue
            except _StreamFault as fault:
                self._fail(act, fault)
                continue
            stepping.append(act)
            code0.append(sampled[0])
            text_rows.append(sampled[1])
        items: list[DecodeItem] = []
        owners: list[_Active] = []
        ended: list[tuple[_Active, str]] = []
        # 3. code predictor for all stepping streams in one call
        if stepping:
            rows = dict(zip(map(id, stepping), text_rows))
            c0s = dict(zip(map(id, stepping), code0))
            for act, out in list(self._predict(stepping, code0)):
                if isinstance(out, _StreamFault):
                    self._fail(act, out)
                    continue
                codes, frame_embedding = out
                frame = np.concatenate([[c0s[id(act)]], codes]).astype(np.int64)
                act.codes.append(frame)
                act.pending.append(frame)
                act.history.add(int(frame[0]))
                self.stats["frames"] += 1
                act.segment_frames += 1
                act.text.frame_made(act.segment_frames)
                act.chunks.frame_made(self.clock())
                limit, reason = self._frame_limit(act)
                if act.segment_frames >= limit:
                    try:
                        if self._next_segment(act):
                            prefill.append(act)
                        else:
                            ended.append((act, reason))  # no next talker step: ends once its audio is flushed
                    except _StreamFault as fault:
                        self._fail(act, fault)
                    continue
                items.append(DecodeItem(act.seq, act.pos, (frame_embedding + rows[id(act)])[None]))
                owners.append(act)
        # 4. audio that is due, before the talker step: a chunk's latency need not include it (also of
        # streams that did not step: a player may be running dry, or their codec lane was busy)
        for act in list(self._active.values()):
            if act.pending and not act.stream.cancelled and act.chunks.due(len(act.pending), self.clock()):
                self._emit(act)
        # 5. prompts of admitted streams and new segments join the same decode
        for act in prefill:
            if act.seq not in self._active:
                continue
            try:
                items.append(self._prefill_item(act))
            except Exception as e:
                self._fail(act, self._fault("prompt", e, act))
                continue
            owners.append(act)
        live = [(item, act) for item, act in zip(items, owners) if self._active.get(act.seq) is act]
        if live:
            self._decode([i for i, _ in live], [a for _, a in live])
        for act, reason in ended:
            if self._active.get(act.seq) is act:
                self._finish(act, reason)
        self.stats["iterations"] += 1

    def _primed_state(self, codes: np.ndarray) -> CodecState:
        """Decoder state after an in-context clone's reference codes (audio discarded; cached)."""
        codes = np.ascontiguousarray(codes, np.int64)
        key = hashlib.sha1(codes.tobytes()).hexdigest()
        with self._primed_lock:
            state = self._primed.pop(key, None)
        if state is None:
            _, state = self.model.codec.decode(codes)
        with self._primed_lock:
            self._primed[key] = state  # most recently used last
            while len(self._primed) > 8:
                self._primed.pop(next(iter(self._primed)))
        return state

    def _emit(self, act: _Active) -> None:
        """The stream's pending frames to the codec: here, or queued in its codec lane (unless a call
        of this stream is still there: then they wait and join the next one). A stream's first chunk
        is decoded here, with the cores to itself: overlapped, it came 0.03-0.13 s later."""
        if not self._codec_lanes or act.chunks.start is None:  # the first chunk: at once, for first audio
            frames, act.pending = act.pending, []
            try:
                self._emit_audio(act, frames)
            except Exception as e:
                self._fail(act, self._fault("codec", e, act))
            return
        if act.codec_busy:
            return
        frames, act.pending = act.pending, []
        act.codec_busy = True
        self._lane(act).submit(self._codec_job, act, frames)

    def _lane(self, act: _Active) -> ThreadPoolExecutor:
        """The stream's codec lane: given at its first call, the lane with the fewest running streams;
        all its calls and its result go through that one, so they stay in order."""
        if act.codec_lane is None:
            load = [0] * len(self._codec_lanes)
            for other in self._active.values():
                if other.codec_lane is not None:
                    load[other.codec_lane] += 1
            act.codec_lane = load.index(min(load))
        return self._codec_lanes[act.codec_lane]

    def _codec_job(self, act: _Active, frames: list) -> None:
        """In the stream's codec lane: one call; a failure is left for the engine, which ends the stream."""
        try:
            if act.codec_fault is None and not act.stream.cancelled:
                self._emit_audio(act, frames)
        except Exception as e:
            act.codec_fault = e
        finally:
            act.codec_busy = False
            self._notify()

    def _emit_audio(self, act: _Active, frames: list) -> None:
        frames = np.stack(frames)
        t0, started = time.perf_counter(), self.clock()
        reference = act.stream.request.voice.reference
        if act.codec_state is None and reference is not None:
            # the reference frames are the decoder's left context: the first frame already has it
            act.codec_state = self._primed_state(reference.codes)
        wav, act.codec_state = self.model.codec.decode(frames, act.codec_state)
        if not np.isfinite(wav).all():
            raise FloatingPointError("the codec made non-finite samples")
        act.timings["codec_s"] += time.perf_counter() - t0
        now = self.clock()
        act.chunks.emitted(len(frames), now - started, now)
        if act.stream.first_audio_at is None:
            act.stream.first_audio_at = time.monotonic()
        act.stream._put(AudioChunk(samples=wav, first_frame=act.decoded_frames, n_frames=len(frames),
                                   progress=act.text.progress))
        act.decoded_frames += len(frames)

    def _finish(self, act: _Active, reason: str, error: str | None = None, flush: bool = True,
                retryable: bool = False) -> None:
        """End a stream: its cells and slot freed here; its last audio (when `flush`) and result after
        every chunk before them (in its codec lane when the codec overlaps)."""
        self.model.talker.drop(act.seq)
        if self._active.get(act.seq) is act:
            self._active.pop(act.seq)
            self._free_seqs.append(act.seq)
            self._free_seqs.sort()
            self._room_changed = True
        act.text.cancel()
        self.stats["streams_done"] += 1
        if reason == "cancelled":
            self.stats["cancelled"] += 1
        frames, act.pending = (act.pending if flush else []), []
        if self._codec_lanes:
            self._lane(act).submit(self._conclude, act, reason, error, frames, retryable)
        else:
            self._conclude(act, reason, error, frames, retryable)

    def _conclude(self, act: _Active, reason: str, error: str | None, frames: list, retryable: bool) -> None:
        # an overlapped call that failed after the last step ends the stream as an error, its last frames unsaid
        fault = act.codec_fault if reason != "error" else None
        if fault is None and frames:
            try:
                self._emit_audio(act, frames)
            except Exception as e:
                fault = e
        if fault is not None:
            self._fault("codec", fault, act)
            reason, error = "error", "the codec failed for this stream"
            self._count_error()
        stream = act.stream
        timings = dict(act.timings)
        if stream.first_audio_at is not None:
            timings["first_audio_s"] = stream.first_audio_at - stream.submitted_at
        timings["total_s"] = time.monotonic() - stream.submitted_at
        codes = np.stack(act.codes) if act.codes else np.zeros((0, 16), np.int64)
        text = act.text
        stream._put(SynthesisResult(frames=len(act.codes), text_tokens=text.text_tokens,
                                    finish_reason=reason, codes=codes, error=error, timings=timings,
                                    retryable=retryable, progress=text.final_progress(reason),
                                    text_chars=text.raw_chars, normalized_chars=text.normalized_chars))


__all__ = ["Engine", "EngineBusy", "EngineHealth", "EngineStopped", "Stream"]
