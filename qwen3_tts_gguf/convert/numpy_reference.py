"""Plain-numpy forwards of the Qwen3 decoder stacks, for self-checking converted graphs.

`decoder_stack` runs a talker ("talker.model") or code-predictor ("talker.code_predictor.model")
stack over a sequence of input rows with full causal attention and returns the post-final-norm
hidden states; `code_predictor_logits` builds the teacher-forced code-predictor forward on it.
Computed in float64 by default so it serves as the truth for fp32 graphs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from qwen3_tts_gguf.convert.checkpoint import ModelConfig, TransformerConfig


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
                  positions: np.ndarray | None = None, dtype=np.float64) -> np.ndarray:
    """Post-final-norm hidden states [..., T, D] of the stack `prefix` for input rows [..., T, D]."""
    def w(name: str) -> np.ndarray:
        return np.asarray(weights[f"{prefix}.{name}"], dtype)

    x = np.asarray(rows, dtype)
    T = x.shape[-2]
    positions = np.arange(T) if positions is None else np.asarray(positions)
    g, hd, eps = cfg.num_heads // cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    causal = np.where(np.arange(T)[None, :] > np.arange(T)[:, None], -np.inf, 0.0)
    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        a = _rms_norm(x, w(f"{p}.input_layernorm.weight"), eps)
        q = (a @ w(f"{p}.self_attn.q_proj.weight").T).reshape(*x.shape[:-1], cfg.num_heads, hd)
        k = (a @ w(f"{p}.self_attn.k_proj.weight").T).reshape(*x.shape[:-1], cfg.num_kv_heads, hd)
        v = (a @ w(f"{p}.self_attn.v_proj.weight").T).reshape(*x.shape[:-1], cfg.num_kv_heads, hd)
        q = _rope(_rms_norm(q, w(f"{p}.self_attn.q_norm.weight"), eps), positions, cfg.rope_theta)
        k = _rope(_rms_norm(k, w(f"{p}.self_attn.k_norm.weight"), eps), positions, cfg.rope_theta)
        k, v = np.repeat(k, g, axis=-2), np.repeat(v, g, axis=-2)  # GQA: head h reads kv head h // g
        scores = np.einsum("...thd,...shd->...hts", q, k) / np.sqrt(hd) + causal
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("...hts,...shd->...thd", probs, v).reshape(*x.shape[:-1], cfg.num_heads * hd)
        x = x + attn @ w(f"{p}.self_attn.o_proj.weight").T
        h = _rms_norm(x, w(f"{p}.post_attention_layernorm.weight"), eps)
        gate, up = h @ w(f"{p}.mlp.gate_proj.weight").T, h @ w(f"{p}.mlp.up_proj.weight").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w(f"{p}.mlp.down_proj.weight").T
    return _rms_norm(x, w("norm.weight"), eps)


def code_predictor_logits(weights: Mapping[str, np.ndarray], config: ModelConfig, hidden: np.ndarray,
                          code0: int, codes: Sequence[int], dtype=np.float64) -> np.ndarray:
    """Teacher-forced code-predictor logits [15, vocab] for one frame.

    hidden: the talker's post-norm hidden state [H] that produced code0; codes: codebooks 1..14
    (a 15th is ignored) fed as the inputs of steps 2..15. Row j predicts codebook j+1.
    """
    def w(name: str) -> np.ndarray:
        return np.asarray(weights[name], dtype)

    cp = "talker.code_predictor"
    rows = [hidden, weights["talker.model.codec_embedding.weight"][int(code0)]]
    rows += [weights[f"{cp}.model.codec_embedding.{j}.weight"][int(c)] for j, c in enumerate(codes[:14])]
    x = np.stack([np.asarray(r, dtype) for r in rows])
    if config.has_mtp_projection:
        x = x @ w(f"{cp}.small_to_mtp_projection.weight").T + w(f"{cp}.small_to_mtp_projection.bias")
    out = decoder_stack(weights, f"{cp}.model", config.code_predictor, x, dtype=dtype)
    return np.stack([out[j + 1] @ w(f"{cp}.lm_head.{j}.weight").T for j in range(15)])
