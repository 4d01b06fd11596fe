"""Run the official implementation on a checkpoint folder: the model, its talker, its codec."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .official import import_qwen_tts


@functools.lru_cache(maxsize=4)
def load_official(path: str):
    """`Qwen3TTSModel.from_pretrained(path)` in float32 (cached per path)."""
    import torch

    import_qwen_tts()
    from qwen_tts import Qwen3TTSModel

    torch.set_num_threads(2)
    return Qwen3TTSModel.from_pretrained(str(path), dtype=torch.float32)


def talker_forward(path: str | Path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Official talker on input embedding rows [n, H]: (logits [n, 3072], post-norm hidden [n, H])."""
    import torch

    talker = load_official(str(path)).model.talker
    with torch.no_grad():
        out = talker.model(inputs_embeds=torch.from_numpy(np.asarray(rows, np.float32))[None], use_cache=False)
        hidden = out.last_hidden_state
        logits = talker.codec_head(hidden)
    return logits[0].numpy(), hidden[0].numpy()


def text_rows(path: str | Path, ids: list[int]) -> np.ndarray:
    """Official E_txt(ids): text_projection(text_embedding(ids)), [n, H]."""
    import torch

    talker = load_official(str(path)).model.talker
    with torch.no_grad():
        emb = talker.model.text_embedding(torch.tensor([ids]))
        return talker.text_projection(emb)[0].numpy()
