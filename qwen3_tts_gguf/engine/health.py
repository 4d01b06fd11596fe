"""What the engine tells its callers about itself: health, and why it refuses a request."""

from __future__ import annotations

from dataclasses import dataclass


class EngineBusy(RuntimeError):
    """Too many requests are waiting for a slot."""


class EngineStopped(RuntimeError):
    """The engine is not running. `retry_after_s`: when a retry may succeed (None: it will not)."""

    def __init__(self, message: str = "the engine is not running", retry_after_s: int | None = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class EngineHealth:
    """What the supervisor and `/ready` need: is the worker serving, and if not, why."""

    status: str  # "running" | "stopped" | "failed" (worker died: restart it) | "dead" (gave up)
    reason: str | None = None
    restarts: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "running"
