"""The *Targets* section: each goal of the issue *Real-time CPU* next to this run's figure, a verdict, and
what bounds each goal not reached, computed from the run's own figures."""

from __future__ import annotations

from qwen3_tts_gguf.convert.presets import DEFAULT_PRESET, PRESETS

from bench.common import FRAME_RATE
from bench.experiments import OVERLAP_RUNTIMES
from bench.report.busy import busy_figure, busy_slowdowns, weighted_slowdown
from bench.report.first_audio import (
    fastest_cold_words,
    first_audio_best,
    first_audio_medians,
    first_audio_targets,
)
from bench.report.format import fmt_goal, fmt_verdict, mid, msec, num, ok_result, preset_words, split_config
from bench.report.goals import (
    CONCURRENT_RTF_TARGET,
    FAST_RTF_TARGET,
    MEMORY_TARGET_MB,
    ONE_PROCESS_TARGET,
    RTF_TARGET,
    STAGE_BOUND_TARGET,
    STALL_FREE_BELOW_RTF,
    TTFA_TARGETS,
)
from bench.report.memory import config_words, lean_memory, lowest_peak
from bench.report.overlap import overlap_medians, overlap_targets
from bench.report.results import STAGE_KEYS, headline_run, latency_medians, limit_values, stage_bound_values


