"""Waiting for a condition in tests: bounded, polled, never a wall-clock assertion."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], what: str = "condition", timeout_s: float = 30.0) -> None:
    """Poll `predicate` until it holds; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
