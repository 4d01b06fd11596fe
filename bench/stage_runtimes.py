"""The code predictor and the codec on each runtime a CPU can use: ONNX Runtime's graphs and the project's ggml
graphs (on ggml's CPU backend; `--cp-runtime`, `--codec-runtime`; docs/gpu.md), side by side in one process,
rounds alternating their order.

Per stage and runtime: ms per frame for one stream and for eight (the code predictors decode the eight in one
batched call; the codec follows the engine's chunk ramp, 1-2-4-8-8..., one state per stream), the codec's ms per
frame at fixed chunks of 1, 2, 4 and 8 frames with its work a frame (FLOPs), the resident memory its file added when
it was loaded, and its agreement with the fp32 ONNX graph: greedy codes equal (code predictor, on the same
talker states) and the SNR of the audio (codec). Random weights: speed does not depend on them.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.codec_precision import snr_db
from bench.common import Meter, median, rss_mb, wait_for_quiet

STREAMS = (1, 8)
CHUNKS = (1, 2, 4, 8)
"""The codec's fixed chunks (frames a call)."""


def _chunks(frames: int) -> list[int]:
    """The engine's chunk sizes for an utterance of `frames` frames (its default ramp, chunking.ChunkPlan)."""
    from qwen3_tts_gguf.model.settings import EngineSettings

    ramp = EngineSettings.chunk_frames
    sizes, at = [], 0
    while at < frames:
        sizes.append(min(ramp[min(len(sizes), len(ramp) - 1)], frames - at))
        at += sizes[-1]
    return sizes


def _load(kind: str, runtime: str, folder: Path, stages_file: Path | None, threads: int, device: str | None = None):
    """(stage object, what to close or None); `device`: the ggml device of a ggml variant (None: the CPU)."""
    from qwen3_tts_gguf.model.manifest import CODEC_FILE, load_manifest

    if runtime == "ggml":
        from qwen3_tts_gguf.ggml.graph import Backend

        backend = Backend(device, threads=threads)
        if kind == "predictor":
            from qwen3_tts_gguf.ggml.batched_predictor import GgmlCodePredictor

            stage = GgmlCodePredictor(stages_file, backend,
                                      temperature=load_manifest(folder).llama_stages["temperature"])
        else:
            from qwen3_tts_gguf.ggml.streaming_codec import GgmlCodec

            stage = GgmlCodec(folder / CODEC_FILE, backend)
        return stage, _Closing(stage, backend)
    if kind == "predictor":
        from qwen3_tts_gguf.model.loaded import predictor_file
        from qwen3_tts_gguf.model.predictor import CodePredictor

        return CodePredictor(folder / predictor_file(load_manifest(folder)), threads=threads), None
    from qwen3_tts_gguf.model.codec import CodecDecoder

    return CodecDecoder(folder / CODEC_FILE, threads=threads), None


class _Closing:
    """Closes a ggml stage, then its backend."""

    def __init__(self, *parts):
        self.parts = parts

    def close(self) -> None:
        for part in self.parts:
            part.close()


def _chunked_ms(codec, codes: np.ndarray, chunk: int) -> float:
    """ms per frame of one stream decoding `codes` in calls of `chunk` frames."""
    state, t0 = None, time.perf_counter()
    for at in range(0, len(codes), chunk):
        _, state = codec.decode(codes[at:at + chunk], state)
    return 1000 * (time.perf_counter() - t0) / len(codes)


def _predict(predictor, hidden: np.ndarray, code0: np.ndarray, greedy: bool, rngs: list | None = None) -> np.ndarray:
    from qwen3_tts_gguf.model.sampler import SamplingParams

    rngs = rngs or [np.random.default_rng(k) for k in range(len(hidden))]
    return predictor.predict(hidden, code0, SamplingParams(greedy=greedy), rngs=rngs).codes


def _time_predictor(predictor, hidden: np.ndarray, code0: np.ndarray, streams: int) -> float:
    """ms per frame: each step one call of `streams` streams (sampled, the default settings; each stream's
    generator goes on from step to step, as an engine stream's does)."""
    steps = len(hidden) // streams
    rngs = [np.random.default_rng(k) for k in range(streams)]
    t0 = time.perf_counter()
    for s in range(steps):
        _predict(predictor, hidden[s * streams:(s + 1) * streams], code0[s * streams:(s + 1) * streams], False, rngs)
    return 1000 * (time.perf_counter() - t0) / (steps * streams)


def _loaded_mb(variant: dict, threads: int) -> float:
    """Resident memory the variant's file adds when it is loaded, in a fresh process (a heap that other
    variants freed into would hide it), the load's freed heap given back as the engine gives it (model/loaded.py)."""
    from qwen3_tts_gguf.host.heap import release_freed_heap

    before = rss_mb()
    obj, closer = _load(variant["stage"], variant["runtime"], Path(variant["folder"]),
                        variant.get("stages_file") and Path(variant["stages_file"]), threads, variant.get("device"))
    release_freed_heap()
    grown = rss_mb() - before
    if closer is not None:
        closer.close()
    del obj
    return grown


