"""A random official-format checkpoint -> the two GGUF files qwentts.cpp loads (talker + code predictor, codec).

The PyPI wheel (`realtimetts-qwen-native-cpu`) ships only the loader (`QwenTTS(talker_path, codec_path)`) and
downloads pre-converted files from a model hub; its converter (`convert.py` + `tools/quantize.cpp` of
qwentts.cpp) is not packaged. This writes the same layout, as that converter documents it and the loader's
tensor and key names confirm: arch `qwen3-tts` (talker and code predictor, the text table and its 2-layer
projection kept as tensors, the BPE vocabulary embedded) and arch `qwen3-tts-tokenizer` (the codec decoder, RVQ
codebooks pre-divided by their usage). Quantization follows the upstream policy: every tensor of two or more
dimensions goes to the requested type (Q8_0) when its rows split into blocks, else F16 (the conv kernels);
1-D tensors, snake parameters and everything of the RVQ stay F32.

`suppress_eos`: the talker file's `qwen3-tts.codec.eos_id` is set to the codec vocabulary size, an id the
sampler can never draw; qwentts.cpp masks the top 1024 codec ids except the EOS id it reads, so the real EOS is
masked with the others and every utterance runs to `max_new_tokens` (as the bench's official pipeline, whose EOS
id is moved out of reach the same way).

Runs in the project's interpreter (gguf-py, numpy), never in the peer's venv.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

RVQ_EPS = 1e-5  # the official EuclideanCodebook's clamp of cluster_usage
_LM_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # the codec's pre-transformer only
    "self_attn_layer_scale.scale": "attn_scale", "mlp_layer_scale.scale": "ffn_scale",
}
_TALKER_TOP = {
    "talker.model.codec_embedding.weight": "talker.codec_embd.weight",
    "talker.model.text_embedding.weight": "talker.text_embd.weight",
    "talker.model.norm.weight": "talker.output_norm.weight",
    "talker.codec_head.weight": "talker.codec_head.weight",
    "talker.code_predictor.model.norm.weight": "code_pred.output_norm.weight",
    "talker.code_predictor.small_to_mtp_projection.weight": "code_pred.mtp_proj.weight",
    "talker.code_predictor.small_to_mtp_projection.bias": "code_pred.mtp_proj.bias",
}
TALKER_RULES = (
    (r"talker\.model\.layers\.(\d+)\.(.+)", lambda m: f"talker.blk.{m[1]}.{_LM_LAYER[m[2]]}"),
    (r"talker\.code_predictor\.model\.layers\.(\d+)\.(.+)", lambda m: f"code_pred.blk.{m[1]}.{_LM_LAYER[m[2]]}"),
    (r"talker\.code_predictor\.model\.codec_embedding\.(\d+)\.weight", lambda m: f"code_pred.codec_embd.{m[1]}.weight"),
    (r"talker\.code_predictor\.lm_head\.(\d+)\.weight", lambda m: f"code_pred.lm_head.{m[1]}.weight"),
    (r"talker\.text_projection\.linear_fc([12])\.(weight|bias)", lambda m: f"talker.text_proj.fc{m[1]}.{m[2]}"),
)
CODEC_RULES = (
    (r"decoder\.pre_conv\.conv\.(weight|bias)", lambda m: f"tok_dec.pre_conv.{m[1]}"),
    (r"decoder\.pre_transformer\.(input_proj|output_proj)\.(weight|bias)", lambda m: f"tok_dec.pre_tfm.{m[1]}.{m[2]}"),
    (r"decoder\.pre_transformer\.norm\.weight", lambda m: "tok_dec.pre_tfm.norm.weight"),
    (r"decoder\.pre_transformer\.layers\.(\d+)\.(.+)", lambda m: f"tok_dec.pre_tfm.blk.{m[1]}.{_LM_LAYER[m[2]]}"),
    (r"decoder\.upsample\.(\d+)\.0\.conv\.(weight|bias)", lambda m: f"tok_dec.upsample.{m[1]}.conv.{m[2]}"),
    (r"decoder\.upsample\.(\d+)\.1\.dwconv\.conv\.(weight|bias)", lambda m: f"tok_dec.upsample.{m[1]}.dwconv.{m[2]}"),
    (r"decoder\.upsample\.(\d+)\.1\.(norm|pwconv1|pwconv2)\.(weight|bias)",
     lambda m: f"tok_dec.upsample.{m[1]}.{m[2]}.{m[3]}"),
    (r"decoder\.upsample\.(\d+)\.1\.gamma", lambda m: f"tok_dec.upsample.{m[1]}.gamma"),
    (r"decoder\.decoder\.(0|6)\.conv\.(weight|bias)", lambda m: f"tok_dec.dec.{m[1]}.conv.{m[2]}"),
    (r"decoder\.decoder\.5\.(alpha|beta)", lambda m: f"tok_dec.dec.5.snake.{m[1]}"),
    (r"decoder\.decoder\.(\d+)\.block\.0\.(alpha|beta)", lambda m: f"tok_dec.dec.{m[1]}.snake.{m[2]}"),
    (r"decoder\.decoder\.(\d+)\.block\.1\.conv\.(weight|bias)", lambda m: f"tok_dec.dec.{m[1]}.conv_t.{m[2]}"),
    (r"decoder\.decoder\.(\d+)\.block\.([234])\.(act[12])\.(alpha|beta)",
     lambda m: f"tok_dec.dec.{m[1]}.res.{int(m[2]) - 2}.{m[3]}.{m[4]}"),
    (r"decoder\.decoder\.(\d+)\.block\.([234])\.(conv[12])\.conv\.(weight|bias)",
     lambda m: f"tok_dec.dec.{m[1]}.res.{int(m[2]) - 2}.{m[3]}.{m[4]}"),
    (r"decoder\.quantizer\.r(vq_first|vq_rest)\.output_proj\.weight", lambda m: f"tok_dec.{m[1]}.output_proj.weight"),
)
_KEEP_F32 = ("tok_dec.vq_", "tok_enc.vq_", ".snake.", ".act1.", ".act2.", "spk_enc.fc.weight")


def qwentts_name(name: str, rules) -> str | None:
    """The qwentts.cpp name of checkpoint tensor `name` under `rules`, or None when no rule matches."""
    for pattern, target in rules:
        m = re.fullmatch(pattern, name)
        if m:
            return target(m)
    return None


def target_type(name: str, shape: tuple[int, ...], quant: str) -> str:
    """"F32", "F16" or `quant` for one tensor (the upstream quantizer's policy)."""
    if quant == "F32" or len(shape) < 2 or any(k in name for k in _KEEP_F32):
        return "F32"
    return quant if shape[-1] % 32 == 0 else "F16"


def _add(writer, name: str, arr: np.ndarray, quant: str) -> None:
    import gguf

    kind = target_type(name, arr.shape, quant)
    if kind == "F32":
        writer.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    elif kind == "F16":
        writer.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float16))
    else:
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qtype),
                          raw_dtype=qtype)