def render_targets(res: dict) -> str:
    """The "Targets" section: each goal of the issue *Real-time CPU* next to this run's figure for each
    model, a verdict, and for each goal not reached what bounds it (from the same run's figures)."""
    lim = limit_values(res)
    labels = {"0.6b": "0.6B", "1.7b": "1.7B"}
    shapes = list(res["shapes"])
    rows: list[tuple[str, str, list[str], str]] = []  # target, goal, figure per shape, verdict (the first shape)
    bounds: list[str] = []

    def add(target: str, goal: str, figures: list, digits: int, verdict: str, unit: str = "") -> None:
        rows.append((target, goal, [num(v, digits) + (unit if v is not None else "") for v in figures], verdict))

    heads = {shape: headline_run(entry) for shape, entry in res["shapes"].items()}
    first = shapes[0]
    key0, head0 = heads[first]
    label0 = labels.get(first, first)

    # one stream
    rtf = [mid(h["single"], "rtf") if h else None for _, h in heads.values()]
    default = PRESETS[DEFAULT_PRESET]
    quant0, cp0 = split_config(key0)[:2] if key0 else ("?", "?")
    is_default = (quant0, cp0) == (default.quant, default.cp_precision)
    add(f"one stream, {'default' if is_default else 'headline (not the default)'} configuration (talker "
        f"{quant0}, code predictor {cp0}): RTF", fmt_goal(RTF_TARGET), rtf, 2,
        fmt_verdict(rtf[0], RTF_TARGET) if is_default or not key0
        else "not the target's configuration (`--quants` / `--cp` chose another)")
    stage_bounds = {shape: stage_bound_values(res["shapes"][shape], lim) for shape in shapes}
    stages = stage_bounds[first]
    if rtf[0] is not None and rtf[0] > RTF_TARGET and head0:
        s = head0["single"]
        t, c, k = (mid(s, x) for x in ("talker_step_ms", "predictor_ms", "codec_ms_per_frame"))
        floor = sum(b for name, _, b in stages if name != "codec")
        bounds.append(
            f"One stream ({label0}): a frame is {1e3 / FRAME_RATE:.0f} ms of audio; in the engine its talker step took "
            f"{num(t)} ms and its code predictor call {num(c)} ms one after the other, and its codec {num(k)} ms on a "
            f"thread of its own beside them, on the same {res['plan']['threads'][0]} cores. "
            + (f"At this run's measured bandwidth the talker and code predictor alone cannot take less than "
               f"{floor:.0f} ms per frame (RTF ≥ {floor * FRAME_RATE / 1e3:.2f}), however well the codec overlaps."
               if floor else "") + _one_row_rate_bound(res, head0, stages, floor))
    fast = PRESETS["fast"]
    fast_rtf = []
    for shape, (key, _) in heads.items():
        run = (res["shapes"][shape].get("ours", {}).get(f"{fast.quant}+{fast.cp_precision}/t{split_config(key)[2]}")
               if key else None)
        fast_rtf.append(mid(run["single"], "rtf") if ok_result(run) and run.get("single") else None)
    add(f"one stream, `--preset fast` ({preset_words('fast')}; agreement in "
        "*Agreement of the quantized paths*): RTF", fmt_goal(FAST_RTF_TARGET), fast_rtf, 2,
        fmt_verdict(fast_rtf[0], FAST_RTF_TARGET))
    if fast_rtf[0] is not None and fast_rtf[0] > FAST_RTF_TARGET and key0:
        line = _fast_bound(res, first, f"{fast.quant}+{fast.cp_precision}/t{split_config(key0)[2]}", stages)
        if line:
            bounds.append(line)

    # playback without a stall
    pbs = [h.get("playback") if h and ok_result(h.get("playback")) else None for _, h in heads.values()]
    pb = pbs[0]
    if pb is None:
        verdict = "not measured"
    elif (pb.get("rtf") or 0) < STALL_FREE_BELOW_RTF:
        verdict = "**reached**" if not pb.get("stalls") else "**not reached**"
    else:
        verdict = (f"not testable here (RTF {pb['rtf']:.2f}); reached in `tests/test_chunking.py`'s simulations of RTF "
                   f"0.3-0.89")
    rows.append((f"a 30 s text plays without a stall when one stream's RTF < {STALL_FREE_BELOW_RTF}: stalls", "0",
                 ["–" if p is None else f"{p.get('stalls')} (RTF {num(p.get('rtf'), 2)})" for p in pbs], verdict))

    # first audio
    latency = [latency_medians(h) for _, h in heads.values()]
    for case, goal in TTFA_TARGETS.items():
        figures = [lat.get(case, {}).get("first_audio_s") for lat in latency]
        mode, prefix = case.split("/")
        add(f"time to first audio, {mode} text, {prefix}" + (" (words 0.4 s after the stream opened)" if mode == "live"
                                                              else "") + ", s",
            fmt_goal(goal, 2), figures, 3, fmt_verdict(figures[0], goal))
    streaming = _streaming_bound(label0, latency[0], res.get("latency") or {})
    cold = latency[0].get("non-streaming/cold")
    if cold and cold.get("first_audio_s", 0) > TTFA_TARGETS["non-streaming/cold"]:
        bounds.append(
            f"First audio ({label0}, non-streaming, cold): the first frame needs the whole prompt prefilled "
            f"({num(cold.get('prefill_rows'), 0)} rows: {msec(cold.get('prefill_s'))} ms), one code predictor call "
            f"({msec(cold.get('predictor_s'))} ms) and one codec call ({msec(cold.get('codec_s'))} ms), one after the "
            f"other: the prefill's rows share each weight it reads and are bound by the arithmetic, the code "
            f"predictor's 15 steps read their layers from memory each time, and a one-frame codec call reads every "
            f"codec weight for a single frame. A cached voice prefix and live text (the voice prefilled "
            f"while the words are on their way) remove most of the prefill: see *Time to first audio*."
            + fastest_cold_words(res.get("latency") or {}))
    if streaming:
        bounds.append(streaming)

    # eight streams
    aggs = [next((c for c in (h or {}).get("concurrency") or [] if c["streams"] == 8), None) for _, h in heads.values()]
    add("eight streams: aggregate RTF", fmt_goal(CONCURRENT_RTF_TARGET), [c and c["aggregate_rtf"] for c in aggs], 2,
        fmt_verdict(aggs[0] and aggs[0]["aggregate_rtf"], CONCURRENT_RTF_TARGET))
    c8 = aggs[0]
    if c8 and c8["aggregate_rtf"] > CONCURRENT_RTF_TARGET and c8.get("talker_call_ms") and c8.get("frames_total"):
        per_frame = (c8["talker_call_ms"] + c8["predictor_call_ms"]) / 8
        codec = 1e3 * c8["codec_s"] / c8["frames_total"]
        bounds.append(
            f"Eight streams ({label0}): one iteration makes a frame for each stream: the batched talker step took "
            f"{c8['talker_call_ms']:.0f} ms and the batched code predictor call {c8['predictor_call_ms']:.0f} ms, "
            f"{per_frame:.0f} ms per frame together; the codec does not batch across streams (`python -m "
            f"bench.experiments codec-batch`) and took {codec:.0f} ms per frame on the same cores. Their sum, "
            f"{per_frame + codec:.0f} ms per {1e3 / FRAME_RATE:.0f} ms frame, is RTF "
            f"{(per_frame + codec) * FRAME_RATE / 1e3:.2f} before any overlap.")

    # stages
    stage_figs = [", ".join(f"{name} {meas / bound:.1f}×" for name, meas, bound in st) if st else None
                  for st in stage_bounds.values()]
    worst = max((meas / bound for _, meas, bound in stages), default=None)
    rows.append(("each stage against its lower bound (*Each stage next to its physical limit*)",
                 fmt_goal(STAGE_BOUND_TARGET, 1, "×"), [f or "–" for f in stage_figs],
                 fmt_verdict(worst, STAGE_BOUND_TARGET)))
    if worst is not None and worst > STAGE_BOUND_TARGET:
        alone = head0.get("isolated") if ok_result(head0.get("isolated")) else {}
        ratios = [f"{name} {alone[STAGE_KEYS[name]] / bound:.1f}×" for name, _, bound in stages
                  if alone.get(STAGE_KEYS[name])]
        vnni = any("vnni" in f for f in res["machine"].get("flags", []))
        bounds.append(
            f"Stages ({label0}): in the engine the three stages share the cores (the codec runs on threads of its "
            "own beside the other two), so each call is slower than alone"
            + (f" (alone: {', '.join(ratios)} its bound)" if ratios else "") + "."
            + ("" if vnni else " This CPU has no VNNI instructions: the talker's q8_0 and the code predictor's int8 "
               "kernels multiply 8-bit values in several instructions each, and are bound by that arithmetic rather "
               "than by the memory bandwidth the bound assumes."))

    # blocks: busy machine, memory
    busy, mem = res.get("busy"), res.get("memory")
    extra: list[str] = []
    if busy:
        sd = busy_slowdowns(busy)
        ones = [sd[k]["ours"][2] for k in ("cpu1", "stream1") if k in sd and sd[k]["ours"][2] is not None]
        one = max(ones) if ones else None
        weighted = weighted_slowdown(busy)
        extra.append(f"| one busy process (`stress-ng --cpu 1`, `--stream 1`): slowdown | "
                     f"{fmt_goal(ONE_PROCESS_TARGET)}× "
                     f"| {num(one, 2)}× ({label0})"
                     + (f"; {weighted:.2f}× under `--cpu 1` with a larger CPU weight (autogroup nice "
                        f"{busy.get('weighted_nice')})" if weighted is not None else "")
                     + f" | {fmt_verdict(one, ONE_PROCESS_TARGET)}"
                     + (f"; with the larger CPU weight {fmt_verdict(weighted, ONE_PROCESS_TARGET)}"
                        if weighted is not None else "") + " (*Busy machine* says what bounds it) |")
        o2, f2 = (busy_figure(sd, "cpu2", who, 2) for who in ("ours", "official"))
        extra.append(f"| two busy processes (`stress-ng --cpu 2`): slowdown | ≤ official's ({num(f2, 2)}×) | "
                     f"{num(o2, 2)}× ({label0}) | {fmt_verdict(o2, f2) if f2 is not None else 'not measured'} |")
    if mem:
        kv, peak = lowest_peak({k: v for k, v in mem.get("kv", {}).items() if ok_result(v.get("peak"))})
        measured = f"{num(peak, 0)} (`{mem.get('model', '?')}`, KV cache {kv})"
        verdict = fmt_verdict(peak, MEMORY_TARGET_MB)
        lean = lean_memory(mem)
        if lean and (peak is None or lean[3] < peak):
            label, model, lean_kv, lean_peak = lean
            measured += f"; {num(lean_peak, 0)} with {config_words(label)} (`{model}`, KV cache {lean_kv})"
            verdict = (f"{fmt_verdict(lean_peak, MEMORY_TARGET_MB)} with {config_words(label)} and KV cache {lean_kv}; "
                       f"with the default weights {fmt_verdict(peak, MEMORY_TARGET_MB)}"
                       if lean_peak <= MEMORY_TARGET_MB else verdict)
        extra.append(f"| peak RSS, one model serving 8 streams, MiB | ≤ {MEMORY_TARGET_MB} | {measured} | {verdict} "
                     "(*Memory* says where it goes) |")

    extra += overlap_targets(res.get("overlap") or {})
    extra += first_audio_targets(res.get("latency") or {})

    out: list[str] = []
    w = out.append
    w("## Targets (issue *Real-time CPU*)\n")
    w("Each goal next to this run's figure (medians; the sections below give the details). The machine limits of this "
      "run are in *Machine limits*.\n")
    names = [labels.get(sh, sh) for sh in shapes]
    w("| target | goal | " + " | ".join(names) + f" | verdict ({label0}) |")
    w("|---|---|" + "---|" * len(names) + "---|")
    for target, goal, figures, verdict in rows:
        w(f"| {target} | {goal} | " + " | ".join(figures) + f" | {verdict} |")
    w("")
    if extra:
        blocks = [f"*{name}*" for name, key in (("Busy machine", "busy"), ("Memory", "memory"),
                                                ("Codec overlap", "overlap"),
                                                ("Time to first audio per configuration", "latency")) if res.get(key)]
        w(f"From the blocks below, each with its own date ({', '.join(blocks)}):\n")
        w("| target | goal | measured | verdict |\n|---|---|---|---|")
        out.extend(extra)
        w("")
    if bounds:
        w("What bounds the goals not reached, from this run's own figures:\n")
        out.extend(f"- {b}" for b in bounds)
        w("")
    return "\n".join(out) + "\n"


