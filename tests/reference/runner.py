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


def clone_prompt(xvector: np.ndarray, ref_text: str | None = None, ref_codes: np.ndarray | None = None):
    """An official VoiceClonePromptItem: x-vector only, or in-context with transcript + codes."""
    import torch

    import_qwen_tts()
    from qwen_tts.inference.qwen3_tts_model import VoiceClonePromptItem

    icl = ref_codes is not None
    return [VoiceClonePromptItem(
        ref_code=torch.from_numpy(np.asarray(ref_codes, np.int64)) if icl else None,
        ref_spk_embedding=torch.from_numpy(np.asarray(xvector, np.float32)),
        x_vector_only_mode=not icl, icl_mode=icl, ref_text=ref_text)]


def _call_wrapper(tts, text, speaker, language, instruct, clone, kwargs):
    if tts.model.tts_model_type == "voice_design":
        return tts.generate_voice_design(text=text, instruct=instruct or "", language=language, **kwargs)
    if tts.model.tts_model_type == "base":
        if isinstance(clone, dict):  # {"ref_audio": (wav, sr), "ref_text": ..., "x_vector_only_mode": ...}
            return tts.generate_voice_clone(text=text, language=language, **clone, **kwargs)
        return tts.generate_voice_clone(text=text, language=language, voice_clone_prompt=clone, **kwargs)
    return tts.generate_custom_voice(text=text, speaker=speaker, instruct=instruct, language=language, **kwargs)


def official_generate(path: str | Path, text: str, *, speaker: str | None = None, language: str = "Auto",
                      instruct: str | None = None, non_streaming: bool = True, frames: int = 40,
                      ignore_eos: bool = True, greedy: bool = True, clone=None,
                      **sampling) -> tuple[np.ndarray, np.ndarray]:
    """Official generate_custom_voice / generate_voice_design: (codes [T, 16], wav).

    With ignore_eos the EOS id is moved out of reach (reference-harness.md §3.1), so exactly
    `frames` frames come out (max_new_tokens = frames + 1: the last code0 is discarded).
    """
    import torch

    tts = load_official(str(path))
    model = tts.model
    captured = {}
    original_generate = model.generate

    def capture(*args, **kwargs):
        codes, hiddens = original_generate(*args, **kwargs)
        captured["codes"] = codes[0].numpy().copy()
        return codes, hiddens

    eos = model.config.talker_config.codec_eos_token_id
    if ignore_eos:
        model.config.talker_config.codec_eos_token_id = 10**6
    model.generate = capture
    try:
        kwargs = dict(max_new_tokens=frames + 1, non_streaming_mode=non_streaming,
                      do_sample=not greedy, subtalker_dosample=not greedy, **sampling)
        with torch.no_grad():
            wavs, _ = _call_wrapper(tts, text, speaker, language, instruct, clone, kwargs)
    finally:
        model.generate = original_generate
        model.config.talker_config.codec_eos_token_id = eos
    return captured["codes"], np.asarray(wavs[0], np.float32)


def official_decode(path: str | Path, codes: np.ndarray) -> np.ndarray:
    """The official `decoder.forward` on a whole utterance of codes [T, 16] -> wav [T * 1920]."""
    import torch

    decoder = load_official(str(path)).model.speech_tokenizer.model.decoder
    with torch.no_grad():
        wav = decoder(torch.from_numpy(np.asarray(codes, np.int64).T[None]))
    return wav[0, 0].numpy()


class _Captured(Exception):
    pass


def official_prompt(path: str | Path, text: str, *, speaker: str | None = None, language: str = "Auto",
                    instruct: str | None = None, non_streaming: bool = True, clone=None):
    """The official talker prefill rows and trailing text rows: (rows [L, H], trailing [M, H], pad [H])."""
    import torch

    tts = load_official(str(path))
    talker = tts.model.talker
    captured = {}
    original = talker.generate

    def capture(*args, **kwargs):
        captured["rows"] = kwargs["inputs_embeds"][0].numpy().copy()
        captured["trailing"] = kwargs["trailing_text_hidden"][0].numpy().copy()
        captured["pad"] = kwargs["tts_pad_embed"].reshape(-1).numpy().copy()
        raise _Captured

    talker.generate = capture
    try:
        with torch.no_grad():
            _call_wrapper(tts, text, speaker, language, instruct, clone, dict(non_streaming_mode=non_streaming))
    except _Captured:
        pass
    finally:
        talker.generate = original
    return captured["rows"], captured["trailing"], captured["pad"]
