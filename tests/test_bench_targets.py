"""The report's *Targets* section: each goal of the issue *Real-time CPU* next to its figure, a
verdict, and what bounds each goal not reached, computed from the run's own figures."""

from __future__ import annotations

import re

from bench import cli
from bench.report.page import render
from bench.report.targets import render_targets


def _single(rtf: float, talker=60.0, predictor=140.0, codec=110.0) -> list[dict]:
    return [{"rtf": rtf, "talker_step_ms": talker, "predictor_ms": predictor, "codec_ms_per_frame": codec,
             "background": 0.0, "first_audio_s": 0.5}] * 3


def _case(ttfa: float, rows=25, prefill=0.35, predictor=0.14, codec=0.09) -> dict:
    return {"first_audio_s": ttfa, "prefill_rows": rows, "prefill_s": prefill, "predictor_s": predictor,
            "codec_s": codec}


_CONC = {"per_stream_rtf": 2.0, "first_audio_s_median": 1.0, "first_audio_s_max": 1.5, "background": 0.0}


def _shape(rtf=3.4, fast_rtf=0.9, playback_rtf=3.4, stalls=48, agg8=1.96, cold=0.59) -> dict:
    head = {"single": _single(rtf),
            "isolated": {"talker_step_ms": 40.0, "predictor_ms": 100.0, "codec_ms_per_frame": 70.0},
            "latency": [{"cases": {"non-streaming/cold": _case(cold), "streaming/cold": _case(0.38, rows=12),
                                   "streaming/cached": _case(0.09, rows=3), "live/cold": _case(0.29, rows=3)}}] * 3,
            "playback": {"rtf": playback_rtf, "stalls": stalls},
            "concurrency": [dict(_CONC, streams=1, aggregate_rtf=rtf),
                            dict(_CONC, streams=8, aggregate_rtf=agg8, talker_call_ms=300.0, predictor_call_ms=500.0,
                                 codec_s=10.5, frames_total=100)]}
    return {"headline": "q8_0+int8/t2",
            "ours": {"q8_0+int8/t2": head, "q4_k_m+int4/t2": {"single": _single(fast_rtf)}},
            "costs": {"talker_by_quant": {"q8_0": {"bytes_per_step": 0.472e9, "flops_per_step": 0.89e9}},
                      "predictors": {"int8": {"bytes_per_frame": 1.373e9, "flops_per_frame": 2.43e9}},
                      "codec": {"flops_per_frame": 4.95e9, "weight_bytes_per_call": 0.456e9}}}


def _results(**shapes) -> dict:
    plan = dict(cli.MODES["full"], mode="full", threads=[2], quiet_s=8.0)
    machine = {"date": "2026-12-01", "commit": "abc", "versions": {}, "cpu": "cpu", "cores": 2, "flags": ["avx2"],
               "kernel": "k", "python": "3.11", "ram_gib": 8}
    return {"plan": plan, "machine": machine, "shapes": shapes or {"0.6b": _shape()},
            "machine_limits": {"threads": 2, "read_gbs_2t": 20.0, "conv_gflops": 100.0}}


