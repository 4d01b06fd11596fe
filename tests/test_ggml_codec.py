"""The streaming codec on the project's own ggml graphs (`--codec-runtime ggml`, `ggml/streaming_codec.py`): the ONNX
codec's graph, state and weights on ggml's CPU backend here (lavapipe's Vulkan in tests/test_vulkan_stages.py).

What holds: chunked audio equals one whole decode bit for bit, a stream decoded beside others equals its
solo decode bit for bit, and the samples agree with the fp32 ONNX codec to a stated SNR (rounding order
only: both are fp32). Every call's inputs are checked before ggml sees them (a ggml assert would abort
the process).
"""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import onnx
import pytest

from qwen3_tts_gguf.ggml.graph import Backend
from qwen3_tts_gguf.ggml.streaming_codec import GgmlCodec
from qwen3_tts_gguf.model.codec import CodecDecoder, split_states, stack_states
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.manifest import CODEC_FILE, MANIFEST, Manifest, ModelFolderError, file_entries, load_manifest
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.model.stage_runtimes import resolve

from tests.conftest import converted_preset
from tests.greedy_agreement import snr_db
from tests.test_ggml_predictor import greedy_request, open_engine, speak

CODEC_SNR_DB = 80.0
"""The ggml codec against the fp32 ONNX codec: measured 95.4 dB (tiny shape) and 84.7 dB (the published
shape) on random weights, 2026-12-06."""


@pytest.fixture(scope="module")
def tiny(converted_factory):
    return converted_factory("tiny_cv", "f32")


@pytest.fixture(scope="module")
def codec(tiny):
    backend = Backend(threads=2)
    codec = GgmlCodec(tiny / CODEC_FILE, backend)
    yield codec
    codec.close()
    backend.close()


def chunked(codec, codes: np.ndarray, sizes) -> np.ndarray:
    state, parts, at = None, [], 0
    for size in sizes:
        wav, state = codec.decode(codes[at:at + size], state)
        parts.append(wav)
        at += size
    assert at == len(codes)
    return np.concatenate(parts)


def test_chunks_equal_the_whole_decode_and_agree_with_onnx(tiny, codec):
    codes = np.random.default_rng(1).integers(0, 2048, (40, 16))
    whole = codec.decode_all(codes)
    reference = CodecDecoder(tiny / CODEC_FILE, threads=2).decode_all(codes)
    assert whole.shape == reference.shape == (40 * codec.samples_per_frame,)
    assert snr_db(reference, whole) > CODEC_SNR_DB
    for sizes in ([1] * 40, [2] * 20, [1, 2, 4, 8, 8, 8, 9], [3, 5, 7, 11, 14]):  # across the 8-frame window
        np.testing.assert_array_equal(chunked(codec, codes, sizes), whole)


def test_streams_side_by_side_equal_their_solo_decodes(codec):
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 2048, (12, 16)), rng.integers(0, 2048, (5, 16))
    solo_a, solo_b = codec.decode_all(a), codec.decode_all(b)
    _, state_a = codec.decode(a[:7])  # a is 7 frames in, b starts: the rows sit at different positions
    wav, state = codec.decode(np.stack([a[7:12], b]), stack_states([state_a, codec.new_state()]))
    np.testing.assert_array_equal(wav[0], solo_a[7 * 1920:])
    np.testing.assert_array_equal(wav[1], solo_b)
    assert [int(s.pos[0]) for s in split_states(state)] == [12, 5]


def test_the_published_codec_shape_agrees_with_onnx():
    """One stage at the published shape (114 M decoder parameters): the same SNR, chunking bit-exact."""
    folder = converted_preset("tiny_realcodec_cv", "exact")
    backend = Backend(threads=2)
    codec = GgmlCodec(folder / CODEC_FILE, backend)
    try:
        codes = np.random.default_rng(3).integers(0, 2048, (6, 16))
        whole = codec.decode_all(codes)
        assert snr_db(CodecDecoder(folder / CODEC_FILE, threads=2).decode_all(codes), whole) > CODEC_SNR_DB
        np.testing.assert_array_equal(chunked(codec, codes, [1, 2, 3]), whole)
        # the activation buffer, sized for 16-frame calls, stays below the weights (205 against 435 MiB): ggml-alloc
        # reuses every intermediate (a buffer made as a leaf tensor never is: 704 MiB)
        assert codec.nbytes - codec.weights.nbytes < codec.weights.nbytes
    finally:
        codec.close()
        backend.close()


def test_bad_codes_are_refused_before_ggml_sees_them(codec):
    for bad in (np.zeros((0, 16), np.int64), np.zeros((3, 15), np.int64), np.full((2, 16), 2048),
                np.zeros((2, 16), np.float32), np.zeros((1, 2, 3, 16), np.int64)):
        with pytest.raises(ValueError):
            codec.decode(bad)
    with pytest.raises(ValueError, match="streams"):
        codec.decode(np.zeros((2, 1, 16), np.int64), codec.new_state(3))
    padded = np.zeros((2, 16), np.int64)
    padded[1] = -1  # padding counts as code 0, as in the official wrapper
    np.testing.assert_array_equal(codec.decode_all(padded), codec.decode_all(np.zeros((2, 16), np.int64)))


