"""Opt-in text normalization: piecewise = whole text, bounded wetext calls, failures never the stream's."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.text import normalization as tn
from qwen3_tts_gguf.text.normalization import (
    MAX_HELD_CHARS,
    LiveNormalizer,
    StreamingNormalizer,
    normalize_text,
    pick_language,
)

TEXTS = {  # language -> text whose character-by-character normalization must equal the whole text's
    "zh": "今天是2026年11月30日，气温-3.5℃，占99%的人同意。价格是$5.99，电话13800138000。我有 3 个苹果！好的",
    "en": "Dr. Smith paid $5.99 on 11/30/2026 at 3:30 pm. Then he left, happy; it was 99% done! Really? "
          "Yes, 12 people came. The end",
    "mixed": "我们在2026年用OpenAI的GPT模型，花了$20。Hello world, 这是123个测试。",
}
GREEDY = SamplingParams(greedy=True)


def identity(language, text):
    """A stand-in for wetext: speaks every piece as written."""
    return SimpleNamespace(output_text=text, mappings=())


def whole(language, text):
    return tn._wetext_normalize(language, text)


def spans(result) -> list[tuple[int, int, int, int]]:
    return [(m.input_start, m.input_end, m.output_start, m.output_end) for m in result.mappings]


@pytest.mark.parametrize("name", TEXTS)
def test_character_by_character_equals_the_whole_text(name):
    text, language = TEXTS[name], "en" if name == "en" else "zh"
    expected = whole(language, text)
    normalizer = StreamingNormalizer(language)
    pieces = [p for ch in text for p in normalizer.feed(ch)] + normalizer.close()
    assert normalizer.forced == 0
    assert "".join(p.text for p in pieces) == expected.output_text
    assert [(s.raw_start, s.raw_end, s.norm_start, s.norm_end) for s in normalizer.map.spans] == spans(expected)
    assert [(p.raw_start, p.raw_end) for p in pieces] == list(zip([0] + [p.raw_end for p in pieces[:-1]],
                                                                  [p.raw_end for p in pieces]))
    assert pieces[-1].raw_end == len(text)
    fixed = normalize_text(text, language)  # fixed text: the same pieces
    assert fixed.text == expected.output_text
    for s in normalizer.map.spans:  # every replacement is the raw text's own
        assert fixed.to_raw(s.norm_start) == s.raw_start
        assert fixed.to_raw(s.norm_end) == (s.raw_end if s.norm_end < len(fixed.text) else len(text))


def test_english_commits_when_sentences_end():
    text = "I have 3 apples. You have 4! Do we have 12; or more? "
    normalizer = StreamingNormalizer("english")
    committed = []
    for i, ch in enumerate(text):
        for piece in normalizer.feed(ch):
            committed.append((i, piece.text))
    # each sentence is spoken once the whitespace after its end arrives, not at close
    assert [t for _, t in committed] == ["I have three apples.", " You have four!", " Do we have twelve;", " or more?"]
    assert [i for i, _ in committed] == [text.index(s) + len(s) for s in ("apples.", "4!", "12;", "more?")]
    assert [p.text for p in normalizer.close()] == [""]  # the trailing space: nothing to say


def test_english_cannot_take_newlines_or_double_spaces_so_they_cut_pieces():
    text = "Call 12 now.\n\nThen  13 more"
    normalizer = StreamingNormalizer("en")
    out = "".join(p.text for p in normalizer.feed(text) + normalizer.close())
    assert out == "Call twelve now.\n\nThen  thirteen more"


def test_a_long_text_without_punctuation_bounds_every_wetext_call():
    words = "the quick brown fox jumps over the lazy dog and 3 cats while 45 birds sing under a sky".split()
    text = " ".join(words[i % len(words)] for i in range(1000))[:4096]
    seen = []

    def spy(language, piece):
        seen.append(len(piece))
        return whole(language, piece)

    normalizer = StreamingNormalizer("en", normalize=spy)
    pieces = []
    for i in range(0, len(text), 4):  # LLM-sized deltas
        pieces += normalizer.feed(text[i:i + 4])
    pieces += normalizer.close()
    assert max(seen) <= MAX_HELD_CHARS and len(seen) <= len(text) // (MAX_HELD_CHARS // 2) + 1
    assert normalizer.forced == len(seen) - 1 and normalizer.largest_call == max(seen)
    assert "".join(p.text for p in pieces).startswith("the quick brown fox jumps over the lazy dog and three cats")
    assert pieces[-1].raw_end == len(text)


def test_zh_held_back_text_is_cut_at_the_limit_too():
    """wetext may hold text back (e.g. "99%" until the next punctuation): a held-back run is
    normalized in one forced call once it passes the limit, and no call sees more."""
    seen = []

    def hold_everything(language, window):
        seen.append(len(window))
        return 0

    normalizer = StreamingNormalizer("zh", normalize=identity, commit_point=hold_everything)
    text = "占九十九的人同意" * 300
    out = [p for i in range(0, len(text), 3) for p in normalizer.feed(text[i:i + 3])] + normalizer.close()
    assert "".join(p.text for p in out) == text
    assert max(seen) <= MAX_HELD_CHARS and normalizer.largest_call <= MAX_HELD_CHARS
    assert normalizer.forced == len(text) // MAX_HELD_CHARS - 1  # the last 200 are the final call


def test_a_failure_while_streaming_holds_and_at_the_end_speaks_raw(caplog):
    failing = {"on": True}

    def flaky(language, text):
        if failing["on"]:
            raise RuntimeError("no normalization path for the requested input")
        return whole(language, text)

    normalizer = StreamingNormalizer("en", normalize=flaky)
    assert normalizer.feed("It costs $5. ") == []  # the sentence is held, not lost
    failing["on"] = False
    pieces = normalizer.feed("It is 3 now. ")
    assert "".join(p.text for p in pieces) == "It costs five dollars. It is three now."
    failing["on"] = True
    assert normalizer.feed("Bye 7 times") == []
    tail = normalizer.close()  # the final call fails: that piece is spoken as written
    assert [p.text for p in tail] == [" Bye 7 times"] and tail[0].spans == ()
    assert "spoken as written" in caplog.text


def test_language_choice():
    assert [pick_language(x) for x in ("chinese", "English", "japanese", "zh", "korean", "german")] == \
        ["zh", "en", "ja", "zh", None, None]
    assert pick_language("auto", "  你好 hello") == "zh"
    assert pick_language("auto", " Hello 你好") == "en"
    assert pick_language("auto", "こんにちは") == "ja"
    assert pick_language("auto", "안녕하세요") is None
    assert pick_language(None, "   ") is None
    auto = StreamingNormalizer("auto", normalize=whole)
    assert auto.feed("  ") == [] and auto.language is None
    assert "".join(p.text for p in auto.feed("我有3个") + auto.close()) == "我有三个"
    assert auto.language == "zh"
    korean = StreamingNormalizer("korean")
    assert [p.text for p in korean.feed("3 개 ")] == ["3 개 "]  # not normalized: passed through as is
    assert tn.LANGUAGES == ("zh", "en", "ja")


def test_live_text_is_normalized_off_the_pushing_thread():
    threads, pushed, closed = [], [], threading.Event()

    def spy(language, text):
        threads.append(threading.current_thread().name)
        return whole(language, text)

    live = LiveNormalizer(StreamingNormalizer("en", normalize=spy), pushed.append, closed.set)
    for word in "I have 3 apples. And 4 pears.".split(" "):
        live.push(word + " ")
    live.close()
    assert closed.wait(30) and live.done.is_set()
    assert "".join(pushed) == "I have three apples. And four pears."
    assert threads and threading.current_thread().name not in threads
    with pytest.raises(ValueError):
        live.push("more")


@pytest.fixture(scope="module")
def engine(tiny_cv_f32):
    model = LoadedModel(tiny_cv_f32, EngineSettings(deterministic=True, max_streams=2))
    with Engine(model) as running:
        yield running
    model.close()


def test_streams_with_normalization_make_audio(engine):
    voice = VoiceSpec(speaker="ryan", language="english")
    request = SynthesisRequest("I paid $5.99 on 11/30/2026.", voice, text_mode="streaming",
                               talker=TalkerSampling(GREEDY), code_predictor=GREEDY, seed=0, max_frames=30,
                               ignore_eos=True, text_normalization="auto")
    fixed = engine.submit(request)
    audio = np.concatenate([c.samples for c in fixed])
    assert fixed.result.finish_reason == "max_frames" and audio.size > 0
    assert fixed.result.normalized_chars == len(normalize_text(request.text, "english").text)
    assert fixed.prompts[0].text_tokens == len(engine.model.prompts.text_ids(normalize_text(request.text, "en").text))

    live = engine.open_text_stream(request)
    for i in range(0, len(request.text), 3):
        live.push_text(request.text[i:i + 3])
    live.close_text()
    live_audio = np.concatenate([c.samples for c in live])
    assert live.result.finish_reason == "max_frames"
    assert live.text.feed.text == "I paid five point nine nine dollars on the thirtieth of november twenty twenty six."
    np.testing.assert_array_equal(live.result.codes, fixed.result.codes)  # same text, same codes
    np.testing.assert_array_equal(live_audio, audio)
    assert (live.result.text_chars, live.result.normalized_chars) == (len(request.text), len(live.text.feed.text))
    with pytest.raises(ValueError):
        SynthesisRequest("x", text_normalization="on")
