"""The bench's memory block: the real measurement on a small model, and its section of the report."""

from __future__ import annotations

from bench import cli, experiments, memory
from bench.experiments import OVERLAP_VARIANTS
from bench.report.memory import MEMORY_PARTS, render_memory
from bench.report.page import splice_section


def test_parts_and_peak_measure_a_real_model(tiny_cv_f32):
    parts = memory.parts(str(tiny_cv_f32), 1, "q8_0")
    assert parts["kv_cache"] == "f16"  # 16-wide heads cannot hold q8_0 blocks
    assert list(parts["shares_mb"]) == list(MEMORY_PARTS)
    assert parts["shares_mb"]["runtimes"] > 20 and parts["kv_cache_mb"] > 0
    assert parts["loaded_mb"] >= sum(parts["shares_mb"].values()) - 1
    peak = memory.peak(str(tiny_cv_f32), 1, "q8_0", frames=4)
    assert peak["peak_mb"] >= peak["loaded_mb"] > 0 and peak["streams"] == 8
    assert 0 < parts["loaded_file_mb"] < parts["loaded_mb"] and 0 < peak["after_file_mb"] < peak["after_mb"]


def _block(peaks=(2100.0, 2500.0)):
    kv = {}
    for name, peak in zip(memory.KV_CACHES, peaks):
        kv[name] = {"parts": {"kv_cache": name, "n_ctx": 8192, "kv_cache_mb": 476.0 if name == "q8_0" else 896.0,
                              "shares_mb": {"runtimes": 65, "tokenizer_tables": 92, "talker": 931,
                                            "code_predictor": 398, "codec": 472},
                              "loaded_mb": 1958, "loaded_file_mb": 500,
                              "files_mb": {"talker.gguf": 453, "code_predictor.onnx": 252, "codec_decoder.onnx": 435,
                                           "text_tables.safetensors": 672}},
                    "peak": {"peak_mb": peak, "loaded_mb": 2000, "streams": 8, "after_file_mb": 610}}
    return {"date": "d", "commit": "c", "model": "m", "threads": 2, "kv": kv}


def test_the_section_names_each_part_and_the_target():
    text = render_memory(_block())
    assert "| **peak, 8 streams** | **2100** | **2500** |" in text
    assert "476 (8192 cells)" in text and "**not reached** (2100 MiB, KV cache q8_0)" in text
    assert "weights alone take 1140 MiB" in text and "holds 8192 cells" in text
    assert ("(clean: the kernel may drop and read them again; shared by processes mapping the same files) "
            "| 500 / 610 |") in text
    assert "**reached** (1400 MiB, KV cache q8_0)" in render_memory(_block((1400.0, 1800.0)))
    assert "Not measured" in render_memory({"kv": {"q8_0": {"parts": {"error": "x"}, "peak": {}}}})
    doc = splice_section("# B\n\n## Machine limits\n\nx\n", "## Memory", render_memory(_block(), standalone=True))
    assert doc.index("## Memory") < doc.index("## Machine limits") and "--only memory" in doc


def test_the_section_adds_a_row_per_larger_model():
    block = _block()
    big = _block((3400.0,))["kv"]
    big["q8_0"]["parts"]["files_mb"]["talker.gguf"] = 1700
    block["shapes"] = {"1.7b": {"model": "1.7b-q8_0-cpint8", "kv": {"q8_0": big["q8_0"]}},
                       "4b": {"model": "x", "kv": {"q8_0": {"parts": {"error": "x"}, "peak": {}}}}}
    text = render_memory(block)
    assert "| 1.7b (`1.7b-q8_0-cpint8`) | q8_0 | 931 (KV 476) | 398 | 472 | 1958 | **3400** | 2387 |" in text
    assert "| 4b | q8_0 | not measured |" in text
    assert "Other models and configurations" in text and "Other models" not in render_memory(_block())


