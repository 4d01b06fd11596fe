"""Where the memory goes: resident set size after each part of a model is loaded, then the peak with
eight streams running (`python -m bench --only memory`, or part of the full run).

Each KV-cache precision is measured in a fresh worker (task `memory`), loading the parts in the
engine's order: runtimes imported, tokenizer and text tables, talker (weights + KV cache for the
engine's default context), code predictor, codec; then eight concurrent streams through the
engine. The KV cache's size is also computed from the talker's shape (`Talker.kv_cache_bytes`), to
check the measurement.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import LANGUAGE, SPEAKER, TEXT, TEXT_MODE, peak_rss_mb, rss_file_mb, rss_mb

KV_CACHES = ("q8_0", "f16", "q4_0")
STREAMS = 8


def parts(model_dir: str, threads: int, kv_cache: str) -> dict:
    """RSS (MiB) after each part in the engine's order, and the KV cache's computed size."""
    import numpy as np  # noqa: F401  (counted in the runtimes' share, as the engine imports them)
    import onnxruntime  # noqa: F401

    from qwen3_tts_gguf.host.cpus import import_llama

    import_llama()
    from qwen3_tts_gguf.host.heap import map_large_blocks, release_freed_heap
    from qwen3_tts_gguf.model.codec import CodecDecoder
    from qwen3_tts_gguf.model.embeddings import EmbeddingTables
    from qwen3_tts_gguf.model.loaded import predictor_file, talker_settings
    from qwen3_tts_gguf.model.manifest import CODEC_FILE, TALKER_FILE, TEXT_TABLES_FILE, load_manifest
    from qwen3_tts_gguf.model.predictor import CodePredictor
    from qwen3_tts_gguf.model.prompt import PromptBuilder, VoiceSpec
    from qwen3_tts_gguf.model.settings import EngineSettings
    from qwen3_tts_gguf.model.talker import Talker
    from qwen3_tts_gguf.model.tokenizer import TextTokenizer

    folder = Path(model_dir)
    settings = EngineSettings(threads=threads, max_streams=STREAMS, kv_cache=kv_cache)
    map_large_blocks(settings.heap_map_threshold)  # as LoadedModel does first
    rss = {"runtimes": rss_mb()}
    manifest = load_manifest(folder)
    tables = EmbeddingTables(folder / TEXT_TABLES_FILE)
    prompts = PromptBuilder(manifest, TextTokenizer(folder, manifest.tokenizer["pretokenizer"]), tables)
    prompts.build(TEXT, VoiceSpec(speaker=SPEAKER, language=LANGUAGE), TEXT_MODE)
    rss["tokenizer_tables"] = rss_mb()
    talker = Talker(folder / TALKER_FILE, talker_settings(settings, manifest.quant, activations=manifest.activations))
    rss["talker"] = rss_mb()
    predictor = CodePredictor(folder / predictor_file(manifest), threads=threads)
    rss["code_predictor"] = rss_mb()
    codec = CodecDecoder(folder / CODEC_FILE, threads=threads)
    release_freed_heap()  # as LoadedModel does once its parts are loaded
    rss["codec"] = rss_mb()
    del predictor, codec
    steps = list(rss)
    shares = {"runtimes": rss["runtimes"], **{b: rss[b] - rss[a] for a, b in zip(steps, steps[1:])}}
    files = {p.name: p.stat().st_size / 2**20 for p in folder.iterdir()
             if p.suffix in (".gguf", ".onnx", ".data", ".safetensors")}
    return {"kv_cache": talker.kv_cache, "n_ctx": settings.kv_cells, "kv_cache_mb": talker.kv_cache_bytes / 2**20,
            "shares_mb": shares, "loaded_mb": rss["codec"], "loaded_file_mb": rss_file_mb(), "files_mb": files}


def peak(model_dir: str, threads: int, kv_cache: str, frames: int) -> dict:
    """The engine as served (LoadedModel, max_streams 8) with eight streams at once: peak RSS (MiB)."""
    from qwen3_tts_gguf.engine.request import SynthesisRequest
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.prompt import VoiceSpec
    from qwen3_tts_gguf.model.settings import EngineSettings

    model = LoadedModel(model_dir, EngineSettings(threads=threads, max_streams=STREAMS, kv_cache=kv_cache))
    loaded = rss_mb()
    t0 = time.perf_counter()
    with Engine(model) as engine:
        streams = [engine.submit(SynthesisRequest(TEXT, VoiceSpec(speaker=SPEAKER, language=LANGUAGE),
                                                  text_mode=TEXT_MODE, seed=s, max_frames=frames, ignore_eos=True))
                   for s in range(STREAMS)]
        for stream in streams:
            for _ in stream:
                pass
    return {"kv_cache": model.talker.kv_cache, "loaded_mb": loaded, "peak_mb": peak_rss_mb(), "streams": STREAMS,
            "frames": frames, "wall_s": time.perf_counter() - t0, "after_mb": rss_mb(), "after_file_mb": rss_file_mb()}


def measure(progress, model_dir: str, threads: int, frames: int, kv_caches: tuple[str, ...] = KV_CACHES) -> dict:
    """Each KV-cache precision (both by default), each part and peak in its own fresh worker."""
    from bench import machine
    from bench.session import one_shot

    out = {**machine.block_origin(), "model": Path(model_dir).name, "threads": threads, "kv": {}}
    for kv in kv_caches:
        progress.bar.set_description(f"memory: {Path(model_dir).name}, KV cache {kv}")
        out["kv"][kv] = {"parts": one_shot(progress, "memory", {"phase": "parts", "model_dir": model_dir,
                                                          "threads": threads, "kv_cache": kv}),
                   "peak": one_shot(progress, "memory", {"phase": "peak", "model_dir": model_dir, "threads": threads,
                                                         "kv_cache": kv, "frames": frames})}
    return out
