"""OpenAI-compatible HTTP server for Qwen3-TTS-X (FastAPI + uvicorn).

Import direction: `api` imports the engine package `qwen3_tts_gguf`, never the other way round (the
engine's CLI hands `serve` over to `api/cli_args.py`). `create_app` builds the app around loaded
models; `server.run_server` is what `serve` runs. The three names below load on first use, so that
`serve`'s flags (`api.cli_args`) do not import the whole server.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from api.app import create_app
    from api.config import ServerConfig
    from api.registry import ModelRegistry

_EXPORTS = {"create_app": "api.app", "ServerConfig": "api.config", "ModelRegistry": "api.registry"}
__all__ = ["create_app", "ServerConfig", "ModelRegistry"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'api' has no attribute {name!r}")
