"""Prompt rows from the converted model's tables: text rows through the projection MLP, codec rows.

`E_txt(id) = fc2(silu(fc1(text_embedding[id]) + b1)) + b2` is computed on demand for the tokens a
prompt uses (the table has 151936 rows; most are never touched, and the file is memory-mapped).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController

from qwen3_tts_gguf.model.safetensors_io import SafetensorsFile, bf16_to_f32

TEXT_CACHE_ROWS = 16384  # E_txt rows kept (64 MB at H=1024, 128 MB at H=2048)
_BLAS = ThreadpoolController()  # finds numpy's BLAS once; limits are then cheap to apply


class _StoredRows:
    """One table of a safetensors file, memory-mapped; indexing returns f32 rows."""

    def __init__(self, file: SafetensorsFile, name: str):
        self._raw, self._bf16 = file.raw(name), file.dtype_of(name) == "BF16"
        self.shape = self._raw.shape

    def __getitem__(self, index) -> np.ndarray:
        rows = np.asarray(self._raw[index])
        return bf16_to_f32(rows) if self._bf16 else rows.astype(np.float32)


class EmbeddingTables:
    """Text and codec embedding rows of one converted model."""

    def __init__(self, path: str | Path):
        self._file = SafetensorsFile(path)
        self.fc1_w = self._file["text_fc1.weight"]
        self.fc1_b = self._file["text_fc1.bias"]
        self.fc2_w = self._file["text_fc2.weight"]
        self.fc2_b = self._file["text_fc2.bias"]
        # the codec tables stay memory-mapped in their stored precision: rows become f32 when looked up
        # (the same values as widening the whole table, without its 140 MB f32 copy at 0.6B)
        self.codec = [_StoredRows(self._file, f"codec_embedding.{i}") for i in range(16)]
        self.hidden_size = self.codec[0].shape[1]
        self._text_table = _StoredRows(self._file, "text_embedding")
        self.text_vocab_size = self._text_table.shape[0]
        self._text_cache: dict[int, np.ndarray] = {}  # oldest first; bounded (a server runs for weeks)
        self._cache_lock = threading.Lock()  # prompts are built on request threads and on the engine's

    def _text_embedding_rows(self, ids: np.ndarray) -> np.ndarray:
        return self._text_table[ids]

    def _project(self, x: np.ndarray) -> np.ndarray:
        """The projection MLP on one row. One row at a time on purpose: a batched GEMM's rounding
        depends on the batch, and a token's row must not depend on which tokens came with it."""
        h = self.fc1_w @ x + self.fc1_b
        h = h * (1.0 / (1.0 + np.exp(-h)))
        return (self.fc2_w @ h + self.fc2_b).astype(np.float32)

    def text_rows(self, ids) -> np.ndarray:
        """E_txt for each id: [n, H] float32 (the last TEXT_CACHE_ROWS rows computed are cached)."""
        ids = [int(i) for i in ids]
        if not ids:
            return np.zeros((0, self.hidden_size), np.float32)
        with self._cache_lock:
            found = {i: self._text_cache[i] for i in ids if i in self._text_cache}
        missing = sorted(set(ids) - found.keys())
        if missing:
            if missing[0] < 0 or missing[-1] >= self.text_vocab_size:
                raise ValueError(f"text token id out of range: {missing}")
            # one BLAS thread: a matrix-vector product gains nothing from more, and OpenBLAS's idle
            # threads spin for ~0.1 s afterwards, slowing the talker's next decode (measured on 2
            # cores: a 1-row step 20 -> 38 ms, a 14-row prefill 116 -> 173 ms)
            with _BLAS.limit(limits=1, user_api="blas"):
                y = np.stack([self._project(x) for x in self._text_embedding_rows(np.array(missing))])
            found.update(zip(missing, y))
            with self._cache_lock:
                self._text_cache.update(zip(missing, y))
                while len(self._text_cache) > TEXT_CACHE_ROWS:
                    del self._text_cache[next(iter(self._text_cache))]
        return np.stack([found[i] for i in ids])

    def codec_rows(self, ids) -> np.ndarray:
        """Talker codec-embedding rows (codebook-0 codes, control, language and speaker ids)."""
        return self.codec[0][np.asarray(ids, dtype=np.int64)]

    def frame_rows(self, codes: np.ndarray) -> np.ndarray:
        """Frame embedding of codes [n, 16]: C(code0) + sum_i CP_i(code_i), shape [n, H]."""
        codes = np.asarray(codes, dtype=np.int64)
        out = self.codec[0][codes[:, 0]]  # (a new f32 array)
        for i in range(1, 16):
            out += self.codec[i][codes[:, i]]
        return out
