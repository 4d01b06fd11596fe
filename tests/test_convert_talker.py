"""The talker GGUF, the text tables and the tokenizer against the official modules."""

from __future__ import annotations

import numpy as np
import pytest

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.talker_gguf import gguf_tensor_types, write_talker_gguf
from qwen3_tts_gguf.convert.text_tables import write_text_tables
from qwen3_tts_gguf.model.embeddings import EmbeddingTables
from qwen3_tts_gguf.model.safetensors_io import SafetensorsFile, bf16_to_f32, write_safetensors
from qwen3_tts_gguf.model.talker import DecodeItem, Talker, TalkerSettings, cpu_has_amx, kv_cache_for
from qwen3_tts_gguf.model.tokenizer import TextTokenizer, official_pretokenizer

from tests.reference.runner import load_official, talker_forward, text_rows

# f32 weights, F32 KV cache, flash attention off: llama.cpp and PyTorch differ by summation order
# only. Measured ~1e-6 on hidden states and ~1e-5 on logits (std ~4); the bars leave 10x room.
HIDDEN_TOL = 2e-5
LOGIT_TOL = 2e-4
# Quantized talkers are not exact: their agreement with f32 is reported, and bounded loosely.
QUANT_REL_RMS = {"bf16": 0.02, "f16": 0.01, "q8_0": 0.05, "q5_k_m": 0.12, "q4_k_m": 0.25, "iq4_nl": 0.3}
Q4_0_KV_REL_RMS = 0.15  # the opt-in q4_0 KV cache, f32 talker, against the official logits (measured 0.095)


def _rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


@pytest.fixture(scope="module", params=["tiny_cv", "tiny0b6_cv_bf16"])
def ckpt_dir(request, checkpoint_factory):
    return checkpoint_factory(request.param)


def test_f32_talker_equals_official(ckpt_dir, tmp_path):
    ckpt = Checkpoint.open(ckpt_dir)
    write_talker_gguf(ckpt, tmp_path / "talker.gguf", "f32")
    assert set(gguf_tensor_types(tmp_path / "talker.gguf").values()) == {"F32"}
    talker = Talker(tmp_path / "talker.gguf", TalkerSettings(n_ctx=256, max_streams=2, deterministic=True))
    rows = np.random.default_rng(0).standard_normal((14, talker.hidden_size)).astype(np.float32)
    logits, hidden = talker.decode_steps(0, rows, 9)
    ref_logits, ref_hidden = talker_forward(ckpt_dir, rows)
    assert np.abs(hidden - ref_hidden[8:]).max() < HIDDEN_TOL
    assert np.abs(logits - ref_logits[8:]).max() < LOGIT_TOL
    talker.close()


def test_two_streams_in_one_decode_equal_separate_runs(tiny_cv, tmp_path):
    """Guards the q8_0 multi-token crash workaround too: this is a 2-token batch on q8_0 weights."""
    ckpt = Checkpoint.open(tiny_cv)
    write_talker_gguf(ckpt, tmp_path / "talker.gguf", "q8_0")
    rng = np.random.default_rng(1)
    talker = Talker(tmp_path / "talker.gguf", TalkerSettings(n_ctx=256, max_streams=4, deterministic=True))
    a = rng.standard_normal((10, talker.hidden_size)).astype(np.float32)
    b = rng.standard_normal((7, talker.hidden_size)).astype(np.float32)
    # separate
    sep_a = talker.decode_steps(0, a, 6)
    talker.drop(0)
    sep_b = talker.decode_steps(0, b, 4)
    talker.drop(0)
    # together: prefills in one batch, then both streams step in each decode at different positions
    la, ha = [], []
    lb, hb = [], []
    logits, hidden = talker.decode([DecodeItem(1, 0, a[:6]), DecodeItem(2, 0, b[:4])])
    la.append(logits[0]), ha.append(hidden[0]), lb.append(logits[1]), hb.append(hidden[1])
    for k in range(3):
        logits, hidden = talker.decode([DecodeItem(1, 6 + k, a[6 + k:7 + k]), DecodeItem(2, 4 + k, b[4 + k:5 + k])])
        la.append(logits[0]), ha.append(hidden[0]), lb.append(logits[1]), hb.append(hidden[1])
    np.testing.assert_allclose(np.stack(ha), sep_a[1][:4], atol=1e-4)
    np.testing.assert_allclose(np.stack(hb), sep_b[1], atol=1e-4)
    np.testing.assert_allclose(np.stack(la), sep_a[0][:4], atol=1e-3)
    assert talker.length(1) == 9 and talker.length(2) == 7
    talker.drop(1)
    assert talker.length(1) == 0 and talker.length(2) == 7
    talker.close()


