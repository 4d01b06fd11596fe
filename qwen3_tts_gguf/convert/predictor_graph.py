"""The code predictor (codebooks 1..15 of a frame) as one ONNX graph, sampling included.

One call = one frame: the 15 autoregressive steps are unrolled, each step attends to the K/V
rows of the steps before it (a KV cache held as graph values, at most 16 rows; positions restart
at 0 every frame), and each step samples its code inside the graph (`qwen3_tts_gguf.model.sampler`
documents the semantics; `sampler.sample` is the numpy twin of `_sample` below).

Inputs (B dynamic): hidden f[B,H] (talker post-norm hidden state that produced code0),
code0 i64[B], rand f[B,15] (one uniform [0,1) per step), temperature f[B], top_k i64[B] (0 = off),
top_p f[B], greedy bool[B] (argmax of the raw logits; temperature/top-k/top-p then unused).
Outputs: codes i64[B,15] (codebooks 1..15), frame_embedding f[B,H] (talker codec_embedding[code0]
+ the 15 code-predictor embeddings of codes 1..15: the next talker input row minus its text part),
logits f[B,15,V] (raw lm_head logits of each step).
Teacher-forced variant (tests): also forced_codes i64[B,15], which replace the drawn codes as the
step inputs and in frame_embedding; `codes` still reports each step's draw.
Cost: sampling sorts only the head of each row, but a sampling row with top-k off (0) makes
the whole batch sort the full vocabulary at every step.
"""

from __future__ import annotations

import numpy as np
import onnx

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.onnx_builder import GraphBuilder
from qwen3_tts_gguf.convert.presets import CP_BLOCK_SIZE, CP_BLOCK_SIZES, CP_PRECISIONS

NUM_STEPS = 15  # codebooks 1..15
ROPE_NODE = "rope_rotation"  # MatMuls by constant rotations: exact in fp32, never quantized
INPUTS = ("hidden", "code0", "rand", "temperature", "top_k", "top_p", "greedy")
ATTENTIONS = ("matmul", "gqa", "standard")
STANDARD_ATTENTION_OPSET = 23  # Attention and RotaryEmbedding
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}
"""The weights `_Stack.matmuls` registers side by side (they read one input), by the name it gives them."""


