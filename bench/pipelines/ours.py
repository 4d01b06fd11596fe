"""Our engine on a converted model folder: one stream at a time, then N concurrent streams.

Runs in its own process (a `bench.worker` session). The request goes through the public API
(`Engine.submit`, iterate the stream) exactly as an application uses it; time to first audio is
measured on the consumer side (submit -> first AudioChunk in hand). Per-stage totals are the
engine's own `SynthesisResult.timings`; to split the talker's prefill from its per-frame steps
and to see batch sizes, the three stage objects' entry points are wrapped with a timer (the math
is untouched).
"""

from __future__ import annotations

import functools
import os
import threading
import time

from bench.common import (
    FRAME_RATE,
    LANGUAGE,
    LATENCY_TEXTS,
    LONG_FRAMES,
    LONG_TEXT,
    SPEAKER,
    TEXT,
    TEXT_MODE,
    Meter,
    median,
    peak_rss_mb,
    rss_mb,
)


class _CallLog:
    """(stage, duration, rows, streams) of every talker/predictor/codec call, thread-safe."""

    def __init__(self):
        self.events: list[tuple[str, float, int, int]] = []
        self._lock = threading.Lock()

    def wrap(self, obj, method: str, stage: str, sizes):
        fn = getattr(obj, method)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                rows, streams = sizes(*args, **kwargs)
                with self._lock:
                    self.events.append((stage, dt, rows, streams))

        setattr(obj, method, wrapper)

    def take(self) -> list:
        with self._lock:
            out, self.events = self.events, []
        return out


def _talker_sizes(items, *a, **k):
    return sum(len(i.rows) for i in items), len(items)


def _predictor_sizes(hidden, *a, **k):
    return len(hidden), len(hidden)


def _codec_sizes(codes, *a, **k):
    return (codes.shape[-2], 1 if codes.ndim == 2 else codes.shape[0])


def _with_llama_repack() -> None:
    """Prototype (bench.experiments only): llama.cpp's weight repacking for every talker quant,
    through the engine's own switch; the engine itself repacks only where `repack_pays` (q4_k_m on
    a CPU known to lack AMX: the AMX + q8_0 crash on Sapphire Rapids)."""
    from qwen3_tts_gguf.model import talker

    talker.repack_pays = lambda *args, **kwargs: True


def playback_report(arrivals: list[tuple[float, float]]) -> dict:
    """Chunks (arrival s, duration s) played back to back from the first arrival: the stalls a
    real-time player would hit, and the pre-buffer that avoids them all."""
    if not arrivals:
        return {"chunks": 0}
    start = arrivals[0][0]
    played_until, stalls, stalled, first_stall, queued, need = start, 0, 0.0, None, 0.0, 0.0
    for arrival, duration in arrivals:
        need = max(need, arrival - start - queued)  # a pre-buffer of `need` s would cover this chunk
        if arrival > played_until + 1e-9:
            stalls += 1
            stalled += arrival - played_until
            first_stall = first_stall if first_stall is not None else played_until - start
            played_until = arrival
        played_until += duration
        queued += duration
    return {"chunks": len(arrivals), "chunk_frames": [round(d * FRAME_RATE) for _, d in arrivals],
            "audio_s": queued, "stalls": stalls, "stalled_s": stalled, "first_stall_at_s": first_stall,
            "prebuffer_s": need, "first_audio_s": start, "last_arrival_s": arrivals[-1][0]}


