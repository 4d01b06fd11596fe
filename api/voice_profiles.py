"""Cloned voices over HTTP: `POST /v1/audio/voices`, `DELETE /v1/audio/voices/{id}`, and profile lookup.

`StoredVoiceProfiles` is the server's `VoiceProfiles`: profiles in the voices folder
(`qwen3_tts_gguf.voices.VoiceStore`), used by name from any request (`voice="alice"` or
`{"id": "alice"}`). A profile names the Base model it was made with: a request whose `model` is
the default or one of OpenAI's aliases speaks with that model (`model_for_voice`).

Creating takes OpenAI's multipart fields (`name`, `audio_sample`; `consent` accepted and ignored),
`audio` as an alias, and our extensions: `text` (the clip's transcript: in-context clone; without
it, x-vector only), `instructions` instead of audio (design-then-clone through a served
VoiceDesign model), `model`, `language`, `overwrite`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request, UploadFile
from starlette.datastructures import UploadFile as StarletteUpload

from qwen3_tts_gguf.manifest import Manifest
from qwen3_tts_gguf.prompt import VoiceSpec
from qwen3_tts_gguf.voice_clone import ReferenceAudioError, VoiceCloner
from qwen3_tts_gguf.voice_design import reference_text, speak_reference
from qwen3_tts_gguf.voices import (VoiceExistsError, VoiceNotFoundError, VoiceProfile, VoiceProfileError,
                                   VoiceStore, validate_name)

from .errors import APIError, invalid_request
from .registry import OPENAI_MODEL_ALIASES, ModelRegistry, ServedModel
from .state import get_state

log = logging.getLogger("api.voices")
router = APIRouter(tags=["voices"])
MAX_UPLOAD_BYTES = 64 * 1024 * 1024


class StoredVoiceProfiles:
    """Voice profiles of one folder, with a cloner per Base model (created on first use)."""

    def __init__(self, store: VoiceStore):
        self.store = store
        self._cloners: dict[Path, VoiceCloner] = {}
        self._lock = threading.Lock()

    def get(self, voice_id: str) -> VoiceProfile | None:
        try:
            return self.store.get(voice_id)
        except (VoiceNotFoundError, VoiceProfileError):
            return None  # not a (valid) profile name: the caller tries speakers next

    def lookup(self, voice_id: str, manifest: Manifest) -> VoiceSpec | None:
        profile = self.get(voice_id)
        if profile is None:
            return None
        try:
            profile.check_model(manifest.model_type, manifest.model_size, int(manifest.talker["hidden_size"]))
        except VoiceProfileError as e:
            raise invalid_request(str(e), param="voice") from None
        return profile.voice_spec()

    def entries(self) -> list[dict]:
        out = []
        for name in self.store.list():
            profile = self.get(name)
            if profile is not None:
                out.append({"id": name, "name": name, "mode": profile.mode, "language": profile.language,
                            "model": profile.model, "model_size": profile.model_size,
                            "created_at": profile.created_at})
        return out

    def cloner(self, served: ServedModel) -> VoiceCloner:
        with self._lock:
            if served.folder not in self._cloners:
                self._cloners[served.folder] = VoiceCloner(served.folder, threads=served.model.settings.threads or None)
            return self._cloners[served.folder]


def model_for_voice(registry: ModelRegistry, model_id: str, voice_id: str, profiles) -> ServedModel:
    """The model a request speaks with: the one it names, or, when it names the default or an OpenAI
    alias and its voice is a profile, the Base model that profile was made with."""
    served = registry.resolve(model_id)
    if not isinstance(profiles, StoredVoiceProfiles) or served.manifest.model_type == "base":
        return served
    if model_id not in OPENAI_MODEL_ALIASES and served is not registry.default:
        return served
    profile = profiles.get(voice_id)
    if profile is None:
        return served
    fits = [m for m in registry.models if m.manifest.model_type == "base" and m.manifest.model_size == profile.model_size]
    named = [m for m in fits if profile.model in (m.id, m.manifest.name, m.folder.name)]
    return (named or fits or [served])[0]


@dataclass
class _CreateForm:
    name: str
    audio: UploadFile | None
    text: str | None
    instructions: str | None
    model: str | None
    language: str
    overwrite: bool


def _field(form, key: str) -> str | None:
    value = form.get(key)
    if value is None or isinstance(value, StarletteUpload):
        return None
    value = str(value).strip()
    return value or None


async def _read_form(request: Request) -> _CreateForm:
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise invalid_request("POST /v1/audio/voices takes multipart/form-data (name, audio_sample, text)",
                              code="invalid_content_type")
    try:
        form = await request.form(max_part_size=MAX_UPLOAD_BYTES)
    except Exception as e:  # malformed multipart bodies raise several parser exceptions
        raise invalid_request(f"could not read the form: {e}") from None
    audio = form.get("audio_sample") or form.get("audio")
    if audio is not None and not isinstance(audio, StarletteUpload):
        raise invalid_request("'audio_sample' must be a file upload", param="audio_sample")
    name = _field(form, "name")
    if name is None:
        raise invalid_request("'name' is required", param="name", code="missing_required_parameter")
    try:
        validate_name(name)
    except VoiceProfileError as e:
        raise invalid_request(str(e), param="name") from None
    overwrite = (_field(form, "overwrite") or "false").lower() in ("1", "true", "yes")
    return _CreateForm(name=name, audio=audio, text=_field(form, "text"), instructions=_field(form, "instructions"),
                       model=_field(form, "model"), language=_field(form, "language") or "auto", overwrite=overwrite)


def _base_model(registry: ModelRegistry, model_id: str | None) -> ServedModel:
    if model_id is not None:
        served = registry.resolve(model_id)
        if served.manifest.model_type != "base":
            raise invalid_request(f"model '{served.id}' is a {served.manifest.model_type} model; cloning needs a "
                                  "Base model", param="model")
        return served
    bases = [m for m in registry.models if m.manifest.model_type == "base"]
    if not bases:
        raise invalid_request("no Base model is served: voice cloning needs one (serve --model <base model>)",
                              param="model")
    return bases[0]


def _design_model(registry: ModelRegistry) -> ServedModel:
    for served in registry.models:
        if served.manifest.model_type == "voice_design":
            return served
    raise invalid_request("'instructions' design a voice through a VoiceDesign model, and none is served",
                          param="instructions")


@router.post("/v1/audio/voices")
async def create_voice(request: Request) -> dict:
    """Clone a voice from an uploaded clip (or design one from instructions) into a profile."""
    state = get_state(request)
    profiles = state.voice_profiles
    if not isinstance(profiles, StoredVoiceProfiles):
        raise invalid_request("this server keeps no voice profiles")
    form = await _read_form(request)
    if form.audio is None and form.instructions is None:
        raise invalid_request("send 'audio_sample' (a clip of the voice) or 'instructions' (to design one)",
                              param="audio_sample", code="missing_required_parameter")
    if not form.overwrite and profiles.store.exists(form.name):
        raise APIError(f"voice '{form.name}' exists already (send overwrite=true to replace it)",
                       status_code=409, param="name", code="voice_exists")
    base = _base_model(state.registry, form.model)
    cloner = profiles.cloner(base)
    if form.audio is not None:
        data = await form.audio.read(MAX_UPLOAD_BYTES + 1)
        if len(data) > MAX_UPLOAD_BYTES:
            raise invalid_request("the audio sample is larger than 64 MiB", param="audio_sample")
        source, ref_text = data, form.text
    else:
        design = _design_model(state.registry)
        ref_text = form.text or reference_text(form.language)
        try:
            wav = await asyncio.to_thread(speak_reference, design.engine, form.instructions, ref_text, form.language)
        except ValueError as e:
            raise invalid_request(str(e), param="instructions") from None
        source = (wav, design.model.sample_rate)
    try:
        profile = await asyncio.to_thread(cloner.create_profile, form.name, source, ref_text=ref_text,
                                          language=form.language)
        await asyncio.to_thread(profiles.store.save, profile, form.overwrite)
    except VoiceExistsError as e:
        raise APIError(str(e), status_code=409, param="name", code="voice_exists") from None
    except ReferenceAudioError as e:
        raise invalid_request(str(e), param="audio_sample") from None
    except VoiceProfileError as e:
        raise invalid_request(str(e)) from None
    log.info("voice %s created (%s, model %s)", profile.name, profile.mode, base.id)
    return {"object": "audio.voice", "id": profile.name, "name": profile.name, "created_at": int(time.time()),
            "mode": profile.mode, "model": base.id}


@router.delete("/v1/audio/voices/{voice_id}")
async def delete_voice(voice_id: str, request: Request) -> dict:
    """Remove a voice profile."""
    profiles = get_state(request).voice_profiles
    if not isinstance(profiles, StoredVoiceProfiles):
        raise invalid_request("this server keeps no voice profiles")
    try:
        await asyncio.to_thread(profiles.store.delete, voice_id)
    except VoiceNotFoundError as e:
        raise APIError(str(e), status_code=404, param="voice_id", code="voice_not_found") from None
    except VoiceProfileError as e:
        raise invalid_request(str(e), param="voice_id") from None
    return {"object": "audio.voice.deleted", "id": voice_id, "deleted": True}
