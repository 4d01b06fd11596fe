"""The streaming codec decoder on ggml: the graph of `convert/codec_graph.py` (same operations, same
state, same weights, read from the model folder's codec file) on any ggml backend (CPU, Vulkan,
CUDA, Metal), behind `model/codec.CodecDecoder`'s interface.

One call decodes N new frames of B streams (`codes` [B, N, 16]) after their states and returns their
samples and the next states: the work of a call is proportional to its frames (no window is decoded
again). On the CPU backend chunked audio equals one whole decode bit for bit, and a stream decoded beside
others equals its solo decode: each query attends exactly the W keys that end at it (a gathered window),
and every product's rows are padded to a multiple of 4 (`graph.Ops.product`). States are host arrays
in `CodecState`'s layout, so the engine stacks and splits them as it does the ONNX codec's. Graphs
are built once per (B, N) and kept (`max_graphs`); every graph of one decoder shares one activation
buffer (`graph.GraphCache`), sized at load for the largest call (`max_call_frames` frames).

Where the graph differs in form from the ONNX one (results equal up to rounding):
- activations are [B, L, C] (channel last); a conv's taps are its input rows side by side (im2col: one
  copy of an overlapping view) times the kernel, one fp32 product (ggml_conv_1d would round its input to f16); the
  ConvNeXt depthwise convs are ggml_ssm_conv (a causal depthwise conv);
- the Snake's sin^2 is ggml_sin squared (the ONNX graph's polynomial fits it within 1.1e-7);
- RoPE's cos/sin tables and the window's mask are computed on the host per call from `pos`, as the ONNX
  graph computes them (fp32, torch's inv_freq); rotate-half is two halves swapped, one negated (exact).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.convert.checkpoint import CodecDecoderConfig
from qwen3_tts_gguf.ggml.graph import VECTOR_KERNEL_ROWS, Backend, GgmlStage, Graph, GraphCache, Ops, Weights, dims
from qwen3_tts_gguf.host.locks import DeviceLock, hold_devices
from qwen3_tts_gguf.model.codec import CodecState, checked_codes, decode_in_calls, split_states, stack_states

MAX_CALL_FRAMES = 16
"""Frames (streams x frames) of one call at most; longer input is decoded in pieces, the state carried."""
MAX_GRAPHS = 24
"""Graphs (one per (streams, frames) shape) kept built; the least recently used goes first."""


class GgmlCodecError(ValueError):
    """A codec file this runtime cannot read (converted before the ggml codec existed)."""


def _read_onnx(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name.startswith("decoder.")}
    return weights, meta


class GgmlCodec(GgmlStage):
    """`CodecDecoder` on ggml. `backend`: where it runs (one backend may serve several stages)."""

    runtime = "ggml"
    batches_streams = True
    """Streams due at the same time decode in one call (the engine gathers them: engine/audio_out.py)."""

    def __init__(self, path: str | Path, backend: Backend, *, max_call_frames: int = MAX_CALL_FRAMES,
                 max_graphs: int = MAX_GRAPHS, device_locks: Sequence[DeviceLock] = ()):
        raw, meta = _read_onnx(Path(path))
        if "config" not in meta:
            raise GgmlCodecError(f"{Path(path).name} was converted before the ggml codec existed; convert "
                                 "the checkpoint again (or use --codec-runtime onnxruntime)")
        conf = json.loads(meta["config"])
        self.cfg = CodecDecoderConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in conf.items()})
        self.state_specs = [(d["name"], tuple(d["shape"]), np.dtype(d["dtype"])) for d in json.loads(meta["states"])]
        self.samples_per_frame = self.cfg.samples_per_frame
        self.sample_rate = self.cfg.sample_rate
        self.num_quantizers = self.cfg.num_quantizers
        self.codebook_size = self.cfg.codebook_size
        self.max_call_frames = max_call_frames
        self.backend = backend
        self._device_locks = tuple(device_locks)
        self.weights = Weights(backend, _device_weights(raw, self.cfg))
        self._graphs = GraphCache(backend, lambda key: self._graph(*key).ops,
                                  max_graphs)
        self._graphs.reserve([(1, max_call_frames), (max_call_frames, 1)])
        hd = self.cfg.head_dim
        exponents = np.arange(0, hd, 2).astype(np.float32) / np.float32(hd)
        self._inv_freq = np.float32(1.0) / (np.float32(self.cfg.rope_theta) ** exponents)  # as torch (fp32)

    def new_state(self, batch: int = 1) -> CodecState:
        return CodecState({name: np.zeros((batch, *shape), dtype) for name, shape, dtype in self.state_specs})

    def decode(self, codes: np.ndarray, state: CodecState | None = None) -> tuple[np.ndarray, CodecState]:
        """As `CodecDecoder.decode`: codes [B, N, 16] (or [N, 16]) after `state`; wav [B, N*spf] and the
        new state (the given one is not modified)."""
        codes, single = checked_codes(codes, self.num_quantizers, self.codebook_size)
        state = state if state is not None else self.new_state(codes.shape[0])
        if codes.shape[0] > self.max_call_frames:  # streams in groups: a call holds max_call_frames frames at most
            groups = [slice(at, at + self.max_call_frames) for at in range(0, codes.shape[0], self.max_call_frames)]
            parts = [self.decode(codes[g], stack_states(split_states(state)[g])) for g in groups]
            return np.concatenate([w for w, _ in parts]), stack_states([s for _, s in parts])
        wav, state = decode_in_calls(self._run, codes, state, self.max_call_frames)
        return (wav[0] if single else wav), state

    def flops_per_frame(self, frames: int, batch: int = 1) -> float:
        """The work of one call of `batch` streams x `frames` frames, per frame (bench: against the ONNX codec's
        count)."""
        graph = Graph(self._graph(batch, frames).ops)
        try:
            return graph.flops() / (batch * frames)
        finally:
            graph.close()

    def decode_all(self, codes: np.ndarray) -> np.ndarray:
        wav, _ = self.decode(codes)
        return wav

    # -- one call ----------------------------------------------------------------------------
    def _graph(self, batch: int, frames: int) -> _CodecGraph:
        return _CodecGraph(self.cfg, self.weights, self.state_specs, batch, frames,
                           vector_rows=0 if self.backend.is_cpu else VECTOR_KERNEL_ROWS)

    def _run(self, codes: np.ndarray, state: CodecState) -> tuple[np.ndarray, CodecState]:
        batch, frames, _ = codes.shape
        cfg = self.cfg
        codes = np.maximum(codes, 0).astype(np.int32)  # padding (-1) counts as 0, as in the official wrapper
        offsets = (np.arange(cfg.num_quantizers - 1, dtype=np.int32) * cfg.codebook_size)
        pos = state.pos.astype(np.int64)
        feeds = {"first": codes[:, :, 0].reshape(-1), "rest": (codes[:, :, 1:] + offsets).reshape(-1),
                 **self._positions(pos, frames),
                 **{f"in_{name}": array for name, array in state.tensors.items() if name != "pos"}}
        with hold_devices(self._device_locks):  # the talker's decodes and this call never interleave on a GPU
            out = self._graphs.run((batch, frames), feeds)
        new = {"pos": pos + frames, **{name: out[f"out_{name}"] for name, _, _ in self.state_specs if name != "pos"}}
        return out["wav"], CodecState(new)

    def _positions(self, pos: np.ndarray, frames: int) -> dict[str, np.ndarray]:
        """RoPE tables [B, N, 1, hd] as the ONNX graph computes them (codec_graph.py, `positions`), and the
        additive mask of each query's window [B*h, N, 1, W]: its key j sits at frame q-(W-1)+j, hidden
        before the stream's first frame."""
        window = self.cfg.sliding_window
        qpos = pos[:, None] + np.arange(frames)[None]  # [B, N]
        kpos = qpos[:, :, None] - (window - 1) + np.arange(window)  # [B, N, W]
        mask = np.where(kpos >= 0, np.float32(0), np.float32(-np.inf))[:, :, None]
        mask = np.repeat(mask, self.cfg.num_heads, axis=0)
        rows = (np.arange(frames)[:, None] + np.arange(window)[None]).reshape(1, -1)
        rows = np.broadcast_to(rows, (len(pos) * self.cfg.num_heads, frames * window))
        freqs = qpos.astype(np.float32)[:, :, None] * self._inv_freq
        emb = np.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
        return {"cos": np.cos(emb), "sin": np.sin(emb), "mask": mask, "window_rows": rows}


