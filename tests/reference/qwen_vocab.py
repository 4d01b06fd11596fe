"""The real Qwen2/Qwen3 BPE vocabulary, derived from dashscope's `qwen.tiktoken`.

`vocab.json` + `merges.txt` derived this way are identical (entries and merge order) to the
real Qwen3 `tokenizer.json` (see shared/docs/reference-harness.md §2.1). The tiktoken file
comes from the PyPI wheel `dashscope==2.0.2`, downloaded once and cached.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from qwen3_tts_gguf.model.tokenizer import bytes_to_unicode

DASHSCOPE_WHEEL = "dashscope==2.0.2"
TIKTOKEN_MEMBER = "dashscope/resources/qwen.tiktoken"


def _bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    parts = [bytes([b]) for b in token]
    while True:
        best_idx, best_rank = None, None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best_rank is None or rank < best_rank):
                best_idx, best_rank = i, rank
        if best_idx is None:
            return parts
        parts = parts[:best_idx] + [parts[best_idx] + parts[best_idx + 1]] + parts[best_idx + 2 :]


def fetch_tiktoken(cache_dir: Path) -> Path:
    """Download the dashscope wheel (no deps) into cache_dir and extract qwen.tiktoken."""
    target = cache_dir / "qwen.tiktoken"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache_dir), DASHSCOPE_WHEEL],
        check=True,
    )
    wheel = next(cache_dir.glob("dashscope-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(TIKTOKEN_MEMBER)
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(target)
    return target


def write_vocab_files(cache_dir: Path) -> tuple[Path, Path]:
    """Return (vocab.json, merges.txt), deriving them from qwen.tiktoken on first use."""
    vocab_path, merges_path = cache_dir / "vocab.json", cache_dir / "merges.txt"
    if vocab_path.exists() and merges_path.exists():
        return vocab_path, merges_path
    ranks: dict[bytes, int] = {}
    for line in fetch_tiktoken(cache_dir).read_text().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    byte_map = bytes_to_unicode()
    as_text = lambda b: "".join(byte_map[x] for x in b)  # noqa: E731
    vocab = {as_text(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) == 1:
            continue
        parts = _bpe_split(ranks, tok, rank)
        assert len(parts) == 2, (tok, parts)
        merges.append(f"{as_text(parts[0])} {as_text(parts[1])}")
    tmp = vocab_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(vocab, ensure_ascii=False))
    tmp.rename(vocab_path)
    tmp = merges_path.with_suffix(".tmp")
    tmp.write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tmp.rename(merges_path)
    return vocab_path, merges_path
