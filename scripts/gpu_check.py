"""The checks and timings of `scripts/gpu-check.sh`: on a lent GPU machine, with the llama.cpp it built
there (`LLAMA_CPP_LIB_PATH`), or in its dry run on the CPU (`--cpu`: every stage on the
CPU, the same steps, small shapes). Models are made where this runs (numpy's random weights, the
converter): none travels, the references are computed there on its CPU.

    python scripts/gpu_check.py parity WORK [--label cuda] [--cpu] [--budget-s S]
    python scripts/gpu_check.py speed WORK [--label cuda] [--cpu] [--shape 1.7b] [--streams 1,8,32] [--frames 48]

parity, on the narrow-codec model (tests/narrow_codec.py: the talker f32, the codec with the hyperparameters
libmtmd hard-codes, narrow), the CPU run in the parity profile (ONNX graphs) as reference:
- the talker with every layer offloaded, teacher-forced: logits and hidden state (the lavapipe bars);
- greedy codes of 30 frames with the code predictor and the codec on the project's ggml graphs on the talker's
  device and on ONNX Runtime (CUDA when this onnxruntime has its provider, else the CPU: said), in that order
  (a call's budget runs out on the last first): equal,
  or equal up to a near tie of the float64 logits (tests/greedy_agreement.py); the audio against the fp32
  ONNX codec's decode of the same codes, as an SNR.
speed, on a random model of `--shape` (converted at the default preset's formats but an fp32 code
predictor): per runtime, first audio and the real-time factor for 1, 8, 32, 64 streams at once, and the peak
device memory (NVML: the GPU's used memory above what it was before the model loaded; `--cpu`: peak RSS)
against the seed's 1.8 GB for 1.7B.

Prints report lines; exit 1 when a parity check fails. WORK keeps the models between calls.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FRAMES = 30
TEXT = "Hello world, this is a parity test."
SPEED_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest."
LOGIT_TOL, HIDDEN_TOL = 3e-2, 5e-3
"""The lavapipe bars (tests/test_vulkan.py); f32 on a real GPU should be far inside them."""
CODEC_SNR_DB = 28.0
"""The ggml codec against the fp32 ONNX codec: 85-95 dB on the CPU backend, 37 dB on lavapipe (ggml-vulkan's f16
inputs to its matrix kernels)."""
SEED_DEVICE_GB = 1.8
"""The seed project's device memory for 1.7B (one stream), the figure to compare with."""
ALL = -1
MAKE_MODEL_S = 240
"""Seconds a random 1.7B model is given to be made (checkpoint and conversion; not yet measured on that machine):
with less left, the next call makes it."""


def say(line: str) -> None:
    print(line, flush=True)


