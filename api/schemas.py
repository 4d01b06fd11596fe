"""Request and response bodies of the HTTP API (pydantic), as OpenAI defines them plus extensions.

`SpeechRequest` is OpenAI's `CreateSpeechRequest`; the extension fields (reached with the SDK's
`extra_body`) come after the OpenAI ones. Unknown fields are accepted and ignored (clients send
other servers' extensions such as `stream`); the response names them in a header.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from qwen3_tts_gguf.audio_encoding import MAX_SPEED, MIN_SPEED

MAX_INPUT_CHARS = 4096
MAX_INSTRUCTIONS_CHARS = 4096

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]  # = audio_encoding.FORMATS (a test checks)


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form of `voice`: {"id": "..."}."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str = Field(min_length=1)
    input: str = Field(max_length=MAX_INPUT_CHARS)
    voice: str | VoiceRef
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    response_format: ResponseFormat = "mp3"
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    stream_format: Literal["audio", "sse"] = "audio"
    # -- extensions -------------------------------------------------------------------------
    language: str | None = Field(None, description="auto (default), english, chinese, ...")
    text_mode: Literal["non-streaming", "streaming"] | None = Field(
        None, description="prompt layout; default: the model's official default")
    seed: int | None = Field(None, ge=0, description="fixed seed for reproducible sampling")
    temperature: float | None = Field(None, ge=0, description="talker temperature; 0 = greedy decoding")
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    max_frames: int | None = Field(None, ge=1, description="cap on codec frames (80 ms each)")

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_shape(cls, value: object) -> object:
        if isinstance(value, str) or (isinstance(value, dict) and set(value) == {"id"}):
            return value
        raise PydanticCustomError("voice_type", 'expected a voice name or {"id": "<voice id>"}')

    @field_validator("input")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("empty_input", "the input text is empty")
        return value

    @property
    def voice_id(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    @property
    def ignored_fields(self) -> tuple[str, ...]:
        """Fields this server does not know (sent for other servers); they change nothing."""
        return tuple(sorted(self.model_extra or ()))


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int


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
