"""Prompt rows equal the official talker prefill rows, in every prompt mode."""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.pipeline import build_manifest
from qwen3_tts_gguf.convert.text_tables import write_text_tables
from qwen3_tts_gguf.model.embeddings import EmbeddingTables
from qwen3_tts_gguf.model.prompt import PromptBuilder, PromptError, VoiceSpec
from qwen3_tts_gguf.model.tokenizer import TextTokenizer

from tests.reference.runner import official_prompt

# numpy vs PyTorch for the 2-layer text projection: ~1e-6
TOL = 1e-5

CASES = [  # (checkpoint, text, speaker, language, instruct)
    ("tiny_cv", "Hello world, this is a parity test.", "ryan", "english", None),
    ("tiny_cv", "你好，欢迎使用。", "vivian", "chinese", None),
    ("tiny_cv", "你好，我是成都人。", "eric", "auto", None),  # dialect speaker: sichuan tag, think form
    ("tiny_cv", "Hallo, wie geht's?", "dylan", "german", None),  # explicit non-Chinese: no dialect
    ("tiny_cv", "OpenAI and McDonald's use JavaScript iPhone APIs.", "aiden", "auto", "Speak slowly and calmly."),
    ("tiny0b6_cv_bf16", "An instruction the 0.6B model drops.", "serena", "auto", "Whisper."),
    ("tiny_vd", "A designed voice speaks.", None, "english", "A calm, low elderly voice."),
]


def _builder(ckpt_dir, tmp_path) -> PromptBuilder:
    ckpt = Checkpoint.open(ckpt_dir)
    manifest = build_manifest(ckpt, "f32", "test")
    write_text_tables(ckpt, tmp_path / "tables.safetensors")
    tokenizer = TextTokenizer(ckpt_dir, manifest.tokenizer["pretokenizer"])
    return PromptBuilder(manifest, tokenizer, EmbeddingTables(tmp_path / "tables.safetensors"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[3]}")
@pytest.mark.parametrize("text_mode", ["non-streaming", "streaming"])
def test_prompt_equals_official(case, text_mode, checkpoint_factory, tmp_path):
    name, text, speaker, language, instruct = case
    ckpt_dir = checkpoint_factory(name)
    builder = _builder(ckpt_dir, tmp_path)
    ours = builder.build(text, VoiceSpec(speaker=speaker, language=language, instruct=instruct), text_mode)
    rows, trailing, pad = official_prompt(ckpt_dir, text, speaker=speaker, language=language, instruct=instruct,
                                          non_streaming=text_mode == "non-streaming")
    assert ours.rows.shape == rows.shape
    np.testing.assert_allclose(ours.rows, rows, atol=TOL)
    np.testing.assert_allclose(ours.pad_row, pad, atol=TOL)
    if text_mode == "streaming":
        np.testing.assert_allclose(ours.trailing, trailing, atol=TOL)
    else:  # the official code passes one PAD row as "trailing" in this mode: the same as none
        assert len(ours.trailing) == 0
        np.testing.assert_allclose(trailing, pad[None], atol=TOL)


def test_bad_requests_are_clear(tiny_cv, tmp_path):
    builder = _builder(tiny_cv, tmp_path)
    with pytest.raises(PromptError, match="unknown speaker 'nobody'; valid: vivian, serena"):
        builder.build("hi", VoiceSpec(speaker="nobody"), "non-streaming")
    with pytest.raises(PromptError, match="unknown language 'klingon'"):
        builder.build("hi", VoiceSpec(speaker="ryan", language="klingon"), "non-streaming")
    with pytest.raises(PromptError, match="empty"):
        builder.build("   ", VoiceSpec(speaker="ryan"), "non-streaming")
    with pytest.raises(PromptError, match="text mode"):
        builder.build("hi", VoiceSpec(speaker="ryan"), "sideways")
    # dialects are speaker properties, not languages a request can name
    with pytest.raises(PromptError, match="unknown language"):
        builder.build("hi", VoiceSpec(speaker="ryan", language="sichuan_dialect"), "non-streaming")


ICL_CASES = [  # (checkpoint, text, reference transcript, reference frames, language)
    ("tiny_base", "Hello, I am a cloned voice speaking.", "This is what the reference says.", 6, "english"),
    ("tiny_base", "短句。", "A longer reference transcript than the text itself, by far.", 4, "auto"),
    ("tiny0b6_base", "你好，我是克隆的声音。", "参考音频的文本。", 12, "chinese"),
]


@pytest.mark.parametrize("case", ICL_CASES, ids=lambda c: f"{c[0]}-{c[3]}")
@pytest.mark.parametrize("text_mode", ["non-streaming", "streaming"])
def test_clone_prompts_equal_official(case, text_mode, checkpoint_factory, tmp_path):
    from qwen3_tts_gguf.model.prompt import ReferencePrompt

    from tests.reference.runner import clone_prompt

    name, text, ref_text, n_ref, language = case
    ckpt_dir = checkpoint_factory(name)
    builder = _builder(ckpt_dir, tmp_path)
    rng = np.random.default_rng(n_ref)
    xvector = rng.standard_normal(builder.tables.hidden_size).astype(np.float32)
    ref_codes = rng.integers(0, 2048, (n_ref, 16))
    non_streaming = text_mode == "non-streaming"
    # in-context: transcript + reference codes + x-vector
    ours = builder.build(text, VoiceSpec(speaker_embedding=xvector, language=language,
                                         reference=ReferencePrompt(ref_text, ref_codes)), text_mode)
    rows, trailing, _ = official_prompt(ckpt_dir, text, language=language, non_streaming=non_streaming,
                                        clone=clone_prompt(xvector, ref_text, ref_codes))
    np.testing.assert_allclose(ours.rows, rows, atol=TOL)
    if len(ours.trailing):
        np.testing.assert_allclose(ours.trailing, trailing, atol=TOL)
    else:
        np.testing.assert_allclose(trailing, ours.pad_row[None], atol=TOL)
    # x-vector only
    ours = builder.build(text, VoiceSpec(speaker_embedding=xvector, language=language), text_mode)
    rows, trailing, _ = official_prompt(ckpt_dir, text, language=language, non_streaming=non_streaming,
                                        clone=clone_prompt(xvector))
    np.testing.assert_allclose(ours.rows, rows, atol=TOL)