class Budget:
    """Seconds left for this call: a step that would start after them is reported as not run."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self, step: str, need_s: float = 0.0) -> bool:
        if time.monotonic() + need_s < self.end:
            return True
        say(f"  not run: {step} (out of time: run the same command again on the same warm machine, it continues)")
        return False


# -- models ---------------------------------------------------------------------------------------------
def narrow_model(work: Path) -> Path:
    """The narrow-codec model folder, made once in WORK (its checkpoint beside it: `narrow_codec_checkpoint`)."""
    from tests.narrow_codec import narrow_codec_model

    t0 = time.monotonic()
    folder = narrow_codec_model(work)
    say(f"  narrow-codec model {folder.name} ({time.monotonic() - t0:.0f} s to make or find)")
    return folder


def random_model_dir(work: Path, shape: str) -> Path:
    return work / f"random-{shape}"


def speed_model(work: Path, shape: str) -> Path:
    """A random model of `shape` (`narrow`: the narrow-codec model): talker q8_0, code predictor fp32 (no
    ONNX quantizer needed there), llama stages at the default preset; its checkpoint deleted once converted."""
    if shape == "narrow":
        return narrow_model(work)
    from qwen3_tts_gguf.convert.pipeline import convert_checkpoint
    from qwen3_tts_gguf.convert.presets import PRESETS
    from qwen3_tts_gguf.convert.random_checkpoint import make_random_checkpoint

    out = random_model_dir(work, shape)
    checkpoint = out.with_name(out.name + "-checkpoint")
    if not (out / "manifest.json").exists():
        t0 = time.monotonic()
        shutil.rmtree(checkpoint, ignore_errors=True)
        make_random_checkpoint(checkpoint, shape, "custom_voice", seed=1)
        t1 = time.monotonic()
        convert_checkpoint(checkpoint, out, "q8_0", cp_precision="fp32", llama_stages=PRESETS["default"].llama_stages,
                           overwrite=True, verify=False, show_progress=False)
        shutil.rmtree(checkpoint, ignore_errors=True)
        say(f"  {shape} random model: checkpoint {t1 - t0:.0f} s, converted in {time.monotonic() - t1:.0f} s")
    return out


# -- engines ----------------------------------------------------------------------------------------------
def onnx_device() -> str:
    from qwen3_tts_gguf.model.onnx_session import available_devices

    return "cuda" if available_devices().get("cuda") else "cpu"


def runtimes(cpu: bool) -> list[tuple[str, dict]]:
    """(label, engine settings) of each runtime for the code predictor and the codec, the talker offloaded."""
    device = "cpu" if cpu else onnx_device()
    onnx = f"ONNX Runtime on {'CUDA' if device == 'cuda' else 'the CPU'}"
    if not cpu and device == "cpu":
        import onnxruntime as ort

        onnx += f" (onnxruntime {ort.__version__} here has no CUDA provider: ONNX graphs on CUDA untested)"
    return [("code predictor and codec on the project's ggml graphs on the talker's device",
             {"cp_runtime": "ggml", "codec_runtime": "ggml"}),
            (f"code predictor and codec on {onnx}",
             {"cp_runtime": "onnxruntime", "codec_runtime": "onnxruntime", "device": device})]


def start_engine(folder: Path, **settings):
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.settings import EngineSettings

    return Engine(LoadedModel(folder, EngineSettings(**{"max_streams": 2, "n_ctx": 2048, **settings}))).start()


def stop_engine(engine) -> None:
    engine.stop()
    engine.model.close()


def greedy(text: str, frames: int):
    from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
    from qwen3_tts_gguf.model.prompt import VoiceSpec
    from qwen3_tts_gguf.model.sampler import SamplingParams

    g = SamplingParams(greedy=True)
    return SynthesisRequest(text, VoiceSpec(speaker="ryan", language="english"), talker=TalkerSampling(g),
                            code_predictor=g, max_frames=frames, ignore_eos=True)


def speak(engine, request):
    stream = engine.submit(request)
    wav = [chunk.samples for chunk in stream]
    return stream.result, np.concatenate(wav) if wav else np.zeros(0, np.float32)


# -- parity ----------------------------------------------------------------------------------------------
def parity(work: Path, label: str, cpu: bool, budget: Budget) -> bool:
    from qwen3_tts_gguf.model.codec import CodecDecoder
    from qwen3_tts_gguf.model.manifest import CODEC_FILE, TALKER_FILE
    from qwen3_tts_gguf.model.talker import Talker, TalkerSettings

    from tests.greedy_agreement import assert_greedy_codes_agree, recording, snr_db
    from tests.narrow_codec import narrow_codec_checkpoint

    say(f"== parity on {label}: the narrow-codec model, against this machine's CPU (parity profile, ONNX graphs)")
    folder = narrow_model(work)
    layers = 0 if cpu else ALL
    where = "on the CPU (dry run)" if cpu else "offloaded"
    ok = True
    talkers = [Talker(folder / TALKER_FILE, TalkerSettings(n_ctx=256, max_streams=2, deterministic=True, gpu_layers=n))
               for n in (0, layers)]
    rows = np.random.default_rng(0).standard_normal((14, talkers[0].hidden_size)).astype(np.float32)
    (ref_l, ref_h), (dev_l, dev_h) = [t.decode_steps(0, rows, 9) for t in talkers]
    for t in talkers:
        t.close()
    dl, dh = float(np.abs(dev_l - ref_l).max()), float(np.abs(dev_h - ref_h).max())
    ok &= dl < LOGIT_TOL and dh < HIDDEN_TOL
    say(f"  talker f32, every layer {where}, teacher-forced: logits max|d| {dl:.2e}, hidden max|d| {dh:.2e} "
        f"(bars {LOGIT_TOL:g}, {HIDDEN_TOL:g})")
    reference = start_engine(folder, deterministic=True)
    try:
        ref, _ = speak(reference, greedy(TEXT, FRAMES))
    finally:
        stop_engine(reference)
    onnx_codec = CodecDecoder(folder / CODEC_FILE)
    for name, settings in runtimes(cpu):
        if not budget.left(f"greedy codes, {name}"):
            return ok
        engine = start_engine(folder, gpu_layers=layers, kv_cache="f16", chunk_frames=(16,), adaptive_chunks=False,
                              **settings)
        inputs = recording(engine)
        try:
            t0 = time.monotonic()
            result, wav = speak(engine, greedy(TEXT, FRAMES))
            seconds = time.monotonic() - t0
        finally:
            stop_engine(engine)
        same = (result.codes == ref.codes).all(axis=1)
        verdict = f"{int(same.sum())}/{FRAMES} frames equal"
        if not same.all():
            try:
                assert_greedy_codes_agree(result.codes, ref.codes, inputs, narrow_codec_checkpoint(work))
                verdict += f", from frame {int(np.argmin(same))} on after a near tie of the float64 logits"
            except AssertionError as e:
                ok = False
                verdict += f", first difference at frame {int(np.argmin(same))} is no near tie: {e} FAIL"
        snr = snr_db(onnx_codec.decode_all(result.codes), wav)
        ok &= snr > CODEC_SNR_DB
        say(f"  greedy codes, talker {where}, {name}: {verdict}; audio against the fp32 ONNX codec {snr:.1f} dB "
            f"(bar {CODEC_SNR_DB:g}); {seconds:.1f} s")
    return ok


# -- speed -----------------------------------------------------------------------------------------------
class DeviceMemory:
    """Peak of the GPU's used memory (NVML, sampled every 20 ms) above its use when started; None without NVML."""

    def __init__(self):
        self._nvml = self._handle = None
        try:
            self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
            self._nvml.nvmlInit_v2()
            self._handle = ctypes.c_void_p()
            self._nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self._handle))
        except (OSError, AttributeError):
            self._nvml = None
        self.base = self.peak = self._used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _used(self) -> int | None:
        if self._nvml is None:
            return None
        info = (ctypes.c_ulonglong * 3)()  # nvmlMemory_t: total, free, used
        if self._nvml.nvmlDeviceGetMemoryInfo(self._handle, ctypes.byref(info)) != 0:
            return None
        return int(info[2])

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            used = self._used()
            if used is not None:
                self.peak = max(self.peak, used)

    def stop(self) -> str:
        self._stop.set()
        self._thread.join()
        if self.base is None:
            from bench.common import peak_rss_mb

            return f"peak RSS {peak_rss_mb() / 1024:.2f} GB (no GPU: no device memory)"
        return f"peak device memory {(self.peak - self.base) / 1e9:.2f} GB"


