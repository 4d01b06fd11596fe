"""Audio out: frames to the codec (here, or in the stream's codec lane when the codec overlaps), chunks to the
stream, its result after its last chunk (`AudioOut`, the engine's `self.audio`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from qwen3_tts_gguf.engine.active import ActiveStream
from qwen3_tts_gguf.engine.admission import Admission
from qwen3_tts_gguf.engine.request import AudioChunk, SynthesisResult
from qwen3_tts_gguf.model.codec import CodecState, split_states, stack_states


class AudioOut:
    """Frames to the codec, chunks to their streams, each stream's result after its last chunk: here (on the
    worker thread), or in the codec lanes, threads of their own, when the codec overlaps (`start(lanes)`).

    `clock` is the chunk plans' clock; `notify` wakes the worker; `fault(stage, error, act)` logs a stream's
    failure and `count_error()` counts one (the engine's)."""

    def __init__(self, codec, admission: Admission, clock: Callable[[], float], notify: Callable[[], None],
                 fault: Callable[..., object], count_error: Callable[[], None]):
        self.codec = codec
        self.admission = admission
        self.clock = clock
        self.lanes: list[ThreadPoolExecutor] = []  # the overlapped codec: one thread each, jobs in order
        # a codec that decodes several streams in one call (the ggml codec) gets the frames due in one iteration
        # together, in the first lane (`flush_due`)
        self.batches = bool(getattr(codec, "batches_streams", False))
        self._due: list = []
        self._primed: dict[str, CodecState] = {}
        self._primed_lock = threading.Lock()
        self._notify = notify
        self._fault = fault
        self._count_error = count_error

    # -- lanes ---------------------------------------------------------------------------------------
    def start(self, lanes: int) -> None:
        if lanes and not self.lanes:
            self.lanes = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"qwen3-tts-codec-{i}")
                          for i in range(lanes)]

    def stop(self, wait: bool) -> None:
        """The streams' last chunks and results are in the lanes: delivered (`wait`) unless a call there is stuck."""
        for lane in self.lanes:
            lane.shutdown(wait=wait)
        self.lanes = []

    def drained(self) -> list[Future]:
        """Futures done once every job queued in the lanes so far is."""
        return [lane.submit(lambda: None) for lane in self.lanes]

    def in_flight(self) -> bool:
        """Whether a codec call of any active stream is queued or running in its lane."""
        return any(a.codec_busy for a in self.admission.active.values())

    def reset(self) -> None:
        """After a failure: no primed decoder state kept."""
        with self._primed_lock:
            self._primed.clear()

    def _primed_state(self, codes: np.ndarray) -> CodecState:
        """Decoder state after an in-context clone's reference codes (audio discarded; cached)."""
        codes = np.ascontiguousarray(codes, np.int64)
        key = hashlib.sha1(codes.tobytes()).hexdigest()
        with self._primed_lock:
            state = self._primed.pop(key, None)
        if state is None:
            _, state = self.codec.decode(codes)
        with self._primed_lock:
            self._primed[key] = state  # most recently used last
            while len(self._primed) > 8:
                self._primed.pop(next(iter(self._primed)))
        return state

    def emit(self, act: ActiveStream, n: int, fail: Callable[[ActiveStream, BaseException], None]) -> None:
        """The stream's first `n` pending frames to the codec: here, or queued in its codec lane (unless
        a call of this stream is still there: then they wait and join the next one). A stream's first
        chunk is decoded here, with the cores to itself: overlapped, it came 0.03-0.13 s later. `fail` ends a stream
        whose call here failed."""
        if not self.lanes or act.chunks.start is None:  # the first chunk: at once, for first audio
            frames, act.pending = act.pending[:n], act.pending[n:]
            try:
                self.emit_audio(act, frames)
            except Exception as e:
                fail(act, e)
            return
        if act.codec_busy:
            return
        frames, act.pending = act.pending[:n], act.pending[n:]
        act.codec_busy = True
        if self.batches:
            self._due.append((act, frames))  # one call for all of them: `flush_due`, after this iteration's
        else:
            self._lane(act).submit(self._codec_job, act, frames)

    def flush_due(self) -> None:
        """The frames `emit` gathered this iteration, as one job: a codec that decodes several streams in one
        call (`codec.batches_streams`: the ggml codec) is called once for all of them."""
        if self._due:
            due, self._due = self._due, []
            self._lane(due[0][0]).submit(self._codec_batch_job, due)

    def _lane(self, act: ActiveStream) -> ThreadPoolExecutor:
        """The stream's codec lane: given at its first call, the lane with the fewest running streams (the
        first lane for every stream when calls batch streams); all its calls and its result go through that
        one, so they stay in order."""
        if act.codec_lane is None:
            load = [0] * len(self.lanes)
            for other in self.admission.active.values():
                if other.codec_lane is not None:
                    load[other.codec_lane] += 1
            act.codec_lane = 0 if self.batches else load.index(min(load))
        return self.lanes[act.codec_lane]

    def _codec_job(self, act: ActiveStream, frames: list) -> None:
        """In the stream's codec lane: one call; a failure is left for the engine, which ends the stream."""
        try:
            if act.codec_fault is None and not act.stream.cancelled:
                self.emit_audio(act, frames)
        except Exception as e:
            act.codec_fault = e
        finally:
            act.codec_busy = False
            self._notify()

    def _codec_batch_job(self, due: list) -> None:
        """In the first codec lane: the due streams whose frames make one call each, decoded together by
        frame count; a stream whose frames need several calls (a seeded grid), and every stream of a batched
        call that failed, one at a time (only the culprit fails)."""
        try:
            live = [(a, f) for a, f in due if a.codec_fault is None and not a.stream.cancelled]
            alone, groups = [], {}
            for act, frames in live:
                if len(act.chunks.calls(act.decoded_frames, len(frames))) == 1:
                    groups.setdefault(len(frames), []).append((act, frames))
                else:
                    alone.append((act, frames))
            for group in groups.values():
                if len(group) == 1:
                    alone.extend(group)
                    continue
                try:
                    self._emit_audio_together(group)
                except Exception:
                    alone.extend(group)
            for act, frames in alone:
                try:
                    self.emit_audio(act, frames)
                except Exception as e:
                    act.codec_fault = e
        finally:
            for act, _ in due:
                act.codec_busy = False
            self._notify()

    def _emit_audio_together(self, group: list) -> None:
        """Streams' frames of one count in one codec call; nothing is delivered unless every row is sound."""
        t0, started = time.perf_counter(), self.clock()
        codec = self.codec
        states = [self._codec_state(act) or codec.new_state() for act, _ in group]
        wav, state = codec.decode(np.stack([np.stack(frames) for _, frames in group]), stack_states(states))
        if not np.isfinite(wav).all():
            raise FloatingPointError("the codec made non-finite samples")
        seconds = (time.perf_counter() - t0) / len(group)
        for (act, frames), row, row_state in zip(group, wav, split_states(state)):
            act.codec_state = row_state
            self._deliver(act, row, len(frames), seconds, started)

    def _codec_state(self, act: ActiveStream) -> CodecState | None:
        """The stream's decoder state; before its first frame, a cloned voice's reference codes primed in."""
        reference = act.stream.request.voice.reference
        if act.codec_state is None and reference is not None:
            # the reference frames are the decoder's left context: the first frame already has it
            act.codec_state = self._primed_state(reference.codes)
        return act.codec_state

    def emit_audio(self, act: ActiveStream, frames: list) -> None:
        frames = np.stack(frames)
        t0, started = time.perf_counter(), self.clock()
        self._codec_state(act)
        parts, at = [], 0
        for size in act.chunks.calls(act.decoded_frames, len(frames)):  # (one, or the seeded grid's)
            wav, act.codec_state = self.codec.decode(frames[at:at + size], act.codec_state)
            parts.append(wav)
            at += size
        wav = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if not np.isfinite(wav).all():
            raise FloatingPointError("the codec made non-finite samples")
        self._deliver(act, wav, len(frames), time.perf_counter() - t0, started)

    def _deliver(self, act: ActiveStream, wav: np.ndarray, n_frames: int, seconds: float, started: float) -> None:
        """A decoded chunk to its stream: timings, the chunk plan, the chunk itself."""
        act.timings["codec_s"] += seconds
        now = self.clock()
        act.chunks.emitted(n_frames, now - started, now)
        if act.stream.first_audio_at is None:
            act.stream.first_audio_at = time.monotonic()
        act.stream.put(AudioChunk(samples=wav, first_frame=act.decoded_frames, n_frames=n_frames,
                                   progress=act.text.progress))
        act.decoded_frames += n_frames

    def conclude(self, act: ActiveStream, reason: str, error: str | None, frames: list, retryable: bool) -> None:
        """A finished stream's last frames (`frames`) and its result, after every chunk before them: in its codec
        lane when the codec overlaps, else here."""
        if self.lanes:
            self._lane(act).submit(self._conclude, act, reason, error, frames, retryable)
        else:
            self._conclude(act, reason, error, frames, retryable)

    def _conclude(self, act: ActiveStream, reason: str, error: str | None, frames: list, retryable: bool) -> None:
        # an overlapped call that failed after the last step ends the stream as an error, its last frames unsaid
        fault = act.codec_fault if reason != "error" else None
        if fault is None and frames:
            try:
                self.emit_audio(act, frames)
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
        stream.put(SynthesisResult(frames=len(act.codes), text_tokens=text.text_tokens,
                                    finish_reason=reason, codes=codes, error=error, timings=timings,
                                    retryable=retryable, progress=text.final_progress(reason),
                                    text_chars=text.raw_chars, normalized_chars=text.normalized_chars,
                                    runaway=[e.as_dict() for e in act.guard.events]))
