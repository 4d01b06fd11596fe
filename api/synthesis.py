"""A validated SpeechRequest turned into the engine's SynthesisRequest for one served model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from qwen3_tts_gguf.prompt import PromptError
from qwen3_tts_gguf.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.sampler import SamplingParams
from qwen3_tts_gguf.scheduler import EngineBusy, EngineStopped, Stream

from . import headers
from .errors import invalid_request, queue_full, unavailable
from .registry import ServedModel
from .schemas import SpeechRequest
from .voices import ResolvedVoice, VoiceProfiles, resolve_voice


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
            out[headers.IGNORED_FIELDS] = ",".join(self.ignored_fields)
        return out


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


def plan_speech(body: SpeechRequest, served: ServedModel, profiles: VoiceProfiles) -> SpeechPlan:
    """Resolve voice, language and sampling for `served`; APIError 400 on what the model cannot do."""
    manifest = served.manifest
    voice = resolve_voice(manifest, body.voice_id, body.instructions, body.language, profiles)
    talker, predictor = sampling_for(body, manifest.sampling)
    request = SynthesisRequest(text=body.input, voice=voice.spec, text_mode=body.text_mode, talker=talker,
                               code_predictor=predictor, seed=body.seed, max_frames=body.max_frames)
    return SpeechPlan(served, request, voice, body.ignored_fields)


async def start_stream(plan: SpeechPlan, live_request: SynthesisRequest | None = None) -> Stream:
    """Queue `plan.request` on its model's engine, or with `live_request` open a stream whose text
    arrives later; the prompt is built off the event loop. Engine refusals become API errors."""
    engine = plan.served.engine
    loop = asyncio.get_running_loop()
    try:
        if live_request is None:
            return await asyncio.to_thread(engine.submit, plan.request, loop)
        return await asyncio.to_thread(engine.open_text_stream, live_request, loop)
    except EngineBusy:
        raise queue_full(engine.load()["waiting"]) from None
    except EngineStopped:
        raise unavailable("The engine is not running (the server is starting or stopping); retry.") from None
    except PromptError as e:
        raise invalid_request(str(e)) from None
