"""Fault containment: a failure ends its own stream; a worker that dies ends them all, and the
state is reset.
"""

from __future__ import annotations

import logging

from qwen3_tts_gguf.engine.active import ActiveStream, StreamFault
from qwen3_tts_gguf.engine.request import SynthesisResult
from qwen3_tts_gguf.engine.stream import Stream

log = logging.getLogger("qwen3_tts_gguf.engine")


class Faults:
    """Part of `Engine` (`scheduler.py`): these methods run on its worker thread, on its state."""

    def _fault(self, stage: str, error: BaseException, act: ActiveStream | None = None) -> StreamFault:
        log.error("stream %s of %s: the %s failed", act.stream.id if act else "?", self.model.name, stage,
                  exc_info=(type(error), error, error.__traceback__))
        return StreamFault(stage)

    def _count_error(self) -> None:
        with self._stats_lock:
            self.stats["errors"] += 1

    def _fail(self, act: ActiveStream, fault: StreamFault) -> None:
        self._count_error()
        self._finish(act, "error", error=f"the {fault.stage} failed for this stream", flush=False)

    def _died(self, reason: str) -> None:
        with self._wake:
            self._failure = reason
            self._end_all("error", "the engine failed; retry", retryable=True)

    def _end_all(self, reason: str, error: str | None = None, retryable: bool = False) -> None:
        """End every running and waiting stream (the worker is stopping or died)."""
        for act in list(self.admission.active.values()):
            self._finish(act, reason, error=error, flush=False, retryable=retryable)
        for stream in [*self.admission.waiting, *self.admission.waiting_text]:
            self._end_unstarted(stream, reason, error, retryable=retryable)
        self.admission.waiting.clear()
        self.admission.waiting_text.clear()
        self.prefixes.streams_gone()

    def _admission_failed(self, stream: Stream, error: Exception) -> None:
        """A queued stream whose own state could not be set up: it alone ends."""
        self._fault("admission", error)
        self._count_error()
        self._end_unstarted(stream, "error", "the admission failed for this stream")

    def _end_unstarted(self, stream: Stream, reason: str, error: str | None = None,
                       retryable: bool = False) -> None:
        stream.text.cancel()
        text = stream.text
        stream.put(SynthesisResult(0, text.text_tokens, reason, error=error, retryable=retryable,
                                    progress=text.final_progress(reason, started=False),
                                    text_chars=text.raw_chars, normalized_chars=text.normalized_chars))

    def _reset_state(self) -> None:
        """After a failure: every KV cell, slot, cached prefix and decoder state forgotten."""
        self.model.talker.clear()
        self.admission.reset()
        self.prefixes.reset()
        self.audio.reset()
