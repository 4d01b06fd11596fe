"""WebSocket `/v1/realtime`: OpenAI's Realtime API (GA, WebSocket transport) for text to speech.

What a client written for OpenAI's Realtime API (the openai SDK's `client.realtime.connect`, a raw
socket) does here, speaking text with this server's voices:

    client: connect /v1/realtime?model=gpt-realtime     (our model ids and aliases too)
    server: session.created {session}
    client: session.update {session: {type: "realtime", audio: {output: {format, voice, speed}}, instructions}}
    server: session.updated {session}
    client: conversation.item.create {item: {type: "message", role: "user", content: [{type: "input_text", text}]}}
    server: conversation.item.added, conversation.item.done
    client: response.create {response?: {instructions, audio: {output: {...}}, conversation, input, ...}}
    server: response.created, response.output_item.added, conversation.item.added,
            response.content_part.added, response.output_audio_transcript.delta (the text),
            response.output_audio.delta x N (base64 audio), response.output_audio.done,
            response.output_audio_transcript.done, response.content_part.done,
            response.output_item.done, conversation.item.done, response.done {response: {status, usage}}

A response speaks, verbatim, the `input_text` of the user messages added since the previous
response (joined with a space where two would run together), or its `response.input` items. It runs
through the speech route's path (`speaking/start.plan_request`, `utterance.open_utterance(live=False)`) with
the model's default text mode, so the same text, voice and seed give the same audio as POST
/v1/audio/speech; the session's `text_mode` extension picks "streaming" (lower first-audio time).
`instructions` are the speech route's style instructions, not a system prompt.

Text as it is written (an LLM's tokens) uses this server's extension pair:

    client: input_text_buffer.append {delta}   the first one opens a live response (the same events)
    server: response.output_audio_transcript.delta {delta} for each append, audio as it is ready
    client: input_text_buffer.commit            no more text: speak the rest (as /v1/ws `stop`)

`response.cancel` stops any response (status cancelled). One response runs at a time
(`conversation_already_has_active_response`). Audio formats: `audio/pcm` (s16le mono 24 kHz),
`audio/pcmu` and `audio/pcma` (G.711 at 8 kHz, resampled with soxr's streaming resampler).

Refused with an `error` event (code `unsupported_feature`), the socket kept: audio input
(`input_audio_buffer.*`, input_audio parts, turn detection, transcription sessions), tools and
function calls, text-only output, system and assistant messages, `output_audio_buffer.clear`
(WebRTC/SIP). The beta API's flat fields (`voice`, `output_audio_format`, `modalities`, ...) get
`unknown_parameter` naming the GA field. Supported trivially: `conversation.item.retrieve`,
`.delete` and `.truncate` (no audio is kept; truncate only acknowledges).

Authentication, handshake checks, socket counts and the message, send and live-text limits are
every socket protocol's (`api/protocols/base.py`, `api/speaking/utterance.py`); the key may also come as the
subprotocol `openai-insecure-api-key.<key>` (what browsers send), and the `realtime` subprotocol is
echoed when offered. Every server event has a unique `event_id`; an `error` caused by a client
event echoes that event's `event_id` in `error.event_id`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, WebSocket

from qwen3_tts_gguf import AudioChunk

from api.errors import APIError, invalid_request
from api.ops.clients import client_of
from api.protocols.base import CLOSE_POLICY_VIOLATION, KEY_SUBPROTOCOL_PREFIX, SocketConnection, serve_socket
from api.protocols.realtime_events import (
    REALTIME_MODEL_PREFIXES,
    SessionConfig,
    assistant_item,
    check_text_length,
    item_text,
    join_text,
    new_id,
    realtime_error,
    response_object,
    response_settings,
    response_status,
    session_object,
    speech_request,
    unsupported,
    updated_session,
    usage_object,
    user_item,
)
from api.registry import ModelRegistry, ServedModel
from api.speaking.plan import LIVE_TEXT, SpeechPlan
from api.speaking.start import plan_request
from api.speaking.utterance import Ending, Utterance, open_utterance, pump, record, settle, start_watch
from api.state import AppState

log = logging.getLogger("api.protocols.realtime")

router = APIRouter(tags=["audio"])

PATH = "/v1/realtime"
SUBPROTOCOL = "realtime"
KEY_PREFIXES = ("openai-insecure-api-key.", KEY_SUBPROTOCOL_PREFIX)
MAX_ITEMS = 256
"""Conversation items kept for `retrieve`/`delete`/`item_reference` (the oldest spoken ones go first)."""
PROGRESS_EVENT = "response.output_audio.progress"
"""This server's extension event (session `progress: true`): text progress after each audio delta."""