def _device_weights(raw: dict[str, np.ndarray], cfg: CodecDecoderConfig) -> dict[str, np.ndarray]:
    """The ONNX file's initializers in the forms the ggml graph multiplies by (numpy shapes; ggml's ne
    reversed): matrices as [out, in]; convolutions as [C_out, k*C_in], tap-major (column j*C_in + c takes
    x[t + j*d, c]); transposed convs' taps as [s*C_out, m*C_in], sample-major (row r*C_out + c is sample
    t*s + r of channel c), their column blocks in the order of the rows they take (the ONNX graph's reversed);
    Snakes' alpha and 1/beta as [C]."""
    strides = {f"upsample.{j}.0.conv": s for j, s in enumerate(cfg.upsampling_ratios)}
    strides |= {f"decoder.{n + 1}.block.1.conv": s for n, s in enumerate(cfg.upsample_rates)}
    # a transposed conv's input channels: the latent width, then the official decoder's halving blocks
    inputs = {f"upsample.{j}.0.conv": cfg.latent_dim for j in range(len(cfg.upsampling_ratios))}
    inputs |= {f"decoder.{n + 1}.block.1.conv": cfg.decoder_dim >> n for n in range(len(cfg.upsample_rates))}
    out = {}
    for name, array in raw.items():
        key = name.removeprefix("decoder.")
        prefix, _, leaf = key.rpartition(".")
        if leaf == "alpha_over_pi":
            out[prefix + ".alpha"] = (array.astype(np.float64) * math.pi).astype(np.float32).reshape(-1)
        elif leaf == "beta_inv":
            out[key] = array.reshape(-1)
        elif leaf == "taps":  # [m*C_in, C_out*s]: row block i takes x[t-i], column c*s + r
            m, c_in = array.shape[0] // inputs[prefix], inputs[prefix]
            taps = array.reshape(m, c_in, -1, strides[prefix])[::-1]  # [m, C_in, C_out, s], block j takes x[t+j]
            out[key] = np.ascontiguousarray(taps.transpose(3, 2, 0, 1).reshape(array.shape[1], array.shape[0]))
        elif leaf == "bias_taps":  # [C_out*s], entry c*s + r
            out[key] = np.ascontiguousarray(array.reshape(-1, strides[prefix]).T.reshape(-1))
        elif key.endswith("dwconv.conv.weight"):  # [C, 1, k] -> ggml_ssm_conv's [C, k]
            out[key] = array.reshape(array.shape[0], array.shape[2])
        elif array.ndim == 3:  # a causal conv's [C_out, C_in, k]
            out[key] = np.ascontiguousarray(array.transpose(0, 2, 1).reshape(array.shape[0], -1))
        elif (array.ndim == 2 and not key.startswith("quantizer.")) or key.endswith("output_proj.weight_t"):
            out[key] = np.ascontiguousarray(array.T)  # a linear layer's [in, out] (GraphBuilder.linear)
        else:
            out[key] = array
    return out


