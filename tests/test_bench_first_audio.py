"""The bench's time-to-first-audio block: configurations side by side (bench/first_audio.py), its section of
the report and its rows in the targets' table."""

from __future__ import annotations

from pathlib import Path

from test_bench_targets import _results, _row

from bench import cli, first_audio
from bench.report.first_audio import render_first_audio
from bench.report.page import ONLY_RENDERERS, splice_section
from bench.report.targets import render_targets


def _cases(scale: float) -> dict:
    def case(ttfa, rows, prefill, predictor, codec):
        return {"first_audio_s": ttfa * scale, "prefill_rows": rows, "prefill_s": prefill * scale,
                "predictor_s": predictor * scale, "codec_s": codec * scale, "background": 0.01}

    return {"cases": {"non-streaming/cold": case(0.40, 26, 0.25, 0.07, 0.075),
                      "non-streaming/cached": case(0.35, 16, 0.20, 0.07, 0.075),
                      "streaming/cold": case(0.30, 10, 0.15, 0.07, 0.075),
                      "streaming/cached": case(0.18, 1, 0.03, 0.07, 0.075),
                      "live/cold": case(0.20, 1, 0.04, 0.07, 0.075)}}


def _block() -> dict:
    configs = {}
    for c, scale in zip(first_audio.CONFIGS, (1.0, 0.8, 0.7, 0.6)):
        configs[c.label] = {"model": f"0.6b-{c.quant}-cp{c.cp}-x", "quant": c.quant, "cp": c.cp, "engine": c.engine,
                            "runs": [_cases(scale), _cases(scale * 1.1), _cases(scale * 0.9)], "errors": []}
    return {"date": "2026-12-02 15:00 UTC", "commit": "abc", "dirty_files": 0, "threads": 2, "rounds": 3,
            "configs": configs}


class _Bar:
    def set_postfix_str(self, text):
        pass

    def write(self, text):
        pass


class _Progress:
    bar = _Bar()


def test_measure_alternates_the_configurations_and_closes_every_worker(monkeypatch):
    calls, sessions = [], []

    class FakeSession:
        def __init__(self, progress, label, kind, params, timeout=0, env=None):
            self.label, self.kind, self.params, self.closed = label, kind, params, False
            sessions.append(self)

        def call(self, op, rep):
            calls.append((self.label, op, rep))
            if "openvino" in self.label and "iq4_nl" in self.label:
                return {"error": "RuntimeError: no OpenVINO here"}
            return _cases(1.0)

        def close(self):
            self.closed = True
            return {}

    folders = []

    def model_dir(quant, cp):
        folders.append((quant, cp))
        return Path(f"/models/0.6b-{quant}-cp{cp}")

    monkeypatch.setattr("bench.session.Session", FakeSession)
    out = first_audio.measure(_Progress(), 2, 0.0, model_dir, rounds=2)
    labels = [c.label for c in first_audio.CONFIGS]
    assert calls == [(label, "latency", r) for r in range(2) for label in labels]  # rounds alternate
    assert folders == [(c.quant, c.cp) for c in first_audio.CONFIGS]
    assert all(s.closed and s.kind == "ours" and s.params["threads"] == 2 for s in sessions)
    assert [s.params["engine"] for s in sessions] == [c.engine for c in first_audio.CONFIGS]
    assert {"codec_runtime": "openvino"} in [s.params["engine"] for s in sessions]
    configs = out["configs"]
    assert [len(configs[label]["runs"]) for label in labels] == [2, 2, 2, 0]
    assert configs[labels[3]]["errors"] == ["RuntimeError: no OpenVINO here"] * 2
    assert configs[labels[0]]["model"] == f"0.6b-{first_audio.CONFIGS[0].quant}-cp{first_audio.CONFIGS[0].cp}"
    assert out["rounds"] == 2 and out["threads"] == 2


def test_the_section_gives_each_configuration_its_medians_and_where_the_cold_case_goes():
    block = _block()
    text = render_first_audio(block)
    assert text.startswith("## Time to first audio per configuration\n")
    assert "Measured on 2026-12-02 15:00 UTC at commit `abc`:" in text
    default, fast, fast_ov, iq4 = first_audio.CONFIGS
    row = _row(text, default.label)
    assert row[1:6] == ["0.400 (0.360)", "0.350 (0.315)", "0.300 (0.270)", "0.180 (0.162)", "0.200 (0.180)"]
    assert _row(text, "target")[1:6] == ["≤ 0.25", "report", "≤ 0.15", "≤ 0.10", "≤ 0.15"]
    breakdown = [line for line in text.splitlines() if line.startswith(f"| {iq4.label} |")][-1]
    assert [c.strip() for c in breakdown.strip("|").split("|")][1:] == ["26", "150", "42", "45", "3.0"]
    # the lowest medians: iq4_nl + OpenVINO at 0.6 of the default
    assert (f"- non-streaming, cold: 0.240 s with {iq4.label} against ≤ 0.25 s: **reached** with that "
            "configuration") in text
    assert f"- streaming, cached: 0.108 s with {iq4.label} against ≤ 0.10 s: **not reached**" in text
    assert "by `python -m bench --only latency`" in render_first_audio(block, standalone=True)
    assert "**Not measured.**" in render_first_audio({"configs": {}})


def test_a_configuration_whose_runs_failed_says_so():
    block = _block()
    label = first_audio.CONFIGS[3].label
    block["configs"][label].update(runs=[], errors=["RuntimeError: no OpenVINO here"])
    text = render_first_audio(block)
    row = [line for line in text.splitlines() if line.startswith(f"| {label} (")][0]
    assert "1 runs failed: RuntimeError: no OpenVINO here" in row and row.count("–") == 6
    assert f"with {first_audio.CONFIGS[2].label}" in text  # the next fastest takes the lines


def test_the_targets_table_names_the_fastest_configuration():
    res = _results()
    res["latency"] = _block()
    text = render_targets(res)
    iq4 = first_audio.CONFIGS[3].label
    assert _row(text, "time to first audio, non-streaming, cold: the fastest")[1:] == [
        "≤ 0.25", f"0.240 with {iq4} (0.6B)",
        "**reached** with that configuration (*Time to first audio per configuration*)"]
    assert _row(text, "time to first audio, live, cold: the fastest")[1:] == [
        "≤ 0.15", f"0.120 with {iq4} (0.6B)",
        "**reached** with that configuration (*Time to first audio per configuration*)"]
    assert _row(text, "time to first audio, streaming, cold: the fastest")[3] == (
        "**not reached** (*Time to first audio per configuration*)")
    assert "*Time to first audio per configuration*)" in text.split("From the blocks below")[1].splitlines()[0]
    cold_bound = next(line for line in text.splitlines() if line.startswith("- First audio"))
    assert cold_bound.endswith(f"The configuration with the fastest first audio here, {iq4}, took 0.240 s: prefill "
                               "150 ms, code predictor 42 ms, codec 45 ms (*Time to first audio per configuration*).")


def test_only_latency_is_a_block_of_its_own():
    args = cli.build_parser().parse_args(["--only", "latency"])
    assert args.only == "latency" and ONLY_RENDERERS["latency"] is render_first_audio
    doc = "# Benchmarks\n\n## Codec precision\n\nx\n\n## Machine limits (measured in the same run)\n\ny\n"
    spliced = splice_section(doc, cli.ONLY_BLOCKS["latency"], render_first_audio(_block(), standalone=True))
    assert spliced.index("## Codec precision") < spliced.index("## Time to first audio per configuration") < \
        spliced.index("## Machine limits")
