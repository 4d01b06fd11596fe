"""Text handling around the model: live text commits only final tokens; long text splits cleanly."""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.model.tokenizer import TextTokenizer
from qwen3_tts_gguf.text.feed import TextFeed
from qwen3_tts_gguf.text.segments import split_segments

TEXTS = [
    "OpenAI and McDonald's use JavaScript iPhone APIs.",
    "你好，欢迎使用。今天天气很好！Hello there.\n\nNew paragraph  with   spaces.",
    "Call me at 555-0199 on 2026-11-30, or see https://example.org/a?b=1 now.",
    "It's 3.14 o'clock, DON'T shout!! ABCd eFG café naïve",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_cv):
    return TextTokenizer(tiny_cv, "mistral-fixed")


@pytest.mark.parametrize("text", TEXTS)
def test_committed_tokens_are_always_a_prefix_of_the_final_ones(tokenizer, text):
    full = tokenizer.encode(text)
    for seed in range(5):
        feed = TextFeed(tokenizer.encode, tokenizer.pieces)
        rng = np.random.default_rng(seed)
        i = 0
        while i < len(text):
            n = int(rng.integers(1, 5))
            feed.push(text[i:i + n])
            i += n
            ids, closed = feed.snapshot()
            assert ids == full[:len(ids)] and not closed
        feed.close()
        assert feed.snapshot() == (full, True)


def test_open_tails_are_held_back(tokenizer):
    feed = TextFeed(tokenizer.encode, tokenizer.pieces)
    feed.push("Hello wor")
    assert tokenizer.decode(feed.snapshot()[0]) == "Hello"
    feed.push("ld, see https://exa")
    assert tokenizer.decode(feed.snapshot()[0]) == "Hello world, see"
    feed.push("mple.org today")
    assert tokenizer.decode(feed.snapshot()[0]) == "Hello world, see https://example.org"
    feed.close()
    assert tokenizer.decode(feed.snapshot()[0]) == "Hello world, see https://example.org today"
    with pytest.raises(ValueError):
        feed.push("more")


def test_segments_split_at_sentence_ends():
    text = "First sentence here. Second one! Third? 第四句话。第五句。"
    assert split_segments(text, 1000) == [text]
    segments = split_segments(text, 25)
    assert segments == ["First sentence here.", "Second one! Third? 第四句话。", "第五句。"]
    assert all(len(s) <= 25 for s in split_segments("word " * 40, 25))
    assert "".join(split_segments("无标点的很长的一段中文文本" * 5, 20)) == "无标点的很长的一段中文文本" * 5
    assert split_segments("   ", 10) == []
