"""Plain-numpy forwards of the talker, the code predictor and the codec decoder, for self-checking
converted graphs. Float64 by default, so they serve as the truth for fp32 graphs; no torch, no onnx.

`decoder_stack` runs a talker ("talker.model") or code-predictor ("talker.code_predictor.model")
stack over a sequence of input rows with full causal attention and returns the post-final-norm
hidden states; `code_predictor_logits` builds the teacher-forced code-predictor forward on it.
`decoder_stack`, `code_predictor_logits`, `codec_upsampled` (the codec up to its vocoder) and
`decode_codes` take `observe(name, x)`, called with every matrix product's input `x` (a convolution's:
its input positions as rows) and the checkpoint name of its weight (`convert/precision/activation_ranges.py`
measures activation ranges with it).

`decode_codes(weights, cfg, codes)` is the 12 Hz codec decoder's (code2wav) whole-utterance forward:
it reads the speech tokenizer's `decoder.*` tensors directly and computes what the official
`Qwen3TTSTokenizerV2Decoder.forward` computes, independently of the ONNX graph builder: split-RVQ
dequantisation -> causal pre_conv -> sliding-window transformer -> 2x (ConvTranspose k=s + ConvNeXt)
-> decoder.0 -> DecoderBlocks (SnakeBeta, causal ConvTranspose with the last k-s samples dropped,
residual units with dilations 1, 3, 9) -> SnakeBeta -> conv -> clamp [-1, 1]. Convolutions are one
matmul per kernel tap, so the real shape decodes a few frames in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from qwen3_tts_gguf.convert.checkpoint import CodecDecoderConfig, ModelConfig, TransformerConfig

Observer = Callable[[str, np.ndarray], None]
"""observe(weight name, the input x of `x @ weight.T`); and observe("<stack>.layers.<i>.self_attn.k_cache" or
".v_cache", the keys (normed, rotated) or values [..., heads, head_dim] the layer caches)."""


def _linear(read: Callable[[str], np.ndarray], name: str, x: np.ndarray, observe: Observer | None) -> np.ndarray:
    """x @ read(name).T, `x` shown to `observe` first (rows of any leading shape as one matrix: NumPy's
    stacked product is several times slower)."""
    if observe is not None:
        observe(name, x)
    return (x.reshape(-1, x.shape[-1]) @ read(name).T).reshape(*x.shape[:-1], -1)


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) of a large negative x: inf, and x / inf the exact -0
        return x / (1.0 + np.exp(-x))


def _reader(weights: Mapping[str, np.ndarray], dtype) -> Callable[[str], np.ndarray]:
    return lambda name: np.asarray(weights[name], dtype)


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """NeoX rotate-half RoPE on x [..., T, heads, hd]."""
    hd = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos = np.cos(np.concatenate([freqs, freqs], -1))[:, None, :].astype(x.dtype)
    sin = np.sin(np.concatenate([freqs, freqs], -1))[:, None, :].astype(x.dtype)
    rotated = np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], axis=-1)
    return x * cos + rotated * sin


def decoder_stack(weights: Mapping[str, np.ndarray], prefix: str, cfg: TransformerConfig, rows: np.ndarray,
                  positions: np.ndarray | None = None, dtype=np.float64, observe: Observer | None = None) -> np.ndarray:
    """Post-final-norm hidden states [..., T, D] of the stack `prefix` for input rows [..., T, D]."""
    read = _reader(weights, dtype)

    def w(name: str) -> np.ndarray:
        return read(f"{prefix}.{name}")

    def mm(x: np.ndarray, name: str) -> np.ndarray:
        return _linear(read, f"{prefix}.{name}", x, observe)

    x = np.asarray(rows, dtype)
    T = x.shape[-2]
    positions = np.arange(T) if positions is None else np.asarray(positions)
    g, hd, eps = cfg.num_heads // cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    causal = np.where(np.arange(T)[None, :] > np.arange(T)[:, None], -np.inf, 0.0).astype(dtype)
    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        a = _rms_norm(x, w(f"{p}.input_layernorm.weight"), eps)
        q = mm(a, f"{p}.self_attn.q_proj.weight").reshape(*x.shape[:-1], cfg.num_heads, hd)
        k = mm(a, f"{p}.self_attn.k_proj.weight").reshape(*x.shape[:-1], cfg.num_kv_heads, hd)
        v = mm(a, f"{p}.self_attn.v_proj.weight").reshape(*x.shape[:-1], cfg.num_kv_heads, hd)
        q = _rope(_rms_norm(q, w(f"{p}.self_attn.q_norm.weight"), eps), positions, cfg.rope_theta)
        k = _rope(_rms_norm(k, w(f"{p}.self_attn.k_norm.weight"), eps), positions, cfg.rope_theta)
        if observe is not None:  # what the layer's KV cache holds
            observe(f"{prefix}.{p}.self_attn.k_cache", k)
            observe(f"{prefix}.{p}.self_attn.v_cache", v)
        k, v = np.repeat(k, g, axis=-2), np.repeat(v, g, axis=-2)  # GQA: head h reads kv head h // g
        scores = np.einsum("...thd,...shd->...hts", q, k) / math.sqrt(hd) + causal
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("...hts,...shd->...thd", probs, v).reshape(*x.shape[:-1], cfg.num_heads * hd)
        x = x + mm(attn, f"{p}.self_attn.o_proj.weight")
        h = _rms_norm(x, w(f"{p}.post_attention_layernorm.weight"), eps)
        gate, up = mm(h, f"{p}.mlp.gate_proj.weight"), mm(h, f"{p}.mlp.up_proj.weight")
        x = x + mm(_silu(gate) * up, f"{p}.mlp.down_proj.weight")
    return _rms_norm(x, w("norm.weight"), eps)


def code_predictor_logits(weights: Mapping[str, np.ndarray], config: ModelConfig, hidden: np.ndarray,
                          code0: int | np.ndarray, codes: Sequence[int] | np.ndarray, dtype=np.float64,
                          observe: Observer | None = None) -> np.ndarray:
    """Teacher-forced code-predictor logits [..., 15, vocab] for one frame or a batch of frames.

    hidden: the talker's post-norm hidden state [..., H] that produced code0 (an int or [...]); codes:
    codebooks 1..14 [..., 14] (a 15th is ignored) fed as the inputs of steps 2..15. Row j predicts
    codebook j+1.
    """
    cp, read = "talker.code_predictor", _reader(weights, dtype)
    code0, codes = np.asarray(code0, np.int64), np.asarray(codes, np.int64)
    rows = [hidden, weights["talker.model.codec_embedding.weight"][code0]]
    rows += [weights[f"{cp}.model.codec_embedding.{j}.weight"][codes[..., j]] for j in range(14)]
    x = np.stack([np.asarray(r, dtype) for r in rows], axis=-2)
    if config.has_mtp_projection:
        x = (_linear(read, f"{cp}.small_to_mtp_projection.weight", x, observe)
             + read(f"{cp}.small_to_mtp_projection.bias"))
    out = decoder_stack(weights, f"{cp}.model", config.code_predictor, x, dtype=dtype, observe=observe)
    return np.stack([_linear(read, f"{cp}.lm_head.{j}.weight", out[..., j + 1, :], observe)
                     for j in range(15)], axis=-2)


# -- the codec decoder -----------------------------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)
RESIDUAL_DILATIONS = (1, 3, 9)


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU; math.erf elementwise, exact to double precision."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))


def _conv(read: Callable[[str], np.ndarray], prefix: str, x: np.ndarray, observe: Observer | None,
          dilation: int = 1) -> np.ndarray:
    """The causal Conv1d `prefix`.weight/.bias on x [C_in, L], its input shown to `observe` first."""
    if observe is not None:
        observe(prefix + ".weight", x.T)
    return _causal_conv(x, read(prefix + ".weight"), read(prefix + ".bias"), dilation)


def _trans_conv(read: Callable[[str], np.ndarray], prefix: str, x: np.ndarray, stride: int,
                observe: Observer | None) -> np.ndarray:
    """The causal ConvTranspose1d `prefix`.weight/.bias on x [C_in, L], its input shown to `observe` first."""
    if observe is not None:
        observe(prefix + ".weight", x.T)
    return _causal_trans_conv(x, read(prefix + ".weight"), read(prefix + ".bias"), stride)


def _causal_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, dilation: int = 1) -> np.ndarray:
    """Stride-1 causal Conv1d on x [C_in, L] (left zero pad (k-1)*d), w [C_out, C_in, k] -> [C_out, L]."""
    k, length = w.shape[2], x.shape[1]
    xp = np.pad(x, ((0, 0), ((k - 1) * dilation, 0)))
    cols = np.stack([xp[:, j * dilation: j * dilation + length] for j in range(k)], axis=1)  # im2col [C_in, k, L]
    y = w.reshape(w.shape[0], -1) @ cols.reshape(-1, length)
    return y + b[:, None] if b is not None else y


def _depthwise_causal_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """groups=C causal conv: x [C, L], w [C, 1, k]."""
    k, length = w.shape[2], x.shape[1]
    xp = np.pad(x, ((0, 0), (k - 1, 0)))
    return sum(w[:, 0, j, None] * xp[:, j: j + length] for j in range(k)) + b[:, None]


def _causal_trans_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """ConvTranspose1d without padding (length (L-1)s+k) on x [C_in, L], w [C_in, C_out, k], then drop
    the LAST k-s samples -> [C_out, L*s]."""
    c_in, c_out, k = w.shape
    length = x.shape[1]
    taps = (w.reshape(c_in, c_out * k).T @ x).reshape(c_out, k, length)  # taps[o, j, t] lands at t*s + j
    y = np.zeros((c_out, (length - 1) * stride + k), x.dtype)
    for j in range(k):
        y[:, j: j + (length - 1) * stride + 1: stride] += taps[:, j]
    return y[:, : length * stride] + b[:, None]


def _snake(x: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """SnakeBeta with log-space parameters: x + 1/(exp(beta)+1e-9) * sin^2(exp(alpha) x); x [C, L]."""
    return x + (1.0 / (np.exp(beta) + 1e-9))[:, None] * np.sin(np.exp(alpha)[:, None] * x) ** 2


def _rope_tables(cfg: CodecDecoderConfig, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [n, head_dim] for positions 0..n-1; inv_freq built in fp32 exactly as torch does."""
    hd = cfg.head_dim
    exponent = np.arange(0, hd, 2).astype(np.float32) / np.float32(hd)
    inv_freq = np.float32(1.0) / np.float32(cfg.rope_theta) ** exponent
    freqs = np.arange(n, dtype=dtype)[:, None] * inv_freq.astype(dtype)[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def _transformer(w, cfg: CodecDecoderConfig, x: np.ndarray, observe: Observer | None = None) -> np.ndarray:
    """pre_transformer on x [T, latent] -> [T, latent]; causal attention within the sliding window."""
    p = "decoder.pre_transformer."
    n, heads, hd = x.shape[0], cfg.num_heads, cfg.head_dim

    def mm(y: np.ndarray, name: str) -> np.ndarray:
        return _linear(w, p + name, y, observe)

    h = mm(x, "input_proj.weight") + w(p + "input_proj.bias")
    cos, sin = _rope_tables(cfg, n, x.dtype)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    visible = (j <= i) & (j > i - cfg.sliding_window)

    def rope(t):  # t [heads, T, hd], NeoX rotate-half
        return t * cos + np.concatenate([-t[..., hd // 2:], t[..., : hd // 2]], axis=-1) * sin

    for layer in range(cfg.num_layers):
        q, layer_name = f"{p}layers.{layer}.", f"layers.{layer}."
        a = _rms_norm(h, w(q + "input_layernorm.weight"), cfg.rms_norm_eps)
        qs, ks, vs = (mm(a, f"{layer_name}self_attn.{name}_proj.weight").reshape(n, -1, hd).transpose(1, 0, 2)
                      for name in ("q", "k", "v"))
        qs, ks = rope(qs), rope(ks)
        kv_rep = heads // ks.shape[0]
        ks, vs = np.repeat(ks, kv_rep, axis=0), np.repeat(vs, kv_rep, axis=0)
        scores = np.where(visible, qs @ ks.transpose(0, 2, 1) / math.sqrt(hd), -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = mm((probs @ vs).transpose(1, 0, 2).reshape(n, heads * hd), layer_name + "self_attn.o_proj.weight")
        h = h + w(q + "self_attn_layer_scale.scale") * attn
        m = _rms_norm(h, w(q + "post_attention_layernorm.weight"), cfg.rms_norm_eps)
        gate = mm(m, layer_name + "mlp.gate_proj.weight")
        mlp = mm(_silu(gate) * mm(m, layer_name + "mlp.up_proj.weight"),
                 layer_name + "mlp.down_proj.weight")
        h = h + w(q + "mlp_layer_scale.scale") * mlp
    h = _rms_norm(h, w(p + "norm.weight"), cfg.rms_norm_eps)
    return mm(h, "output_proj.weight") + w(p + "output_proj.bias")


def _convnext(w, prefix: str, x: np.ndarray, observe: Observer | None = None) -> np.ndarray:
    """ConvNeXt block on x [C, L]: depthwise causal k7 -> LayerNorm(1e-6) -> MLP (GELU) -> gamma -> +x."""
    y = _depthwise_causal_conv(x, w(prefix + "dwconv.conv.weight"), w(prefix + "dwconv.conv.bias")).T
    y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-6)
    y = y * w(prefix + "norm.weight") + w(prefix + "norm.bias")
    y = _gelu(_linear(w, prefix + "pwconv1.weight", y, observe) + w(prefix + "pwconv1.bias"))
    y = (_linear(w, prefix + "pwconv2.weight", y, observe) + w(prefix + "pwconv2.bias")) * w(prefix + "gamma")
    return x + y.T


def codec_upsampled(weights: Mapping[str, np.ndarray], cfg: CodecDecoderConfig, codes: np.ndarray,
                    dtype=np.float64, observe: Observer | None = None) -> np.ndarray:
    """The steps of `decode_codes` before its vocoder: codes [T, num_quantizers] -> dequantised, pre_conv,
    transformer, upsampling: [latent, T * prod(upsampling_ratios)]."""
    codes = np.maximum(np.asarray(codes, dtype=np.int64), 0)
    if codes.ndim != 2 or codes.shape[1] != cfg.num_quantizers or codes.shape[0] < 1:
        raise ValueError(f"codes must be [T>=1, {cfg.num_quantizers}], got {list(codes.shape)}")
    if codes.max() >= cfg.codebook_size:
        raise ValueError(f"codes must be < {cfg.codebook_size}, got {int(codes.max())}")

    w = _reader(weights, dtype)

    def lookup(part: str, k: int, idx: np.ndarray) -> np.ndarray:
        cb = f"decoder.quantizer.{part}.vq.layers.{k}._codebook."
        return w(cb + "embedding_sum")[idx] / np.maximum(w(cb + "cluster_usage")[idx], 1e-5)[:, None]

    # (1) split-RVQ dequantisation -> [codebook_dim, T]
    sem = lookup("rvq_first", 0, codes[:, 0])
    ac = sum(lookup("rvq_rest", k - 1, codes[:, k]) for k in range(1, cfg.num_quantizers))
    z = (w("decoder.quantizer.rvq_first.output_proj.weight")[:, :, 0] @ sem.T
         + w("decoder.quantizer.rvq_rest.output_proj.weight")[:, :, 0] @ ac.T)
    # (2) pre_conv, (3) transformer
    x = _conv(w, "decoder.pre_conv.conv", z, observe)
    x = _transformer(w, cfg, x.T, observe).T
    # (4) upsampling: ConvTranspose k=s (no trim) + ConvNeXt
    for u, factor in enumerate(cfg.upsampling_ratios):
        q = f"decoder.upsample.{u}."
        x = _trans_conv(w, q + "0.conv", x, factor, observe)
        x = _convnext(w, q + "1.", x, observe)
    return x


def decode_codes(weights: Mapping[str, np.ndarray], cfg: CodecDecoderConfig, codes: np.ndarray,
                 dtype=np.float64, observe: Observer | None = None) -> np.ndarray:
    """Whole-utterance decode of codes [T, num_quantizers] -> wav [T*samples_per_frame] in `dtype`.

    `weights` maps the speech tokenizer's tensor names (`decoder.*`) to arrays. Negative codes
    (padding) count as 0, as the official wrapper clamps them; codes >= codebook_size are refused."""
    w = _reader(weights, dtype)
    x = codec_upsampled(weights, cfg, codes, dtype, observe)
    # (5) vocoder
    x = _conv(w, "decoder.decoder.0.conv", x, observe)
    for n, rate in enumerate(cfg.upsample_rates, start=1):
        q = f"decoder.decoder.{n}.block."
        x = _snake(x, w(q + "0.alpha"), w(q + "0.beta"))
        x = _trans_conv(w, q + "1.conv", x, rate, observe)
        for u, dilation in enumerate(RESIDUAL_DILATIONS, start=2):
            r = f"{q}{u}."
            y = _snake(x, w(r + "act1.alpha"), w(r + "act1.beta"))
            y = _conv(w, r + "conv1.conv", y, observe, dilation)
            y = _snake(y, w(r + "act2.alpha"), w(r + "act2.beta"))
            x = x + _conv(w, r + "conv2.conv", y, observe)
    last = len(cfg.upsample_rates) + 1
    x = _snake(x, w(f"decoder.decoder.{last}.alpha"), w(f"decoder.decoder.{last}.beta"))
    x = _conv(w, f"decoder.decoder.{last + 1}.conv", x, observe)
    return np.clip(x[0], -1.0, 1.0)
