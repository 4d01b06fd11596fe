"""Request and response bodies of the HTTP API (pydantic), as OpenAI defines them plus extensions.

`SpeechRequest` is OpenAI's `CreateSpeechRequest`; the extension fields (reached with the SDK's
`extra_body`) come after the OpenAI ones. Unknown fields are accepted and ignored (clients send
other servers' extensions such as `stream`); the response names them in a header.

Every field has a domain, written here and therefore in the OpenAPI document: types are strict (no
`true` for a number, no `2.0` for an integer, no strings for numbers, no NaN or Infinity), numbers
have bounds, strings have lengths. A value outside its domain is a 400 naming the parameter.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    field_validator,
)
from pydantic_core import PydanticCustomError

from qwen3_tts_gguf.audio.formats import MAX_SPEED, MIN_SPEED

MAX_INPUT_CHARS = 4096
MAX_INSTRUCTIONS_CHARS = 4096
MAX_ID_CHARS = 256
"""`model` and `voice` (a name or `{"id"}`): served ids, speakers and profile names are far shorter."""
MAX_LANGUAGE_CHARS = 32
MAX_SEED = 2**53 - 1
"""The largest integer every JSON client (JavaScript) and the OpenAPI document (its bounds are floats) hold
exactly."""
MAX_FRAMES = 6000
"""The `max_frames` ceiling: 6000 codec frames of 80 ms = 8 minutes (the engine's runaway budget and
its context usually end a stream long before)."""
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1_000_000
"""Any top_k at or above the vocabulary (3072 codebook-0 ids) means "off", as 0 does."""
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 100.0

# Python's str.isspace() characters: `input` must have one character outside them (str.strip()
# semantics, which the validator applies); the same class goes into the schema as a pattern.
WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK_PATTERN = f"[^{WHITESPACE}]"

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]  # = audio.formats.FORMATS (a test checks)
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_input", "the input text is empty")
    return value


SpokenText = Annotated[str, Field(max_length=MAX_INPUT_CHARS, json_schema_extra={"pattern": NOT_BLANK_PATTERN}),
                       AfterValidator(_not_blank)]
"""Text to speak: at most MAX_INPUT_CHARS characters, one of them outside WHITESPACE (every route that speaks)."""


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form of `voice`: {"id": "..."}."""

    model_config = ConfigDict(extra="forbid")

    id: Identifier


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, json_schema_extra={"examples": [
        {"model": "tts-1", "input": "Hello! This is a streaming test.", "voice": "alloy", "response_format": "pcm"},
    ]})

    model: Identifier = Field(description="a served model id, folder name or OpenAI alias (tts-1, ...)",
                              examples=["tts-1"])
    input: SpokenText = Field(description="the text to speak (not blank)")
    voice: Identifier | VoiceRef = Field(description='a speaker, an OpenAI voice name or a profile; or {"id": ...}',
                                         examples=["alloy"])
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    response_format: ResponseFormat = "mp3"
    speed: StrictFloat = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    stream_format: Literal["audio", "sse"] = "audio"
    # -- extensions -------------------------------------------------------------------------
    language: str | None = Field(None, max_length=MAX_LANGUAGE_CHARS,
                                 description="auto (default; also when empty), english, chinese, ...")
    text_mode: Literal["non-streaming", "streaming"] | None = Field(
        None, description="prompt layout; default: the model's official default")
    seed: StrictInt | None = Field(None, ge=0, le=MAX_SEED, description="fixed seed for reproducible sampling")
    temperature: StrictFloat | None = Field(None, ge=0, le=MAX_TEMPERATURE,
                                            description="talker temperature; 0 = greedy decoding")
    top_k: StrictInt | None = Field(None, ge=0, le=MAX_TOP_K, description="0 or at least the vocabulary: off")
    top_p: StrictFloat | None = Field(None, ge=0, le=1, description="0 keeps the most likely token only")
    repetition_penalty: StrictFloat | None = Field(None, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY)
    max_frames: StrictInt | None = Field(None, ge=1, le=MAX_FRAMES, description="cap on codec frames (80 ms each)")
    text_normalization: Literal["off", "auto"] = Field(
        "off", description="'auto': numbers, dates, URLs ... spoken as words before tokenizing (zh, en, ja; "
                           "docs/protocols.md); 'off': the text as written (the official behaviour)")
    progress: StrictBool = Field(False, description="text-progress events (SSE `speech.progress`; docs/protocols.md)")
    word_timestamps: StrictBool = Field(
        False, description="SSE `speech.word` events: each word, its estimated start and end (seconds) and its "
                           "offsets into `input` (stream_format sse only; docs/protocols.md)")
    subtitles: Literal["vtt", "srt"] | None = Field(
        None, description="a `speech.subtitles` event at the end: the audio's WebVTT or SubRip file, timed by the "
                          "same estimate (stream_format sse only)")

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_shape(cls, value: object) -> object:
        if isinstance(value, str) or (isinstance(value, dict) and set(value) == {"id"}):
            return value
        raise PydanticCustomError("voice_type", 'expected a voice name or {"id": "<voice id>"}')

    @property
    def voice_id(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    @property
    def ignored_fields(self) -> tuple[str, ...]:
        """Fields this server does not know (sent for other servers); they change nothing."""
        return tuple(sorted(self.model_extra or ()))


class ErrorDetail(BaseModel):
    """OpenAI's error object: all four keys are always present; `param` and `code` may be null."""

    message: str
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error")
    param: str | None = Field(description="the request field at fault")
    code: str | None = Field(description="invalid_value, missing_required_parameter, model_not_found, ...")


class ErrorResponse(BaseModel):
    """Every error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


class Usage(BaseModel):
    """What one stream used (`api/speaking/usage.py`): OpenAI's token counts, then characters, audio and timing."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    characters: int = Field(description="characters of the raw text")
    normalized_characters: int | None = Field(
        description="characters after text normalization; null when the text was not normalized")
    audio_seconds: float = Field(description="seconds of audio made and sent (at speed 1)")
    frames: int = Field(description="codec frames made (= output_tokens; 12.5 a second)")
    first_audio_s: float | None = Field(
        description="seconds from the request's arrival to the first audio sent; null without audio")
    runaways: int = Field(0, description="runaways the engine caught: a segment whose codes looped, or that ran "
                                         "out of the frames its text may take (docs/reliability.md, Runaway)")
    runaway_retries: int = Field(0, description="of those, loops retried with a new random state")


_COUNT = {"type": "integer", "minimum": 0}


def _event(kind: str, **fields: dict) -> dict:
    return {"type": "object", "required": ["type", *fields], "properties": {"type": {"const": kind}, **fields}}


_ERROR_OBJECT = {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
    "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
    "code": {"type": ["string", "null"]}}}