@pytest.mark.parametrize("quant", ["bf16", "f16", "q8_0", "q4_k_m", "iq4_nl"])
def test_quantized_talker_agreement(tiny_cv, tmp_path, quant, record_property):
    ckpt = Checkpoint.open(tiny_cv)
    write_talker_gguf(ckpt, tmp_path / "talker.gguf", quant)
    talker = Talker(tmp_path / "talker.gguf", TalkerSettings(n_ctx=128, max_streams=1, deterministic=True))
    rows = np.random.default_rng(2).standard_normal((8, talker.hidden_size)).astype(np.float32)
    logits, _ = talker.decode([DecodeItem(0, 0, rows)])
    ref_logits, _ = talker_forward(tiny_cv, rows)
    err = _rel_rms(logits[0], ref_logits[-1])
    record_property(f"{quant}_logit_rel_rms", err)
    assert err < QUANT_REL_RMS[quant], f"{quant}: relative RMS error {err:.4f}"
    talker.close()


def test_quantized_kv_cache_agreement(checkpoint_factory, tmp_path, record_property):
    """The fast profile's q8_0 KV cache and the opt-in q4_0 one (64-wide heads here) against the official
    logits, with the f16 cache beside them for scale; heads too narrow for their blocks fall back to f16."""
    small = checkpoint_factory("small_cv")
    ckpt = Checkpoint.open(small)
    write_talker_gguf(ckpt, tmp_path / "talker.gguf", "f32")
    rows = np.random.default_rng(3).standard_normal((24, ckpt.config.talker.hidden_size)).astype(np.float32)
    ref_logits, _ = talker_forward(small, rows)
    errs = {}
    for kv in ("f16", "q8_0", "q4_0"):
        talker = Talker(tmp_path / "talker.gguf", TalkerSettings(n_ctx=128, max_streams=1, kv_cache=kv))
        assert talker.kv_cache == kv
        logits, _ = talker.decode_steps(0, rows, 8)
        talker.close()
        errs[kv] = max(_rel_rms(a, b) for a, b in zip(logits, ref_logits[7:]))
        record_property(f"kv_{kv}_logit_rel_rms", errs[kv])
    assert 0 < errs["q8_0"] < QUANT_REL_RMS["q8_0"], errs
    assert errs["f16"] < errs["q8_0"] < errs["q4_0"] < Q4_0_KV_REL_RMS, errs  # each cache's rounding is there

    assert kv_cache_for("q8_0", 16) == "f16" and kv_cache_for("q8_0", 128) == "q8_0"
    assert kv_cache_for("q4_0", 16) == "f16" and kv_cache_for("q4_0", 128) == "q4_0"
    with pytest.raises(ValueError, match="kv_cache"):
        kv_cache_for("q2_k", 128)


def _maps_file(path) -> bool:
    """Whether this process maps `path` (Linux)."""
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(str(path)) for line in f)


@pytest.mark.parametrize("repack", [False, True])
@pytest.mark.parametrize("quant, kinds", [("q4_k_m", {"Q4_K", "Q6_K"}), ("iq4_nl", {"IQ4_NL"})])
def test_4_bit_quants_apply_on_wide_rows(checkpoint_factory, tmp_path, quant, kinds, repack):
    """q4_k_m and iq4_nl as loaded plainly and with llama.cpp's repacked kernels (what the engine uses on
    CPUs without AMX): both agree with the official forward, one row and several at once."""
    if repack and cpu_has_amx() is not False:
        pytest.skip("repacking is only used on CPUs known to lack AMX")
    small = checkpoint_factory("small_cv")
    ckpt = Checkpoint.open(small)
    write_talker_gguf(ckpt, tmp_path / "talker.gguf", quant)
    types = gguf_tensor_types(tmp_path / "talker.gguf")
    assert kinds <= set(types.values()), types
    talker = Talker(tmp_path / "talker.gguf", TalkerSettings(n_ctx=128, max_streams=2, repack=repack))
    # repacked weights live in llama.cpp's own buffers: the file is read, not mapped beside them
    assert _maps_file(tmp_path / "talker.gguf") is not repack
    rows = np.random.default_rng(3).standard_normal((5, talker.hidden_size)).astype(np.float32)
    logits, _ = talker.decode([DecodeItem(0, 0, rows)])
    ref_logits, _ = talker_forward(small, rows)
    assert _rel_rms(logits[0], ref_logits[-1]) < QUANT_REL_RMS[quant]
    for k in range(1, 5):  # the same rows one at a time (single-row kernels) in another sequence
        step, _ = talker.decode([DecodeItem(1, k - 1, rows[k - 1:k])])
        assert _rel_rms(step[0], ref_logits[k - 1]) < QUANT_REL_RMS[quant]
    talker.close()