def _one_row_floor(res: dict, weight_bytes: float,
                   stages: list[tuple[str, float, float]]) -> tuple[float, float] | None:
    """(ms per frame to stream `weight_bytes` at the ORT M=1 MatMul chain's rate, the codec's convolution bound in
    ms) of this run; None where it lacks either."""
    gemv = res.get("machine_limits", {}).get("gemv_stream_gbs")
    codec = next((b for name, _, b in stages if name == "codec"), None)
    if not (gemv and weight_bytes and codec):
        return None
    return 1e3 * weight_bytes / (gemv * 1e9), codec


def _one_row_rate_bound(res: dict, head: dict, stages: list[tuple[str, float, float]], floor: float) -> str:
    """" At the rate one-row matmuls stream their weights here ..." : the one-stream floor again, with the
    talker and code predictor at the ORT M=1 MatMul chain's rate instead of a plain read's, and the codec at
    its Conv1d bound, all three on the same cores; "" where the run lacks the figures."""
    bw, gemv = limit_values(res)["bw"], res.get("machine_limits", {}).get("gemv_stream_gbs")
    found = _one_row_floor(res, floor * bw * 1e6, stages) if bw and floor else None
    if found is None or gemv >= bw:
        return ""
    weights, codec = found
    alone = head.get("isolated") if ok_result(head.get("isolated")) else {}
    rates = [f"{name} {b * bw / alone[STAGE_KEYS[name]]:.0f} GB/s" for name, _, b in stages
             if name != "codec" and alone.get(STAGE_KEYS[name])]
    total = weights + codec
    return (f" One-row matmuls stream their weights slower than a plain read here (ONNX Runtime's M=1 MatMul "
            f"chain: {gemv:.1f} GB/s at best, {100 * gemv / bw:.0f} % of the read"
            + (f"; alone, the {' and the '.join(rates)}" if rates else "") + f"): at that rate the talker and "
            f"code predictor take ≥ {weights:.0f} ms per frame, and with the codec's convolutions at the best Conv1d "
            f"rate (≥ {codec:.0f} ms) the three stages need ≥ {total:.0f} ms of these cores per {1e3 / FRAME_RATE:.0f} "
            f"ms frame (RTF ≥ {total * FRAME_RATE / 1e3:.2f}) before any other work.")