SPEECH_SSE_EVENT = {"oneOf": [
    _event("speech.audio.delta", audio={"type": "string", "contentEncoding": "base64",
                                        "description": "the next bytes of the audio file"}),
    _event("speech.audio.done", usage={"type": "object", "required": list(Usage.model_fields), "properties": {
        **{k: {"type": "integer", "minimum": 0} for k in ("input_tokens", "output_tokens", "total_tokens",
                                                           "characters", "frames", "runaways", "runaway_retries")},
        "normalized_characters": {"type": ["integer", "null"], "minimum": 0},
        "audio_seconds": {"type": "number", "minimum": 0},
        "first_audio_s": {"type": ["number", "null"], "minimum": 0}}}),
    _event("speech.progress", audio_end_s={"type": "number", "minimum": 0},
           text_fed_end=_COUNT, spoken_end_estimate=_COUNT, basis={"enum": ["frames_per_token", "final"]}),
    _event("speech.word", word={"type": "string"}, start_s={"type": "number", "minimum": 0},
           end_s={"type": "number", "minimum": 0}, text_start=_COUNT, text_end=_COUNT,
           basis={"enum": ["frames_per_token", "final"]}),
    _event("speech.subtitles", format={"enum": ["vtt", "srt"]}, text={"type": "string"}),
    _event("error", error=_ERROR_OBJECT),
]}
"""One SSE event's JSON (its `data:` line) on the speech route: deltas (each followed by `speech.progress`
and `speech.word`s when asked: `api/speaking/progress.py`, `timings.py`), then `speech.subtitles` when
asked and `done`, or an `error` last."""


