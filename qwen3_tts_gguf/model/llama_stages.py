"""The code predictor and the codec on llama.cpp's own Qwen3-TTS graphs (libmtmd's `code_gen` and
`code2wav`, bound by llama-cpp-python's `mtmd_cpp`), behind the same interfaces as the ONNX Runtime
sessions (`predictor.CodePredictor.predict`, `codec.CodecDecoder.decode`), so the engine does not know
which runtime runs a stage (`--cp-runtime`, `--codec-runtime`; docs/gpu.md).

What the library does, and what follows here (measured: docs/gpu.md, *llama.cpp stages*):
- one call is one stream: `code_gen` takes one frame's codebook 0 and talker hidden state and returns
  its 16 codes and the next talker input row, sampling on the device; `code2wav` decodes 1-72 frames.
  Streams are served one call after another (no batching across streams), in the engine's order.
- the context keeps one random generator and reseeds it only when a call's seed differs from the
  previous call's: each frame's seed is drawn from its stream's own generator, so a stream's codes
  depend on its seed alone, never on the streams beside it (a seed equal to the previous call's, as
  when two streams of one seed step side by side, first takes a throwaway call to reseed). The graph
  samples at temperature 1: the conversion bakes the model's code-predictor temperature into the file
  (`manifest.llama_stages["temperature"]`); greedy decoding is unaffected.
- `code2wav` always computes a 72-frame window (padded with code 0) and its state is the state after
  the whole window: a stream keeps the state of its last full window and the frames since, and each
  call decodes those again (causal: the same samples), so chunked audio equals one whole decode.
  On a CPU a call costs a whole window (seconds): `auto` never picks it there.
- one context serves both stages of a model, one call at a time (its buffers are overwritten by the
  next call); on a GPU the device's lock is held too (`runtime/locks.py`), as the talker's decodes do.
- the library aborts the process on a call of more than 72 frames or of fewer than 16 codes, on a
  code outside its table, and on a hidden state that is not finite (NaN logits, then an out-of-range
  gather): all are refused here before the call (ValueError, which ends that stream alone). What the
  weights could do (an f16 matrix whose input overflows) the converter prevents: such matrices stay F32
  (`convert/precision/activation_ranges.py`; a file written before: `Manifest.llama_stages_missing`).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.model.predictor import NUM_STEPS, PredictorOutput
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.runtime.cpus import import_llama, quiet_llama_logs
from qwen3_tts_gguf.runtime.locks import DeviceLock, hold_devices

WINDOW = 72
"""Frames of one `code2wav` call (hard-coded in llama.cpp's graph)."""
CODES_PER_FRAME = 16
CODEBOOK_SIZE = 2048
"""Codes per codebook of every published checkpoint (the codec's tables and the code predictor's heads)."""
SAMPLES_PER_FRAME = 1920
UINT32_MAX = 0xFFFFFFFF
_MTMD_LOG_CALLBACK = None  # the library keeps a raw pointer: the ctypes callback must stay alive


class LlamaStagesError(RuntimeError):
    """The llama stages file could not be loaded, or a call failed."""


def _mtmd():
    import_llama()  # llama.cpp loaded the project's way first (OpenMP waits)
    from llama_cpp import mtmd_cpp

    return mtmd_cpp


def _quiet_mtmd_logs(mtmd) -> None:
    global _MTMD_LOG_CALLBACK
    quiet_llama_logs()
    if _MTMD_LOG_CALLBACK is None:
        llama_cpp = import_llama()
        _MTMD_LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
        mtmd.mtmd_log_set(_MTMD_LOG_CALLBACK, ctypes.c_void_p(0))
        mtmd.mtmd_helper_log_set(_MTMD_LOG_CALLBACK, ctypes.c_void_p(0))


class LlamaStages:
    """One libmtmd context on a model folder's llama stages file: `code_gen` and `code2wav`, one
    call at a time. `device_locks`: the GPU devices it runs on (none on the CPU)."""

    def __init__(self, path: str | Path, *, threads: int, use_gpu: bool = False,
                 device_locks: Sequence[DeviceLock] = ()):
        mtmd = self._mtmd = _mtmd()
        _quiet_mtmd_logs(mtmd)
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.warmup = False
        params.print_timings = False
        self.path = Path(path)
        self._ctx = mtmd.mtmd_init_from_file(os.fsencode(self.path), None, params)
        if not self._ctx:
            raise LlamaStagesError(f"llama.cpp cannot load {self.path.name} (a llama stages file of another "
                                   "layout, or damaged: convert --only-llama-stages writes it again)")
        info = mtmd.mtmd_gen_audio_get_info(self._ctx)
        if info.type != mtmd.MTMD_GEN_AUDIO_TYPE_QWEN3TTS:
            self.close()
            raise LlamaStagesError(f"{self.path.name} holds no Qwen3-TTS generation graphs")
        self.sample_rate = int(info.sample_rate)
        self.use_gpu = use_gpu
        self._lock = threading.Lock()
        self._device_locks = tuple(device_locks)
        self._last_seed: int | None = None

    def close(self) -> None:
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None

    def _call(self, inp, hidden_size: int = 0) -> tuple[np.ndarray, np.ndarray | bytes]:
        out = self._mtmd.mtmd_gen_out()
        code = inp.type == self._mtmd.MTMD_GEN_PROCESS_TYPE_GEN_CODE
        with self._lock, hold_devices(self._device_locks):
            if not self._ctx:
                raise LlamaStagesError("the llama stages are closed")
            # the context reseeds only when the seed changes: a frame whose seed equals the previous
            # call's (two streams of one seed side by side) first reseeds it with a throwaway call, and
            # a decode, which draws nothing, keeps the previous seed so as not to reseed
            if code and inp.seed == self._last_seed:
                seed, inp.seed = inp.seed, inp.seed ^ 1
                self._mtmd.mtmd_gen_audio_process(self._ctx, ctypes.byref(inp), ctypes.byref(out))
                inp.seed = seed
            elif not code:
                inp.seed = UINT32_MAX if self._last_seed is None else self._last_seed
            rc = self._mtmd.mtmd_gen_audio_process(self._ctx, ctypes.byref(inp), ctypes.byref(out))
            self._last_seed = inp.seed
            if rc != 0:
                raise LlamaStagesError(f"llama.cpp's Qwen3-TTS graph failed (code {rc})")
            # copied before the next call overwrites the context's buffers
            if code:
                codes = np.ctypeslib.as_array(out.codes, shape=(out.n_codes,)).astype(np.int64)
                return codes, np.ctypeslib.as_array(out.embd, shape=(hidden_size,)).copy()
            wav = np.ctypeslib.as_array(out.audio, shape=(out.n_samples,)).copy()
            return wav, ctypes.string_at(out.state_data, out.state_size)

    def gen_code(self, hidden: np.ndarray, code0: int, *, top_k: int, top_p: float, seed: int
                 ) -> tuple[np.ndarray, np.ndarray]:
        """One frame: its 16 codes (codebook 0 first) and the talker input row it makes. ValueError
        for a hidden state that is not finite or a code0 outside [0, CODEBOOK_SIZE)."""
        hidden = np.ascontiguousarray(hidden, np.float32).reshape(-1)
        if not np.isfinite(hidden).all():
            raise ValueError("the talker's hidden state is not finite")
        if not 0 <= code0 < CODEBOOK_SIZE:
            raise ValueError(f"code0 must be in [0, {CODEBOOK_SIZE}), got {code0}")
        inp = self._mtmd.mtmd_gen_inp_default(self._ctx)
        inp.type = self._mtmd.MTMD_GEN_PROCESS_TYPE_GEN_CODE
        inp.code0 = int(code0)
        inp.embd = hidden.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        inp.top_k, inp.top_p, inp.seed = int(top_k), float(top_p), int(seed) & UINT32_MAX
        if inp.seed == UINT32_MAX:  # the library's "random": never asked for here
            inp.seed -= 1
        return self._call(inp, hidden.size)

    def gen_wav(self, codes: np.ndarray, state: bytes | None) -> tuple[np.ndarray, bytes]:
        """`codes` [1-72, 16] decoded after `state` (None: a fresh stream): their samples, and the state
        after a whole window (the frames, then code 0 up to 72)."""
        codes = np.ascontiguousarray(codes, np.int32)
        if codes.ndim != 2 or codes.shape[1] != CODES_PER_FRAME or not 1 <= codes.shape[0] <= WINDOW:
            raise ValueError(f"codes must be [1-{WINDOW}, {CODES_PER_FRAME}], got {list(codes.shape)}")
        if codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
            raise ValueError(f"codes must be in [0, {CODEBOOK_SIZE}), got {int(codes.min())}..{int(codes.max())}")
        inp = self._mtmd.mtmd_gen_inp_default(self._ctx)
        inp.type = self._mtmd.MTMD_GEN_PROCESS_TYPE_GEN_WAV
        inp.codes = codes.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        inp.n_codes = codes.size
        buffer = None
        if state is not None:
            buffer = ctypes.create_string_buffer(state, len(state))
            inp.state_data = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_char))
            inp.state_size = len(state)
        wav, new_state = self._call(inp)
        del buffer
        return wav[:codes.shape[0] * SAMPLES_PER_FRAME], new_state