def test_which_runtime_runs_the_codec(tiny, tmp_path):
    manifest = load_manifest(tiny)
    assert resolve("auto", "auto", manifest, gpu_layers=0, onnx_device="cpu").codec == "onnxruntime"
    assert resolve("auto", "auto", manifest, gpu_layers=-1, onnx_device="cpu").codec == "ggml"
    assert (resolve("auto", "auto", manifest, gpu_layers=-1, onnx_device="cpu", deterministic=True).codec
            == "onnxruntime")
    assert resolve("auto", "auto", manifest, gpu_layers=-1, onnx_device="cuda").codec == "onnxruntime"
    with pytest.raises(ValueError, match="deterministic"):
        EngineSettings(deterministic=True, codec_runtime="ggml")
    model = LoadedModel(tiny, EngineSettings(max_streams=1, threads=1, codec_runtime="ggml"))
    try:
        assert model.runtimes.codec == "ggml" and isinstance(model.codec, GgmlCodec)
    finally:
        model.close()


def test_a_codec_file_from_before_the_ggml_codec_is_named(tiny, tmp_path):

    old = tmp_path / "old"
    shutil.copytree(tiny, old)
    graph = onnx.load(str(old / CODEC_FILE))
    kept = [p for p in graph.metadata_props if p.key != "config"]
    del graph.metadata_props[:]
    graph.metadata_props.extend(kept)
    onnx.save(graph, str(old / CODEC_FILE))
    manifest = Manifest.from_dict(json.loads((old / MANIFEST).read_text()))
    manifest.files = file_entries(old)
    (old / MANIFEST).write_text(manifest.to_json())
    with pytest.raises(ModelFolderError, match="convert the checkpoint again"):
        LoadedModel(old, EngineSettings(max_streams=1, threads=1, codec_runtime="ggml"))


def test_the_engine_speaks_through_the_ggml_codec(tiny):
    """A greedy request through the engine: the same codes as with ONNX Runtime's codec, the audio within
    the stated SNR, streamed in the engine's chunks (1, 2, 4, 8 frames)."""
    results = {}
    for runtime in ("onnxruntime", "ggml"):
        engine = open_engine(tiny, codec_runtime=runtime)
        try:
            results[runtime] = speak(engine, greedy_request("Hello from the ggml codec.",
                                                            VoiceSpec(speaker="ryan", language="english"),
                                                            frames=20))
        finally:
            engine.stop()
            engine.model.close()
    (onnx_result, onnx_wav), (ggml_result, ggml_wav) = results["onnxruntime"], results["ggml"]
    np.testing.assert_array_equal(ggml_result.codes, onnx_result.codes)
    assert ggml_wav.shape == onnx_wav.shape == (20 * 1920,)
    assert snr_db(onnx_wav, ggml_wav) > CODEC_SNR_DB


def three_streams_through(tiny, fail_shared: bool):
    """Three greedy streams of 12 frames at once through an engine whose ggml codec is slow (while a call runs,
    every stream's next chunk falls due) and, with `fail_shared`, fails every call of several streams.
    Returns (streams in each call, [(result, audio)], the codec) after the engine stopped."""
    engine = open_engine(tiny, codec_runtime="ggml", max_streams=4, chunk_frames=(2,), adaptive_chunks=False)
    codec = engine.model.codec
    batches, real = [], codec.decode

    def slow(codes, state=None):
        codes = np.asarray(codes)
        batches.append(codes.shape[0] if codes.ndim == 3 else 1)
        time.sleep(0.05)
        if fail_shared and batches[-1] > 1:
            raise RuntimeError("injected: a shared call failed")
        return real(codes, state)

    codec.decode = slow
    try:
        voice = VoiceSpec(speaker="ryan", language="english")
        streams = [engine.submit(greedy_request(text, voice, frames=12)) for text in
                   ("The first stream.", "A second one, longer.", "Third.")]
        results = [(s.result, wav) for s in streams for wav in [np.concatenate([c.samples for c in s])]]
    finally:
        del codec.decode
        engine.stop()
    return batches, results, engine


def test_streams_due_together_decode_in_one_call(tiny):
    """The engine gathers the frames of every stream due in one iteration into one ggml codec call (its codec
    lane): each stream's audio still equals one whole decode of its own codes, bit for bit."""
    batches, results, engine = three_streams_through(tiny, fail_shared=False)
    try:
        assert max(batches) > 1, batches  # streams shared calls
        for result, wav in results:
            assert result.frames == 12
            np.testing.assert_array_equal(wav, engine.model.codec.decode_all(result.codes))
    finally:
        engine.model.close()


def test_a_failed_shared_call_is_retried_stream_by_stream(tiny):
    """A batched codec call that fails costs no stream: each is decoded alone again."""
    batches, results, engine = three_streams_through(tiny, fail_shared=True)
    engine.model.close()
    assert max(batches) > 1, batches  # a shared call was tried
    for result, wav in results:
        assert result.finish_reason == "max_frames" and wav.shape == (12 * 1920,)
