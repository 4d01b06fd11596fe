"""The talker as a GGUF that stock llama.cpp loads: plain `qwen3` architecture.

The talker's interleaved MRoPE is degenerate for TTS (all three position streams are equal), so it
is exactly NeoX RoPE with theta 1e6: llama.cpp's `qwen3` graph computes it. The codec embedding
[3072, H] is the token table (unused at run time: prompts go in as embeddings) and `codec_head`
the output matrix. f32/f16/bf16 are written directly; q8_0, the K-quants and iq4_nl go through
llama.cpp's own quantizer from a lossless intermediate (rows narrower than 256 make llama.cpp
fall back to another type for those tensors). iq4_nl (4.5 bits per weight in blocks of 32, a
non-linear grid) has repacked CPU kernels that make prefills and batched steps the fastest of the
4-bit formats (`talker.REPACK_QUANTS`).
Weights whose input the format could not take (`keep`, from `convert/precision/activation_ranges.py`)
stay F32 in any format: written so, and named to llama.cpp's quantizer as tensor type overrides.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.host.cpus import default_threads

QUANTS = ("f32", "bf16", "f16", "q8_0", "q5_k_m", "q4_k_m", "iq4_nl")
_DIRECT = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
           "bf16": gguf.GGMLQuantizationType.BF16}
_LLAMA_FTYPE = {"q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "iq4_nl": 25}  # llama_ftype values
_FILE_TYPE = {"f32": 0, "f16": 1, "bf16": 32}
_GGML_F32 = 0  # ggml_type

_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def tensor_map(ckpt: Checkpoint) -> dict[str, str]:
    """GGUF tensor name -> checkpoint tensor name."""
    names = {
        "token_embd.weight": "talker.model.codec_embedding.weight",
        "output_norm.weight": "talker.model.norm.weight",
        "output.weight": "talker.codec_head.weight",
    }
    for i in range(ckpt.config.talker.num_layers):
        for src, dst in _LAYER_TENSORS.items():
            names[f"blk.{i}.{dst}"] = f"talker.model.layers.{i}.{src}"
    return names


def _write_direct(ckpt: Checkpoint, path: Path, quant: str, name: str,
                  progress: Callable[[str], None] | None, keep: frozenset[str]) -> None:
    t = ckpt.config.talker
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name(name)
    writer.add_context_length(32768)
    writer.add_embedding_length(t.hidden_size)
    writer.add_block_count(t.num_layers)
    writer.add_feed_forward_length(t.intermediate_size)
    writer.add_head_count(t.num_heads)
    writer.add_head_count_kv(t.num_kv_heads)
    writer.add_key_length(t.head_dim)
    writer.add_value_length(t.head_dim)
    writer.add_rope_freq_base(t.rope_theta)
    writer.add_layer_norm_rms_eps(t.rms_norm_eps)
    writer.add_file_type(_FILE_TYPE[quant])
    writer.add_tokenizer_model("none")  # prompts are embeddings: no text vocabulary in the talker
    writer.add_vocab_size(t.vocab_size)

    qtype = _DIRECT[quant]
    plan = []
    for gguf_name, src in tensor_map(ckpt).items():
        shape = ckpt.weights.shape_of(src)
        if len(shape) == 1 or qtype == gguf.GGMLQuantizationType.F32 or src in keep:
            kind, dtype, nbytes = "f32", np.float32, 4
        elif qtype == gguf.GGMLQuantizationType.F16:
            kind, dtype, nbytes = "f16", np.float16, 2
        else:
            kind, dtype, nbytes = "bf16", np.uint16, 2
        plan.append((gguf_name, src, kind))
        raw_dtype = gguf.GGMLQuantizationType.BF16 if kind == "bf16" else None
        writer.add_tensor_info(gguf_name, shape, np.dtype(dtype), int(np.prod(shape)) * nbytes, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for gguf_name, src, kind in plan:
        if progress:
            progress(gguf_name)
        if kind == "bf16" and ckpt.weights.dtype_of(src) == "BF16":
            data = np.ascontiguousarray(ckpt.weights.raw(src))  # lossless: copy the words
        elif kind == "bf16":
            data = gguf.quants.quantize(ckpt.weights[src], gguf.GGMLQuantizationType.BF16)
        else:
            data = np.ascontiguousarray(ckpt.weights[src], dtype=np.float32).astype(
                {"f32": np.float32, "f16": np.float16}[kind])
        writer.write_tensor_data(data)
    writer.close()


def _llama_quantize(src: Path, dst: Path, quant: str, threads: int, keep: list[str]) -> None:
    """llama.cpp's quantizer, the GGUF tensors `keep` left F32."""
    import llama_cpp

    from qwen3_tts_gguf.host.cpus import quiet_llama_logs

    quiet_llama_logs()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = _LLAMA_FTYPE[quant]
    params.nthread = default_threads(threads)  # llama.cpp's own 0 would be every core of the machine
    patterns = [f"^{re.escape(n)}$".encode() for n in keep]
    overrides = (llama_cpp.llama_model_tensor_override * (len(keep) + 1))(  # ends at a null pattern
        *[llama_cpp.llama_model_tensor_override(p, _GGML_F32) for p in patterns])
    if keep:
        params.tt_overrides = ctypes.cast(overrides, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama.cpp failed to quantize the talker to {quant} (code {rc})")


def write_talker_gguf(ckpt: Checkpoint, out_path: Path, quant: str, *, name: str = "qwen3-tts-talker",
                      threads: int = 0, progress: Callable[[str], None] | None = None,
                      keep: frozenset[str] = frozenset()) -> None:
    """Write the talker GGUF at `out_path` in `quant` (one of QUANTS); the checkpoint weights `keep` F32."""
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r}; choose one of {', '.join(QUANTS)}")
    out_path = Path(out_path)
    if quant in _DIRECT:
        _write_direct(ckpt, out_path, quant, name, progress, keep)
        return
    # lossless intermediate: bf16 words when the source is bf16, else f32
    source_bf16 = ckpt.weights.dtype_of("talker.codec_head.weight") == "BF16"
    tmp = out_path.with_name(out_path.name + ".unquantized")
    try:
        _write_direct(ckpt, tmp, "bf16" if source_bf16 else "f32", name, progress, keep)
        if progress:
            progress(f"quantizing to {quant}")
        _llama_quantize(tmp, out_path, quant, threads, [g for g, src in tensor_map(ckpt).items() if src in keep])
    finally:
        tmp.unlink(missing_ok=True)


def gguf_tensor_types(path: Path) -> dict[str, str]:
    """Tensor name -> ggml type name of a GGUF file (for manifests and reports)."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in reader.tensors}
