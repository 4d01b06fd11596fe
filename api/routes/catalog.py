"""Model and voice listings: GET /v1/models, /v1/models/{id}, /v1/audio/models, /v1/audio/voices; and the same
catalogue in ElevenLabs' shapes: GET /v1/voices, /v1/voices/{id}, /v2/voices (`elevenlabs_router`), and its
model list at `/v1/models` for a client that sends `xi-api-key` (ElevenLabs' clients do, OpenAI's never) and
always under the `/elevenlabs` prefix (`elevenlabs_models`, mounted there only: `app.py`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Header, Path, Query, Request

from api.errors import APIError, error_responses
from api.registry import ModelRegistry, ServedModel
from api.schemas import (
    MAX_ID_CHARS,
    AudioModel,
    AudioModelList,
    ElevenLabsLanguage,
    ElevenLabsModel,
    ElevenLabsVoice,
    ElevenLabsVoicePage,
    ElevenLabsVoices,
    Identifier,
    ModelCard,
    ModelList,
    Voice,
    VoiceList,
)
from api.state import get_state
from api.voice_resolution import LANGUAGE_CODES, voice_entries

router = APIRouter(tags=["models"])
elevenlabs_router = APIRouter(tags=["models"])
elevenlabs_models = APIRouter(tags=["models"])


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


@router.get("/v1/models", response_model=ModelList | list[ElevenLabsModel], responses=error_responses(400, 401))
async def list_models(request: Request, xi_api_key: str | None = Header(
        None, alias="xi-api-key", max_length=MAX_ID_CHARS,
        description="ElevenLabs' clients send their key here: they get ElevenLabs' model list")
                      ) -> ModelList | list[ElevenLabsModel]:
    """OpenAI's model list: served models plus the OpenAI TTS ids that alias the default; with `xi-api-key`,
    the same models in ElevenLabs' shape (a list of `{"model_id", "name", "languages", ...}`)."""
    cards = model_cards(get_state(request).registry)
    return ModelList(data=cards) if xi_api_key is None else [elevenlabs_model(c) for c in cards]


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


# -- ElevenLabs' shapes ------------------------------------------------------------------------------------


def _language(name: str) -> ElevenLabsLanguage:
    return ElevenLabsLanguage(language_id=LANGUAGE_CODES.get(name, name), name=name.replace("_", " ").title())


def elevenlabs_model(card: ModelCard) -> ElevenLabsModel:
    """A model card as an entry of ElevenLabs' model list."""
    alias = f", serving {card.root}" if card.root != card.id else ""
    return ElevenLabsModel(model_id=card.id, name=card.id, languages=[_language(n) for n in card.languages],
                           description=f"Qwen3-TTS {card.model_size} {card.model_type}{alias}")


def _unix_time(value: str | int | None) -> int | None:
    if isinstance(value, int) or value is None:
        return value
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def elevenlabs_voice(voice: Voice) -> ElevenLabsVoice:
    """A `/v1/audio/voices` entry in ElevenLabs' `Voice` shape."""
    language = voice.language and LANGUAGE_CODES.get(voice.language, voice.language)
    return ElevenLabsVoice(voice_id=voice.id, name=voice.name,
                           category="cloned" if voice.kind == "profile" else "premade",
                           labels={k: v for k, v in (("gender", voice.gender), ("language", language)) if v},
                           description=voice.description,
                           created_at_unix=_unix_time(voice.created_at), models=voice.models)


def elevenlabs_voices(request: Request) -> list[ElevenLabsVoice]:
    state = get_state(request)
    return [elevenlabs_voice(v) for v in voice_entries(state.registry, state.voice_profiles)]


@elevenlabs_models.get("/v1/models", response_model=list[ElevenLabsModel], responses=error_responses(400, 401))
async def list_elevenlabs_models(request: Request) -> list[ElevenLabsModel]:
    """ElevenLabs' model list (under `/elevenlabs` only: `/v1/models` is OpenAI's unless `xi-api-key` is sent)."""
    return [elevenlabs_model(c) for c in model_cards(get_state(request).registry)]


