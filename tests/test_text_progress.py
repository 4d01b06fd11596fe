"""Text progress on chunks and results: exact fed offsets (code points of the raw text), a
monotonic spoken estimate below them, the whole text at the end; through segments and normalization."""

from __future__ import annotations

import time

import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling, TextProgress
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.engine.text_sources import SPOKEN_FRAMES_PER_TOKEN
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.model.tokenizer import bytes_to_unicode
from qwen3_tts_gguf.text.normalization import normalize_text
from qwen3_tts_gguf.text.segments import locate_segments

from tests.llm_text import PAUSE_S, llm_deltas

GREEDY = SamplingParams(greedy=True)
BUDGET_BASE = 3  # each segment makes 3 + (its tokens) frames: every token is read before it ends
TEXT = "Hi 😀 there, 👨\u200d👩\u200d👧 family. 你好，欢迎！Done now."  # an emoji split over tokens (ZWJ)
BYTE_OF = {ch: b for b, ch in bytes_to_unicode().items()}


@pytest.fixture(scope="module")
def engine(tiny_cv_f32):
    settings = EngineSettings(deterministic=True, max_streams=2, max_segment_chars=60,
                              budget_base_frames=BUDGET_BASE, budget_frames_per_token=1)
    model = LoadedModel(tiny_cv_f32, settings)
    with Engine(model) as running:
        yield running
    model.close()


def request(text: str, mode: str | None = "streaming", normalization: str = "off") -> SynthesisRequest:
    return SynthesisRequest(text, VoiceSpec(speaker="ryan", language="english"), text_mode=mode,
                            talker=TalkerSampling(GREEDY), code_predictor=GREEDY, seed=0, ignore_eos=True,
                            text_normalization=normalization)


def complete_chars(engine: Engine, ids: list[int]) -> int:
    """Code points fully contained in the bytes of `ids` (the oracle: byte-level BPE decoded by hand)."""
    tok = engine.model.tokenizer._tok
    data = b"".join(bytes(BYTE_OF[ch] for ch in tok.id_to_token(i)) for i in ids)
    return len(data.decode("utf-8", errors="ignore"))


def last_frame(chunk) -> int:
    return chunk.first_frame + chunk.n_frames - 1


def check_monotonic(progress: list[TextProgress]) -> None:
    for p in progress:
        assert 0 <= p.spoken_end_estimate <= p.text_fed_end and p.basis == "frames_per_token"
        if p.normalized_text_fed_end is not None:
            assert p.normalized_spoken_end_estimate <= p.normalized_text_fed_end
    for a, b in zip(progress, progress[1:]):
        assert a.text_fed_end <= b.text_fed_end and a.spoken_end_estimate <= b.spoken_end_estimate


def fed_ends(engine, chunks, text: str, segments: list[str]) -> list[int]:
    """Expected fed end per chunk in `text` (what the talker speaks): frame k of a segment is made
    after the talker read 1 + k of its tokens (a plain voice pairs one text row with codec_bos in
    the prefill); each segment but the last makes BUDGET_BASE + its tokens frames."""
    out, first, cursor = [], 0, 0
    for s, segment in enumerate(segments):
        ids = engine.model.prompts.text_ids(segment)
        frames, last = BUDGET_BASE + len(ids), s == len(segments) - 1
        start = text.index(segment, cursor)
        cursor = start + len(segment)
        for c in chunks:
            k = last_frame(c) - first
            if 0 <= k and (k < frames or last):
                fed = min(1 + k, len(ids))
                if fed < len(ids):
                    out.append(start + complete_chars(engine, ids[:fed]))
                else:
                    out.append(len(text) if last else cursor)
        first += frames
    return out


def test_fixed_text_in_streaming_mode(engine):
    stream = engine.submit(request(TEXT))
    chunks = list(stream)
    ids = engine.model.prompts.text_ids(TEXT)
    assert stream.prompts[0].text_tokens == len(ids)
    progress = [c.progress for c in chunks]
    check_monotonic(progress)
    assert [p.text_fed_end for p in progress] == fed_ends(engine, chunks, TEXT, [TEXT])
    assert progress[-1].text_fed_end == len(TEXT)
    assert TEXT[:progress[1].text_fed_end] == "Hi 😀 there"  # code points, not bytes or tokens
    result = stream.result
    assert result.progress == TextProgress(len(TEXT), len(TEXT), "final")
    assert (result.text_chars, result.normalized_chars) == (len(TEXT), None)


def test_a_token_ending_inside_a_character_does_not_count_it(engine):
    ids, ends = engine.model.prompts.text_ids_with_ends(TEXT)
    family = TEXT.index("👨")
    assert [complete_chars(engine, ids[:k + 1]) for k in range(len(ids))] == ends
    assert family in ends  # " " + the first bytes of 👨: only the space is complete
    assert ends.count(family + 1) == 2  # 👨's last byte, then the first of the ZWJ's two tokens


