"""What goes into the engine (a synthesis request) and what comes out (audio chunks, a result)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .prompt import VoiceSpec
from .sampler import SamplingParams

FINISH_REASONS = ("eos", "max_frames", "budget", "context_full", "cancelled", "error")


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
    weights). seed None draws a fresh seed.
    """

    text: str
    voice: VoiceSpec = VoiceSpec()
    text_mode: str | None = None
    talker: TalkerSampling = TalkerSampling()
    code_predictor: SamplingParams = SamplingParams()
    seed: int | None = None
    max_frames: int | None = None
    ignore_eos: bool = False


@dataclass
class AudioChunk:
    """float32 samples at the model's rate for frames [first_frame, first_frame + n_frames)."""

    samples: np.ndarray
    first_frame: int
    n_frames: int


@dataclass
class SynthesisResult:
    """How a stream ended: frames made, text tokens read, why it stopped, and its codes [T, 16]."""

    frames: int
    text_tokens: int
    finish_reason: str
    codes: np.ndarray = field(default_factory=lambda: np.zeros((0, 16), np.int64))
    error: str | None = None
    timings: dict = field(default_factory=dict)
    retryable: bool = False
    """The engine (not this request) failed: the same request may succeed when retried."""