def timed_streams(engine, streams: int, frames: int) -> tuple[list[float], float]:
    """`streams` sampled streams at once, each read to its end: first-audio seconds of each, wall seconds."""
    from qwen3_tts_gguf.engine.request import SynthesisRequest
    from qwen3_tts_gguf.model.prompt import VoiceSpec

    t0 = time.monotonic()
    submitted = [engine.submit(SynthesisRequest(SPEED_TEXT, VoiceSpec(speaker="ryan", language="english"),
                                                max_frames=frames, ignore_eos=True, seed=k)) for k in range(streams)]
    for stream in submitted:
        for _ in stream:
            pass
    wall = time.monotonic() - t0
    bad = [s.result for s in submitted if s.result.finish_reason != "max_frames"]
    if bad:
        raise RuntimeError(f"{len(bad)} of {streams} streams ended early: {bad[0].finish_reason} {bad[0].error}")
    return [s.result.timings["first_audio_s"] for s in submitted], wall


def speed(work: Path, label: str, cpu: bool, shape: str, stream_counts: list[int], frames: int, budget: Budget) -> None:
    from qwen3_tts_gguf.model.manifest import load_manifest

    made = shape == "narrow" or (random_model_dir(work, shape) / "manifest.json").exists()
    if not budget.left(f"making the {shape} model", 0 if made else MAKE_MODEL_S):
        return
    folder = speed_model(work, shape)
    say(f"== speed on {label}: {shape} random model, talker {load_manifest(folder).quant} "
        f"{'on the CPU (dry run)' if cpu else 'offloaded'}, {frames} frames ({frames * 0.08:.1f} s of audio) a "
        "stream, sampled")
    layers = 0 if cpu else ALL
    for name, settings in runtimes(cpu):
        # one stream in an engine of one (the configuration the seed's figure is for), then the rest in one engine
        for group in ([n for n in stream_counts if n == 1], [n for n in stream_counts if n > 1]):
            if not group or not budget.left(f"{name}, {group} streams"):
                continue
            memory = DeviceMemory()
            t0 = time.monotonic()
            engine = start_engine(folder, gpu_layers=layers, max_streams=max(group), n_ctx=0, **settings)
            loaded = time.monotonic() - t0
            try:
                timed_streams(engine, 1, 2)  # warm-up: kernels chosen, shaders compiled
                for n in group:
                    first, wall = timed_streams(engine, n, frames)
                    rtf = wall / (frames * 0.08)
                    say(f"  {name}, {n} stream{'s' * (n > 1)}: first audio median {np.median(first):.3f} s "
                        f"(max {max(first):.3f}), RTF {rtf:.3f} a stream ({n / rtf:.1f}x real time in all)")
            finally:
                stop_engine(engine)
            vs = f" (the seed: {SEED_DEVICE_GB} GB for 1.7B)" if shape == "1.7b" and group == [1] else ""
            say(f"  {name}, engine of {max(group)} stream(s) (loaded in {loaded:.1f} s): {memory.stop()}{vs}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("parity", "speed"))
    p.add_argument("work", type=Path, help="folder for the models made here (kept between calls)")
    p.add_argument("--label", default="cpu", help="the backend's name in the report (cuda, vulkan)")
    p.add_argument("--cpu", action="store_true", help="dry run: every stage on the CPU")
    p.add_argument("--shape", default="1.7b", help="speed: the random model's shape (1.7b, 0.6b, narrow)")
    p.add_argument("--streams", default="1,8,32", help="speed: stream counts")
    p.add_argument("--frames", type=int, default=48, help="speed: frames a stream")
    p.add_argument("--budget-s", type=float, default=1e9, help="seconds this call may spend")
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    budget = Budget(a.budget_s)
    if a.what == "parity":
        ok = parity(a.work, a.label, a.cpu, budget)
        say(f"gpu-check parity on {a.label}: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    speed(a.work, a.label, a.cpu, a.shape, [int(n) for n in a.streams.split(",")], a.frames, budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
