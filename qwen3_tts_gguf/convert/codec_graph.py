"""The 12 Hz codec decoder (code2wav) as one stateful, streaming ONNX graph.

Feeding frames in any chunking gives the same waveform as the official whole-utterance
`Qwen3TTSTokenizerV2Decoder.forward` (exact in fp64; fp32 rounding noise otherwise, the Snakes'
sin^2 a polynomial within 1.1e-7), because every piece of history the decoder looks back at is carried
explicitly between calls.

Inputs: `codes` int64 [B, N, 16], `in_pos` int64 [B] (frames already decoded per stream) and
`in_<state>` for each state below. Outputs: `wav` float [B, N*1920] clamped to [-1, 1],
`out_pos` = in_pos + N and `out_<state>`. B and N are dynamic; rows may sit at different positions,
but every row decodes the same N frames in one call. Negative codes (padding) are clamped to 0
like the official wrapper; codes >= codebook_size are the caller's to refuse (the graph would fail
on the last codebook but silently read the next table on the others).

State layout (batch axis first, all zero-initialised; names and per-stream shapes are also in
metadata_props["states"] as JSON, pos included):

| state              | per-stream shape            | what it holds                                       |
|--------------------|-----------------------------|-----------------------------------------------------|
| pos                | [] (int64)                  | frames decoded so far                               |
| pre_conv           | [codebook_dim, 2]           | last k-1 input columns of the causal k3 conv        |
| k{i}, v{i}         | [heads, W-1, head_dim]      | last W-1 post-RoPE keys / values of layer i         |
| up{j}_dw           | [latent, 6]                 | ConvNeXt depthwise k7 history (upsample stage j)    |
| dec0               | [latent, 6]                 | decoder.0 k7 conv history                           |
| b{n}_tc            | [C_in, 1]                   | previous (post-Snake) input column of the block's   |
|                    |                             | transposed conv (k=2r, stride r)                    |
| b{n}_ru{u}         | [C, 6*d], d = 1, 3, 9       | residual unit u's dilated k7 conv history           |
| final              | [C_last, 6]                 | last k7 conv history                                |

The KV state has a fixed length W-1 (W = sliding_window); which slots are real is derived from
`pos`: slot j of Concat(cache, new) sits at absolute frame pos-(W-1)+j and is visible to query
frame q iff 0 <= kpos, kpos <= q and kpos > q-W. The k=s upsampling transposed convs need no state.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.onnx_builder import GraphBuilder

INT_MAX = np.iinfo(np.int64).max
NUM_CODEBOOKS_SEMANTIC = 1
# sin(pi*f)^2 = u*Q(u), u = f^2, |f| <= 1/2: Q's coefficients c0..c5, a least-squares fit on Chebyshev
# nodes (max error 6.3e-9; 1.1e-7 with the coefficients rounded to fp32). ONNX Runtime's Sin is scalar
# and single-threaded, about a sixth of the codec's time; these elementwise ops run on every thread.
# Fewer passes measured no faster (0.6B, 2 threads, 6 alternating rounds, 2026-12-02): a degree-5 fit with
# the Snake's 1/beta folded into per-channel coefficients and a rounding by adding and subtracting 1.5*2^23
# (15 ops instead of 17) 0.96-1.00 of this graph's time per frame; with no Snake at all, 0.85-0.87.
SIN_PI_SQUARED = (9.869602862099184, -32.469578315538755, 42.72533822629437, -30.08560427089877,
                  12.989520750069191, -3.2713667499473047)


def sin_pi_squared(g: GraphBuilder, y: str) -> str:
    """sin(pi*y)^2 by elementwise ops: u*Q(u) with f = y - round(y), u = f^2 (see SIN_PI_SQUARED)."""
    f = g.op("Sub", y, g.op("Round", y))
    u = g.op("Mul", f, f)
    acc = g.const(SIN_PI_SQUARED[-1])
    for c in SIN_PI_SQUARED[-2::-1]:  # Horner: Q(u) = c0 + u(c1 + u(c2 + ...))
        acc = g.op("Add", g.op("Mul", acc, u), g.const(c))
    return g.op("Mul", acc, u)


@dataclass(frozen=True)
class StateSpec:
    """One streaming state tensor: graph I/O `in_<name>` / `out_<name>`, shape [B, *shape]."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name


