"""Design-then-clone: keep a designed voice stable across requests.

VoiceDesign makes a new voice from an instruction each time it speaks, so the same instruction
sounds a little different every request. The official guide's flow fixes it: VoiceDesign speaks a
reference sentence once, and a Base model clones that clip (transcript + codes + x-vector) into a
profile that then speaks everything in the same voice.
"""

from __future__ import annotations

import numpy as np

from .prompt import VoiceSpec
from .request import SynthesisRequest
from .scheduler import Engine

REFERENCE_TEXTS = {
    "chinese": "今天的天气很好，我们一起去公园散步吧。阳光照在湖面上，闪闪发光。",
    "english": "The weather is lovely today, so let's take a walk in the park. The sunlight sparkles on the lake.",
}


def reference_text(language: str) -> str:
    """A default sentence for the reference clip (Chinese for Chinese, else English)."""
    return REFERENCE_TEXTS["chinese" if language.lower() == "chinese" else "english"]


def speak_reference(engine: Engine, instructions: str, text: str, language: str = "auto",
                    seed: int | None = 0, max_frames: int = 600) -> np.ndarray:
    """The VoiceDesign model speaks `text` as `instructions` describe: float32 24 kHz samples."""
    if engine.model.manifest.model_type != "voice_design":
        raise ValueError(f"{engine.model.name} is a {engine.model.manifest.model_type} model; "
                         "designing a voice needs a VoiceDesign model")
    if not instructions or not instructions.strip():
        raise ValueError("designing a voice needs instructions describing it")
    stream = engine.submit(SynthesisRequest(text, VoiceSpec(instruct=instructions, language=language),
                                            seed=seed, max_frames=max_frames))
    chunks = [chunk.samples for chunk in stream]
    if stream.result.finish_reason == "error":
        raise RuntimeError(f"voice design failed: {stream.result.error}")
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