def test_non_streaming_mode_has_read_all_its_text_and_estimates_the_spoken_part(engine):
    """The prefill reads the whole text: every chunk's fed end is the text's end; the spoken
    estimate is the text of the first frames / SPOKEN_FRAMES_PER_TOKEN tokens, as in streaming."""
    stream = engine.submit(request(TEXT, mode="non-streaming"))
    chunks = list(stream)
    ids = engine.model.prompts.text_ids(TEXT)
    progress = [c.progress for c in chunks]
    check_monotonic(progress)
    assert {p.text_fed_end for p in progress} == {len(TEXT)}

    def spoken(chunk) -> int:
        n = min(len(ids), (last_frame(chunk) + 1) // SPOKEN_FRAMES_PER_TOKEN)
        return len(TEXT) if n == len(ids) else complete_chars(engine, ids[:n])

    assert [p.spoken_end_estimate for p in progress] == [spoken(c) for c in chunks]
    assert progress[0].spoken_end_estimate == 0 < progress[-1].spoken_end_estimate
    assert stream.result.progress == TextProgress(len(TEXT), len(TEXT), "final")


def test_segments_map_back_to_the_raw_input(engine):
    text = "  First sentence is here, 😀 a bit long. Second sentence follows it!  你好，第三句话在这里。  "
    stream = engine.submit(request(text))
    chunks = list(stream)
    segments = stream.text._segments
    assert len(segments) >= 2 and len(stream.prompts) == len(segments)
    expected = fed_ends(engine, chunks, text, segments)
    progress = [c.progress for c in chunks]
    check_monotonic(progress)
    assert [p.text_fed_end for p in progress] == expected
    assert stream.result.progress.text_fed_end == len(text)


def test_segments_are_located_even_where_whitespace_was_dropped():
    text = "One.\n \nTwo three.  Four"
    assert [list(o) for o in locate_segments(text, ["One.", "Two three.", "Four"])] == \
        [list(range(0, 5)), list(range(7, 18)), list(range(19, 24))]
    assert list(locate_segments("A \n\nB", ["A\nB"])[0]) == [0, 1, 4, 5]  # (a space piece dropped inside)


def test_live_text(engine):
    stream = engine.open_text_stream(request(""))
    for delta, pause in llm_deltas(TEXT):
        stream.push_text(delta)
        if pause:
            time.sleep(PAUSE_S)
    stream.close_text()
    chunks = list(stream)
    assert stream.text.feed.snapshot()[0] == engine.model.prompts.text_ids(TEXT)
    progress = [c.progress for c in chunks]
    check_monotonic(progress)
    assert [p.text_fed_end for p in progress] == fed_ends(engine, chunks, TEXT, [TEXT])
    assert stream.result.progress == TextProgress(len(TEXT), len(TEXT), "final")
    assert stream.result.text_chars == len(TEXT)


NORMALIZED = "I paid $5.99 on 11/30/2026, 😀 and 12 more."


def check_normalized(engine, chunks, spoken: str, segments: list[str]) -> None:
    normalized = normalize_text(NORMALIZED, "english")
    assert normalized.text == spoken
    progress = [c.progress for c in chunks]
    check_monotonic(progress)
    assert [p.normalized_text_fed_end for p in progress] == fed_ends(engine, chunks, spoken, segments)
    for p in progress:  # raw offsets: the spans' map of the normalized ones, never inside a replacement
        assert p.text_fed_end == normalized.to_raw(p.normalized_text_fed_end)
        assert p.spoken_end_estimate == normalized.to_raw(p.normalized_spoken_end_estimate)
        assert not any(s.raw_start < p.text_fed_end < s.raw_end for s in normalized.map.spans)
    assert progress[-1].text_fed_end == len(NORMALIZED)
    assert any(NORMALIZED[:p.text_fed_end].endswith("$5.99") for p in progress)


def test_normalized_fixed_text(engine):
    stream = engine.submit(request(NORMALIZED, normalization="auto"))
    chunks = list(stream)
    spoken = normalize_text(NORMALIZED, "english").text
    assert len(stream.text._segments) == 2  # longer than max_segment_chars once normalized
    check_normalized(engine, chunks, spoken, stream.text._segments)
    result = stream.result
    assert result.progress == TextProgress(len(NORMALIZED), len(NORMALIZED), "final", len(spoken), len(spoken))
    assert (result.text_chars, result.normalized_chars) == (len(NORMALIZED), len(spoken))


def test_normalized_live_text(engine):
    stream = engine.open_text_stream(request("", normalization="auto"))
    for i in range(0, len(NORMALIZED), 3):
        stream.push_text(NORMALIZED[i:i + 3])
    stream.close_text()
    chunks = list(stream)
    spoken = stream.text.feed.text
    assert stream.text.feed.snapshot()[0] == engine.model.prompts.text_ids(spoken)
    check_normalized(engine, chunks, spoken, [spoken])
    assert stream.result.normalized_chars == len(stream.text.feed.text)


@pytest.mark.parametrize("mode", ["streaming", "non-streaming", "live"])
def test_a_progress_failure_turns_progress_off_not_the_stream(engine, monkeypatch, mode):
    """The stream ends as it would have, with the same audio, only without progress."""
    from qwen3_tts_gguf.engine import text_sources

    def run():
        if mode == "live":
            stream = engine.open_text_stream(request(""))
            stream.push_text("Hello there.")
            stream.close_text()
        else:
            stream = engine.submit(request("Hello there.", mode=mode))
        return stream, list(stream)

    _, healthy = run()

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the offsets")

    monkeypatch.setattr(text_sources.FedText if mode == "live" else text_sources.FixedText, "_ends", broken)
    stream, chunks = run()
    assert all(c.progress is not None for c in healthy) and all(c.progress is None for c in chunks)
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), np.concatenate([c.samples for c in healthy]))
    assert stream.result.finish_reason == "budget" and stream.result.progress is None