class _CodecBuilder:
    def __init__(self, ckpt: Checkpoint, float_type, snake_sin: bool):
        self.g = GraphBuilder("qwen3_tts_codec_decoder", float_type)
        self.snake_sin = snake_sin
        self.cfg = ckpt.config.codec
        self.weights = ckpt.codec_weights
        self.float_name = np.dtype(float_type).name
        self.states: list[StateSpec] = []
        self.new_states: dict[str, str] = {}

    # -- helpers ---------------------------------------------------------------------------
    def w(self, name: str) -> np.ndarray:
        return np.asarray(self.weights["decoder." + name], dtype=np.float32)

    def init(self, name: str, array: np.ndarray | None = None) -> str:
        """The checkpoint tensor `decoder.<name>` (or `array`) as an initializer."""
        return self.g.weight("decoder." + name, self.w(name) if array is None else array)

    def state(self, name: str, shape: tuple[int, ...], dtype=None) -> str:
        dtype = dtype or self.g.float_type
        self.states.append(StateSpec(name, tuple(int(s) for s in shape), np.dtype(dtype).name))
        return self.g.input(f"in_{name}", "float" if dtype is self.g.float_type else dtype, ["B", *shape])

    def tail(self, x: str, n: int, axis: int) -> str:
        """The last n entries of x along axis."""
        g = self.g
        return g.op("Slice", x, g.const([-n]), g.const([INT_MAX]), g.const([axis]))

    def slice(self, x: str, start: int, end: int, axis: int) -> str:
        g = self.g
        return g.op("Slice", x, g.const([start]), g.const([end]), g.const([axis]))

    def snake(self, x: str, prefix: str) -> str:
        """SnakeBeta on [B, C, L]: x + 1/(exp(beta)+1e-9) * sin(exp(alpha)*x)^2 (log-space params)."""
        ft = self.g.float_type
        alpha = np.exp(self.w(prefix + ".alpha").astype(ft))
        inv_beta = 1.0 / (np.exp(self.w(prefix + ".beta").astype(ft)) + ft(1e-9))
        b = self.init(prefix + ".beta_inv", inv_beta.reshape(1, -1, 1))
        if self.snake_sin:
            s = self.g.op("Sin", self.g.op("Mul", x, self.init(prefix + ".alpha_exp", alpha.reshape(1, -1, 1))))
            square = self.g.op("Mul", s, s)
        else:
            scaled = (alpha.astype(np.float64) / np.pi).astype(ft).reshape(1, -1, 1)
            square = sin_pi_squared(self.g, self.g.op("Mul", x, self.init(prefix + ".alpha_over_pi", scaled)))
        return self.g.op("Add", x, self.g.op("Mul", square, b))

    def causal_conv(self, x: str, prefix: str, state: str | None, *, dilation: int = 1, groups: int = 1) -> str:
        """Causal Conv1d on [B, C, L]: the last (k-1)*d input columns of the previous call are prepended.

        ONNX Runtime runs these at 150-165 GFLOP/s on 2 AVX2 cores (per-node profile, 0.6B, 4 frames a call,
        2026-12-04), near the cores' fp32 FMA peak. As Conv2d with a height of 1, which ONNX Runtime's NCHWc
        layout kernels take, they ran no faster (12 alternating rounds: 58.1 / 56.6 ms a frame, SNR 85 dB)."""
        weight = self.w(prefix + ".conv.weight")
        hist = (weight.shape[-1] - 1) * dilation
        args = (self.init(prefix + ".conv.weight"), self.init(prefix + ".conv.bias"))
        if hist:
            h = self.state(state, (weight.shape[1] * groups, hist))
            x = self.g.op("Concat", h, x, axis=2)
            self.new_states[state] = self.tail(x, hist, axis=2)
        return self.g.op("Conv", x, *args, dilations=[dilation], group=groups)

    def trans_conv(self, x: str, prefix: str, stride: int, state: str) -> str:
        """Causal ConvTranspose1d (official: no padding, drop the last k-s samples) on [B, C, L].

        With k = m*s (every transposed conv of this codec), output block t (s samples) is
        sum_i W[:, :, i*s:(i+1)*s]^T x[t-i] for i < m: one MatMul of the m shifted input columns,
        stacked on the channel axis, by the taps laid out as [m*C_in, C_out*s]. ONNX Runtime
        prepacks that constant operand, where its ConvTranspose re-reads the weights transposed
        and adds a col2im pass. The previous m-1 input columns are the state."""
        g = self.g
        weight = self.w(prefix + ".conv.weight")  # [C_in, C_out, k], already ONNX's layout
        c_in, c_out, k = weight.shape
        if k % stride:
            raise ValueError(f"{prefix}: kernel {k} is not a multiple of the stride {stride}")
        m = k // stride
        if m > 1:
            x = g.op("Concat", self.state(state, (c_in, m - 1)), x, axis=2)
            self.new_states[state] = self.tail(x, m - 1, axis=2)
        cols = g.op("Transpose", x, perm=[0, 2, 1])  # [B, N+m-1, C_in]
        if m > 1:  # x[t-i] for i < m, side by side
            cols = g.op("Concat", *[self.slice(cols, m - 1 - i, -i if i else INT_MAX, axis=1) for i in range(m)],
                        axis=2)
        kernel = np.concatenate([weight[:, :, i * stride:(i + 1) * stride].reshape(c_in, c_out * stride)
                                 for i in range(m)])
        bias = np.repeat(self.w(prefix + ".conv.bias"), stride)
        y = g.op("Add", g.op("MatMul", cols, self.init(prefix + ".conv.taps", kernel)),
                 self.init(prefix + ".conv.bias_taps", bias))  # [B, N, C_out*s]
        y = g.op("Transpose", g.op("Reshape", y, g.const([0, -1, c_out, stride])), perm=[0, 2, 1, 3])
        return g.op("Reshape", y, g.const([0, c_out, -1]))

    def linear(self, x: str, prefix: str, bias: bool = True) -> str:
        w = self.w(prefix + ".weight")
        b = self.w(prefix + ".bias") if bias else None
        return self.g.linear(x, w, b, "decoder." + prefix)

    # -- stages ----------------------------------------------------------------------------
    def dequantize(self, codes: str) -> str:
        """RVQ lookup: [B, N, 16] codes -> [B, N, codebook_dim]; output_proj folded to MatMuls."""
        g, ft = self.g, self.g.float_type

        def table(prefix: str) -> np.ndarray:
            s = self.w(prefix + "._codebook.embedding_sum").astype(ft)
            usage = self.w(prefix + "._codebook.cluster_usage").astype(ft)
            return s / np.maximum(usage, ft(1e-5))[:, None]

        n_sem, n_q, size = NUM_CODEBOOKS_SEMANTIC, self.cfg.num_quantizers, self.cfg.codebook_size
        first = table("quantizer.rvq_first.vq.layers.0")
        rest = np.concatenate([table(f"quantizer.rvq_rest.vq.layers.{i}") for i in range(n_q - n_sem)])
        offsets = g.const(np.arange(n_q - n_sem, dtype=np.int64) * size)
        e_first = g.op("Gather", self.init("quantizer.rvq_first.codebook", first),
                       self.slice(codes, 0, n_sem, axis=2), axis=0)  # [B, N, 1, d]
        e_rest = g.op("Gather", self.init("quantizer.rvq_rest.codebooks", rest),
                      g.op("Add", self.slice(codes, n_sem, n_q, axis=2), offsets), axis=0)
        sums = [g.op("ReduceSum", e, g.const([2]), keepdims=0) for e in (e_first, e_rest)]
        projected = [
            g.op("MatMul", s, self.init(f"quantizer.{q}.output_proj.weight_t",
                                        np.ascontiguousarray(self.w(f"quantizer.{q}.output_proj.weight")[:, :, 0].T)))
            for s, q in zip(sums, ("rvq_first", "rvq_rest"))
        ]
        return g.op("Add", *projected)

    def positions(self, pos: str, n: str):
        """RoPE cos/sin [B, 1, N, head_dim] and the sliding-window mask [B, 1, N, W-1+N]."""
        g, cfg = self.g, self.cfg
        W, hd = cfg.sliding_window, cfg.head_dim
        i = g.op("Range", g.const(0), n, g.const(1))
        j = g.op("Range", g.const(0), g.op("Add", n, g.const(W - 1)), g.const(1))
        pos_col = g.op("Unsqueeze", pos, g.const([1]))  # [B, 1]
        qpos = g.op("Add", pos_col, g.op("Unsqueeze", i, g.const([0])))  # [B, N]
        kpos = g.op("Add", g.op("Sub", pos_col, g.const([[W - 1]])), g.op("Unsqueeze", j, g.const([0])))  # [B, L]
        q4 = g.op("Unsqueeze", qpos, g.const([1, 3]))  # [B, 1, N, 1]
        k4 = g.op("Unsqueeze", kpos, g.const([1, 2]))  # [B, 1, 1, L]
        valid = g.op("And", g.op("And", g.op("GreaterOrEqual", k4, g.const(0)), g.op("LessOrEqual", k4, q4)),
                     g.op("Greater", k4, g.op("Sub", q4, g.const(W))))
        # inv_freq exactly as torch computes it (fp32), so fp32 angles round like the reference
        exponents = np.arange(0, hd, 2).astype(np.float32) / np.float32(hd)
        inv_freq = np.float32(1.0) / (np.float32(cfg.rope_theta) ** exponents)
        freqs = g.op("Mul", g.op("Unsqueeze", g.op("Cast", qpos, to=g.float_elem), g.const([2])), g.const(inv_freq))
        emb = g.op("Unsqueeze", g.op("Concat", freqs, freqs, axis=2), g.const([1]))  # [B, 1, N, hd]
        return g.op("Cos", emb), g.op("Sin", emb), valid

    def rope(self, x: str, cos: str, sin: str) -> str:
        half = self.cfg.head_dim // 2
        x1, x2 = self.slice(x, 0, half, axis=3), self.slice(x, half, INT_MAX, axis=3)
        rotated = self.g.op("Concat", self.g.op("Neg", x2), x1, axis=3)
        return self.g.op("Add", self.g.op("Mul", x, cos), self.g.op("Mul", rotated, sin))

    def attention(self, x: str, layer: int, cos: str, sin: str, valid: str) -> str:
        g, cfg = self.g, self.cfg
        p = f"pre_transformer.layers.{layer}.self_attn"
        hd, W, heads = cfg.head_dim, cfg.sliding_window, cfg.num_heads  # kv heads == heads (Checkpoint checks)

        def split_heads(y: str) -> str:  # [B, N, h*hd] -> [B, h, N, hd]
            return g.op("Transpose", g.op("Reshape", y, g.const([0, 0, -1, hd])), perm=[0, 2, 1, 3])

        q = self.rope(split_heads(self.linear(x, p + ".q_proj", bias=False)), cos, sin)
        k = self.rope(split_heads(self.linear(x, p + ".k_proj", bias=False)), cos, sin)
        v = split_heads(self.linear(x, p + ".v_proj", bias=False))
        kv = []
        for name, new in ((f"k{layer}", k), (f"v{layer}", v)):
            cache = self.state(name, (heads, W - 1, hd))
            full = g.op("Concat", cache, new, axis=2)  # [B, heads, W-1+N, hd]
            self.new_states[name] = self.tail(full, W - 1, axis=2)
            kv.append(full)
        scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", kv[0], perm=[0, 1, 3, 2])), g.const(hd ** -0.5))
        probs = g.op("Softmax", g.op("Where", valid, scores, g.const(-np.inf)), axis=-1)
        out = g.op("Transpose", g.op("MatMul", probs, kv[1]), perm=[0, 2, 1, 3])
        out = g.op("Reshape", out, g.const([0, 0, heads * hd]))
        return self.linear(out, p + ".o_proj", bias=False)

    def transformer(self, x: str, pos: str, n: str) -> str:
        """[B, N, latent] -> [B, N, latent]: input_proj, sliding-window layers, norm, output_proj."""
        g, cfg = self.g, self.cfg
        cos, sin, valid = self.positions(pos, n)
        h = self.linear(x, "pre_transformer.input_proj")
        for i in range(cfg.num_layers):
            p = f"pre_transformer.layers.{i}"
            a = self.attention(g.rms_norm(h, self.w(p + ".input_layernorm.weight"), cfg.rms_norm_eps,
                                          f"decoder.{p}.input_layernorm.weight"), i, cos, sin, valid)
            h = g.op("Add", h, g.op("Mul", a, self.init(p + ".self_attn_layer_scale.scale")))
            m = g.rms_norm(h, self.w(p + ".post_attention_layernorm.weight"), cfg.rms_norm_eps,
                           f"decoder.{p}.post_attention_layernorm.weight")
            m = self.linear(g.op("Mul", g.silu(self.linear(m, p + ".mlp.gate_proj", bias=False)),
                                 self.linear(m, p + ".mlp.up_proj", bias=False)), p + ".mlp.down_proj", bias=False)
            h = g.op("Add", h, g.op("Mul", m, self.init(p + ".mlp_layer_scale.scale")))
        h = g.rms_norm(h, self.w("pre_transformer.norm.weight"), cfg.rms_norm_eps,
                       "decoder.pre_transformer.norm.weight")
        return self.linear(h, "pre_transformer.output_proj")

    def convnext(self, x: str, prefix: str, state: str) -> str:
        """ConvNeXt block on [B, C, L]: causal depthwise k7, LayerNorm, MLP with exact GELU, gamma, residual."""
        g = self.g
        channels = self.w(prefix + ".dwconv.conv.weight").shape[0]
        y = self.causal_conv(x, prefix + ".dwconv", state, groups=channels)
        y = g.op("Transpose", y, perm=[0, 2, 1])
        y = g.op("LayerNormalization", y, self.init(prefix + ".norm.weight"), self.init(prefix + ".norm.bias"),
                 axis=-1, epsilon=1e-6)
        y = self.linear(y, prefix + ".pwconv1")
        y = g.op("Mul", g.op("Mul", y, g.const(0.5)),
                 g.op("Add", g.op("Erf", g.op("Mul", y, g.const(1 / np.sqrt(2)))), g.const(1.0)))
        y = g.op("Mul", self.linear(y, prefix + ".pwconv2"), self.init(prefix + ".gamma"))
        return g.op("Add", x, g.op("Transpose", y, perm=[0, 2, 1]))

    def decoder_block(self, x: str, n: int, rate: int) -> str:
        p = f"decoder.{n + 1}.block"
        x = self.trans_conv(self.snake(x, p + ".0"), p + ".1", rate, f"b{n}_tc")
        for u, dilation in enumerate((1, 3, 9)):
            q = f"{p}.{u + 2}"
            y = self.causal_conv(self.snake(x, q + ".act1"), q + ".conv1", f"b{n}_ru{u}", dilation=dilation)
            y = self.causal_conv(self.snake(y, q + ".act2"), q + ".conv2", None)
            x = self.g.op("Add", x, y)
        return x

    # -- whole graph -----------------------------------------------------------------------
    def build(self) -> onnx.ModelProto:
        g, cfg = self.g, self.cfg
        codes = g.input("codes", np.int64, ["B", "N", cfg.num_quantizers])
        pos = self.state("pos", (), np.int64)
        n = g.op("Gather", g.op("Shape", codes), g.const(1), axis=0)  # scalar N

        z = self.dequantize(g.op("Max", codes, g.const(0)))  # [B, N, codebook_dim]
        h = self.causal_conv(g.op("Transpose", z, perm=[0, 2, 1]), "pre_conv", "pre_conv")
        h = self.transformer(g.op("Transpose", h, perm=[0, 2, 1]), pos, n)
        h = g.op("Transpose", h, perm=[0, 2, 1])  # [B, latent, N]
        for j, factor in enumerate(cfg.upsampling_ratios):
            h = self.trans_conv(h, f"upsample.{j}.0", factor, f"up{j}_tc")
            h = self.convnext(h, f"upsample.{j}.1", f"up{j}_dw")
        h = self.causal_conv(h, "decoder.0", "dec0")
        for n_block, rate in enumerate(cfg.upsample_rates):
            h = self.decoder_block(h, n_block, rate)
        last = len(cfg.upsample_rates) + 1
        h = self.snake(h, f"decoder.{last}")
        h = self.causal_conv(h, f"decoder.{last + 1}", "final")  # [B, 1, N*upsample]
        wav = g.op("Reshape", g.op("Clip", h, g.const(-1.0), g.const(1.0)), g.const([0, -1]))
        self.new_states["pos"] = g.op("Add", pos, n)

        g.output(wav, "wav", "float", ["B", "S"])
        for spec in self.states:
            g.output(self.new_states[spec.name], f"out_{spec.name}",
                     "float" if spec.dtype == self.float_name else np.dtype(spec.dtype), ["B", *spec.shape])
        metadata = {
            "states": json.dumps([asdict(s) for s in self.states]),
            "samples_per_frame": str(cfg.samples_per_frame),
            "sample_rate": str(cfg.sample_rate),
            "num_quantizers": str(cfg.num_quantizers),
            "codebook_size": str(cfg.codebook_size),
            "sliding_window": str(cfg.sliding_window),
            "config": json.dumps(asdict(cfg)),  # every size and constant: ggml/streaming_codec.py rebuilds the graph
        }
        return g.model(metadata, doc="Qwen3-TTS 12 Hz codec decoder, stateful streaming (see codec_graph.py)")


def build_codec_decoder(ckpt: Checkpoint, float_type=np.float32, snake_sin: bool | None = None) -> onnx.ModelProto:
    """The streaming codec decoder of `ckpt` as an opset-17 ONNX model (weights embedded).

    float_type np.float64 builds the same graph in double precision (for `onnx.reference`;
    ONNX Runtime's CPU provider has no double Conv). The Snake activations use `Sin` in that graph
    (the exact proof) and the polynomial `sin_pi_squared` otherwise, unless `snake_sin` says."""
    if snake_sin is None:
        snake_sin = np.dtype(float_type) == np.float64
    return _CodecBuilder(ckpt, float_type, snake_sin).build()


def state_specs(model: onnx.ModelProto) -> list[StateSpec]:
    """The state tensors recorded in a built model's metadata (pos first)."""
    meta = {p.key: p.value for p in model.metadata_props}
    return [StateSpec(d["name"], tuple(d["shape"]), d["dtype"]) for d in json.loads(meta["states"])]
