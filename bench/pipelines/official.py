"""The official `qwen-tts` 0.1.1 pipeline (PyTorch, CPU, fp32) on the same weights and workload.

Runs in its own process (a `bench.worker` session). Per-stage times come from hooks that only
time calls (reference-harness.md §4): `talker.forward` (its first call is the prefill; each later
call also runs the code predictor for the previous frame), `code_predictor.generate` and
`speech_tokenizer.decode`. EOS is moved out of reach so exactly `frames` frames come out
(max_new_tokens = frames + 1, reference-harness.md §3.1). The official wrapper is not streaming:
its first audio sample exists when the whole call returns.
"""

from __future__ import annotations

import functools
import os
import time

from bench.common import LANGUAGE, SAMPLE_RATE, SPEAKER, TEXT, Meter, median, peak_rss_mb, rss_mb


def _timed(record: list, fn):
    @functools.wraps(fn)  # HF generate inspects forward's signature
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record.append((t0, time.perf_counter() - t0))
    return wrapper


class OfficialSession:
    def __init__(self, checkpoint: str, threads: int, frames: int, warmup_frames: int, progress=None):
        import torch

        from tests.reference.official import import_qwen_tts  # the repo root is on sys.path (worker)

        self.progress = progress or (lambda m: None)
        self.frames, self.threads = frames, threads
        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        import_qwen_tts()
        import transformers
        from qwen_tts import Qwen3TTSModel

        transformers.logging.set_verbosity_error()  # the codec *encoder* is absent from CustomVoice checkpoints
        t0 = time.perf_counter()
        self.tts = Qwen3TTSModel.from_pretrained(checkpoint, dtype=torch.float32)
        self.load_s = time.perf_counter() - t0
        self.rss_loaded = rss_mb()
        model = self.tts.model
        talker = model.talker
        self.events = {"talker": [], "cp": [], "codec": []}
        talker.forward = _timed(self.events["talker"], talker.forward)
        talker.code_predictor.generate = _timed(self.events["cp"], talker.code_predictor.generate)
        model.speech_tokenizer.decode = _timed(self.events["codec"], model.speech_tokenizer.decode)
        model.config.talker_config.codec_eos_token_id = 10**6  # ignore EOS
        self.progress("official: warm-up")
        self._once(warmup_frames, 0)

    def _once(self, n_frames: int, seed: int) -> dict:
        import torch

        for v in self.events.values():
            v.clear()
        torch.manual_seed(seed)
        with torch.no_grad(), Meter() as m:
            start = time.perf_counter()
            wavs, _ = self.tts.generate_custom_voice(text=TEXT, speaker=SPEAKER, language=LANGUAGE,
                                                     non_streaming_mode=True, max_new_tokens=n_frames + 1)
        samples = len(wavs[0])
        talker_calls, cp_calls, codec_calls = self.events["talker"], self.events["cp"], self.events["codec"]
        cp_total = sum(d for _, d in cp_calls)
        prefill = talker_calls[0][1] if talker_calls else 0.0
        step_talker = [d - c for (_, d), (_, c) in zip(talker_calls[1:], cp_calls)]  # forward k = CP(k-1) + step
        codec_s = sum(d for _, d in codec_calls)
        talker_s = prefill + sum(step_talker)
        got = samples // 1920
        return {
            "frames": got, "audio_s": samples / SAMPLE_RATE, **m.as_dict(),
            "prefill_s": prefill, "talker_step_ms": 1e3 * median(step_talker),
            "predictor_ms": 1e3 * median([d for _, d in cp_calls]),
            "talker_ms_per_frame": 1e3 * talker_s / got, "predictor_ms_per_frame": 1e3 * cp_total / got,
            "codec_s": codec_s, "codec_ms_per_frame": 1e3 * codec_s / got,
            "other_s": m.wall - talker_s - cp_total - codec_s,
            "first_codes_s": (cp_calls[0][0] + cp_calls[0][1] - start) if cp_calls else None,
            "first_audio_s": m.wall,  # not streaming
            "rtf": m.wall / (samples / SAMPLE_RATE),
        }

    def single(self, rep: int) -> dict:
        self.progress(f"official: run {rep + 1}")
        return self._once(self.frames, rep + 1)

    def summary(self) -> dict:
        import torch

        return {"load_s": self.load_s, "rss_loaded_mb": self.rss_loaded, "peak_rss_mb": peak_rss_mb(),
                "threads": self.threads, "torch": torch.__version__, "dtype": "float32",
                "torch_threads": torch.get_num_threads(), "pid": os.getpid(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
