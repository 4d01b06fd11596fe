"""Published shapes of the Qwen3-TTS 12 Hz checkpoints, and tiny ones for tests.

`checkpoint_configs(shape, model_type)` returns the `config.json`, `speech_tokenizer/config.json`
and `generation_config.json` dicts of a checkpoint in the real Hugging Face layout. `make-random`
writes random weights for them; the test harness instantiates the official classes from them.
"""

from __future__ import annotations

import copy

MODEL_TYPES = ("custom_voice", "voice_design", "base")
SHAPES = ("tiny", "tiny-0b6", "tiny-realcodec", "small", "0.6b", "1.7b")

LANGUAGE_IDS = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
}
DIALECT_IDS = {"beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKERS = {  # name: (codec id, dialect or False)
    "vivian": (3065, False), "serena": (3066, False), "uncle_fu": (3010, False),
    "dylan": (2878, "beijing_dialect"), "eric": (2875, "sichuan_dialect"), "ryan": (3061, False),
    "aiden": (2861, False), "ono_anna": (2873, False), "sohee": (2864, False),
}

GENERATION_CONFIG = {
    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
    "subtalker_top_k": 50, "max_new_tokens": 8192,
}

# the codec decoder of every published checkpoint (speech_tokenizer/config.json's decoder_config)
PUBLISHED_CODEC = dict(codebook_dim=512, latent_dim=1024, decoder_dim=1536, hidden_size=512, intermediate_size=1024,
                       num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16, head_dim=64,
                       sliding_window=72)

# talker / code predictor / text / codec dimensions per shape
_DIMS = {
    "tiny": dict(size="1b7", H=64, layers=2, heads=4, kv=2, hd=16, I=128, mrope=[4, 2, 2],
                 cpH=32, cp_layers=2, cp_heads=4, cp_kv=2, cp_hd=16, cpI=96, text_hidden=48,
                 codec=dict(codebook_dim=16, latent_dim=32, decoder_dim=32, hidden_size=32,
                            intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=2, head_dim=16, sliding_window=8),
                 enc=dict(hidden_size=32, num_filters=4, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=16, intermediate_size=64, codebook_dim=16,
                          vector_quantization_hidden_dimension=16, sliding_window=250),
                 spk=dict(enc_channels=[32, 32, 32, 32, 96], enc_attention_channels=16,
                          enc_se_channels=16)),
    "tiny-0b6": dict(size="0b6", cpH=64),  # code predictor as wide as the talker: no projection
    # the tiny talker with the published codec decoder, whose shape llama.cpp hard-codes: the smallest
    # checkpoint that gets a llama stages file (convert/llama_stages.py)
    "tiny-realcodec": dict(codec=PUBLISHED_CODEC),
    # wide enough (256) for K-quant rows
    "small": dict(size="1b7", H=256, layers=2, heads=4, kv=2, hd=64, I=512, mrope=[16, 8, 8],
                  cpH=256, cp_layers=2, cp_heads=4, cp_kv=2, cp_hd=64, cpI=512, text_hidden=256),
    "0.6b": dict(size="0b6", H=1024, layers=28, heads=16, kv=8, hd=128, I=3072, mrope=[24, 20, 20],
                 cpH=1024, cp_layers=5, cp_heads=16, cp_kv=8, cp_hd=128, cpI=3072, text_hidden=2048,
                 codec=PUBLISHED_CODEC,
                 enc=dict(hidden_size=512, num_filters=64, num_hidden_layers=8, num_attention_heads=8,
                          num_key_value_heads=8, head_dim=64, intermediate_size=2048, codebook_dim=256,
                          vector_quantization_hidden_dimension=256, sliding_window=250),
                 spk=dict(enc_channels=[512, 512, 512, 512, 1536], enc_attention_channels=128,
                          enc_se_channels=128)),
    "1.7b": dict(size="1b7", H=2048, I=6144),
}


def _dims(shape: str) -> dict:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    base = {"tiny-0b6": "tiny", "tiny-realcodec": "tiny", "small": "tiny", "1.7b": "0.6b"}.get(shape)
    dims = copy.deepcopy(_DIMS[base]) if base else {}
    dims.update(copy.deepcopy(_DIMS[shape]))
    return dims


