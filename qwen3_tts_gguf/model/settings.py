"""The engine's knobs (`EngineSettings`, each with its domain) and the caps those domains end at: what the CLI's
and the server's flags are derived from (`flags.py`, `api/cli_args.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from qwen3_tts_gguf.host.cpus import StageThreads, default_threads, stage_threads
from qwen3_tts_gguf.host.heap import MAP_THRESHOLD, MAX_MAP_THRESHOLD
from qwen3_tts_gguf.model.stage_runtimes import check_stage_runtimes

KV_CELLS_PER_STREAM = 1024
"""Talker KV cells per configured stream when `n_ctx` is not given, never fewer than MIN_KV_CELLS in all
(so one stream holds a whole segment of `max_segment_chars`: about 250 English text tokens, their
prompt and their frames at a few per token). The pool is shared: a stream alone may use all of it."""
MIN_KV_CELLS = 2048
MAX_KV_CELLS = 1 << 20
"""The most talker KV cells (`n_ctx`): 60 GiB at 0.6B with a q8_0 cache; fewer may not fit this machine's memory,
which llama.cpp reports when it makes the context."""
MAX_THREADS = 256
"""The most threads one runtime is given: beyond the CPUs this process may use they only wait for each other."""
MAX_STREAMS = 128
"""The most streams one model runs at once: llama.cpp holds at most 256 sequences (LLAMA_MAX_SEQ), shared by
the streams and the prefix cache's scratch sequence."""
MAX_PREFIX_CACHE = 128
MAX_PENDING = 10_000
"""The most requests (and, apart, live-text streams) one model lets wait for a slot."""
MAX_BUFFERED_AUDIO_S = 600.0
MAX_CHUNK_FRAMES = 16
"""The largest chunk: a stream with this many frames waiting for the codec makes no more (iteration.py), so a
larger chunk would never be due."""
MIN_SEGMENT_CHARS, MAX_SEGMENT_CHARS = 8, 100_000
RUNAWAY_ACTIONS = ("off", "end", "retry")
"""What the runaway guard does with a segment whose codebook 0 loops (engine/runaway.py)."""
MAX_RUNAWAY_RETRIES = 8


