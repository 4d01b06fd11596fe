"""The talker LM through llama-cpp-python's low-level API: embeddings in, logits + hidden out.

Each stream is one sequence of a single llama.cpp context (unified KV cache), so one
`llama_decode` steps every active stream together. `llama_get_embeddings_ith` returns the hidden
state after the final RMSNorm, which is exactly what the code predictor consumes.

CPU note: the default (-march=native) build repacks q8_0 weights into AMX buffers and then crashes
on any batch of more than one token (shared/docs/runtime-notes.md §2.4). Every prefill and every
multi-stream step is such a batch, so the extra buffer types (llama.cpp's weight repacking) are
off unless `TalkerSettings.repack` asks for them, which `repack_pays` allows only on a CPU known
to have no AMX and for a quant whose repacked kernels measured faster.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.host.cpus import default_threads, import_llama, quiet_llama_logs

log = logging.getLogger("qwen3_tts_gguf.model.talker")

# Talker quants whose repacked CPU kernels are faster (0.6B, 2 AVX-512 cores, ms per decode:
# q4_k_m one row 13.4 -> 11.3, 4 streams 43.5 -> 33.9, 8 streams 67.8 -> 58.4; q8_0 none: this llama.cpp
# repacks q8_0 only on ARM and RISC-V). iq4_nl (2026-12-02, 5 alternating rounds): one row 21.4 -> 13.2,
# 8 streams 93.2 -> 58.4, 24-row prefill 199 -> 119; repacked, its prefill and batched
# steps are the fastest of the 4-bit formats (q4_k_m repacked: 14.2, 79.1, 166); in a portable AVX2
# build both decode alike (13.6 / 13.6, 73.8 / 76.5, 164 / 164). Unrepacked (a CPU with AMX) it is the
# slowest of them.
REPACK_QUANTS = ("q4_k_m", "iq4_nl")
# The default q8_0 is bound by instructions, not by memory, on x86: its kernels (256-bit VNNI after a
# sign trick, a scale per 32 weights) take a one-row step 21-26 ms (its weights at about 20 GB/s) and
# rows of one decode barely share work (0.6B, 2 threads, alone: 1 / 8 / 25 rows 21 / 83 / 222 ms). bf16
# (the published checkpoints' own weights; AVX-512 BF16 kernels) shares them better (32 / 67 / 133 ms) but
# reads twice the bytes per step: side by side in the engine (`bench.experiments talker-quants`,
# 2026-12-03 06:25) prefill 220 -> 183 ms, step 36 -> 47 ms, one stream's RTF 1.72 -> 1.89, eight
# streams 1.18 -> 1.10, peak 1934 -> 2352 MiB, logits 0.3 % from f16's (q8_0 1.8 %): no preset takes it.


def cpu_has_amx() -> bool | None:
    """Whether this CPU has AMX tiles (Linux /proc/cpuinfo); None where that cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return None


def repack_pays(quant: str, *, deterministic: bool = False, gpu_layers: int = 0) -> bool:
    """Whether to let llama.cpp repack the talker's weights: a K-quant it speeds up, on a CPU that
    is known to lack AMX (the AMX q8_0 crash), never in the parity profile or with offloading."""
    return not deterministic and not gpu_layers and quant in REPACK_QUANTS and cpu_has_amx() is False


KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
"""KV cache precisions of the fast profile. q8_0 halves the cache (112 -> 60 KiB per cell for the 0.6B
talker), q4_0 quarters it (32 KiB) for memory-tight servers; their agreement with f16 is in
docs/benchmarks.md. The deterministic profile uses f32."""
# precision -> (llama.cpp's ggml type, bytes per value, flash attention: a quantized V cache needs it;
# the parity profile keeps it off; f16 leaves llama.cpp's choice)
_KV_LAYOUT = {"f32": ("GGML_TYPE_F32", 4.0, "LLAMA_FLASH_ATTN_TYPE_DISABLED"),
              "f16": ("GGML_TYPE_F16", 2.0, "LLAMA_FLASH_ATTN_TYPE_AUTO"),
              "q8_0": ("GGML_TYPE_Q8_0", 34 / 32, "LLAMA_FLASH_ATTN_TYPE_ENABLED"),  # 32 int8 + an f16 scale
              "q4_0": ("GGML_TYPE_Q4_0", 18 / 32, "LLAMA_FLASH_ATTN_TYPE_ENABLED")}  # 32 4-bit + an f16 scale


KV_BLOCK = 32  # values per q8_0 / q4_0 block: a quantized cache needs head dimensions that are multiples of it


