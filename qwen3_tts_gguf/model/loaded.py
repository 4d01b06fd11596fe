"""A converted model folder opened for inference: manifest, tokenizer, tables, talker, graphs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from qwen3_tts_gguf.host.cpus import StageThreads
from qwen3_tts_gguf.host.heap import map_large_blocks, release_freed_heap
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
from qwen3_tts_gguf.model.settings import EngineSettings
from qwen3_tts_gguf.model.stage_runtimes import StageRuntimeError, StageRuntimes, resolve
from qwen3_tts_gguf.model.tokenizer import TextTokenizer


def talker_settings(settings: EngineSettings, quant: str, threads: StageThreads | None = None,
                    activations: dict | None = None):
    """The talker's context settings (talker.TalkerSettings) for an engine with `settings` and a
    talker of quant `quant`; `threads`: `settings.stage_threads` when already worked out; `activations`: the
    folder's measured ranges (manifest.activations)."""
    from qwen3_tts_gguf.model.talker import TalkerSettings, repack_pays

    threads = threads or settings.stage_threads
    return TalkerSettings(
        n_ctx=settings.kv_cells, max_streams=settings.max_streams, cached_prefixes=settings.prefix_cache,
        # one row gets every core until a codec call runs beside it (the engine sets it per decode)
        threads=threads.talker_batch, batch_threads=threads.talker_batch, kv_cache=settings.kv_cache,
        gpu_layers=settings.gpu_layers, deterministic=settings.deterministic,
        repack=repack_pays(quant, deterministic=settings.deterministic, gpu_layers=settings.gpu_layers),
        activations=activations)


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
            self.talker = Talker(self.folder / TALKER_FILE, talker_settings(settings, self.manifest.quant, threads,
                                                                                self.manifest.activations))
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
