"""Wyoming, Home Assistant's voice protocol, on a TCP port of its own (`serve --wyoming-port 10200`).

A thin adapter beside the WebSocket protocols: its events become the same speech plan
(`speaking/start.plan_request`), utterance and audio pump (`utterance.py`) and the same limits as `/v1/ws`.
The `wyoming` package gives the events; the reader here bounds what a client may send.

    describe                                   -> info: one TTS program, every voice of /v1/audio/voices
    synthesize {text, voice}                   -> audio-start, audio-chunk ..., audio-stop
    synthesize-start {voice}, synthesize-chunk {text} ..., synthesize (ignored), synthesize-stop
                                               -> audio-start, audio-chunk ... (while the text comes),
                                                  audio-stop, synthesize-stopped
    ping                                       -> pong

Audio is 16-bit PCM, mono, at the model's rate (24 kHz). `voice.name` is any voice `/v1/audio/voices`
lists (a speaker, an OpenAI name, a profile); without one, `voice.language` ("en", "en-US", ...)
picks the language and the first voice of the default model speaks. A synthesis that cannot run or
fails is answered with an `error` event {text, code: OpenAI's error code} and the connection closes:
a Wyoming client waits for `audio-stop` or `synthesize-stopped`, and Home Assistant takes the close
as the failed synthesis. Other event types are ignored, as Wyoming servers do.

Wyoming has no authentication: the port listens where `--wyoming-host` says (default `--host`), and
the API key does not apply to it. Limits (`api/limits.py`, shared with the WebSockets): the
connection counts toward `max_sockets` / `max_sockets_per_client`; an event's line and data at most
`ws_max_message_bytes` each, a payload at most that too (a TTS client sends none); a connection with
no synthesis running that sends nothing for `ws_idle_timeout_s` is closed, a streamed synthesis
follows `/v1/ws`'s idle and length limits (`ws_max_session_chars`, `ws_max_session_s`); a client that
reads none of its audio for `send_timeout_s` is cut off. While the server drains, a new synthesis
gets an `error` (code `unavailable`), and the drain waits for the running ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from qwen3_tts_gguf import __version__

from api.errors import APIError, invalid_request
from api.ops.clients import UNKNOWN_CLIENT, Client
from api.ops.lifecycle import PROCESS
from api.protocols.base import socket_counts
from api.speaking.plan import LIVE_TEXT, SpeechPlan, speech_body
from api.speaking.start import plan_request
from api.speaking.utterance import Ending, Utterance, open_utterance, pump, record, settle, start_watch
from api.state import AppState
from api.voice_resolution import LANGUAGE_CODES, language_of, voice_entries

log = logging.getLogger("api.protocols.wyoming")

ROUTE = "wyoming"
PROGRAM = "qwen3-tts-x"
ATTRIBUTION = Attribution(name="Qwen3-TTS-X", url="https://github.com/QwenLM/Qwen3-TTS")


class ProtocolError(Exception):
    """The client broke the framing or a bound: told once, then the connection closes."""


async def read_event(reader: asyncio.StreamReader, max_bytes: int, wait_s: float | None) -> Event | None:
    """The next event, None at the end of the stream. Like `wyoming.event.async_read_event`, but a
    data or payload length over `max_bytes` is refused before anything is read (the line itself is
    bounded by the reader's limit). TimeoutError when no event begins within `wait_s` (None: no
    limit; nothing is consumed then); an event begun must be complete within `wait_s` too."""
    try:
        async with asyncio.timeout(wait_s):
            line = await reader.readline()
    except ValueError:  # longer than the reader's limit
        raise ProtocolError(f"An event header line is at most {max_bytes} bytes.") from None
    if not line:
        return None
    try:
        header = json.loads(line)
    except ValueError:
        raise ProtocolError("An event header must be one line of JSON.") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError("An event header is a JSON object with a 'type'.")
    data = header.get("data") or {}
    lengths = [header.get("data_length") or 0, header.get("payload_length") or 0]
    if not isinstance(data, dict) or any(not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= max_bytes
                                         for n in lengths):
        raise ProtocolError(f"An event's data is an object, and its data and payload are at most {max_bytes} bytes.")
    try:
        async with asyncio.timeout(wait_s):
            extra = json.loads(await reader.readexactly(lengths[0])) if lengths[0] else {}
            payload = await reader.readexactly(lengths[1]) if lengths[1] else None
    except asyncio.IncompleteReadError:
        return None
    except TimeoutError:
        raise ProtocolError("An event's data and payload must follow its header line.") from None
    except ValueError:
        raise ProtocolError("An event's data must be JSON.") from None
    if not isinstance(extra, dict):
        raise ProtocolError("An event's data is a JSON object.")
    return Event(type=header["type"], data={**data, **extra}, payload=payload)


def describe(state: AppState) -> Info:
    """One TTS program whose voices are those of /v1/audio/voices, each with its model's languages."""
    registry = state.registry
    voices = []
    for entry in voice_entries(registry, state.voice_profiles):
        served = registry.resolve(entry.models[0]) if entry.models else registry.default
        languages = [LANGUAGE_CODES[name] for name in served.manifest.languages if name in LANGUAGE_CODES]
        voices.append(TtsVoice(name=entry.id, description=entry.description or entry.name, attribution=ATTRIBUTION,
                               installed=True, version=None, languages=languages))
    program = TtsProgram(name=PROGRAM, description="Qwen3-TTS, streaming", attribution=ATTRIBUTION, installed=True,
                         version=__version__, voices=voices, supports_synthesize_streaming=True)
    return Info(tts=[program])


