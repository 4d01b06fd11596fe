"""A converted model folder opened for inference: manifest, tokenizer, tables, talker, graphs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from qwen3_tts_gguf.host.cpus import StageThreads, default_threads, stage_threads
from qwen3_tts_gguf.host.heap import MAP_THRESHOLD, MAX_MAP_THRESHOLD, map_large_blocks, release_freed_heap
from qwen3_tts_gguf.model.manifest import (
    CODEC_FILE,
    LLAMA_STAGES_FILE,
    PREDICTOR_CPU_FILE,
    PREDICTOR_FILE,
    TALKER_FILE,
    Manifest,
    ModelFolderError,
    load_manifest,
)
from qwen3_tts_gguf.model.manifest import TEXT_TABLES_FILE as TEXT_TABLES
from qwen3_tts_gguf.model.onnx_session import resolve_device
from qwen3_tts_gguf.model.openvino_session import check_codec_runtime
from qwen3_tts_gguf.model.prompt import PromptBuilder
from qwen3_tts_gguf.model.stage_runtimes import StageRuntimeError, StageRuntimes, check_stage_runtimes, resolve
from qwen3_tts_gguf.model.tokenizer import TextTokenizer

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


def talker_settings(settings: EngineSettings, quant: str, threads: StageThreads | None = None):
    """The talker's context settings (talker.TalkerSettings) for an engine with `settings` and a
    talker of quant `quant`; `threads`: `settings.stage_threads` when already worked out."""
    from qwen3_tts_gguf.model.talker import TalkerSettings, repack_pays

    threads = threads or settings.stage_threads
    return TalkerSettings(
        n_ctx=settings.kv_cells, max_streams=settings.max_streams, cached_prefixes=settings.prefix_cache,
        # one row gets every core until a codec call runs beside it (the engine sets it per decode)
        threads=threads.talker_batch, batch_threads=threads.talker_batch, kv_cache=settings.kv_cache,
        gpu_layers=settings.gpu_layers, deterministic=settings.deterministic,
        repack=repack_pays(quant, deterministic=settings.deterministic, gpu_layers=settings.gpu_layers))


def predictor_file(manifest: Manifest, device: str = "cpu") -> str:
    """The code predictor graph `device` runs: the CPU's fused-attention graph where the folder has one
    (converted since 2026-12-02), else the graph every device runs."""
    cpu = PREDICTOR_CPU_FILE in manifest.files and resolve_device(device).name == "cpu"
    return PREDICTOR_CPU_FILE if cpu else PREDICTOR_FILE


class LoadedModel:
    """Everything needed to synthesise with one converted model."""

    def __init__(self, folder: str | Path, settings: EngineSettings = EngineSettings()):
        from qwen3_tts_gguf.model.codec import CodecDecoder
        from qwen3_tts_gguf.model.embeddings import EmbeddingTables
        from qwen3_tts_gguf.model.predictor import CodePredictor
        from qwen3_tts_gguf.model.talker import Talker, TalkerError

        self.folder = Path(folder)
        self.manifest: Manifest = load_manifest(self.folder)
        self.settings = settings
        # as the talker re-checks its GPU layers: what the start-up check refuses (CodecRuntimeError), an
        # engine built without that check refuses too, before loading anything
        if settings.codec_runtime == "openvino":
            check_codec_runtime(settings.codec_runtime, settings.device, settings.deterministic)
        try:
            self.runtimes: StageRuntimes = resolve(settings.cp_runtime, settings.codec_runtime, self.manifest,
                                                   gpu_layers=settings.gpu_layers,
                                                   onnx_device=resolve_device(settings.device).name,
                                                   deterministic=settings.deterministic)
        except StageRuntimeError as e:  # the ggml code predictor asked of a folder without its weights
            raise ModelFolderError(f"{self.folder}: {e}") from e
        map_large_blocks(settings.heap_map_threshold)  # before the graphs allocate (process-wide)
        try:
            self.tokenizer = TextTokenizer(self.folder, self.manifest.tokenizer["pretokenizer"])
            self.tables = EmbeddingTables(self.folder / TEXT_TABLES)
        except (OSError, ValueError) as e:
            raise ModelFolderError(f"{self.folder}: cannot read the tokenizer or text tables ({e})") from e
        self.prompts = PromptBuilder(self.manifest, self.tokenizer, self.tables)
        self.stage_threads = threads = settings.stage_threads  # worked out once: it reads the cgroup's files

        def load_codec() -> CodecDecoder:
            if self.runtimes.codec == "ggml":
                from qwen3_tts_gguf.ggml.streaming_codec import GgmlCodecError

                try:
                    return self._load_ggml_codec(threads.codec)
                except GgmlCodecError:
                    if settings.codec_runtime != "auto":
                        raise
                    self.runtimes = replace(self.runtimes, codec="onnxruntime",
                                            why=self.runtimes.why + "; the codec on ONNX Runtime: its file predates "
                                                                    "the ggml codec (convert again)")
            return CodecDecoder(self.folder / CODEC_FILE, threads=threads.codec, device=settings.device,
                                runtime=self.runtimes.codec, lanes=threads.codec_lanes)

        def graph_error(e: Exception) -> ModelFolderError:
            return ModelFolderError(f"{self.folder}: cannot load the ONNX graphs ({e})")

        # The codec on OpenVINO goes first: importing it maps its whole cached blob before the pages go
        # back (openvino_session.py), a peak lowest with nothing else loaded yet.
        try:
            early_codec = load_codec() if self.runtimes.codec == "openvino" else None
        except Exception as e:  # the runtimes raise their own exception types for corrupt graphs
            raise graph_error(e) from e
        try:
            self.talker = Talker(self.folder / TALKER_FILE, talker_settings(settings, self.manifest.quant, threads))
        except TalkerError as e:  # a talker file llama.cpp refuses, or a context it cannot make
            raise ModelFolderError(f"{self.folder}: {e}") from e
        self.codec_overlap = settings.overlaps_codec
        try:
            if self.runtimes.predictor == "ggml":
                self.predictor = self._load_ggml_predictor(threads.predictor)
            else:
                self.predictor = CodePredictor(self.folder / self.predictor_file, threads=threads.predictor,
                                               device=settings.device)
            self.codec = early_codec or load_codec()
        except Exception as e:
            self.close()
            raise graph_error(e) from e
        release_freed_heap()

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def predictor_file(self) -> str:
        return predictor_file(self.manifest, self.settings.device)

    @property
    def sample_rate(self) -> int:
        return int(self.manifest.codec["sample_rate"])

    def _ggml_backend(self, threads: int):
        """The ggml backend both ggml stages share: the talker's first GPU (the CPU without one), and its locks."""
        from qwen3_tts_gguf.ggml.graph import Backend
        from qwen3_tts_gguf.host.locks import talker_device_locks

        locks = talker_device_locks(self.settings.gpu_layers)
        if getattr(self, "ggml_backend", None) is None:
            self.ggml_backend = Backend(locks[0].name if locks else None, threads=threads)
        return self.ggml_backend, locks

    def _load_ggml_codec(self, threads: int):
        """The streaming codec on the project's ggml graphs."""
        from qwen3_tts_gguf.ggml.streaming_codec import GgmlCodec

        backend, locks = self._ggml_backend(threads)
        return GgmlCodec(self.folder / CODEC_FILE, backend, device_locks=locks)

    def _load_ggml_predictor(self, threads: int):
        """The batched code predictor on the project's ggml graphs (the llama stages file's weights)."""
        from qwen3_tts_gguf.ggml.batched_predictor import GgmlCodePredictor

        backend, locks = self._ggml_backend(threads)
        return GgmlCodePredictor(self.folder / LLAMA_STAGES_FILE, backend, device_locks=locks,
                                 temperature=float((self.manifest.llama_stages or {}).get("temperature", 1.0)))

    def close(self) -> None:
        self.talker.close()
        if getattr(self, "ggml_backend", None) is not None:
            for stage in (getattr(self, "codec", None), getattr(self, "predictor", None)):
                if getattr(stage, "runtime", None) == "ggml":
                    stage.close()
            self.ggml_backend.close()
            self.ggml_backend = None
