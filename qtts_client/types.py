"""What the server says, as typed values: stream events and the capabilities document.

Every event keeps the server's JSON in `raw` (fields added by newer servers stay reachable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple, Union


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- stream events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """The utterance runs (`started`): its id, the model and voice used, the audio format."""

    id: str
    model: str
    voice: str
    sample_rate: int
    channels: int
    format: str
    resume_token: Optional[str] = None
    """Set when the server keeps the utterance across a lost connection (`resumable`)."""
    ignored_fields: Tuple[str, ...] = ()
    instructions_ignored: bool = False
    voice_ignored: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_event(cls, event: Dict[str, Any]) -> "Started":
        return cls(id=str(event.get("id")), model=str(event.get("model")), voice=str(event.get("voice")),
                   sample_rate=_int(event.get("sample_rate")) or 24000, channels=_int(event.get("channels")) or 1,
                   format=str(event.get("format")), resume_token=event.get("resume_token") or None,
                   ignored_fields=tuple(event.get("ignored_fields") or ()),
                   instructions_ignored=bool(event.get("instructions_ignored")),
                   voice_ignored=bool(event.get("voice_ignored")), raw=event)


@dataclass(frozen=True)
class Audio:
    """The next bytes of the utterance's audio file (pcm: s16le mono); `offset` is where they start."""

    data: bytes = field(repr=False)
    offset: int

    def __bytes__(self) -> bytes:
        return self.data

    def __len__(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class Progress:
    """How far the speech has come: seconds of audio made, text fed to the engine, text spoken (estimate)."""

    id: str
    audio_end_s: Optional[float]
    text_fed_end: Optional[int]
    spoken_end_estimate: Optional[int]
    basis: Optional[str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Also the optional `normalized_*` fields."""

    @classmethod
    def from_event(cls, event: Dict[str, Any]) -> "Progress":
        return cls(id=str(event.get("id")), audio_end_s=_float(event.get("audio_end_s")),
                   text_fed_end=_int(event.get("text_fed_end")),
                   spoken_end_estimate=_int(event.get("spoken_end_estimate")),
                   basis=event.get("basis"), raw=event)


@dataclass(frozen=True)
class Resumed:
    """The connection was lost and the utterance resumed on a new one (nothing was lost)."""

    id: str
    last_text_seq: int
    """The last text message the server had; the SDK sent the later ones again."""
    audio_bytes: int
    """Audio bytes received before the cut; the server went on from there."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    characters: Optional[int] = None
    normalized_characters: Optional[int] = None
    audio_seconds: Optional[float] = None
    frames: Optional[int] = None
    first_audio_s: Optional[float] = None

    @classmethod
    def from_json(cls, usage: Any) -> "Usage":
        usage = usage if isinstance(usage, dict) else {}
        return cls(input_tokens=_int(usage.get("input_tokens")) or 0,
                   output_tokens=_int(usage.get("output_tokens")) or 0,
                   total_tokens=_int(usage.get("total_tokens")) or 0,
                   characters=_int(usage.get("characters")),
                   normalized_characters=_int(usage.get("normalized_characters")),
                   audio_seconds=_float(usage.get("audio_seconds")), frames=_int(usage.get("frames")),
                   first_audio_s=_float(usage.get("first_audio_s")))


@dataclass(frozen=True)
class Done:
    """The utterance ended: eos, max_frames, budget, cancelled or error (`finish_reason`)."""

    id: str
    finish_reason: str
    usage: Usage
    audio_s: Optional[float] = None
    limit: Optional[str] = None
    """The server limit that ended the text ("idle_timeout", "session_length"), else None."""
    timings: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_event(cls, event: Dict[str, Any]) -> "Done":
        timings = event.get("timings")
        return cls(id=str(event.get("id")), finish_reason=str(event.get("finish_reason")),
                   usage=Usage.from_json(event.get("usage")), audio_s=_float(event.get("audio_s")),
                   limit=event.get("limit"), timings=timings if isinstance(timings, dict) else {}, raw=event)


Event = Union[Audio, Progress, Resumed, Done]
"""What iterating an utterance yields."""


# -- GET /v1/capabilities -------------------------------------------------------------------------


@dataclass(frozen=True)
class ProtocolInfo:
    name: str
    path: str
    subprotocol: Optional[str]
    version: str
    features: Tuple[str, ...]


@dataclass(frozen=True)
class ModelInfo:
    id: str
    type: str
    """custom_voice, voice_design or base."""
    default_text_mode: str


@dataclass(frozen=True)
class Capabilities:
    """What the server offers (GET /v1/capabilities)."""

    protocols: Tuple[ProtocolInfo, ...]
    formats: Tuple[str, ...]
    limits: Dict[str, Any]
    normalization_languages: Tuple[str, ...]
    models: Tuple[ModelInfo, ...]
    """Served models, the default first."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "Capabilities":
        protocols = tuple(ProtocolInfo(name=p["name"], path=p["path"], subprotocol=p.get("subprotocol"),
                                       version=str(p.get("version", "")), features=tuple(p.get("features") or ()))
                          for p in doc.get("protocols") or ())
        models = tuple(ModelInfo(id=m["id"], type=m.get("type", ""), default_text_mode=m.get("default_text_mode", ""))
                       for m in doc.get("models") or ())
        return cls(protocols=protocols, formats=tuple(doc.get("formats") or ()), limits=dict(doc.get("limits") or {}),
                   normalization_languages=tuple((doc.get("normalization") or {}).get("languages") or ()),
                   models=models, raw=doc)

    def protocol(self, name: str) -> Optional[ProtocolInfo]:
        return next((p for p in self.protocols if p.name == name), None)

    def supports(self, protocol: str, feature: Optional[str] = None) -> bool:
        """Whether `protocol` is offered (and has `feature`)."""
        found = self.protocol(protocol)
        return found is not None and (feature is None or feature in found.features)

    @property
    def default_model(self) -> Optional[str]:
        return self.models[0].id if self.models else None