@dataclass
class Voice:
    """What a `synthesize` / `synthesize-start` asks for."""

    name: str | None
    language: str | None

    @classmethod
    def of(cls, data: dict[str, Any]) -> Voice:
        voice = data.get("voice") or {}
        if not isinstance(voice, dict):
            raise invalid_request("'voice' is an object: {name, language, speaker}.", param="voice")
        name, language = voice.get("name"), voice.get("language")
        if not isinstance(name, (str, type(None))) or not isinstance(language, (str, type(None))):
            raise invalid_request("'voice.name' and 'voice.language' are strings.", param="voice")
        return cls(name or None, language_of(language))


class WyomingConnection:
    """One Wyoming client connection: at most one synthesis at a time (`lifecycle.Drainable`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: AppState,
                 client: Client | None):
        self.reader, self.writer, self.state, self.client = reader, writer, state, client
        self.limits = state.config.limits
        self.utterance: Utterance | None = None
        """The synthesis running (until its pump has sent its end)."""
        self._send_lock = asyncio.Lock()
        self._closed = False

    @property
    def busy(self) -> bool:
        return self.utterance is not None

    def end(self, close: tuple[int, str] | None = None) -> None:
        """Cancel what runs and close the connection (the drain's deadline, or the client is gone)."""
        self._closed = True
        if self.utterance is not None:
            self.utterance.cancel()
        self.writer.close()

    async def run(self) -> None:
        try:
            while not self._closed:
                try:
                    event = await read_event(self.reader, self.limits.ws_max_message_bytes,
                                             self.limits.ws_idle_timeout_s or None)
                except TimeoutError:
                    if self.utterance is not None:
                        continue  # a synthesis runs: its client only listens
                    log.info("wyoming client %s sent nothing for %g s: closing", self._peer,
                             self.limits.ws_idle_timeout_s)
                    return
                if event is None:
                    return
                await self.handle(event)
        except ProtocolError as e:
            await self.send(Error(text=str(e), code="invalid_request_error").event())
        except APIError as e:
            await self.send(Error(text=e.message, code=e.code or e.type).event())
        except (ConnectionError, OSError):
            pass
        finally:
            await settle(self.utterance)
            self.writer.close()

    async def handle(self, event: Event) -> None:
        """Answer one event (the audio of a synthesis goes out from its pump). APIError: told, then closed."""
        if Describe.is_type(event.type):
            await self.send(describe(self.state).event())
        elif Ping.is_type(event.type):
            await self.send(Pong(text=event.data.get("text")).event())
        elif Synthesize.is_type(event.type):
            if self.utterance is not None and self.utterance.live:
                return  # a stream's text once more, for servers without streaming: ignored
            text = event.data.get("text")
            if not isinstance(text, str):
                raise invalid_request("'synthesize' needs 'text': a string.", param="text")
            await self.begin(Voice.of(event.data), text)
        elif SynthesizeStart.is_type(event.type):
            await self.begin(Voice.of(event.data), None)
        elif SynthesizeChunk.is_type(event.type):
            utterance = self._streaming("synthesize-chunk")
            text = event.data.get("text")
            if not isinstance(text, str):
                raise invalid_request("'synthesize-chunk' needs 'text': a string.", param="text")
            utterance.check_text(text, self.limits)
            utterance.push(text)
        elif SynthesizeStop.is_type(event.type):
            self._streaming("synthesize-stop").stop()

    async def begin(self, voice: Voice, text: str | None) -> None:
        """A synthesis of `text`, or (None) of the text the `synthesize-chunk`s will bring."""
        if self.utterance is not None:
            raise invalid_request("A synthesis already runs on this connection: wait for its audio-stop.",
                                  code="stream_active")
        live = text is None
        plan = self._plan(voice, LIVE_TEXT if live else text)
        self.utterance = utterance = await open_utterance(self.client, self.state, plan, "pcm", 1.0, live=live)
        utterance.pump = asyncio.ensure_future(self._pump(utterance))
        start_watch(utterance, self.limits)

    def _streaming(self, what: str) -> Utterance:
        if self.utterance is None or not self.utterance.live:
            raise invalid_request(f"'{what}' comes after 'synthesize-start'.", code="no_active_stream")
        return self.utterance

    def _plan(self, voice: Voice, text: str) -> SpeechPlan:
        registry, profiles = self.state.registry, self.state.voice_profiles
        name = voice.name
        if name is None:  # the default model's first voice of the language asked for, else its first
            entries = voice_entries(registry, profiles, registry.default)
            name = next((v.id for v in entries if voice.language and v.language == voice.language),
                        entries[0].id if entries else "alloy")
        body = speech_body({"model": registry.default.id, "input": text, "voice": name, "language": voice.language,
                            "response_format": "pcm"})
        return plan_request(self.state, body)

    async def _pump(self, utterance: Utterance) -> None:
        rate, started = utterance.sample_rate, False

        async def deliver(data: bytes, _chunk) -> None:
            nonlocal started
            if not started:
                started = True
                await self.send(AudioStart(rate=rate, width=2, channels=1).event())
            await self.send(AudioChunk(rate=rate, width=2, channels=1, audio=data).event())

        ending = Ending("error")
        try:
            ending = await pump(utterance, deliver)
            if ending.error is not None:
                await self.send(Error(text=ending.error.message, code=ending.error.code or ending.error.type).event())
                self.end()
            elif not utterance.cancelled:
                await self.send(AudioStop().event())  # sent even with no audio: the client waits for it
                if utterance.live:
                    await self.send(SynthesizeStopped().event())
        except (ConnectionError, OSError):
            self.end()
        finally:
            self.utterance = None
            record(self.state, utterance, ending, ROUTE, method="WYOMING", status=None)

    async def send(self, event: Event) -> None:
        """Write `event`; a client that takes nothing for `send_timeout_s` is cut off."""
        if self._closed or self.writer.is_closing():
            return
        async with self._send_lock:
            try:
                async with asyncio.timeout(self.limits.send_timeout_s):
                    await async_write_event(event, self.writer)
            except TimeoutError:
                log.info("wyoming client %s read nothing for %g s: ending it", self._peer, self.limits.send_timeout_s)
                self.writer.transport.abort()
                self.end()

    @property
    def _peer(self) -> str:
        peer = self.writer.get_extra_info("peername")
        return peer[0] if peer else UNKNOWN_CLIENT


class WyomingServer:
    """The Wyoming listener of one app: started and stopped by its lifespan (`api/app.py`)."""

    def __init__(self, state: AppState, app_state: Any):
        self.state, self.app_state = state, app_state
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def port(self) -> int | None:
        """The bound port (a requested port 0 is chosen by the system)."""
        return self._server.sockets[0].getsockname()[1] if self._server and self._server.sockets else None

    async def start(self, host: str, port: int) -> None:
        limit = self.state.config.limits.ws_max_message_bytes
        self._server = await asyncio.start_server(self._connected, host, port, limit=limit)
        log.info("Wyoming (Home Assistant) on tcp://%s:%d", host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = peer[0] if peer else UNKNOWN_CLIENT
        limiter = getattr(self.app_state, "client_limiter", None)
        connection = WyomingConnection(reader, writer, self.state,
                                       Client(address, limiter) if limiter is not None else None)
        counts, limits = socket_counts(self.app_state), self.state.config.limits
        problem = counts.admit(address, limits)
        if problem is None and PROCESS.draining:
            counts.release(address)
            problem = APIError("The server is draining before it stops: connect to another instance.",
                               status_code=503, code="unavailable")
        if problem is not None:
            await connection.send(Error(text=problem.message, code=problem.code).event())
            return
        try:
            with PROCESS.session(connection):
                await connection.run()
        finally:
            counts.release(address)
