"""Qwen3-TTS-X engine: Qwen3-TTS as a GGUF talker (llama.cpp) plus ONNX code predictor and codec.

The engine package knows nothing of HTTP; the server lives in `api/`.
"""

__version__ = "0.1.0"
