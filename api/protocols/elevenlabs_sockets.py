"""ElevenLabs' multi-context WebSocket, as voice-agent frameworks speak it to a TTS server: LiveKit's
`livekit-plugins-elevenlabs` and Pipecat's `ElevenLabsTTSService` take a base URL and stream an LLM's
tokens into `WS /v1/text-to-speech/{voice_id}/multi-stream-input`. A thin adapter beside `/v1/ws`:
each context is one live utterance (`utterance.py`), several may run on one socket.

    WS [/elevenlabs]/v1/text-to-speech/{voice}/multi-stream-input?model_id=...[&output_format=pcm_24000]
        [&language_code=en][&seed=N][&apply_text_normalization=auto|on|off]

    client -> server (JSON; `context_id` names a context, "default" when absent)
    {"text": " ", "context_id": "c1"}                  opens c1 (any first text does; its voice_settings'
                                                       speed is honoured, the rest of it and generation_config
                                                       are accepted and ignored)
    {"text": "Hello there. ", "context_id": "c1"}      text, spoken as soon as its words are complete (a
                                                       context speaks its texts joined, from the first word)
    {"text": "", "context_id": "c1"}                   keeps c1 alive (resets its idle time; opens nothing)
    {"context_id": "c1", "flush": true}                accepted: complete words are spoken without it
    {"context_id": "c1", "close_context": true}        no more text: c1 speaks what it has, then ends
    {"close_socket": true}                             every context likewise, then the socket closes
    server -> client
    {"audio": "<base64>", "isFinal": false, "contextId": "c1", "alignment": {...}, "normalizedAlignment": {...}}
                                                       audio, with the characters it carried (or null)
    {"isFinal": true, "contextId": "c1"}               c1's audio is complete (its id may be used again)
    {"error": "<code>", "message": "...", "contextId": "c1"}   OpenAI's error code; the socket stays open

`WS /v1/text-to-speech/{voice}/stream-input`, ElevenLabs' single-context socket, is the same with one
context: no `context_id`s or `contextId`s, `{"text": ""}` ends the text, and after `{"isFinal": true}`
the socket closes.

The same service's HTTP routes are `api/routes/elevenlabs.py`; they share `OutputFormat` and the
model-id rule with the sockets.

Character timings (`alignment`, and `normalizedAlignment` the same: the text as sent) are estimates
from the engine's text progress (`alignment.py`), not a forced alignment; characters the estimate
had not reached when the audio ended come in a last message with empty audio.

`voice` is any voice `/v1/audio/voices` lists; `model_id` a served model or alias (ElevenLabs' own
`eleven_*` ids mean the default model); `output_format` one of `OutputFormat.NAMES`: `pcm_8000` ...
`pcm_48000` (16-bit mono, resampled from 24 kHz), `ulaw_8000`, `alaw_8000`, ElevenLabs' `mp3_<rate>_<kb/s>`
and `opus_48000_<kb/s>` (base64 of the compressed stream's bytes; the default: `mp3_44100`, 128 kb/s, as
ElevenLabs' socket documents it; HTTP's is `mp3_44100_128`); anything else is refused (400 on HTTP, at the
socket's handshake). `apply_text_normalization`: `on` is the speech route's `text_normalization: "auto"`,
`auto` (ElevenLabs' default) and `off` the text as written (`text_normalization_of`). The key: the
`xi-api-key` header, `Authorization: Bearer`, or (socket) `?api_key=`. Every ElevenLabs route and socket is
also served under `/elevenlabs` (`PREFIX`: the base URL that also gives ElevenLabs' `GET /v1/models`).
Limits as `/v1/ws` (`protocols/base.py`: message size, socket counts, send timeout; each context's text,
idle time and length), and at most `MAX_CONTEXTS` contexts open on one socket, each holding one of its
client's speech places.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from qwen3_tts_gguf import AudioChunk, SynthesisResult, TextProgress

from api.errors import APIError, invalid_request, validation_error
from api.ops.clients import client_of
from api.protocols.base import CLOSE_POLICY_VIOLATION, SocketConnection, serve_socket
from api.speaking.alignment import CharTimeline, TimedChars
from api.speaking.elevenlabs_fields import (
    SOCKET_DEFAULT_FORMAT,
    OutputFormat,
    VoiceSettings,
    speech_fields,
)
from api.speaking.plan import LIVE_TEXT, SpeechPlan, speech_body
from api.speaking.start import plan_request
from api.speaking.timings import spoken_end
from api.speaking.utterance import Ending, Utterance, open_utterance, pump, record, settle, start_watch
from api.state import AppState

log = logging.getLogger("api.protocols.elevenlabs_sockets")

router = APIRouter(tags=["audio"])

PATH = "/v1/text-to-speech/{voice_id}/multi-stream-input"
ROUTE = "/v1/text-to-speech/multi-stream-input"
SINGLE_PATH = "/v1/text-to-speech/{voice_id}/stream-input"
SINGLE_ROUTE = "/v1/text-to-speech/stream-input"
MAX_CONTEXTS = 5
"""Contexts open at once on one socket (ElevenLabs' own bound)."""
DEFAULT_CONTEXT = "default"
MAX_CONTEXT_ID_CHARS = 128
PREFIX = "/elevenlabs"
"""Every ElevenLabs route and socket is also served under this prefix (`app.py`): a base URL on which
`GET /v1/models` answers in ElevenLabs' shape whatever the client sends (docs/integrations.md)."""
def error_message(error: APIError, context: str | None = None) -> dict[str, Any]:
    """`{"error": code, "message": text[, "contextId"]}`: the code is OpenAI's, as over HTTP."""
    return {"error": error.code or error.type, "message": error.message, **({"contextId": context} if context else {})}


class Connection(SocketConnection):
    """One multi-context socket: its contexts by id, each a live utterance with its own pump."""

    protocol_name = "elevenlabs"
    route = ROUTE
    single = False
    """One context, no `contextId`s, the socket closes with it (`SingleStreamConnection`)."""

    def __init__(self, websocket: WebSocket, state: AppState, client: str = ""):
        super().__init__(websocket, state, client)
        self.contexts: dict[str, Utterance] = {}
        self.timelines: dict[str, CharTimeline] = {}
        """Each context's text and the characters its audio has carried (`alignment.py`)."""
        self.closing = False
        self.problem: APIError | None = None
        try:
            self.plan, self.format = self._plan_from_handshake()
        except APIError as e:
            self.problem = e

    def _plan_from_handshake(self) -> tuple[SpeechPlan, OutputFormat]:
        query = self.ws.query_params
        fields = speech_fields(self.ws.path_params["voice_id"], query.get("model_id"), query.get("language_code"),
                               query.get("apply_text_normalization"), self.state.registry)
        if query.get("seed") is not None:
            if not query["seed"].isdigit():
                raise invalid_request("seed is a whole number, 0 or more.", param="seed")
            fields["seed"] = int(query["seed"])
        body = speech_body({**fields, "input": LIVE_TEXT, "text_mode": "streaming", "response_format": "pcm"})
        plan = plan_request(self.state, body)
        return plan, OutputFormat.parse(query.get("output_format"), plan.served.model.sample_rate,
                                        SOCKET_DEFAULT_FORMAT)

    async def run(self) -> None:
        if self.problem is not None:
            await self.send_error(self.problem)
            self.end((CLOSE_POLICY_VIOLATION, self.problem.code or "invalid_request"))
        await super().run()

    # -- the protocol -------------------------------------------------------------------------------
    def kind_of(self, message: dict[str, Any]) -> str:
        if message.get("close_socket") is True:
            return "close_socket"
        if message.get("close_context") is True:
            return "close_context"
        return "text" if "text" in message else "flush" if message.get("flush") is True else "unknown"

    def handlers(self):
        return {"text": self.text, "flush": self.flush, "close_context": self.close_context,
                "close_socket": self.close_socket}

    def unknown_type(self, kind: Any, message: dict[str, Any]) -> APIError:
        return invalid_request("A message has 'text', 'flush', 'close_context' or 'close_socket'.", param="text")

    def error_event(self, error: APIError, message: dict[str, Any] | None = None) -> dict[str, Any]:
        context = (message or {}).get("context_id")
        return error_message(error, context if isinstance(context, str) else None)

    @property
    def busy(self) -> bool:
        return bool(self.contexts)

    def on_end(self) -> None:
        for utterance in list(self.contexts.values()):
            utterance.cancel()

    async def release(self) -> None:
        await asyncio.gather(*(settle(u) for u in list(self.contexts.values())))

    # -- messages -------------------------------------------------------------------------------------
    def _context_id(self, message: dict[str, Any]) -> str:
        context = message.get("context_id", DEFAULT_CONTEXT)
        if not isinstance(context, str) or not 0 < len(context) <= MAX_CONTEXT_ID_CHARS:
            raise invalid_request(f"context_id is a string of 1 to {MAX_CONTEXT_ID_CHARS} characters.",
                                  param="context_id")
        return context

    async def text(self, message: dict[str, Any]) -> None:
        text = message["text"]
        if not isinstance(text, str):
            raise invalid_request("'text' is a string.", param="text")
        context = self._context_id(message)
        if not text and context not in self.contexts:
            return  # a keep-alive (Pipecat sends one with no context): it opens nothing
        utterance = self.contexts.get(context) or await self._open(context, message.get("voice_settings"))
        if utterance.closed:
            raise invalid_request(f"Context {context!r} was closed: wait for its isFinal, or use another id.",
                                  param="context_id", code="context_closed")
        if not utterance.has_text:
            text = text.lstrip()  # the opening " " (and any space before the first word) is not spoken
        if text:
            utterance.check_text(text, self.limits)
            utterance.push(text)
            self.timelines[context].text += text
        else:
            utterance.last_text_at = time.monotonic()  # a keep-alive

    async def flush(self, message: dict[str, Any]) -> None:
        self._context_id(message)  # complete words are spoken as they come: nothing waits for a flush

    async def close_context(self, message: dict[str, Any]) -> None:
        context = self._context_id(message)
        utterance = self.contexts.get(context)
        if utterance is None:
            raise invalid_request(f"No open context {context!r}.", param="context_id", code="context_not_found")
        self._stop(utterance)

    async def close_socket(self, _: dict[str, Any]) -> None:
        self.closing = True
        for utterance in list(self.contexts.values()):
            self._stop(utterance)
        if not self.contexts:
            self.end((1000, "close_socket"))

    @staticmethod
    def _stop(utterance: Utterance) -> None:
        if utterance.has_text:
            utterance.stop()
        else:
            utterance.cancel()  # nothing to speak: ends at once, with its isFinal

    async def _open(self, context: str, voice_settings: Any) -> Utterance:
        if self.closing:
            raise invalid_request("The socket is closing (close_socket).", param="context_id", code="socket_closing")
        if len(self.contexts) >= MAX_CONTEXTS:
            raise invalid_request(f"At most {MAX_CONTEXTS} contexts may be open on one socket: close one first.",
                                  param="context_id", code="too_many_contexts")
        speed = _settings(voice_settings).speed or 1.0
        plan = replace(self.plan, request=replace(self.plan.request, text="", text_mode="streaming"))
        utterance = await open_utterance(client_of(self.ws), self.state, plan, self.format.response_format, speed,
                                         live=True, out_rate=self.format.out_rate, bit_rate=self.format.bit_rate)
        self.contexts[context] = utterance
        self.timelines[context] = CharTimeline()
        utterance.pump = asyncio.create_task(self._pump(context, utterance), name=f"11l-pump-{context[:16]}")
        start_watch(utterance, self.limits)
        return utterance

    async def _pump(self, context: str, utterance: Utterance) -> None:
        timeline, clock = self.timelines[context], self.format.clock()

        async def send_audio(data: bytes, timed: TimedChars) -> None:
            alignment = timed.socket_shape()
            await self.send_event(self._tagged(context, {"audio": base64.b64encode(data).decode("ascii"),
                                                          "isFinal": False, "alignment": alignment,
                                                          "normalizedAlignment": alignment}))

        async def deliver(data: bytes, chunk: AudioChunk | None) -> None:
            # the encoder's tail (chunk None) comes after the engine's result: it carries the rest
            end = spoken_end(chunk.progress if chunk is not None else final_progress(utterance.stream.result))
            await send_audio(data, timeline.piece(clock.seconds(data), end))

        ending = Ending("error")
        try:
            ending = await pump(utterance, deliver)
            rest = timeline.rest(spoken_end(final_progress(utterance.stream.result)))
            if rest.chars and not utterance.cancelled:
                await send_audio(b"", rest)
            if ending.error is not None and not utterance.cancelled:
                await self.send_error(ending.error, {"context_id": context})
            await self.send_event(self._tagged(context, {"isFinal": True}))
        finally:
            self.contexts.pop(context, None)
            self.timelines.pop(context, None)
            record(self.state, utterance, ending, self.route)
            if (self.closing or self.single) and not self.contexts:
                self.end((1000, "close_socket" if self.closing else "done"))

    def _tagged(self, context: str, event: dict[str, Any]) -> dict[str, Any]:
        return event if self.single else {**event, "contextId": context}


def _settings(voice_settings: Any) -> VoiceSettings:
    """A context's `voice_settings` (absent: none), or APIError 400 naming the setting at fault."""
    try:
        return VoiceSettings.model_validate(voice_settings or {})
    except ValidationError as e:
        errors = [{**error, "loc": ("voice_settings", *error["loc"])} for error in e.errors()]
        raise validation_error(RequestValidationError(errors)) from None


def final_progress(result: SynthesisResult | None) -> TextProgress | None:
    return None if result is None else result.progress


class SingleStreamConnection(Connection):
    """ElevenLabs' single-context socket (`stream-input`): one utterance, opened by the first text;
    `{"text": ""}` ends its text (as `close_socket` does), then its audio, `{"isFinal": true}`, and the
    socket closes. Events carry no `contextId`."""

    protocol_name = "elevenlabs-stream-input"
    route = SINGLE_ROUTE
    single = True

    def kind_of(self, message: dict[str, Any]) -> str:
        return "close_socket" if message.get("text") == "" else super().kind_of(message)

    def _context_id(self, message: dict[str, Any]) -> str:
        return DEFAULT_CONTEXT

    def error_event(self, error: APIError, message: dict[str, Any] | None = None) -> dict[str, Any]:
        return error_message(error)


@router.websocket(PATH)
async def multi_stream_input(websocket: WebSocket) -> None:
    """ElevenLabs' multi-context text-to-speech socket; see the module docstring."""
    await serve_socket(websocket, Connection, subprotocol=None, refusal_event=error_message)


@router.websocket(SINGLE_PATH)
async def stream_input(websocket: WebSocket) -> None:
    """ElevenLabs' single-context text-to-speech socket; see the module docstring."""
    await serve_socket(websocket, SingleStreamConnection, subprotocol=None, refusal_event=error_message)


__all__ = ["router", "PATH", "SINGLE_PATH", "Connection", "SingleStreamConnection", "OutputFormat"]
