"""A model's section of the report ("## 0.6B CustomVoice"): the headline against the official pipeline, each
stage next to its physical limit, every configuration, time to first audio, playback, concurrent streams,
agreement of the quantized paths, the HTTP server, the official pipeline's details and the ONNX profiles."""

from __future__ import annotations

from qwen3_tts_gguf.convert.presets import PRESETS

from bench.common import FRAME_RATE
from bench.report.format import (
    fmt_background,
    fmt_bytes,
    fmt_goal,
    fmt_ratio,
    gib,
    low,
    mid,
    msec,
    num,
    ok_result,
    split_config,
)
from bench.report.goals import TTFA_TARGETS
from bench.report.results import headline_run, rest_s, stage_bound_values


def render_shape(w, shape: str, entry: dict, res: dict, lim: dict, plan: dict) -> None:
    label = {"0.6b": "0.6B", "1.7b": "1.7B"}.get(shape, shape)
    w(f"## {label} CustomVoice\n")
    if entry.get("vocab") != "qwen2-bpe":
        w("Note: the real vocabulary was not available, so the checkpoint uses a byte-level one and the prompt "
          "is longer than with the real tokenizer.\n")
    key, head = headline_run(entry)
    off = entry.get("official")
    off_ok = ok_result(off)
    costs = entry.get("costs", {})
    talker_costs = costs.get("talker_by_quant", {})
    predictors = costs.get("predictors") or ({"fp32": costs["predictor"]} if costs.get("predictor") else {})
    cc = costs.get("codec", {})
    head_q, head_cp, head_t = split_config(key) if key else (None, None, None)
    pc = predictors.get(head_cp, {})

    # -- headline ------------------------------------------------------------------------
    if head:
        quant, t = head_q, head_t
        s = head["single"]
        w(f"### Headline: ours (talker {quant}, code predictor {head.get('predictor_precision')}, "
          f"{head.get('text_mode')}, {t} threads) vs official qwen-tts (PyTorch fp32, {t} threads)\n")
        w("| | ours | official | speed-up |\n|---|---|---|---|")
        o = off["runs"] if off_ok else []

        def row(name, key_a, key_b=None, scale=1.0, digits=0, note=""):
            key_b = key_b or key_a
            a, b = mid(s, key_a), mid(o, key_b)
            ab, bb = low(s, key_a), low(o, key_b)

            def fa(x):
                return num(None if x is None else x * scale, digits)

            w(f"| {name} | {fa(a)} ({fa(ab)}) | {fa(b)} ({fa(bb)}){note} | {fmt_ratio(b, a)} ({fmt_ratio(bb, ab)}) |")
            return a, b, ab, bb

        stages = [row("talker, ms per frame (one decode step)", "talker_step_ms"),
                  row("code predictor, ms per frame (15 steps)", "predictor_ms"),
                  row("codec, ms per frame", "codec_ms_per_frame")]
        tot = [sum(v[i] for v in stages) if all(v[i] for v in stages) else None for i in range(4)]
        w(f"| sum of the three, ms per frame (real time = {1e3 / FRAME_RATE:.0f}) | {num(tot[0])} ({num(tot[2])}) | "
          f"{num(tot[1])} ({num(tot[3])}) | {fmt_ratio(tot[1], tot[0])} ({fmt_ratio(tot[3], tot[2])}) |")
        row(f"talker prefill ({head.get('prompt_rows')} prompt rows), ms", "prefill_s", scale=1e3)
        row("time to first audio, s", "first_audio_s", digits=2, note=" (not streaming)")
        row("real-time factor (compute s / audio s)", "rtf", digits=2)
        w(f"| peak RSS | {gib(head.get('peak_rss_single_mb'))} | {gib(off.get('peak_rss_mb') if off_ok else None)} | |")
        w(f"| background load (other jobs), median | {fmt_background(s)} | {fmt_background(o)} | |")
        w("")
        w("Each cell: median (best run). Speed-up = official / ours. Per-frame stage times exclude the prefill; "
          "RTF and time to first audio include everything. Our codec runs on a thread of its own beside the talker "
          "and code predictor (see *Codec overlap*), so a frame takes less than the sum of the three (compare the "
          "RTF row), and each codec call is slower than alone because it shares the cores.\n")
        if not off_ok:
            w(f"Official pipeline: {'skipped' if off is None else 'failed: ' + str(off.get('error'))}.\n")

    # -- stage vs bound -------------------------------------------------------------------
    if head and lim.get("bw"):
        w("### Each stage next to its physical limit\n")
        w(f"Bandwidth-bound stages (one token at a time: every weight is read once per step, arithmetic is "
          f"negligible): bound = bytes / {lim['bw']:.1f} GB/s (the best weight-streaming rate measured, see *Machine "
          f"limits*). Compute-bound codec: bound = FLOPs / {num(lim.get('conv'))} GFLOP/s (best measured ORT Conv1d); "
          f"it also re-reads its weights once per call.\n")
        w("| stage | weights | read per frame | work per frame | lower bound, ms/frame | alone, ms/frame "
          "| in the engine (median), ms/frame | × above bound | official, ms/frame |")
        w("|---|---|---|---|---|---|---|---|---|")
        o = off["runs"] if off_ok else []
        iso = head.get("isolated") if ok_result(head.get("isolated")) else {}

        def bandwidth_row(stage: str, weights: str, key: str, nbytes: float, flops: float, measure: str,
                          headline: bool) -> None:
            """The row of a bandwidth-bound stage in `weights` (run `key`; `measure`: its time in the runs)."""
            run = entry["ours"].get(key)
            meas = mid(run["single"], measure) if ok_result(run) and run.get("single") else None
            bound = 1e3 * nbytes / (lim["bw"] * 1e9)
            alone = num(iso.get(measure)) if headline else ""
            w(f"| {stage} | {weights} | {fmt_bytes(nbytes)} | {flops / 1e9:.2f} GFLOP | {bound:.1f} | "
              f"{alone} | {num(meas)} | "
              f"{fmt_ratio(meas, bound)} | {num(mid(o, measure)) + ' (fp32)' if headline else ''} |")

        for quant, tc in talker_costs.items():
            bandwidth_row("talker step", quant, f"{quant}+{head_cp}/t{head_t}", tc["bytes_per_step"],
                          tc["flops_per_step"], "talker_step_ms", quant == head_q)
        for cp, pcost in predictors.items():
            bandwidth_row("code predictor (15 steps)", cp, f"{head_q}+{cp}/t{head_t}", pcost["bytes_per_frame"],
                          pcost["flops_per_frame"], "predictor_ms", cp == head_cp)
        if cc:
            bound = 1e3 * cc["flops_per_frame"] / (lim["conv"] * 1e9) if lim.get("conv") else None
            meas = mid(head["single"], "codec_ms_per_frame")
            chunks = head["single"][0].get("codec_chunks") or []
            avg_chunk = sum(chunks) / len(chunks) if chunks else 1
            w(f"| codec | fp32 | {fmt_bytes(cc['weight_bytes_per_call'])} per call (avg {avg_chunk:.1f} frames/call) | "
              f"{cc['flops_per_frame'] / 1e9:.2f} GFLOP | {num(bound)} | {num(iso.get('codec_ms_per_frame'))} (4 "
              f"frames/call) | {num(meas)} | {fmt_ratio(meas, bound)} | {num(mid(o, 'codec_ms_per_frame'))} (fp32) |")
        w("")
        w("*Alone*: the same loaded objects called back to back outside the engine loop (talker: 16 single-row "
          "steps after the real prompt; code predictor: one frame per call; codec: 4 frames per call). *In the "
          "engine*: the per-call medians of the single-stream runs above, where the three stages alternate.\n")
        ratios = [(meas - bound, meas / bound, name, meas, bound)
                  for name, meas, bound in stage_bound_values(entry, lim)]
        if ratios:
            gap = max(ratios)
            far = max(ratios, key=lambda r: r[1])
            share = max(ratios, key=lambda r: r[3])
            w(f"Headline configuration: furthest from its bound: **{far[2]}** ({far[1]:.1f}×: {far[3]:.0f} ms measured "
              f"vs {far[4]:.0f} ms). Largest absolute gap: **{gap[2]}** ({gap[3] - gap[4]:.0f} ms per frame above its "
              f"bound). Largest share of each frame: **{share[2]}** ({share[3]:.0f} of "
              f"{sum(r[3] for r in ratios):.0f} ms). The {head_cp} code predictor reads "
              f"{fmt_bytes(pc.get('bytes_per_frame', 0))} per frame "
              f"({pc.get('bytes_per_frame', 0) / max(talker_costs.get(head_q, {}).get('bytes_per_step', 1), 1):.1f}× "
              f"the {head_q} talker step): its 5 layers are read once per each of its 15 steps.\n")

    # -- single stream per configuration ---------------------------------------------------
    if entry.get("ours"):
        w("### Our engine, one stream, per configuration\n")
        w("| talker | code predictor | text mode | threads | time to first audio, s | RTF | talker step, ms | "
          "prefill, ms | code predictor, ms/frame | codec, ms/frame | peak RSS | load, s | bg |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for k, r in entry["ours"].items():
            quant, cp, t = split_config(k)
            if not ok_result(r) or not r.get("single"):
                w(f"| {quant} | {cp} | | {t} | failed: {r.get('error') or '; '.join(r.get('errors', []))} | | | | | | "
                  f"| | |")
                continue
            s = r["single"]
            preset = next((f" (`--preset {name}`)" for name, p in PRESETS.items()
                           if name != "default" and (p.quant, p.cp_precision) == (quant, cp)), "")
            w(f"| {quant}{preset} | {r.get('predictor_precision')} | {r.get('text_mode')} | {t} | "
              f"{num(mid(s, 'first_audio_s'), 2)} ({num(low(s, 'first_audio_s'), 2)}) | "
              f"{num(mid(s, 'rtf'), 2)} ({num(low(s, 'rtf'), 2)}) | "
              f"{num(mid(s, 'talker_step_ms'))} ({num(low(s, 'talker_step_ms'))}) | {msec(mid(s, 'prefill_s'))} | "
              f"{num(mid(s, 'predictor_ms_per_frame'))} ({num(low(s, 'predictor_ms_per_frame'))}) | "
              f"{num(mid(s, 'codec_ms_per_frame'))} ({num(low(s, 'codec_ms_per_frame'))}) | "
              f"{gib(r.get('peak_rss_single_mb'))} | {num(r.get('load_s'), 1)} | {fmt_background(s)} |")
        w("")
        w("Time to first audio is measured by the caller: `Engine.submit` → first `AudioChunk` in hand (the engine "
          "emits audio after 1 frame, then chunks of 2, 4, 8 frames). RTF = wall seconds / audio seconds for the "
          "whole utterance, prefill included. Talker step = one `llama_decode` of one row; code predictor = one "
          "ONNX call for the 15 codebooks of a frame, sampling in the graph; codec = stateful ONNX decoder time "
          "divided by frames. Peak RSS is the worker process's (weights are memory-mapped or loaded once).\n")

    if head and head.get("latency"):
        _render_latency(w, head, head_q, head_cp, head_t)
    if head and ok_result(head.get("playback")):
        _render_playback(w, head["playback"], head_q, head_cp, head_t)

    # -- concurrency ---------------------------------------------------------------------
    conc_runs = [(k, r) for k, r in entry.get("ours", {}).items() if ok_result(r) and r.get("concurrency")]
    if conc_runs:
        w("### Concurrent streams\n")
        w("N requests submitted at once; the engine steps them together (one batched talker decode and one batched "
          "code-predictor call per iteration; the codec runs once per stream and chunk). Aggregate RTF = wall time "
          "until the last stream ends / total audio of all streams (below 1 = faster than real time in total); "
          "per-stream RTF = each stream's own wall time / its audio.\n")
        w("| talker | code predictor | threads | streams | aggregate RTF | per-stream RTF | first audio, median / max "
          "s | talker ms per iteration | code predictor ms per call | codec ms per frame | peak RSS | bg |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for k, r in conc_runs:
            quant, cp, t = split_config(k)
            for c in r["concurrency"]:
                codec_pf = 1e3 * c["codec_s"] / c["frames_total"] if c.get("frames_total") else None
                w(f"| {quant} | {cp} | {t} | {c['streams']} | {num(c['aggregate_rtf'], 2)} | "
                  f"{num(c['per_stream_rtf'], 2)} | {num(c['first_audio_s_median'], 2)} / "
                  f"{num(c['first_audio_s_max'], 2)} | {num(c.get('talker_call_ms'))} | "
                  f"{num(c.get('predictor_call_ms'))} "
                  f"(batch {num(c.get('predictor_batch'), 0)}) | {num(codec_pf)} | {gib(r.get('peak_rss_mb'))} | "
                  f"{100 * c['background']:.0f} % |")
        w("")
        w("Scaling against one stream (same configuration, same run): *talker + code predictor* = N × (talker step "
          "+ code predictor call at 1 stream) / (talker + code predictor per iteration at N streams), the work the "
          "batched calls share; *end to end* = aggregate RTF at 1 stream / aggregate RTF at N (the codec runs per "
          "stream, so it does not batch).\n")
        w("| talker | code predictor | streams | talker + code predictor throughput vs 1 stream | end to end vs 1 "
          "stream |")
        w("|---|---|---|---|---|")
        for k, r in conc_runs:
            quant, cp, t = split_config(k)
            by_n = {c["streams"]: c for c in r["concurrency"]}
            one = by_n.get(1)
            if not one:
                continue
            for n, c in sorted(by_n.items()):
                if n == 1:
                    continue
                shared = None
                if all(x.get(f) for x in (one, c) for f in ("talker_call_ms", "predictor_call_ms")):
                    shared = n * (one["talker_call_ms"] + one["predictor_call_ms"]) / (
                        c["talker_call_ms"] + c["predictor_call_ms"])
                w(f"| {quant} | {cp} | {n} | {num(shared, 2)}× | "
                  f"{fmt_ratio(one['aggregate_rtf'], c['aggregate_rtf'], 2)} |")
        w("")

    if ok_result(entry.get("agreement")):
        render_agreement(w, entry["agreement"])

    # -- http ----------------------------------------------------------------------------
    w("### Through the HTTP server\n")
    http = entry.get("http")
    if http is None:
        w(f"Time to first audio through the HTTP server: **{entry.get('http_status') or res.get('http_status')}**.\n")
    elif not ok_result(http):
        w(f"HTTP measurement failed: {http.get('error')}\n")
    else:
        runs = http["runs"]
        w("`python -m qwen3_tts_gguf serve`, `POST /v1/audio/speech` with `response_format: \"pcm\"`, same text, "
          f"voice and seed, `max_frames` {http['frames']} (EOS not suppressed over HTTP: random weights rarely emit "
          f"it).\n")
        w("| | median | best |\n|---|---|---|")
        w(f"| request sent → first PCM byte, s | {num(mid(runs, 'first_audio_s'), 3)} | "
          f"{num(low(runs, 'first_audio_s'), 3)} |")
        w(f"| whole response, s | {num(mid(runs, 'total_s'), 2)} | {num(low(runs, 'total_s'), 2)} |")
        w(f"| RTF | {num(mid(runs, 'rtf'), 2)} | {num(low(runs, 'rtf'), 2)} |")
        first = http.get("first_request") or {}
        if first:
            w(f"| the first request after the start (the server's warm-up spoke this voice and language before its "
              f"port opened), first PCM byte, s | {num(first.get('first_audio_s'), 3)} | |")
        w(f"| server start until /v1/models answers (warm-up included), s | {num(http.get('startup_s'), 1)} | |")
        w("")

    # -- official ------------------------------------------------------------------------
    if off_ok:
        o = off["runs"]
        w("### Official qwen-tts pipeline (details)\n")
        w(f"`Qwen3TTSModel.from_pretrained(checkpoint, dtype=torch.float32)` on the same checkpoint, "
          f"`generate_custom_voice`, {off['threads']} torch threads, hooks time `talker.forward`, "
          f"`code_predictor.generate` and `speech_tokenizer.decode` (reference-harness.md §4).\n")
        w("| prefill, ms | talker step, ms | code predictor, ms/frame | codec, ms/frame | other (generate loop), s | "
          "first frame's codes, s | first audio, s | RTF | peak RSS | bg |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        w(f"| {msec(mid(o, 'prefill_s'))} | {num(mid(o, 'talker_step_ms'))} | {num(mid(o, 'predictor_ms'))} | "
          f"{num(mid(o, 'codec_ms_per_frame'))} | {num(mid(o, 'other_s'), 2)} | {num(mid(o, 'first_codes_s'), 2)} | "
          f"{num(mid(o, 'first_audio_s'), 1)} | {num(mid(o, 'rtf'), 2)} | "
          f"{gib(off.get('peak_rss_mb'))} | {fmt_background(o)} |")
        w("")
        w("The official wrapper is not streaming: its first audio sample exists when the call returns. "
          "\"First frame's codes\" is when a streaming engine with the same math could start its codec.\n")

    # -- profiles ------------------------------------------------------------------------
    if any(p.get("op_time_s") for p in predictors.values()) or cc.get("op_time_s_per_frame"):
        when = f", profiled {costs['measured_at']}" if costs.get("measured_at") else ""
        w(f"### Where the ONNX time goes (ORT profiler, one stream{when})\n")
        for cp, p in predictors.items():
            if not p.get("op_time_s") or not p.get("call_s"):
                continue
            tot = sum(p["op_time_s"].values())
            top = list(p["op_time_s"].items())[:5]
            w(f"Code predictor {cp}, one call ({msec(p['call_s'])} ms in the profiled run): "
              + ", ".join(f"{op} {100 * t / tot:.0f} %" for op, t in top)
              + f". Weights read per call {fmt_bytes(p['bytes_per_frame'])} → "
                f"{p['bytes_per_frame'] / 1e9 / p['call_s']:.1f} "
                f"GB/s achieved.\n")
        if cc.get("op_time_s_per_frame"):
            ops = cc["op_time_s_per_frame"]
            tot = sum(ops.values())
            top = list(ops.items())[:6]
            conv_t = sum(t for op, t in ops.items() if op in ("Conv", "FusedConv", "ConvTranspose"))
            w(f"Codec, {cc.get('profile_frames')} frames per call ({msec(cc.get('call_s_per_frame'))} ms per frame in "
              f"the profiled run): " + ", ".join(f"{op} {100 * t / tot:.0f} %" for op, t in top)
              + f". Convolutions achieve about {cc['flops_per_frame'] / 1e9 / conv_t:.0f} GFLOP/s "
                f"(all {cc['flops_per_frame'] / 1e9:.1f} GFLOP per frame over the convolution time).\n")


def _render_latency(w, head: dict, quant: str, cp: str, threads: str) -> None:
    runs = [r["cases"] for r in head["latency"] if ok_result(r)]
    if not runs:
        return
    w(f"### Time to first audio (talker {quant}, code predictor {cp}, {threads} threads)\n")
    w("A short sentence the engine has not seen (a new one each run), speaker ryan, `Engine.submit` → first "
      "`AudioChunk` (one frame, 80 ms of audio) in the caller's hand. *Cold*: the voice's prompt prefix (role, "
      "speaker and language rows) is prefilled with the request (prefix cache cleared first); *cached*: the "
      "same voice's previous request left its prefix in the prefix cache, so only the rows after it are prefilled. "
      "Non-streaming text mode puts the whole text in the prompt (the HTTP default for CustomVoice); streaming text "
      "mode (the WebSocket and `stream_format` live text) puts only the first text token there. *Live*: a "
      "streaming-text stream opened with no text (as a WebSocket `start`), its words pushed 0.4 s later (an LLM's "
      "first token), prefix cache cleared first: timed from the words; the engine prefilled the voice prefix while "
      "the stream waited, so its prefill holds the text rows only.\n")
    w("| text mode | voice prefix | time to first audio, s | prefill rows | prefill, ms | first code predictor call, "
      "ms | first codec call (1 frame), ms | rest (prompt build, queueing), ms | target | bg |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    for case in runs[0]:
        rs = [r[case] for r in runs if case in r]
        ttfa = mid(rs, "first_audio_s")
        parts = [mid(rs, k) for k in ("prefill_s", "predictor_s", "codec_s")]
        rest = rest_s(rs)
        mode, prefix = case.split("/")
        if mode == "live":
            mode, prefix = "streaming, live: words 0.4 s after the stream opened", "cold, prefilled while waiting"
        w(f"| {mode} | {prefix} | {num(ttfa, 3)} ({num(low(rs, 'first_audio_s'), 3)}) | "
          f"{num(mid(rs, 'prefill_rows'), 0)} | {msec(parts[0])} | {msec(parts[1])} | "
          f"{msec(parts[2])} | {msec(rest)} | "
          f"{fmt_goal(TTFA_TARGETS.get(case), 3) if case in TTFA_TARGETS else 'report'} | {fmt_background(rs)} |")
    w("")
    w(f"Median (best) of {len(runs)} runs. The first frame needs the prefill (its last row gives codebook 0), one "
      "code predictor call (codebooks 1-15) and one codec call; the engine emits a due chunk before the next "
      "talker step, so that step is not part of the latency.\n")


def _render_playback(w, pb: dict, quant: str, cp: str, threads: str) -> None:
    w(f"### Playback of a 30 s text (talker {quant}, code predictor {cp}, {threads} threads)\n")
    frames = pb.get("chunk_frames") or []
    ramp = " → ".join(str(f) for f in frames[:6]) + (" …" if len(frames) > 6 else "")
    w(f"One request of {pb.get('frames')} frames ({num(pb.get('audio_s'), 1)} s of audio), chunks of {ramp} frames. "
      "A player that starts at the first chunk and plays at real time:\n")
    w("| | |\n|---|---|")
    w(f"| first audio, s | {num(pb.get('first_audio_s'), 2)} |")
    w(f"| real-time factor of the request | {num(pb.get('rtf'), 2)} |")
    w(f"| stalls (a chunk arrives after the previous one finished playing) | {pb.get('stalls')} |")
    w(f"| total stall time, s | {num(pb.get('stalled_s'), 1)} |")
    first = pb.get("first_stall_at_s")
    w(f"| first stall, s of audio played | {'none' if first is None else num(first, 2)} |")
    w(f"| pre-buffer that avoids every stall, s | {num(pb.get('prebuffer_s'), 2)} |")
    w(f"| background load | {100 * pb.get('background', 0):.0f} % |")
    w("")
    rtf = pb.get("rtf") or 0
    if rtf > 1:
        w(f"At a real-time factor of {rtf:.2f} on this machine, generation is slower than playback, so no chunk "
          "schedule can avoid stalls for one stream: a player must buffer about (RTF − 1) × duration up front "
          "(the last row). The ramp only decides how early the first sample plays.\n")
    else:
        w("Generation keeps ahead of playback: with the pre-buffer of the last row (0 = none) no chunk arrives "
          "after the player needs it.\n")


def render_agreement(w, ag: dict) -> None:
    w("### Agreement of the quantized paths\n")
    ref = ag.get("reference_quant")
    w(f"Talker quants against the {ref} talker: the headline prompt, then {ag.get('steps', 0) - 1} teacher-forced "
      f"frames, every quant decoding the same rows one step at a time. Code predictor against fp32: greedy, fed the "
      f"{ref} talker's hidden states and codebook-0 codes of those steps. Random weights give small logit margins, "
      "so these agreements are pessimistic; real checkpoints must be measured again.\n")
    w("| path | against | codebook 0 / first code equal | all 15 codes equal | logits, relative RMS error (median) |")
    w("|---|---|---|---|---|")
    for quant, a in ag.get("talker", {}).items():
        w(f"| talker {quant} | talker {ref} | {100 * a['code0_agree']:.1f} % | | "
          f"{100 * a['logits_rel_rms_median']:.2f} % |")
    kv = ag.get("kv_cache") or {}
    for cache, a in ((k, v) for k, v in kv.items() if k != "talker"):
        default = " (the default)" if cache == "q8_0" else ""
        w(f"| talker {kv['talker']}, KV cache {cache}{default} | the same talker, KV cache f16 | "
          f"{100 * a['code0_agree']:.1f} % | | {100 * a['logits_rel_rms_median']:.2f} % |")
    for cp, a in ag.get("code_predictor", {}).items():
        w(f"| code predictor {cp} | code predictor fp32 | {100 * a['first_code_agree']:.1f} % | "
          f"{100 * a['all_codes_agree']:.1f} % | {100 * a['first_logits_rel_rms_median']:.2f} % (first step) |")
    c = ag.get("codec")
    if c:
        snr = "exact" if c.get("snr_db") is None else f"SNR {c['snr_db']:.0f} dB"
        w(f"| codec, chunks of {' + '.join(str(n) for n in c['chunks'])} frames | one call over the same "
          f"{c['frames']} frames | | | {snr}, max abs difference {c['max_abs_diff']:.1e} |")
    w("")
