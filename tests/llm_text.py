"""Text as an LLM streams it, for the tests of live text (the engine's text streams, `/v1/ws`, Realtime)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

PAUSE_S = 0.01  # long enough for the engine to run dry and wait for text


def llm_deltas(text: str, seed: int = 0) -> Iterator[tuple[str, bool]]:
    """`text` in pieces of 1 to 3 characters, each with whether the sender pauses (PAUSE_S) after it
    (about 3 in 10), from a fixed random sequence."""
    rng = np.random.default_rng(seed)
    i = 0
    while i < len(text):
        n = int(rng.integers(1, 4))
        yield text[i:i + n], bool(rng.random() < 0.3)
        i += n
