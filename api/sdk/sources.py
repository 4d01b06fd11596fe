"""An SDK's source files as the packages take them: one folder's files (not below it), sorted, bounded."""

from __future__ import annotations

from pathlib import Path

MAX_SOURCE_BYTES = 4 * 1024 * 1024
"""The project's own sources are a few dozen KiB; a folder past this is not what it should be."""


def source_files(folder: Path, patterns: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """(name, bytes) of the files of `folder` (not below it) matching `patterns`, sorted by name; ValueError
    past `MAX_SOURCE_BYTES` in all (these are the project's own small sources)."""
    paths = sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()})
    files = [(p.name, p.read_bytes()) for p in paths]
    if sum(len(data) for _, data in files) > MAX_SOURCE_BYTES:
        raise ValueError(f"{folder}: more than {MAX_SOURCE_BYTES} bytes of sources")
    return files
