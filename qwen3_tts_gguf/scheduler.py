"""The engine worker: one thread owns llama.cpp and ONNX Runtime and steps every stream together.

Each iteration (continuous batching; one stream is the special case):
  1. drop cancelled streams; admit waiting requests into free slots (their prompt rows join step 5);
  2. sample codebook 0 of every stream that can step; EOS or a limit ends a stream (or its segment);
  3. one batched code-predictor call for all of them -> codebooks 1..15 + the next input rows;
  4. each stream's codec state decodes its pending frames once a chunk is full (1, 2, 4, 8, 8, ...),
     before the talker step, so a chunk's latency does not include it;
  5. one multi-sequence talker decode: new prompts and every stream's next row.
A stream whose text arrives live (`open_text_stream`) and whose next text row has not arrived
simply does not step: it keeps its state and goes on when the text comes. Audio leaves as float32
chunks on a per-request queue (asyncio or thread); a slow reader never blocks the worker. The
engine knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .codec import CodecState
from .model import LoadedModel
from .prompt import Prompt, PromptError
from .request import AudioChunk, SynthesisRequest, SynthesisResult
from .sampler import sample_code0
from .talker import DecodeItem, Talker
from .text_feed import TextFeed
from .text_segments import split_segments


class EngineBusy(RuntimeError):
    """Too many requests are waiting for a slot."""


class EngineStopped(RuntimeError):
    """The engine is not running."""


class _FixedText:
    """Text known up front: one prompt per segment (long input is split at sentence ends).

    The first segment's prompt is built at submit (its errors reach the caller); each later one is
    built in the background while the segment before it speaks (`prepare` returns a Future), so
    neither the first audio nor the engine loop waits for the text rows of a long input."""

    def __init__(self, segments: list[str], tokens: list[int], build: Callable[[str], Prompt],
                 prepare: Callable[[str], Future]):
        self._segments, self._tokens, self._prepare = segments, tokens, prepare
        self.prompts = [build(segments[0])]
        self._next = prepare(segments[1]) if len(segments) > 1 else None
        self.segment = 0

    @property
    def prompt(self) -> Prompt:
        return self.prompts[self.segment]

    def ready(self) -> bool:
        return True

    def empty(self) -> bool:
        return False

    def prefill_rows(self) -> np.ndarray:
        return self.prompt.rows

    def prefill_len(self) -> int:
        return len(self.prompt.rows)

    def prefix_len(self) -> int:
        return self.prompt.prefix_len

    def row(self, step: int) -> np.ndarray | None:
        p = self.prompt
        return p.trailing[step] if step < len(p.trailing) else p.pad_row

    def segment_tokens(self) -> int:
        return self._tokens[self.segment]

    @property
    def text_tokens(self) -> int:
        return sum(self._tokens)

    def next_segment(self) -> bool:
        if self._next is None:
            return False
        self.prompts.append(self._next.result())  # segments were validated at submit
        self.segment += 1
        following = self.segment + 1
        self._next = self._prepare(self._segments[following]) if following < len(self._segments) else None
        return True


class _FedText:
    """Text arriving live (streaming text mode): rows are made as tokens are committed.

    The streaming layout pairs the first Nc text rows with Nc codec rows in the prompt: Nc = 1
    (codec_bos) for a plain voice; for an in-context clone the text rows start with the reference
    transcript and the codec rows are codec_bos + one per reference frame, so the stream starts
    once Nc text rows are known (or at close, padding with <tts_pad> as the official layout does).
    Text row Nc + k is added to decode step k; after the text (and its EOS) comes <tts_pad>.
    """

    def __init__(self, engine: "Engine", request: SynthesisRequest):
        prompts = engine.model.prompts
        self._prompts = prompts
        self._prefix = prompts.prefix_rows(request.voice)  # validates the voice now
        self._ref_ids, self._codec_rows = prompts.reference_track(request.voice)
        tokenizer = prompts.tokenizer
        # plain encode of each new run of pieces = the template's body ids (text not starting with a newline)
        self.feed = TextFeed(tokenizer.encode, tokenizer.pieces, on_change=engine._notify)

    def _text(self) -> tuple[list[int], bool]:
        """(reference transcript + committed body ids, closed)."""
        ids, closed = self.feed.snapshot()
        return self._ref_ids + ids, closed

    def _text_row(self, index: int, ids: list[int], closed: bool) -> np.ndarray | None:
        if index < len(ids):
            return self._prompts.tables.text_rows([ids[index]])[0]
        if not closed:
            return None
        return self._prompts.eos_row if index == len(ids) else self._prompts.pad_row

    def ready(self) -> bool:
        ids, closed = self._text()
        return closed or len(ids) >= len(self._codec_rows)

    def empty(self) -> bool:
        ids, closed = self.feed.snapshot()
        return closed and not ids

    def prefill_rows(self) -> np.ndarray:
        ids, closed = self._text()
        text = np.stack([self._text_row(i, ids, closed) for i in range(len(self._codec_rows))])
        return np.concatenate([self._prefix, text + self._codec_rows]).astype(np.float32)

    def prefill_len(self) -> int:
        return len(self._prefix) + len(self._codec_rows)

    def prefix_len(self) -> int:
        return len(self._prefix)

    def row(self, step: int) -> np.ndarray | None:
        """Text part of decode step `step`; None = that text has not arrived yet."""
        ids, closed = self._text()
        return self._text_row(len(self._codec_rows) + step, ids, closed)

    def segment_tokens(self) -> int:
        return max(len(self.feed.snapshot()[0]), 1)

    @property
    def text_tokens(self) -> int:
        return len(self.feed.snapshot()[0])

    def next_segment(self) -> bool:
        return False


class Stream:
    """The consumer's handle on one request: iterate (sync or async) for AudioChunks, then `.result`.

    Streams opened with `Engine.open_text_stream` also take text: `push_text(delta)`, `close_text()`.
    """

    _ids = itertools.count(1)

    def __init__(self, request: SynthesisRequest, text: _FixedText | _FedText, loop: asyncio.AbstractEventLoop | None,
                 on_cancel=None):
        self.id = next(self._ids)
        self._on_cancel = on_cancel
        self.request = request
        self.text = text
        self.result: SynthesisResult | None = None
        self.submitted_at = time.monotonic()
        self.first_audio_at: float | None = None
        self._cancel = threading.Event()
        self._loop = loop
        self._queue: asyncio.Queue | queue.Queue = asyncio.Queue() if loop else queue.Queue()

    @property
    def prompts(self) -> list[Prompt]:
        """The segment prompts of a fixed-text stream."""
        return self.text.prompts

    # -- text input (live streams) ----------------------------------------------------------
    def push_text(self, delta: str) -> None:
        """Append text to a live stream; it is spoken as soon as its tokenization is final."""
        if not isinstance(self.text, _FedText):
            raise TypeError("this stream's text was given up front")
        self.text.feed.push(delta)

    def close_text(self) -> None:
        """No more text: the stream finishes speaking what it has."""
        if not isinstance(self.text, _FedText):
            raise TypeError("this stream's text was given up front")
        self.text.feed.close()

    # -- producer side (engine thread) ------------------------------------------------------
    def _put(self, event) -> None:
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
            except RuntimeError:  # the consumer's loop is closed: nobody listens any more
                self._cancel.set()
        else:
            self._queue.put(event)

    # -- consumer side ------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop this stream at the next engine iteration and free its slot (or its queue place)."""
        self._cancel.set()
        if self._on_cancel is not None:
            self._on_cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def __iter__(self):
        assert isinstance(self._queue, queue.Queue), "created with an event loop: use `async for`"
        while True:
            event = self._queue.get()
            if isinstance(event, SynthesisResult):
                self.result = event
                return
            yield event

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        assert isinstance(self._queue, asyncio.Queue), "created without an event loop: use `for`"
        while True:
            event = await self._queue.get()
            if isinstance(event, SynthesisResult):
                self.result = event
                return
            yield event