class LlamaCodePredictor:
    """`CodePredictor.predict` on llama.cpp's `code_gen`: one call per frame, in row order."""

    def __init__(self, stages: LlamaStages, hidden_size: int, codebook_size: int = CODEBOOK_SIZE):
        self.stages = stages
        self.hidden_size = hidden_size
        self.codebook_size = codebook_size

    def predict(self, hidden: np.ndarray, code0: np.ndarray, params: SamplingParams | Sequence[SamplingParams],
                rngs: Sequence[np.random.Generator] | None = None, rand: np.ndarray | None = None) -> PredictorOutput:
        """As `CodePredictor.predict`. Randomness: one seed per row drawn from its generator in `rngs`
        (`rand`, ONNX Runtime's uniform draws, has no meaning here: refused)."""
        hidden = np.ascontiguousarray(hidden, np.float32)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(f"hidden must be [B, {self.hidden_size}], got {list(hidden.shape)}")
        batch = hidden.shape[0]
        code0 = np.asarray(code0, np.int64).reshape(batch)
        if rand is not None:
            raise ValueError("the llama.cpp code predictor draws its own numbers: pass rngs, not rand")
        params = [params] * batch if isinstance(params, SamplingParams) else list(params)
        if len(params) != batch or (rngs is not None and len(rngs) != batch):
            raise ValueError("one sampling setting and one generator per row")
        codes = np.empty((batch, NUM_STEPS), np.int64)
        rows = np.empty((batch, self.hidden_size), np.float32)
        for i, p in enumerate(params):
            greedy = p.greedy or p.top_k == 1
            if not greedy and rngs is None:
                raise ValueError("sampling needs a generator per row")
            seed = 0 if greedy else int(rngs[i].integers(0, UINT32_MAX))
            frame, rows[i] = self.stages.gen_code(hidden[i], int(code0[i]), top_k=1 if greedy else p.top_k,
                                                  top_p=1.0 if greedy else p.top_p, seed=seed)
            codes[i] = frame[1:]
        if codes.min() < 0 or codes.max() >= self.codebook_size:
            raise ValueError(f"code_gen made a code outside [0, {self.codebook_size})")
        return PredictorOutput(codes, rows)


