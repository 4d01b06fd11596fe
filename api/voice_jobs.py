"""Voice cloning and design, off the speech path: a few threads of their own and a short queue.

A job (`run`) takes a worker thread (`limits.voice_workers`) or waits for one; at most
`limits.voice_queue` wait, and more get 429 `queue_full`. While the job runs, the request watches its
connection: a client that leaves cancels it (a job still waiting never starts; a running one is
told through its `Cancellation`, which stops a design's engine stream at once and skips the steps
after the current one) and `run` raises `ClientGone`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from starlette.requests import HTTPConnection, Request
from starlette.types import Receive

from qwen3_tts_gguf.voicebank.design import Cancellation

from api.errors import RATE_LIMIT, APIError, unavailable

T = TypeVar("T")
RETRY_AFTER_S = 2


class ClientGone(Exception):
    """The client disconnected while its voice job waited or ran; the job was cancelled."""


def voice_jobs_busy(capacity: int) -> APIError:
    """429: every voice worker is busy and the voice queue is full."""
    return APIError(f"Voice cloning is busy ({capacity} jobs are running or waiting); retry shortly.",
                    status_code=429, type=RATE_LIMIT, code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


async def _disconnected(receive: Receive) -> None:
    """Returns once the client is gone (call after the request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class VoiceJobs:
    """`workers` threads for voice jobs, at most `queue` more jobs waiting."""

    def __init__(self, workers: int, queue: int):
        self.capacity = workers + queue
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qtts-voice")
        self._lock = threading.Lock()
        self._jobs = 0
        self._closed = False

    @property
    def jobs(self) -> int:
        """Jobs running or waiting now."""
        return self._jobs

    def _take(self) -> bool:
        with self._lock:
            if self._jobs >= self.capacity:
                return False
            self._jobs += 1
            return True

    def _give_back(self, *_: object) -> None:
        with self._lock:
            self._jobs -= 1

    async def run(self, job: Callable[[Cancellation], T], request: Request) -> T:
        """Run `job(cancellation)` on a voice thread; its result, or its exception.

        APIError 429 when full, 503 while the server stops; ClientGone when the client leaves.
        """
        if self._closed:
            raise unavailable("The server is stopping.", retry_after_s=RETRY_AFTER_S)
        if not self._take():
            raise voice_jobs_busy(self.capacity)
        cancel = Cancellation()
        try:
            future = self._pool.submit(job, cancel)
        except RuntimeError:  # shut down meanwhile
            self._give_back()
            raise unavailable("The server is stopping.", retry_after_s=RETRY_AFTER_S) from None
        future.add_done_callback(self._give_back)  # also when cancelled before it ran
        result = asyncio.wrap_future(future)
        result.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "exception never retrieved"
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait((result, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cancel.set()
            future.cancel()
            raise
        finally:
            gone.cancel()
        if not result.done():
            cancel.set()
            future.cancel()
            raise ClientGone()
        return result.result()

    def close(self) -> None:
        """Refuse new jobs, drop waiting ones, wait for the running ones (their engines stop first)."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)


def voice_jobs_of(conn: HTTPConnection) -> VoiceJobs:
    return conn.app.state.voice_jobs
