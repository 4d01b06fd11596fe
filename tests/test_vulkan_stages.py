"""Every stage of a frame on a real Vulkan backend, Mesa's software device (lavapipe): the talker offloaded
(`--gpu-layers all`), the code predictor and the codec on llama.cpp's own Qwen3-TTS graphs on the same
device (`--cp-runtime llama --codec-runtime llama`, or `auto`, which picks them there).

Run as tests/test_vulkan.py is, by the Vulkan build's python (CI does, in the same process):

    .venv-vulkan/bin/python -m pytest -q tests/test_vulkan.py tests/test_vulkan_stages.py

What a frame still does on the CPU (the glue; docs/gpu.md, *What runs where*): codebook 0's sampling from the
talker's logits (repetition penalty, temperature, top-k/top-p, suppressed ids, end of speech), the text
row of the next talker input (a table lookup) added to the frame embedding code_gen returns, a segment's
prompt rows, the runaway guard and the chunking; and the copies between host and device: the talker's
logits and hidden state out, code_gen's hidden state and code 0 in and 16 codes and the next input row out,
that row into the talker, code2wav's codes in and samples and state out.

The codec's cost decides the design. One code2wav call computes a whole 72-frame window, whatever the frames
asked; at the published codec's widths that is about 300 GFLOP: on lavapipe (2 shared cores, load 5-9)
142 s a call, 344 s for a process's first. So these tests use the narrow-codec model (tests/narrow_codec.py:
the graph and the hyperparameters libmtmd hard-codes, channels 32 wide): 16-19 s a window (IM2COL, RMS
norm and RoPE shaders, slow on llvmpipe at any width, are most of it); code_gen about 1 s a frame. A
machine's first run also compiles the shaders (minutes, once: Mesa keeps them in ~/.cache/mesa_shader_cache).
So each stream costs one window per 16 frames: the engine here sends a stream's frames to the codec 16 at a
time (`chunk_frames=(16,)`, adaptive chunks off: lavapipe is never real time, so adaptive chunking would send
every frame alone), its requests carry no seed (a seeded stream's calls follow a grid of 4 frames), and the
server (its default chunking) speaks 2 frames without a warm-up. Measured (2 cores, load 3.5-4): the whole file
about 2 minutes.
"""

from __future__ import annotations

import ctypes
import os
import time
from contextlib import contextmanager

import numpy as np
import pytest

from tests.conftest import CACHE
from tests.greedy_agreement import assert_greedy_codes_agree, recording, snr_db
from tests.narrow_codec import narrow_codec_checkpoint, narrow_codec_model
from tests.test_vulkan import ALL, SKIP, _report

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
FRAMES = 30
CHUNK = 16
"""Frames per codec call: the most a stream holds for the codec (engine/iteration.MAX_PENDING_FRAMES; a larger
chunk would stall it), so a stream of up to 16 frames costs one window, the 30-frame one two."""
CODEC_SNR_DB = 28.0
"""The codec on lavapipe against the fp32 ONNX codec and llama.cpp's CPU backend, both on the CPU. Measured
on the narrow-codec model, 30 frames: 31.4 and 31.3 dB (the CPU backend against ONNX: 39.2 dB; its
convolutions round to f16): ggml-vulkan's f16 arithmetic on a device that reports fp16 support (with
GGML_VK_DISABLE_F16=1, 39.7 dB)."""
VOICE = {"speaker": "ryan", "language": "english"}


