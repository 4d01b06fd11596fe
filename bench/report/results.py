"""Readings of the results JSON that several sections share: the machine's limits, the headline run, its
stages against their lower bounds, and the medians of time-to-first-audio runs."""

from __future__ import annotations

from bench.common import median
from bench.report.format import mid, ok_result, split_config


def limit_values(res: dict) -> dict:
    """Best weight-streaming rate (numpy reads or ORT's M=1 MatMul chain, whichever pulled more)
    and best convolution throughput."""
    lim = res.get("machine_limits", {})
    threads = lim.get("threads", 2)
    reads = [v for v in (lim.get(f"read_gbs_{threads}t"), lim.get("read_gbs_1t"), lim.get("gemv_stream_gbs")) if v]
    return {"bw": max(reads) if reads else None, "conv": lim.get("conv_gflops"), "gemm": lim.get("gemm_gflops")}


def probe_spread(res: dict) -> str:
    runs = [r for r in res.get("machine_limits_runs", []) if isinstance(r, dict) and "error" not in r]
    if len(runs) < 2:
        return ""
    t = runs[0].get("threads", 2)
    vals = [r.get(f"read_gbs_{t}t") for r in runs]
    gemv = [r.get("gemv_stream_gbs") for r in runs]
    if None in vals or None in gemv:
        return ""
    return (f"The two probes of this run read {' and '.join(f'{v:.1f}' for v in vals)} GB/s (numpy) and "
            f"{' and '.join(f'{v:.1f}' for v in gemv)} GB/s (ORT MatMul chain). ")


def headline_run(entry: dict):
    ours = entry.get("ours", {})
    for key in (entry.get("headline"), *ours):
        if key in ours and ok_result(ours[key]) and ours[key].get("single"):
            return key, ours[key]
    return None, None


STAGE_KEYS = {"talker": "talker_step_ms", "code predictor": "predictor_ms", "codec": "codec_ms_per_frame"}
"""A stage's per-frame time in a single-stream run's measurements."""


def stage_bound_values(entry: dict, lim: dict) -> list[tuple[str, float, float]]:
    """(stage, ms per frame in the engine, lower bound) of the headline configuration's three stages:
    talker and code predictor at the best weight-streaming rate, the codec at the best Conv1d rate."""
    key, head = headline_run(entry)
    if not head or not lim.get("bw"):
        return []
    quant, cp, _ = split_config(key)
    costs = entry.get("costs", {})
    predictors = costs.get("predictors") or ({"fp32": costs["predictor"]} if costs.get("predictor") else {})
    talker_bytes = costs.get("talker_by_quant", {}).get(quant, {}).get("bytes_per_step", 0)
    codec_flops = costs.get("codec", {}).get("flops_per_frame", 0)
    bound = {"talker": 1e3 * talker_bytes / (lim["bw"] * 1e9),
             "code predictor": 1e3 * predictors.get(cp, {}).get("bytes_per_frame", 0) / (lim["bw"] * 1e9),
             "codec": 1e3 * codec_flops / (lim["conv"] * 1e9) if lim.get("conv") else 0}
    stages = [(name, mid(head["single"], key), bound[name]) for name, key in STAGE_KEYS.items()]
    return [(name, meas, b) for name, meas, b in stages if meas and b]


def latency_medians(head: dict | None) -> dict[str, dict]:
    """{case: {measure: median}} of a headline run's time-to-first-audio runs."""
    runs = [r["cases"] for r in (head or {}).get("latency") or [] if ok_result(r)]
    cases = {case for r in runs for case in r}
    return {case: {k: mid([r[case] for r in runs if case in r], k)
                   for k in ("first_audio_s", "prefill_rows", "prefill_s", "predictor_s", "codec_s")} for case in cases}


def rest_s(cases: list[dict]) -> float | None:
    """Median over runs of what a first audio spent outside its prefill, code predictor and codec calls
    (prompt build, queueing): per run, so that one slow stage does not move another's share."""
    rests = [c["first_audio_s"] - c["prefill_s"] - c["predictor_s"] - c["codec_s"] for c in cases
             if all(c.get(k) is not None for k in ("first_audio_s", "prefill_s", "predictor_s", "codec_s"))]
    return median(rests) if rests else None
