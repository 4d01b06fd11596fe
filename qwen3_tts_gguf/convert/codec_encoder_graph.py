"""The 12 Hz speech tokenizer's ENCODER (wav -> codes) as one whole-clip ONNX graph.

Input `wav` float [1, N]: mono, 24 kHz (no normalisation, like the official `EncodecFeatureExtractor`).
Output `codes` int64 [T, 16] with T = ceil(N / 1920): the reference codes of an ICL voice clone,
equal to the official `Qwen3TTSTokenizer.encode(wav, sr=24000).audio_codes[0]` (a LongTensor [T, 16]).

The official encoder is transformers' `MimiModel` encode path (qwen-tts's `Qwen3TTSTokenizerV2Encoder`):

* SEANet (`MimiEncoder`): conv k7 -> per ratio in reversed(upsampling_ratios) [4, 5, 6, 8]:
  ResnetBlock (ELU, conv k3 dim->dim/2, ELU, conv k1 dim/2->dim, + x) -> ELU -> conv k=2r stride r
  (channels x2) -> ELU -> conv k3 -> hidden 512 at 25 Hz. Every `MimiConv1d` is causal: it pads
  k_eff - stride on the left (zeros, pad_mode "constant") and `(-L) mod stride` on the right (the
  "extra padding" that completes the last stride), so a layer of stride s maps L to ceil(L / s).
  Here the right pad is the static s - 1 instead: the samples past `(-L) mod s` are never read
  by any output window, so the result is identical and the graph needs no length arithmetic.
* transformer (`MimiTransformerModel`, 8 layers): LayerNorm (with bias) -> attention (RoPE theta 1e4,
  causal, no biases) -> layer scale -> residual; LayerNorm -> fc1 -> exact (erf) GELU -> fc2 ->
  layer scale -> residual. No final norm.
  Sliding window: the config says 250 frames (10 s), but with `use_cache=False` (the MimiConfig
  default, which the tokenizer keeps) transformers 4.57 builds the mask with `create_causal_mask`,
  i.e. plain causal attention over the whole clip: the window is NOT applied by the official
  code. This graph does the same by default; `sliding_window=250` in `build_codec_encoder` builds
  the windowed variant (what Mimi was trained with) for whoever wants it. The two differ only on
  clips longer than 250 frames at 25 Hz (> 10 s).
* downsample: causal conv k4 stride 2 without bias, "replicate" padding -> 12.5 Hz.
* split RVQ: semantic input_proj (k1, 512->256) -> 1 codebook -> code 0; acoustic input_proj
  applied to the SAME 512-d input -> residual VQ over the first 15 of its codebooks -> codes 1..15
  (the official model computes all 31 and keeps 16: the residual chain makes that identical).
  Nearest neighbour is Euclidean against embed = embed_sum / max(cluster_usage, 1e-5).
* trim: the official wrapper keeps ceil(N / 1920) frames, which is exactly what the convs produce.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx

from qwen3_tts_gguf.convert.checkpoint import Checkpoint, CheckpointError
from qwen3_tts_gguf.convert.onnx_builder import GraphBuilder

PREFIX = "encoder."
NUM_CODEBOOKS = 16
CODEBOOK_EPS = 1e-5

DEFAULTS = {  # transformers MimiConfig defaults (the published configs state most fields)
    "sampling_rate": 24000, "audio_channels": 1, "hidden_size": 512, "num_filters": 64,
    "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7, "last_kernel_size": 3,
    "residual_kernel_size": 3, "dilation_growth_rate": 2, "use_causal_conv": True, "pad_mode": "constant",
    "compress": 2, "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32,
    "use_conv_shortcut": False, "vector_quantization_hidden_dimension": 256, "num_semantic_quantizers": 1,
    "num_hidden_layers": 8, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8,
    "head_dim": None, "hidden_act": "gelu", "norm_eps": 1e-5, "rope_theta": 10000.0,
    "sliding_window": 250, "attention_bias": False, "frame_rate": 12.5, "rope_scaling": None,
}


class _CodecEncoderBuilder:
    def __init__(self, ckpt: Checkpoint, float_type, sliding_window: int | None):
        codec_cfg = json.loads((ckpt.path / "speech_tokenizer" / "config.json").read_text())
        enc = codec_cfg.get("encoder_config")
        if not isinstance(enc, dict):
            raise CheckpointError("speech_tokenizer/config.json has no encoder_config")
        self.cfg = {**DEFAULTS, **enc}
        if "_frame_rate" in enc and enc["_frame_rate"] is not None:
            self.cfg["frame_rate"] = enc["_frame_rate"]
        self.valid_quantizers = int(codec_cfg.get("encoder_valid_num_quantizers", NUM_CODEBOOKS))
        self.samples_per_frame = int(codec_cfg.get("encode_downsample_rate", 1920))
        self.sliding_window = sliding_window
        self.weights = ckpt.codec_weights
        self.g = GraphBuilder("qwen3_tts_codec_encoder", float_type)
        self._check()

    def _check(self) -> None:
        c = self.cfg
        problems = []
        if int(c["sampling_rate"]) != 24000 or int(c["audio_channels"]) != 1:
            problems.append(f"sampling_rate {c['sampling_rate']} / audio_channels {c['audio_channels']} "
                            "(expected 24000 / 1)")
        if not c["use_causal_conv"]:
            problems.append("use_causal_conv false")
        if c["pad_mode"] not in ("constant", "replicate"):
            problems.append(f"pad_mode {c['pad_mode']!r}")
        if c["hidden_act"] not in ("gelu",):
            problems.append(f"hidden_act {c['hidden_act']!r}")
        if c.get("rope_scaling"):
            problems.append("rope_scaling")
        if c["attention_bias"]:
            problems.append("attention_bias")
        if self.valid_quantizers != NUM_CODEBOOKS or int(c["num_semantic_quantizers"]) != 1:
            problems.append(f"{self.valid_quantizers} valid quantizers / {c['num_semantic_quantizers']} semantic "
                            f"(expected {NUM_CODEBOOKS} / 1)")
        hop = int(np.prod(c["upsampling_ratios"]))
        encodec_rate = math.ceil(int(c["sampling_rate"]) / hop)
        self.down_stride = 2
        self.down_kernel = 2 * int(encodec_rate / float(c["frame_rate"]))
        if hop * self.down_stride != self.samples_per_frame:
            problems.append(f"samples per frame {hop} x {self.down_stride} != encode_downsample_rate "
                            f"{self.samples_per_frame}")
        if problems:
            raise CheckpointError("unsupported speech tokenizer encoder: " + "; ".join(problems))

    # -- helpers ---------------------------------------------------------------------------
    def w(self, name: str) -> np.ndarray:
        key = PREFIX + name
        if key not in self.weights:
            raise CheckpointError(f"speech_tokenizer/model.safetensors has no tensor {key}")
        return np.asarray(self.weights[key], dtype=np.float32)

    def init(self, name: str) -> str:
        """The checkpoint tensor `encoder.<name>` as an initializer."""
        return self.g.weight(PREFIX + name, self.w(name))

    def has(self, name: str) -> bool:
        return PREFIX + name in self.weights

    def conv(self, x: str, name: str, stride: int = 1, dilation: int = 1, pad_mode: str | None = None) -> str:
        """MimiConv1d (causal) on [1, C, L] -> [1, C', ceil(L / stride)]; weights `<name>.conv.*`."""
        g = self.g
        weight = self.w(name + ".conv.weight")
        k = weight.shape[-1]
        left = (k - 1) * dilation + 1 - stride
        right = stride - 1
        mode = {"constant": "constant", "replicate": "edge"}[pad_mode or self.cfg["pad_mode"]]
        if left or right:
            x = g.op("Pad", x, g.const(np.array([0, 0, left, 0, 0, right], np.int64)), mode=mode)
        inputs = [x, g.weight(PREFIX + name + ".conv.weight", weight)]
        if self.has(name + ".conv.bias"):
            inputs.append(self.init(name + ".conv.bias"))
        return g.op("Conv", *inputs, kernel_shape=[k], strides=[stride], dilations=[dilation])

    def elu(self, x: str) -> str:
        return self.g.op("Elu", x, alpha=1.0)

    def linear(self, x: str, name: str, rot_heads: int = 0) -> str:
        """x @ W.T for a Linear weight [out, in]; rot_heads > 0 folds RoPE's rotate_half into W."""
        weight = self.w(name + ".weight").T  # [in, out]
        if rot_heads:
            d = weight.shape[1] // rot_heads
            cols = weight.reshape(weight.shape[0], rot_heads, d)
            # rotate_half(v) = cat(-v[d/2:], v[:d/2]) per head: a signed column permutation (exact)
            weight = np.concatenate([-cols[:, :, d // 2:], cols[:, :, :d // 2]], axis=2).reshape(weight.shape)
            name = name + ".rotated"
        return self.g.op("MatMul", x, self.g.weight(PREFIX + name + ".weight", np.ascontiguousarray(weight)))

    # -- parts -----------------------------------------------------------------------------
    def seanet(self, x: str) -> str:
        c = self.cfg
        idx = 0
        x = self.conv(x, f"encoder.layers.{idx}")
        idx += 1
        for ratio in reversed(c["upsampling_ratios"]):
            for j in range(int(c["num_residual_layers"])):
                p = f"encoder.layers.{idx}"
                h = self.conv(self.elu(x), f"{p}.block.1", dilation=int(c["dilation_growth_rate"]) ** j)
                h = self.conv(self.elu(h), f"{p}.block.3")
                residual = self.conv(x, f"{p}.shortcut") if c["use_conv_shortcut"] else x
                x = self.g.op("Add", residual, h)
                idx += 1
            idx += 1  # ELU
            x = self.conv(self.elu(x), f"encoder.layers.{idx}", stride=int(ratio))
            idx += 1
        idx += 1  # ELU
        return self.conv(self.elu(x), f"encoder.layers.{idx}")

    def rope_tables(self, t_len: str, head_dim: int) -> tuple[str, str]:
        """cos, sin [T, 1, head_dim] for positions 0..T-1 (fp32 math like HF)."""
        g = self.g
        theta = np.float32(self.cfg["rope_theta"])
        inv_freq = (1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim)))
        inv_freq = inv_freq.astype(np.float32)
        pos = g.op("Cast", g.op("Range", g.const(np.array(0, np.int64)), t_len, g.const(np.array(1, np.int64))),
                   to=onnx.TensorProto.FLOAT)
        freqs = g.op("Mul", g.op("Unsqueeze", pos, g.const(np.array([1], np.int64))),
                     g.const(inv_freq[None, :], np.float32))  # [T, hd/2]
        emb = g.op("Concat", freqs, freqs, axis=1)
        cos, sin = g.op("Cos", emb), g.op("Sin", emb)
        if g.float_type is not np.float32:
            cos = g.op("Cast", cos, to=g.float_elem)
            sin = g.op("Cast", sin, to=g.float_elem)
        axes = g.const(np.array([1], np.int64))
        return g.op("Unsqueeze", cos, axes), g.op("Unsqueeze", sin, axes)

    def attention_mask(self, t_len: str) -> str:
        """bool [T, T]: key j visible to query i iff j <= i (and j > i - W with a window)."""
        g = self.g
        r = g.op("Range", g.const(np.array(0, np.int64)), t_len, g.const(np.array(1, np.int64)))
        q = g.op("Unsqueeze", r, g.const(np.array([1], np.int64)))
        k = g.op("Unsqueeze", r, g.const(np.array([0], np.int64)))
        mask = g.op("LessOrEqual", k, q)
        if self.sliding_window:
            lowest = g.op("Sub", q, g.const(np.array(self.sliding_window, np.int64)))
            mask = g.op("And", mask, g.op("Greater", k, lowest))
        return mask

    def transformer(self, x: str, t_len: str) -> str:
        """x [1, T, D] -> [1, T, D]."""
        g, c = self.g, self.cfg
        d_model = int(c["hidden_size"])
        heads = int(c["num_attention_heads"])
        kv_heads = int(c["num_key_value_heads"])
        head_dim = int(c["head_dim"] or d_model // heads)
        cos, sin = self.rope_tables(t_len, head_dim)
        mask = self.attention_mask(t_len)
        neg_inf = g.const(-np.inf)
        scale = g.const(1.0 / math.sqrt(head_dim))
        eps = float(c["norm_eps"])

        def heads_first(v: str, n: int) -> str:  # [1, T, n*hd] -> [1, T, n, hd]
            v = g.op("Reshape", v, g.const(np.array([1, -1, n, head_dim], np.int64)))
            return v

        def rope(v: str, v_rot: str, n: int) -> str:
            v, v_rot = heads_first(v, n), heads_first(v_rot, n)  # [1, T, n, hd]
            out = g.op("Add", g.op("Mul", v, cos), g.op("Mul", v_rot, sin))
            return g.op("Transpose", out, perm=[0, 2, 1, 3])

        def repeat_kv(v: str) -> str:
            if kv_heads == heads:
                return v
            rep = heads // kv_heads
            v = g.op("Unsqueeze", v, g.const(np.array([2], np.int64)))  # [1, KV, 1, T, hd]
            v = g.op("Expand", v, g.const(np.array([1, 1, rep, 1, 1], np.int64)))
            return g.op("Reshape", v, g.const(np.array([1, heads, -1, head_dim], np.int64)))

        for i in range(int(c["num_hidden_layers"])):
            p = f"encoder_transformer.layers.{i}"
            h = g.op("LayerNormalization", x, self.init(f"{p}.input_layernorm.weight"),
                     self.init(f"{p}.input_layernorm.bias"), axis=-1, epsilon=eps)
            a = f"{p}.self_attn"
            q = rope(self.linear(h, f"{a}.q_proj"), self.linear(h, f"{a}.q_proj", rot_heads=heads), heads)
            k = rope(self.linear(h, f"{a}.k_proj"), self.linear(h, f"{a}.k_proj", rot_heads=kv_heads), kv_heads)
            v = g.op("Transpose", heads_first(self.linear(h, f"{a}.v_proj"), kv_heads), perm=[0, 2, 1, 3])
            k, v = repeat_kv(k), repeat_kv(v)
            scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), scale)
            probs = g.op("Softmax", g.op("Where", mask, scores, neg_inf), axis=-1)
            o = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])  # [1, T, H, hd]
            o = g.op("Reshape", o, g.const(np.array([1, -1, heads * head_dim], np.int64)))
            o = self.linear(o, f"{a}.o_proj")
            o = g.op("Mul", o, self.init(f"{p}.self_attn_layer_scale.scale"))
            x = g.op("Add", x, o)
            h = g.op("LayerNormalization", x, self.init(f"{p}.post_attention_layernorm.weight"),
                     self.init(f"{p}.post_attention_layernorm.bias"), axis=-1, epsilon=eps)
            h = self.linear(h, f"{p}.mlp.fc1")
            h = g.op("Mul", g.op("Mul", h, g.const(0.5)),
                     g.op("Add", g.op("Erf", g.op("Mul", h, g.const(1.0 / math.sqrt(2.0)))), g.const(1.0)))
            h = self.linear(h, f"{p}.mlp.fc2")
            h = g.op("Mul", h, self.init(f"{p}.mlp_layer_scale.scale"))
            x = g.op("Add", x, h)
        return x

    def codebook(self, q: str, k: int) -> np.ndarray:
        p = f"quantizer.{q}_residual_vector_quantizer.layers.{k}.codebook"
        embed_sum = self.w(f"{p}.embed_sum")
        usage = self.w(f"{p}.cluster_usage")
        return (embed_sum / np.maximum(usage, np.float32(CODEBOOK_EPS))[:, None]).astype(np.float32)

    def quantize(self, x: str) -> str:
        """x [T, D] -> codes int64 [T, 16]."""
        g = self.g
        codes = []
        for q, n in (("semantic", 1), ("acoustic", NUM_CODEBOOKS - 1)):
            proj = self.w(f"quantizer.{q}_residual_vector_quantizer.input_proj.weight")[:, :, 0]  # [dim, D]
            residual = g.op("MatMul", x, g.weight(f"{PREFIX}quantizer.{q}.input_proj", np.ascontiguousarray(proj.T)))
            for k in range(n):
                embed = self.codebook(q, k)  # [K, dim]
                tbl = g.weight(f"{PREFIX}quantizer.{q}.{k}.embed", embed)
                norms = g.weight(f"{PREFIX}quantizer.{q}.{k}.embed_norm2", (embed.astype(np.float64) ** 2).sum(1))
                # squared Euclidean distance up to the per-row constant |x|²: |e|² - 2 x·e
                dots = g.op("Gemm", residual, tbl, transB=1)  # [T, K]
                dist = g.op("Sub", norms, g.op("Add", dots, dots))
                idx = g.op("ArgMin", dist, axis=1, keepdims=0)  # [T], first minimum like torch
                codes.append(g.op("Unsqueeze", idx, g.const(np.array([1], np.int64))))
                if k < n - 1:
                    residual = g.op("Sub", residual, g.op("Gather", tbl, idx, axis=0))
        return g.op("Concat", *codes, axis=1)

    def build(self) -> onnx.ModelProto:
        g = self.g
        wav = g.input("wav", "float", [1, "N"])
        x = g.op("Unsqueeze", wav, g.const(np.array([1], np.int64)))  # [1, 1, N]
        x = self.seanet(x)  # [1, D, L25]
        h = g.op("Transpose", x, perm=[0, 2, 1])  # [1, L25, D]
        t_len = g.op("Squeeze", g.op("Slice", g.op("Shape", h), g.const(np.array([1], np.int64)),
                                      g.const(np.array([2], np.int64))), g.const(np.array([0], np.int64)))
        h = self.transformer(h, t_len)
        x = g.op("Transpose", h, perm=[0, 2, 1])
        if self.w("downsample.conv.weight").shape[-1] != self.down_kernel:
            raise CheckpointError(f"encoder.downsample.conv.weight has kernel "
                                  f"{self.w('downsample.conv.weight').shape[-1]}, config implies {self.down_kernel}")
        x = self.conv(x, "downsample", stride=self.down_stride, pad_mode="replicate")  # [1, D, T]
        x = g.op("Squeeze", g.op("Transpose", x, perm=[0, 2, 1]), g.const(np.array([0], np.int64)))  # [T, D]
        codes = self.quantize(x)
        g.output(codes, "codes", np.int64, ["T", NUM_CODEBOOKS])
        return g.model(
            metadata={"sample_rate": 24000, "samples_per_frame": self.samples_per_frame,
                      "num_codebooks": NUM_CODEBOOKS,
                      "attention": (f"sliding window {self.sliding_window}" if self.sliding_window
                                    else "causal, whole clip"),
                      "encoder_sliding_window_config": int(self.cfg["sliding_window"])},
            doc="Qwen3-TTS 12 Hz speech tokenizer encoder: wav [1, N] at 24 kHz -> codes [ceil(N/1920), 16]",
        )


def build_codec_encoder(ckpt: Checkpoint, float_type=np.float32, *,
                        sliding_window: int | None = None) -> onnx.ModelProto:
    """ONNX graph wav float [1, N] (24 kHz mono) -> codes int64 [ceil(N / 1920), 16].

    `sliding_window=None` (default) is plain causal attention over the whole clip, which is what
    the official transformers 4.57 code computes; an int applies that attention window instead.
    """
    return _CodecEncoderBuilder(ckpt, float_type, sliding_window).build()


__all__ = ["build_codec_encoder", "NUM_CODEBOOKS"]
