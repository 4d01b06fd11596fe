"""The bench's codec-precision block: the variants really built and run on a small codec, the
polynomial Snake against the graph it replaces, and the block's section of the report."""

from __future__ import annotations

import numpy as np
import onnx

from bench import cli, codec_precision
from bench.report import render_codec, splice_section
from qwen3_tts_gguf.codec import CodecDecoder
from qwen3_tts_gguf.manifest import CODEC_FILE


def test_the_polynomial_follows_sin_squared():
    coef = codec_precision._snake_coefficients()
    f = np.linspace(-0.5, 0.5, 200001)
    u = f * f
    approx = u * np.polynomial.polynomial.polyval(u, coef)
    assert np.abs(approx - np.sin(np.pi * f) ** 2).max() < 1e-8


def test_the_polynomial_snake_decodes_like_the_graph_it_replaces(tiny_cv_f32, tmp_path):
    source = tiny_cv_f32 / CODEC_FILE
    model, rewritten = codec_precision.snake_as_polynomial(onnx.load(source))
    nodes = onnx.load(source).graph.node
    sines = {n.output[0] for n in nodes if n.op_type == "Sin"}
    snakes = sum(n.op_type == "Mul" and n.input[0] == n.input[1] and n.input[0] in sines for n in nodes)
    left = sum(n.op_type == "Sin" for n in model.graph.node)
    assert rewritten == snakes > 0 and left == len(sines) - snakes  # the rotary embedding's Sin stays
    onnx.save(model, tmp_path / "poly.onnx")
    codes = np.random.default_rng(1).integers(0, 2048, (sum(codec_precision.CHUNKS), 16))
    ref, _ = codec_precision.decode_chunked(CodecDecoder(source, threads=1), codes)
    poly, _ = codec_precision.decode_chunked(CodecDecoder(tmp_path / "poly.onnx", threads=1), codes)
    assert np.abs(poly - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


def test_every_variant_is_built_and_measured(tiny_cv_f32):
    block = codec_precision.measure(str(tiny_cv_f32), threads=1, rounds=1)
    variants = block["variants"]
    assert list(variants) == list(codec_precision.VARIANTS)
    assert variants[codec_precision.REFERENCE]["max_abs_diff"] == 0
    for name, v in variants.items():
        assert "error" not in v, (name, v.get("error"))
        assert len(v["ms_per_frame"]) == 1 and v["ms_per_frame"][0] > 0 and v["file_mb"] > 0
    assert variants["Snake as a polynomial"]["snr_db"] > 60  # fp32 either way
    assert variants["int8, Conv + MatMul"]["snr_db"] < variants["Snake as a polynomial"]["snr_db"]


def _variant(ms: float, snr: float | None) -> dict:
    return {"changes": "x", "file_mb": 100.0, "ms_per_frame": [ms, ms + 2, ms - 1], "background": [0.0],
            "snr_db": snr, "max_abs_diff": 0.01}


def test_the_section_gives_each_variant_its_verdict():
    block = {"date": "d", "commit": "c", "threads": 2, "frames": 48, "chunks": [1, 2], "rounds": 3,
             "variants": {codec_precision.REFERENCE: _variant(60.0, None), "fp16": _variant(50.0, 37.0),
                          "int8, Conv + MatMul": _variant(40.0, 45.0), "Snake as a polynomial": _variant(59.0, 94.0)}}
    text = render_codec(block, standalone=True)
    assert "| fp32 (default) | x | 100 | 60.0 (59.0) | 1.00 | exact |  | the default | 0 % |" in text
    assert "| 37.0 | 1.0e-02 | kept off: SNR below 40 dB |" in text
    assert "| 0.67 | 45.0 | 1.0e-02 | meets the gate |" in text
    assert "kept off: not 5 % faster" in text and "Meets the gate: int8, Conv + MatMul." in text
    del block["variants"]["int8, Conv + MatMul"]
    assert "No variant meets the gate" in render_codec(block)
    assert "Not measured" in render_codec({"error": "worker exited with 1"})
    doc = splice_section("# B\n\n## Machine limits\n\nx\n", "## Codec precision", text)
    assert doc.index("## Codec precision") < doc.index("## Machine limits") and "--only codec" in doc
    assert cli.build_parser().parse_args(["--only", "codec"]).only == "codec"
