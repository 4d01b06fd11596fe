"""One iteration of the worker: codebook 0 for every stream that can step, one batched code-predictor
call, the audio that is due, one talker decode. A failed batched call is retried stream by
stream with its random state and KV cells rewound, so only the culprit fails.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from qwen3_tts_gguf.engine.active import ActiveStream, StreamFault
from qwen3_tts_gguf.engine.runaway import Loop, RunawayEvent
from qwen3_tts_gguf.engine.text_sources import FedText
from qwen3_tts_gguf.model.sampler import SamplingParams, sample_code0
from qwen3_tts_gguf.model.settings import MAX_CHUNK_FRAMES
from qwen3_tts_gguf.model.talker import DecodeItem

MAX_PENDING_FRAMES = MAX_CHUNK_FRAMES
"""A stream with this many frames waiting for the codec (its call in a codec lane still running)
makes no more until they are decoded: one codec call never grows past it."""


class Iteration:
    """The worker's step, a part of `Engine` (`scheduler.py`) read apart: it runs on the worker thread over the
    engine's parts (`self.admission`, `self.prefixes`, `self.audio`, `self.ends`), through their public methods,
    and the model's stages."""

    def _iterate(self, admitted: list[ActiveStream]) -> None:
        eos = self.model.manifest.codec_ids["eos"]
        for act in [a for a in self.admission.active.values() if a.stream.cancelled]:
            self.ends.finish(act, "cancelled", flush=False)
        for act in [a for a in self.admission.active.values() if a.codec_fault is not None]:
            self.ends.fail(act, self.ends.fault("codec", act.codec_fault, act))
        prefill = [a for a in admitted if a.seq in self.admission.active]
        # 2. codebook 0 for every stream that can step (logits there, text row there, reader keeping up)
        stepping, code0, text_rows = [], [], []
        for act in list(self.admission.active.values()):
            if act in prefill or not self._can_step(act):
                continue
            try:
                if isinstance(act.text, FedText):
                    self.admission.grow(act)
                sampled = self._sample(act, eos)
                if sampled is None:
                    if self._next_segment(act):
                        prefill.append(act)
                    else:
                        self.ends.finish(act, "eos")
                    continue
            except StreamFault as fault:
                self.ends.fail(act, fault)
                continue
            stepping.append(act)
            code0.append(sampled[0])
            text_rows.append(sampled[1])
        items: list[DecodeItem] = []
        owners: list[ActiveStream] = []
        ended: list[tuple[ActiveStream, str]] = []
        # 3. code predictor for all stepping streams in one call
        if stepping:
            rows = dict(zip(map(id, stepping), text_rows))
            c0s = dict(zip(map(id, stepping), code0))
            for act, out in list(self._predict(stepping, code0)):
                if isinstance(out, StreamFault):
                    self.ends.fail(act, out)
                    continue
                codes, frame_embedding = out
                frame = np.concatenate([[c0s[id(act)]], codes]).astype(np.int64)
                act.codes.append(frame)
                act.pending.append(frame)
                act.history.add(int(frame[0]))
                self.stats["frames"] += 1
                act.segment_frames += 1
                act.text.frame_made(act.segment_frames)
                act.chunks.frame_made(self.clock())
                limit, reason = self._frame_limit(act)
                loop = act.guard.check(act.text.segment_text(), act.segment_frames,
                                       lambda start, act=act: self._segment_code0(act, start))
                if loop is not None:
                    replay = self._runaway_loop(act, loop)
                    if replay is not None:  # retried: the row before the frames kept is decoded again
                        items.append(replay)
                        owners.append(act)
                        continue
                    reason = "runaway"
                elif act.segment_frames >= limit:
                    if reason == "budget":
                        self._runaway_event(act, "budget", "end")
                else:
                    row = (frame_embedding + rows[id(act)])[None]
                    act.recent_rows.append((act.segment_frames - 1, act.pos, row))
                    items.append(DecodeItem(act.seq, act.pos, row))
                    owners.append(act)
                    continue
                try:
                    if self._next_segment(act):
                        prefill.append(act)
                    else:
                        ended.append((act, reason))  # no next talker step: ends once its audio is flushed
                except StreamFault as fault:
                    self.ends.fail(act, fault)
        # 4. audio that is due, before the talker step: a chunk's latency need not include it (also of
        # streams that did not step: a player may be running dry, or their codec lane was busy)
        for act in list(self.admission.active.values()):
            if not act.stream.cancelled and (due := act.frames_due(self.clock())):
                self.audio.emit(act, due, lambda a, e: self.ends.fail(a, self.ends.fault("codec", e, a)))
        self.audio.flush_due()
        # 5. prompts of admitted streams and new segments join the same decode
        for act in prefill:
            if act.seq not in self.admission.active:
                continue
            try:
                items.append(self.prefixes.prefill_item(act))
            except Exception as e:
                self.ends.fail(act, self.ends.fault("prompt", e, act))
                continue
            owners.append(act)
        live = [(item, act) for item, act in zip(items, owners) if self.admission.holds(act)]
        if live:
            self._decode([i for i, _ in live], [a for _, a in live])
        for act, reason in ended:
            if self.admission.holds(act):
                self.ends.finish(act, reason)
        self.stats["iterations"] += 1

    def _can_step(self, act: ActiveStream) -> bool:
        if act.logits is None or len(act.pending) >= MAX_PENDING_FRAMES:  # (its codec lane is behind)
            return False
        if act.stream.backlogged():
            if not act.stream.paused:
                act.stream.paused = True
                self.stats["paused"] += 1
            return False
        act.stream.paused = False
        return act.text.has_row(act.segment_frames)  # (the row itself is projected once, when it steps)

    def _frame_limit(self, act: ActiveStream) -> tuple[int, str]:
        """Frames the current segment may make, and the finish reason when it hits that."""
        req = act.stream.request
        limit, reason = self.admission.budget(act.text.segment_tokens()), "budget"
        if req.max_frames is not None and req.max_frames - len(act.codes) + act.segment_frames <= limit:
            limit, reason = req.max_frames - len(act.codes) + act.segment_frames, "max_frames"
        room = act.reserved - act.text.prefill_len()
        if limit > room:
            limit, reason = max(room, 1), "context_full"
        return limit, reason

    def _sample(self, act: ActiveStream, eos: int) -> tuple[int, np.ndarray] | None:
        """(codebook 0, text row) of a stream's next frame; None when its segment ended."""
        row = act.text.row(act.segment_frames)
        req = act.stream.request
        try:
            c0 = sample_code0(act.logits, act.history, act.segment_frames, act.sampling, act.rng, eos_id=eos,
                              allow_eos=not req.ignore_eos)
            if not 0 <= c0 < len(act.logits):
                raise ValueError(f"sampled code {c0} is out of range")
        except Exception as e:
            raise self.ends.fault("sampler", e, act) from None
        return (c0, row) if c0 != eos else None

    def _predict(self, stepping: list[ActiveStream], code0: list[int]):
        """Codes and frame embeddings of every stepping stream: one batched call, or, if that
        fails, one call per stream with its random state rewound (only the culprit fails). The parity
        profile calls it stream by stream, as it decodes the talker: a quantized code predictor's kernels
        round a row differently with the rows beside it.
        Yields (act, codes[15], frame embedding) or (act, StreamFault)."""
        if self.settings.deterministic and len(stepping) > 1:
            for act, c0 in zip(stepping, code0):
                yield from self._predict([act], [c0])
            return
        predictor = self.model.predictor
        states = [a.rng.bit_generator.state for a in stepping]
        t0 = time.perf_counter()
        try:
            out = predictor.predict(np.stack([a.hidden for a in stepping]), np.array(code0, np.int64),
                                    [a.stream.request.code_predictor for a in stepping], rngs=[a.rng for a in stepping])
            self._check_codes(out.codes)
        except Exception as e:
            if len(stepping) == 1:
                yield stepping[0], self.ends.fault("code predictor", e, stepping[0])
                return
            for act, state, c0 in zip(stepping, states, code0):
                act.rng.bit_generator.state = state
                yield from self._predict([act], [c0])
            return
        dt = (time.perf_counter() - t0) / len(stepping)
        for k, act in enumerate(stepping):
            act.timings["predictor_s"] += dt
            yield act, (out.codes[k], out.frame_embedding[k])

    def _check_codes(self, codes: np.ndarray) -> None:
        size = self.model.codec.codebook_size
        if codes.size and (codes.min() < 0 or codes.max() >= size):
            raise ValueError(f"code predictor made a code outside [0, {size})")

    def _decode(self, items: list[DecodeItem], owners: list[ActiveStream]) -> None:
        """One talker decode for every item; if it fails, each item alone (KV cells rewound)."""
        talker = self.model.talker
        threads = self.model.stage_threads
        if threads.talker_step < threads.talker_batch and talker.thread_invariant:
            # a step leaves a core to the codec lanes only while one of their calls is in flight (a
            # lane call starts only from this thread, so none starts during the decode); only where the
            # thread count cannot change the numbers (a quantized KV cache), as timing decides it
            busy = self.audio.in_flight()
            talker.set_step_threads(threads.talker_step if busy else threads.talker_batch)
        t0 = time.perf_counter()
        try:
            results = list(zip(*talker.decode(items)))
        except Exception as e:
            if len(items) == 1:
                talker.truncate(items[0].seq, items[0].pos)
                self.ends.fail(owners[0], self.ends.fault("talker decode", e, owners[0]))
                return
            for item in items:
                talker.truncate(item.seq, item.pos)
            for item, act in zip(items, owners):
                if self.admission.holds(act):
                    self._decode([item], [act])
            return
        dt = (time.perf_counter() - t0) / len(items)
        for item, act, (logits, hidden) in zip(items, owners, results):
            if not (np.isfinite(logits).all() and np.isfinite(hidden).all()):
                talker.truncate(item.seq, item.pos)
                self.ends.fail(act, self.ends.fault("talker decode", FloatingPointError("non-finite output"), act))
                continue
            act.logits, act.hidden = logits, hidden
            act.pos = item.pos + len(item.rows)
            act.timings["talker_s"] += dt
            if act.new_prefix is not None:
                self.prefixes.keep(act)

    def _next_segment(self, act: ActiveStream) -> bool:
        """Move a stream whose segment ended to its next segment (codec state carries over)."""
        req = act.stream.request
        if req.max_frames is not None and len(act.codes) >= req.max_frames:
            return False
        try:
            if not act.text.next_segment():
                return False
        except Exception as e:
            raise self.ends.fault("prompt", e) from None
        self.model.talker.drop(act.seq)
        act.segment_frames, act.pos, act.logits, act.hidden, act.history = 0, 0, None, None, set()
        act.guard.next_segment()
        act.recent_rows.clear()
        act.talker_sampling = None
        return True

    @staticmethod
    def _segment_code0(act: ActiveStream, start: int) -> np.ndarray:
        """Codebook 0 of the current segment's frames from its frame `start` on."""
        n = act.segment_frames - start
        return np.fromiter((f[0] for f in act.codes[len(act.codes) - n:]), np.int64, n)

    def _runaway_event(self, act: ActiveStream, kind: str, action: str, period: int = 0) -> None:
        segment = getattr(act.text, "segment", 0)
        act.guard.events.append(RunawayEvent(kind, action, segment, act.segment_frames, period))
        self.stats[f"runaway_{kind}_{action}"] += 1

    def _runaway_loop(self, act: ActiveStream, loop: Loop) -> DecodeItem | None:
        """A loop found (runaway.py): its repeats not yet decoded are dropped; then the segment ends
        (None), or, retried, goes on from there with a new random state (the item to decode again)."""
        keep = max(loop.keep, act.segment_frames - len(act.pending))  # what went to the codec stays
        replay = next(((pos, row) for k, pos, row in act.recent_rows if k == keep - 1), None)
        action = act.guard.decide() if replay is not None else "end"
        self._runaway_event(act, "loop", action, loop.period)
        if drop := act.segment_frames - keep:
            del act.codes[-drop:]
            del act.pending[-drop:]
            act.segment_frames = keep
        if action == "end":
            return None
        while act.recent_rows and act.recent_rows[-1][0] >= keep:
            act.recent_rows.pop()
        pos, row = replay
        self.model.talker.truncate(act.seq, pos)
        act.pos = pos
        act.history = {int(f[0]) for f in act.codes[len(act.codes) - keep:]}
        act.rng = np.random.default_rng([act.seed, act.guard.retried])
        if act.sampling.params.greedy:  # greedy would only make the same loop again
            default = SamplingParams.from_generation_config({**self.model.manifest.sampling, "do_sample": True})
            act.talker_sampling = replace(act.sampling, params=default)
        act.guard.since = keep
        return DecodeItem(act.seq, pos, row)
