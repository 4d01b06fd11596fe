"""Fault containment and the end of a stream (`StreamEnds`, the engine's `self.ends`): a failure ends its own
stream, logged and counted, its client told which stage failed; an ended stream frees its KV cells and slot at
once and gets its last audio and its result after every chunk before them; a worker that stops or dies ends
them all.
"""

from __future__ import annotations

import logging
import threading

from qwen3_tts_gguf.engine.active import ActiveStream, StreamFault
from qwen3_tts_gguf.engine.admission import Admission
from qwen3_tts_gguf.engine.audio_out import AudioOut
from qwen3_tts_gguf.engine.prefix_cache import PrefixCache
from qwen3_tts_gguf.engine.request import SynthesisResult
from qwen3_tts_gguf.engine.stream import Stream
from qwen3_tts_gguf.model.talker import Talker

log = logging.getLogger("qwen3_tts_gguf.engine")


class StreamEnds:
    """Ends streams, one or all, over the engine's parts. `counts` is the engine's stats dict (streams done,
    cancelled, errors: the codec lanes count errors too, under a lock)."""

    def __init__(self, talker: Talker, admission: Admission, audio: AudioOut, prefixes: PrefixCache,
                 counts: dict[str, int], name: str = ""):
        self.talker = talker
        self.admission = admission
        self.audio = audio
        self.prefixes = prefixes
        self.name = name  # the model's, for the log
        self._counts = counts
        self._lock = threading.Lock()

    def fault(self, stage: str, error: BaseException, act: ActiveStream | None = None) -> StreamFault:
        """`error` logged as the failure of `stage` in `act`'s stream; the fault that ends it."""
        log.error("stream %s of %s: the %s failed", act.stream.id if act else "?", self.name, stage,
                  exc_info=(type(error), error, error.__traceback__))
        return StreamFault(stage)

    def count_error(self) -> None:
        with self._lock:
            self._counts["errors"] += 1

    def fail(self, act: ActiveStream, fault: StreamFault) -> None:
        """End `act`'s stream as an error of `fault`'s stage."""
        self.count_error()
        self.finish(act, "error", error=f"the {fault.stage} failed for this stream", flush=False)

    def finish(self, act: ActiveStream, reason: str, error: str | None = None, flush: bool = True,
               retryable: bool = False) -> None:
        """End a stream: its cells and slot freed here; its last audio (when `flush`) and result after
        every chunk before them (in its codec lane when the codec overlaps)."""
        self.talker.drop(act.seq)
        self.admission.release(act)
        act.text.cancel()
        self._counts["streams_done"] += 1
        if reason == "cancelled":
            self._counts["cancelled"] += 1
        frames, act.pending = (act.pending if flush else []), []
        self.audio.conclude(act, reason, error, frames, retryable)

    def end_unstarted(self, stream: Stream, reason: str, error: str | None = None, retryable: bool = False) -> None:
        """End a stream that never had a slot."""
        stream.text.cancel()
        text = stream.text
        stream.put(SynthesisResult(0, text.text_tokens, reason, error=error, retryable=retryable,
                                   progress=text.final_progress(reason, started=False),
                                   text_chars=text.raw_chars, normalized_chars=text.normalized_chars))

    def admission_failed(self, stream: Stream, error: Exception) -> None:
        """A queued stream whose own state could not be set up: it alone ends."""
        self.fault("admission", error)
        self.count_error()
        self.end_unstarted(stream, "error", "the admission failed for this stream")

    def end_all(self, reason: str, error: str | None = None, retryable: bool = False) -> None:
        """End every running and waiting stream (the worker is stopping or died)."""
        for act in list(self.admission.active.values()):
            self.finish(act, reason, error=error, flush=False, retryable=retryable)
        for stream in self.admission.take_waiting():
            self.end_unstarted(stream, reason, error, retryable=retryable)
        self.prefixes.streams_gone()
