"""Every stage of a frame on a real Vulkan backend, Mesa's software device (lavapipe): the talker offloaded
(`--gpu-layers all`), the code predictor and the codec on the project's ggml graphs on the same device
(`auto` picks them there: model/stage_runtimes.py).

Run as tests/test_vulkan.py is, by the Vulkan build's python (CI does, in the same process):

    .venv-vulkan/bin/python -m pytest -q tests/test_vulkan.py tests/test_vulkan_stages.py

What a frame still does on the CPU (the glue; docs/gpu.md, *What runs where*): codebook 0's sampling from the
talker's logits (repetition penalty, temperature, top-k/top-p, suppressed ids, end of speech), the text
row of the next talker input (a table lookup) added to the frame embedding the code predictor returns, a
segment's prompt rows, the runaway guard and the chunking; and the copies between host and device: the
talker's logits and hidden state out, the code predictor's hidden states and codes 0 in and 15 codes and
the next input rows out, that row into the talker, the codec's codes and state in and samples and state out.

The whole frame runs on the narrow-codec model (tests/narrow_codec.py: the published codec's graph with
channels 32 wide; a codec call's work is its frames'); the published codec's shape runs one stage at a time
(`test_the_published_codec_on_vulkan`). A machine's first run also compiles the shaders (a minute or two,
once: Mesa keeps them in ~/.cache/mesa_shader_cache).

Precision on this device: ggml-vulkan's matrix kernels round their inputs to f16 on a device that reports
fp16 (lavapipe does), so the codec agrees with the fp32 ONNX codec to about 37-41 dB here (about 96 dB with
GGML_VK_DISABLE_F16=1); the code predictor keeps to the f32 matrix-vector kernels (ggml/batched_predictor.py,
GPU_MAX_ROWS), so its codes equal the CPU's.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tests.conftest import CACHE
from tests.greedy_agreement import assert_greedy_codes_agree, recording, snr_db
from tests.narrow_codec import narrow_codec_checkpoint, narrow_codec_model
from tests.test_vulkan import ALL, SKIP, _report

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
FRAMES = 30
CHUNK = 8
"""Frames per codec call: lavapipe is never real time, so adaptive chunking would send every frame alone."""
CODEC_SNR_DB = 30.0
"""The ggml codec on lavapipe against the fp32 ONNX codec and against the ggml codec on the CPU backend (see
the module doc: f16 inputs to ggml-vulkan's matrix kernels). Measured 36.9 dB on the tiny codec, 2026-12-06."""
VOICE = {"speaker": "ryan", "language": "english"}


def _settings(**kw):
    from qwen3_tts_gguf.model.settings import EngineSettings

    return EngineSettings(**{"max_streams": 2, "threads": 2, "n_ctx": 2048, **kw})


def _start(folder, settings):
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.model.loaded import LoadedModel

    return Engine(LoadedModel(folder, settings)).start()


def _stop(engine) -> None:
    engine.stop()
    engine.model.close()


def _greedy(text: str, frames: int):
    from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
    from qwen3_tts_gguf.model.prompt import VoiceSpec
    from qwen3_tts_gguf.model.sampler import SamplingParams

    greedy = SamplingParams(greedy=True)
    return SynthesisRequest(text, VoiceSpec(**VOICE), talker=TalkerSampling(greedy), code_predictor=greedy,
                            max_frames=frames, ignore_eos=True)


def _speak(stream):
    """All of a stream: (its result, its samples)."""
    wav = [chunk.samples for chunk in stream]
    return stream.result, np.concatenate(wav) if wav else np.zeros(0, np.float32)


@pytest.fixture(scope="module")
def folder():
    return narrow_codec_model(CACHE)


@pytest.fixture(scope="module")
def vulkan(folder):
    """Every stage on lavapipe, the runtimes left to `auto`; a stream's audio in codec calls of CHUNK frames."""
    engine = _start(folder, _settings(gpu_layers=ALL, kv_cache="f16", chunk_frames=(CHUNK,), adaptive_chunks=False))
    yield engine
    _stop(engine)


@pytest.fixture(scope="module")
def cpu(folder):
    """The reference: llama.cpp's CPU backend for the talker, the ONNX graphs on the CPU, the parity profile
    (whose greedy codes equal the official implementation's: tests/test_engine.py)."""
    engine = _start(folder, _settings(deterministic=True))
    yield engine
    _stop(engine)


def test_auto_puts_every_stage_on_the_vulkan_device(vulkan):
    from qwen3_tts_gguf.host import devices

    model = vulkan.model
    assert (model.runtimes.predictor, model.runtimes.codec) == ("ggml", "ggml"), model.runtimes
    assert model.talker._device_locks
    (device,) = [d.name for d in devices.llama_runtime().gpu_devices]
    # one ggml backend on the talker's device serves both stages, which take the talker's device lock
    assert model.ggml_backend.device == device and not model.ggml_backend.is_cpu
    assert model.predictor.backend is model.codec.backend is model.ggml_backend
    for stage in (model.predictor, model.codec):
        assert [lock.name for lock in stage._device_locks] == [device]


def test_greedy_codes_with_every_stage_on_vulkan_equal_the_cpu_run(vulkan, cpu, folder, record_property):
    """30 greedy frames: codes equal to the CPU run's (up to a near tie of the code predictor's float64
    logits: tests/greedy_agreement.py); the audio, decoded on lavapipe in the engine's calls of CHUNK frames,
    against the fp32 ONNX codec's and the ggml CPU backend's decode of the same codes."""
    from qwen3_tts_gguf.ggml.graph import Backend
    from qwen3_tts_gguf.ggml.streaming_codec import GgmlCodec
    from qwen3_tts_gguf.model.codec import CodecDecoder
    from qwen3_tts_gguf.model.manifest import CODEC_FILE

    text = "Hello world, this is a parity test."
    inputs = recording(vulkan)
    t0 = time.perf_counter()
    try:
        result, wav = _speak(vulkan.submit(_greedy(text, FRAMES)))
    finally:
        del vulkan.model.predictor.predict
    seconds = time.perf_counter() - t0
    reference, _ = _speak(cpu.submit(_greedy(text, FRAMES)))
    assert result.finish_reason == "max_frames" and result.frames == FRAMES
    same = (result.codes == reference.codes).all(axis=1)
    first = int(np.argmin(same)) if not same.all() else FRAMES
    assert_greedy_codes_agree(result.codes, reference.codes, inputs, narrow_codec_checkpoint(CACHE),
                              same_talker=False)
    onnx = CodecDecoder(folder / CODEC_FILE, threads=2).decode_all(result.codes)
    backend = Backend(threads=2)  # ggml's CPU backend
    codec = GgmlCodec(folder / CODEC_FILE, backend)
    try:
        ggml_cpu = codec.decode_all(result.codes)
    finally:
        codec.close()
        backend.close()
    assert wav.shape == onnx.shape == (FRAMES * 1920,)
    snr = {"onnx": snr_db(onnx, wav), "ggml_cpu": snr_db(ggml_cpu, wav), "cpu_vs_onnx": snr_db(onnx, ggml_cpu)}
    _report(record_property, frames=FRAMES, equal_frames_vs_cpu=first, equal_codes_vs_cpu=float(same.mean()),
            seconds=round(seconds, 1), predictor_s=round(result.timings["predictor_s"], 1),
            codec_s=round(result.timings["codec_s"], 1), **{f"snr_db_vs_{k}": round(v, 1) for k, v in snr.items()})
    assert snr["onnx"] > CODEC_SNR_DB and snr["ggml_cpu"] > CODEC_SNR_DB


def test_two_streams_at_once_one_cancelled_with_every_stage_on_vulkan(vulkan, cpu, record_property):
    """Two streams stepping together (one talker decode, one code predictor call and one codec call step
    both); the first is cancelled after about two frames each, the second goes on alone to its end. The
    cancelled one ends as `cancelled` and frees its slot; the other's codes equal its run alone on the CPU
    (up to a near tie of the code predictor's float64 logits, either way round: its talker ran beside
    another stream, on another device), its audio a frame's samples a frame."""
    short = _greedy("Second client, a bit longer than the first.", 8)
    want = _speak(cpu.submit(short))[0].codes
    rows = recording(vulkan)
    t0, made = time.perf_counter(), vulkan.stats["frames"]
    try:
        streams = [vulkan.submit(_greedy("A long one that we stop early.", 400)), vulkan.submit(short)]
        deadline = time.monotonic() + 120
        while vulkan.stats["frames"] < made + 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        streams[0].cancel()
        (cancelled, _), (result, wav) = [_speak(s) for s in streams]
    finally:
        del vulkan.model.predictor.predict
    same = (result.codes == want).all(axis=1)
    _report(record_property, two_streams_s=round(time.perf_counter() - t0, 1), cancelled_after=cancelled.frames,
            equal_frames_vs_cpu=int(np.argmin(same)) if not same.all() else len(same))
    assert cancelled.finish_reason == "cancelled" and 1 <= cancelled.frames < 8, cancelled  # within a few frames
    assert result.finish_reason == "max_frames" and result.frames == 8, result
    assert_greedy_codes_agree(result.codes, want, rows, narrow_codec_checkpoint(CACHE), same_talker=False)
    assert wav.shape == (8 * 1920,) and np.isfinite(wav).all()
    assert vulkan.load()["active"] == 0


def test_a_request_through_the_server_with_every_stage_on_vulkan(folder, tmp_path):
    from tests.serve_process import ServeProcess, httpx

    env = {"GGML_VK_VISIBLE_DEVICES": os.environ["GGML_VK_VISIBLE_DEVICES"]}
    # no warm-up: on lavapipe it compiles the shaders of every chunk's graph before the port opens
    with ServeProcess("--model", str(folder), "--gpu-layers", "all", "--threads", "2", "--max-streams", "2",
                      "--warm-up-voices", "none", log_path=tmp_path / "serve.log", env=env) as server:
        r = httpx.post(f"{server.url}/v1/audio/speech", timeout=300,
                       json={"model": "tts-1", "input": "Hello from the software GPU.", "voice": "ryan",
                             "response_format": "pcm", "seed": 1, "max_frames": 2})
        assert r.status_code == 200, r.text
        assert len(r.content) >= 2 * 1920  # at least one 80 ms frame of s16 at 24 kHz
        log = server.log()
    assert "devices: talker: all layers on Vulkan" in log and "llvmpipe" in log, log
    assert "code predictor on the project's ggml graphs on the talker's device" in log, log
    assert "codec on the project's ggml graphs on the talker's device" in log, log


def test_the_published_codec_on_vulkan(record_property):
    """One stage at the published codec's shape (114 M decoder parameters) on lavapipe: chunks equal one whole
    decode and a stream beside another its solo decode, bit for bit (every row meets the same kernel whatever the
    call holds); the samples within the stated SNR of the fp32 ONNX codec."""
    from qwen3_tts_gguf.ggml.graph import Backend
    from qwen3_tts_gguf.ggml.streaming_codec import GgmlCodec
    from qwen3_tts_gguf.host import devices
    from qwen3_tts_gguf.model.codec import CodecDecoder
    from qwen3_tts_gguf.model.manifest import CODEC_FILE

    from tests.conftest import converted_preset

    folder = converted_preset("tiny_realcodec_cv", "exact")
    (device,) = [d.name for d in devices.llama_runtime().gpu_devices]
    backend = Backend(device)
    codec = GgmlCodec(folder / CODEC_FILE, backend)
    try:
        codes = np.random.default_rng(3).integers(0, 2048, (3, 16))
        t0 = time.perf_counter()
        whole = codec.decode_all(codes)
        seconds = time.perf_counter() - t0
        first, state = codec.decode(codes[:1])
        rest, _ = codec.decode(codes[1:], state)
        snr = snr_db(CodecDecoder(folder / CODEC_FILE, threads=2).decode_all(codes), whole)
        _report(record_property, published_codec_3_frames_s=round(seconds, 1), published_codec_snr_db=round(snr, 1),
                device_mib=round(codec.nbytes / 2**20))
        assert snr > CODEC_SNR_DB
        np.testing.assert_array_equal(np.concatenate([first, rest]), whole)
        other = np.random.default_rng(4).integers(0, 2048, (3, 16))
        side_by_side, _ = codec.decode(np.stack([other, codes]))
        np.testing.assert_array_equal(side_by_side[1], whole)
    finally:
        codec.close()
        backend.close()
