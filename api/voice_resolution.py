"""Who speaks: a request's `voice`/`instructions`/`language` turned into the engine's VoiceSpec.

Rules by model type (manifest.model_type):

- custom_voice: `voice` is a voice profile (hook, see `VoiceProfiles`), a speaker of the model
  (case-insensitive), or one of OpenAI's 13 voice names mapped by `OPENAI_VOICES`.
  `instructions` steer the style where the model takes them (manifest.instruct_supported, the
  1.7B models); elsewhere (0.6B) they are accepted, ignored, and said so in a response header.
- voice_design: the instructions describe the voice, and `voice` is accepted and ignored. A
  request without instructions gets the description of its OpenAI voice name (so clients that only
  know `tts-1` + `alloy` still work); with neither it is a 400.
- base (voice cloning): only voice profiles speak.

`StoredVoiceProfiles` is the server's `VoiceProfiles`: profiles in the voices folder
(`qwen3_tts_gguf.voicebank.store.VoiceStore`), used by name from any request (`voice="alice"` or
`{"id": "alice"}`). A profile names the Base model it was made with: a request whose `model` is
the default or one of OpenAI's aliases speaks with that model (`model_for_voice`). They are created
and deleted over HTTP in `api/routes/voice_profiles.py`. `voice_entries` lists every voice a model speaks, for
the catalogue routes and Wyoming's `info` alike.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from qwen3_tts_gguf import (
    Manifest,
    PromptError,
    VoiceCloner,
    VoiceNotFoundError,
    VoiceProfile,
    VoiceProfileError,
    VoiceSpec,
    VoiceStore,
)
from qwen3_tts_gguf.model.prompt import resolve_language

from api.errors import invalid_request
from api.registry import OPENAI_MODEL_ALIASES, ModelRegistry, ServedModel
from api.schemas import Voice

LANGUAGE_CODES = {"chinese": "zh", "english": "en", "german": "de", "italian": "it", "portuguese": "pt",
                  "spanish": "es", "japanese": "ja", "korean": "ko", "french": "fr", "russian": "ru"}
"""The models' languages as ISO 639-1 codes, for protocols that name languages so (Wyoming, ElevenLabs)."""


def language_of(code: str | None) -> str | None:
    """The language name for an ISO code ("en", "en-US", "en_US"); None (auto) when unknown or absent."""
    prefix = (code or "").replace("_", "-").split("-")[0].lower()
    return next((name for name, iso in LANGUAGE_CODES.items() if iso == prefix), None)


@dataclass(frozen=True)
class OpenAIVoice:
    """Where one of OpenAI's voice names goes on a CustomVoice model, and how it sounds."""

    speaker: str
    description: str
    """OpenAI's character of the voice; also the VoiceDesign instruction when none is given."""


# OpenAI voice -> official CustomVoice speaker (model notes §2.1), matched by gender and character.
# English-native speakers first (OpenAI clients mostly speak English); the dialect speakers (dylan,
# eric) are left out because with language "auto" they switch on their Chinese dialect.
OPENAI_VOICES: dict[str, OpenAIVoice] = {
    "alloy": OpenAIVoice("serena", "A neutral, balanced, warm female voice with a calm, even delivery."),
    "ash": OpenAIVoice("aiden", "A warm, clear young male voice with a friendly American accent."),
    "ballad": OpenAIVoice("ryan", "A soft, expressive, melodic male voice."),
    "coral": OpenAIVoice("vivian", "A bright, cheerful, friendly female voice."),
    "echo": OpenAIVoice("aiden", "A resonant, clear male voice with a steady delivery."),
    "fable": OpenAIVoice("ryan", "An animated, expressive male storyteller voice."),
    "onyx": OpenAIVoice("uncle_fu", "A deep, low, mellow mature male voice."),
    "nova": OpenAIVoice("vivian", "A young, bright, energetic female voice."),
    "sage": OpenAIVoice("serena", "A calm, gentle, thoughtful female voice."),
    "shimmer": OpenAIVoice("sohee", "A soft, warm, gentle female voice."),
    "verse": OpenAIVoice("ryan", "A versatile, dynamic, expressive male voice."),
    "marin": OpenAIVoice("serena", "A natural, warm, conversational female voice."),
    "cedar": OpenAIVoice("aiden", "A natural, relaxed, conversational male voice."),
}


