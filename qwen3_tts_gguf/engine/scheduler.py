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
Voice prefixes (role, speaker, language rows) are kept prefilled (their KV rows saved) for later
streams of the same voice (fast profile); a live stream still waiting for its first words has its
voice prefix prefilled meanwhile, so its words only prefill themselves.
The engine knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from qwen3_tts_gguf.engine.admission import Admission
from qwen3_tts_gguf.engine.audio_out import AudioOut
from qwen3_tts_gguf.engine.faults import StreamEnds
from qwen3_tts_gguf.engine.health import EngineBusy, EngineHealth, EngineStopped
from qwen3_tts_gguf.engine.iteration import Iteration
from qwen3_tts_gguf.engine.prefix_cache import PrefixCache
from qwen3_tts_gguf.engine.request import SynthesisRequest
from qwen3_tts_gguf.engine.runaway import RUNAWAY_COUNTS
from qwen3_tts_gguf.engine.stream import Stream
from qwen3_tts_gguf.engine.text_sources import FedText, FixedText
from qwen3_tts_gguf.host import heap
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import ContextLengthExceeded, Prompt, PromptError
from qwen3_tts_gguf.model.talker import Talker
from qwen3_tts_gguf.text.normalization import NormalizedText, normalize_text

log = logging.getLogger("qwen3_tts_gguf.engine")

IDLE_TRIM_S = 2.0
"""Seconds without streams after which the engine gives the heap they freed back (`heap.release_freed_heap`)."""


