"""What goes into the engine (a synthesis request) and what comes out (audio chunks, a result)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.text.normalization import TEXT_NORMALIZATION

FINISH_REASONS = ("eos", "max_frames", "budget", "runaway", "context_full", "cancelled", "error")
"""budget: the last segment ran out of the frames its text may take; runaway: its codebook 0 looped
(engine/runaway.py)."""


@dataclass(frozen=True)
class TalkerSampling:
    """Codebook-0 sampling: the code predictor's settings plus the repetition penalty."""

    params: SamplingParams = SamplingParams()
    repetition_penalty: float = 1.05

    def __post_init__(self) -> None:
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


@dataclass(frozen=True)
class SynthesisRequest:
    """One utterance to synthesise.

    text_mode None means the model's official default (from its manifest). max_frames caps the
    frames (EOS still ends earlier); ignore_eos generates exactly max_frames (benchmarks, random
    weights). seed None draws a fresh seed. text_normalization "auto" speaks written forms
    ("$5", "2026-11-30") as words in the voice's language (zh, en, ja; "auto": the text's first
    character decides; `text_normalization.py`); "off" (the default) speaks the text as given.
    """

    text: str
    voice: VoiceSpec = VoiceSpec()
    text_mode: str | None = None
    talker: TalkerSampling = TalkerSampling()
    code_predictor: SamplingParams = SamplingParams()
    seed: int | None = None
    max_frames: int | None = None
    ignore_eos: bool = False
    text_normalization: str = "off"

    def __post_init__(self) -> None:
        if self.text_normalization not in TEXT_NORMALIZATION:
            raise ValueError(f"text_normalization must be one of {', '.join(TEXT_NORMALIZATION)}, "
                             f"got {self.text_normalization!r}")


@dataclass(frozen=True)
class TextProgress:
    """How far the text has got, in code points of the raw text (as given, or every pushed delta
    joined); the `normalized_*` twins count in the normalized (spoken) text, None when off.

    text_fed_end: exact; the end of the text tokens the talker had read when the frame was made
      (streaming text mode reads one per frame, ahead of the speech: an upper bound on it).
    spoken_end_estimate: <= text_fed_end, never decreasing over a stream; `basis` says how:
      "frames_per_token": the text of the first frames / SPOKEN_FRAMES_PER_TOKEN tokens of the
      segment (text_sources.py), at most the fed ones; "final": the values at the end.
    """

    text_fed_end: int
    spoken_end_estimate: int
    basis: str
    normalized_text_fed_end: int | None = None
    normalized_spoken_end_estimate: int | None = None


@dataclass
class AudioChunk:
    """float32 samples at the model's rate for frames [first_frame, first_frame + n_frames).

    progress: the text's progress as of the chunk's last frame (None only where progress failed)."""

    samples: np.ndarray
    first_frame: int
    n_frames: int
    progress: TextProgress | None = None


@dataclass
class SynthesisResult:
    """How a stream ended: frames made, text tokens read, why it stopped, and its codes [T, 16].

    progress: the final text progress (every text mode; basis "final"): the whole text when the
    stream ended at EOS or had read all of it, else what was read; spoken = fed at the end.
    text_chars / normalized_chars: raw characters received / spoken after normalization (None
    when normalization is off) for usage accounting."""

    frames: int
    text_tokens: int
    finish_reason: str
    codes: np.ndarray = field(default_factory=lambda: np.zeros((0, 16), np.int64))
    error: str | None = None
    timings: dict = field(default_factory=dict)
    retryable: bool = False
    """The engine (not this request) failed: the same request may succeed when retried."""
    progress: TextProgress | None = None
    text_chars: int = 0
    normalized_chars: int | None = None
    runaway: list[dict] = field(default_factory=list)
    """The stream's runaways, in order (runaway.RunawayEvent.as_dict: kind, action, segment, frame, period)."""