def _fast_bound(res: dict, shape: str, key: str, stages: list[tuple[str, float, float]]) -> str | None:
    """What bounds `--preset fast`'s one stream: its stages in the engine, its weights at the one-row MatMul rate
    and the codec at its Conv1d bound; and the preset with OpenVINO's codec (*Codec overlap*). None without
    the run or its costs."""
    entry = res["shapes"][shape]
    run = entry.get("ours", {}).get(key)
    fast = PRESETS["fast"]
    costs = entry.get("costs", {})
    weights = (costs.get("talker_by_quant", {}).get(fast.quant, {}).get("bytes_per_step", 0)
               + (costs.get("predictors") or {}).get(fast.cp_precision, {}).get("bytes_per_frame", 0))
    found = _one_row_floor(res, weights, stages)
    if not (ok_result(run) and run.get("single") and found):
        return None
    stream, codec = found
    rate = res["machine_limits"]["gemv_stream_gbs"]
    t, c, k = (mid(run["single"], x) for x in ("talker_step_ms", "predictor_ms", "codec_ms_per_frame"))
    total = stream + codec
    openvino = overlap_medians((res.get("overlap") or {}).get("fast") or {}, OVERLAP_RUNTIMES[1])[0]
    label = {"0.6b": "0.6B", "1.7b": "1.7B"}.get(shape, shape)
    return (f"`--preset fast` ({label}): in the engine its talker "
            f"step took {num(t)} ms, its code predictor call {num(c)} ms and its codec {num(k)} ms per frame. Its "
            f"weights ({weights / 1e9:.3f} GB per frame) take ≥ {stream:.0f} ms at the one-row MatMul rate "
            f"({rate:.1f} GB/s) and the codec's convolutions ≥ {codec:.0f} ms: RTF ≥ {total * FRAME_RATE / 1e3:.2f} "
            f"on these cores. The codec is the largest part and the furthest from its bound (ONNX Runtime's "
            f"elementwise Snakes and its calls' weight reads come on top of the convolutions)"
            + (f"; on OpenVINO (`--codec-runtime openvino`, *Codec overlap*) the preset ran at RTF {openvino:.2f}"
               if openvino else "") + ".")


