"""Cloning end to end: reference audio -> our encoders -> profile -> engine, against the official
`generate_voice_clone(ref_audio=..., ref_text=...)` on the same clip (greedy, silence option off)."""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.voicebank.clone import VoiceCloner

from tests.reference.runner import official_generate
from tests.test_cli_voices import speechlike

GREEDY = SamplingParams(greedy=True)
FRAMES = 20
AUDIO_TOL = 2e-4  # see tests/test_engine.py


@pytest.mark.parametrize("mode", ["icl", "xvector"])
def test_clone_from_audio_equals_official(mode, converted_factory, checkpoint_factory):
    folder = converted_factory("tiny0b6_base", "f32")
    clip = speechlike(2.3, 24000, seed=4)
    ref_text = "This is what the reference clip says." if mode == "icl" else None
    profile = VoiceCloner(folder, threads=2).create_profile("clip", (clip, 24000), ref_text=ref_text,
                                                             language="english", trailing_silence=0.0)
    text = "And this is the cloned voice speaking."
    model = LoadedModel(folder, EngineSettings(deterministic=True, max_streams=1))
    with Engine(model) as engine:
        stream = engine.submit(SynthesisRequest(text, profile.voice_spec(), talker=TalkerSampling(GREEDY),
                                                code_predictor=GREEDY, max_frames=FRAMES, ignore_eos=True))
        wav = np.concatenate([c.samples for c in stream])
    model.close()
    clone = {"ref_audio": (clip, 24000), "ref_text": ref_text, "x_vector_only_mode": mode == "xvector"}
    codes, ref_wav = official_generate(checkpoint_factory("tiny0b6_base"), text, language="english",
                                       non_streaming=False, frames=FRAMES, clone=clone)
    np.testing.assert_array_equal(stream.result.codes, codes)
    # the official wrapper cuts int(n_ref / n_total * len) samples: n_ref * 1920 here, to the sample
    assert wav.shape == ref_wav.shape
    assert np.abs(wav - ref_wav).max() < AUDIO_TOL