class OursSession:
    def __init__(self, model_dir: str, threads: int, frames: int, warmup_frames: int,
                 concurrency_frames: int, max_streams: int = 8,
                 predictor_file: str | None = None, llama_repack: bool = False, progress=None,
                 engine: dict | None = None, second_model: bool = False):
        from qwen3_tts_gguf.engine.scheduler import Engine
        from qwen3_tts_gguf.model.loaded import LoadedModel
        from qwen3_tts_gguf.model.prompt import VoiceSpec
        from qwen3_tts_gguf.model.settings import EngineSettings

        if llama_repack:
            _with_llama_repack()

        self.frames, self.concurrency_frames, self.threads = frames, concurrency_frames, threads
        self.progress = progress or (lambda m: None)
        t0 = time.perf_counter()
        # engine: more EngineSettings fields (bench.experiments variants)
        self.model = LoadedModel(model_dir, EngineSettings(threads=threads, max_streams=max_streams, **(engine or {})))
        self.load_s = time.perf_counter() - t0
        if predictor_file:  # prototype: another code-predictor graph (e.g. MatMulNBits int8), same I/O
            from qwen3_tts_gguf.model.predictor import CodePredictor

            self.model.predictor = CodePredictor(predictor_file, threads=threads)
        self.rss_loaded = rss_mb()
        self.log = _CallLog()
        self.log.wrap(self.model.talker, "decode", "talker", _talker_sizes)
        self.log.wrap(self.model.predictor, "predict", "predictor", _predictor_sizes)
        self.log.wrap(self.model.codec, "decode", "codec", _codec_sizes)
        self.sr = self.model.sample_rate
        self.voice = VoiceSpec(speaker=SPEAKER, language=LANGUAGE)
        self.prompt_rows = len(self.model.prompts.build(TEXT, self.voice, TEXT_MODE).rows)
        self.engine = Engine(self.model).start()
        self.progress("ours: warm-up")
        warm = {}
        self._consume(self.engine.submit(self._request(warmup_frames, 0)), time.perf_counter(), warm)
        self.warmup_first_audio_s = warm.get("first_audio_s")
        self.second = self._second_model(model_dir) if second_model else None
        self.log.take()
        self.peak_single = None

    def _second_model(self, model_dir: str):
        """The same folder loaded again, with the first's settings and an engine of its own, as a server
        serving two models does, left idle after one request: its engine thread keeps the OpenMP team
        llama.cpp gave it."""
        from qwen3_tts_gguf.engine.scheduler import Engine
        from qwen3_tts_gguf.model.loaded import LoadedModel

        self.progress("ours: second model")
        model = LoadedModel(model_dir, self.model.settings)
        second = Engine(model).start()
        self._consume(second.submit(self._request(2, 0)), time.perf_counter(), {})
        return second

    def _request(self, n_frames: int, seed: int, text: str = TEXT, text_mode: str = TEXT_MODE):
        from qwen3_tts_gguf.engine.request import SynthesisRequest

        return SynthesisRequest(text, self.voice, text_mode=text_mode, seed=seed, max_frames=n_frames, ignore_eos=True)

    def _consume(self, stream, start: float, out: dict) -> None:
        first, samples, arrivals = None, 0, []
        for chunk in stream:
            now = time.perf_counter() - start
            if first is None:
                first = now
            samples += len(chunk.samples)
            arrivals.append((now, len(chunk.samples) / self.sr))
        out.update(first_audio_s=first, samples=samples, done_s=time.perf_counter() - start, result=stream.result,
                   arrivals=arrivals)

    def single(self, rep: int, frames: int | None = None) -> dict:
        """One utterance of `frames` frames (default: the session's)."""
        self.progress(f"ours: run {rep + 1}")
        out = {}
        with Meter() as m:
            start = time.perf_counter()
            self._consume(self.engine.submit(self._request(frames or self.frames, rep + 1)), start, out)
        calls = self.log.take()
        res, sr = out["result"], self.sr
        got, t = res.frames, res.timings
        talker_calls = [(d, rows) for s, d, rows, _ in calls if s == "talker"]
        audio_s = out["samples"] / sr
        self.peak_single = peak_rss_mb()
        return {
            "frames": got, "finish_reason": res.finish_reason, "audio_s": audio_s, **m.as_dict(),
            "first_audio_s": out["first_audio_s"], "engine_first_audio_s": t.get("first_audio_s"),
            "total_s": t.get("total_s"),
            "talker_s": t["talker_s"], "predictor_s": t["predictor_s"], "codec_s": t["codec_s"],
            "prefill_s": sum(d for d, rows in talker_calls if rows > 1), "prompt_rows": self.prompt_rows,
            "talker_step_ms": 1e3 * median([d for d, rows in talker_calls if rows == 1]),
            "predictor_ms": 1e3 * median([d for s, d, *_ in calls if s == "predictor"]),
            "talker_ms_per_frame": 1e3 * t["talker_s"] / got,
            "predictor_ms_per_frame": 1e3 * t["predictor_s"] / got,
            "codec_ms_per_frame": 1e3 * t["codec_s"] / got,
            "codec_chunks": [rows for s, _, rows, _ in calls if s == "codec"],
            "other_s": m.wall - t["talker_s"] - t["predictor_s"] - t["codec_s"],
            "rtf": m.wall / audio_s,
        }

    LATENCY_CASES = (("non-streaming", False), ("non-streaming", True), ("streaming", False), ("streaming", True),
                     ("live", False))
    LIVE_WORDS_AFTER_S = 0.4  # a live stream's words come this long after it opened (an LLM's first token)

    def latency(self, rep: int) -> dict:
        """Time to first audio of a short new sentence in both text modes, with the voice's prompt
        prefix first prefilled (the cache cleared) and then taken from the prefix cache; then a live
        stream whose words come LIVE_WORDS_AFTER_S after it opened, cache cleared (timed from the words)."""
        self.progress(f"ours: time to first audio, run {rep + 1}")
        cases = {}
        for j, (mode, cached) in enumerate(self.LATENCY_CASES):
            if not cached:
                self.engine.clear_prefix_cache()
            text = LATENCY_TEXTS[(rep * len(self.LATENCY_CASES) + j) % len(LATENCY_TEXTS)]
            out = {}
            with Meter() as m:
                if mode == "live":  # the stream opens first; its voice prefix is prefilled while it waits
                    stream = self.engine.open_text_stream(self._request(2, 1000 + rep, "", "streaming"))
                    time.sleep(self.LIVE_WORDS_AFTER_S)
                    self.log.take()
                    start = time.perf_counter()
                    stream.push_text(text)
                    stream.close_text()
                    self._consume(stream, start, out)
                else:
                    self._consume(self.engine.submit(self._request(2, 1000 + rep, text, mode)), time.perf_counter(),
                                  out)
            calls = self.log.take()
            first = {stage: next((d for s_, d, *_ in calls if s_ == stage), None)
                     for stage in ("talker", "predictor", "codec")}
            prefill_rows = next((rows for s_, _, rows, _ in calls if s_ == "talker"), None)
            cases[f"{mode}/{'cached' if cached else 'cold'}"] = {
                "first_audio_s": out["first_audio_s"], "prefill_s": first["talker"], "prefill_rows": prefill_rows,
                "predictor_s": first["predictor"], "codec_s": first["codec"], "background": m.background}
        return {"cases": cases, "prefix_hits": self.engine.stats.get("prefix_hits")}

    def playback(self) -> dict:
        """One request of about 30 s of audio: when each chunk arrives against when a player that
        starts at the first chunk needs it (the 1 -> 2 -> 4 -> 8 frame ramp against underruns)."""
        self.progress("ours: 30 s text, playback check")
        out = {}
        with Meter() as m:
            self._consume(self.engine.submit(self._request(LONG_FRAMES, 7, LONG_TEXT)), time.perf_counter(), out)
        self.log.take()
        return {**playback_report(out["arrivals"]), **m.as_dict(), "frames": out["result"].frames,
                "rtf": m.wall / (out["samples"] / self.sr)}

    def isolated(self, steps: int = 16) -> dict:
        """Each stage alone, outside the engine loop (the engine thread is idle): the same objects and
        threads, but nothing else runs between calls. Compared with the in-engine figures this shows
        how much the stages slow each other down (thread pools spinning, caches evicted)."""
        import numpy as np

        from qwen3_tts_gguf.model.sampler import SamplingParams
        from qwen3_tts_gguf.model.talker import DecodeItem

        self.progress("ours: stages in isolation")
        rng = np.random.default_rng(0)
        talker, predictor, codec = self.model.talker, self.model.predictor, self.model.codec
        seq = self.model.settings.max_streams - 1  # a slot no request uses right now
        H = talker.hidden_size
        prompt = self.model.prompts.build(TEXT, self.voice, TEXT_MODE).rows
        with Meter() as m:
            t0 = time.perf_counter()
            _, hidden = talker.decode([DecodeItem(seq, 0, prompt)])
            prefill = time.perf_counter() - t0
            step_t, pred_t, codec_t = [], [], []
            for i in range(steps):
                t0 = time.perf_counter()
                _, hidden = talker.decode([DecodeItem(seq, len(prompt) + i,
                                                      rng.standard_normal((1, H)).astype(np.float32))])
                step_t.append(time.perf_counter() - t0)
            talker.drop(seq)
            for i in range(max(steps // 2, 4)):
                t0 = time.perf_counter()
                predictor.predict(hidden, np.array([7]), SamplingParams(), rngs=[rng])
                pred_t.append(time.perf_counter() - t0)
            state = None
            for i in range(max(steps // 2, 4)):
                t0 = time.perf_counter()
                _, state = codec.decode(rng.integers(0, codec.codebook_size, (4, codec.num_quantizers)), state)
                codec_t.append((time.perf_counter() - t0) / 4)
        self.log.take()
        return {"prefill_s": prefill, "talker_step_ms": 1e3 * median(step_t), "predictor_ms": 1e3 * median(pred_t),
                "codec_ms_per_frame": 1e3 * median(codec_t), "codec_chunk": 4, **m.as_dict()}

    def concurrency(self, n: int) -> dict:
        self.progress(f"ours: {n} concurrent streams")
        outs = [{} for _ in range(n)]
        with Meter() as m:
            start = time.perf_counter()
            streams = [self.engine.submit(self._request(self.concurrency_frames, 100 + i)) for i in range(n)]
            readers = [threading.Thread(target=self._consume, args=(s, start, o)) for s, o in zip(streams, outs)]
            for th in readers:
                th.start()
            for th in readers:
                th.join()
        calls = self.log.take()
        audio = [o["samples"] / self.sr for o in outs]
        return {
            "streams": n, **m.as_dict(), "audio_s_total": sum(audio),
            "aggregate_rtf": m.wall / sum(audio),
            "per_stream_rtf": median([o["done_s"] / a for o, a in zip(outs, audio)]),
            "first_audio_s_median": median([o["first_audio_s"] for o in outs]),
            "first_audio_s_max": max(o["first_audio_s"] for o in outs),
            "talker_call_ms": 1e3 * median([d for s, d, rows, k in calls if s == "talker" and rows == k]),
            "predictor_call_ms": 1e3 * median([d for s, d, *_ in calls if s == "predictor"]),
            "predictor_batch": median([b for s, _, b, _ in calls if s == "predictor"]),
            "codec_s": sum(d for s, d, *_ in calls if s == "codec"),
            "codec_calls": sum(1 for s, *_ in calls if s == "codec"),
            "frames_total": sum(o["result"].frames for o in outs),
            "finish_reasons": sorted({o["result"].finish_reason for o in outs}),
            "peak_rss_mb": peak_rss_mb(),
        }

    def summary(self) -> dict:
        import llama_cpp
        import onnxruntime

        self.engine.stop()
        self.model.close()
        if self.second:
            self.second.stop()
            self.second.model.close()
        m = self.model.manifest
        return {"load_s": self.load_s, "rss_loaded_mb": self.rss_loaded, "peak_rss_single_mb": self.peak_single,
                "peak_rss_mb": peak_rss_mb(), "threads": self.threads, "quant": m.quant,
                "predictor_precision": m.code_predictor.get("precision"), "text_mode": TEXT_MODE,
                "prompt_rows": self.prompt_rows, "warmup_first_audio_s": self.warmup_first_audio_s,
                "llama_cpp": llama_cpp.__version__, "onnxruntime": onnxruntime.__version__, "pid": os.getpid(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")}