def kv_cache_for(asked: str, head_dim: int, measured: Mapping | None = None) -> str:
    """The KV cache precision to use: `asked`, or f16 when the heads cannot be cut into q8_0 blocks
    (the tiny test shapes; every published Qwen3-TTS talker has 128-wide heads). `measured`: the model
    folder's `activations` (convert/precision/activation_ranges.py): where what the talker's layers cache
    passes what f16 holds, f32 (an f16 cache, and the f16 scales and GPU kernels of 8-bit blocks, would
    overflow); where one value towers over its row (8-bit blocks would round the rest to zero), f16."""
    if asked not in KV_CACHE_TYPES:
        raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHE_TYPES)}, got {asked!r}")
    kind = asked
    if kind != "f16" and head_dim % KV_BLOCK:
        log.info("talker heads are %d wide, not a multiple of %d: KV cache f16 instead of %s", head_dim, KV_BLOCK,
                 kind)
        kind = "f16"
    cached = (measured or {}).get("talker_kv_cache")
    if cached:
        peak, ratio = cached["peak"], cached["peak_to_median"]
        if peak > measured["f16_limit"]:
            log.info("the talker caches values up to %.3g, past f16's range: KV cache f32 instead of %s", peak, kind)
            return "f32"
        if kind != "f16" and ratio > measured["int8_peak_to_median_limit"]:
            log.info("the talker caches a value %.3g times its row's median: KV cache f16 instead of %s", ratio, kind)
            return "f16"
    return kind


@dataclass(frozen=True)
class TalkerSettings:
    """How the talker context is created.

    deterministic: F32 KV cache, flash attention off, one KV buffer per stream and one llama_decode
    per stream — the profile in which outputs equal the official implementation to float tolerance
    and a stream's numbers do not depend on which other streams run with it. (In one shared buffer,
    attention sums run over every stream's cells; and a matmul's kernel depends on its row count:
    both change the last bits.)
    """

    n_ctx: int = 8192
    max_streams: int = 8
    cached_prefixes: int = 0  # >0: the engine caches prompt prefixes (saved states): one scratch sequence for them
    n_batch: int = 512
    threads: int = 0  # 0: all cores; a decode of one row
    batch_threads: int = 0  # a decode of several rows (prefills, several streams); 0: as `threads`
    gpu_layers: int = 0  # >0 offloads layers on a CUDA/Vulkan build of llama-cpp-python; -1: all (devices.py)
    deterministic: bool = False
    repack: bool = False  # llama.cpp's extra buffer types (weight repacking); see `repack_pays`
    kv_cache: str = "q8_0"  # KV_CACHE_TYPES; the deterministic profile always uses f32
    # the model folder's measured ranges (manifest.activations), which bound the KV cache's precision (kv_cache_for)
    activations: dict | None = field(default=None, hash=False, compare=False)


@dataclass(frozen=True)
class DecodeItem:
    """Rows [n, H] to append to stream `seq` starting at position `pos`."""

    seq: int
    pos: int
    rows: np.ndarray


class TalkerError(RuntimeError):
    """llama.cpp refused a model or a decode."""