class _CodecGraph:
    """One (B, N) codec graph, written as `convert/codec_graph.py` writes the ONNX one. Activations are
    [B, L, C] (channel last) from end to end: every product is a weight times rows, with no transpose
    between stages. States keep the ONNX codec's layout ([B, C, L]) and are turned at the graph's ends."""

    def __init__(self, cfg: CodecDecoderConfig, weights: Weights, specs, batch: int, frames: int, *,
                 vector_rows: int = 0):
        self.cfg, self.w, self.B, self.N = cfg, weights, batch, frames
        self.vector_rows = vector_rows
        self.ops = o = Ops()
        self.states = {name: o.input(f"in_{name}", (batch, *shape)) for name, shape, _ in specs if name != "pos"}
        first = o.input("first", (batch * frames,), np.int32)
        rest = o.input("rest", (batch * frames * (cfg.num_quantizers - 1),), np.int32)
        hd, window = cfg.head_dim, cfg.sliding_window
        self.cos = o.input("cos", (batch, frames, 1, hd))
        self.sin = o.input("sin", (batch, frames, 1, hd))
        self.mask = o.input("mask", (batch * cfg.num_heads, frames, 1, window))
        self.window_rows = o.input("window_rows", (batch * cfg.num_heads, frames * window), np.int32)

        h = self.causal_conv(self.dequantize(first, rest), "pre_conv.conv", "pre_conv")
        h = self.transformer(h)
        for j, factor in enumerate(cfg.upsampling_ratios):
            h = self.trans_conv(h, f"upsample.{j}.0.conv", factor, f"up{j}_tc")
            h = self.convnext(h, f"upsample.{j}.1", f"up{j}_dw")
        h = self.causal_conv(h, "decoder.0.conv", "dec0")
        for n, rate in enumerate(cfg.upsample_rates):
            h = self.decoder_block(h, n, rate)
        last = len(cfg.upsample_rates) + 1
        h = self.causal_conv(self.snake(h, f"decoder.{last}"), f"decoder.{last + 1}.conv", "final")
        wav = o.clamp(h, -1.0, 1.0)  # [B, N*spf, 1]
        o.output("wav", wav, (batch, frames * cfg.samples_per_frame))

    # -- layout ----------------------------------------------------------------------------
    def swap(self, x):
        """[B, X, Y] -> [B, Y, X] (contiguous)."""
        return self.ops.cont(self.ops.permute(x, 1, 0, 2, 3))

    def tail(self, full, keep: int):
        """The last `keep` rows of `full` [B, T, C] (a view)."""
        _, b, length, c = dims(full)
        nb = full.contents.nb
        return self.ops.view_3d(full, c, keep, b, nb[1], nb[2], (length - keep) * nb[1])

    def with_history(self, x, state: str):
        """x [B, L, C] after its state's rows (held as [B, C, hist]): [B, hist+L, C]; `out_<state>` is the
        new state, the last hist rows."""
        o = self.ops
        full = o.concat(self.swap(self.states[state]), x, 1)
        hist = dims(self.states[state])[3]
        o.output(f"out_{state}", self.swap(self.tail(full, hist)), (self.B, dims(x)[3], hist))
        return full

    def side_by_side(self, x, taps: int, step: int, length: int):
        """x [B, T, C] -> [B, length, taps*C]: row t holds x[t], x[t+step], ... side by side (im2col: one copy of
        an overlapping view, each input row read `taps` times)."""
        o = self.ops
        _, b, rows, c = dims(x)
        if taps == 1 and rows == length:
            return x
        nb = x.contents.nb
        # ggml_view checks a view's dense size against its source, which an overlapping view exceeds: it is made
        # one tap wide, then widened (its extent, which backends read, stays inside x)
        view = o.view_4d(x, c, 1, length, b, step * nb[1], nb[1], nb[2], 0)
        view.contents.ne[1] = taps
        return o.reshape_3d(o.cont(view), taps * c, length, b)

    # -- pieces ----------------------------------------------------------------------------
    def product(self, x, weight):
        """x [B, L, in] times a weight [out, in] (a name or a tensor): [B, L, out] (`Ops.product`). With
        `vector_rows` (a GPU), the stages of few rows a frame, which a call may hold few or many of, take them in
        pieces of that many: a row meets the same kernel whatever the call holds."""
        o = self.ops
        weight = self.w[weight] if isinstance(weight, str) else weight
        _, b, length, c = dims(x)
        piece = self.vector_rows if length <= self.N * self.vector_rows else 0
        y = o.product(weight, o.reshape_2d(x, c, b * length), rows_first=False, piece=piece)
        return o.reshape_3d(y, dims(weight)[2], length, b)

    def linear(self, x, prefix: str, bias: bool = True):
        """[B, N, in] -> [B, N, out]."""
        y = self.product(x, prefix + ".weight")
        return self.ops.add(y, self.w[prefix + ".bias"]) if bias else y

    def causal_conv(self, x, prefix: str, state: str | None, dilation: int = 1):
        """Causal Conv1d on [B, L, C_in]: the state's last (k-1)*d rows before x, the k taps' rows side by
        side, one fp32 product (ggml_conv_1d would round its input to f16) -> [B, L, C_out]."""
        o, weight = self.ops, self.w[prefix + ".weight"]  # [C_out, k*C_in]
        length, c_in = dims(x)[2:]
        k = dims(weight)[3] // c_in
        if k > 1:
            x = self.with_history(x, state)
        cols = self.side_by_side(x, k, dilation, length)
        return o.add(self.product(cols, weight), self.w[prefix + ".bias"])

    def trans_conv(self, x, prefix: str, stride: int, state: str):
        """Causal ConvTranspose1d (k = m*s) on [B, N, C_in]: one product of the m shifted input rows by the
        taps (codec_graph.py, `trans_conv`) -> [B, N*s, C_out]."""
        o = self.ops
        taps = self.w[prefix + ".taps"]  # [s*C_out, m*C_in]
        _, b, n, c_in = dims(x)
        m = dims(taps)[3] // c_in
        if m > 1:
            x = self.with_history(x, state)
        cols = self.side_by_side(x, m, 1, n)
        y = o.add(self.product(cols, taps), self.w[prefix + ".bias_taps"])  # [B, N, s*C_out]
        return o.reshape_3d(y, dims(taps)[2] // stride, n * stride, b)

    def snake(self, x, prefix: str):
        """SnakeBeta on [B, L, C]: x + 1/beta * sin(alpha*x)^2."""
        o = self.ops
        s = o.sin(o.mul(x, self.w[prefix + ".alpha"]))
        return o.add(x, o.mul(o.sqr(s), self.w[prefix + ".beta_inv"]))

    def dequantize(self, first, rest):
        """RVQ lookup -> [B, N, codebook_dim]: the first table and the sum of the rest, each projected."""
        o, q = self.ops, self.cfg.num_quantizers - 1
        e_first = o.get_rows(self.w["quantizer.rvq_first.codebook"], first)  # [B*N, d]
        e_rest = o.get_rows(self.w["quantizer.rvq_rest.codebooks"], rest)  # [B*N*q, d]
        d = dims(e_rest)[3]
        e_rest = o.reshape_3d(e_rest, d, q, self.B * self.N)
        e_rest = o.reshape_3d(o.sum_rows(o.cont(o.permute(e_rest, 1, 0, 2, 3))), d, self.N, self.B)
        return o.add(self.product(o.reshape_3d(e_first, d, self.N, self.B), "quantizer.rvq_first.output_proj.weight_t"),
                     self.product(e_rest, "quantizer.rvq_rest.output_proj.weight_t"))

    def rope(self, x):
        """x [B, N, H, hd] rotated by the host's tables (NeoX rotate-half: [-x2, x1])."""
        o = self.ops
        b, n, h, hd = dims(x)
        nb = x.contents.nb
        x1, x2 = (o.cont(o.view_4d(x, hd // 2, h, n, b, nb[1], nb[2], nb[3], at * nb[0])) for at in (0, hd // 2))
        rotated = o.concat(o.scale(x2, -1.0), x1, 0)
        return o.add(o.mul(x, self.cos), o.mul(rotated, self.sin))

    def attention(self, x, layer: int):
        """Sliding-window attention, each query against exactly the W keys that end at it (a fixed-length
        softmax in the same order whatever the chunk: chunked audio equals one whole decode bit for bit)."""
        o, cfg = self.ops, self.cfg
        p = f"pre_transformer.layers.{layer}.self_attn"
        hd, heads, window = cfg.head_dim, cfg.num_heads, cfg.sliding_window
        B, N = self.B, self.N

        def heads_of(y):  # [B, N, h*hd] -> [B, N, h, hd]
            return o.reshape_4d(y, hd, heads, N, B)

        q = o.cont(o.permute(self.rope(heads_of(self.linear(x, p + ".q_proj", False))), 0, 2, 1, 3))  # [B, h, N, hd]
        k = o.cont(o.permute(self.rope(heads_of(self.linear(x, p + ".k_proj", False))), 0, 2, 1, 3))
        v = o.cont(o.permute(heads_of(self.linear(x, p + ".v_proj", False)), 0, 2, 1, 3))
        windows = []
        for name, new in ((f"k{layer}", k), (f"v{layer}", v)):
            cat = o.concat(self.states[name], new, 1)  # [B, h, W-1+N, hd]: slot j at frame pos-(W-1)+j
            nb = cat.contents.nb
            o.output(f"out_{name}", o.cont(o.view_4d(cat, hd, window - 1, heads, B, nb[1], nb[2], nb[3], N * nb[1])),
                     (B, heads, window - 1, hd))
            # query i's keys are slots i..i+W-1, gathered (streams and heads on one axis)
            rows = o.get_rows(o.reshape_3d(cat, hd, window - 1 + N, heads * B), self.window_rows)
            windows.append(o.reshape_4d(rows, hd, window, N, heads * B))  # [hB, N, W, hd]
        scores = o.mul_mat(windows[0], o.reshape_4d(q, hd, 1, N, heads * B))  # [hB, N, 1, W]
        probs = o.soft_max_ext(scores, self.mask, hd ** -0.5, 0.0)
        out = o.mul_mat(o.cont(o.transpose(windows[1])), probs)  # [hB, N, 1, hd]
        out = o.reshape_3d(o.cont(o.permute(o.reshape_4d(out, hd, N, heads, B), 0, 2, 1, 3)), hd * heads, N, B)
        return self.linear(out, p + ".o_proj", False)

    def transformer(self, x):
        """[B, N, codebook_dim] -> [B, N, latent]."""
        o, cfg = self.ops, self.cfg
        eps = cfg.rms_norm_eps
        h = self.linear(x, "pre_transformer.input_proj")
        for i in range(cfg.num_layers):
            p = f"pre_transformer.layers.{i}"
            a = self.attention(o.mul(o.rms_norm(h, eps), self.w[p + ".input_layernorm.weight"]), i)
            h = o.add(h, o.mul(a, self.w[p + ".self_attn_layer_scale.scale"]))
            m = o.mul(o.rms_norm(h, eps), self.w[p + ".post_attention_layernorm.weight"])
            m = o.mul(o.silu(self.linear(m, p + ".mlp.gate_proj", False)), self.linear(m, p + ".mlp.up_proj", False))
            h = o.add(h, o.mul(self.linear(m, p + ".mlp.down_proj", False), self.w[p + ".mlp_layer_scale.scale"]))
        h = o.mul(o.rms_norm(h, eps), self.w["pre_transformer.norm.weight"])
        return self.linear(h, "pre_transformer.output_proj")

    def convnext(self, x, prefix: str, state: str):
        """ConvNeXt on [B, L, C]: causal depthwise k7 (ggml_ssm_conv, on time-last rows like its state), LayerNorm,
        MLP with exact GELU, gamma, residual."""
        o = self.ops
        full = o.concat(self.states[state], self.swap(x), 0)  # [B, C, 6+L]
        hist = dims(self.states[state])[3]
        ne, nb = full.contents.ne, full.contents.nb
        kept = o.view_3d(full, hist, ne[1], ne[2], nb[1], nb[2], (ne[0] - hist) * nb[0])
        o.output(f"out_{state}", o.cont(kept), (self.B, ne[1], hist))
        y = o.ssm_conv(full, self.w[prefix + ".dwconv.conv.weight"])  # [B, L, C]
        y = o.add(y, self.w[prefix + ".dwconv.conv.bias"])
        y = o.add(o.mul(o.norm(y, 1e-6), self.w[prefix + ".norm.weight"]), self.w[prefix + ".norm.bias"])
        y = o.gelu_erf(self.linear(y, prefix + ".pwconv1"))
        y = o.mul(self.linear(y, prefix + ".pwconv2"), self.w[prefix + ".gamma"])
        return o.add(x, y)

    def decoder_block(self, x, n: int, rate: int):
        p = f"decoder.{n + 1}.block"
        x = self.trans_conv(self.snake(x, p + ".0"), p + ".1.conv", rate, f"b{n}_tc")
        for u, dilation in enumerate((1, 3, 9)):
            q = f"{p}.{u + 2}"
            y = self.causal_conv(self.snake(x, q + ".act1"), q + ".conv1.conv", f"b{n}_ru{u}", dilation)
            y = self.causal_conv(self.snake(y, q + ".act2"), q + ".conv2.conv", None)
            x = self.ops.add(x, y)
        return x
