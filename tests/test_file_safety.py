"""Damaged or hostile input files are refused up front, with a clear error naming what is wrong.

`.safetensors` files are built byte by byte (each breaks one rule of the format); config.json
files are a copy of the tiny checkpoint's with one dimension made absurd.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from qwen3_tts_gguf.convert import checkpoint
from qwen3_tts_gguf.convert.checkpoint import Checkpoint, CheckpointError, parse_config
from qwen3_tts_gguf.convert.model_shapes import MODEL_TYPES, SHAPES, checkpoint_configs
from qwen3_tts_gguf.model.safetensors_io import SafetensorsError, SafetensorsFile, write_safetensors

from tests.conftest import ROOT

# -- .safetensors ---------------------------------------------------------------------------------

W = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}  # a well-formed entry for 16 data bytes


def _safetensors(header: object, data: bytes = bytes(16), header_len: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data


def test_a_well_formed_file_loads(tmp_path):
    path = tmp_path / "ok.safetensors"
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "empty": np.zeros((0, 3), np.float32),
              "ids": np.array([1, -2], np.int64)}
    write_safetensors(path, arrays)
    f = SafetensorsFile(path)
    assert set(f) == set(arrays) and f.metadata == {"format": "pt"}
    for name, array in arrays.items():
        np.testing.assert_array_equal(f[name], array)
    path.write_bytes(_safetensors({"w": W}, np.arange(4, dtype="<f4").tobytes()))  # by hand, no metadata
    np.testing.assert_array_equal(SafetensorsFile(path)["w"], [[0, 1], [2, 3]])


@pytest.mark.parametrize("content,message", [
    (_safetensors({"w": W}, header_len=1 << 40), "header length 1099511627776 is implausible"),
    (_safetensors({"w": W}, header_len=200), "header length 200 is implausible for a"),
    (b"\x01\x02", "not a readable safetensors file"),
    (_safetensors(b"{not json"), "not a readable safetensors file"),
    (_safetensors([W]), "the header is not a JSON object"),
    (_safetensors({"__metadata__": [1], "w": W}), "__metadata__ is not a JSON object"),
    (_safetensors({"w": {**W, "dtype": "F8"}}), "tensor w has unsupported dtype F8"),
    (_safetensors({"w": {**W, "dtype": ["F32"]}}), "tensor w has unsupported dtype"),
    (_safetensors({"w": {**W, "shape": [-2, -2]}}), r"tensor w has a negative dimension in shape \[-2, -2\]"),
    (_safetensors({"w": {**W, "shape": "2x2"}}), "tensor w has a malformed header entry"),
    (_safetensors({"w": {**W, "data_offsets": [0]}}), "tensor w has a malformed header entry"),
    (_safetensors({"w": {**W, "data_offsets": [0.0, 16.0]}}), "tensor w has a malformed header entry"),
    (_safetensors({"w": {**W, "data_offsets": [16, 0]}}), r"tensor w has data offsets \[16, 0\] out of order"),
    (_safetensors({"w": {**W, "data_offsets": [-16, 0]}}), r"tensor w has data offsets \[-16, 0\] out of order"),
    (_safetensors({"w": {**W, "data_offsets": [0, 32]}}), "tensor w runs past the end of the file"),
    (_safetensors({"w": {**W, "data_offsets": [0, 12]}}), r"tensor w has 12 bytes of data but F32 \[2, 2\] needs 16"),
    (_safetensors({"w": {**W, "shape": [1 << 40, 1 << 40]}}), "tensor w has 16 bytes of data but F32"),
    (_safetensors({"w": W, "v": {**W, "dtype": "BF16", "shape": [3]}}), r"tensor v has 16 bytes .* BF16 \[3\] needs 6"),
])
def test_malformed_files_are_refused_naming_the_problem(tmp_path, content, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(SafetensorsError, match=message) as e:
        SafetensorsFile(path)
    assert isinstance(e.value, ValueError) and str(path) in str(e.value)


@pytest.fixture
def ckpt_copy(tiny_cv, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_cv, dst)
    return dst


def test_the_converter_reports_a_malformed_tensor_in_one_line(ckpt_copy, tmp_path):
    (ckpt_copy / "model.safetensors").write_bytes(_safetensors({"talker.x": {**W, "data_offsets": [0, 12]}}))
    with pytest.raises(CheckpointError, match="tensor talker.x has 12 bytes of data"):
        Checkpoint.open(ckpt_copy)
    r = subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", "convert", str(ckpt_copy), "-o", str(tmp_path / "out")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "tensor talker.x has 12 bytes" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


# -- config dimensions ----------------------------------------------------------------------------

TALKER, CP, DECODER = ("talker_config",), ("talker_config", "code_predictor_config"), ("decoder_config",)


@pytest.mark.parametrize("path,key,value,message", [
    (TALKER, "num_hidden_layers", 100_000,
     r"talker_config.num_hidden_layers = 100000 is not a plausible size \(an integer in 1..448\)"),
    (TALKER, "hidden_size", -64, "talker_config.hidden_size = -64 is not a plausible size"),
    (TALKER, "intermediate_size", 0, "talker_config.intermediate_size = 0 is not a plausible size"),
    (TALKER, "vocab_size", 10 ** 9, "talker_config.vocab_size = 1000000000 is not a plausible size"),
    (TALKER, "text_vocab_size", 10 ** 12, "talker_config.text_vocab_size = 1000000000000"),
    (TALKER, "text_hidden_size", "48", "talker_config.text_hidden_size = '48' is not a plausible size"),
    (TALKER, "num_attention_heads", 10 ** 6, "talker_config.num_attention_heads = 1000000"),
    (TALKER, "head_dim", 4096, "talker_config.head_dim = 4096"),
    (TALKER, "head_dim", 15, "talker_config.head_dim = 15 is odd"),
    (TALKER, "num_key_value_heads", 3, "talker_config: num_attention_heads 4 is not a multiple of num_key_value_heads"),
    (TALKER, "vocab_size", None, "talker_config.vocab_size is missing"),
    (TALKER, "codec_bos_id", 5000, r"codec token ids \{'bos': 5000\} lie outside the codec vocabulary of 3072"),
    (CP, "num_attention_heads", 0, "talker_config.code_predictor_config.num_attention_heads = 0"),
    (CP, "num_hidden_layers", True, "talker_config.code_predictor_config.num_hidden_layers = True"),
    (DECODER, "num_hidden_layers", 10 ** 6, "decoder_config.num_hidden_layers = 1000000"),
    (DECODER, "codebook_size", -1, "decoder_config.codebook_size = -1"),
    (DECODER, "sliding_window", 10 ** 7, "decoder_config.sliding_window = 10000000"),
    (DECODER, "num_key_value_heads", 1, "decoder_config: num_key_value_heads must equal num_attention_heads 2"),
    (DECODER, "upsample_rates", [8, 5, 4, -3], "decoder_config.upsample_rates = -3"),
    (DECODER, "upsample_rates", [2] * 1000, "decoder_config.upsample_rates = .* is not a list of 1..64 factors"),
    (DECODER, "upsample_rates", [2] * 6, "decoder_config: decoder_dim 32 cannot be halved 6 times"),
    (DECODER, "upsample_rates", [8, 5, 4, 4], r"decode_upsample_rate 1920 is not the product of decoder_config"),
    ((), "decode_upsample_rate", 10 ** 9, "speech_tokenizer.decode_upsample_rate = 1000000000"),
])
def test_absurd_config_dimensions_are_refused_before_any_tensor_is_read(ckpt_copy, monkeypatch, path, key,
                                                                      value, message):
    config_file = ckpt_copy / ("speech_tokenizer/config.json" if path in (DECODER, ()) else "config.json")
    config = json.loads(config_file.read_text())
    section = config
    for part in path:
        section = section[part]
    section[key] = value
    config_file.write_text(json.dumps(config))

    def no_tensors(*args):
        raise AssertionError("a tensor file was opened before the config was checked")

    monkeypatch.setattr(checkpoint, "SafetensorsFile", no_tensors)
    with pytest.raises(CheckpointError, match=message):
        Checkpoint.open(ckpt_copy)


def test_a_head_dim_left_out_must_divide_the_hidden_size(ckpt_copy):
    config = json.loads((ckpt_copy / "config.json").read_text())
    config["talker_config"].update(head_dim=None, num_attention_heads=6, num_key_value_heads=2)
    (ckpt_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="talker_config: hidden_size 64 is not a multiple of num_attention_heads"):
        Checkpoint.open(ckpt_copy)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_published_and_test_shape_is_within_the_ceilings(shape):
    for model_type in MODEL_TYPES:
        configs = checkpoint_configs(shape, model_type)
        cfg = parse_config(configs["config.json"], configs["speech_tokenizer/config.json"])
        assert cfg.codec.samples_per_frame == 1920
