"""The blocking client: HTTP with urllib directly; live utterances run the asyncio client on a private
event loop thread (one per `Client`, started on first use, stopped by `close()`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Awaitable, Callable, Optional, Tuple, TypeVar

from . import _http
from .aio import AsyncClient, AsyncSpeechSocket, AsyncUtterance
from .types import Capabilities, Done, Event, Started

T = TypeVar("T")
_END: Any = object()


class _LoopThread:
    """An asyncio loop on a daemon thread; `run` waits for one coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="qtts-client-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("the sync client cannot be used from its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def call(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on the loop thread soon (no waiting)."""
        self.loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_closed():
            return
        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class Client:
    """A Qwen3-TTS-X server, blocking API; the same arguments as `AsyncClient`. Use as a context
    manager (or call `close()`) when it ran live utterances: that stops its loop thread."""

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0,
                 proxy: Optional[str] = None, key_in_query: bool = False, verify: _http.Verify = True):
        self._async = AsyncClient(base_url, api_key, timeout=timeout, proxy=proxy, key_in_query=key_in_query,
                                  verify=verify)
        self._loop: Optional[_LoopThread] = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> _http.Endpoint:
        return self._async.endpoint

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()

    def _runner(self) -> _LoopThread:
        with self._lock:
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    # -- HTTP -------------------------------------------------------------------------------------
    def capabilities(self, refresh: bool = False) -> Capabilities:
        """GET /v1/capabilities (remembered; `refresh=True` reads it again)."""
        return self._async._fetch_capabilities(refresh)

    def speak(self, text: str, voice: Any, format: str = "wav", model: Optional[str] = None, **fields: Any) -> bytes:
        """The whole audio file of `text` (POST /v1/audio/speech); see `AsyncClient.speak`."""
        return self._async._speak(text, voice, format, model, fields)

    # -- WebSocket --------------------------------------------------------------------------------
    def connect(self) -> SpeechSocket:
        """One `/v1/ws` connection for any number of utterances (a context manager)."""
        runner = self._runner()
        socket = self._async.connect()
        runner.run(socket.open())
        return SpeechSocket(socket, runner)

    def stream(self, voice: Any, **options: Any) -> Utterance:
        """One utterance on its own connection (a context manager; closing it closes the connection).
        Options as `AsyncSpeechSocket.start`."""
        socket = self.connect()
        try:
            utterance = socket.start(voice, **options)
        except BaseException:
            socket.close()
            raise
        utterance._owned_socket = socket
        return utterance

    def stream_text(self, deltas: Iterable[str], voice: Any, **options: Any) -> Iterator[Event]:
        """Speak text as it is produced: feeds `deltas` (read on a worker thread), yields events to `Done`."""
        runner = self._runner()
        events = self._async.stream_text(deltas, voice, **options)

        async def next_event() -> Any:
            try:
                return await events.__anext__()
            except StopAsyncIteration:
                return _END

        try:
            while (event := runner.run(next_event())) is not _END:
                yield event
        finally:
            runner.run(events.aclose())


class SpeechSocket:
    """Blocking face of `AsyncSpeechSocket`."""

    def __init__(self, socket: AsyncSpeechSocket, runner: _LoopThread):
        self._async = socket
        self._runner = runner

    def __enter__(self) -> SpeechSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, voice: Any, **options: Any) -> Utterance:
        """Open an utterance; see `AsyncSpeechSocket.start`."""
        return Utterance(self._runner.run(self._async.start(voice, **options)), self._runner)

    def close(self) -> None:
        self._runner.run(self._async.close())


class Utterance:
    """Blocking face of `AsyncUtterance`: `send_text`, `finish`, `cancel`, iterate events, `collect`.

    `send_text` may be called from another thread while this one iterates.
    """

    def __init__(self, utterance: AsyncUtterance, runner: _LoopThread):
        self._async = utterance
        self._runner = runner
        self._owned_socket: Optional[SpeechSocket] = None

    @property
    def started(self) -> Started:
        return self._async.started

    @property
    def id(self) -> str:
        return self._async.id

    @property
    def done(self) -> Optional[Done]:
        return self._async.done

    @property
    def audio_bytes(self) -> int:
        return self._async.audio_bytes

    @property
    def resume_token(self) -> Optional[str]:
        return self._async.resume_token

    @property
    def finished(self) -> bool:
        return self._async.finished

    def __enter__(self) -> Utterance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel when not finished (then read to `Done`); close the connection `Client.stream` opened."""
        try:
            if not self._async.finished:
                self._runner.run(self._async.abort())
        finally:
            if self._owned_socket is not None:
                self._owned_socket.close()

    def send_text(self, text: str) -> None:
        self._runner.run(self._async.send_text(text))

    def finish(self) -> None:
        self._runner.run(self._async.finish())

    def cancel(self) -> None:
        self._runner.run(self._async.cancel())

    def collect(self) -> Tuple[bytes, Done]:
        """Read to the end: (all the audio, Done)."""
        return self._runner.run(self._async.collect())

    def __iter__(self) -> Utterance:
        return self

    def __next__(self) -> Event:
        event = self._runner.run(_next(self._async))
        if event is _END:
            raise StopIteration
        return event


async def _next(utterance: AsyncUtterance) -> Any:
    try:
        return await utterance.__anext__()
    except StopAsyncIteration:
        return _END


def speak(text: str, voice: Any, format: str = "wav", model: Optional[str] = None, *,
          base_url: Optional[str] = None, api_key: Optional[str] = None, timeout: float = 60.0,
          verify: _http.Verify = True, **fields: Any) -> bytes:
    """One-shot `Client(base_url, api_key).speak(...)`."""
    return Client(base_url, api_key, timeout=timeout, verify=verify).speak(text, voice, format, model, **fields)


def capabilities(base_url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = 60.0, verify: _http.Verify = True) -> Capabilities:
    """One-shot `Client(base_url, api_key).capabilities()`."""
    return Client(base_url, api_key, timeout=timeout, verify=verify).capabilities()
