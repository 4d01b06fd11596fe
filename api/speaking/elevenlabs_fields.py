"""ElevenLabs' request vocabulary as its HTTP routes (`routes/elevenlabs.py`) and its sockets
(`protocols/elevenlabs_sockets.py`) both take it: `output_format` as this server's encoder makes it, the clock
of that audio (the character timings'), `voice_settings`, `apply_text_normalization`, and the speech request's
fields for a voice, a `model_id` and a `language_code`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat

from qwen3_tts_gguf.audio.formats import G711_MIME_TYPES, MAX_SPEED, MIN_SPEED

from api.errors import invalid_request
from api.registry import ModelRegistry
from api.speaking.http_body import CONTENT_TYPES
from api.voice_resolution import language_of

PCM_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
G711 = {"ulaw_8000": "pcmu", "alaw_8000": "pcma"}
CODED = {"mp3_22050_32": 32, "mp3_24000_48": 48, **{f"mp3_44100_{k}": k for k in (32, 64, 96, 128, 192)},
         "mp3_44100": 128, **{f"opus_48000_{k}": k for k in (32, 64, 96, 128, 192)}}
"""ElevenLabs' mp3 and opus formats and their kb/s (`mp3_44100`: its socket's documented default)."""
HTTP_DEFAULT_FORMAT = "mp3_44100_128"
SOCKET_DEFAULT_FORMAT = "mp3_44100"
TEXT_NORMALIZATION = {"on": "auto", "auto": "off", "off": "off"}
"""ElevenLabs' `apply_text_normalization` -> the speech request's `text_normalization`: `on` normalizes;
`auto` (ElevenLabs' default: "the system decides") is this server's default, the text as written."""


@dataclass(frozen=True)
class OutputFormat:
    """An ElevenLabs `output_format` as this server's encoder makes it."""

    NAMES: ClassVar[tuple[str, ...]] = (*(f"pcm_{rate}" for rate in PCM_RATES), *G711, *CODED)

    name: str
    response_format: str  # pcm, pcmu, pcma, mp3 or opus
    out_rate: int | None  # resampled to this rate (None: the model's own)
    bit_rate: int | None  # mp3's or opus's, bits a second
    bits_per_second: int  # of the bytes (opus: its bit rate, which varies)

    @property
    def content_type(self) -> str:
        return G711_MIME_TYPES.get(self.response_format) or CONTENT_TYPES[self.response_format]

    def clock(self) -> AudioClock:
        """A new clock of one stream's audio in this format."""
        return AudioClock(self)

    @classmethod
    def parse(cls, name: str | None, model_rate: int, default: str = HTTP_DEFAULT_FORMAT) -> OutputFormat:
        """`name` (None: `default`), or APIError 400 `unsupported_output_format` naming what is served."""
        name = name or default
        if name not in cls.NAMES:
            raise invalid_request(f"output_format {name[:40]!r} is not served here: use pcm_<rate> (rates "
                                  f"{', '.join(map(str, PCM_RATES))}), ulaw_8000, alaw_8000, "
                                  f"{', '.join(CODED)}.", param="output_format", code="unsupported_output_format")
        if name in G711:
            return cls(name, G711[name], None, None, 8 * 8000)
        codec, rate = name.split("_")[:2]
        if name in CODED:
            return cls(name, codec, int(rate), 1000 * CODED[name], 1000 * CODED[name])
        return cls(name, "pcm", None if int(rate) == model_rate else int(rate), None, 16 * int(rate))


class AudioClock:
    """How much audio each piece of one stream's bytes carries (the character timings' clock): raw and
    G.711 bytes by their size, mp3 (constant bit rate, no header) by its bit rate, Ogg Opus by the
    granule position of its last complete page (less the stream's pre-skip)."""

    def __init__(self, audio: OutputFormat):
        self.audio = audio
        self._ogg = b""
        """An Ogg page not yet complete (at most one page: 64 KiB)."""
        self._ogg_end_s = 0.0
        self._pre_skip = 0

    def seconds(self, data: bytes) -> float:
        """The audio in `data`, the stream's next bytes, in seconds."""
        if self.audio.response_format != "opus":
            return len(data) * 8 / self.audio.bits_per_second
        before, self._ogg = self._ogg_end_s, self._ogg + data
        while len(self._ogg) >= 27 and len(self._ogg) >= (header := 27 + self._ogg[26]):
            size = header + sum(self._ogg[27:header])
            if len(self._ogg) < size:
                break
            page, self._ogg = self._ogg[:size], self._ogg[size:]
            if page[header:].startswith(b"OpusHead"):
                self._pre_skip = int.from_bytes(page[header + 10:header + 12], "little")
            granule = int.from_bytes(page[6:14], "little", signed=True)  # 48 kHz samples; -1: no packet ends
            if granule > 0:
                self._ogg_end_s = max(self._ogg_end_s, (granule - self._pre_skip) / 48000)
        return self._ogg_end_s - before


def text_normalization_of(value: str | None, param: str = "apply_text_normalization") -> str | None:
    """The speech request's `text_normalization` for ElevenLabs' `apply_text_normalization` (None: not given);
    APIError 400 naming `param` for a value outside `auto`, `on`, `off`."""
    if value is None:
        return None
    if value not in TEXT_NORMALIZATION:
        raise invalid_request(f"{param} is auto, on or off.", param=param)
    return TEXT_NORMALIZATION[value]


class VoiceSettings(BaseModel):
    """ElevenLabs' `voice_settings`: `speed` is honoured (the speech route's atempo, within its domain); the
    others steer ElevenLabs' own models: accepted within their domain, ignored (`ignored`)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    stability: StrictFloat | None = Field(None, ge=0, le=1)
    similarity_boost: StrictFloat | None = Field(None, ge=0, le=1)
    style: StrictFloat | None = Field(None, ge=0, le=1)
    use_speaker_boost: StrictBool | None = None
    speed: StrictFloat | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED, description="tempo, pitch kept")

    @property
    def ignored(self) -> list[str]:
        """`voice_settings.<name>` of each setting given (not null) but `speed`."""
        return [f"voice_settings.{name}" for name in self.model_dump(exclude_none=True) if name != "speed"]


def speech_fields(voice: str, model_id: str | None, language_code: str | None, apply_text_normalization: str | None,
                  registry: ModelRegistry) -> dict[str, Any]:
    """A speech request's fields for what ElevenLabs' routes and sockets name alike (the text, seed and
    speed are each route's own)."""
    fields = {"voice": voice, "model": served_model_id(model_id, registry), "language": language_of(language_code)}
    normalization = text_normalization_of(apply_text_normalization)
    return fields if normalization is None else {**fields, "text_normalization": normalization}


def served_model_id(model_id: str | None, registry: ModelRegistry) -> str:
    """The served model a `model_id` names: ElevenLabs' own `eleven_*` ids (and none) mean the default."""
    return registry.default.id if not model_id or model_id.startswith("eleven_") else model_id
