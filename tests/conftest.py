"""Shared fixtures: random official checkpoints (built once, cached under .cache/fixtures)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("QTTS_TEST_CACHE", ROOT / ".cache" / "fixtures"))

# name -> build arguments; the 1.7B-like presets have a small_to_mtp_projection, the 0b6 ones not
CHECKPOINTS = {
    "tiny_cv": dict(shape="tiny", model_type="custom_voice", seed=1),
    "tiny0b6_cv_bf16": dict(shape="tiny-0b6", model_type="custom_voice", seed=2, talker_dtype="bfloat16"),
    "tiny_vd": dict(shape="tiny", model_type="voice_design", seed=3),
    "tiny_base": dict(shape="tiny", model_type="base", seed=4),
    "tiny0b6_base": dict(shape="tiny-0b6", model_type="base", seed=5),
    "small_cv": dict(shape="small", model_type="custom_voice", seed=6),
    # the tiny talker with the published codec decoder: the smallest checkpoints given a llama stages file
    "tiny_realcodec_cv": dict(shape="tiny-realcodec", model_type="custom_voice", seed=7),
    "tiny_realcodec_base": dict(shape="tiny-realcodec", model_type="base", seed=8),
    "tiny_realcodec_vd": dict(shape="tiny-realcodec", model_type="voice_design", seed=9),
}


def _builder_digest() -> str:
    h = hashlib.sha256()
    for rel in ("tests/reference/checkpoints.py", "qwen3_tts_gguf/convert/model_shapes.py"):
        h.update((ROOT / rel).read_bytes())
    return h.hexdigest()[:10]


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _share_identical_files(folder: Path) -> None:
    """Hard-link `folder`'s large files to identical ones in its sibling folders (the conversions of one
    checkpoint at several presets share a 450 MB codec graph): CI's disk bounds a fresh run's footprint.
    Cached folders are read-only to the tests, which copy a folder before they change it."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        size = path.stat().st_size
        if size < 1 << 20:
            continue
        rel, digest = path.relative_to(folder), None
        for other in (sibling / rel for sibling in sorted(folder.parent.iterdir()) if sibling != folder):
            if not other.is_file() or other.stat().st_size != size:
                continue
            digest = digest or _sha256(path)
            if _sha256(other) == digest:
                link = path.with_name(path.name + ".link")
                try:
                    os.link(other, link)
                except OSError:  # a file system without hard links: keep the copy
                    return
                os.replace(link, path)
                break


def official_checkpoint(name: str) -> Path:
    """Path of the cached random checkpoint `name` (see CHECKPOINTS), built on first use."""
    from tests.reference.checkpoints import build_official_checkpoint

    args = CHECKPOINTS[name]
    out = CACHE / f"{name}-{_builder_digest()}"
    if not (out / "speech_tokenizer" / "model.safetensors").exists():
        build_official_checkpoint(out, vocab_cache=CACHE / "vocab", **args)
        _share_identical_files(out)
    return out


@pytest.fixture(scope="session")
def checkpoint_factory():
    """Call with a CHECKPOINTS name; returns the checkpoint folder."""
    return official_checkpoint


@pytest.fixture(scope="session")
def tiny_cv() -> Path:
    return official_checkpoint("tiny_cv")


@pytest.fixture(scope="session")
def tiny0b6_cv_bf16() -> Path:
    return official_checkpoint("tiny0b6_cv_bf16")


def _converter_digest() -> str:
    h = hashlib.sha256(_builder_digest().encode())
    for path in sorted((ROOT / "qwen3_tts_gguf" / "convert").rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:10]


def converted_model(name: str, quant: str = "f32", cp_precision: str = "fp32", *,
                    llama_stages: str = "exact") -> Path:
    """A converted model folder of checkpoint `name` (cached; rebuilt when the converter changes).

    The defaults are the parity precisions: f32 talker, fp32 code predictor; `llama_stages` names the
    preset whose llama stages formats are written (only the tiny_realcodec checkpoints get that file)."""
    from qwen3_tts_gguf.convert.pipeline import convert_checkpoint
    from qwen3_tts_gguf.convert.presets import PRESETS

    suffix = "" if cp_precision == "fp32" else f"-cp{cp_precision}"
    if llama_stages != "exact":
        suffix += f"-stages{llama_stages}"
    out = CACHE / "converted" / f"{name}-{quant}{suffix}-{_converter_digest()}"
    if not (out / "manifest.json").exists():
        convert_checkpoint(official_checkpoint(name), out, quant, cp_precision=cp_precision,
                           llama_stages=PRESETS[llama_stages].llama_stages, overwrite=True, show_progress=False)
        _share_identical_files(out)
    return out


def converted_preset(name: str, preset: str) -> Path:
    """converted_model at a `--preset`'s formats: the talker's, the code predictor's, the llama stages'."""
    from qwen3_tts_gguf.convert.presets import PRESETS

    return converted_model(name, PRESETS[preset].quant, PRESETS[preset].cp_precision, llama_stages=preset)


@pytest.fixture(scope="session")
def converted_factory():
    """Call with (checkpoint name, quant[, cp_precision][, llama_stages=preset]); returns a converted model folder."""
    return converted_model


@pytest.fixture(scope="session")
def tiny_cv_f32() -> Path:
    return converted_model("tiny_cv", "f32")


def _converted_fixture(checkpoint: str, preset: str):
    """A session fixture: `checkpoint` converted at `preset`'s formats."""
    @pytest.fixture(scope="session", name=f"{checkpoint.removeprefix('tiny_')}_{preset}")
    def converted() -> Path:
        return converted_preset(checkpoint, preset)

    return converted


# models with a llama stages file (tiny talker, published codec), CustomVoice and Base at the exact and the
# default preset: realcodec_cv_exact, realcodec_cv_default, realcodec_base_exact, realcodec_base_default
realcodec_cv_exact, realcodec_cv_default, realcodec_base_exact, realcodec_base_default = (
    _converted_fixture(f"tiny_realcodec_{kind}", preset) for kind in ("cv", "base") for preset in ("exact", "default"))


# Debian's chromium driven by Playwright (never `playwright install`: it downloads a browser)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--autoplay-policy=no-user-gesture-required", "--use-fake-device-for-media-stream",
                 "--use-fake-ui-for-media-stream"]


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium for the web console's tests."""
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def failing_codec(monkeypatch):
    """Call with a CodecDecoder: its decode works once, then raises (a failure after audio began)."""
    def install(codec) -> None:
        real_decode, calls = codec.decode, []

        def decode_then_fail(*args, **kwargs):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("codec exploded")
            return real_decode(*args, **kwargs)

        monkeypatch.setattr(codec, "decode", decode_then_fail)
        return calls

    return install
