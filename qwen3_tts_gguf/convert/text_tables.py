"""The text side and the codec embedding tables as one memory-mapped safetensors file.

The text embedding (151936 rows) stays in its source dtype (BF16 in the published checkpoints,
so it is copied word for word), and so does everything else: rows are widened to f32 on access.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.model.manifest import TEXT_TABLES_FILE as FILE_NAME  # noqa: F401 (the name's old home)
from qwen3_tts_gguf.model.safetensors_io import write_safetensors


def table_sources(ckpt: Checkpoint) -> dict[str, str]:
    """Output tensor name -> checkpoint tensor name."""
    names = {
        "text_embedding": "talker.model.text_embedding.weight",
        "text_fc1.weight": "talker.text_projection.linear_fc1.weight",
        "text_fc1.bias": "talker.text_projection.linear_fc1.bias",
        "text_fc2.weight": "talker.text_projection.linear_fc2.weight",
        "text_fc2.bias": "talker.text_projection.linear_fc2.bias",
        "codec_embedding.0": "talker.model.codec_embedding.weight",
    }
    for i in range(1, ckpt.config.talker.num_code_groups):
        names[f"codec_embedding.{i}"] = f"talker.code_predictor.model.codec_embedding.{i - 1}.weight"
    return names


def write_text_tables(ckpt: Checkpoint, out_path: Path) -> None:
    """Write the text embedding, its projection MLP and the 16 codec embedding tables."""
    tensors = {}
    for name, src in table_sources(ckpt).items():
        if ckpt.weights.dtype_of(src) == "BF16":
            tensors[name] = ("BF16", np.ascontiguousarray(ckpt.weights.raw(src)))
        else:
            tensors[name] = np.ascontiguousarray(ckpt.weights[src], dtype=np.float32)
    write_safetensors(out_path, tensors, metadata={"format": "qwen3-tts-x text tables"})