def _bpe(checkpoint: Path) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the checkpoint's Qwen2 BPE files; added tokens are type 4, gaps 5."""
    vocab = json.loads((checkpoint / "vocab.json").read_text())
    added = json.loads((checkpoint / "tokenizer_config.json").read_text()).get("added_tokens_decoder", {})
    size = max([*vocab.values(), *map(int, added)]) + 1
    tokens, types = [f"<|unused-{i}|>" for i in range(size)], [5] * size
    for tok, i in vocab.items():
        tokens[i], types[i] = tok, 1
    for i, info in added.items():
        tokens[int(i)], types[int(i)] = info["content"], 4
    merges = [ln for ln in (checkpoint / "merges.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    return tokens, types, merges


def write_talker(checkpoint: Path, out: Path, quant: str = "Q8_0", suppress_eos: bool = True) -> None:
    """The talker + code predictor GGUF of `checkpoint` (a CustomVoice or VoiceDesign one: no speaker encoder)."""
    import gguf

    from qwen3_tts_gguf.model.safetensors_io import SafetensorsFile

    cfg = json.loads((checkpoint / "config.json").read_text())
    gen = json.loads((checkpoint / "generation_config.json").read_text())
    t, cp = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    w = gguf.GGUFWriter(str(out), "qwen3-tts")
    a = "qwen3-tts"
    w.add_string("general.name", f"Qwen3-TTS-12Hz-{cfg['tts_model_size']}-{cfg['tts_model_type']}")
    for key in ("tokenizer_type", "model_size", "model_type"):
        w.add_string(f"{a}.{key}", cfg[key if key == "tokenizer_type" else f"tts_{key}"])
    w.add_uint32(f"{a}.num_code_groups", t["num_code_groups"])
    for part, c in (("talker", t), ("code_pred", cp)):
        w.add_uint32(f"{a}.{part}.embedding_length", c["hidden_size"])
        w.add_uint32(f"{a}.{part}.feed_forward_length", c["intermediate_size"])
        w.add_uint32(f"{a}.{part}.block_count", c["num_hidden_layers"])
        w.add_uint32(f"{a}.{part}.attention.head_count", c["num_attention_heads"])
        w.add_uint32(f"{a}.{part}.attention.head_count_kv", c["num_key_value_heads"])
        w.add_uint32(f"{a}.{part}.attention.key_length", c["head_dim"])
        w.add_uint32(f"{a}.{part}.vocab_size", c["vocab_size"])
        w.add_uint32(f"{a}.{part}.context_length", c["max_position_embeddings"])
        w.add_float32(f"{a}.{part}.rope.freq_base", float(c["rope_theta"]))
        w.add_float32(f"{a}.{part}.attention.layer_norm_rms_epsilon", float(c["rms_norm_eps"]))
    w.add_uint32(f"{a}.talker.text_vocab_size", t["text_vocab_size"])
    w.add_uint32(f"{a}.talker.text_hidden_size", t["text_hidden_size"])
    w.add_uint32(f"{a}.talker.position_id_per_seconds", t["position_id_per_seconds"])
    rope = t.get("rope_scaling") or {}
    if "mrope_section" in rope:
        w.add_array(f"{a}.talker.rope.mrope_section", rope["mrope_section"])
        for key in ("rope.mrope_interleaved", "mrope_interleaved"):  # the wheel's key, upstream's converter's key
            w.add_bool(f"{a}.talker.{key}", bool(rope.get("interleaved", False)))
    eos = t["vocab_size"] if suppress_eos else t["codec_eos_token_id"]
    for key, value in (("pad_id", t["codec_pad_id"]), ("bos_id", t["codec_bos_id"]), ("eos_id", eos),
                       ("think_id", t["codec_think_id"]), ("nothink_id", t["codec_nothink_id"]),
                       ("think_bos_id", t["codec_think_bos_id"]), ("think_eos_id", t["codec_think_eos_id"])):
        w.add_uint32(f"{a}.codec.{key}", value)
    langs = t.get("codec_language_id") or {}
    w.add_array(f"{a}.codec.language_names", list(langs))
    w.add_array(f"{a}.codec.language_ids", [int(v) for v in langs.values()])
    speakers = t.get("spk_id") or {}
    if speakers:
        dialects = t.get("spk_is_dialect") or {}
        w.add_array(f"{a}.codec.speaker_names", list(speakers))
        w.add_array(f"{a}.codec.speaker_ids", [int(v) for v in speakers.values()])
        w.add_array(f"{a}.codec.speaker_dialects",
                    [d if isinstance(d := dialects.get(k), str) else "" for k in speakers])
    for key in ("im_start", "im_end", "tts_pad", "tts_bos", "tts_eos"):
        w.add_uint32(f"{a}.text.{key}_id", cfg[f"{key}_token_id"])
    for key, add in (("do_sample", w.add_bool), ("top_k", w.add_uint32), ("top_p", w.add_float32),
                     ("temperature", w.add_float32), ("repetition_penalty", w.add_float32),
                     ("subtalker_top_k", w.add_uint32), ("subtalker_top_p", w.add_float32),
                     ("subtalker_temperature", w.add_float32)):
        if key in gen:
            add(f"generation.{key}", gen[key])
    if "subtalker_dosample" in gen:
        w.add_bool("generation.subtalker_do_sample", bool(gen["subtalker_dosample"]))
    tokens, types, merges = _bpe(checkpoint)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.eos_token_id", 151643)  # <|endoftext|>
    weights = SafetensorsFile(checkpoint / "model.safetensors")
    for name in sorted(weights):
        target = _TALKER_TOP.get(name) or qwentts_name(name, TALKER_RULES)
        if target is None:
            raise ValueError(f"no qwentts.cpp name for talker tensor {name}")
        _add(w, target, weights[name], quant)
    _finish(w)


def write_codec(checkpoint: Path, out: Path, quant: str = "Q8_0") -> None:
    """The codec GGUF (decoder only: a CustomVoice checkpoint's speech tokenizer carries no encoder weights;
    qwentts.cpp loads the encoder lazily, for cloning only)."""
    import gguf

    from qwen3_tts_gguf.model.safetensors_io import SafetensorsFile

    cfg = json.loads((checkpoint / "speech_tokenizer" / "config.json").read_text())
    dec, enc = cfg["decoder_config"], cfg.get("encoder_config") or {}
    w = gguf.GGUFWriter(str(out), "qwen3-tts-tokenizer")
    a = "qwen3-tts-tokenizer"
    w.add_string("general.name", "Qwen3-TTS-Tokenizer-12Hz")
    for key in ("input_sample_rate", "output_sample_rate", "decode_upsample_rate", "encode_downsample_rate",
                "encoder_valid_num_quantizers"):
        w.add_uint32(f"{a}.{key}", cfg[key])
    for side, c in (("decoder", dec), ("encoder", enc)):
        for key, value in c.items():
            key = "vector_quantization_hidden_dim" if key == "vector_quantization_hidden_dimension" else key
            if isinstance(value, bool) or not isinstance(value, (int, float, list)):
                continue
            if isinstance(value, list):
                w.add_array(f"{a}.{side}.{key}", value)
            elif isinstance(value, float) or key in ("rope_theta",):
                w.add_float32(f"{a}.{side}.{key}", float(value))
            else:
                w.add_uint32(f"{a}.{side}.{key}", value)
    w.add_uint32(f"{a}.decoder.codebook_dim_internal", 256)  # codebook vectors before output_proj
    weights = SafetensorsFile(checkpoint / "speech_tokenizer" / "model.safetensors")
    books: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for name in sorted(weights):
        m = re.fullmatch(r"decoder\.quantizer\.r(vq_first|vq_rest)\.vq\.layers\.(\d+)\._codebook\.(\w+)", name)
        if m:
            books.setdefault((m[1], int(m[2])), {})[m[3]] = weights[name]
            continue
        if name.startswith("encoder.") or re.fullmatch(r"decoder\.quantizer\..*\.input_proj\.weight", name):
            continue  # the encoder (absent here) and the decoder-side copy of the encoder's input projection
        target = qwentts_name(name, CODEC_RULES)
        if target is None:
            raise ValueError(f"no qwentts.cpp name for codec tensor {name}")
        _add(w, target, weights[name], quant)
    for (side, layer), parts in sorted(books.items()):
        usage = np.clip(parts["cluster_usage"].astype(np.float32), RVQ_EPS, None)
        _add(w, f"tok_dec.{side}.{layer}.codebook", parts["embedding_sum"].astype(np.float32) / usage[:, None], quant)
    _finish(w)


def _finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
