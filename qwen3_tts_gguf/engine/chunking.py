"""When a stream's frames go to the codec: a growing chunk ramp, cut short when a player would run dry.

The first chunk is one frame (the lowest time to first audio); later chunks follow the ramp
(1, 2, 4, 8, 8, ...), because the codec costs less per frame in larger calls. A fixed ramp stalls a
player that starts at the first chunk whenever generation runs slower than about half of real time
(a chunk of n frames takes n frames' time to make, while the player holds only the chunks before it).
So the fast profile also emits whatever is pending as soon as waiting for one more frame could miss
the moment the player runs out: with a real-time factor below 1 the buffer then grows by
(1 - RTF) x 80 ms per frame, and the chunks grow back to the ramp's size by themselves. A stream
made slower than real time (on average since its first frame) keeps the ramp: its player stalls
whatever the chunking, and fewer, longer stalls with cheaper codec calls beat a stutter every frame.

A ramp that stops at 4 (the codec's largest call, `codec.MAX_CALL_FRAMES`, so the same calls) sends the
last frames to the codec sooner, but ran no faster: 0.6B, 50 frames, 7 alternating rounds (2026-12-03),
one stream's RTF 1.81 / 1.76 and eight streams' 1.05 / 1.02 for 1-2-4-8 / 1-2-4, within the rounds'
spread; the codec's work after the last frame was 300-544 ms of a 4 s utterance's 6.2-7.2 s.

Chunking never changes the samples beyond the codec's float tolerance: the decoder carries its state
across calls (`codec.py`). Their bits do depend on how the frames are grouped into the codec's calls
(0.6B, 40 frames in calls of 1, 2, 4 frames against the ramp's: up to 1e-4 apart), and in the fast
profile that grouping depends on timing: an early chunk, or the frames that came while a stream's
previous call ran, which join its next one. So a seeded stream's calls follow a grid of its own frame
numbers (`grid`): the ramp's chunks, each cut into calls of at most `codec.MAX_CALL_FRAMES` frames,
then calls of that many (1-2-4-8: at frames 0, 1, 3, 7, 11, 15, ...); a chunk ends only on that grid
(the frames past its last point wait, at most 3, unless the stream ends), and is decoded call by call
along it. Its price, on a driven clock (96 frames, the engine's tiny model): at 0.55 / 0.7 / 0.8 / 0.89
of real time a player started at the first chunk waits twice, 32 / 103 / 152 / 195 ms in all (unseeded:
never; the fixed ramp: three times, 63 / 231 / 344 / 444 ms); at 0.4, never. The deterministic profile
keeps the fixed ramp so that its bits do not depend on timing.
"""

from __future__ import annotations

from dataclasses import dataclass

SAFETY = 1.5
"""The next frame is assumed to take this many times the usual interval (frame times vary). The
codec's time per frame is taken from this stream's calls so far, which counts each call's fixed
cost on every frame: pessimistic for larger chunks."""
SMOOTHING = 0.3
"""Weight of the newest measurement in the running estimates."""


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


@dataclass
class ChunkPlan:
    """One stream's chunking state. Times are the engine clock's seconds."""

    ramp: tuple[int, ...]
    frame_s: float  # audio per frame
    adaptive: bool = True
    grid: int = 0  # >0: codec calls of at most this many frames on the stream's grid (seeded streams); 0: none
    chunks: int = 0  # chunks emitted
    audio_s: float = 0.0  # audio emitted
    start: float | None = None  # when the first chunk went out: a player starts playing then
    runs_dry_at: float | None = None  # when that player will have played everything emitted (it waits when dry)
    frames_made: int = 0
    frame_interval_s: float | None = None  # time between this stream's frames, smoothed
    codec_s_per_frame: float | None = None  # this stream's codec time per frame, smoothed
    _last_frame_at: float | None = None
    _first_frame_at: float | None = None

    @property
    def target(self) -> int:
        """Frames the ramp asks for in the next chunk."""
        return self.ramp[min(self.chunks, len(self.ramp) - 1)]

    def frame_made(self, now: float) -> None:
        if self._last_frame_at is not None:
            self.frame_interval_s = _smooth(self.frame_interval_s, now - self._last_frame_at)
        else:
            self._first_frame_at = now
        self._last_frame_at = now
        self.frames_made += 1

    @property
    def keeping_up(self) -> bool:
        """Frames come faster than real time, on average since the first one."""
        if self.frames_made < 2:
            return False
        return (self._last_frame_at - self._first_frame_at) / (self.frames_made - 1) < self.frame_s

    def due(self, pending: int, now: float) -> bool:
        """Should the `pending` frames go to the codec now?"""
        if pending <= 0:
            return False
        if pending >= self.target:
            return True
        if not self.adaptive or self.runs_dry_at is None or self.frame_interval_s is None or not self.keeping_up:
            return False
        next_chance = SAFETY * self.frame_interval_s + (self.codec_s_per_frame or 0.0) * (pending + 1)
        return now + next_chance >= self.runs_dry_at

    def cut(self, start: int, pending: int) -> int:
        """How many of `pending` frames, the first of them the stream's frame `start`, a chunk may take:
        all of them, or on the grid those up to its last point (0: none yet)."""
        if not self.grid:
            return pending
        return max(0, self._grid_point(start + pending) - start)

    def calls(self, start: int, frames: int) -> list[int]:
        """Frames of each codec call for a chunk of `frames` frames from frame `start`: one call (which the
        codec cuts into calls of its own), or on the grid one per grid step (the last one may end off it)."""
        if not self.grid:
            return [frames]
        sizes, at, end = [], start, start + frames
        while at < end:
            step = self._grid_point(at, after=True)
            sizes.append(min(step, end) - at)
            at += sizes[-1]
        return sizes

    def _grid_point(self, frame: int, after: bool = False) -> int:
        """The last grid point at or before `frame` (`after`: the first one after it)."""
        def split(n: int) -> list[int]:
            return [self.grid] * (n // self.grid) + ([n % self.grid] if n % self.grid else [])

        head, tail = [c for n in self.ramp[:-1] for c in split(n)], split(self.ramp[-1])
        at = 0
        for steps, repeat in ((head, False), (tail, True)):
            if repeat:
                at += (frame - at) // sum(tail) * sum(tail)
            for c in steps:
                if at + c > frame:
                    return at + c if after else at
                at += c
        return at + tail[0] if after else at

    def emitted(self, frames: int, codec_s: float, now: float) -> None:
        """`frames` went out in one codec call of `codec_s` seconds that ended at `now`."""
        if self.start is None:
            self.start = now
        duration = frames * self.frame_s
        # a dry player starts again when this chunk arrives
        self.runs_dry_at = now + duration if self.runs_dry_at is None or now > self.runs_dry_at \
            else self.runs_dry_at + duration
        self.audio_s += duration
        self.chunks += 1
        self.codec_s_per_frame = _smooth(self.codec_s_per_frame, codec_s / frames)


__all__ = ["ChunkPlan"]