@dataclass(frozen=True)
class SpeakerInfo:
    """What the official CustomVoice speakers are (README / model notes §2.1), for voice lists."""

    gender: str
    language: str
    description: str


OFFICIAL_SPEAKERS: dict[str, SpeakerInfo] = {
    "vivian": SpeakerInfo("female", "chinese", "Bright, slightly edgy young female voice."),
    "serena": SpeakerInfo("female", "chinese", "Warm, gentle young female voice."),
    "uncle_fu": SpeakerInfo("male", "chinese", "Seasoned male voice, low and mellow."),
    "dylan": SpeakerInfo("male", "beijing_dialect", "Youthful Beijing male voice."),
    "eric": SpeakerInfo("male", "sichuan_dialect", "Lively Chengdu (Sichuan) male voice."),
    "ryan": SpeakerInfo("male", "english", "Dynamic male voice."),
    "aiden": SpeakerInfo("male", "english", "Sunny American male voice."),
    "ono_anna": SpeakerInfo("female", "japanese", "Playful female voice."),
    "sohee": SpeakerInfo("female", "korean", "Warm female voice."),
}


class VoiceProfiles(Protocol):
    """Saved voice profiles (voices/, `qwen3_tts_gguf.voicebank.store.VoiceStore`): the Voices issue
    implements this and passes it to `create_app(voice_profiles=...)`.

    A profile is looked up before speaker names and OpenAI names, for every model type.
    """

    def lookup(self, voice_id: str, manifest: Manifest) -> VoiceSpec | None:
        """The profile's voice for this model, or None when there is no such profile.

        Raise `errors.invalid_request(..., param="voice")` for a profile that exists but does not
        fit the model (another model size, say).
        """
        ...

    def entries(self) -> list[dict]:
        """Entries for GET /v1/audio/voices (each at least {"id", "name"})."""
        ...


class NoVoiceProfiles:
    """The profile store until voice profiles exist: knows none."""

    def lookup(self, voice_id: str, manifest: Manifest) -> VoiceSpec | None:
        return None

    def entries(self) -> list[dict]:
        return []


@dataclass(frozen=True)
class ResolvedVoice:
    """The engine's voice for one request, and what the response should tell about it."""

    spec: VoiceSpec
    label: str
    """Who speaks: a speaker name, a profile id, or "instructions" (VoiceDesign)."""
    voice_ignored: bool = False
    instructions_ignored: bool = False


def speaker_for(manifest: Manifest, voice_id: str) -> str | None:
    """A model speaker for `voice_id`: its own speaker name, or an OpenAI name via the table.

    An OpenAI name whose mapped speaker the model lacks (a fine-tuned model) gets the model's first
    speaker; a model without named speakers gets None.
    """
    if not manifest.speakers:
        return None
    name = voice_id.lower()
    if name in manifest.speakers:
        return name
    if name in OPENAI_VOICES:
        mapped = OPENAI_VOICES[name].speaker
        return mapped if mapped in manifest.speakers else next(iter(manifest.speakers))
    return None


