"""Liveness and readiness: GET /health (the process can serve: 503 only when an engine was given
up, so a liveness probe replaces it) and GET /ready (every engine running; 503 with the reason and
`Retry-After` while one restarts, or at once when the server starts draining to stop)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.errors import error_responses, unavailable
from api.ops.lifecycle import PROCESS, draining_error
from api.schemas import Health, Readiness
from api.state import get_state

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, responses=error_responses(503))
async def health(request: Request) -> dict:
    """Alive: 200 unless an engine was given up for good (then 503: replace this process)."""
    for served, engine in get_state(request).registry.health():
        if engine.status == "dead":
            raise unavailable(f"The engine of model '{served.id}' failed for good: {engine.reason}.")
    return {"status": "ok"}


@router.get("/ready", response_model=Readiness, responses=error_responses(503))
async def ready(request: Request) -> dict:
    """200 with each model's load when every engine is running; 503 otherwise (and while draining)."""
    if PROCESS.draining:
        raise draining_error()
    registry = get_state(request).registry
    if not registry.running:
        raise unavailable("The models are not loaded yet (or the server is stopping).", retry_after_s=1)
    for served, engine in registry.health():
        if engine.status == "dead":
            raise unavailable(f"The engine of model '{served.id}' failed for good: {engine.reason}.")
        if not engine.ok:
            raise unavailable(f"The engine of model '{served.id}' is restarting: {engine.reason}.",
                              retry_after_s=1)
    return {"status": "ready", "models": [
        {"id": served.id, "default": served is registry.default, "type": served.manifest.model_type,
         **served.engine.load()} for served in registry.models]}