class Talker:
    """A loaded talker GGUF and one llama.cpp context shared by up to `max_streams` streams."""

    def __init__(self, gguf_path: str | Path, settings: TalkerSettings = TalkerSettings()):
        L = import_llama()

        quiet_llama_logs()
        self._L = L
        self.settings = settings
        if settings.gpu_layers:
            from qwen3_tts_gguf.host.devices import DeviceError, check_gpu_layers

            try:  # llama.cpp itself would put every layer on the CPU without a word
                check_gpu_layers(settings.gpu_layers)
            except DeviceError as e:
                raise TalkerError(str(e)) from e
        from qwen3_tts_gguf.host.locks import talker_device_locks

        # one lock per GPU device for every model in the process (locks.DeviceLock); none on the CPU
        self._device_locks = talker_device_locks(settings.gpu_layers)
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = settings.gpu_layers
        mp.use_extra_bufts = settings.repack  # off by default: the AMX/q8_0 crash, see the module docstring
        if settings.repack:
            # repacking copies the weights into llama.cpp's own buffers; a mapped file would keep a second,
            # file-backed copy of them resident (0.6B q4_k_m: about 200 MiB), so read the file instead
            mp.load_mode = L.LLAMA_LOAD_MODE_NONE
        self._model = L.llama_model_load_from_file(str(gguf_path).encode(), mp)
        if not self._model:
            raise TalkerError(f"llama.cpp could not load the talker {gguf_path}")
        self.hidden_size = L.llama_model_n_embd(self._model)
        self.vocab_size = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self._model))
        cp = L.llama_context_default_params()
        cp.n_ctx = settings.n_ctx
        cp.n_batch = cp.n_ubatch = settings.n_batch
        cp.n_seq_max = settings.max_streams + self.prefix_slots(settings)
        # one pool of cells for all streams (needed for sequence copies), except in the deterministic
        # profile, where each stream gets n_ctx / max_streams cells of its own
        cp.kv_unified = not settings.deterministic
        cp.n_threads = default_threads(settings.threads)
        cp.n_threads_batch = default_threads(settings.batch_threads or settings.threads)
        cp.embeddings = True
        # no GPU layers asked: the talker stays on the CPU even on a GPU build (llama.cpp would otherwise
        # move large batches' matmuls to the GPU by itself)
        cp.op_offload = bool(settings.gpu_layers)
        cp.pooling_type = L.LLAMA_POOLING_TYPE_NONE
        self._set_kv_cache(cp, "f32" if settings.deterministic else kv_cache_for(settings.kv_cache, self._head_dim(),
                                                                               settings.activations))
        self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx and self.kv_cache not in ("f16", "f32"):
            # a GPU backend without flash attention for a quantized cache: f16 rather than no talker
            log.warning("llama.cpp refused a %s KV cache here; using f16", self.kv_cache)
            self._set_kv_cache(cp, "f16")
            self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            L.llama_model_free(self._model)
            self._model = None  # (close() must not free it again)
            raise TalkerError(f"llama.cpp could not create a context for the talker ({cp.n_ctx} KV cells, "
                              f"{cp.n_seq_max} sequences): too little memory for that many cells (--n-ctx)?")
        self._mem = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(settings.n_batch, self.hidden_size, settings.max_streams)
        self._step_threads, self._batch_threads = cp.n_threads, cp.n_threads_batch

    @property
    def thread_invariant(self) -> bool:
        """Whether a decode's numbers are the same on any number of threads, so that `set_step_threads` changes
        only its speed. Measured on the CPU (0.6B shape, one-row steps, 2026-12-05): with a q8_0 KV cache the
        logits are equal on 1 to 32 threads after a 40-row prompt and on 1 to 4 after 2000 rows, with q4_0 on 1
        to 16 after 700; with an f16 cache they differ between 1 and 2 threads (up to 0.5) from a 300-row prompt
        on (after 200 rows they are equal): llama.cpp then seems to share a row's cells out among the threads."""
        return self.kv_cache in ("q8_0", "q4_0")

    def set_step_threads(self, threads: int) -> None:
        """Threads for the next decodes of one row (llama.cpp keeps the count until it is changed)."""
        if threads != self._step_threads:
            self._L.llama_set_n_threads(self._ctx, threads, self._batch_threads)
            self._step_threads = threads

    def _set_kv_cache(self, cp, kind: str) -> None:
        """Context parameters for a KV cache of precision `kind` (_KV_LAYOUT)."""
        ggml_type, _, flash = _KV_LAYOUT[kind]
        self.kv_cache = kind
        cp.type_k = cp.type_v = getattr(self._L, ggml_type)
        cp.flash_attn_type = getattr(self._L, flash)

    @property
    def kv_cache_bytes(self) -> int:
        """Size of the KV cache llama.cpp allocated for this context (K and V, every layer, n_ctx cells)."""
        L = self._L
        per_value = _KV_LAYOUT[self.kv_cache][1]
        values = (self.settings.n_ctx * L.llama_model_n_layer(self._model) * 2
                  * L.llama_model_n_head_kv(self._model) * self._head_dim())
        return int(values * per_value)

    def _head_dim(self) -> int:
        L, buf = self._L, ctypes.create_string_buffer(128)

        def meta(key: str) -> str | None:
            n = L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
            return buf.value.decode() if n >= 0 else None

        arch = meta("general.architecture") or ""
        key_length = meta(f"{arch}.attention.key_length")
        return int(key_length) if key_length else self.hidden_size // L.llama_model_n_head(self._model)

    # -- decoding --------------------------------------------------------------------------
    def decode(self, items: list[DecodeItem]) -> tuple[np.ndarray, np.ndarray]:
        """Append each item's rows to its stream; returns (logits [k, V], hidden [k, H]) of each
        item's last row, in item order. Rows of all items share llama_decode calls."""
        batch, cap = self._batch, self.settings.n_batch
        logits = np.empty((len(items), self.vocab_size), np.float32)
        hidden = np.empty((len(items), self.hidden_size), np.float32)
        pending: list[tuple[int, int]] = []  # (item index, index within the current batch)
        n = 0
        for k, item in enumerate(items):
            rows = np.ascontiguousarray(item.rows, dtype=np.float32)
            if rows.ndim != 2 or rows.shape[1] != self.hidden_size or len(rows) == 0:
                raise ValueError(f"rows must be [n>0, {self.hidden_size}], got {rows.shape}")
            if n and self.settings.deterministic:
                # a matmul's kernel (and rounding) depends on how many rows it gets: in the parity
                # profile each stream decodes on its own, so its numbers never depend on the others
                self._run(n, pending, logits, hidden)
                pending, n = [], 0
            for r in range(len(rows)):
                if n == cap:
                    self._run(n, pending, logits, hidden)
                    pending, n = [], 0
                ctypes.memmove(ctypes.addressof(batch.embd.contents) + n * self.hidden_size * 4,
                               rows[r].ctypes.data, self.hidden_size * 4)
                batch.pos[n] = item.pos + r
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = item.seq
                last = r == len(rows) - 1
                batch.logits[n] = last  # only the last row's outputs are read: llama.cpp skips the rest
                if last:
                    pending.append((k, n))
                n += 1
        if n:
            self._run(n, pending, logits, hidden)
        return logits, hidden

    def decode_steps(self, seq: int, rows: np.ndarray, n_prefill: int) -> tuple[np.ndarray, np.ndarray]:
        """Teacher forcing (tests, benchmarks): rows[:n_prefill] in one decode, then one decode per
        later row, into sequence `seq` from position 0. Returns logits [k, V] and hidden [k, H]
        after the prefill and after each step (k = len(rows) - n_prefill + 1)."""
        logits, hidden = self.decode([DecodeItem(seq, 0, rows[:n_prefill])])
        out_l, out_h = [logits[0]], [hidden[0]]
        for i in range(n_prefill, len(rows)):
            logits, hidden = self.decode([DecodeItem(seq, i, rows[i:i + 1])])
            out_l.append(logits[0])
            out_h.append(hidden[0])
        return np.stack(out_l), np.stack(out_h)

    def _run(self, n: int, pending, logits: np.ndarray, hidden: np.ndarray) -> None:
        with self._devices():  # decode and the read-back (which waits for the device)
            self._run_unlocked(n, pending, logits, hidden)

    def _run_unlocked(self, n: int, pending, logits: np.ndarray, hidden: np.ndarray) -> None:
        L = self._L
        self._batch.n_tokens = n
        rc = L.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise TalkerError(f"llama_decode failed with code {rc} (context full? n_ctx={self.settings.n_ctx})")
        for k, i in pending:
            logits[k] = np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, i), shape=(self.vocab_size,))
            hidden[k] = np.ctypeslib.as_array(L.llama_get_embeddings_ith(self._ctx, i), shape=(self.hidden_size,))

    # -- stream memory ---------------------------------------------------------------------
    def drop(self, seq: int) -> None:
        """Free every cell of stream `seq`."""
        self._L.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def truncate(self, seq: int, pos: int) -> None:
        """Forget positions >= pos of stream `seq`."""
        self._L.llama_memory_seq_rm(self._mem, seq, pos, -1)

    @staticmethod
    def prefix_slots(settings: TalkerSettings) -> int:
        """Extra sequences for the prefix cache: one scratch sequence its states are saved from (fast
        profile only; the parity profile caches none)."""
        return 0 if settings.deterministic or not settings.cached_prefixes else 1

    def save(self, seq: int) -> bytes:
        """Every KV row of stream `seq` (positions, keys, values) as bytes; `load` puts them back bit for bit."""
        L = self._L
        size = L.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        with self._devices():
            if L.llama_state_seq_get_data(self._ctx, buf, size, seq) != size:
                raise TalkerError(f"llama.cpp could not save the KV rows of sequence {seq}")
        return bytes(buf)

    def load(self, seq: int, state: bytes) -> None:
        """Stream `seq` gets the KV rows of a `save`d state, in the lowest run of free cells that holds them
        (as a prefill of those rows would place them); TalkerError, and `seq` empty, when none does."""
        src = ctypes.cast(ctypes.c_char_p(state), ctypes.POINTER(ctypes.c_uint8))  # (no copy; read only)
        with self._devices():
            loaded = self._L.llama_state_seq_set_data(self._ctx, src, len(state), seq)
        if not loaded:
            self.drop(seq)
            raise TalkerError(f"llama.cpp could not load saved KV rows into sequence {seq}")

    def _devices(self):
        """Held around a call that runs the model or touches the KV cache's memory: this talker's GPU devices
        (none on a CPU)."""
        from qwen3_tts_gguf.host.locks import hold_devices

        return hold_devices(self._device_locks)

    def copy(self, src: int, dst: int, end: int = -1) -> None:
        """Share positions [0, end) of stream `src` with stream `dst` (a cached prefix)."""
        self._L.llama_memory_seq_cp(self._mem, src, dst, 0, end)

    def length(self, seq: int) -> int:
        """Number of positions stored for `seq` (0 when empty)."""
        return int(self._L.llama_memory_seq_pos_max(self._mem, seq)) + 1

    @property
    def cells_per_stream(self) -> int:
        """KV cells one stream can use (all of n_ctx when the cache is shared)."""
        s = self.settings
        return s.n_ctx if not s.deterministic else s.n_ctx // s.max_streams

    def clear(self) -> None:
        self._L.llama_memory_clear(self._mem, True)

    def close(self) -> None:
        L = self._L
        if getattr(self, "_batch", None) is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
