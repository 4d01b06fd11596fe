"""The bench's codec-precision block: the variants really built and run on a small codec (the Snake
with `Sin` from the model's checkpoint), and the block's section of the report."""

from __future__ import annotations

from bench import cli, codec_precision
from bench.report.codec import render_codec
from bench.report.page import splice_section


def test_every_variant_is_built_and_measured(tiny_cv_f32):
    block = codec_precision.measure(str(tiny_cv_f32), threads=1, rounds=1)
    variants = block["variants"]
    assert list(variants) == list(codec_precision.VARIANTS)
    assert variants[codec_precision.REFERENCE]["max_abs_diff"] == 0
    for name, v in variants.items():
        assert "error" not in v, (name, v.get("error"))
        assert len(v["ms_per_frame"]) == 1 and v["ms_per_frame"][0] > 0 and v["file_mb"] > 0
    assert variants[codec_precision.SNAKE_SIN]["snr_db"] > 60  # fp32 either way
    assert variants["OpenVINO fp32"]["snr_db"] > 60
    assert variants["int8, Conv + MatMul"]["snr_db"] < variants[codec_precision.SNAKE_SIN]["snr_db"]


def _variant(ms: float, snr: float | None) -> dict:
    return {"changes": "x", "file_mb": 100.0, "ms_per_frame": [ms, ms + 2, ms - 1], "background": [0.0],
            "snr_db": snr, "max_abs_diff": 0.01}


def test_the_section_gives_each_variant_its_verdict():
    block = {"date": "d", "commit": "c", "threads": 2, "frames": 48, "chunks": [1, 2], "rounds": 3,
             "variants": {codec_precision.REFERENCE: _variant(60.0, None), "fp16": _variant(50.0, 37.0),
                          "int8, Conv + MatMul": _variant(40.0, 45.0), codec_precision.SNAKE_SIN: _variant(59.0, 94.0)}}
    text = render_codec(block, standalone=True)
    assert "| fp32 (default) | x | 100 | 60.0 (59.0) | 1.00 | exact |  | the default | 0 % |" in text
    assert "| 37.0 | 1.0e-02 | kept off: SNR below 40 dB |" in text
    assert "| 0.67 | 45.0 | 1.0e-02 | meets the gate |" in text
    assert "kept off: not 5 % faster" in text and "Meets the gate: int8, Conv + MatMul." in text
    del block["variants"]["int8, Conv + MatMul"]
    assert "No variant of ONNX Runtime's graph meets the gate" in render_codec(block)
    block["variants"]["OpenVINO fp32"] = _variant(45.0, 80.0)
    with_openvino = render_codec(block)
    assert "| meets the gate; opt-in (`--codec-runtime openvino`): more memory, see *Codec overlap* |" in with_openvino
    assert "Meets the gate as an option: OpenVINO fp32" in with_openvino and "stays the default" in with_openvino
    block["variants"][codec_precision.SNAKE_SIN] = dict(_variant(50.0, 94.0), background=[0.12, 0.16, 0.10])
    noisy = render_codec(block)  # 0.83 of fp32's time, but measured beside other jobs: no verdict either way
    assert ("| not judged: other processes used 12 % of the CPUs (rerun `python -m bench --only codec` on a quiet "
            "machine) |") in noisy and "Meets the gate: Snake" not in noisy
    assert "Not measured" in render_codec({"error": "worker exited with 1"})
    doc = splice_section("# B\n\n## Machine limits\n\nx\n", "## Codec precision", text)
    assert doc.index("## Codec precision") < doc.index("## Machine limits") and "--only codec" in doc
    assert cli.build_parser().parse_args(["--only", "codec"]).only == "codec"
