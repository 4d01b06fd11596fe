"""OpenAI-compatible HTTP server for Qwen3-TTS-X (FastAPI + uvicorn).

Import direction: `api` imports the engine package `qwen3_tts_gguf`, never the other way round.
`create_app` builds the app around loaded models; `server.run_server` is what `serve` runs.
"""

from .app import create_app
from .config import ServerConfig
from .registry import ModelRegistry

__all__ = ["create_app", "ServerConfig", "ModelRegistry"]
