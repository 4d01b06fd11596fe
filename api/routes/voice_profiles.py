"""Cloned voices over HTTP: `POST /v1/audio/voices`, `DELETE /v1/audio/voices/{id}`.

The profiles themselves, and which model speaks one, are `api/voice_resolution.py` (`StoredVoiceProfiles`,
`model_for_voice`).

Creating takes OpenAI's multipart fields (`name`, `audio_sample`; `consent` accepted and ignored),
`audio` as an alias, and our extensions: `text` (the clip's transcript: in-context clone; without
it, x-vector only), `instructions` instead of audio (design-then-clone through a served
VoiceDesign model), `model`, `language`, `overwrite`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import partial

from fastapi import APIRouter, Request, Response, UploadFile
from starlette.datastructures import FormData
from starlette.datastructures import UploadFile as StarletteUpload
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from qwen3_tts_gguf import (
    EngineBusy,
    Manifest,
    ModelFolderError,
    PromptError,
    ReferenceAudioError,
    VoiceNotFoundError,
    VoiceProfile,
    VoiceProfileError,
    VoiceSpec,
)
from qwen3_tts_gguf.model.prompt import resolve_language
from qwen3_tts_gguf.voicebank.design import Cancellation, VoiceDesignError, reference_text, speak_reference
from qwen3_tts_gguf.voicebank.store import VoiceExistsError, validate_name

from api.errors import (
    CLIENT_CLOSED_REQUEST,
    SERVER_ERROR,
    APIError,
    engine_refusal,
    error_responses,
    invalid_request,
)
from api.limits import ServerLimits
from api.ops.lifecycle import PROCESS
from api.registry import ModelRegistry, ServedModel
from api.schemas import (
    MAX_INPUT_CHARS,
    MAX_INSTRUCTIONS_CHARS,
    MAX_LANGUAGE_CHARS,
    VoiceCreated,
    VoiceDeleted,
    voice_upload_openapi,
)
from api.state import get_state
from api.voice_jobs import ClientGone, voice_jobs_of
from api.voice_resolution import StoredVoiceProfiles

log = logging.getLogger("api.voices")  # the voice routes' log name, as before the modules were renamed
router = APIRouter(tags=["voices"])

MAX_MODEL_CHARS = 256
FIELD_CHARS = {"name": 64, "text": MAX_INPUT_CHARS, "instructions": MAX_INSTRUCTIONS_CHARS,
               "language": MAX_LANGUAGE_CHARS, "model": MAX_MODEL_CHARS, "overwrite": 8}
"""Characters of each text field of a voice upload (`text` and `instructions` as on the speech route)."""
MAX_FIELD_BYTES = 4 * max(FIELD_CHARS.values())
"""Bytes of any one text part (UTF-8 takes at most 4 bytes a character); over it the form is refused."""


@dataclass
class _CreateForm:
    name: str
    audio: UploadFile | None
    text: str | None
    instructions: str | None
    model: str | None
    language: str
    overwrite: bool


def _field(form: FormData, key: str) -> str | None:
    value = form.get(key)
    if value is None or isinstance(value, StarletteUpload):
        return None
    value = str(value).strip()
    if len(value) > FIELD_CHARS[key]:
        raise invalid_request(f"'{key}' is longer than {FIELD_CHARS[key]} characters", param=key,
                              code="string_above_max_length")
    return value or None


async def _read_form(request: Request, limits: ServerLimits) -> tuple[_CreateForm, FormData]:
    """The upload's fields (bounded) and the form itself (the caller closes it)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise invalid_request("POST /v1/audio/voices takes multipart/form-data (name, audio_sample, text)",
                              code="invalid_content_type")
    try:
        form = await request.form(max_files=1, max_fields=max(1, limits.max_form_fields - 1),
                                  max_part_size=MAX_FIELD_BYTES)
    except (HTTPException, ClientDisconnect):  # Starlette's parser refusals; a client that left
        raise invalid_request(f"could not read the form: it must be valid multipart/form-data with at most "
                              f"{limits.max_form_fields} parts, one file among them, and text fields of at most "
                              f"{MAX_FIELD_BYTES} bytes", code="invalid_form") from None
    try:
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
        fields = _CreateForm(name=name, audio=audio, text=_field(form, "text"),
                             instructions=_field(form, "instructions"), model=_field(form, "model"),
                             language=_field(form, "language") or "auto", overwrite=overwrite)
    except BaseException:
        await form.close()
        raise
    return fields, form


def _check_language(manifest: Manifest, language: str) -> None:
    try:
        resolve_language(manifest, VoiceSpec(language=language))  # the engine's own rule
    except PromptError as e:
        raise invalid_request(str(e), param="language") from None


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


@router.post("/v1/audio/voices", response_model=VoiceCreated, openapi_extra=voice_upload_openapi(FIELD_CHARS),
             responses=error_responses(400, 401, 403, 404, 408, 409, 413, 429, 500, 503))
