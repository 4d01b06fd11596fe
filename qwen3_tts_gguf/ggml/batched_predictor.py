"""The code predictor on ggml: one call a frame for every stepping stream, its 15 steps and each row's
sampling on the device, behind `model/predictor.CodePredictor`'s interface (`--cp-runtime ggml`).

The weights are the llama stages file's code predictor (`convert/llama_stages.py`: the preset's matrix
type, the layers whose inputs f16 cannot hold kept f32, the sampling temperature baked into the heads),
uploaded as they are. One graph is built per (rows, sampling setting) and kept.

What a call computes is `convert/predictor_graph.py`'s frame with `model/sampler.py`'s semantics:
- each step is one token per row through every layer (the frame's first two positions, the talker's
  hidden state and codebook 0's row, as two steps), attention over the row's own earlier steps;
- greedy rows take the argmax of the raw logits; sampling rows scale them by their temperature, keep the
  top-k (exactly k: a tie at the k-th logit keeps the lower id only by chance of the sort), then the
  top-p nucleus, and draw by inverse CDF with one uniform number a step from the row's own generator,
  the candidates ordered by descending logit;
- every matrix product's rows are padded to a multiple of 4 (`graph.Ops.product`): on the CPU backend a
  row's codes do not depend on the rows beside it, so a seed gives the same codes alone or beside others;
- on a GPU a call holds at most 8 rows (`GPU_MAX_ROWS`: ggml-vulkan's f32 matrix-vector kernels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.convert.predictor_graph import rope_tables
from qwen3_tts_gguf.ggml.graph import VECTOR_KERNEL_ROWS, Backend, GgmlStage, GraphCache, Ops, Weights
from qwen3_tts_gguf.ggml.lib import TYPE_F16, TYPE_F32, TYPE_I32
from qwen3_tts_gguf.host.locks import DeviceLock, hold_devices
from qwen3_tts_gguf.model.predictor import NUM_STEPS, PredictorOutput, uniform_draws
from qwen3_tts_gguf.model.sampler import SamplingParams

ROPE_THETA = 1e6  # the code predictor's (convert/llama_stages.CODE_PREDICTOR_ROPE_THETA: a file holds no other)
MAX_GRAPHS = 16
GPU_MAX_ROWS = VECTOR_KERNEL_ROWS
"""Rows of one call on a GPU backend at most: ggml-vulkan's matrix-vector kernels compute in f32, its matrix
kernels round their inputs to f16, which the published 0.6B's activation spike (~1.3e5) overflows. Larger
batches take several calls."""
_SORT_DESC = 1


class GgmlPredictorError(ValueError):
    """A llama stages file this runtime cannot read."""


@dataclass(frozen=True)
class _Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    hidden: int  # the talker's width (input rows, frame embedding)
    width: int  # the code predictor's
    vocab: int


@dataclass(frozen=True)
class _Sampling:
    """A graph's sampling setting: the factor on the (baked) logits, top-k (vocab: off) and top-p."""

    scale: float
    top_k: int
    top_p: float


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {}
    for name, field in reader.fields.items():
        if name.startswith("clip.gen.audio."):
            fields[name.removeprefix("clip.gen.audio.")] = field.contents()
    weights = {t.name.removeprefix("a.gen.code."): np.array(t.data) for t in reader.tensors
               if t.name.startswith("a.gen.code.")}
    return weights, fields


