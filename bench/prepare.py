"""Random-weight checkpoints at the real shapes and their converted model folders, built once.

Checkpoints come from `python -m qwen3_tts_gguf make-random OUT --shape S --type custom_voice`
(numpy only; BF16 talker like the published repos) with the real Qwen2 BPE vocabulary when it is
available, so prompts have their real length. The same folder loads into the official classes
(`Qwen3TTSModel.from_pretrained`), so both implementations run on identical weights. Cached
under bench/cache/, keyed by a digest of the code that produced them: editing the generator or
the converter rebuilds them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from qwen3_tts_gguf.model.manifest import MANIFEST

from bench.common import CACHE, ROOT

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def _digest(paths: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:10]


def checkpoint_digest() -> str:
    pkg = ROOT / "qwen3_tts_gguf"
    return _digest([pkg / "convert" / "random_checkpoint.py", pkg / "convert" / "model_shapes.py"])


def converter_digest() -> str:
    pkg = ROOT / "qwen3_tts_gguf"
    return _digest(sorted((pkg / "convert").glob("*.py")), checkpoint_digest())


def tokenizer_dir(log=print) -> tuple[Path | None, str]:
    """A folder with the real Qwen vocab.json/merges.txt/tokenizer_config.json, or None (then
    make-random writes its byte-level vocabulary: every character is a token, prompts get longer)."""
    target = CACHE / "vocab"
    if all((target / f).exists() for f in TOKENIZER_FILES):
        return target, "qwen2-bpe"
    target.mkdir(parents=True, exist_ok=True)
    from qwen3_tts_gguf.convert.model_shapes import tokenizer_config

    sources = [ROOT / ".cache" / "fixtures" / "vocab"]  # the test suite's copy, if it ran here
    try:
        for src in sources:
            if (src / "vocab.json").exists() and (src / "merges.txt").exists():
                shutil.copy(src / "vocab.json", target / "vocab.json")
                shutil.copy(src / "merges.txt", target / "merges.txt")
                break
        else:  # derive it like the tests do (pip downloads the dashscope wheel once)
            sys.path.insert(0, str(ROOT))
            from tests.reference.qwen_vocab import write_vocab_files

            log("deriving the Qwen vocabulary from dashscope's qwen.tiktoken (one-time)")
            vocab, merges = write_vocab_files(target)
            if vocab != target / "vocab.json":
                shutil.copy(vocab, target / "vocab.json")
                shutil.copy(merges, target / "merges.txt")
        (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2))
        return target, "qwen2-bpe"
    except Exception as e:  # offline and no cached copy: the byte-level vocabulary still works
        log(f"real vocabulary unavailable ({type(e).__name__}: {e}); using make-random's byte-level one")
        shutil.rmtree(target, ignore_errors=True)
        return None, "byte-level"


def ensure_checkpoint(shape: str, log=print) -> tuple[Path, str]:
    """The cached random custom_voice checkpoint of `shape` (built by the make-random CLI)."""
    vocab, vocab_kind = tokenizer_dir(log)
    out = CACHE / f"ckpt-{shape}-{checkpoint_digest()}{'' if vocab else '-bytevocab'}"
    if (out / "speech_tokenizer" / "model.safetensors").exists():
        return out, vocab_kind
    for stale in CACHE.glob(f"ckpt-{shape}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    cmd = [sys.executable, "-m", "qwen3_tts_gguf", "make-random", str(out), "--shape", shape,
           "--type", "custom_voice", "--seed", "0"]
    if vocab:
        cmd += ["--tokenizer-dir", str(vocab)]
    log(f"building a random {shape} custom_voice checkpoint: {' '.join(cmd[1:])}")
    subprocess.run(cmd, check=True, cwd=ROOT)
    return out, vocab_kind


def converted_path(checkpoint: Path, shape: str, quant: str, cp_precision: str) -> Path:
    """Where the converted folder lives (exists once `ensure_converted` finished)."""
    byte_vocab = "-bytevocab" if checkpoint.name.endswith("-bytevocab") else ""
    return CACHE / "models" / f"{shape}-{quant}-cp{cp_precision}-{converter_digest()}{byte_vocab}"


def ensure_converted(checkpoint: Path, shape: str, quant: str, cp_precision: str, threads: int, log=print) -> Path:
    """The converted model folder of `checkpoint`: talker at `quant`, code predictor at
    `cp_precision` (self-check skipped: the test suite checks the converter; only speed matters here)."""
    import inspect

    from qwen3_tts_gguf.convert.pipeline import convert_checkpoint

    out = converted_path(checkpoint, shape, quant, cp_precision)
    if (out / MANIFEST).exists():
        return out
    for stale in (CACHE / "models").glob(f"{shape}-{quant}-cp{cp_precision}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    log(f"converting {checkpoint.name} -> talker {quant}, code predictor {cp_precision}")
    kwargs = dict(overwrite=True, verify=False, threads=threads)
    if "cp_precision" in inspect.signature(convert_checkpoint).parameters:
        kwargs["cp_precision"] = cp_precision
    elif cp_precision != "fp32":
        raise RuntimeError("this converter has no code predictor precision option (fp32 only)")
    convert_checkpoint(checkpoint, out, quant, **kwargs)
    return out