def checkpoint_configs(shape: str, model_type: str, transformers_version: str = "4.57.3") -> dict[str, dict]:
    """Config dicts of a checkpoint: keys `config.json`, `generation_config.json`,
    `speech_tokenizer/config.json`, `speech_tokenizer/preprocessor_config.json`."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown model type {model_type!r}; choose one of {', '.join(MODEL_TYPES)}")
    d = _dims(shape)
    languages = dict(LANGUAGE_IDS)
    if model_type == "custom_voice":
        languages.update(DIALECT_IDS)
        spk_id = {name: cid for name, (cid, _) in SPEAKERS.items()}
        spk_is_dialect = {name: dialect for name, (_, dialect) in SPEAKERS.items()}
    else:
        spk_id, spk_is_dialect = {}, {}
    code_predictor = {
        "vocab_size": 2048, "hidden_size": d["cpH"], "intermediate_size": d["cpI"],
        "num_hidden_layers": d["cp_layers"], "num_attention_heads": d["cp_heads"],
        "num_key_value_heads": d["cp_kv"], "head_dim": d["cp_hd"], "hidden_act": "silu",
        "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": None, "attention_bias": False, "use_sliding_window": False,
        "num_code_groups": 16, "tie_word_embeddings": False,
    }
    talker = {
        "code_predictor_config": code_predictor,
        "vocab_size": 3072, "hidden_size": d["H"], "intermediate_size": d["I"],
        "num_hidden_layers": d["layers"], "num_attention_heads": d["heads"],
        "num_key_value_heads": d["kv"], "head_dim": d["hd"], "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": {"interleaved": True, "mrope_section": d["mrope"], "rope_type": "default"},
        "attention_bias": False, "use_sliding_window": False, "position_id_per_seconds": 13,
        "num_code_groups": 16, "text_hidden_size": d["text_hidden"], "text_vocab_size": 151936,
        "tie_word_embeddings": False,
        "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codec_pad_id": 2148,
        "codec_bos_id": 2149, "spk_id": spk_id, "spk_is_dialect": spk_is_dialect,
        "codec_language_id": languages,
    }
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": d["size"],
        "tts_model_type": model_type,
        "im_start_token_id": 151644, "im_end_token_id": 151645, "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
        "talker_config": talker,
        "transformers_version": transformers_version,
    }
    if model_type == "base":
        config["speaker_encoder_config"] = {
            "mel_dim": 128, "enc_dim": d["H"], "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1], "enc_res2net_scale": 8, "sample_rate": 24000,
            **d["spk"],
        }
    decoder = {
        "codebook_size": 2048, "max_position_embeddings": 8000, "rope_theta": 10000,
        "attention_bias": False, "hidden_act": "silu", "layer_scale_initial_scale": 0.01,
        "rms_norm_eps": 1e-5, "num_quantizers": 16, "num_semantic_quantizers": 1,
        "semantic_codebook_size": 4096, "vector_quantization_hidden_dimension": 512,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "attention_dropout": 0.0,
        **d["codec"],
    }
    encoder = {
        "audio_channels": 1, "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3,
        "num_residual_layers": 1, "compress": 2, "upsampling_ratios": [8, 6, 5, 4],
        "hidden_act": "gelu", "norm_eps": 1e-5, "layer_scale_initial_scale": 0.01,
        "rope_theta": 10000.0, "max_position_embeddings": 8000, "num_quantizers": 32,
        "num_semantic_quantizers": 1, "codebook_size": 2048, "pad_mode": "constant",
        "use_causal_conv": True, "dilation_growth_rate": 2, "trim_right_ratio": 1.0,
        "sampling_rate": 24000, "frame_rate": 12.5, "use_conv_shortcut": False,
        "upsample_groups": d["enc"]["hidden_size"],
        **d["enc"],
    }
    codec = {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
        "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
        "encoder_config": encoder, "decoder_config": decoder,
        "transformers_version": transformers_version,
    }
    preprocessor = {
        "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
        "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
        "sampling_rate": 24000, "chunk_length_s": None, "overlap": None,
    }
    return {
        "config.json": config,
        "generation_config.json": dict(GENERATION_CONFIG),
        "speech_tokenizer/config.json": codec,
        "speech_tokenizer/preprocessor_config.json": preprocessor,
    }


_QWEN3_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    # 151669/151670: names not published (placeholders keep the ids contiguous); then the TTS tokens
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>",
]
_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
FIRST_ADDED_ID = 151643


def tokenizer_config() -> dict:
    """`tokenizer_config.json` of a Qwen3-TTS checkpoint (Qwen2TokenizerFast, added tokens)."""
    added = {
        str(FIRST_ADDED_ID + i): {
            "content": tok, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": tok not in _NOT_SPECIAL,
        }
        for i, tok in enumerate(_QWEN3_ADDED)
    }
    return {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