@dataclass(frozen=True)
class EngineSettings:
    """Runtime knobs. `deterministic` is the parity profile (F32 KV cache, flash attention off)."""

    threads: int = 0  # 0: all cores
    max_streams: int = 8
    n_ctx: int = 0  # KV cells shared by all streams; 0: KV_CELLS_PER_STREAM per stream (kv_cells)
    deterministic: bool = False
    device: str = "cpu"  # ONNX Runtime device for code predictor and codec: devices.ONNX_DEVICES (cpu, auto, cuda, ...)
    gpu_layers: int = 0  # llama.cpp talker layers to offload (Vulkan/CUDA builds); -1: all (devices.GPU_LAYERS_ALL)
    chunk_frames: tuple[int, ...] = (1, 2, 4, 8)  # first audio after 1 frame, then growing chunks
    # the codec on threads of its own beside talker and predictor (2+ threads; not deterministic)
    codec_overlap: bool = True
    # ONNX Runtime threads per codec call; 0: `threads`; fewer: calls in parallel lanes (cpus.stage_threads)
    codec_threads: int = 0
    adaptive_chunks: bool = True  # a chunk goes out early when a player would run dry (chunking.py; not deterministic)
    budget_base_frames: int = 30  # runaway protection: a segment never exceeds base + per_token * its
    budget_frames_per_token: int = 12  #   text tokens frames (the margin: docs/reliability.md, Runaway)
    runaway: str = "retry"  # a segment whose codebook 0 loops: off, end, retry (engine/runaway.py)
    runaway_retries: int = 2  # retries per stream before a loop ends its segment
    max_pending: int = 64  # requests waiting for a slot before submit refuses
    max_pending_live: int = 64  # live-text streams waiting for their first final token (apart from max_pending)
    max_buffered_audio_s: float = 10.0  # audio a stream may have made ahead of its reader before it pauses
    max_segment_chars: int = 1000  # longer input is split at sentence ends (decoder state carries over)
    # voice prefixes kept prefilled (0 = off; off when deterministic): a CustomVoice model's nine speakers and
    # some profiles, each a saved copy of its KV rows (engine/prefix_cache.py: about 0.7 MiB at 0.6B)
    prefix_cache: int = 16
    kv_cache: str = "q8_0"  # talker KV cache precision, talker.KV_CACHE_TYPES (deterministic: always f32)
    # bytes from which malloc maps blocks on their own (heap.py); 0: glibc's choice
    heap_map_threshold: int = MAP_THRESHOLD
    # what runs the code predictor and the codec (stage_runtimes.py): auto (the project's ggml graphs when the talker
    # is on a GPU ONNX Runtime cannot use, else ONNX Runtime), onnxruntime, ggml; the codec also openvino
    # (faster on a CPU, more memory; not deterministic)
    cp_runtime: str = "auto"
    codec_runtime: str = "auto"

    def __post_init__(self) -> None:
        def check(name: str, ok: bool, domain: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {domain}, got {getattr(self, name)!r}")

        check("threads", 0 <= self.threads <= MAX_THREADS, f"0 (the usable CPUs) to {MAX_THREADS}")
        check("max_streams", 1 <= self.max_streams <= MAX_STREAMS, f"1 to {MAX_STREAMS}")
        check("codec_threads", 0 <= self.codec_threads <= MAX_THREADS, f"0 (as threads) to {MAX_THREADS}")
        check("max_pending", 0 <= self.max_pending <= MAX_PENDING, f"0 to {MAX_PENDING}")
        check("max_pending_live", 0 <= self.max_pending_live <= MAX_PENDING, f"0 to {MAX_PENDING}")
        check("max_buffered_audio_s", 0 < self.max_buffered_audio_s <= MAX_BUFFERED_AUDIO_S,
              f"above 0 and at most {MAX_BUFFERED_AUDIO_S:g} seconds")
        check("prefix_cache", 0 <= self.prefix_cache <= MAX_PREFIX_CACHE, f"0 (off) to {MAX_PREFIX_CACHE}")
        check("n_ctx", 0 <= self.n_ctx <= MAX_KV_CELLS, f"0 (per stream) to {MAX_KV_CELLS}")
        check("chunk_frames", len(self.chunk_frames) > 0 and all(1 <= n <= MAX_CHUNK_FRAMES for n in self.chunk_frames),
              f"one or more frame counts of 1 to {MAX_CHUNK_FRAMES}")
        check("budget_base_frames", self.budget_base_frames >= 1, "at least 1")
        check("budget_frames_per_token", self.budget_frames_per_token >= 0, "0 or more")
        check("runaway", self.runaway in RUNAWAY_ACTIONS, f"one of {', '.join(RUNAWAY_ACTIONS)}")
        check("runaway_retries", 0 <= self.runaway_retries <= MAX_RUNAWAY_RETRIES, f"0 to {MAX_RUNAWAY_RETRIES}")
        check("max_segment_chars", MIN_SEGMENT_CHARS <= self.max_segment_chars <= MAX_SEGMENT_CHARS,
              f"{MIN_SEGMENT_CHARS} to {MAX_SEGMENT_CHARS}")
        check("heap_map_threshold", 0 <= self.heap_map_threshold <= MAX_MAP_THRESHOLD, f"0 to {MAX_MAP_THRESHOLD}")
        check_stage_runtimes(self.cp_runtime, self.codec_runtime, deterministic=self.deterministic)

    @property
    def overlaps_codec(self) -> bool:
        """Whether the codec runs on threads of its own (asked, fast profile, at least 2 threads)."""
        return self.codec_overlap and not self.deterministic and default_threads(self.threads) >= 2

    @property
    def stage_threads(self) -> StageThreads:
        """Each stage's threads (cpus.stage_threads)."""
        return stage_threads(self.threads, codec_overlap=self.overlaps_codec, codec_threads=self.codec_threads)

    @property
    def kv_cells(self) -> int:
        """The talker's KV cells: `n_ctx`, or KV_CELLS_PER_STREAM per stream (at least MIN_KV_CELLS)."""
        return self.n_ctx or max(MIN_KV_CELLS, KV_CELLS_PER_STREAM * self.max_streams)