async def create_voice(request: Request) -> dict:
    """Clone a voice from an uploaded clip (or design one from instructions) into a profile."""
    state = get_state(request)
    profiles = state.voice_profiles
    if not isinstance(profiles, StoredVoiceProfiles):
        raise invalid_request("this server keeps no voice profiles")
    form, raw_form = await _read_form(request, state.config.limits)
    try:
        if form.audio is None and form.instructions is None:
            raise invalid_request("send 'audio_sample' (a clip of the voice) or 'instructions' (to design one)",
                                  param="audio_sample", code="missing_required_parameter")
        if not form.overwrite and profiles.store.exists(form.name):
            raise APIError(f"voice '{form.name}' exists already (send overwrite=true to replace it)",
                           status_code=409, param="name", code="voice_exists")
        base = _base_model(state.registry, form.model)
        _check_language(base.manifest, form.language)  # a profile is never saved with a language it cannot speak
        design = None
        if form.audio is None:
            design = _design_model(state.registry)
            _check_language(design.manifest, form.language)
        audio = await form.audio.read() if form.audio is not None else None
        PROCESS.refuse_if_draining()  # no new voice job while the server drains (running ones finish)
        try:
            profile = await voice_jobs_of(request).run(partial(_make_voice, profiles, base, design, form, audio),
                                                       request)
        except ClientGone:
            log.info("voice %s: the client left; its job was cancelled", form.name)
            return Response(status_code=CLIENT_CLOSED_REQUEST)  # type: ignore[return-value]
        except Exception as e:
            raise _voice_error(e, request, base, design) from None
    finally:
        await raw_form.close()
    log.info("voice %s created (%s, model %s)", profile.name, profile.mode, base.id)
    return {"object": "audio.voice", "id": profile.name, "name": profile.name, "created_at": int(time.time()),
            "mode": profile.mode, "model": base.id}


def _make_voice(profiles: StoredVoiceProfiles, base: ServedModel, design: ServedModel | None, form: _CreateForm,
                audio: bytes | None, cancel: Cancellation) -> VoiceProfile:
    """The voice job (on a voice thread): design the clip if asked, clone it, save the profile."""
    cloner = profiles.cloner(base)  # loads the encoders on first use (slow)
    if design is None:
        source, ref_text = audio, form.text
    else:
        ref_text = form.text or reference_text(form.language)
        wav = speak_reference(design.engine, form.instructions, ref_text, form.language, cancel=cancel)
        source = (wav, design.model.sample_rate)
    cancel.check()
    profile = cloner.create_profile(form.name, source, ref_text=ref_text, language=form.language)
    cancel.check()
    profiles.store.save(profile, form.overwrite)
    return profile


def _voice_error(e: Exception, request: Request, base: ServedModel, design: ServedModel | None) -> Exception:
    """The answer to a voice job's exception; an unexpected one is returned as is (logged, 500)."""
    request_id = request.scope.get("state", {}).get("request_id")
    if isinstance(e, APIError):
        return e
    if isinstance(e, VoiceExistsError):
        return APIError(str(e), status_code=409, param="name", code="voice_exists")
    if isinstance(e, ReferenceAudioError):
        return invalid_request(str(e), param="audio_sample")
    if isinstance(e, VoiceProfileError):
        return invalid_request(str(e))
    if design is not None or not isinstance(e, EngineBusy):
        refusal = engine_refusal(e, design and design.engine, subject="The voice design model", reason=False,
                                 prompt_param="instructions")
        if refusal is not None:
            return refusal
    if isinstance(e, ModelFolderError):
        log.error("request %s: model %s cannot clone voices: %s", request_id, base.id, e)
        return invalid_request(f"model '{base.id}' cannot clone voices: its folder lacks the voice-cloning "
                               "encoders (convert the Base checkpoint again)", param="model")
    if isinstance(e, VoiceDesignError):
        log.error("request %s: %s", request_id, e)
        return APIError("The voice design failed.", status_code=500, type=SERVER_ERROR, code="synthesis_failed")
    return e


@router.delete("/v1/audio/voices/{voice_id}", response_model=VoiceDeleted,
               responses=error_responses(400, 401, 403, 404))
async def delete_voice(voice_id: str, request: Request) -> dict:
    """Remove a voice profile."""
    profiles = get_state(request).voice_profiles
    if not isinstance(profiles, StoredVoiceProfiles):
        raise invalid_request("this server keeps no voice profiles")
    try:
        await asyncio.to_thread(profiles.store.delete, voice_id)
    except VoiceNotFoundError:
        raise APIError(f"no voice named '{voice_id}'", status_code=404, param="voice_id",
                       code="voice_not_found") from None
    except VoiceProfileError as e:
        raise invalid_request(str(e), param="voice_id") from None
    return {"object": "audio.voice.deleted", "id": voice_id, "deleted": True}
