"""WebSocket `/v1/ws` (`qtts.v1`): text in as it is written, audio out as it is ready; several
utterances, one at a time, on one socket.

The protocol is described once, in docs/protocols.md (*WebSocket /v1/ws*, and *Resumable streams*
for `api/protocols/resume.py`). Here: the socket's messages turned into utterances
(`api/speaking/utterance.py`) over the one way into the engine (`api/speaking/start.py`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, WebSocket

from qwen3_tts_gguf import AudioChunk

from api.errors import APIError, invalid_request
from api.ops.clients import client_of
from api.protocols.base import CLOSE_POLICY_VIOLATION, SocketConnection, error_event, offered_key, serve_socket
from api.protocols.resume import CLOSE_RESUME_FAILED, Resumable, resume_registry
from api.schemas import SpeechRequest
from api.speaking.plan import LIVE_TEXT, speech_body
from api.speaking.start import plan_request
from api.speaking.utterance import Ending, Utterance, open_utterance, pump, record, settle, start_watch
from api.state import AppState

log = logging.getLogger("api.protocols.native")

router = APIRouter(tags=["audio"])

PATH = "/v1/ws"
SUBPROTOCOL = "qtts.v1"
SEND_TIMEOUT_CLOSE = (CLOSE_POLICY_VIOLATION, "send_timeout")
NOT_FOR_LIVE_TEXT = ("input", "text_mode", "stream_format")
"""Speech-request fields a session ignores (the text comes in deltas, always in streaming mode)."""


def speech_request(message: dict[str, Any], default_model: str) -> tuple[SpeechRequest, tuple[str, ...]]:
    """A `start` message validated as a speech request: (request, fields ignored). APIError 400."""
    fields = {k: v for k, v in message.items() if k != "type"}
    ignored = tuple(k for k in NOT_FOR_LIVE_TEXT if fields.pop(k, None) is not None)
    if "format" in fields:
        if "response_format" in fields and fields["response_format"] != fields["format"]:
            raise invalid_request("Give either 'format' or 'response_format', not both.", param="format")
        fields["response_format"] = fields.pop("format")
    fields.setdefault("response_format", "pcm")
    fields.setdefault("model", default_model)
    body = speech_body({**fields, "input": LIVE_TEXT, "text_mode": "streaming"})
    return body, tuple(sorted(body.ignored_fields + ignored))


def done_event(utterance: Utterance, ending: Ending) -> dict[str, Any]:
    return {
        "type": "done", "id": utterance.id, "finish_reason": ending.reason, "usage": utterance.usage(),
        "audio_s": utterance.audio_s, "limit": utterance.limit, "idle_timeout": utterance.limit == "idle_timeout",
        "timings": utterance.timings(),  # first_audio_s: from the first text message to the first audio sent
    }


def progress_event(session: Utterance, fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "progress", "id": session.id, **fields}


def closing_events(session: Utterance, ending: Ending) -> list[dict[str, Any]]:
    """What ends an utterance: its `error` (if it failed), its last `progress` (if asked), `done`."""
    final = session.final_progress()
    return [*([error_event(ending.error, id=session.id)] if ending.error else []),
            *([progress_event(session, final)] if final is not None else []),
            done_event(session, ending)]


class Connection(SocketConnection):
    """One `/v1/ws` socket: runs at most one utterance at a time."""

    protocol_name = "websocket"

    def __init__(self, websocket: WebSocket, state: AppState, client: str = ""):
        super().__init__(websocket, state, client)
        self.session: Utterance | None = None
        self._last_pump = None
        """The latest session's pump (it sends that session's `done`)."""
        self._resumable: Resumable | None = None
        """The resumable stream this socket carries (or last carried)."""

    def handlers(self):
        return {"start": self.start, "text": self.text, "stop": self.stop, "cancel": self.cancel, "ack": self.ack,
                "resume": self.resume}

    def error_event(self, error: APIError, message: dict[str, Any] | None = None) -> dict[str, Any]:
        return error_event(error, **({"id": self.session.id} if self.session is not None else {}))

    @property
    def busy(self) -> bool:
        """An utterance runs or is sending its `done` (the drain lets it finish: `lifecycle.Drainable`)."""
        return self.session is not None or (self._last_pump is not None and not self._last_pump.done())

    def on_end(self) -> None:
        if self.session is None:
            return
        close = self._ended.result() if self._ended.done() else None
        if self.session.resume is not None and close in (None, SEND_TIMEOUT_CLOSE):
            return  # the client may come back: `release` keeps the stream for a resume when it can
        self.session.cancel()

    async def release(self) -> None:
        resumable = self._resumable
        if resumable is not None and resumable.connection is self \
                and resume_registry(self.ws).detach(resumable, self):
            self.session = None
            return
        await settle(self.session)

    # -- a resumable stream moves between sockets (`api/protocols/resume.py`) ---------------------------------
    def adopt(self, utterance: Utterance) -> None:
        self.session = utterance
        self._last_pump = utterance.pump

    def let_go(self, utterance: Utterance, moved: bool = False) -> None:
        if self.session is utterance:
            self.session = None
        if moved:
            self._resumable = None
            if self._last_pump is utterance.pump:
                self._last_pump = None

    # -- messages ---------------------------------------------------------------------------------
    async def start(self, message: dict[str, Any]) -> None:
        if self.session is not None:
            raise invalid_request("A stream is already running on this socket: send 'stop' or 'cancel' and "
                                  "wait for 'done' before the next 'start'.", code="stream_active")
        resumable = message.get("resumable", False)
        if not isinstance(resumable, bool):
            raise invalid_request("'resumable' must be true or false.", param="resumable")
        registry = self.state.registry
        body, ignored = speech_request({k: v for k, v in message.items() if k != "resumable"}, registry.default.id)
        plan = plan_request(self.state, body, ignored)  # as the route
        session = await open_utterance(client_of(self.ws), self.state, plan, body.response_format, body.speed,
                                       live=True, progress=body.progress)
        self.session = session
        self._resumable = None
        started = {
            "type": "started", "id": session.id, "model": plan.served.id, "voice": plan.voice.label,
            "sample_rate": session.sample_rate, "channels": 1, "format": body.response_format,
            "instructions_ignored": plan.voice.instructions_ignored, "voice_ignored": plan.voice.voice_ignored,
            "ignored_fields": list(ignored),
        }
        if resumable:
            token = None
            if self.limits.resume_window_s > 0:
                token = resume_registry(self.ws).open(session, self, offered_key(self.ws))
                self._resumable = session.resume
            started["resume_token"] = token
        await self.send_event(started)
        session.pump = self._last_pump = asyncio.create_task(self._pump(session), name=f"ws-pump-{session.id[:8]}")
        start_watch(session, self.limits)

    async def text(self, message: dict[str, Any]) -> None:
        session = self._require_session("text")
        delta = message.get("text")
        if not isinstance(delta, str):
            raise invalid_request("A text message needs 'text': a string.", param="text",
                                  code="missing_required_parameter" if delta is None else "invalid_value")
        resumable, seq = session.resume, message.get("seq")
        if resumable is not None and seq is not None:
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
                raise invalid_request("'seq' must be an integer, 1 or more (1, 2, ... in order).", param="seq")
            if seq <= resumable.last_text_seq:
                return  # taken already: sent again after a resume
            session.check_text(delta, self.limits)
            session.push(delta)
            resumable.last_text_seq = seq
            return
        session.check_text(delta, self.limits)
        session.push(delta)

    async def stop(self, _: dict[str, Any]) -> None:
        self._require_session("stop").stop()

    async def cancel(self, _: dict[str, Any]) -> None:
        """Stop at once; audio not yet sent is dropped. Idle: nothing to do (a cancel racing a `done`)."""
        if self.session is not None:
            self.session.cancel()

    async def ack(self, message: dict[str, Any]) -> None:
        """The client has the first `audio_bytes` bytes of the stream's audio: no need to keep them for a
        resume. Nothing to do for a stream that is not resumable (or none: an ack racing a `done`)."""
        received = message.get("audio_bytes")
        if not isinstance(received, int) or isinstance(received, bool) or received < 0:
            raise invalid_request("An ack needs 'audio_bytes': the audio bytes received so far (an integer, 0 or "
                                  "more).", param="audio_bytes",
                                  code="missing_required_parameter" if received is None else "invalid_value")
        resumable = self._resumable
        if resumable is None or resumable.connection is not self:
            return
        if received > resumable.replay.end:
            raise invalid_request(f"An ack of {received} bytes, but {resumable.replay.end} were sent.",
                                  param="audio_bytes")
        resumable.replay.ack(received)

    async def resume(self, message: dict[str, Any]) -> None:
        """Carry on a resumable stream whose socket was lost (module docstring)."""
        if self.session is not None:
            raise invalid_request("A stream is already running on this socket: resume on a new one.",
                                  code="stream_active")
        registry = resume_registry(self.ws)
        try:
            resumable, token = registry.claim(message.get("resume_token"), offered_key(self.ws),
                                              message.get("audio_bytes"))
        except APIError as e:
            await self.send_error(e)
            self.end(CLOSE_RESUME_FAILED)
            return
        self._resumable = resumable
        await resumable.attach(self, message["audio_bytes"], token)

    def _require_session(self, kind: str) -> Utterance:
        if self.session is None:
            raise invalid_request(f"'{kind}' before 'start': open a stream with a 'start' message first.",
                                  param="type", code="no_active_stream")
        return self.session

    # -- audio ------------------------------------------------------------------------------------
    async def _pump(self, session: Utterance) -> None:
        """Binary frames as the audio comes; then `done` (and `error` first if it failed)."""
        resumable = session.resume
        if resumable is not None:  # it goes wherever the stream is attached (`api/protocols/resume.py`)
            async def deliver_resumable(data: bytes, chunk: AudioChunk | None) -> None:
                await resumable.deliver(data)
                if (progress := session.progress_after(chunk)) is not None:  # dropped while detached
                    await resumable.send_event(progress_event(session, progress))

            ending = await pump(session, deliver_resumable)
            record(self.state, session, ending, PATH)
            await resumable.finish(closing_events(session, ending))
            return

        async def deliver(data: bytes, chunk: AudioChunk | None) -> None:
            await self.send_bytes(data)
            if (progress := session.progress_after(chunk)) is not None:
                await self.send_event(progress_event(session, progress))
            if not self.open:  # the client left (or was ended) while we were sending
                session.cancel()

        ending = await pump(session, deliver)
        events = closing_events(session, ending)
        record(self.state, session, ending, PATH)
        if self.session is session:
            self.session = None  # the next `start` is welcome from here on
        for event in events:
            await self.send_event(event)


@router.websocket(PATH)
async def speech_socket(websocket: WebSocket) -> None:
    """Live text to speech; see the module docstring for the protocol."""
    await serve_socket(websocket, Connection, subprotocol=SUBPROTOCOL)


__all__ = ["router", "PATH", "SUBPROTOCOL", "Connection", "speech_request"]