def rope_tables(head_dim: int, theta: float, positions: np.ndarray, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """NeoX cos/sin [len(positions), head_dim] computed like HF (in `dtype`)."""
    inv_freq = (1.0 / (dtype(theta) ** (np.arange(0, head_dim, 2, dtype=dtype) / dtype(head_dim)))).astype(dtype)
    freqs = positions.astype(dtype)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


class _Stack:
    """Builds Qwen3 decoder layers whose weights are registered once and shared by every step."""

    def __init__(self, b: GraphBuilder, weights, prefix: str, cfg, fuse: bool = True, attention: str = "matmul"):
        self.b, self.w, self.prefix, self.cfg, self.fuse, self.attention = b, weights, prefix, cfg, fuse, attention
        self._names: dict[str, str] = {}

    def param(self, name: str, transpose: bool = False) -> str:
        if name not in self._names:
            arr = np.asarray(self.w[name])
            self._names[name] = self.b.weight(name, np.ascontiguousarray(arr.T) if transpose else arr)
        return self._names[name]

    def matmul(self, x: str, name: str) -> str:
        """x @ W.T for a Linear weight `name` [out, in]."""
        return self.b.op("MatMul", x, self.param(name, transpose=True))

    def matmuls(self, x: str, names: list[str], fused: str) -> list[str]:
        """x @ W.T for several Linear weights that read the same x: one MatMul by their outputs side by
        side (registered as `fused`), split again. Quantized, that is one MatMulNBits: the activation is
        quantized once and the thread pool woken once instead of once per weight (one frame at the 0.6B
        shape: 6 % less time, median of 15 alternating rounds, the same int8 codes and embeddings to the
        bit); each output column keeps its own blocks."""
        if not self.fuse:
            return [self.matmul(x, n) for n in names]
        if fused not in self._names:
            arrays = [np.asarray(self.w[n]) for n in names]
            self._names[fused] = self.b.weight(fused, np.ascontiguousarray(np.concatenate(arrays).T))
        sizes = [int(self.w.shape_of(n)[0]) for n in names]
        return self.b.op("Split", self.b.op("MatMul", x, self._names[fused]), self.b.const(sizes), axis=-1,
                         outputs=len(names))

    def fused(self, x: str, layer: str, name: str) -> list[str]:
        """`matmuls` of the weights FUSED[name] of `layer`, registered as `layer`.`name`.weight."""
        return self.matmuls(x, [f"{layer}.{part}.weight" for part in FUSED[name]], f"{layer}.{name}.weight")

    def rms_norm(self, x: str, name: str) -> str:
        return self.b.rms_norm(x, self.param(name), self.cfg.rms_norm_eps)

    def rope(self, x: str, positions: list[int]) -> str:
        """NeoX rotary embedding of x [B,T,heads,hd] at `positions`, as one MatMul per step.

        x*cos + rotate_half(x)*sin is linear in x with constant coefficients per position, so
        each position's rotation is an [hd,hd] matrix with two non-zeros per column."""
        hd, half = self.cfg.head_dim, self.cfg.head_dim // 2
        cos, sin = rope_tables(hd, self.cfg.rope_theta, np.array(positions), self.b.float_type)
        rotate = np.zeros((hd, hd), self.b.float_type)  # x @ rotate == concat(-x2, x1)
        rotate[np.arange(half) + half, np.arange(half)] = -1
        rotate[np.arange(half), np.arange(half) + half] = 1
        b = self.b
        rotations = [b.const(np.diag(c) + rotate * s[None, :]) for c, s in zip(cos, sin)]
        if len(positions) == 1:
            return b.op("MatMul", x, rotations[0], name=b.fresh(ROPE_NODE))
        rows = b.op("Split", x, b.const([1] * len(positions)), axis=1, outputs=len(positions))
        return b.op("Concat", *[b.op("MatMul", r, m, name=b.fresh(ROPE_NODE)) for r, m in zip(rows, rotations)],
                    axis=1)

    def layer(self, i: int, x: str, cache: list, positions: list[int]) -> str:
        """One decoder layer on rows x [B,T,D] at `positions`; appends this step's K/V to cache[i]."""
        b, c = self.b, self.cfg
        p = f"{self.prefix}.layers.{i}"
        T = len(positions)

        a = self.rms_norm(x, f"{p}.input_layernorm.weight")
        q, k, v = self.fused(a, p, "self_attn.qkv_proj")
        q = self.rms_norm(b.op("Reshape", q, b.const([0, T, c.num_heads, c.head_dim])), f"{p}.self_attn.q_norm.weight")
        k = self.rms_norm(b.op("Reshape", k, b.const([0, T, c.num_kv_heads, c.head_dim])),
                          f"{p}.self_attn.k_norm.weight")
        attend = {"matmul": self.attention_matmul, "gqa": self.attention_gqa,
                  "standard": self.attention_standard}[self.attention]
        x = b.op("Add", x, self.matmul(attend(q, k, v, i, cache, positions), f"{p}.self_attn.o_proj.weight"))

        h = self.rms_norm(x, f"{p}.post_attention_layernorm.weight")
        gate, up = self.fused(h, p, "mlp.gate_up_proj")
        act = b.op("Mul", b.silu(gate), up)
        return b.op("Add", x, self.matmul(act, f"{p}.mlp.down_proj.weight"))

    def attention_matmul(self, q: str, k: str, v: str, i: int, cache: list, positions: list[int]) -> str:
        """Attention of normed q [B,T,heads,hd] and k [B,T,kv,hd], v [B,T,kv*hd] in standard ops (every
        execution provider has them): rotary MatMuls, the cache as Concats, MatMul, Softmax, MatMul.
        Returns [B,T,heads*hd]."""
        b, c = self.b, self.cfg
        T, g = len(positions), c.num_heads // c.num_kv_heads
        q, k = self.rope(q, positions), self.rope(k, positions)
        v = b.op("Reshape", v, b.const([0, T, c.num_kv_heads, c.head_dim]))
        k = b.op("Transpose", k, perm=[0, 2, 1, 3])  # [B,kv,T,hd]
        v = b.op("Transpose", v, perm=[0, 2, 1, 3])
        if cache[i] is not None:
            k = b.op("Concat", cache[i][0], k, axis=2)
            v = b.op("Concat", cache[i][1], v, axis=2)
        cache[i] = (k, v)
        S = positions[-1] + 1

        # GQA: q head h reads kv head h // g, so heads group as [kv, g] and rows as (g, T)
        q = b.op("Reshape", b.op("Transpose", q, perm=[0, 2, 1, 3]), b.const([0, c.num_kv_heads, g * T, c.head_dim]))
        scores = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])), b.const(c.head_dim ** -0.5))
        if T > 1:
            row_pos = np.tile(np.array(positions), g)[:, None]
            mask = np.where(np.arange(S)[None, :] > row_pos, -np.inf, 0.0)
            scores = b.op("Add", scores, b.const(mask))
        attn = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)  # [B,kv,g*T,hd]
        attn = b.op("Reshape", attn, b.const([0, c.num_heads, T, c.head_dim]))
        return b.op("Reshape", b.op("Transpose", attn, perm=[0, 2, 1, 3]), b.const([0, T, c.num_heads * c.head_dim]))

    def attention_gqa(self, q: str, k: str, v: str, i: int, cache: list, positions: list[int]) -> str:
        """The same attention as one GroupQueryAttention node (ONNX Runtime's contrib op, rotary and
        cache inside): a fifth fewer nodes. Not the converter's graph: its CPU kernel takes float32 but
        CUDA's does not, and the gain stayed within the engine's noise (0.6B int8, one frame alone 58.5 ->
        53.3 ms, median of 10; in the engine 69 -> 69 ms per frame, `python -m bench.experiments graphs`,
        2026-12-02 06:27)."""
        b, c = self.b, self.cfg
        T, S = len(positions), positions[-1] + 1
        cos, sin, batch = self._rotary_tables(q)
        if f"gqa_seqlens_{S}" not in self._names:  # per row: the cache's length after this step, minus 1
            self._names[f"gqa_seqlens_{S}"] = b.op("Expand", b.const([S - 1], np.int32), batch)
        q = b.op("Reshape", q, b.const([0, T, c.num_heads * c.head_dim]))
        k = b.op("Reshape", k, b.const([0, T, c.num_kv_heads * c.head_dim]))
        past = cache[i] or (None, None)
        attn, *cache[i] = b.op(
            "GroupQueryAttention", q, k, v, *past, self._names[f"gqa_seqlens_{S}"], b.const(S, np.int32),
            cos, sin, outputs=3, domain="com.microsoft", num_heads=c.num_heads, kv_num_heads=c.num_kv_heads,
            do_rotary=1, rotary_interleaved=0, scale=float(c.head_dim ** -0.5))
        return attn

    def attention_standard(self, q: str, k: str, v: str, i: int, cache: list, positions: list[int]) -> str:
        """The same attention as opset 23's standard ops: two RotaryEmbedding nodes and one Attention
        (past and present key/value inside, causal on the two-row first step): the CPU's graph
        (manifest.PREDICTOR_CPU_FILE), 3048 -> 2292 nodes after ONNX Runtime's fusions. 0.6B int8, one frame
        alone 70.8 -> 66.4 ms, eight rows 162 -> 147 (median of 12); in the engine (`python -m
        bench.experiments graphs`, four runs 2026-12-02 08:28-08:52) RTF 1.95 -> 1.79, 1.95 -> 1.76,
        1.97 -> 1.91, 1.89 -> 1.80 and the eight-stream call 4-10 % shorter. Not the portable graph: other
        devices' providers may lack these kernels and would run the nodes on the CPU."""
        b, c = self.b, self.cfg
        T = len(positions)
        cos, sin, batch = self._rotary_tables(q)
        if f"std_positions_{positions[0]}_{T}" not in self._names:
            self._names[f"std_positions_{positions[0]}_{T}"] = b.op(
                "Expand", b.const([positions]), b.op("Concat", batch, b.const([T]), axis=0))  # [B,T]
        at = self._names[f"std_positions_{positions[0]}_{T}"]
        q = b.op("RotaryEmbedding", b.op("Reshape", q, b.const([0, T, c.num_heads * c.head_dim])), cos, sin, at,
                 num_heads=c.num_heads)
        k = b.op("RotaryEmbedding", b.op("Reshape", k, b.const([0, T, c.num_kv_heads * c.head_dim])), cos, sin, at,
                 num_heads=c.num_kv_heads)
        past = cache[i] or (None, None)
        causal = {"is_causal": 1} if T > 1 else {}
        attn, *cache[i] = b.op("Attention", q, k, v, None, *past, outputs=3, q_num_heads=c.num_heads,
                               kv_num_heads=c.num_kv_heads, scale=float(c.head_dim ** -0.5), **causal)
        return attn

    def _rotary_tables(self, q: str) -> tuple[str, str, str]:
        """cos, sin [NUM_STEPS + 1, head_dim / 2] of every position a frame uses, and the batch size [1]
        (read from `q`), for the fused attentions."""
        b, c = self.b, self.cfg
        if "rotary_batch" not in self._names:
            cos, sin = rope_tables(c.head_dim, c.rope_theta, np.arange(NUM_STEPS + 1), b.float_type)
            self._names["rotary_cos"], self._names["rotary_sin"] = (b.const(t[:, :c.head_dim // 2]) for t in (cos, sin))
            self._names["rotary_batch"] = b.op("Slice", b.op("Shape", q), b.const([0]), b.const([1]))
        return self._names["rotary_cos"], self._names["rotary_sin"], self._names["rotary_batch"]


def _sample(b: GraphBuilder, logits: str, rand_col: str, temperature: str, k_index: str, sort_k: str,
            one_minus_p: str, greedy: str) -> str:
    """One code per row from logits [B,V]; see `qwen3_tts_gguf.model.sampler` for the semantics.

    Sorts only the head of each row: first the batch's widest top-k (`sort_k`; V when a sampling
    row has top-k off) to find each row's k-th logit, then as many as the widest row keeps once
    ties with its k-th logit are counted. Everything past that head is filtered out anyway.
    """
    neg_inf, last_axis = b.const(-np.inf), b.const([-1])
    argmax = b.op("ArgMax", logits, axis=-1, keepdims=1)  # first index on ties, as torch
    scaled = b.op("Div", logits, temperature)
    head = b.op("TopK", scaled, sort_k, axis=-1, largest=1, sorted=1, outputs=2)[0]
    kth = b.op("GatherElements", head, k_index, axis=1)
    n_top = b.op("ReduceSum", b.op("Cast", b.op("GreaterOrEqual", scaled, kth), to=onnx.TensorProto.INT64),
                 last_axis, keepdims=1)
    width = b.op("Reshape", b.op("ReduceMax", n_top, keepdims=0), b.const([1]))
    # ONNX TopK puts equal values lower index first: the draw order is deterministic
    scaled, order = b.op("TopK", scaled, width, axis=-1, largest=1, sorted=1, outputs=2)
    scaled = b.op("Where", b.op("GreaterOrEqual", scaled, kth), scaled, neg_inf)
    suffix = b.op("CumSum", b.op("Softmax", scaled, axis=-1), b.const(np.array(-1)), reverse=1)
    kept = b.op("ReduceSum", b.op("Cast", b.op("Greater", suffix, one_minus_p), to=onnx.TensorProto.INT64),
                last_axis, keepdims=1)
    last = b.op("Sub", b.op("Max", kept, b.const([1])), b.const([1]))
    last_kept = b.op("GatherElements", scaled, last, axis=1)
    scaled = b.op("Where", b.op("GreaterOrEqual", scaled, last_kept), scaled, neg_inf)
    cdf = b.op("CumSum", b.op("Softmax", scaled, axis=-1), b.const(np.array(-1)))
    u = b.op("Mul", rand_col, b.op("Slice", cdf, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1])))
    below = b.op("ReduceSum", b.op("Cast", b.op("LessOrEqual", cdf, u), to=onnx.TensorProto.INT64),
                 last_axis, keepdims=1)
    n_kept = b.op("ReduceSum", b.op("Cast", b.op("Greater", scaled, neg_inf), to=onnx.TensorProto.INT64),
                  last_axis, keepdims=1)
    pos = b.op("Min", below, b.op("Sub", n_kept, b.const([1])))
    drawn = b.op("GatherElements", order, pos, axis=1)
    return b.op("Where", greedy, argmax, drawn)  # [B,1]


def _row_settings(b: GraphBuilder, temperature: str, top_k: str, top_p: str, greedy: str, vocab: int):
    """Per-row sampling inputs [B] -> the [B,1] values `_sample` takes after logits and rand."""
    col = b.const([1])
    greedy = b.op("Unsqueeze", greedy, col)
    temperature = b.op("Where", greedy, b.const(1.0), b.op("Unsqueeze", temperature, col))
    top_k = b.op("Unsqueeze", top_k, col)
    off = b.op("Or", b.op("LessOrEqual", top_k, b.const(0)), b.op("GreaterOrEqual", top_k, b.const(vocab)))
    # greedy rows ignore their draw: k 1 keeps them from widening the batch's sort
    k_eff = b.op("Where", greedy, b.const(1), b.op("Where", off, b.const(vocab), top_k))
    sort_k = b.op("Reshape", b.op("ReduceMax", k_eff, keepdims=0), col)  # [1]: TopK's K
    one_minus_p = b.op("Sub", b.const(1.0), b.op("Unsqueeze", top_p, col))
    return temperature, b.op("Sub", k_eff, b.const(1)), sort_k, one_minus_p, greedy


def build_sampler(vocab: int, float_type=np.float32) -> onnx.ModelProto:
    """The in-graph sampler alone: logits f[B,V], rand f[B], temperature, top_k, top_p, greedy -> code i64[B]."""
    b = GraphBuilder("sampler", float_type)
    logits, rand = b.input("logits", "float", ["B", vocab]), b.input("rand", "float", ["B"])
    settings = _row_settings(b, b.input("temperature", "float", ["B"]), b.input("top_k", np.int64, ["B"]),
                             b.input("top_p", "float", ["B"]), b.input("greedy", np.bool_, ["B"]), vocab)
    code = _sample(b, logits, b.op("Unsqueeze", rand, b.const([1])), *settings)
    b.output(b.op("Squeeze", code, b.const([1])), "code", np.int64, ["B"])
    return b.model({"kind": "sampler", "vocab": vocab})


def build_code_predictor(ckpt: Checkpoint, float_type=np.float32, teacher_forced: bool = False,
                         fuse: bool = True, attention: str = "matmul") -> onnx.ModelProto:
    """The code predictor of `ckpt` as one per-frame ONNX graph (opset 17: every device's); see the module
    doc. `attention="standard"` makes each layer's attention opset 23's RotaryEmbedding and Attention (the
    CPU's graph, manifest.PREDICTOR_CPU_FILE). For the bench's comparisons (`bench.experiments graphs`):
    `fuse=False` keeps q, k, v and gate, up as separate MatMuls; `attention="gqa"` makes each layer's
    attention one GroupQueryAttention node."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    cfg, w = ckpt.config, ckpt.weights
    cp, H = cfg.code_predictor, cfg.talker.hidden_size
    vocab = int(w.shape_of("talker.code_predictor.lm_head.0.weight")[0])
    b = GraphBuilder("code_predictor" + ("_teacher_forced" if teacher_forced else ""), float_type,
                     **({"opset": STANDARD_ATTENTION_OPSET} if attention == "standard" else {}))
    stack = _Stack(b, w, "talker.code_predictor.model", cp, fuse, attention)

    hidden = b.input("hidden", "float", ["B", H])
    code0 = b.input("code0", np.int64, ["B"])
    rand = b.input("rand", "float", ["B", NUM_STEPS])
    temperature = b.input("temperature", "float", ["B"])
    top_k = b.input("top_k", np.int64, ["B"])
    top_p = b.input("top_p", "float", ["B"])
    greedy = b.input("greedy", np.bool_, ["B"])
    forced = b.input("forced_codes", np.int64, ["B", NUM_STEPS]) if teacher_forced else None

    settings = _row_settings(b, temperature, top_k, top_p, greedy, vocab)
    col = b.const([1])

    def project(rows: str) -> str:  # small_to_mtp_projection, identity when the widths agree
        if not cfg.has_mtp_projection:
            return rows
        y = stack.matmul(rows, "talker.code_predictor.small_to_mtp_projection.weight")
        return b.op("Add", y, stack.param("talker.code_predictor.small_to_mtp_projection.bias"))

    def embed(table: str, ids: str) -> str:  # ids [B] -> rows [B,H]
        return b.op("Gather", stack.param(table), ids, axis=0)

    def column(x: str, j: int) -> str:  # x[:, j:j+1]
        return b.op("Slice", x, b.const([j]), b.const([j + 1]), b.const([1]))

    frame = embed("talker.model.codec_embedding.weight", code0)
    rows = b.op("Concat", b.op("Unsqueeze", hidden, col), b.op("Unsqueeze", frame, col), axis=1)  # [B,2,H]
    positions = [0, 1]
    cache: list = [None] * cp.num_layers
    codes, logits = [], []
    for j in range(NUM_STEPS):  # the last step's `rows` feed nothing: its code only joins the frame
        x = project(rows)
        for i in range(cp.num_layers):
            x = stack.layer(i, x, cache, positions)
        if len(positions) > 1:
            x = b.op("Slice", x, b.const([-1]), b.const([len(positions)]), b.const([1]))
        x = b.op("Squeeze", stack.rms_norm(x, "talker.code_predictor.model.norm.weight"), col)  # [B,D]
        step_logits = stack.matmul(x, f"talker.code_predictor.lm_head.{j}.weight")  # [B,V]
        logits.append(b.op("Unsqueeze", step_logits, col))
        code = _sample(b, step_logits, column(rand, j), *settings)
        codes.append(code)
        fed = b.op("Squeeze", column(forced, j) if teacher_forced else code, col)  # [B]
        emb = embed(f"talker.code_predictor.model.codec_embedding.{j}.weight", fed)
        frame = b.op("Add", frame, emb)
        rows, positions = b.op("Unsqueeze", emb, col), [positions[-1] + 1]  # the next step's input

    b.output(b.op("Concat", *codes, axis=1), "codes", np.int64, ["B", NUM_STEPS])
    b.output(frame, "frame_embedding", "float", ["B", H])
    b.output(b.op("Concat", *logits, axis=1), "logits", "float", ["B", NUM_STEPS, vocab])
    meta = {"kind": "code_predictor", "num_steps": NUM_STEPS, "hidden_size": H, "vocab": vocab,
            "teacher_forced": int(teacher_forced), "mtp_projection": int(cfg.has_mtp_projection)}
    return b.model(meta, doc=__doc__.strip().splitlines()[0])


# Weight-only quantization of the code predictor's MatMuls (ONNX Runtime's MatMulNBits): the code
# predictor reads its ~80 M weights 15 times per frame, so it is bandwidth-bound and narrower
# weights are proportionally faster. fp32 stays the parity precision.
_NBITS = {"int8": 8, "int4": 4}
NBITS_ACCURACY_LEVEL = 4  # int8 activations: ORT's fastest CPU kernels (AVX-512 VNNI / AVX2)


def _sources(weight: str) -> tuple[str, ...]:
    """The checkpoint weights a graph weight is made of (several for a fused one)."""
    for fused, parts in FUSED.items():
        if weight.endswith(f".{fused}.weight"):
            return tuple(weight.replace(fused, part) for part in parts)
    return (weight,)


def quantize_code_predictor(model: onnx.ModelProto, precision: str, block_size: int = CP_BLOCK_SIZE,
                            keep: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """The graph with every constant-weight MatMul as MatMulNBits (symmetric, `block_size` weights per
    scale), but those of the checkpoint weights `keep`: fp32 MatMuls, their inputs never quantized
    (`convert/precision/activation_ranges.py`)."""
    if precision not in CP_PRECISIONS:
        raise ValueError(f"unknown code predictor precision {precision!r}; choose {', '.join(CP_PRECISIONS)}")
    if block_size not in CP_BLOCK_SIZES:
        raise ValueError(f"code predictor block size must be one of {CP_BLOCK_SIZES}, got {block_size}")
    if precision == "fp32":
        return model
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    excluded = [n.name for n in model.graph.node if n.name.startswith(ROPE_NODE)
                or (n.op_type == "MatMul" and not keep.isdisjoint(_sources(n.input[1])))]
    quantizer = MatMulNBitsQuantizer(model, bits=_NBITS[precision], block_size=block_size,
                                     is_symmetric=True, accuracy_level=NBITS_ACCURACY_LEVEL,
                                     nodes_to_exclude=excluded)
    quantizer.process()
    quantized = _half_tables(quantizer.model.model)
    for key, value in (("precision", precision), ("block_size", str(block_size))):
        entry = quantized.metadata_props.add()
        entry.key, entry.value = key, value
    return quantized


def quantize_code_predictors(graphs: list[onnx.ModelProto], precision: str, block_size: int = CP_BLOCK_SIZE,
                             keep: frozenset[str] = frozenset()) -> list[onnx.ModelProto]:
    """Graphs of one code predictor (the same weights, attention written differently) each quantized as
    `quantize_code_predictor` does, every weight once: ONNX Runtime's quantizer takes the first graph,
    and in the others each MatMul of a weight it quantized becomes a copy of its MatMulNBits node (0.6B
    int8, the converter's two graphs built and quantized: 27.7 s one by one, 14.2 s together)."""
    first, *rest = graphs
    # each MatMul's weight and name, read before the quantizer rewrites the graph
    source = {n.output[0]: (n.input[1], n.name) for n in first.graph.node if n.op_type == "MatMul"}
    quantized = quantize_code_predictor(first, precision, block_size, keep)
    if precision == "fp32":
        return [quantized, *rest]
    done = {}  # weight name -> (its MatMulNBits node, the suffix the quantizer added to the MatMul's name)
    for node in quantized.graph.node:
        if node.op_type == "MatMulNBits" and node.output[0] in source:
            weight, name = source[node.output[0]]
            done[weight] = (node, node.name.removeprefix(name))
    packed = {t.name: t for t in quantized.graph.initializer}
    # what the copies leave unquantized, if anything, the quantizer still takes
    return [quantized, *(quantize_code_predictor(_reuse_quantized(g, done, packed), precision, block_size, keep)
                         for g in rest)]


def _reuse_quantized(model: onnx.ModelProto, done: dict, packed: dict) -> onnx.ModelProto:
    """`model` with each MatMul by a weight of `done` (weight name -> its MatMulNBits node and the suffix the
    quantizer gave that node's name) as a copy of that node on the MatMul's input, output and name; `packed`
    holds the quantized initializers by name."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes, used = [], set()
    for node in graph.node:
        template, suffix = done.get(node.input[1], (None, "")) if node.op_type == "MatMul" else (None, "")
        weight = weights.get(node.input[1]) if template is not None else None
        if weight is None or tuple(weight.dims) != _matmul_shape(template):
            nodes.append(node)
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(template)
        copy.input[0], copy.output[0], copy.name = node.input[0], node.output[0], node.name + suffix
        nodes.append(copy)
        used.update(i for i in template.input[1:] if i)
    del graph.node[:]
    graph.node.extend(nodes)
    consumed = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in consumed]
    del graph.initializer[:]
    graph.initializer.extend(kept + [packed[name] for name in sorted(used)])
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return model


def _matmul_shape(node: onnx.NodeProto) -> tuple[int, int]:
    """(K, N) of a MatMulNBits node: the float weight it replaced was [K, N]."""
    attrs = {a.name: a.i for a in node.attribute}
    return attrs["K"], attrs["N"]


def _half_tables(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each embedding table (a Gather of a float initializer) stored in float16, its rows cast back to
    float32 after the lookup: half the file and, once eight streams have read every row, half the
    resident pages (0.6B: 132 -> 66 MiB), for a rounding error far below the quantized MatMuls' (none for
    a bfloat16 checkpoint's values, which float16 holds exactly unless they are tiny or huge)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    tables = {t.name: t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        if node.op_type != "Gather" or node.input[0] not in tables:
            continue
        table = tables.pop(node.input[0])
        half = numpy_helper.from_array(numpy_helper.to_array(table).astype(np.float16), table.name + "_fp16")
        graph.initializer.remove(table)
        graph.initializer.append(half)
        rows = node.output[0]
        node.input[0], node.output[0] = half.name, rows + "_fp16"
        nodes.append(helper.make_node("Cast", [node.output[0]], [rows], to=onnx.TensorProto.FLOAT,
                                      name=(node.name or rows) + "_to_fp32"))
    del graph.node[:]
    graph.node.extend(nodes)
    return model