@dataclass
class _Active:
    """Engine-side state of one admitted stream."""

    stream: Stream
    seq: int
    rng: np.random.Generator
    segment_frames: int = 0
    pos: int = 0  # next talker position
    logits: np.ndarray | None = None
    hidden: np.ndarray | None = None
    history: set = field(default_factory=set)  # codebook-0 ids of the current segment
    codes: list = field(default_factory=list)
    pending: list = field(default_factory=list)  # frames not yet decoded to audio
    chunk_index: int = 0
    decoded_frames: int = 0
    codec_state: CodecState | None = None
    new_prefix: tuple[str, int] | None = None  # (key, rows) to cache after this stream's prefill
    timings: dict = field(default_factory=lambda: {"talker_s": 0.0, "predictor_s": 0.0, "codec_s": 0.0})

    @property
    def text(self):
        return self.stream.text


class Engine:
    """Owns a LoadedModel on a worker thread; `submit` requests, iterate their streams."""

    def __init__(self, model: LoadedModel):
        self.model = model
        self.settings = model.settings
        self._waiting: deque[Stream] = deque()
        self._active: dict[int, _Active] = {}
        self._free_seqs = list(range(self.settings.max_streams))
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stats = {"iterations": 0, "frames": 0, "streams_done": 0, "cancelled": 0}
        self._primed: dict[str, CodecState] = {}
        # voice prefixes kept in the KV cache: key -> (sequence, rows), least recently used first
        self._prefixes: OrderedDict[str, tuple[int, int]] = OrderedDict()
        first = self.settings.max_streams
        self._prefix_seqs = list(range(first, first + Talker.prefix_slots(model.talker.settings)))
        self.stats["prefix_hits"] = 0
        self._forget_prefixes = False
        self._prompt_pool: ThreadPoolExecutor | None = None  # later segments' prompts, built off both threads

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "Engine":
        if self._thread is None:
            self._stopping = False
            self._prompt_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwen3-tts-prompts")
            self._thread = threading.Thread(target=self._run, name="qwen3-tts-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._prompt_pool is not None:
            self._prompt_pool.shutdown(wait=False, cancel_futures=True)
            self._prompt_pool = None

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- requests -----------------------------------------------------------------------
    def submit(self, request: SynthesisRequest, loop: asyncio.AbstractEventLoop | None = None) -> Stream:
        """Validate and queue a request. Raises PromptError for bad input, EngineBusy when full."""
        self._check_request(request)
        text_mode = request.text_mode or self.model.manifest.default_text_mode
        segments = split_segments(request.text, self.settings.max_segment_chars) or [request.text]
        builder = self.model.prompts
        tokens = [len(builder.body_ids(text)) for text in segments]  # every segment checked now (cheap)

        def build(text: str) -> Prompt:
            return builder.build(text, request.voice, text_mode)

        text = _FixedText(segments, tokens, build, lambda t: self._prompt_pool.submit(build, t))
        return self._enqueue(Stream(request, text, loop, on_cancel=self._notify))

    def open_text_stream(self, request: SynthesisRequest, loop: asyncio.AbstractEventLoop | None = None) -> Stream:
        """A streaming-text-mode stream whose text arrives later through `push_text`/`close_text`.

        `request.text` is ignored. Synthesis starts as soon as the first token is final.
        """
        self._check_request(request)
        return self._enqueue(Stream(request, _FedText(self, request), loop, on_cancel=self._notify))

    def _check_request(self, request: SynthesisRequest) -> None:
        if self._thread is None or self._stopping:
            raise EngineStopped("the engine is not running")
        if request.max_frames is not None and request.max_frames < 1:
            raise PromptError(f"max_frames must be >= 1, got {request.max_frames}")

    def _enqueue(self, stream: Stream) -> Stream:
        with self._wake:
            if len(self._waiting) >= self.settings.max_pending:
                raise EngineBusy(f"{len(self._waiting)} requests are already waiting")
            self._waiting.append(stream)
            self._wake.notify_all()
        return stream

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def clear_prefix_cache(self) -> None:
        """Forget every cached voice prefix (the engine thread frees their KV cells before it
        admits the next request), e.g. to measure a voice's first request."""
        with self._wake:
            self._forget_prefixes = True
            self._wake.notify_all()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopping

    def load(self) -> dict:
        """Active streams, waiting requests and free slots (for health and metrics)."""
        with self._wake:
            return {"active": len(self._active), "waiting": len(self._waiting), "free_slots": len(self._free_seqs)}

    # -- worker -------------------------------------------------------------------------
    def _runnable(self) -> bool:
        if any(s.cancelled or s.text.ready() for s in self._waiting) and self._free_seqs:
            return True
        return any(a.stream.cancelled or a.logits is None or a.text.row(a.segment_frames) is not None
                   for a in self._active.values())

    def _drop_cancelled_waiting(self) -> None:
        if any(s.cancelled for s in self._waiting):
            for stream in [s for s in self._waiting if s.cancelled]:
                self._waiting.remove(stream)
                stream._put(SynthesisResult(0, stream.text.text_tokens, "cancelled"))

    def _run(self) -> None:
        while True:
            with self._wake:
                self._drop_cancelled_waiting()
                while not self._stopping and not self._runnable():
                    self._wake.wait(timeout=0.25)
                    self._drop_cancelled_waiting()
                if self._stopping:
                    break
                if self._forget_prefixes:
                    for seq, _ in self._prefixes.values():
                        self.model.talker.drop(seq)
                    self._prefixes.clear()
                    self._forget_prefixes = False
                admitted = self._admit()
            try:
                self._iterate(admitted)
            except Exception as e:  # a shared call failed: fail every stream it involved
                for act in list(self._active.values()):
                    self._finish(act, "error", error=f"{type(e).__name__}: {e}")
        for act in list(self._active.values()):
            self._finish(act, "cancelled")
        while self._waiting:
            stream = self._waiting.popleft()
            stream._put(SynthesisResult(0, stream.text.text_tokens, "cancelled"))

    def _frame_limit(self, act: _Active) -> tuple[int, str]:
        """Frames the current segment may make, and the finish reason when it hits that."""
        req = act.stream.request
        limit = self.settings.budget_base_frames + self.settings.budget_frames_per_token * act.text.segment_tokens()
        reason = "budget"
        if req.max_frames is not None and req.max_frames - len(act.codes) + act.segment_frames <= limit:
            limit, reason = req.max_frames - len(act.codes) + act.segment_frames, "max_frames"
        room = self.model.talker.cells_per_stream - act.text.prefill_len()
        if limit > room:
            limit, reason = max(room, 1), "budget"
        return limit, reason

    def _reserved_cells(self) -> int:
        streams = sum(a.text.prefill_len() + self._frame_limit(a)[0] for a in self._active.values())
        return streams + sum(rows for _, rows in self._prefixes.values())

    def _prefill_item(self, act: _Active) -> DecodeItem:
        """The prompt rows to decode for a stream; a cached voice prefix is copied in, not recomputed."""
        rows, prefix = act.text.prefill_rows(), act.text.prefix_len()
        if not self._prefix_seqs or not 0 < prefix < len(rows):
            return DecodeItem(act.seq, 0, rows)
        key = hashlib.sha1(np.ascontiguousarray(rows[:prefix]).tobytes()).hexdigest()
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
        if len(self._prefixes) >= len(self._prefix_seqs):
            _, (seq, _) = self._prefixes.popitem(last=False)
            self.model.talker.drop(seq)
        seq = next(s for s in self._prefix_seqs if s not in {v[0] for v in self._prefixes.values()})
        self.model.talker.copy(act.seq, seq, rows)
        self._prefixes[key] = (seq, rows)

    def _admit(self) -> list[_Active]:
        admitted, skipped = [], deque()
        while self._waiting and self._free_seqs:
            stream = self._waiting.popleft()
            if stream.cancelled:
                stream._put(SynthesisResult(0, stream.text.text_tokens, "cancelled"))
                continue
            if stream.text.empty():
                stream._put(SynthesisResult(0, 0, "error", error="input text is empty"))
                continue
            if not stream.text.ready():  # live text with no final token yet
                skipped.append(stream)
                continue
            req = stream.request
            seed = req.seed if req.seed is not None else int(np.random.SeedSequence().entropy % (2**63))
            act = _Active(stream=stream, seq=-1, rng=np.random.default_rng(seed))
            need = act.text.prefill_len() + self._frame_limit(act)[0]
            shared = self.model.talker.cells_per_stream == self.settings.n_ctx
            if shared and self._active and self._reserved_cells() + need > self.settings.n_ctx:
                skipped.appendleft(stream)  # wait until running streams free their cells
                break
            act.seq = self._free_seqs.pop(0)
            self._active[act.seq] = act
            admitted.append(act)
        self._waiting.extendleft(reversed(skipped))
        return admitted

    def _next_segment(self, act: _Active) -> bool:
        """Move a stream whose segment ended to its next segment (codec state carries over)."""
        req = act.stream.request
        if req.max_frames is not None and len(act.codes) >= req.max_frames:
            return False
        if not act.text.next_segment():
            return False
        self.model.talker.drop(act.seq)
        act.segment_frames, act.pos, act.logits, act.hidden, act.history = 0, 0, None, None, set()
        return True

    def _iterate(self, admitted: list[_Active]) -> None:
        model = self.model
        eos = model.manifest.codec_ids["eos"]
        for act in [a for a in self._active.values() if a.stream.cancelled]:
            self._finish(act, "cancelled")
        prefill = list(admitted)
        # 2. codebook 0 for every stream that has logits and whose next text row is there
        stepping, code0, text_rows = [], [], []
        for act in list(self._active.values()):
            if act.logits is None:
                continue
            row = act.text.row(act.segment_frames)
            if row is None:
                continue  # live text not here yet: wait without touching any state
            req = act.stream.request
            c0 = sample_code0(act.logits, act.history, act.segment_frames, req.talker, act.rng, eos_id=eos,
                              allow_eos=not req.ignore_eos)
            if c0 == eos:
                if self._next_segment(act):
                    prefill.append(act)
                else:
                    self._finish(act, "eos")
                continue
            stepping.append(act)
            code0.append(c0)
            text_rows.append(row)
        items: list[DecodeItem] = []
        owners: list[_Active] = []
        ended: list[tuple[_Active, str]] = []
        # 3. code predictor for all stepping streams in one call
        if stepping:
            t0 = time.perf_counter()
            out = model.predictor.predict(
                np.stack([a.hidden for a in stepping]), np.array(code0, np.int64),
                [a.stream.request.code_predictor for a in stepping], rngs=[a.rng for a in stepping])
            dt = (time.perf_counter() - t0) / len(stepping)
            for k, act in enumerate(stepping):
                act.timings["predictor_s"] += dt
                frame = np.concatenate([[code0[k]], out.codes[k]]).astype(np.int64)
                act.codes.append(frame)
                act.pending.append(frame)
                act.history.add(int(code0[k]))
                self.stats["frames"] += 1
                act.segment_frames += 1
                limit, reason = self._frame_limit(act)
                if act.segment_frames >= limit:
                    if self._next_segment(act):
                        prefill.append(act)
                    else:
                        ended.append((act, reason))  # no next talker step: ends once its audio is flushed
                    continue
                items.append(DecodeItem(act.seq, act.pos, (out.frame_embedding[k] + text_rows[k])[None]))
                owners.append(act)
        # 4. audio that is due, before the talker step: a chunk's latency need not include it
        for act in stepping:
            if act.seq not in self._active or act.stream.cancelled:
                continue
            target = self.settings.chunk_frames[min(act.chunk_index, len(self.settings.chunk_frames) - 1)]
            if len(act.pending) >= target:
                self._emit_audio(act)
        # 5. prompts of admitted streams and new segments join the same decode
        for act in prefill:
            items.append(self._prefill_item(act))
            owners.append(act)
        if items:
            t0 = time.perf_counter()
            logits, hidden = model.talker.decode(items)
            dt = (time.perf_counter() - t0) / len(items)
            for k, (item, act) in enumerate(zip(items, owners)):
                act.logits, act.hidden = logits[k], hidden[k]
                act.pos = item.pos + len(item.rows)
                act.timings["talker_s"] += dt
                if act.new_prefix is not None:
                    self._keep_prefix(act)
        for act, reason in ended:
            self._finish(act, reason)
        self.stats["iterations"] += 1

    def _primed_state(self, codes: np.ndarray) -> CodecState:
        """Decoder state after an in-context clone's reference codes (audio discarded; cached)."""
        codes = np.ascontiguousarray(codes, np.int64)
        key = hashlib.sha1(codes.tobytes()).hexdigest()
        state = self._primed.pop(key, None)
        if state is None:
            _, state = self.model.codec.decode(codes)
        self._primed[key] = state  # most recently used last
        while len(self._primed) > 8:
            self._primed.pop(next(iter(self._primed)))
        return state

    def _emit_audio(self, act: _Active) -> None:
        frames = np.stack(act.pending)
        t0 = time.perf_counter()
        reference = act.stream.request.voice.reference
        if act.codec_state is None and reference is not None:
            # the reference frames are the decoder's left context: the first frame already has it
            act.codec_state = self._primed_state(reference.codes)
        wav, act.codec_state = self.model.codec.decode(frames, act.codec_state)
        act.timings["codec_s"] += time.perf_counter() - t0
        if act.stream.first_audio_at is None:
            act.stream.first_audio_at = time.monotonic()
        act.stream._put(AudioChunk(samples=wav, first_frame=act.decoded_frames, n_frames=len(frames)))
        act.decoded_frames += len(frames)
        act.pending = []
        act.chunk_index += 1

    def _finish(self, act: _Active, reason: str, error: str | None = None) -> None:
        if act.pending and reason not in ("cancelled", "error"):
            self._emit_audio(act)
        self.model.talker.drop(act.seq)
        self._active.pop(act.seq, None)
        self._free_seqs.append(act.seq)
        self._free_seqs.sort()
        stream = act.stream
        timings = dict(act.timings)
        if stream.first_audio_at is not None:
            timings["first_audio_s"] = stream.first_audio_at - stream.submitted_at
        timings["total_s"] = time.monotonic() - stream.submitted_at
        codes = np.stack(act.codes) if act.codes else np.zeros((0, 16), np.int64)
        self.stats["streams_done"] += 1
        if reason == "cancelled":
            self.stats["cancelled"] += 1
        stream._put(SynthesisResult(frames=len(act.codes), text_tokens=act.text.text_tokens,
                                    finish_reason=reason, codes=codes, error=error, timings=timings))