def test_text_rows_equal_official(ckpt_dir, tmp_path):
    ckpt = Checkpoint.open(ckpt_dir)
    write_text_tables(ckpt, tmp_path / "tables.safetensors")
    tables = EmbeddingTables(tmp_path / "tables.safetensors")
    ids = [151644, 77091, 198, 9707, 1879, 151671, 151672, 151673, 0, 151935]
    np.testing.assert_allclose(tables.text_rows(ids), text_rows(ckpt_dir, ids), atol=1e-5)
    # codec tables are copies of the official embeddings
    talker = load_official(str(ckpt_dir)).model.talker
    np.testing.assert_array_equal(tables.codec_rows([2148, 3061]),
                                  talker.model.codec_embedding.weight.detach().numpy()[[2148, 3061]])
    cp5 = talker.code_predictor.model.codec_embedding[4].weight.detach().numpy()
    np.testing.assert_array_equal(tables.codec[5][[7, 2047]], cp5[[7, 2047]])


def test_bf16_source_stays_bf16(tiny0b6_cv_bf16, tmp_path):
    ckpt = Checkpoint.open(tiny0b6_cv_bf16)
    write_text_tables(ckpt, tmp_path / "tables.safetensors")
    f = SafetensorsFile(tmp_path / "tables.safetensors")
    assert f.dtype_of("text_embedding") == "BF16"
    np.testing.assert_array_equal(f.raw("text_embedding")[:4],
                                  ckpt.weights.raw("talker.model.text_embedding.weight")[:4])


def test_safetensors_bf16_widening_is_exact(tmp_path):
    x = np.array([1.0, -2.5, 3.140625, 1e-3, 65504.0], np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(tmp_path / "t.safetensors", {"a": ("BF16", words), "b": x})
    f = SafetensorsFile(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(f["a"], bf16_to_f32(words))
    np.testing.assert_array_equal(f["b"], x)
    assert f.dtype_of("a") == "BF16" and f.shape_of("a") == (5,)


CAMEL = "OpenAI and McDonald's use JavaScript iPhone APIs."
TEXTS = [CAMEL, "你好，欢迎使用。Hello there.", "It's 3.14 o'clock, DON'T  shout!!\n\nnew para\r\n",
         "Qwen3-TTS 12Hz 🚀 café naïve", "<|im_start|>assistant\nHi<|im_end|>\n", "日本語のテキストです。한국어"]


@pytest.mark.parametrize("version,expected", [("4.57.3", "mistral-fixed"), (None, "mistral-fixed"),
                                              ("4.57.2", "qwen2"), ("5.1.0", "qwen2")])
def test_official_pretokenizer_rule(version, expected):
    assert official_pretokenizer(version) == expected


def test_tokenizer_equals_official_processor(tiny_cv):
    processor = load_official(str(tiny_cv)).processor
    ours = TextTokenizer(tiny_cv, official_pretokenizer("4.57.3"))
    for text in TEXTS:
        assert ours.encode(text) == processor.tokenizer(text)["input_ids"], text
    # the trap: the official pipeline splits CamelCase words, stock Qwen2 BPE does not
    stock = TextTokenizer(tiny_cv, "qwen2")
    assert len(ours.encode(CAMEL)) == len(stock.encode(CAMEL)) + 3


def test_repack_only_for_measured_quants_on_cpus_without_amx():
    from qwen3_tts_gguf.model.talker import repack_pays

    assert not repack_pays("q8_0")  # no gain, slower prefill
    assert not repack_pays("f32") and not repack_pays("f16")
    assert not repack_pays("q4_k_m", deterministic=True)  # the parity profile keeps one kernel path
    assert not repack_pays("q4_k_m", gpu_layers=10)
    assert repack_pays("q4_k_m") == repack_pays("iq4_nl") == (cpu_has_amx() is False)