class GgmlCodePredictor(GgmlStage):
    """`CodePredictor.predict` on ggml. `temperature`: the sampling temperature baked into the file's
    heads (the manifest's `llama_stages.temperature`)."""

    runtime = "ggml"

    def __init__(self, path: str | Path, backend: Backend, *, temperature: float = 1.0,
                 device_locks: Sequence[DeviceLock] = (), max_graphs: int = MAX_GRAPHS):
        raw, fields = _read(Path(path))
        if "blk.0.attn_q.weight" not in raw:
            raise GgmlPredictorError(f"{Path(path).name} holds no code predictor")
        heads = int(fields["attention.head_count"])
        self.shape = _Shape(layers=int(fields["block_count"]), heads=heads,
                            kv_heads=int(fields["attention.head_count_kv"]),
                            head_dim=raw["blk.0.attn_q.weight"].shape[0] // heads,
                            eps=float(fields["attention.layer_norm_epsilon"]),
                            hidden=raw["out_embd.weight"].shape[1], width=raw["blk.0.attn_q.weight"].shape[1],
                            vocab=raw["head.weight"].shape[1])
        self.hidden_size = self.shape.hidden
        self.codebook_size = self.shape.vocab
        self.baked_temperature = float(temperature)
        self.backend = backend
        arrays, types = {}, {}
        for name, array in raw.items():
            if name in ("embd.weight", "head.weight"):  # per codebook: one 2-D table each
                for j in range(array.shape[0]):
                    arrays[f"{name}.{j}"] = array[j]
                    types[f"{name}.{j}"] = _type(array)
            else:
                arrays[name] = array
                types[name] = _type(array)
        cos, sin = rope_tables(self.shape.head_dim, ROPE_THETA, np.arange(NUM_STEPS + 1))
        arrays["rope_cos"], arrays["rope_sin"] = cos, sin
        self.weights = Weights(backend, arrays, types)
        self._graphs = GraphCache(backend, lambda key: _PredictorGraph(self.shape, self.weights, *key).ops, max_graphs)
        widest = 64 if backend.is_cpu else GPU_MAX_ROWS
        self._graphs.reserve([(widest, _Sampling(1.0, self.codebook_size, 0.5))])
        self._device_locks = tuple(device_locks)

    def predict(self, hidden: np.ndarray, code0: np.ndarray, params: SamplingParams | Sequence[SamplingParams],
                rngs: Sequence[np.random.Generator] | None = None, rand: np.ndarray | None = None) -> PredictorOutput:
        """As `CodePredictor.predict`: codes [B, 15] and frame embeddings [B, H] of B frames. Rows of one
        sampling setting share a call (greedy rows join any)."""
        hidden = np.ascontiguousarray(hidden, np.float32)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size or not len(hidden):
            raise ValueError(f"hidden must be [B>=1, {self.hidden_size}], got {list(hidden.shape)}")
        if not np.isfinite(hidden).all():
            raise ValueError("hidden holds a value that is not finite")
        batch = hidden.shape[0]
        code0 = np.asarray(code0, np.int64).reshape(batch)
        vocab_in = int(self.weights["out_embd.weight"].contents.ne[1])
        if code0.min() < 0 or code0.max() >= vocab_in:
            raise ValueError(f"code0 must be in [0, {vocab_in})")
        params = [params] * batch if isinstance(params, SamplingParams) else list(params)
        if len(params) != batch:
            raise ValueError(f"{len(params)} sampling settings for a batch of {batch}")
        rand = uniform_draws(batch, rngs, rand)
        if not (rand >= 0).all() or not (rand < 1).all():  # NaN included: the draw's index must stay in range
            raise ValueError("rand must hold uniform numbers in [0, 1)")
        groups: dict[_Sampling | None, list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault(None if p.greedy else self._sampling(p), []).append(i)
        sampled = [key for key in groups if key is not None]
        if len(sampled) <= 1 and None in groups:  # greedy rows ride along with the one sampling setting
            groups.setdefault(sampled[0] if sampled else _Sampling(1.0, 1, 1.0), []).extend(groups.pop(None))
        codes = np.empty((batch, NUM_STEPS), np.int64)
        frame = np.empty((batch, self.hidden_size), np.float32)
        step = batch if self.backend.is_cpu else GPU_MAX_ROWS
        for setting, rows in groups.items():
            rows = sorted(rows)
            for at in range(0, len(rows), step):
                part = rows[at:at + step]
                greedy = np.array([params[i].greedy for i in part], np.float32)
                out = self._run(setting or _Sampling(1.0, 1, 1.0), hidden[part], code0[part], rand[part], greedy)
                codes[part], frame[part] = out
        return PredictorOutput(codes, frame)

    def _sampling(self, p: SamplingParams) -> _Sampling:
        k = self.codebook_size if p.top_k <= 0 or p.top_k >= self.codebook_size else int(p.top_k)
        return _Sampling(self.baked_temperature / float(p.temperature), k, float(p.top_p))

    def _run(self, setting: _Sampling, hidden, code0, rand, greedy) -> tuple[np.ndarray, np.ndarray]:
        feeds = {"hidden": hidden, "code0": code0.astype(np.int32), "rand": rand, "greedy": greedy[:, None]}
        with hold_devices(self._device_locks):
            out = self._graphs.run((len(hidden), setting), feeds)
        codes = out["codes"].astype(np.int64)
        if codes.min() < 0 or codes.max() >= self.codebook_size:  # never: a broken device answer, refused
            raise ValueError(f"the ggml code predictor made a code outside [0, {self.codebook_size})")
        return codes, out["frame_embedding"]


def _type(array: np.ndarray) -> int:
    return TYPE_F16 if array.dtype == np.float16 else TYPE_F32


class _PredictorGraph:
    """One frame of B rows: 16 single-token passes through the layers (positions 0..15), 15 draws."""

    def __init__(self, shape: _Shape, weights: Weights, batch: int, sampling: _Sampling):
        self.s, self.w, self.B = shape, weights, batch
        self.ops = o = Ops()
        hidden = o.input("hidden", (batch, shape.hidden))
        code0 = o.input("code0", (batch,), np.int32)
        self.rand = o.input("rand", (batch, NUM_STEPS))
        self.greedy = o.input("greedy", (batch, 1))
        self.cache: list[tuple] = [(None, None)] * shape.layers
        self.pass_through(self.project(hidden), 0)  # position 0 only fills the cache
        frame = o.get_rows(self.w["out_embd.weight"], code0)  # [B, H]
        x, codes = frame, []
        for j in range(NUM_STEPS):
            out = self.pass_through(self.project(x), j + 1)
            out = o.mul(o.rms_norm(out, shape.eps), self.w["output_norm.weight"])
            logits = self.product(out, self.w[f"head.weight.{j}"])  # [B, V]
            code = self.sample(logits, j, sampling)  # i32 [B]
            codes.append(code)
            x = o.get_rows(self.w[f"embd.weight.{j}"], code)  # [B, H]
            frame = o.add(frame, x)
        all_codes = codes[0]
        for c in codes[1:]:
            all_codes = o.concat(all_codes, c, 0)  # [15, B] as ne
        o.output("codes", o.cont(o.transpose(o.reshape_2d(all_codes, batch, NUM_STEPS))), (batch, NUM_STEPS))
        o.output("frame_embedding", frame, (batch, shape.hidden))

    def product(self, rows, weight):
        """rows [B, in] x weight [out, in] -> [B, out] (`Ops.product`)."""
        return self.ops.product(weight, rows, rows_first=False)

    def project(self, rows):
        if "proj_in.weight" not in self.w.tensors:  # the 0.6B: talker and code predictor are as wide
            return rows
        return self.ops.add(self.product(rows, self.w["proj_in.weight"]), self.w["proj_in.bias"])

    def rope(self, x, position: int):
        """x [B, heads, hd] rotated to `position` (NeoX rotate-half, the host's tables)."""
        o, hd = self.ops, self.s.head_dim
        ne, nb = x.contents.ne, x.contents.nb
        x1, x2 = (o.cont(o.view_3d(x, hd // 2, ne[1], ne[2], nb[1], nb[2], at * nb[0])) for at in (0, hd // 2))
        rotated = o.concat(o.scale(x2, -1.0), x1, 0)
        row = o.view_1d(self.w["rope_cos"], hd, position * hd * 4), o.view_1d(self.w["rope_sin"], hd, position * hd * 4)
        return o.add(o.mul(x, row[0]), o.mul(rotated, row[1]))

    def pass_through(self, x, position: int):
        """One token per row through every layer at `position`; the K/V rows join each layer's cache."""
        o, s = self.ops, self.s
        for i in range(s.layers):
            p = f"blk.{i}."
            a = o.mul(o.rms_norm(x, s.eps), self.w[p + "ln1.weight"])
            q = o.reshape_3d(self.product(a, self.w[p + "attn_q.weight"]), s.head_dim, s.heads, self.B)
            k = o.reshape_3d(self.product(a, self.w[p + "attn_k.weight"]), s.head_dim, s.kv_heads, self.B)
            v = o.reshape_3d(self.product(a, self.w[p + "attn_v.weight"]), s.head_dim, s.kv_heads, self.B)
            q = self.rope(o.mul(o.rms_norm(q, s.eps), self.w[p + "attn_q_norm.weight"]), position)
            k = self.rope(o.mul(o.rms_norm(k, s.eps), self.w[p + "attn_k_norm.weight"]), position)
            # caches [B, kv, S, hd]: this step's row appended
            k = o.reshape_4d(k, s.head_dim, 1, s.kv_heads, self.B)
            v = o.reshape_4d(v, s.head_dim, 1, s.kv_heads, self.B)
            keys, values = self.cache[i]
            keys = k if keys is None else o.concat(keys, k, 1)
            values = v if values is None else o.concat(values, v, 1)
            self.cache[i] = (keys, values)
            # q heads group on their kv head (h // g), as ggml broadcasts the cache over the heads
            scores = o.mul_mat(keys, o.reshape_4d(q, s.head_dim, 1, s.heads, self.B))  # [B, h, 1, S]
            probs = o.soft_max_ext(scores, None, s.head_dim ** -0.5, 0.0)
            att = o.mul_mat(o.cont(o.transpose(values)), probs)  # [B, h, 1, hd]
            att = o.reshape_2d(att, s.head_dim * s.heads, self.B)
            x = o.add(x, self.product(att, self.w[p + "attn_out.weight"]))
            h = o.mul(o.rms_norm(x, s.eps), self.w[p + "ln2.weight"])
            act = o.mul(o.silu(self.product(h, self.w[p + "ffn_gate.weight"])),
                        self.product(h, self.w[p + "ffn_up.weight"]))
            x = o.add(x, self.product(act, self.w[p + "ffn_down.weight"]))
        return x

    def sample(self, logits, step: int, setting: _Sampling):
        """One code per row of logits [B, V] (i32 [B]): greedy rows the argmax; the others as the module
        doc says, with rand[:, step]."""
        o, B = self.ops, self.B
        vocab = self.s.vocab
        best = o.argmax(logits)  # [B] i32: the first of equal maxima
        k = setting.top_k
        scaled = o.scale(logits, setting.scale) if setting.scale != 1.0 else logits
        if k < vocab:
            ids = o.top_k(scaled, k)  # [B, k] i32, in no order
            top = o.reshape_2d(o.get_rows(o.reshape_3d(scaled, 1, vocab, B), ids), k, B)
        else:
            ids, top = None, scaled
        order = o.argsort(top, _SORT_DESC)  # [B, k]
        top = o.reshape_2d(o.get_rows(o.reshape_3d(top, 1, k, B), order), k, B)  # descending
        candidates = order if ids is None else o.reshape_2d(o.get_rows(o.reshape_3d(ids, 1, k, B), order), k, B)
        if setting.top_p < 1.0:
            probs = o.soft_max(top)
            before = o.sub(o.cumsum(probs), probs)  # the mass of the candidates ranked above each
            keep = o.step(o.scale_bias(before, -1.0, setting.top_p))  # before < p (the first always)
            top = o.add(top, o.log(keep))
        cdf = o.cumsum(o.soft_max(top))  # [B, k]
        nb = cdf.contents.nb
        total = o.view_2d(cdf, 1, B, nb[1], (k - 1) * nb[0])  # [B, 1]
        u = o.mul(o.view_2d(self.rand, 1, B, self.rand.contents.nb[1], step * 4), total)
        above = o.sum_rows(o.step(o.sub(cdf, u)))  # candidates whose cdf exceeds u: k - position
        position = o.clamp(o.scale_bias(above, -1.0, float(k)), 0.0, float(k - 1))  # [B, 1]
        drawn = o.get_rows(o.reshape_3d(candidates, 1, k, B), o.reshape_2d(o.cast(position, TYPE_I32), 1, B))
        drawn = o.cast(o.reshape_2d(drawn, 1, B), TYPE_F32)
        chosen = o.add(o.mul(o.cast(o.reshape_2d(best, 1, B), TYPE_F32), self.greedy),
                       o.mul(drawn, o.scale_bias(self.greedy, -1.0, 1.0)))
        return o.reshape_1d(o.cast(chosen, TYPE_I32), B)
