"""What the routes share: one AppState per app, at `app.state.qtts`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request

from api.config import ServerConfig
from api.ops.metrics import Metrics
from api.registry import ModelRegistry
from api.voice_resolution import NoVoiceProfiles, VoiceProfiles


@dataclass
class AppState:
    """The served models, settings, metrics, voice profiles and the audio encoders' threads."""

    config: ServerConfig
    registry: ModelRegistry
    metrics: Metrics = field(default_factory=Metrics)
    voice_profiles: VoiceProfiles = field(default_factory=NoVoiceProfiles)
    encoder_pool: ThreadPoolExecutor | None = None
    """Created and shut down by the app's lifespan."""


def get_state(request: Request) -> AppState:
    """The AppState of the app serving `request` (works for WebSocket routes' `websocket.app` too)."""
    return request.app.state.qtts