def speech_sse_openapi() -> dict:
    """The `text/event-stream` media type object of the speech route (OpenAPI 3.2's `itemSchema`:
    each event has a `data` line holding one JSON object)."""
    return {"itemSchema": {"type": "object", "required": ["data"], "properties": {
        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": SPEECH_SSE_EVENT}}}}


class ModelCard(BaseModel):
    """One entry of GET /v1/models (OpenAI's Model object; `root` names what an alias serves).

    After OpenAI's fields come extensions from the served model's manifest (an alias carries those
    of the model it names), so clients such as the web console need not guess what a model can do.
    """

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "qwen3-tts-x"
    root: str
    # -- extensions (manifest) ------------------------------------------------------------------
    model_type: str = Field(
        description="custom_voice (named speakers), voice_design (instructions describe the voice) or "
                    "base (voice profiles only)")
    model_size: str = Field(description='"0.6b" or "1.7b"')
    instruct_supported: bool = Field(description="whether `instructions` steer the voice (else ignored)")
    languages: list[str] = Field(description="`language` values besides auto (dialects are picked by "
                                             "their speakers, not listed)")
    speakers: list[str] = Field(description="named speakers (CustomVoice models; empty otherwise)")
    default_text_mode: str = Field(
        description="the `text_mode` a request gets when it names none")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class AudioModel(BaseModel):
    id: str


class AudioModelList(BaseModel):
    """GET /v1/audio/models (the shape Open WebUI reads)."""

    models: list[AudioModel]


class Voice(BaseModel):
    """One entry of GET /v1/audio/voices (Open WebUI and SillyTavern read `id` and `name`)."""

    id: str
    name: str
    kind: Literal["speaker", "openai", "profile"]
    models: list[str]
    gender: str | None = None
    language: str | None = None
    description: str | None = None
    speaker: str | None = Field(None, description="the speaker an OpenAI voice name maps to")
    # -- voice profiles ---------------------------------------------------------------------------
    mode: str | None = Field(
        None, description="a profile's clone mode: icl (with its transcript) or xvector (speaker embedding only)")
    model_size: str | None = Field(None, description="the Base model size a profile was made with")
    created_at: str | int | None = Field(None, description="when a profile was made (ISO 8601, UTC)")


class VoiceList(BaseModel):
    voices: list[Voice]


# -- ElevenLabs' listings (`GET /v1/voices`, `/v2/voices`, `/v1/voices/{id}`; `/v1/models` for its clients) --


class ElevenLabsVoice(BaseModel):
    """A voice of `VoiceList` in ElevenLabs' `Voice` shape: its fields this server can fill, then `models`."""

    voice_id: str
    name: str
    category: Literal["premade", "cloned"] = Field(description="premade: a speaker or an OpenAI name; cloned: a "
                                                               "voice profile")
    labels: dict[str, str] = Field(description="gender and language (ISO 639-1 where it has one)")
    description: str | None = None
    preview_url: None = None
    available_for_tiers: list[str] = Field(default_factory=list)
    settings: None = None
    created_at_unix: int | None = Field(None, description="when a profile was made")
    models: list[str] = Field(description="the served models that speak it (as `/v1/audio/voices` says)")


class ElevenLabsVoices(BaseModel):
    """GET /v1/voices: ElevenLabs' `GetVoicesResponse`."""

    voices: list[ElevenLabsVoice]


class ElevenLabsVoicePage(BaseModel):
    """GET /v2/voices: ElevenLabs' `GetVoicesV2Response`, one page."""

    voices: list[ElevenLabsVoice]
    has_more: bool
    total_count: int = Field(description="voices matching the query, all pages")
    next_page_token: str | None = Field(description="`next_page_token` of the next page; null on the last")


class ElevenLabsLanguage(BaseModel):
    language_id: str = Field(description="ISO 639-1 where it has one")
    name: str


class ElevenLabsModel(BaseModel):
    """One entry of ElevenLabs' model list (its `Model` shape): a served model or alias."""

    model_id: str
    name: str
    description: str
    can_do_text_to_speech: bool = True
    can_do_voice_conversion: bool = False
    can_be_finetuned: bool = False
    can_use_style: bool = False
    can_use_speaker_boost: bool = False
    serves_pro_voices: bool = False
    requires_alpha_access: bool = False
    maximum_text_length_per_request: int = MAX_INPUT_CHARS
    max_characters_request_free_user: int = MAX_INPUT_CHARS
    max_characters_request_subscribed_user: int = MAX_INPUT_CHARS
    languages: list[ElevenLabsLanguage]


class VoiceCreated(BaseModel):
    """POST /v1/audio/voices: the profile made."""

    model_config = ConfigDict(extra="allow")

    object: Literal["audio.voice"] = "audio.voice"
    id: str
    name: str
    created_at: int
    mode: str = Field(description="icl (with its transcript) or xvector (speaker embedding only)")
    model: str = Field(description="the Base model it was made with")


class VoiceDeleted(BaseModel):
    """DELETE /v1/audio/voices/{voice_id}."""

    model_config = ConfigDict(extra="allow")

    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"
    id: str
    deleted: bool


class Health(BaseModel):
    """GET /health."""

    status: Literal["ok"] = "ok"


class EngineReadiness(BaseModel):
    """One served model's engine in GET /ready: its id and type, then its load (`Engine.load()`:
    active, waiting, free_slots, ...)."""

    model_config = ConfigDict(extra="allow")

    id: str
    default: bool
    type: str


class Readiness(BaseModel):
    """GET /ready (200 only while every engine runs)."""

    status: Literal["ready"] = "ready"
    models: list[EngineReadiness]


VOICE_NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # = qwen3_tts_gguf.voicebank.store.NAME_RE (a test checks)


def voice_upload_openapi(field_chars: dict[str, int]) -> dict:
    """`openapi_extra` of POST /v1/audio/voices: its multipart body (the route reads the form
    itself, so FastAPI cannot describe it). `field_chars`: the route's character limits per field."""

    def text(name: str, description: str) -> dict:
        return {"type": "string", "maxLength": field_chars[name], "description": description}

    properties = {
        "name": {"type": "string", "minLength": 1, "maxLength": field_chars["name"], "pattern": VOICE_NAME_PATTERN,
                 "description": "the profile's name: a letter or digit, then letters, digits, _ . - (no '..'); "
                                "409 when it exists and `overwrite` is not true"},
        "audio_sample": {"type": "string", "format": "binary",
                         "description": "a clip of the voice (any common format, 1-30 s); or send `instructions`"},
        "audio": {"type": "string", "format": "binary", "description": "another name for `audio_sample`"},
        "text": text("text", "the clip's transcript: an in-context clone (without it: x-vector only)"),
        "instructions": text("instructions", "design the voice from this description through a served "
                                             "VoiceDesign model, instead of a clip"),
        "model": text("model", "the Base model to clone with (default: the first served one)"),
        "language": text("language", "the profile's language (default auto)"),
        "overwrite": {"type": "boolean", "default": False, "description": "replace a profile of the same name"},
        "consent": {"type": "string", "description": "OpenAI's consent field: accepted and ignored"},
    }
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {
        "schema": {"type": "object", "required": ["name"], "properties": properties},
        "encoding": {"audio_sample": {"contentType": "application/octet-stream"},
                     "audio": {"contentType": "application/octet-stream"}}}}}}