def _streaming_bound(label: str, head_latency: dict[str, dict], block: dict) -> str | None:
    """What bounds first audio with streaming text when its goals are not reached: the code predictor and
    one-frame codec calls that follow even a one-row prefill; and the fastest configuration measured."""
    cached, cold = head_latency.get("streaming/cached") or {}, head_latency.get("streaming/cold") or {}
    if not cached.get("first_audio_s") or (cached["first_audio_s"] <= TTFA_TARGETS["streaming/cached"] and
                                           (cold.get("first_audio_s") or 0) <= TTFA_TARGETS["streaming/cold"]):
        return None
    if None in (cached.get("predictor_s"), cached.get("codec_s")):
        return None
    after = cached["predictor_s"] + cached["codec_s"]
    rows = round(cached.get("prefill_rows") or 0)
    line = (f"First audio with streaming text ({label}): after even a prefill of {rows} row{'s' * (rows != 1)} "
            f"({msec(cached.get('prefill_s'))} ms, the voice's prefix cached) the first frame needs the code predictor "
            f"call ({msec(cached['predictor_s'])} ms) and a one-frame codec call ({msec(cached['codec_s'])} ms): "
            f"{1e3 * after:.0f} ms"
            + (f", above the {1e3 * TTFA_TARGETS['streaming/cached']:.0f} ms goal on their own"
               if after > TTFA_TARGETS["streaming/cached"] else "")
            + (f"; cold, the prompt's {num(cold.get('prefill_rows'), 0)} rows add a {msec(cold.get('prefill_s'))} ms "
               "prefill" if cold.get("prefill_s") is not None else "") + ".")
    meds = first_audio_medians(block)
    fastest, value = first_audio_best(meds, "streaming/cached")
    if fastest:
        best = meds[fastest]["streaming/cached"]
        line += (f" The fastest configuration measured, {fastest}, took {msec(best.get('predictor_s'))} + "
                 f"{msec(best.get('codec_s'))} ms for those two calls ({value:.3f} s in all; *Time to first audio per "
                 "configuration*).")
    return line
