"""The engine-side state of one admitted stream, and the fault that ends one stream alone."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from qwen3_tts_gguf.engine.chunking import ChunkPlan
from qwen3_tts_gguf.engine.request import TalkerSampling
from qwen3_tts_gguf.engine.runaway import RunawayGuard
from qwen3_tts_gguf.engine.stream import Stream
from qwen3_tts_gguf.engine.text_sources import FedText, FixedText
from qwen3_tts_gguf.model.codec import CodecState

REPLAY_ROWS = 20
"""Decode rows kept per stream, newest last: a runaway retry goes back at most the frames not yet
decoded (iteration.MAX_PENDING_FRAMES) and decodes the row before them again."""


class StreamFault(Exception):
    """One stream's work failed: end that stream alone (`stage` names what failed, for its client)."""

    def __init__(self, stage: str):
        super().__init__(stage)
        self.stage = stage


@dataclass(eq=False)
class ActiveStream:
    """Engine-side state of one admitted stream."""

    stream: Stream
    seq: int
    rng: np.random.Generator
    seed: int = 0  # the stream's seed (drawn when the request gave none): a runaway retry's random state comes from it
    guard: RunawayGuard = field(default_factory=lambda: RunawayGuard("off", 0))
    talker_sampling: TalkerSampling | None = None  # codebook 0's sampling, when not the request's (a greedy retry)
    recent_rows: deque = field(default_factory=lambda: deque(maxlen=REPLAY_ROWS))  # (segment frame, pos, row)
    segment_frames: int = 0
    pos: int = 0  # next talker position
    reserved: int = 0  # KV cells held for this stream's worst case
    logits: np.ndarray | None = None
    hidden: np.ndarray | None = None
    history: set = field(default_factory=set)  # codebook-0 ids of the current segment
    codes: list = field(default_factory=list)
    pending: list = field(default_factory=list)  # frames not yet decoded to audio
    chunks: ChunkPlan | None = None
    decoded_frames: int = 0
    codec_state: CodecState | None = None
    codec_busy: bool = False  # a codec call of this stream is queued or running in its codec lane
    codec_lane: int | None = None  # the codec lane that decodes this stream (overlapped), once it has one
    codec_fault: BaseException | None = None  # that call failed: the engine ends the stream
    new_prefix: tuple[str, int] | None = None  # (key, rows) to cache after this stream's prefill
    timings: dict = field(default_factory=lambda: {"talker_s": 0.0, "predictor_s": 0.0, "codec_s": 0.0})

    @property
    def text(self) -> FixedText | FedText:
        return self.stream.text

    @property
    def sampling(self) -> TalkerSampling:
        """Codebook 0's sampling settings."""
        return self.talker_sampling or self.stream.request.talker

    def frames_due(self, now: float) -> int:
        """How many of the pending frames go to the codec now: none until a chunk is due, then all of
        them, or for a seeded stream those up to its codec grid's last point (chunking.py)."""
        pending = len(self.pending)
        if not pending or not self.chunks.due(pending, now):
            return 0
        return self.chunks.cut(len(self.codes) - pending, pending)