@elevenlabs_router.get("/v1/voices", response_model=ElevenLabsVoices, responses=error_responses(400, 401))
async def list_elevenlabs_voices(request: Request, show_legacy: bool | None = Query(None, description="ignored")
                                 ) -> ElevenLabsVoices:
    """ElevenLabs' voice list (the SDK's `voices.get_all()`): every voice of `/v1/audio/voices`."""
    return ElevenLabsVoices(voices=elevenlabs_voices(request))


@elevenlabs_router.get("/v1/voices/{voice_id}", response_model=ElevenLabsVoice,
                       responses=error_responses(400, 401, 404))
async def get_elevenlabs_voice(request: Request, voice_id: str = Path(max_length=MAX_ID_CHARS),
                               with_settings: bool | None = Query(None, description="ignored")) -> ElevenLabsVoice:
    """One voice in ElevenLabs' shape (the SDK's `voices.get()`); 404 `voice_not_found`."""
    found = next((v for v in elevenlabs_voices(request) if v.voice_id == voice_id), None)
    if found is None:
        raise APIError(f"No voice {voice_id!r} here: GET /v1/voices lists them.", status_code=404, param="voice_id",
                       code="voice_not_found")
    return found


VOICE_TYPES = {"default": {"premade"}, "community": set(),
               **{t: {"cloned"} for t in ("personal", "workspace", "non-default", "non-community", "saved")}}
"""ElevenLabs' `voice_type` filter -> the categories it keeps here (its defaults are the premade voices, the
account's own the profiles; nothing here comes from its community)."""


@elevenlabs_router.get("/v2/voices", response_model=ElevenLabsVoicePage, responses=error_responses(400, 401))
async def search_elevenlabs_voices(
        request: Request,
        page_size: int = Query(10, ge=1, le=100, description="voices a page"),
        next_page_token: str | None = Query(None, pattern=r"^[0-9]{1,9}$", description="from the page before"),
        search: str | None = Query(None, max_length=MAX_ID_CHARS,
                                   description="in the name, description, labels and category (any case)"),
        sort: Literal["created_at_unix", "name"] | None = Query(None, description="default: the catalogue's order"),
        sort_direction: Literal["asc", "desc"] = Query("desc", description="with `sort`"),
        voice_type: Literal["default", "community", "personal", "workspace", "non-default", "non-community",
                            "saved"] | None = Query(None, description="default: premade; personal, workspace, "
                                                                      "non-default ...: profiles"),
        category: Literal["premade", "cloned", "generated", "professional", "famous", "high_quality"] | None = None,
        gender: str | None = Query(None, max_length=MAX_ID_CHARS),
        language: str | None = Query(None, max_length=MAX_ID_CHARS, description="ISO 639-1 or a language's name"),
        voice_ids: list[Identifier] | None = Query(None, max_length=100, description="only these voices"),
        include_total_count: bool | None = Query(None, description="accepted: the count is always given"),
) -> ElevenLabsVoicePage:
    """ElevenLabs' voice search (the SDK's `voices.search()`): the ElevenLabs-shaped catalogue filtered, sorted
    and paged; `next_page_token` is an offset. Other filters of ElevenLabs' (age, accent, use cases ...) are
    not served (the catalogue has no such labels)."""
    voices = elevenlabs_voices(request)
    keep = VOICE_TYPES[voice_type] if voice_type else None
    needle = (search or "").lower()
    language = LANGUAGE_CODES.get((language or "").lower(), language)
    voices = [v for v in voices if (keep is None or v.category in keep)
              and (category is None or v.category == category)
              and (gender is None or v.labels.get("gender") == gender.lower())
              and (language is None or v.labels.get("language") == language.lower())
              and (voice_ids is None or v.voice_id in voice_ids)
              and needle in " ".join([v.name, v.description or "", v.category, *v.labels.values()]).lower()]
    if sort is not None:
        voices.sort(key=lambda v: (v.name.lower() if sort == "name" else v.created_at_unix or 0),
                    reverse=sort_direction == "desc")
    start = int(next_page_token or 0)
    page = voices[start:start + page_size]
    more = start + page_size < len(voices)
    return ElevenLabsVoicePage(voices=page, has_more=more, total_count=len(voices),
                               next_page_token=str(start + page_size) if more else None)
