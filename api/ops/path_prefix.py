"""The domain of a path prefix: `serve --root-path` and a trusted proxy's `X-Forwarded-Prefix`
(`api/ops/forwarded.py`). Standard library only: `serve`'s flags (`api/cli_args.py`) import it."""

from __future__ import annotations

import re

MAX_PREFIX_CHARS = 256
_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")


def path_prefix(text: str) -> str:
    """A path prefix ("/tts", "/a/b") from `text` ("tts", "/tts/", "" for none): segments of letters,
    digits and `. _ ~ -`, not `.` or `..`, at most 256 characters. ValueError otherwise."""
    inner = text.strip().strip("/")
    segments = inner.split("/") if inner else []
    prefix = "".join("/" + s for s in segments)
    if len(prefix) > MAX_PREFIX_CHARS or any(not _SEGMENT.fullmatch(s) or s in (".", "..") for s in segments):
        raise ValueError(f"{text[:64]!r} is not a path prefix (like /tts: segments of letters, digits and . _ ~ -, "
                         f"at most {MAX_PREFIX_CHARS} characters)")
    return prefix

