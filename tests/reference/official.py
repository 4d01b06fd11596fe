"""Import the official `qwen_tts` package on a machine without sox/torchaudio.

`qwen_tts.core` eagerly imports the 25 Hz tokenizer, whose module imports `sox` and
`torchaudio.compliance.kaldi`; the 12 Hz path never calls them. We register stub modules
with a real ModuleSpec (transformers' `find_spec("torchaudio")` raises on `__spec__ = None`)
and no distribution metadata, so transformers reports torchaudio as unavailable.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
import warnings


def _stub(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    module.__path__ = []
    sys.modules[name] = module
    return module


def install_stubs() -> None:
    """Make `import sox` and `import torchaudio.compliance.kaldi` succeed (idempotent)."""
    if "sox" not in sys.modules:
        _stub("sox")
    if "torchaudio" not in sys.modules:
        torchaudio = _stub("torchaudio")
        compliance = _stub("torchaudio.compliance")
        kaldi = _stub("torchaudio.compliance.kaldi")
        torchaudio.compliance = compliance
        compliance.kaldi = kaldi


def import_qwen_tts():
    """Import `qwen_tts` offline and quietly; returns the module."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    install_stubs()
    import contextlib
    import io

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        import qwen_tts  # noqa: F401  (prints a flash-attn banner)
    import qwen_tts

    return qwen_tts