class Engine(Iteration):
    """Owns a LoadedModel on a worker thread; `submit` requests, iterate their streams.

    The worker's parts, objects that own their state: the queues, slots and KV reservations
    (`admission.Admission`: `self.admission`), the voice prefixes (`prefix_cache.PrefixCache`: `self.prefixes`),
    the codec and its lanes (`audio_out.AudioOut`: `self.audio`), the end of a stream and fault containment
    (`faults.StreamEnds`: `self.ends`). One step of every stream over them is `iteration.py`, read apart; this
    module holds the lifecycle, the public calls and the worker loop."""

    # -- lifecycle -------------------------------------------------------------------------------
    def __init__(self, model: LoadedModel):
        self.model = model
        self.settings = model.settings
        self.admission = Admission(model, lambda *a: self.ends.end_unstarted(*a),
                                   lambda stream, error: self.ends.admission_failed(stream, error))
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._failure: str | None = None
        self._dead: str | None = None
        self._restarts = 0
        self.heartbeat = time.monotonic()
        """Updated by the worker at least every 0.25 s while it is not inside one model call."""
        self.stats = {"iterations": 0, "frames": 0, "streams_done": 0, "cancelled": 0, "errors": 0,
                      "prefix_hits": 0, "prefixes_warmed": 0, "paused": 0,
                      **{f"runaway_{kind}_{action}": 0 for kind, action in RUNAWAY_COUNTS}}
        self.prefixes = PrefixCache(model.talker,
                                    self.settings.prefix_cache if Talker.prefix_slots(model.talker.settings) else 0,
                                    scratch_seq=self.settings.max_streams, counts=self.stats, name=model.name)
        self._prompt_pool: ThreadPoolExecutor | None = None  # later segments' prompts, built off both threads
        self.audio = AudioOut(model.codec, self.admission, lambda: self.clock(), self._notify,
                              lambda *a: self.ends.fault(*a), lambda: self.ends.count_error())
        self.ends = StreamEnds(model.talker, self.admission, self.audio, self.prefixes, self.stats, model.name)
        self._heap_used = False  # streams ran since the heap was last given back (_give_back_heap_when_idle)
        self._lanes_drained: list[Future] | None = None  # the codec lanes' jobs queued before going idle
        self._idle_since: float | None = None  # when those were done
        self.clock = time.monotonic
        """The chunk plans' clock (a test may drive it)."""

    def start(self) -> "Engine":
        if self._thread is None:
            self._stopping = False
            self._failure = None
            self._prompt_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwen3-tts-prompts")
            if self.model.codec_overlap:
                self.audio.start(self.model.stage_threads.codec_lanes)
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
        self.audio.stop(wait=self._dead is None)

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

    # -- requests --------------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest, loop: asyncio.AbstractEventLoop | None = None) -> Stream:
        """Validate and queue a request. Raises PromptError for bad input (ContextLengthExceeded
        when it cannot fit one stream's context), EngineBusy when full, EngineStopped."""
        self._check_request(request)
        text_mode = request.text_mode or self.model.manifest.default_text_mode
        builder = self.model.prompts
        fixed = builder.fixed_rows(request.voice)  # also validates the voice
        spoken = (normalize_text(request.text, request.voice.language) if request.text_normalization == "auto"
                  else NormalizedText.plain(request.text))
        segments, tokens = self.admission.fit_segments(spoken.text, fixed)

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
        if text.prefill_len() + self.admission.min_frames(1) > self.model.talker.cells_per_stream:
            raise ContextLengthExceeded(self.admission.too_long(text.prefill_len()), param="instructions")
        return self._enqueue(self._new_stream(request, text, loop))

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

    def _enqueue(self, stream: Stream) -> Stream:
        with self._wake:
            self.admission.enqueue(stream)
            self._wake.notify_all()
        return stream

    def _new_stream(self, request: SynthesisRequest, text, loop) -> Stream:
        backlog = int(self.settings.max_buffered_audio_s * self.model.sample_rate)
        return Stream(request, text, loop, wake=self._notify, max_backlog_samples=backlog)

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    @property
    def prefix_slots(self) -> int:
        """Voice prefixes the engine keeps prefilled (0 in the deterministic profile)."""
        return self.prefixes.room

    def clear_prefix_cache(self) -> None:
        """Forget every cached voice prefix (the engine thread drops them before it admits the next
        request), e.g. to measure a voice's first request."""
        with self._wake:
            self.prefixes.clear()
            self._wake.notify_all()

    @property
    def running(self) -> bool:
        return self.health().ok

    def load(self) -> dict:
        """Active streams, waiting requests, live streams waiting for text, paused streams and free
        slots (for health and metrics)."""
        with self._wake:
            return {"active": len(self.admission.active), "waiting": len(self.admission.waiting),
                    "waiting_text": len(self.admission.waiting_text), "free_slots": len(self.admission.free_seqs),
                    "paused": sum(a.stream.paused for a in self.admission.active.values())}

    # -- worker ----------------------------------------------------------------------------------
    def _runnable(self) -> bool:
        if any(s.cancelled for s in self.admission.waiting_text):
            return True
        if self.prefixes.untried(self.admission.waiting_text):
            return True
        if any(a.codec_fault is not None or (not a.codec_busy and a.frames_due(self.clock()))
               for a in self.admission.active.values()):
            return True
        if self.admission.may_admit():
            return True
        return any(a.stream.cancelled or a.logits is None or self._can_step(a) for a in self.admission.active.values())

    def _give_back_heap_when_idle(self) -> None:
        """Once no stream is left and the codec lanes' last calls have been done for IDLE_TRIM_S, the heap
        that the streams' calls freed goes back to the system (glibc keeps it otherwise: about 100 MiB
        after eight 0.6B streams), on the prompt thread (it takes ~10 ms). Not at once: a request that
        follows at once would fault those pages in again before its first audio."""
        if not self._heap_used or not self.admission.idle() or not self._prompt_pool:
            self._lanes_drained = self._idle_since = None
            return
        if self._lanes_drained is None:
            self._lanes_drained = self.audio.drained()
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
        cancelled, moved = self.admission.sweep()
        for stream in cancelled:
            self.prefixes.stream_left(stream)
            self.ends.end_unstarted(stream, "cancelled")
        for stream in moved:
            self.prefixes.stream_left(stream)

    def _died(self, reason: str) -> None:
        with self._wake:
            self._failure = reason
            self.ends.end_all("error", "the engine failed; retry", retryable=True)

    def _reset_state(self) -> None:
        """After a failure: every KV cell, slot, cached prefix and decoder state forgotten."""
        self.model.talker.clear()
        self.admission.reset()
        self.prefixes.reset()
        self.audio.reset()

    def _worker(self) -> None:
        try:
            self._run()
        except BaseException as e:  # the loop itself broke: fail everything, let the supervisor restart
            log.exception("the engine worker of %s died", self.model.name)
            self._died(f"the engine worker stopped unexpectedly ({type(e).__name__})")

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
                self.prefixes.forget_if_asked()
                admitted = self.admission.admit()
                unwarmed = self.prefixes.unwarmed(self.admission.waiting_text)
            try:
                self.prefixes.warm(unwarmed, self.admission.free_cells)
                self._iterate(admitted)
                self._heap_used = True
            except Exception:  # a bug outside any one stream's work: its state is unknown, start clean
                log.exception("engine iteration of %s failed; ending its streams", self.model.name)
                with self._wake:
                    for act in list(self.admission.active.values()):
                        self.ends.finish(act, "error", error="the engine failed while serving this stream; retry",
                                         flush=False, retryable=True)
                    self._reset_state()
        self.ends.end_all("cancelled")


__all__ = ["Engine", "EngineBusy", "EngineHealth", "EngineStopped", "Stream"]
