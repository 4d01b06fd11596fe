"""Qwen3-TTS-X engine: Qwen3-TTS as a GGUF talker (llama.cpp) plus the code predictor and codec (ONNX Runtime
or the project's ggml graphs). It knows nothing of HTTP; the server lives in `api/`.

What a user of the library needs is here, imported when first used (so `serve --help` stays fast):

    from qwen3_tts_gguf import Engine, EngineSettings, LoadedModel, SynthesisRequest, VoiceSpec

    with Engine(LoadedModel("model-base/<name>", EngineSettings())) as engine:
        stream = engine.submit(SynthesisRequest("Hello there.", VoiceSpec(speaker="ryan")))
        for chunk in stream:        # AudioChunk: float32 samples at the model's sample rate
            ...
        print(stream.result)        # SynthesisResult: frames, finish reason, timings
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_FACE = {
    "qwen3_tts_gguf.engine.scheduler": ("Engine",),
    "qwen3_tts_gguf.engine.health": ("EngineBusy", "EngineHealth", "EngineStopped"),
    "qwen3_tts_gguf.engine.stream": ("Stream",),
    "qwen3_tts_gguf.engine.request": ("AudioChunk", "SynthesisRequest", "SynthesisResult", "TalkerSampling",
                                      "TextProgress"),
    "qwen3_tts_gguf.model.loaded": ("LoadedModel",),
    "qwen3_tts_gguf.model.settings": ("EngineSettings",),
    "qwen3_tts_gguf.model.manifest": ("Manifest", "ModelFolderError"),
    "qwen3_tts_gguf.model.prompt": ("ContextLengthExceeded", "PromptError", "ReferencePrompt", "VoiceSpec"),
    "qwen3_tts_gguf.model.sampler": ("SamplingParams",),
    "qwen3_tts_gguf.voicebank.store": ("VoiceNotFoundError", "VoiceProfile", "VoiceProfileError", "VoiceStore"),
    "qwen3_tts_gguf.voicebank.clone": ("ReferenceAudioError", "VoiceCloner"),
}
"""The engine's public names, by the module that defines each."""
_WHERE = {name: module for module, names in _FACE.items() for name in names}
__all__ = sorted(_WHERE)

if TYPE_CHECKING:  # what type checkers and editors read (the names of _FACE); at run time `__getattr__` imports
    from qwen3_tts_gguf.engine.health import EngineBusy, EngineHealth, EngineStopped
    from qwen3_tts_gguf.engine.request import (
        AudioChunk,
        SynthesisRequest,
        SynthesisResult,
        TalkerSampling,
        TextProgress,
    )
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.engine.stream import Stream
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.manifest import Manifest, ModelFolderError
    from qwen3_tts_gguf.model.prompt import ContextLengthExceeded, PromptError, ReferencePrompt, VoiceSpec
    from qwen3_tts_gguf.model.sampler import SamplingParams
    from qwen3_tts_gguf.model.settings import EngineSettings
    from qwen3_tts_gguf.voicebank.clone import ReferenceAudioError, VoiceCloner
    from qwen3_tts_gguf.voicebank.store import VoiceNotFoundError, VoiceProfile, VoiceProfileError, VoiceStore


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'qwen3_tts_gguf' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
