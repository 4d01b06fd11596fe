"""The runaway guard (`qwen3_tts_gguf/engine/runaway.py`): loops found in scripted code sequences, and
in a random model that loops (greedy), ended or retried; where it shows (finish reason, usage,
/metrics); the parity profile untouched; the frame budget against measured speech.

The looping model: the tiny random CustomVoice checkpoint with its talker layers' weights and its
codec embeddings scaled down, so each step's input barely depends on the frames before it: in
greedy mode it says one code over and over (period 1), as a stuck model does. The plain tiny model
is chaotic instead: 520 greedy frames without a loop (checked), so it must never be flagged.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import wave

import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.engine.runaway import (
    LOOP_MAX_PERIOD,
    LOOP_MIN_FRAMES,
    RunawayGuard,
    find_loop,
    text_repeats,
)
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.engine.text_sources import frame_budget
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.model.tokenizer import TextTokenizer

from tests.ws_helpers import httpx, loaded_registry, serve

GREEDY = SamplingParams(greedy=True)
TEXT = "Hello world, this is a test of loops."
RNG = np.random.default_rng(5)


def _noise(n: int) -> np.ndarray:
    return RNG.integers(0, 2048, n)


# -- scripted code sequences ---------------------------------------------------------------------

@pytest.mark.parametrize("period", [1, 2, 7, 24, 40, LOOP_MAX_PERIOD])
def test_an_exact_loop_is_found_with_its_period_and_start(period):
    unit = _noise(period)
    codes = np.concatenate([_noise(30), np.tile(unit, 2 + (LOOP_MIN_FRAMES + period) // period + 1)])
    loop = find_loop(codes)
    assert loop is not None and loop.period == period and loop.start == 30
    assert loop.keep == 30 + period


def test_a_sampled_loop_with_some_frames_changed_is_found():
    unit = _noise(12)
    codes = np.concatenate([_noise(20), np.tile(unit, 8)])
    changed = RNG.choice(np.arange(20, len(codes)), size=len(codes[20:]) // 10, replace=False)
    codes[changed] = _noise(len(changed))  # a tenth of the loop's frames differ
    loop = find_loop(codes)
    assert loop is not None and loop.period == 12


def test_speech_like_sequences_are_not_loops():
    assert find_loop(_noise(600)) is None
    assert find_loop(np.concatenate([_noise(100), np.full(LOOP_MIN_FRAMES // 2, 7), _noise(40)])) is None  # a pause
    assert find_loop(np.concatenate([_noise(50), np.full(LOOP_MIN_FRAMES - 8, 7)])) is None  # too short to judge
    unit = _noise(LOOP_MAX_PERIOD + 5)  # longer than any loop looked for: the frame budget's
    assert find_loop(np.concatenate([_noise(10), np.tile(unit, 4)])) is None


def check(guard: RunawayGuard, text: str, code0: np.ndarray):
    """`guard.check` as the engine calls it, on a segment whose codebook 0 is `code0`."""
    return guard.check(text, len(code0), lambda start: code0[start:])


def test_text_that_repeats_itself_may_repeat_its_speech():
    assert text_repeats("Hello there, how are you?") == 1
    assert text_repeats("ha ha ha ha ha") == 5
    assert text_repeats("I said no, no, NO, no!") == 4
    assert text_repeats("one two one two one two three") == 3
    assert text_repeats("哈哈哈哈") == 4
    period, unit = 16, _noise(16)
    laugh = np.concatenate([_noise(20), np.tile(unit, 6)])  # six times a 16-frame laugh
    guard = RunawayGuard("end", 0)
    assert check(guard, "ha ha ha ha ha", laugh) is None  # the text asks for 5: up to 5 + 1 pass
    assert check(guard, "Hello there, how are you doing?", laugh).period == period
    assert check(guard, "ha ha ha ha ha", np.concatenate([laugh, np.tile(unit, 2)])).period == period


def test_the_guard_searches_only_frames_made_since_a_retry():
    guard = RunawayGuard("retry", 1)
    codes = np.concatenate([_noise(10), np.full(60, 3)])
    assert check(guard, "text", codes) is not None and guard.decide() == "retry"
    guard.since = 60
    assert check(guard, "text", np.concatenate([codes, _noise(40)])) is None
    assert guard.decide() == "end"  # no retries left
    assert check(RunawayGuard("off", 3), "text", codes) is None


# -- a random model that loops -------------------------------------------------------------------

@pytest.fixture(scope="module")
def looping_model(checkpoint_factory, tmp_path_factory):
    from safetensors.numpy import load_file, save_file

    from qwen3_tts_gguf.convert.pipeline import convert_checkpoint

    work = tmp_path_factory.mktemp("looping")
    checkpoint = work / "checkpoint"
    shutil.copytree(checkpoint_factory("tiny_cv"), checkpoint)
    weights = load_file(checkpoint / "model.safetensors")
    for name, w in weights.items():
        if name.startswith("talker.model.layers.") and w.ndim == 2:
            weights[name] = w * np.float32(0.1)
        elif name.startswith("talker.code_predictor.model.codec_embedding."):
            weights[name] = w * np.float32(0.01)
        elif name == "talker.model.codec_embedding.weight":
            weights[name] = w.copy()
            weights[name][:2048] *= np.float32(0.01)  # the codes' rows (not the special tokens')
    save_file(weights, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    out = work / "converted"
    convert_checkpoint(checkpoint, out, "f32", overwrite=True, show_progress=False)
    return out


def _speak(folder, runaway: str, retries: int = 2, **request) -> tuple:
    settings = EngineSettings(deterministic=True, max_streams=1, threads=1, runaway=runaway, runaway_retries=retries)
    model = LoadedModel(folder, settings)
    try:
        with Engine(model) as engine:
            stream = engine.submit(SynthesisRequest(TEXT, VoiceSpec(speaker="ryan"), seed=3, **{
                "talker": TalkerSampling(GREEDY), "code_predictor": GREEDY, **request}))
            audio = np.concatenate([c.samples for c in stream])
            return stream.result, audio, dict(engine.stats)
    finally:
        model.close()


def test_a_stuck_random_model_is_ended_where_its_loop_began(looping_model):
    off, _, _ = _speak(looping_model, "off")
    budget = frame_budget(EngineSettings.budget_base_frames, EngineSettings.budget_frames_per_token,
                          off.text_tokens)
    assert off.finish_reason == "budget" and off.frames == budget  # unguarded: the whole budget of one code
    assert find_loop(off.codes[:, 0]).period == 1
    assert off.runaway == [{"kind": "budget", "action": "end", "segment": 0, "frame": budget, "period": 0}]

    ended, audio, stats = _speak(looping_model, "end")
    assert ended.finish_reason == "runaway"
    [event] = ended.runaway
    assert event["kind"] == "loop" and event["action"] == "end" and event["period"] == 1
    # found after LOOP_MIN_FRAMES of the stretch; what had not gone to the codec yet was taken back
    assert ended.frames < event["frame"] <= LOOP_MIN_FRAMES + 4
    assert len(audio) == ended.frames * 1920 and np.array_equal(ended.codes, off.codes[:ended.frames])
    assert stats["runaway_loop_end"] == 1 and stats["runaway_loop_retry"] == 0


def test_a_retried_loop_samples_on_and_a_seed_still_means_the_same_audio(looping_model):
    first, audio, stats = _speak(looping_model, "retry", retries=1)
    again, audio_again, _ = _speak(looping_model, "retry", retries=1)
    retry = first.runaway[0]
    assert retry["kind"] == "loop" and retry["action"] == "retry" and stats["runaway_loop_retry"] == 1
    assert np.array_equal(first.codes, again.codes) and np.array_equal(audio, audio_again)
    assert len(audio) == first.frames * 1920
    # greedy, it would say the same code again: after the retry codebook 0 is sampled, and varies
    assert len(set(first.codes[retry["frame"]:, 0].tolist())) > 10


def test_the_parity_profile_and_a_model_that_does_not_loop_are_untouched(converted_factory, looping_model):
    # ignore_eos (benchmarks, the parity tests): the guard is off, exactly max_frames frames
    result, _, _ = _speak(looping_model, "end", max_frames=80, ignore_eos=True)
    assert result.finish_reason == "max_frames" and result.frames == 80 and result.runaway == []
    tiny = converted_factory("tiny_cv", "f32")
    guarded, audio, _ = _speak(tiny, "retry", max_frames=140)
    plain, audio_plain, _ = _speak(tiny, "off", max_frames=140)
    assert guarded.runaway == [] and guarded.frames == 140
    assert np.array_equal(guarded.codes, plain.codes) and np.array_equal(audio, audio_plain)


# -- where it shows: finish reason, usage, /metrics ----------------------------------------------

def test_the_server_reports_a_runaway(looping_model):
    settings = EngineSettings(deterministic=True, max_streams=1, threads=1, runaway="end")
    with loaded_registry(looping_model, settings) as registry, serve(registry, api_key=None) as server:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            response = http.post("/v1/audio/speech", json={
                "model": "tts-1", "input": TEXT, "voice": "ryan", "response_format": "pcm", "stream_format": "sse",
                "temperature": 0, "seed": 1})
            assert response.status_code == 200
            events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
            usage = events[-1]["usage"]
            assert events[-1]["type"] == "speech.audio.done" and usage["runaways"] == 1
            assert usage["runaway_retries"] == 0 and usage["frames"] < LOOP_MIN_FRAMES + 4
            audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
            assert len(audio) == usage["frames"] * 1920 * 2
            metrics = http.get("/metrics").text
    model = registry.models[0].id
    assert f'qtts_runaways_total{{model="{model}",kind="loop",action="end"}} 1' in metrics
    assert f'qtts_speech_streams_total{{model="{model}",reason="runaway"}} 1' in metrics


# -- the frame budget against measured speech ----------------------------------------------------

MEASURED = [  # (text, espeak-ng voice): the parity tests' texts and the hardest cases for the budget
    ("Hello world, this is a parity test.", "en-us"),
    ("OpenAI and McDonald's use JavaScript iPhone APIs.", "en-us"),
    ("A designed voice speaks in English.", "en-us"),
    ("Call me at 555-0134 on 2026-12-05 at 10:30, the total is $1,234.56.", "en-us"),
    ("Visit https://github.com/ggml-org/llama.cpp for details.", "en-us"),
    ("Internationalization, characterization and telecommunications.", "en-us"),
    ("Hi.", "en-us"),
    ("你好，欢迎使用。今天天气很好。", "cmn"),
    ("人工智能正在改变我们的生活方式和工作方式。", "cmn"),
    ("今日はとても良い天気ですね。散歩に行きましょう。", "ja"),
    ("Die Donaudampfschifffahrtsgesellschaft ist ein sehr langes Wort.", "de"),
]
BUDGET_MARGIN = 1.3
"""The least the default budget must exceed espeak-ng's speech of a text by. espeak-ng at its default
175 words a minute; its Chinese and Japanese are slower than natural speech (2.7 characters a second)."""


def test_the_default_budget_leaves_a_margin_over_measured_speech(checkpoint_factory):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    tokenizer = TextTokenizer(checkpoint_factory("tiny_cv"))
    for text, voice in MEASURED:
        wav = subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True).stdout
        with wave.open(io.BytesIO(wav)) as w:
            seconds = (len(wav) - 44) / (2 * w.getframerate())  # (its header's length is unset: piped)
        frames = seconds * 12.5
        budget = frame_budget(EngineSettings.budget_base_frames, EngineSettings.budget_frames_per_token,
                              len(tokenizer.encode(text)))
        assert budget >= BUDGET_MARGIN * frames, (text, budget, frames)
