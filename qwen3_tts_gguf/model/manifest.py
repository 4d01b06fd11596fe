"""`manifest.json` of a converted model folder: what the model is and which files make it.

The engine trusts nothing else: it opens a model folder through `load_manifest`, which checks the
format version and that every listed file is present with the recorded size (and, on request,
hash), so a damaged model is refused with a clear message instead of failing deep in llama.cpp.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 1
# the files of a model folder: the converter writes them, the engine and the self-check open them
MANIFEST = "manifest.json"
TALKER_FILE = "talker.gguf"
PREDICTOR_FILE = "code_predictor.onnx"
# the same code predictor with opset 23's fused attention, for the CPU only (its weights are read from
# PREDICTOR_FILE's data file): other devices may lack the kernels and would run those nodes on the CPU
PREDICTOR_CPU_FILE = "code_predictor_cpu.onnx"
CODEC_FILE = "codec_decoder.onnx"
TEXT_TABLES_FILE = "text_tables.safetensors"
SPEAKER_ENCODER_FILE = "speaker_encoder.onnx"  # Base models only
CODEC_ENCODER_FILE = "codec_encoder.onnx"  # Base models only
# the code predictor (read by the ggml code predictor, ggml/batched_predictor.py), codec decoder and speaker encoder in
# the layout llama.cpp's libmtmd loads, where the checkpoint's codec has the shape llama.cpp hard-codes (every
# published one; convert/llama_stages.py)
LLAMA_STAGES_FILE = "llama_stages.gguf"
ADD_LLAMA_STAGES = "python -m qwen3_tts_gguf convert CHECKPOINT -o MODEL_FOLDER --only-llama-stages"


class ModelFolderError(ValueError):
    """A converted model folder that cannot be used."""


@dataclass
class FileEntry:
    bytes: int
    sha256: str


@dataclass
class Manifest:
    """Everything the runtime needs to know about a converted model."""

    name: str
    model_type: str  # custom_voice | voice_design | base
    model_size: str  # "0.6b" | "1.7b" (from tts_model_size "0b6"/"1b7")
    quant: str
    talker: dict  # hidden_size, num_layers, vocab_size, ...
    code_predictor: dict
    codec: dict  # sample_rate, samples_per_frame, sliding_window
    text_ids: dict  # im_start, im_end, assistant, newline, tts_pad, tts_bos, tts_eos
    codec_ids: dict  # pad, bos, eos, think, nothink, think_bos, think_eos
    languages: dict  # name -> codec id (dialects included where the model has them)
    speakers: dict  # name -> {"id": int, "dialect": str | False}
    sampling: dict  # generation_config.json defaults
    default_text_mode: str  # non-streaming | streaming
    instruct_supported: bool
    tokenizer: dict  # pretokenizer: "qwen2" | "mistral-fixed" (what the official pipeline uses)
    speaker_encoder: dict | None = None
    # LLAMA_STAGES_FILE's facts: {"temperature": the code predictor's sampling temperature baked into its heads,
    # "code_predictor" / "codec": matrix types (f32 | f16), "speaker_encoder": "real" | "dummy"}; or
    # {"missing": why the folder has none}; None: converted before the file existed
    llama_stages: dict | None = None
    # each matrix product's input range as measured at conversion and the weights each file keeps at f32 for
    # it (convert/precision/activation_ranges.py: ActivationRanges.report); None: converted before that
    activations: dict | None = None
    files: dict[str, FileEntry] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    converter_version: str = ""
    source: dict = field(default_factory=dict)

    @property
    def llama_stages_missing(self) -> str | None:
        """Why this folder has no llama stages file it may use, or None when it has one: a file with f16
        matrices written before their inputs' ranges were measured may overflow (and abort) on published
        weights (the 0.6B code predictor's does: convert/precision/activation_ranges.py)."""
        stages = self.llama_stages or {}
        if LLAMA_STAGES_FILE not in self.files:
            return (stages.get("missing")
                    or f"converted before {LLAMA_STAGES_FILE} existed; add it with `{ADD_LLAMA_STAGES}`")
        if "f32_weights" not in stages and "f16" in (stages.get("code_predictor"), stages.get("codec")):
            return (f"its f16 {LLAMA_STAGES_FILE} was written before activation ranges were measured (an f16 matrix "
                    f"may overflow on published weights); write it again with `{ADD_LLAMA_STAGES} --force`")
        return None

    @property
    def codec_peak_past_f16(self) -> float | None:
        """The codec's largest measured input peak where it passes the f16 limit the converter recorded (a
        GPU's matrix kernels may round the codec's inputs to f16), else None; None too for a folder whose
        vocoder was not measured (converted before 2026-12-06 16:30)."""
        measured = self.activations or {}
        peak, limit = measured.get("codec_peak"), measured.get("f16_limit")
        return peak if peak is not None and limit is not None and peak > limit else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        d = dict(d)
        d["files"] = {k: FileEntry(**v) for k, v in d.get("files", {}).items()}
        return cls(**d)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entries(folder: Path) -> dict[str, FileEntry]:
    """Size and SHA-256 of every file in `folder` (the manifest's `files`)."""
    return {p.name: FileEntry(bytes=p.stat().st_size, sha256=sha256_file(p))
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}


def load_manifest(folder: str | Path, verify_hashes: bool = False) -> Manifest:
    """Read and check a model folder's manifest; raises ModelFolderError with the reason."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelFolderError(f"{folder} is not a converted model folder (no {MANIFEST}); "
                               "convert a checkpoint with `python -m qwen3_tts_gguf convert`")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFolderError(f"{path} is not valid JSON ({e})") from e
    if raw.get("format_version") != FORMAT_VERSION:
        raise ModelFolderError(f"{folder}: model format version {raw.get('format_version')} is not "
                               f"{FORMAT_VERSION}; convert the checkpoint again with this version")
    try:
        manifest = Manifest.from_dict(raw)
    except TypeError as e:
        raise ModelFolderError(f"{path} is malformed ({e})") from e
    for name, entry in manifest.files.items():
        f = folder / name
        if not f.is_file():
            raise ModelFolderError(f"{folder}: file {name} is missing; convert the checkpoint again")
        if f.stat().st_size != entry.bytes:
            raise ModelFolderError(f"{folder}: file {name} has {f.stat().st_size} bytes, expected "
                                   f"{entry.bytes} (truncated or replaced); convert the checkpoint again")
        if verify_hashes and sha256_file(f) != entry.sha256:
            raise ModelFolderError(f"{folder}: file {name} is corrupt (sha256 mismatch)")
    return manifest