def _time_codec(codec, codes: np.ndarray, streams: int) -> tuple[float, np.ndarray]:
    """ms per frame of `streams` streams decoding `codes` along the chunk ramp, interleaved; stream 0's audio."""
    states, parts, at = [None] * streams, [], 0
    t0 = time.perf_counter()
    for size in _chunks(len(codes)):
        for k in range(streams):
            wav, states[k] = codec.decode(codes[at:at + size], states[k])
            if k == 0:
                parts.append(wav)
        at += size
    return 1000 * (time.perf_counter() - t0) / (len(codes) * streams), np.concatenate(parts)


def measure(variants: list[dict], threads: int, frames: int = 24, rounds: int = 2, quiet_s: float = 0.0,
            progress=None) -> dict:
    """`variants`: {"name", "stage" (predictor | codec), "runtime" (onnxruntime | ggml), "folder",
    "stages_file", "precision"[, "device": a ggml variant's device, e.g. Vulkan0]}; the first of each stage is its
    reference (fp32 ONNX, on the CPU). Returns every variant's figures."""
    from qwen3_tts_gguf.model.manifest import load_manifest

    manifest = load_manifest(Path(variants[0]["folder"]))
    hidden_size = int(manifest.talker["hidden_size"])
    rng = np.random.default_rng(0)
    steps = frames * max(STREAMS)
    hidden = rng.standard_normal((steps, hidden_size)).astype(np.float32)
    code0 = rng.integers(0, 2048, steps)
    codes = rng.integers(0, 2048, (frames, 16))
    out: dict = {"frames": frames, "threads": threads, "rounds": rounds, "streams": list(STREAMS),
                 "chunks": _chunks(frames), "hidden_size": hidden_size, "variants": {}}
    loaded, closers, reference = {}, [], {}
    try:
        for v in variants:
            name, stage = v["name"], v["stage"]
            entry = out["variants"][name] = {k: v[k] for k in ("stage", "runtime", "precision")}
            entry["device"] = v.get("device") or "CPU"
            entry.update({f"ms_per_frame_{n}": [] for n in STREAMS} | {"background": []})
            if progress:
                progress(f"stage runtimes: loading {name}")
            try:
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                    entry["loaded_mb"] = pool.submit(_loaded_mb, v, threads).result()
                obj, closer = _load(stage, v["runtime"], Path(v["folder"]),
                                    v.get("stages_file") and Path(v["stages_file"]), threads, v.get("device"))
            except Exception as e:  # a runtime that cannot load here is reported, not fatal
                entry["error"] = f"{type(e).__name__}: {e}"[:300]
                continue
            if closer is not None:
                closers.append(closer)
            loaded[name] = obj
            # agreement (and the warm-up): greedy codes on the same states; the codec's whole audio
            got = (_predict(obj, hidden[:frames], code0[:frames], True) if stage == "predictor"
                   else _time_codec(obj, codes, 1)[1])
            if stage == "codec":
                entry.update({f"chunk_ms_{c}": [] for c in CHUNKS})
                if v["runtime"] == "ggml":
                    entry["gflop_per_frame"] = {c: obj.flops_per_frame(c) / 1e9 for c in CHUNKS}
                else:
                    from bench.physics import codec_cost

                    flops = codec_cost(Path(v["folder"]) / "codec_decoder.onnx", threads)["flops_per_frame"] / 1e9
                    entry["gflop_per_frame"] = {c: flops for c in CHUNKS}
            if stage not in reference:
                reference[stage], entry["reference"] = got, True
            elif stage == "predictor":
                entry["codes_equal"] = float(np.mean(got == reference[stage]))
            else:
                entry["snr_db"] = snr_db(got, reference[stage])
        for r in range(rounds):
            for name, obj in list(loaded.items())[::1 if r % 2 == 0 else -1]:
                entry = out["variants"][name]
                for n in STREAMS:
                    if progress:
                        progress(f"stage runtimes: round {r + 1}/{rounds}, {name}, {n} stream(s)")
                    wait_for_quiet(quiet_s)
                    with Meter() as m:
                        if entry["stage"] == "predictor":
                            ms = _time_predictor(obj, hidden[:frames * n], code0[:frames * n], n)
                        else:
                            ms, _ = _time_codec(obj, codes, n)
                    entry[f"ms_per_frame_{n}"].append(ms)
                    entry["background"].append(m.background)
                if entry["stage"] == "codec":
                    for c in CHUNKS:
                        wait_for_quiet(quiet_s)
                        entry[f"chunk_ms_{c}"].append(_chunked_ms(obj, codes, c))
    finally:
        for closer in closers:
            closer.close()
    for entry in out["variants"].values():
        for n in STREAMS:
            entry[f"median_ms_{n}"] = median(entry[f"ms_per_frame_{n}"])
        for c in CHUNKS:
            if entry.get(f"chunk_ms_{c}"):
                entry[f"median_chunk_ms_{c}"] = median(entry[f"chunk_ms_{c}"])
    return out
