"""A validated SpeechRequest turned into the engine's SynthesisRequest for one served model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from qwen3_tts_gguf import SamplingParams, SynthesisRequest, TalkerSampling

from api.errors import invalid_request, validation_error
from api.ops import headers
from api.registry import ServedModel
from api.schemas import SpeechRequest
from api.voice_resolution import ResolvedVoice, VoiceProfiles, resolve_voice


@dataclass(frozen=True)
class SpeechPlan:
    """What the engine will be asked for, and what the response tells the client about it."""

    served: ServedModel
    request: SynthesisRequest
    voice: ResolvedVoice
    ignored_fields: tuple[str, ...] = ()

    def headers(self) -> dict[str, str]:
        out = {headers.MODEL: self.served.id, headers.VOICE: self.voice.label}
        if self.voice.instructions_ignored:
            out[headers.INSTRUCTIONS_IGNORED] = "true"
        if self.voice.voice_ignored:
            out[headers.VOICE_IGNORED] = "true"
        if self.ignored_fields:
            out[headers.IGNORED_FIELDS] = ignored_fields_header(self.ignored_fields)
        return out


ECHOED_FIELD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""Unknown field names that are echoed in a header: any other name (non-Latin-1, CR/LF, commas,
spaces, long) could break or forge the response head, so it is only counted."""
MAX_ECHOED_FIELDS = 16


def ignored_fields_header(names: Sequence[str]) -> str:
    """The `x-qwen3tts-ignored-fields` value: up to 16 safe names, then "+N more" for the rest."""
    shown = [name for name in names if ECHOED_FIELD_NAME.fullmatch(name)][:MAX_ECHOED_FIELDS]
    rest = len(names) - len(shown)
    return ",".join([*shown, f"+{rest} more"] if rest else shown)


def sampling_for(body: SpeechRequest, defaults: dict) -> tuple[TalkerSampling, SamplingParams]:
    """Talker and code-predictor sampling: the model's generation_config, overridden by the request.

    temperature/top_k/top_p/repetition_penalty apply to the talker (codebook 0), as in the official
    `generate`; temperature 0 means greedy decoding for the talker and the code predictor alike.
    """
    talker = SamplingParams.from_generation_config(defaults)
    predictor = SamplingParams.from_generation_config(defaults, "subtalker_")
    greedy = body.temperature == 0
    try:
        talker = replace(talker, temperature=body.temperature or talker.temperature,
                         top_k=talker.top_k if body.top_k is None else body.top_k,
                         top_p=talker.top_p if body.top_p is None else body.top_p,
                         greedy=talker.greedy or greedy)
        predictor = replace(predictor, greedy=predictor.greedy or greedy)
        penalty = body.repetition_penalty or defaults.get("repetition_penalty", TalkerSampling.repetition_penalty)
        return TalkerSampling(talker, float(penalty)), predictor
    except ValueError as e:
        raise invalid_request(str(e)) from None


LIVE_TEXT = "(live text)"
"""The `input` of a live stream's speech request (its text comes later): it passes validation."""


def speech_body(fields: dict[str, Any]) -> SpeechRequest:
    """`fields` validated as a speech request (what a socket protocol's own message asks for); APIError
    400 naming the field, as the speech route answers."""
    try:
        return SpeechRequest.model_validate(fields)
    except ValidationError as e:
        raise validation_error(RequestValidationError(e.errors())) from None


def plan_speech(body: SpeechRequest, served: ServedModel, profiles: VoiceProfiles) -> SpeechPlan:
    """Resolve voice, language and sampling for `served`; APIError 400 on what the model cannot do."""
    manifest = served.manifest
    voice = resolve_voice(manifest, body.voice_id, body.instructions, body.language, profiles)
    talker, predictor = sampling_for(body, manifest.sampling)
    request = SynthesisRequest(text=body.input, voice=voice.spec, text_mode=body.text_mode, talker=talker,
                               code_predictor=predictor, seed=body.seed, max_frames=body.max_frames,
                               text_normalization=body.text_normalization)
    return SpeechPlan(served, request, voice, body.ignored_fields)