def test_the_leanest_configuration_answers_the_target_beside_the_default():
    block = _block()
    lean = _block((1480.0,))["kv"]["q8_0"]
    block["shapes"] = {"0.6b --preset fast": {"model": "0.6b-q4_k_m-cpint4", "kv": {"q4_0": lean}}}
    text = render_memory(block)
    assert ("**reached with `--preset fast` and KV cache q4_0** (1480 MiB, `0.6b-q4_k_m-cpint4`, in the table "
            "below); with the default weights **not reached** (2100 MiB, KV cache q8_0)") in text
    assert "| 0.6b --preset fast (`0.6b-q4_k_m-cpint4`) | q4_0 |" in text and "weights alone take 1140 MiB" in text
    lean["peak"]["peak_mb"] = 1600.0
    assert "**not reached with `--preset fast` and KV cache q4_0** (1600 MiB" in render_memory(block)


def test_command_line_runs_the_block_in_full_mode_only():
    p = cli.build_parser()
    assert cli._plan(p.parse_args([]))["memory"] is True
    assert cli._plan(p.parse_args(["--quick"]))["memory"] is False
    assert p.parse_args(["--only", "memory"]).only == "memory"


def test_the_overlap_section_compares_the_default_with_inline():
    from bench.report.overlap import render_overlap

    run = lambda rtf: {"rtf": rtf, "first_audio_s": 0.3}  # noqa: E731
    block = {"date": "d", "commit": "c", "threads": 2, "frames": 32, "rounds": 2, "markdown": "| table |",
             "runs": {name: [run(a), run(b)] for name, (a, b) in
                      zip(OVERLAP_VARIANTS, ((3.0, 3.2), (2.9, 2.9), (2.7, 2.7), (2.4, 2.4)))},
             "concurrency": {name: {"aggregate_rtf": r, "peak_rss_mb": m} for name, r, m in
                             zip(OVERLAP_VARIANTS, (1.8, 1.6, 1.5, 1.4), (2000, 2000, 2100, 2500))}}
    text = render_overlap(block, standalone=True)
    assert "## Codec overlap" in text and "| table |" in text and "--only overlap" in text
    assert ("against inline: one stream's RTF 3.10 → 2.90 (-6 %); eight streams' aggregate RTF 1.80 → 1.60 "
            "(-11 %)") in text
    assert ("(`--codec-threads 1`) against the default: one stream's RTF 2.90 → 2.70 (-7 %); eight streams' aggregate "
            "RTF 1.60 → 1.50 (-6 %); first audio 0.30 → 0.30 s; peak RSS after eight streams 2000 → 2100 MiB") in text
    assert ("(`--codec-runtime openvino`) against the default: one stream's RTF 2.90 → 2.40 (-17 %); eight streams' "
            "aggregate RTF 1.60 → 1.40 (-13 %); first audio 0.30 → 0.30 s; peak RSS after eight streams "
            "2000 → 2500 MiB") in text
    assert cli.build_parser().parse_args(["--only", "overlap"]).only == "overlap"
    assert "--preset fast" not in text  # no fast comparison measured, none rendered

    default, openvino = experiments.OVERLAP_RUNTIMES
    block["fast"] = {"markdown": "| fast table |", "runs": {default: [run(1.1)], openvino: [run(0.95)]},
                     "concurrency": {default: {"aggregate_rtf": 0.8, "peak_rss_mb": 1700},
                                     openvino: {"aggregate_rtf": 0.7, "peak_rss_mb": 2300}}}
    text = render_overlap(block, standalone=True)
    assert "With `--preset fast` (talker q4_k_m, code predictor int4)" in text and "| fast table |" in text
    assert ("`--preset fast`: the codec on OpenVINO against the default: one stream's RTF 1.10 → 0.95 (-14 %); eight "
            "streams' aggregate RTF 0.80 → 0.70 (-13 %); first audio 0.30 → 0.30 s; peak RSS after eight streams "
            "1700 → 2300 MiB.") in text


