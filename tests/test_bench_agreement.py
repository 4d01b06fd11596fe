"""bench/agreement.py on tiny converted models: the tables the full bench and `bench.experiments
talker-quants` report (each quant against the widest talker, the code predictor against fp32, the codec
chunked against whole)."""

from __future__ import annotations

from bench.agreement import STEPS, measure, talker_agreement


def test_agreement_of_the_quantized_paths(converted_factory):
    folders = {"f16/int8": converted_factory("tiny_cv", "f16"),
               "q8_0/fp32": converted_factory("tiny_cv", "q8_0", "fp32"),
               "q8_0/int8": converted_factory("tiny_cv", "q8_0"), "iq4_nl/int8": converted_factory("tiny_cv", "iq4_nl")}
    out = measure({k: str(v) for k, v in folders.items()}, threads=2)
    assert out["reference_quant"] == "f16" and out["steps"] == STEPS + 1
    talker = out["talker"]
    assert set(talker) == {"q8_0", "iq4_nl"}
    # 8-bit follows f16 more closely than 4-bit, and both are close to it, not noise
    assert 0 < talker["q8_0"]["logits_rel_rms_median"] < talker["iq4_nl"]["logits_rel_rms_median"] < 0.5
    assert talker["q8_0"]["code0_agree"] >= 0.9 and 0.3 < talker["iq4_nl"]["code0_agree"] <= 1
    assert set(out["code_predictor"]) == {"int8"} and 0.5 < out["code_predictor"]["int8"]["first_code_agree"] <= 1
    assert out["kv_cache"]["talker"] == "q8_0" and {"q8_0", "q4_0"} <= set(out["kv_cache"])
    assert out["codec"]["snr_db"] > 60

    # talker_agreement alone (what the experiment calls per code sequence): another sequence, other figures
    talkers = {"f16": folders["f16/int8"], "iq4_nl": folders["iq4_nl/int8"]}
    again, (logits, hidden) = talker_agreement(talkers, "f16", threads=2)
    assert again == {"iq4_nl": talker["iq4_nl"]} and len(logits) == len(hidden) == STEPS + 1
    other, _ = talker_agreement(talkers, "f16", threads=2, seed=1)
    assert other["iq4_nl"]["logits_rel_rms_median"] != talker["iq4_nl"]["logits_rel_rms_median"]


def test_talker_quants_experiment_compares_each_quant_and_its_agreement(monkeypatch, tmp_path):
    """`python -m bench.experiments talker-quants`: one variant per `--quants` entry on the preset's code
    predictor, then each against the f16 talker for three code sequences."""
    from bench import experiments

    calls, agreements = [], []

    def compare(args, variants):
        calls.append(variants)
        return {"runs": {}, "concurrency": {}, "markdown": "| runs |"}

    def agreement(talkers, ref, threads, seed=0):
        agreements.append((dict(talkers), ref, seed))
        return {q: {"code0_agree": 0.5 + seed / 10, "logits_rel_rms_median": 0.1} for q in talkers if q != ref}, None

    monkeypatch.setattr(experiments, "_model_dir", lambda shape, quant, cp="int8": tmp_path / f"{shape}-{quant}-{cp}")
    monkeypatch.setattr(experiments, "_compare", compare)
    monkeypatch.setattr("bench.agreement.talker_agreement", agreement)
    args = experiments.build_parser().parse_args(["talker-quants", "--preset", "fast"])
    result = experiments.EXPERIMENTS["talker-quants"](args)
    (variants,) = calls
    assert list(variants) == ["talker q4_k_m (`--preset fast`)", "talker iq4_nl"]
    assert [p["model_dir"] for p, _ in variants.values()] == [str(tmp_path / "0.6b-q4_k_m-int4"),
                                                               str(tmp_path / "0.6b-iq4_nl-int4")]
    assert [seed for _, _, seed in agreements] == [0, 1, 2] and {ref for _, ref, _ in agreements} == {"f16"}
    assert agreements[0][0]["f16"] == tmp_path / "0.6b-f16-int4"
    assert "| iq4_nl | 50.0 % / 60.0 % / 70.0 % | 10.0 % / 10.0 % / 10.0 % |" in result["markdown"]


def test_bench_takes_any_converter_quant():
    """`python -m bench --quants`: any talker quant the converter writes; concurrency follows them in a mode
    that runs it for each of its quants."""
    import pytest

    from bench import cli

    p = cli.build_parser()
    plan = cli._plan(p.parse_args(["--quants", "q8_0,iq4_nl"]))
    assert plan["quants"] == plan["concurrency_quants"] == ["q8_0", "iq4_nl"]
    assert cli._plan(p.parse_args(["--quick", "--quants", "iq4_nl"]))["concurrency_quants"] == ["iq4_nl"]
    with pytest.raises(SystemExit, match="unknown quant"):
        cli._plan(p.parse_args(["--quants", "q9"]))
