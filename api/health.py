"""Liveness and readiness: GET /health (the process answers) and GET /ready (engines running)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from .errors import unavailable
from .state import get_state

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict:
    """Alive (no auth, no model needed)."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> dict:
    """200 with each model's load when every engine is running; 503 otherwise."""
    registry = get_state(request).registry
    if not registry.running:
        raise unavailable("The models are not loaded yet (or the server is stopping).")
    return {"status": "ready", "models": [
        {"id": served.id, "default": served is registry.default, "type": served.manifest.model_type,
         **served.engine.load()} for served in registry.models]}
