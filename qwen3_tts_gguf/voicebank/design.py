"""Design-then-clone: keep a designed voice stable across requests.

VoiceDesign makes a new voice from an instruction each time it speaks, so the same instruction
sounds a little different every request. The official guide's flow fixes it: VoiceDesign speaks a
reference sentence once, and a Base model clones that clip (transcript + codes + x-vector) into a
profile that then speaks everything in the same voice.

A design can be cancelled from another thread (a server whose client left): pass a `Cancellation`
and `set()` it; the engine stream stops at its next iteration and `speak_reference` raises
`Cancelled`.
"""

from __future__ import annotations

import threading

import numpy as np

from qwen3_tts_gguf.engine.request import SynthesisRequest
from qwen3_tts_gguf.engine.scheduler import Engine, EngineStopped, Stream
from qwen3_tts_gguf.model.prompt import VoiceSpec


class Cancelled(Exception):
    """The work was cancelled through its `Cancellation`."""


class VoiceDesignError(RuntimeError):
    """The engine failed while speaking the reference."""


class Cancellation:
    """A thread-safe cancel flag that also cancels the engine stream attached to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._stream: Stream | None = None

    def set(self) -> None:
        with self._lock:
            self._set = True
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def is_set(self) -> bool:
        return self._set

    def check(self) -> None:
        """Raise `Cancelled` once set."""
        if self._set:
            raise Cancelled()

    def attach(self, stream: Stream) -> None:
        """Cancel `stream` when this is set (at once if it is set already)."""
        with self._lock:
            self._stream = stream
            cancelled = self._set
        if cancelled:
            stream.cancel()

REFERENCE_TEXTS = {
    "chinese": "今天的天气很好，我们一起去公园散步吧。阳光照在湖面上，闪闪发光。",
    "english": "The weather is lovely today, so let's take a walk in the park. The sunlight sparkles on the lake.",
}


def reference_text(language: str) -> str:
    """A default sentence for the reference clip (Chinese for Chinese, else English)."""
    return REFERENCE_TEXTS["chinese" if language.lower() == "chinese" else "english"]


def speak_reference(engine: Engine, instructions: str, text: str, language: str = "auto",
                    seed: int | None = 0, max_frames: int = 600, cancel: Cancellation | None = None) -> np.ndarray:
    """The VoiceDesign model speaks `text` as `instructions` describe: float32 24 kHz samples.

    Raises PromptError for input the model cannot take, EngineBusy / EngineStopped as `submit`
    does (EngineStopped also when the engine stops meanwhile), `Cancelled` when `cancel` is set,
    VoiceDesignError when the engine fails.
    """
    if engine.model.manifest.model_type != "voice_design":
        raise ValueError(f"{engine.model.name} is a {engine.model.manifest.model_type} model; "
                         "designing a voice needs a VoiceDesign model")
    if not instructions or not instructions.strip():
        raise ValueError("designing a voice needs instructions describing it")
    if cancel is not None:
        cancel.check()
    stream = engine.submit(SynthesisRequest(text, VoiceSpec(instruct=instructions, language=language),
                                            seed=seed, max_frames=max_frames))
    if cancel is not None:
        cancel.attach(stream)
    chunks = [chunk.samples for chunk in stream]
    reason = stream.result.finish_reason
    if cancel is not None:
        cancel.check()
    if reason == "cancelled":  # not by us: the engine stopped
        raise EngineStopped("the engine stopped while it designed the voice")
    if reason == "error":
        raise VoiceDesignError(f"voice design failed: {stream.result.error}")
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