def resolve_voice(manifest: Manifest, voice_id: str, instructions: str | None, language: str | None,
                  profiles: VoiceProfiles) -> ResolvedVoice:
    """The VoiceSpec for a request, or APIError 400 naming the parameter that is wrong."""
    requested_language = language
    language = language or "auto"
    try:
        resolve_language(manifest, VoiceSpec(language=language))  # the engine's own rule
    except PromptError as e:
        raise invalid_request(str(e), param="language") from None
    instructions = instructions or None
    takes_instructions = manifest.instruct_supported
    profile = profiles.lookup(voice_id, manifest)
    if profile is not None:
        instruct = instructions if takes_instructions else None
        # a profile keeps the language it was made with unless the request names one
        return ResolvedVoice(replace(profile, instruct=instruct or profile.instruct,
                                     language=requested_language or profile.language), voice_id,
                             instructions_ignored=bool(instructions) and not takes_instructions)
    if manifest.model_type == "voice_design":
        description = instructions or (OPENAI_VOICES[voice_id.lower()].description
                                       if voice_id.lower() in OPENAI_VOICES else None)
        if description is None:
            raise invalid_request(f"Model '{manifest.name}' is a VoiceDesign model: 'instructions' must describe "
                                  "the voice (e.g. \"A calm, deep male voice\").", param="instructions",
                                  code="missing_required_parameter")
        return ResolvedVoice(VoiceSpec(instruct=description, language=language), "instructions",
                             voice_ignored=bool(instructions))
    speaker = speaker_for(manifest, voice_id)
    if speaker is None:
        raise invalid_request(_unknown_voice_message(manifest, voice_id), param="voice")
    return ResolvedVoice(VoiceSpec(speaker=speaker, instruct=instructions if takes_instructions else None,
                                   language=language), speaker,
                         instructions_ignored=bool(instructions) and not takes_instructions)


def _unknown_voice_message(manifest: Manifest, voice_id: str) -> str:
    if not manifest.speakers:
        return (f"Voice '{voice_id}' is not a voice profile, and model '{manifest.name}' "
                f"({manifest.model_type}) speaks only with voice profiles.")
    return (f"Voice '{voice_id}' is not available for model '{manifest.name}'. Speakers: "
            f"{', '.join(manifest.speakers)}; OpenAI voice names: {', '.join(OPENAI_VOICES)}.")


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
        """The cloner of a Base model; the first call loads its encoders (slow: call it on a voice thread)."""
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
    fits = [m for m in registry.models
            if m.manifest.model_type == "base" and m.manifest.model_size == profile.model_size]
    named = [m for m in fits if profile.model in (m.id, m.manifest.name, m.folder.name)]
    return (named or fits or [served])[0]


def profile_models(registry: ModelRegistry, entry: dict) -> list[str]:
    """The served Base models a profile can speak with (its size), the one it names first: the first
    is what a request naming the default model or an alias speaks with (`model_for_voice`)."""
    fits = [m for m in registry.models
            if m.manifest.model_type == "base" and m.manifest.model_size == entry.get("model_size")]
    named = [m for m in fits if entry.get("model") in (m.id, m.manifest.name, m.folder.name)]
    return [m.id for m in named + [m for m in fits if m not in named]]


def voice_entries(registry: ModelRegistry, profiles: VoiceProfiles, model: ServedModel | None = None) -> list[Voice]:
    """Speakers of each model, OpenAI's voice names (with the speaker each maps to), then profiles.

    A voice that several models have is listed once, with all their ids in `models`. A profile's
    `models` are the Base models it speaks with; for `model` it is listed when that is one of them,
    or when `model` is the default (a request for the default or an alias is routed to the
    profile's Base model).
    """
    models = [model] if model is not None else list(registry.models)
    speakers: dict[str, Voice] = {}
    for served in models:
        for name in served.manifest.speakers:
            info = OFFICIAL_SPEAKERS.get(name)
            entry = speakers.setdefault(name, Voice(
                id=name, name=name.replace("_", " ").title(), kind="speaker", models=[],
                gender=info.gender if info else None, language=info.language if info else None,
                description=info.description if info else None))
            entry.models.append(served.id)
    openai: list[Voice] = []
    for name, voice in OPENAI_VOICES.items():
        takers = [s for s in models if s.manifest.model_type == "voice_design" or speaker_for(s.manifest, name)]
        if takers:
            mapped = {speaker_for(s.manifest, name) for s in takers} - {None}
            openai.append(Voice(id=name, name=name.title(), kind="openai", models=[s.id for s in takers],
                                description=voice.description,
                                speaker=mapped.pop() if len(mapped) == 1 else None))
    saved = [Voice.model_validate({**entry, "kind": "profile", "models": profile_models(registry, entry)})
             for entry in profiles.entries()]
    if model is not None:
        saved = [v for v in saved if model.id in v.models or (model is registry.default and v.models)]
    return list(speakers.values()) + openai + saved
