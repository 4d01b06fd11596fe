"""Where user data lives: converted models (`model-base/`) and voice profiles (`voices/`).

Both default to the folders at the top of the project checkout; environment variables
QTTS_MODEL_BASE and QTTS_VOICES_DIR (or command-line flags) point elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from qwen3_tts_gguf.model.manifest import MANIFEST

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def model_base_dir() -> Path:
    return Path(os.environ.get("QTTS_MODEL_BASE", PROJECT_ROOT / "model-base"))


def voices_dir() -> Path:
    return Path(os.environ.get("QTTS_VOICES_DIR", PROJECT_ROOT / "voices"))


def installed_models(base: Path | None = None) -> list[Path]:
    """Converted model folders under model-base/ (those with a manifest), sorted by name. Hidden
    folders are the converter's work in progress or an old model moved aside: never listed."""
    base = base or model_base_dir()
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if not p.name.startswith(".") and (p / MANIFEST).is_file())
