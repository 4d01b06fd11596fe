"""Model and voice listings: GET /v1/models, /v1/models/{id}, /v1/audio/models, /v1/audio/voices."""

from __future__ import annotations

from fastapi import APIRouter, Path, Query, Request

from api.errors import error_responses
from api.registry import ModelRegistry, ServedModel
from api.schemas import MAX_ID_CHARS, AudioModel, AudioModelList, ModelCard, ModelList, Voice, VoiceList
from api.state import get_state
from api.voices import OFFICIAL_SPEAKERS, OPENAI_VOICES, VoiceProfiles, speaker_for

router = APIRouter(tags=["models"])


def card(card_id: str, served: ServedModel) -> ModelCard:
    """OpenAI's Model object for `served` under the name `card_id`, plus what its manifest says."""
    manifest = served.manifest
    return ModelCard(
        id=card_id, created=served.created, root=served.id, model_type=manifest.model_type,
        model_size=manifest.model_size, instruct_supported=bool(manifest.instruct_supported),
        languages=[name for name in manifest.languages if "dialect" not in name],  # the engine's rule
        speakers=list(manifest.speakers), default_text_mode=manifest.default_text_mode)


def model_cards(registry: ModelRegistry) -> list[ModelCard]:
    """Every served model, then OpenAI's ids as aliases of the default (`root` names the model)."""
    return [card(m.id, m) for m in registry.models] + [card(alias, registry.default) for alias in registry.aliases]


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


@router.get("/v1/models", response_model=ModelList, responses=error_responses(400, 401))
async def list_models(request: Request) -> ModelList:
    """OpenAI's model list: served models plus the OpenAI TTS ids that alias the default."""
    return ModelList(data=model_cards(get_state(request).registry))


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=error_responses(400, 401, 404))
async def retrieve_model(request: Request, model_id: str = Path(max_length=MAX_ID_CHARS)) -> ModelCard:
    """One model by id, alias or folder name (404 in the OpenAI envelope otherwise); `id` is the name asked for."""
    return card(model_id, get_state(request).registry.resolve(model_id))


@router.get("/v1/audio/models", response_model=AudioModelList, responses=error_responses(400, 401))
async def list_audio_models(request: Request) -> AudioModelList:
    """`{"models": [{"id"}]}`, the shape Open WebUI reads."""
    return AudioModelList(models=[AudioModel(id=card.id) for card in model_cards(get_state(request).registry)])


@router.get("/v1/audio/voices", response_model=VoiceList, response_model_exclude_none=True,
            responses=error_responses(400, 401, 404))
async def list_voices(request: Request, model: str | None = Query(None, max_length=MAX_ID_CHARS,
                                                                 description="only this model's voices")
                      ) -> VoiceList:
    """`{"voices": [{"id", "name", ...}]}`, the shape Open WebUI and SillyTavern read."""
    state = get_state(request)
    served = state.registry.resolve(model) if model else None
    return VoiceList(voices=voice_entries(state.registry, state.voice_profiles, served))
