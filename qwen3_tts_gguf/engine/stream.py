"""The consumer's handle on one request: audio chunks out, live text in, a bounded backlog.

The engine thread puts AudioChunks and, last, one SynthesisResult on the stream's queue; the
consumer iterates (sync or async). The queue is bounded in audio, not in items: the engine asks
`backlogged()` before it steps a stream and leaves it paused while the reader is more than
`max_backlog_s` of audio behind, so a client that never reads holds a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable

from qwen3_tts_gguf.engine.request import AudioChunk, SynthesisRequest, SynthesisResult
from qwen3_tts_gguf.engine.text_sources import FedText, TextSource
from qwen3_tts_gguf.model.prompt import Prompt

_DONE_LOCK = threading.Lock()


class Stream:
    """Iterate (sync or async) for AudioChunks, then read `.result`.

    Streams opened with `Engine.open_text_stream` also take text: `push_text(delta)`, `close_text()`.
    """

    _ids = itertools.count(1)

    def __init__(self, request: SynthesisRequest, text: TextSource, loop: asyncio.AbstractEventLoop | None,
                 wake: Callable[[], None] | None = None, max_backlog_samples: int | None = None):
        self.id = next(self._ids)
        self._wake = wake  # tells the engine something changed (a cancel, a reader catching up)
        self.request = request
        self.text = text
        self.result: SynthesisResult | None = None
        """The result, once the consumer has read it (after the last chunk)."""
        self.result_sent: SynthesisResult | None = None
        """The result, as soon as the engine produced it."""
        self.submitted_at = time.monotonic()
        self.first_audio_at: float | None = None
        self._cancel = threading.Event()
        self._loop = loop
        self._queue: asyncio.Queue | queue.Queue = asyncio.Queue() if loop else queue.Queue()
        self._done_callbacks: list[Callable[[SynthesisResult], None]] = []
        # samples put and taken: each counter is written by one thread only, so no lock is needed
        self._samples_put = 0
        self._samples_taken = 0
        self._max_backlog = max_backlog_samples
        self.paused = False
        """Set by the engine while it leaves this stream unstepped for its reader to catch up."""

    @property
    def prompts(self) -> list[Prompt]:
        """The segment prompts of a fixed-text stream."""
        return self.text.prompts

    def add_done_callback(self, fn: Callable[[SynthesisResult], None]) -> None:
        """Call `fn(result)` once the stream has ended, whatever ended it (on the engine thread, or
        at once when it has ended already). Used to release what a stream held (client caps)."""
        with _DONE_LOCK:
            if self.result_sent is None:
                self._done_callbacks.append(fn)
                return
        fn(self.result_sent)

    # -- text input (live streams) ----------------------------------------------------------
    def push_text(self, delta: str) -> None:
        """Append text to a live stream; it is spoken as soon as its tokenization is final (with
        normalization on, once it is normalized: on a worker thread, so this stays cheap)."""
        self._fed().push(delta)

    def close_text(self) -> None:
        """No more text: the stream finishes speaking what it has."""
        self._fed().close()

    def _fed(self) -> FedText:
        if not isinstance(self.text, FedText):
            raise TypeError("this stream's text was given up front")
        return self.text

    # -- backlog ------------------------------------------------------------------------------
    @property
    def backlog_samples(self) -> int:
        """Audio made but not yet taken by the consumer."""
        return self._samples_put - self._samples_taken

    def backlogged(self) -> bool:
        """Whether the reader is too far behind for the engine to make more audio now."""
        return self._max_backlog is not None and self.backlog_samples > self._max_backlog

    def _taken(self, event) -> None:
        if isinstance(event, AudioChunk):
            self._samples_taken += len(event.samples)
            if self.paused and not self.backlogged() and self._wake is not None:
                self._wake()

    # -- producer side (engine thread) ------------------------------------------------------
    def put(self, event: AudioChunk | SynthesisResult) -> None:
        """The engine hands the stream its next chunk, or its result (last)."""
        if isinstance(event, AudioChunk):
            self._samples_put += len(event.samples)
        else:
            with _DONE_LOCK:
                self.result_sent = event
                callbacks, self._done_callbacks = self._done_callbacks, []
            for fn in callbacks:
                try:
                    fn(event)
                except Exception:  # a consumer's callback must not break the engine
                    pass
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
        if self._wake is not None:
            self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def __iter__(self):
        assert isinstance(self._queue, queue.Queue), "created with an event loop: use `async for`"
        while True:
            event = self._queue.get()
            self._taken(event)
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
            self._taken(event)
            if isinstance(event, SynthesisResult):
                self.result = event
                return
            yield event