@contextmanager
def mtmd_log():
    """What libmtmd logs meanwhile (it says which backend a context uses), in a list."""
    from llama_cpp import llama_log_callback

    from qwen3_tts_gguf.model import llama_stages

    mtmd = llama_stages._mtmd()
    llama_stages._quiet_mtmd_logs(mtmd)  # first, so that loading the stages does not silence ours
    lines: list[str] = []
    callback = llama_log_callback(lambda level, text, data: lines.append(text.decode(errors="replace")))
    mtmd.mtmd_log_set(callback, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        mtmd.mtmd_log_set(llama_stages._MTMD_LOG_CALLBACK, ctypes.c_void_p(0))


def _settings(**kw):
    from qwen3_tts_gguf.model.loaded import EngineSettings

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
    # no seed (greedy draws nothing): a seeded stream's codec calls follow a grid of 4-frame calls
    # (engine/chunking.py), and every llama.cpp codec call is a whole window
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
    with mtmd_log() as log:
        engine = _start(folder, _settings(gpu_layers=ALL, kv_cache="f16", chunk_frames=(CHUNK,), adaptive_chunks=False))
    engine.mtmd_log = log
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
    from qwen3_tts_gguf.runtime import devices

    model = vulkan.model
    assert (model.runtimes.predictor, model.runtimes.codec) == ("llama", "llama"), model.runtimes
    assert model.llama_stages.use_gpu and model.talker._device_locks
    (device,) = [d.name for d in devices.llama_runtime().gpu_devices]
    # libmtmd names the backend its context runs on (both of its graphs, one context)
    used = [line.strip() for line in vulkan.mtmd_log if "CLIP using" in line]
    assert used and all(line == f"clip_ctx: CLIP using {device} backend" for line in used), used
    # the stages take the talker's device lock
    assert [lock.name for lock in model.llama_stages._device_locks] == [device]


def test_greedy_codes_with_every_stage_on_vulkan_equal_the_cpu_run(vulkan, cpu, folder, record_property):
    """30 greedy frames: codes equal to the CPU run's (up to a near tie of the code predictor's float64
    logits: tests/greedy_agreement.py); the audio, decoded on lavapipe in the engine's calls (16 + 14
    frames), against the fp32 ONNX codec's and the CPU llama.cpp codec's decode of the same codes."""
    from qwen3_tts_gguf.model.codec import CodecDecoder
    from qwen3_tts_gguf.model.llama_stages import LlamaCodec, LlamaStages
    from qwen3_tts_gguf.model.manifest import CODEC_FILE, LLAMA_STAGES_FILE

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
    stages = LlamaStages(folder / LLAMA_STAGES_FILE, threads=2)  # llama.cpp's CPU backend
    try:
        llama_cpu = LlamaCodec(stages).decode_all(result.codes)
    finally:
        stages.close()
    assert wav.shape == onnx.shape == (FRAMES * 1920,)
    snr = {"onnx": snr_db(onnx, wav), "llama_cpu": snr_db(llama_cpu, wav), "cpu_vs_onnx": snr_db(onnx, llama_cpu)}
    _report(record_property, frames=FRAMES, equal_frames_vs_cpu=first, equal_codes_vs_cpu=float(same.mean()),
            seconds=round(seconds, 1), predictor_s=round(result.timings["predictor_s"], 1),
            codec_s=round(result.timings["codec_s"], 1), **{f"snr_db_vs_{k}": round(v, 1) for k, v in snr.items()})
    assert snr["onnx"] > CODEC_SNR_DB and snr["llama_cpu"] > CODEC_SNR_DB


def test_two_streams_at_once_one_cancelled_with_every_stage_on_vulkan(vulkan, cpu, record_property):
    """Two streams stepping together (one talker decode steps both; code_gen and code2wav take one stream a
    call); the first is cancelled after about two frames each, the second goes on alone to its end. The
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
    # no warm-up: on lavapipe it costs two codec windows (half a minute) before the port opens
    with ServeProcess("--model", str(folder), "--gpu-layers", "all", "--cp-runtime", "llama", "--codec-runtime",
                      "llama", "--threads", "2", "--max-streams", "2", "--warm-up-voices", "none",
                      log_path=tmp_path / "serve.log", env=env) as server:
        r = httpx.post(f"{server.url}/v1/audio/speech", timeout=300,
                       json={"model": "tts-1", "input": "Hello from the software GPU.", "voice": "ryan",
                             "response_format": "pcm", "seed": 1, "max_frames": 2})
        assert r.status_code == 200, r.text
        assert len(r.content) >= 2 * 1920  # at least one 80 ms frame of s16 at 24 kHz
        log = server.log()
    assert "devices: talker: all layers on Vulkan" in log and "llvmpipe" in log, log
    assert "code predictor on llama.cpp's graphs on the talker's device" in log, log
    assert "codec on llama.cpp's graphs on the talker's device" in log, log
