"""Streaming codec decoding at run time: codes -> 24 kHz waveform through the stateful ONNX graph.

The graph (built by `convert.codec_graph`) carries every bit of history as explicit state tensors,
so decoding frames in any chunking gives the whole-utterance waveform. A `CodecState` holds those
tensors for a batch of streams; `stack_states` / `split_states` move streams in and out of a batch
so the engine can decode several streams in one call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.model.onnx_session import make_session

MAX_CALL_FRAMES = 4
"""Frames (streams x frames) one ONNX Runtime call decodes at most; longer input is decoded in pieces,
the state carried between them (the same samples up to fp32 rounding). A call's activations take about
20 MiB per frame at fp32, and ms per frame is about flat from 4 frames per call on, slower from 32. Calls
of 4 rather than 8 (0.6B, 2 cores, 2026-12-01): the engine's peak RSS with eight streams 1967 and 1971 ->
1849 and 1861 MiB (KV cache q4_0), with no cost the engine could measure (side by side, one stream's RTF
1.40 -> 1.41, eight streams' 0.84 -> 0.85); a 30 s voice reference (375 frames) primes the decoder in
14.5-15.4 s with a 709 MiB peak, against 13.6-14.0 s and 755-823 MiB in calls of 8 (49.9 s and 3.9 GiB
in one call)."""


@dataclass
class CodecState:
    """Decoder state of B streams: name -> array [B, ...] (`pos` is int64 [B], frames decoded)."""

    tensors: dict[str, np.ndarray]

    @property
    def batch(self) -> int:
        return int(self.tensors["pos"].shape[0])

    @property
    def pos(self) -> np.ndarray:
        return self.tensors["pos"]


def stack_states(states: list[CodecState]) -> CodecState:
    """Concatenate the streams of several states (in order) into one batch."""
    if not states:
        raise ValueError("stack_states needs at least one state")
    return CodecState({k: np.concatenate([s.tensors[k] for s in states]) for k in states[0].tensors})


def split_states(state: CodecState) -> list[CodecState]:
    """One single-stream state per row of a batched state."""
    return [CodecState({k: v[i : i + 1].copy() for k, v in state.tensors.items()}) for i in range(state.batch)]


def checked_codes(codes: np.ndarray, num_quantizers: int, codebook_size: int) -> tuple[np.ndarray, bool]:
    """Codes [B, N, 16] (from [N, 16]: single True) that every codec runtime can take; ValueError otherwise."""
    codes = np.asarray(codes)
    single = codes.ndim == 2
    if single:
        codes = codes[None]
    if codes.ndim != 3 or codes.shape[2] != num_quantizers or codes.shape[1] < 1 or codes.shape[0] < 1:
        raise ValueError(f"codes must be [B, N>=1, {num_quantizers}] or [N, {num_quantizers}], got {list(codes.shape)}")
    if codes.dtype.kind not in "iu":
        raise ValueError(f"codes must be integers, got {codes.dtype}")
    if codes.max() >= codebook_size:
        raise ValueError(f"codes must be < {codebook_size}, got {int(codes.max())}")
    return codes, single


def decode_in_calls(run, codes: np.ndarray, state: CodecState, max_call_frames: int) -> tuple[np.ndarray, CodecState]:
    """codes [B, N, 16] through `run(codes, state) -> (wav, state)` in calls of at most `max_call_frames` frames
    (streams x frames), the state carried: wav [B, N*spf] and the last state."""
    if state.batch != codes.shape[0]:
        raise ValueError(f"codes have {codes.shape[0]} streams but the state has {state.batch}")
    step = max(1, max_call_frames // codes.shape[0])
    parts = []
    for start in range(0, codes.shape[1], step):
        wav, state = run(codes[:, start:start + step], state)
        parts.append(wav)
    return (parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)), state


class CodecDecoder:
    """The codec decoder ONNX graph behind an ONNX Runtime session, or compiled by OpenVINO
    (`runtime="openvino"`: openvino_session.py). `lanes`: calls that may run at once (OpenVINO
    sizes its streams by it; ONNX Runtime sessions take concurrent calls as they are)."""

    def __init__(self, path: str | Path, *, threads: int | None = None, device: str = "cpu",
                 max_call_frames: int = MAX_CALL_FRAMES, runtime: str = "onnxruntime", lanes: int = 1):
        if runtime == "openvino":
            from qwen3_tts_gguf.host.cpus import default_threads
            from qwen3_tts_gguf.model.openvino_session import OpenVINOSession

            self.session = OpenVINOSession(path, threads=default_threads(threads), streams=lanes)
            meta = self.session.metadata
        else:
            self.session = make_session(path, threads=threads, device=device)
            meta = self.session.get_modelmeta().custom_metadata_map
        self.runtime = runtime
        self.max_call_frames = max_call_frames
        self.state_specs: list[tuple[str, tuple[int, ...], np.dtype]] = [
            (d["name"], tuple(d["shape"]), np.dtype(d["dtype"])) for d in json.loads(meta["states"])
        ]
        self.samples_per_frame = int(meta.get("samples_per_frame", 1920))
        self.sample_rate = int(meta.get("sample_rate", 24000))
        self.num_quantizers = int(meta.get("num_quantizers", 16))
        self.codebook_size = int(meta.get("codebook_size", 2048))
        self._outputs = ["wav"] + [f"out_{name}" for name, _, _ in self.state_specs]

    def new_state(self, batch: int = 1) -> CodecState:
        """Zero state for `batch` fresh streams."""
        return CodecState({name: np.zeros((batch, *shape), dtype) for name, shape, dtype in self.state_specs})

    def decode(self, codes: np.ndarray, state: CodecState | None = None) -> tuple[np.ndarray, CodecState]:
        """Decode N new frames per stream (in calls of at most `max_call_frames` frames in all).

        codes: [B, N, 16] (or [N, 16] for one stream) integer codes < codebook_size; negatives
        (padding) count as 0, as in the official wrapper.
        Returns wav float32 [B, N*samples_per_frame] (or [N*samples_per_frame]) and the new state;
        the given state is not modified."""
        codes, single = checked_codes(codes, self.num_quantizers, self.codebook_size)
        state = state if state is not None else self.new_state(codes.shape[0])
        wav, state = decode_in_calls(self._run, codes.astype(np.int64, copy=False), state, self.max_call_frames)
        return (wav[0] if single else wav), state

    def _run(self, codes: np.ndarray, state: CodecState) -> tuple[np.ndarray, CodecState]:
        """One ONNX Runtime call: wav [B, N*samples_per_frame] and the new state."""
        feeds = {"codes": codes, **{f"in_{name}": array for name, array in state.tensors.items()}}
        wav, *new = self.session.run(self._outputs, feeds)
        new_state = CodecState({name: array for (name, _, _), array in zip(self.state_specs, new)})
        return wav.astype(np.float32, copy=False), new_state

    def decode_all(self, codes: np.ndarray) -> np.ndarray:
        """Whole-utterance decode of codes [T, 16] from a fresh state: wav float32 [T*samples_per_frame]."""
        wav, _ = self.decode(codes)
        return wav