@dataclass(frozen=True)
class LlamaCodecState:
    """One stream's codec state: the state after its last whole window, and the frames since."""

    committed: bytes | None = None
    window: np.ndarray = field(default_factory=lambda: np.zeros((0, CODES_PER_FRAME), np.int32))


class LlamaCodec:
    """`CodecDecoder.decode` on llama.cpp's `code2wav`, one stream at a time."""

    samples_per_frame = SAMPLES_PER_FRAME
    num_quantizers = CODES_PER_FRAME
    runtime = "llama"
    max_call_frames = WINDOW  # every call costs a whole window: a seeded stream's grid (chunking.py) need not cut

    def __init__(self, stages: LlamaStages, codebook_size: int = CODEBOOK_SIZE):
        self.stages = stages
        self.sample_rate = stages.sample_rate
        self.codebook_size = codebook_size

    def new_state(self, batch: int = 1) -> LlamaCodecState:
        if batch != 1:
            raise ValueError("the llama.cpp codec decodes one stream a call")
        return LlamaCodecState()

    def decode(self, codes: np.ndarray, state: LlamaCodecState | None = None) -> tuple[np.ndarray, LlamaCodecState]:
        """N new frames [N, 16] of one stream: their samples [N*1920] and the new state (the given one
        is not modified). Negative codes (padding) count as 0, as in the official wrapper."""
        codes = np.asarray(codes)
        if codes.ndim == 3 and codes.shape[0] == 1:
            wav, state = self.decode(codes[0], state)
            return wav[None], state
        if codes.ndim != 2 or codes.shape[1] != CODES_PER_FRAME or codes.shape[0] < 1:
            raise ValueError(f"codes must be [N>=1, {CODES_PER_FRAME}] (one stream), got {list(codes.shape)}")
        if codes.max() >= self.codebook_size:
            raise ValueError(f"codes must be < {self.codebook_size}, got {int(codes.max())}")
        state = state or LlamaCodecState()
        frames = np.concatenate([state.window, np.maximum(codes, 0).astype(np.int32)])
        said, committed, parts = len(state.window), state.committed, []
        while len(frames) >= WINDOW:  # whole windows: their state is the next window's start
            wav, committed = self.stages.gen_wav(frames[:WINDOW], committed)
            parts.append(wav[said * SAMPLES_PER_FRAME:])
            frames, said = frames[WINDOW:], 0
        if len(frames) > said:  # the rest: decoded again from the last whole window, the new frames kept
            wav, _ = self.stages.gen_wav(frames, committed)
            parts.append(wav[said * SAMPLES_PER_FRAME:])
        wav = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return wav.astype(np.float32, copy=False), LlamaCodecState(committed, frames)

    def decode_all(self, codes: np.ndarray) -> np.ndarray:
        wav, _ = self.decode(codes)
        return wav