def _row(text: str, start: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {start}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_each_goal_has_its_figure_and_verdict():
    text = render_targets(_results())
    assert _row(text, "one stream, default")[1:] == ["≤ 1.2", "3.40", "**not reached**"]
    assert _row(text, "one stream, `--preset fast`")[1:] == ["≤ 1.0", "0.90", "**reached**"]
    assert _row(text, "time to first audio, non-streaming text, cold")[1:] == ["≤ 0.25", "0.590", "**not reached**"]
    assert _row(text, "time to first audio, streaming text, cached")[1:] == ["≤ 0.10", "0.090", "**reached**"]
    assert _row(text, "time to first audio, live text")[1:] == ["≤ 0.15", "0.290", "**not reached**"]
    assert _row(text, "eight streams")[1:] == ["≤ 0.6", "1.96", "**not reached**"]
    # talker 60 ms against 0.472 GB / 20 GB/s = 23.6 ms; codec 110 ms against 4.95 GFLOP / 100 GFLOP/s
    assert _row(text, "each stage")[2] == "talker 2.5×, code predictor 2.0×, codec 2.2×"
    assert "stalls" in _row(text, "a 30 s text")[0] and "not testable here (RTF 3.40)" in _row(text, "a 30 s text")[3]


def test_the_bounds_are_computed_from_the_run():
    text = render_targets(_results())
    bounds = text[text.index("What bounds"):]
    # (23.6 + 68.65) ms per 80 ms frame: RTF >= 1.15 at the measured bandwidth
    assert "cannot take less than 92 ms per frame (RTF ≥ 1.15)" in bounds
    assert "(25 rows: 350 ms), one code predictor call (140 ms) and one codec call (90 ms)" in bounds
    # (300 + 500) / 8 = 100 ms per frame, codec 10.5 s / 100 frames = 105 ms: 205 ms per 80 ms frame
    assert "100 ms per frame together" in bounds and "105 ms per frame" in bounds and "RTF 2.56" in bounds
    assert "alone: talker 1.7×, code predictor 1.5×, codec 1.4× its bound" in bounds
    assert "no VNNI" in bounds
    vnni = _results()
    vnni["machine"]["flags"] = ["avx2", "avx512_vnni"]
    assert "no VNNI" not in render_targets(vnni)


def test_the_one_stream_floor_is_given_again_at_the_one_row_matmul_rate():
    res = _results()
    assert "One-row matmuls" not in render_targets(res)  # no MatMul-chain probe in the run
    res["machine_limits"]["gemv_stream_gbs"] = 10.0  # half the plain read's 20 GB/s
    text = render_targets(res)
    # 92 ms at 20 GB/s -> 184 ms at 10; codec 4.95 GFLOP / 100 GFLOP/s = 49.5 ms; 233.5 ms per 80 ms frame
    assert ("(ONNX Runtime's M=1 MatMul chain: 10.0 GB/s at best, 50 % of the read; alone, the talker 12 GB/s and the "
            "code predictor 14 GB/s): at that rate the talker and code predictor take ≥ 184 ms per frame, and with the "
            "codec's convolutions at the best Conv1d rate (≥ 50 ms) the three stages need ≥ 234 ms of these cores per "
            "80 ms frame (RTF ≥ 2.92)") in text


def test_the_fast_preset_and_streaming_first_audio_get_their_bound_lines():
    res = _results(**{"0.6b": _shape(fast_rtf=1.4)})
    res["shapes"]["0.6b"]["costs"]["talker_by_quant"]["q4_k_m"] = {"bytes_per_step": 0.266e9}
    res["shapes"]["0.6b"]["costs"]["predictors"]["int4"] = {"bytes_per_frame": 0.654e9}
    res["machine_limits"]["gemv_stream_gbs"] = 10.0
    res["overlap"] = {"fast": {"runs": {"codec overlapped, on OpenVINO (`--codec-runtime openvino`)": [{"rtf": 1.1}]}}}
    bounds = render_targets(res).split("What bounds")[1]
    # 0.92 GB at 10 GB/s = 92 ms, codec 49.5 ms: 141.5 ms per 80 ms frame
    assert ("`--preset fast` (0.6B): in the engine its talker step took 60 ms, its code predictor call 140 ms and its "
            "codec 110 ms per frame. Its weights (0.920 GB per frame) take ≥ 92 ms at the one-row MatMul rate (10.0 "
            "GB/s) and the codec's convolutions ≥ 50 ms: RTF ≥ 1.77 on these cores.") in bounds
    assert "on OpenVINO (`--codec-runtime openvino`, *Codec overlap*) the preset ran at RTF 1.10." in bounds
    # streaming: cached 0.09 s reaches its goal, cold 0.38 s does not; the two calls after the prefill: 230 ms
    assert ("First audio with streaming text (0.6B): after even a prefill of 3 rows (350 ms, the voice's prefix "
            "cached) the first frame needs the code predictor call (140 ms) and a one-frame codec call (90 ms): 230 "
            "ms, above the 100 ms goal on their own; cold, the prompt's 12 rows add a 350 ms prefill.") in bounds
    assert "`--preset fast` (0.6B)" not in render_targets(_results(**{"0.6b": _shape(fast_rtf=0.9)}))


def test_goals_reached_have_no_bound_line_and_a_fast_machine_plays_without_stalls():
    fast = _shape(rtf=0.8, playback_rtf=0.8, stalls=0, agg8=0.5, cold=0.2)
    fast["ours"]["q8_0+int8/t2"]["single"] = _single(0.8, talker=20.0, predictor=60.0, codec=40.0)
    text = render_targets(_results(**{"0.6b": fast}))
    assert _row(text, "one stream, default")[-1] == "**reached**"
    assert _row(text, "a 30 s text")[1:] == ["0", "0 (RTF 0.80)", "**reached**"]
    assert "One stream (" not in text and "Eight streams (" not in text and "First audio (" not in text
    stalled = _shape(playback_rtf=0.8, stalls=2)
    assert _row(render_targets(_results(**{"0.6b": stalled})), "a 30 s text")[-1] == "**not reached**"


def test_a_second_model_gets_its_own_column_and_missing_runs_say_so():
    big = _shape(rtf=4.1)
    del big["ours"]["q4_k_m+int4/t2"]
    text = render_targets(_results(**{"0.6b": _shape(), "1.7b": big}))
    assert _row(text, "target")[2:4] == ["0.6B", "1.7B"]
    assert _row(text, "one stream, default")[2:4] == ["3.40", "4.10"]
    assert _row(text, "one stream, `--preset fast`")[2:4] == ["0.90", "–"]


def test_the_blocks_add_busy_machine_and_memory():
    res = _results()
    res["busy"] = {"loads": {"none": {"ours": [{"rtf": 3.0}], "official": [{"rtf": 10.0}]},
                             "cpu1": {"ours": [{"rtf": 4.2}], "official": [{"rtf": 35.0}]},
                             "cpu2": {"ours": [{"rtf": 4.0}], "official": [{"rtf": 37.0}]}}}
    res["memory"] = {"model": "m", "kv": {"q8_0": {"parts": {}, "peak": {"peak_mb": 2212.0}}}}
    text = render_targets(res)
    assert _row(text, "one busy process")[1:3] == ["≤ 1.3×", "1.40× (0.6B)"]
    assert _row(text, "one busy process")[3].startswith("**not reached**")
    assert _row(text, "two busy processes")[1:] == ["≤ official's (3.70×)", "1.33× (0.6B)", "**reached**"]
    res["busy"].update(weighted_nice=-5)
    res["busy"]["loads"]["cpu1"]["weighted"] = [{"rtf": 3.6}]  # 1.20x the unloaded 3.0
    row = _row(render_targets(res), "one busy process")
    assert row[2] == "1.40× (0.6B); 1.20× under `--cpu 1` with a larger CPU weight (autogroup nice -5)"
    assert row[3].startswith("**not reached**; with the larger CPU weight **reached**")
    assert re.search(r"\| peak RSS.* \| ≤ 1536 \| 2,212 \(`m`, KV cache q8_0\) \| \*\*not reached\*\*", text)
    res["memory"]["shapes"] = {"0.6b --preset fast": {"model": "f",
                                                      "kv": {"q4_0": {"parts": {}, "peak": {"peak_mb": 1500.0}}}},
                               "1.7b": {"model": "b", "kv": {"q8_0": {"parts": {}, "peak": {"peak_mb": 1000.0}}}}}
    assert _row(render_targets(res), "peak RSS")[2:] == [
        "2,212 (`m`, KV cache q8_0); 1,500 with `--preset fast` (`f`, KV cache q4_0)",
        "**reached** with `--preset fast` and KV cache q4_0; with the default weights **not reached** (*Memory* says "
        "where it goes)"]


def test_the_full_report_opens_with_the_targets():
    text = render(_results())
    assert text.index("## Setup") < text.index("## Targets") < text.index("## 0.6B CustomVoice")
    assert "| target | goal |" not in render(dict(_results(), shapes={}))


def test_a_quick_run_never_replaces_the_published_report(tmp_path):
    """`--quick` writes its report under bench/out; the full run, `--only` and an explicit --doc keep theirs."""
    p = cli.build_parser()
    assert cli.report_path(p.parse_args([])) == cli.PUBLISHED_REPORT
    assert cli.report_path(p.parse_args(["--quick"])) == cli.QUICK_REPORT
    assert cli.QUICK_REPORT.parent == cli.OUT != cli.PUBLISHED_REPORT.parent
    assert cli.report_path(p.parse_args(["--only", "memory"])) == cli.PUBLISHED_REPORT
    assert cli.report_path(p.parse_args(["--quick", "--doc", str(tmp_path / "r.md")])) == tmp_path / "r.md"


def test_a_headline_other_than_the_default_gets_no_verdict_for_the_default_target():
    """`python -m bench --quants iq4_nl`: its headline is not the default configuration, so the default's
    target names what ran and gives it no verdict."""
    shape = _shape(rtf=1.1)
    shape["ours"]["iq4_nl+int4/t2"] = shape["ours"].pop("q8_0+int8/t2")
    shape["headline"] = "iq4_nl+int4/t2"
    row = _row(render_targets(_results(**{"0.6b": shape})), "one stream, headline")
    assert row[0] == "one stream, headline (not the default) configuration (talker iq4_nl, code predictor int4): RTF"
    assert row[1:3] == ["≤ 1.2", "1.10"] and "not the target's configuration" in row[3]