def resolve_model(registry: ModelRegistry, name: str | None) -> ServedModel:
    """`?model=`: a served id, folder or alias; missing or `gpt-realtime*` is the default model."""
    if not name or name.startswith(REALTIME_MODEL_PREFIXES):
        return registry.default
    return registry.resolve(name)


def error_event(error: APIError, client_event_id: str | None = None) -> dict[str, Any]:
    """`{"type": "error", "event_id", "error": {type, code, message, param, event_id}}`."""
    return {"type": "error", "event_id": new_id("event"), "error": {**error.body()["error"],
                                                                      "event_id": client_event_id}}


@dataclass
class Response:
    """One response: its utterance, its output item, and what the client is told about it."""

    id: str
    item_id: str
    utterance: Utterance
    config: SessionConfig
    conversation: bool
    metadata: dict | None
    transcript: list[str] = field(default_factory=list)
    cancel_requested: bool = False
    previous_item_id: str | None = None
    """The conversation item before this response's (conversation.item.added / .done)."""

    def ids(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item_id, "output_index": 0, "content_index": 0}


class Connection(SocketConnection):
    """One `/v1/realtime` socket: a session, its conversation, at most one response at a time."""

    protocol_name = "realtime"

    def __init__(self, websocket: WebSocket, state: AppState, client: str = ""):
        super().__init__(websocket, state, client)
        self.session_id = new_id("sess")
        self.conversation_id = new_id("conv")
        self.config: SessionConfig | None = None
        self.items: dict[str, dict[str, Any]] = {}
        """The conversation (insertion order): user messages, and the responses' assistant messages."""
        self.pending: list[str] = []
        """User messages not spoken yet (the next response's text)."""
        self.response: Response | None = None

    def handlers(self):
        return {
            "session.update": self.session_update,
            "conversation.item.create": self.item_create,
            "conversation.item.retrieve": self.item_retrieve,
            "conversation.item.delete": self.item_delete,
            "conversation.item.truncate": self.item_truncate,
            "response.create": self.response_create,
            "response.cancel": self.response_cancel,
            "input_text_buffer.append": self.text_append,
            "input_text_buffer.commit": self.text_commit,
            **{kind: self.no_audio_input for kind in ("input_audio_buffer.append", "input_audio_buffer.commit",
                                                      "input_audio_buffer.clear")},
            "output_audio_buffer.clear": self.no_output_buffer,
        }

    def error_event(self, error: APIError, message: dict[str, Any] | None = None) -> dict[str, Any]:
        event_id = message.get("event_id") if isinstance(message, dict) else None
        return error_event(error, event_id if isinstance(event_id, str) else None)

    def unknown_type(self, kind: Any, message: dict[str, Any]) -> APIError:
        shown = repr(kind[:60]) if isinstance(kind, str) else "(missing)" if kind is None else "(not a string)"
        return invalid_request(f"Invalid value: {shown}. Supported values are: {', '.join(self.handlers())}.",
                               param="type")

    async def send_event(self, event: dict[str, Any]) -> None:
        if "event_id" not in event:
            event = {"type": event["type"], "event_id": new_id("event"), **event}
        await super().send_event(event)

    @property
    def busy(self) -> bool:
        """A response runs or is sending its last events (the drain lets it finish)."""
        return self.response is not None

    def on_end(self) -> None:
        if self.response is not None:
            self.response.utterance.cancel()

    async def release(self) -> None:
        await settle(self.response.utterance if self.response is not None else None)

    async def run(self) -> None:
        try:
            served = resolve_model(self.state.registry, self.ws.query_params.get("model"))
        except APIError as e:
            await self.send_error(e)
            self.end((CLOSE_POLICY_VIOLATION, e.code or "invalid_model"))
        else:
            self.config = SessionConfig(model=served.id)
            await self.send_event({"type": "session.created", "session": self.session_object()})
        await super().run()

    def session_object(self) -> dict[str, Any]:
        return session_object(self.config, self.session_id)

    # -- session ---------------------------------------------------------------------------------------
    async def session_update(self, message: dict[str, Any]) -> None:
        config, model = updated_session(self.config, message.get("session"))
        if model is not None:
            try:
                named = resolve_model(self.state.registry, model)
            except APIError as e:
                raise realtime_error(e, "session") from None
            if named.id != self.config.model:
                raise invalid_request(f"Invalid value for 'session.model': this session speaks with "
                                      f"'{self.config.model}', chosen when it connected; reconnect with "
                                      f"?model={model} to use another.", param="session.model")
        self.plan(config, LIVE_TEXT, "session")  # voice, language, sampling: refused now, not later
        self.config = config
        await self.send_event({"type": "session.updated", "session": self.session_object()})

    def plan(self, config: SessionConfig, text: str, where: str) -> SpeechPlan:
        """The speech route's plan for `text` with `config` (APIError naming the Realtime field)."""
        body = speech_request(config, text, where)
        try:
            return plan_request(self.state, body)
        except APIError as e:
            raise realtime_error(e, where) from None

    # -- conversation ----------------------------------------------------------------------------------
    async def item_create(self, message: dict[str, Any]) -> None:
        item = user_item(message.get("item"))
        last = next(reversed(self.items), None)
        previous = message.get("previous_item_id")
        if previous is not None and not isinstance(previous, str):
            raise invalid_request("Invalid value for 'previous_item_id': expected a string.", param="previous_item_id")
        if previous is not None and previous != last:
            if previous == "root" or previous in self.items:
                raise unsupported("previous_item_id", "Items are only appended here: leave previous_item_id "
                                                         "out (or name the last item).")
            raise invalid_request(f"Item '{previous}' was not found.", param="previous_item_id",
                                  code="item_not_found")
        if item["id"] in self.items:
            raise invalid_request(f"Item '{item['id']}' already exists.", param="item.id", code="duplicate_item_id")
        if len(self.pending) >= MAX_ITEMS:
            raise invalid_request(f"The conversation holds {MAX_ITEMS} unspoken messages, its limit: send "
                                  "response.create to speak them first.", param="item", code="too_many_items")
        check_text_length(join_text([*self.pending_texts(), item_text(item)]), "item.content")
        self.add_item(item)
        self.pending.append(item["id"])
        for kind in ("conversation.item.added", "conversation.item.done"):
            await self.send_event({"type": kind, "previous_item_id": last, "item": item})

    def pending_texts(self) -> list[str]:
        return [item_text(self.items[item_id]) for item_id in self.pending]

    def add_item(self, item: dict[str, Any]) -> None:
        self.items[item["id"]] = item
        while len(self.items) > MAX_ITEMS:  # forget the oldest spoken item
            oldest = next(i for i in self.items if i not in self.pending)
            del self.items[oldest]

    def find_item(self, message: dict[str, Any]) -> dict[str, Any]:
        item_id = message.get("item_id")
        if not isinstance(item_id, str):
            raise invalid_request("Missing required parameter: 'item_id'.", param="item_id",
                                  code="missing_required_parameter")
        if item_id not in self.items:
            raise invalid_request(f"Item '{item_id[:64]}' was not found.", param="item_id", code="item_not_found")
        return self.items[item_id]

    async def item_retrieve(self, message: dict[str, Any]) -> None:
        await self.send_event({"type": "conversation.item.retrieved", "item": self.find_item(message)})

    async def item_delete(self, message: dict[str, Any]) -> None:
        item = self.find_item(message)
        del self.items[item["id"]]
        if item["id"] in self.pending:
            self.pending.remove(item["id"])
        await self.send_event({"type": "conversation.item.deleted", "item_id": item["id"]})

    async def item_truncate(self, message: dict[str, Any]) -> None:
        """Acknowledged only: no audio is kept, and nothing later depends on what was heard."""
        item = self.find_item(message)
        if item.get("role") != "assistant":
            raise invalid_request("Only assistant messages (a response's audio) can be truncated.", param="item_id")
        content_index, audio_end_ms = message.get("content_index", 0), message.get("audio_end_ms")
        if content_index != 0:
            raise invalid_request("Invalid value for 'content_index': a response's message has one part (0).",
                                  param="content_index")
        if isinstance(audio_end_ms, bool) or not isinstance(audio_end_ms, int) or audio_end_ms < 0:
            raise invalid_request("Invalid value for 'audio_end_ms': expected an integer >= 0.", param="audio_end_ms")
        await self.send_event({"type": "conversation.item.truncated", "item_id": item["id"], "content_index": 0,
                               "audio_end_ms": audio_end_ms})

    # -- responses -------------------------------------------------------------------------------------
    def _require_idle(self) -> None:
        if self.response is not None:
            raise invalid_request(f"Conversation already has an active response in progress: {self.response.id}. "
                                  "Wait until the response is finished before creating a new one.",
                                  code="conversation_already_has_active_response")

    async def response_create(self, message: dict[str, Any]) -> None:
        self._require_idle()
        settings = response_settings(self.config, message.get("response"))
        if settings.input is not None:
            text = join_text(item_text(self._input_item(item, i)) for i, item in enumerate(settings.input))
        else:
            text = join_text(self.pending_texts())
        if not text.strip():
            raise invalid_request("Nothing to speak: add a user message with input_text (conversation.item.create) "
                                  "or give response.input.", param="response.input", code="empty_input")
        check_text_length(text, "response.input")
        plan = self.plan(settings.config, text, "response")
        utterance = await open_utterance(client_of(self.ws), self.state, plan, settings.config.format,
                                         settings.config.speed, live=False,
                                         progress=bool(settings.config.extensions.get("progress")))
        if settings.conversation and settings.input is None:
            self.pending.clear()  # spoken (whatever becomes of the response)
        await self._begin(Response(new_id("resp"), new_id("item"), utterance, settings.config,
                                   settings.conversation, settings.metadata), transcript=text)

    def _input_item(self, item: Any, index: int) -> dict[str, Any]:
        param = f"response.input[{index}]"
        if isinstance(item, dict) and item.get("type") == "item_reference":
            item_id = item.get("id")
            if not isinstance(item_id, str) or item_id not in self.items:
                raise invalid_request(f"Item '{str(item_id)[:64]}' was not found.", param=f"{param}.id",
                                      code="item_not_found")
            return self.items[item_id]
        return user_item(item, param)

    async def response_cancel(self, message: dict[str, Any]) -> None:
        response, wanted = self.response, message.get("response_id")
        if response is None or (wanted is not None and wanted != response.id):
            raise invalid_request("Cancellation failed: no active response found.",
                                  param="response_id" if wanted is not None else None,
                                  code="response_cancel_not_active")
        response.cancel_requested = True
        response.utterance.cancel()

    # -- live text (extension) ---------------------------------------------------------------------------
    async def text_append(self, message: dict[str, Any]) -> None:
        delta = message.get("delta")
        if not isinstance(delta, str):
            raise invalid_request("input_text_buffer.append needs 'delta': a string.", param="delta",
                                  code="missing_required_parameter" if delta is None else "invalid_value")
        response = self.response
        if response is None:
            limit = self.limits.ws_max_session_chars
            if len(delta) > limit:
                raise invalid_request(f"A live response takes at most {limit} characters of text.", param="delta",
                                      code="string_above_max_length")
            plan = self.plan(self.config, LIVE_TEXT, "session")
            utterance = await open_utterance(client_of(self.ws), self.state, plan, self.config.format,
                                             self.config.speed, live=True,
                                             progress=bool(self.config.extensions.get("progress")))
            response = Response(new_id("resp"), new_id("item"), utterance, self.config, True, None)
            await self._begin(response)
        elif not response.utterance.live:
            self._require_idle()
        response.utterance.check_text(delta, self.limits, param="delta")
        response.utterance.push(delta)
        response.transcript.append(delta)
        if delta:
            await self.send_event({"type": "response.output_audio_transcript.delta", **response.ids(), "delta": delta})

    async def text_commit(self, message: dict[str, Any]) -> None:
        response = self.response
        if response is None or not response.utterance.live:
            raise invalid_request("Nothing to commit: input_text_buffer.append opens a live response first.",
                                  code="input_text_buffer_commit_empty")
        response.utterance.stop()

    # -- refused -------------------------------------------------------------------------------------------
    async def no_audio_input(self, message: dict[str, Any]) -> None:
        raise unsupported("type", f"'{message['type']}': this server takes no audio input; send text with "
                                     "conversation.item.create (input_text) or input_text_buffer.append.")

    async def no_output_buffer(self, message: dict[str, Any]) -> None:
        raise unsupported("type", "'output_audio_buffer.clear' is for WebRTC and SIP connections; on a "
                                     "WebSocket, stop a response with response.cancel.")

    # -- one response ---------------------------------------------------------------------------------------
    async def _begin(self, response: Response, transcript: str | None = None) -> None:
        """The response's opening events, then its audio (complete text: its transcript first)."""
        self.response = response
        item = assistant_item(response.item_id, "in_progress", None)
        if response.conversation:
            response.previous_item_id = next(reversed(self.items), None)
            self.add_item(assistant_item(response.item_id, "in_progress", ""))
        await self.send_event({"type": "response.created", "response": self._response_object(response, "in_progress")})
        await self.send_event({"type": "response.output_item.added", "response_id": response.id, "output_index": 0,
                               "item": item})
        if response.conversation:
            await self.send_event({"type": "conversation.item.added", "previous_item_id": response.previous_item_id,
                                   "item": item})
        await self.send_event({"type": "response.content_part.added", **response.ids(),
                               "part": {"type": "audio", "transcript": ""}})
        if transcript is not None:
            response.transcript.append(transcript)
            await self.send_event({"type": "response.output_audio_transcript.delta", **response.ids(),
                                   "delta": transcript})
        utterance = response.utterance
        utterance.pump = asyncio.create_task(self._speak(response), name=f"realtime-{utterance.id[:8]}")
        start_watch(utterance, self.limits)

    async def _speak(self, response: Response) -> None:
        utterance = response.utterance

        async def deliver(data: bytes, chunk: AudioChunk | None) -> None:
            await self.send_event({"type": "response.output_audio.delta", **response.ids(),
                                   "delta": base64.b64encode(data).decode("ascii")})
            if (progress := utterance.progress_after(chunk)) is not None:
                await self.send_event({"type": PROGRESS_EVENT, **response.ids(), **progress})
            if not self.open:  # the client left (or was ended) while we were sending
                utterance.cancel()

        try:
            ending = await pump(utterance, deliver)
            record(self.state, utterance, ending, PATH)
            await self._finish(response, ending)
        finally:
            if self.response is response:
                self.response = None  # the next response is welcome once response.done is out

    async def _finish(self, response: Response, ending: Ending) -> None:
        utterance = response.utterance
        status, details = response_status(ending.reason, utterance.limit, ending.error, response.cancel_requested)
        transcript = "".join(response.transcript)
        item = assistant_item(response.item_id, "completed" if status == "completed" else "incomplete", transcript)
        ids = response.ids()
        if (progress := utterance.final_progress()) is not None:
            await self.send_event({"type": PROGRESS_EVENT, **ids, **progress})
        await self.send_event({"type": "response.output_audio.done", **ids})
        await self.send_event({"type": "response.output_audio_transcript.done", **ids, "transcript": transcript})
        await self.send_event({"type": "response.content_part.done", **ids,
                               "part": {"type": "audio", "transcript": transcript}})
        await self.send_event({"type": "response.output_item.done", "response_id": response.id, "output_index": 0,
                               "item": item})
        if response.conversation:
            if response.item_id in self.items:
                self.items[response.item_id] = item
            await self.send_event({"type": "conversation.item.done", "previous_item_id": response.previous_item_id,
                                   "item": item})
        await self.send_event({"type": "response.done", "response": self._response_object(
            response, status, details, output=[item], usage=usage_object(utterance.usage()))})

    def _response_object(self, response: Response, status: str, details: dict | None = None,
                         output: list | None = None, usage: dict | None = None) -> dict[str, Any]:
        return response_object(response.id, response.config, status=status, status_details=details,
                                  conversation_id=self.conversation_id if response.conversation else None,
                                  metadata=response.metadata, output=output, usage=usage)


@router.websocket(PATH)
async def realtime_socket(websocket: WebSocket) -> None:
    """OpenAI's Realtime API (GA) for text to speech; see the module docstring."""
    await serve_socket(websocket, Connection, subprotocol=SUBPROTOCOL, key_prefixes=KEY_PREFIXES,
                       refusal_event=error_event)


__all__ = ["router", "PATH", "SUBPROTOCOL", "Connection", "resolve_model"]