def test_the_targets_take_openvino_from_the_overlap_block():
    from bench.report.overlap import overlap_targets

    run = lambda rtf: {"rtf": rtf, "first_audio_s": 0.3}  # noqa: E731
    default, openvino = experiments.OVERLAP_RUNTIMES
    block = {"runs": {default: [run(1.7)], openvino: [run(1.6)]},
             "concurrency": {openvino: {"aggregate_rtf": 0.88, "peak_rss_mb": 2900}},
             "fast": {"runs": {default: [run(1.1)], openvino: [run(0.9), run(1.0), run(0.98)]},
                      "concurrency": {openvino: {"aggregate_rtf": 0.58, "peak_rss_mb": 2300}}}}
    one, eight = overlap_targets(block)
    assert one == ("| one stream, `--preset fast` (talker q4_k_m, code predictor int4) with `--codec-runtime "
                   "openvino`: RTF | ≤ 1.0 | 0.98 (0.6B; peak RSS after eight streams 2,300 MiB) | **reached** (*Codec "
                   "overlap*) |")
    assert eight == ("| eight streams with `--codec-runtime openvino`: aggregate RTF | ≤ 0.6 | 0.88 with the default "
                     "weights; 0.58 with `--preset fast` (0.6B) | **reached** (*Codec overlap*) |")
    assert overlap_targets({}) == []


def test_the_overlap_variants_name_their_settings():
    """The default asks nothing but the overlap; the lanes ask calls of one thread, as `--codec-threads 1`."""
    names = list(OVERLAP_VARIANTS)
    assert OVERLAP_VARIANTS[names[1]] == {"codec_overlap": True} and "(default)" in names[1]
    assert OVERLAP_VARIANTS[names[2]] == {"codec_overlap": True, "codec_threads": 1} and "--codec-threads 1" in names[2]
    assert OVERLAP_VARIANTS[names[3]] == {"codec_overlap": True, "codec_runtime": "openvino"}
    assert "--codec-runtime openvino" in names[3]
    assert "inline" in names[0]


def test_the_agreement_table_shows_the_kv_cache_row():
    from bench.report.shape import render_agreement

    out: list[str] = []
    render_agreement(out.append, {"reference_quant": "f16", "steps": 49, "talker": {}, "code_predictor": {},
                                   "kv_cache": {"talker": "q8_0", "q8_0": {"code0_agree": 0.98,
                                                                           "logits_rel_rms_median": 0.016},
                                                "q4_0": {"code0_agree": 0.94, "logits_rel_rms_median": 0.071}}})
    assert "| talker q8_0, KV cache q8_0 (the default) | the same talker, KV cache f16 | 98.0 % | | 1.60 % |" in out
    assert "| talker q8_0, KV cache q4_0 | the same talker, KV cache f16 | 94.0 % | | 7.10 % |" in out


def test_the_overlap_block_runs_the_experiment_with_its_whole_command_line(monkeypatch, tmp_path):
    """`python -m bench --only overlap` builds the experiment's arguments with the experiments' own parser
    (a hand-made namespace missed --preset once and the block failed before it ran): every variant on the
    default weights, then the default codec and OpenVINO's on `--preset fast`'s."""
    from bench import experiments

    calls = []

    def compare(args, variants):
        calls.append((args, variants))
        return {"runs": {}, "concurrency": {}, "markdown": f"| {args.preset} |"}

    monkeypatch.setattr(experiments, "_model_dir", lambda shape, quant, cp="int8": tmp_path / f"{shape}-{quant}-{cp}")
    monkeypatch.setattr(experiments, "_compare", compare)
    block = cli._overlap(threads=2, quiet_s=0.0)
    assert block["markdown"] == "| default |" and block["fast"]["markdown"] == "| fast |"
    (args, variants), (fast_args, fast_variants) = calls
    assert args.preset == "default" and args.threads == 2 and fast_args.preset == "fast" and fast_args.threads == 2
    assert list(variants) == list(OVERLAP_VARIANTS)
    assert [OVERLAP_VARIANTS[n] for n in fast_variants] == [{"codec_overlap": True},
                                                            {"codec_overlap": True, "codec_runtime": "openvino"}]
    for name, (params, env) in variants.items():
        assert params["model_dir"].endswith("0.6b-q8_0-int8") and params["threads"] == 2 and env == {}
        assert params["engine"] == OVERLAP_VARIANTS[name]
    for name, (params, env) in fast_variants.items():
        assert params["model_dir"].endswith("0.6b-q4_k_m-int4") and params["engine"] == OVERLAP_VARIANTS[name]
