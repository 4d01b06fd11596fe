"""Results JSON -> docs/benchmarks.md (every figure labelled; medians, with the best run beside)."""

from __future__ import annotations

from qwen3_tts_gguf.convert.presets import DEFAULT_PRESET, PRESETS
from qwen3_tts_gguf.cpus import SPIN_COUNT
from qwen3_tts_gguf.model import KV_CELLS_PER_STREAM

from .busy import LOADS as BUSY_LOADS
from .common import FRAME_RATE, TEXT, median
from .experiments import EXPERIMENTS, OVERLAP_RUNTIMES, OVERLAP_VARIANTS, STRESS_ARGS

SAMPLING = "temperature 0.9, top-k 50, top-p 1.0 for codebook 0 (repetition penalty 1.05) and for the code predictor"

# The goals of the issue *Real-time CPU* (2-core machine), each rendered next to its figure in *Targets*
RTF_TARGET = 1.2  # one stream, default configuration
FAST_RTF_TARGET = 1.0  # one stream, the `fast` preset
STALL_FREE_BELOW_RTF = 0.9  # a 30 s text plays without a stall whenever one stream's RTF is below this
TTFA_TARGETS = {"non-streaming/cold": 0.25, "streaming/cold": 0.15, "streaming/cached": 0.10, "live/cold": 0.15}
CONCURRENT_RTF_TARGET = 0.6  # eight streams' aggregate RTF
STAGE_BOUND_TARGET = 1.5  # each stage within this factor of its lower bound
ONE_PROCESS_TARGET = 1.3  # slowdown beside one busy process
MEMORY_TARGET_MB = 1536  # one model for up to 8 streams within 1.5 GB


def _f(x, digits: int = 0, unit: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and digits == 0 and abs(x) < 10:
        digits = 1
    return f"{x:,.{digits}f}{unit}"


def _ms(x) -> str:
    return "–" if x is None else _f(1e3 * x)


def _vals(runs: list, key: str) -> list:
    return [r.get(key) for r in runs if r.get(key) is not None]


def _med(runs, key):
    return median(_vals(runs, key))


def _best(runs, key):
    v = _vals(runs, key)
    return min(v) if v else None


def _mb(x) -> str:
    return "–" if x is None else f"{x / 1024:.2f} GB"


def _gb(nbytes) -> str:
    return f"{nbytes / 1e9:.3f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def _x(a, b, digits: int = 1) -> str:
    if not a or not b:
        return "–"
    return f"{a / b:.{digits}f}×"


def _bg(runs) -> str:
    v = _vals(runs, "background")
    return "–" if not v else f"{100 * median(v):.0f} %"


def _ok(r) -> bool:
    return isinstance(r, dict) and "error" not in r


def _limits(res: dict) -> dict:
    """Best weight-streaming rate (numpy reads or ORT's M=1 MatMul chain, whichever pulled more)
    and best convolution throughput."""
    lim = res.get("machine_limits", {})
    threads = lim.get("threads", 2)
    reads = [v for v in (lim.get(f"read_gbs_{threads}t"), lim.get("read_gbs_1t"), lim.get("gemv_stream_gbs")) if v]
    return {"bw": max(reads) if reads else None, "conv": lim.get("conv_gflops"), "gemm": lim.get("gemm_gflops")}


def _probe_spread(res: dict) -> str:
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


def _headline_run(entry: dict):
    ours = entry.get("ours", {})
    for key in (entry.get("headline"), *ours):
        if key in ours and _ok(ours[key]) and ours[key].get("single"):
            return key, ours[key]
    return None, None


STAGE_KEYS = {"talker": "talker_step_ms", "code predictor": "predictor_ms", "codec": "codec_ms_per_frame"}
"""A stage's per-frame time in a single-stream run's measurements."""


def _stage_bounds(entry: dict, lim: dict) -> list[tuple[str, float, float]]:
    """(stage, ms per frame in the engine, lower bound) of the headline configuration's three stages:
    talker and code predictor at the best weight-streaming rate, the codec at the best Conv1d rate."""
    key, head = _headline_run(entry)
    if not head or not lim.get("bw"):
        return []
    quant, cp, _ = _split(key)
    costs = entry.get("costs", {})
    predictors = costs.get("predictors") or ({"fp32": costs["predictor"]} if costs.get("predictor") else {})
    talker_bytes = costs.get("talker_by_quant", {}).get(quant, {}).get("bytes_per_step", 0)
    codec_flops = costs.get("codec", {}).get("flops_per_frame", 0)
    bound = {"talker": 1e3 * talker_bytes / (lim["bw"] * 1e9),
             "code predictor": 1e3 * predictors.get(cp, {}).get("bytes_per_frame", 0) / (lim["bw"] * 1e9),
             "codec": 1e3 * codec_flops / (lim["conv"] * 1e9) if lim.get("conv") else 0}
    stages = [(name, _med(head["single"], key), bound[name]) for name, key in STAGE_KEYS.items()]
    return [(name, meas, b) for name, meas, b in stages if meas and b]


def _split(key: str) -> tuple[str, str, str]:
    """'q8_0+int8/t2' -> ('q8_0', 'int8', '2')"""
    qc, t = key.split("/t")
    q, _, cp = qc.partition("+")
    return q, cp or "fp32", t


def render(res: dict) -> str:
    plan, m = res["plan"], res["machine"]
    lim = _limits(res)
    out: list[str] = []
    w = out.append
    quick = plan["mode"] == "quick"
    w("# Benchmarks\n")
    dirty = f" (+{m['dirty_files']} modified tracked files)" if m.get("dirty_files") else ""
    w(f"Generated by `python -m bench{' --quick' if quick else ''}` on {m['date']} at commit `{m['commit']}`{dirty}. "
      "Do not edit by hand: rerun the harness (`bench/`), which rewrites this file. The README quotes only figures "
      "from here.\n")
    if quick:
        w("**Quick mode**: 0.6B only, talker q8_0 only, fewer frames and repeats. `python -m bench` runs every quant, "
          "a thread sweep and 1.7B.\n")
    w("All models have **random weights at the real shapes** (`make-random`, BF16 talker like the published repos; "
      "the text table at its real 151,936 rows) so the speed is that of the real checkpoints; the audio is noise. "
      "EOS is suppressed so every utterance has exactly the planned number of frames (80 ms each).\n")

    # -- setup --------------------------------------------------------------------------
    w("## Setup\n")
    v = m["versions"]
    rows = [
        ("CPU", f"{m['cpu']} ({m.get('vendor') or '?'}), {m['cores']} cores"
                f"{' (virtual machine)' if m.get('hypervisor') else ''}; flags: {', '.join(m['flags']) or '–'}"
                f"; AMX {'yes' if any(f.startswith('amx') for f in m['flags']) else 'no'}"),
        ("Memory", f"{m['ram_gib']:.0f} GiB" if m.get("ram_gib") else "?"),
        ("OS / Python", f"Linux {m['kernel']}, Python {m['python']}"),
        ("Runtimes", f"llama-cpp-python {v.get('llama_cpp_python')}, onnxruntime {v.get('onnxruntime')}, "
                     f"numpy {v.get('numpy')}; reference: qwen-tts {v.get('qwen-tts')}, torch {v.get('torch')}, "
                     f"transformers {v.get('transformers')}"),
        ("Commit", f"`{m['commit']}` {m.get('commit_subject', '')}"),
        ("Date", m["date"]),
        ("Workload", f"speaker ryan, English, one {len(TEXT.split())}-word sentence (\"{TEXT}\"), non-streaming "
                     "text layout (the whole text in the prompt), seed fixed per run"),
        ("Sampling", SAMPLING + " (the shipped defaults), in both implementations"),
        ("Frames", f"{plan['frames']} per utterance ({plan['frames'] / FRAME_RATE:.1f} s of audio); official "
                   f"{plan['official_frames']}; concurrency runs {plan['concurrency_frames']} per stream"),
        ("Repeats", f"{plan['reps']} measured runs per configuration after one warm-up (official: "
                    f"{plan['official_reps']}); tables show the **median**, best run in parentheses. Our headline "
                    f"configuration and the official pipeline are loaded side by side in two processes and their "
                    f"runs alternate, so both see the same background load"),
        ("Threads", f"{', '.join(map(str, plan['threads']))} per runtime (llama.cpp and ONNX Runtime each get this "
                    f"many; they run one after the other within an engine iteration); the official pipeline uses "
                    f"`torch.set_num_threads` with the same number"),
        ("Load on the machine", f"load average {' '.join(m.get('loadavg_start', []))} at the start, "
                                f"{' '.join(res.get('loadavg_end', []))} at the end; before each run the harness "
                                f"waits up to {plan['quiet_s']:.0f} s for other jobs to go quiet; the *bg* columns "
                                f"give the share of all CPUs other processes used during each measurement"),
    ]
    w("| | |\n|---|---|")
    for k, val in rows:
        w(f"| {k} | {val} |")
    w("")
    w("**Noise warning.** This is a shared 2-core machine and other jobs ran during the measurements. When another "
      "process takes one of the two cores, each of our 2-thread steps waits at its barriers for the thread that "
      "shares a core (llama.cpp's OpenMP threads spin a few microseconds there, then sleep" + (", see *Busy machine*" if
                                                                                 res.get("busy") else "")
      + "), so a run can "
      "become slower (see *bg*; the full run adds a 1-thread configuration). Compare figures only with their *bg* "
      "column in mind; the best run approximates a quiet machine.\n")

    if res.get("skipped"):
        w(f"**Skipped to stay within the {plan.get('budget_s') or 0:.0f} s budget of this mode:** "
          + "; ".join(res["skipped"]) + ".\n")

    if res["shapes"]:
        w(render_targets(res))
    for shape, entry in res["shapes"].items():
        _render_shape(w, shape, entry, res, lim, plan)

    if res.get("busy"):
        w(render_busy(res["busy"]))
    if res.get("memory"):
        w(render_memory(res["memory"]))
    if res.get("overlap"):
        w(render_overlap(res["overlap"]))
    if res.get("codec"):
        w(render_codec(res["codec"]))
    if res.get("latency"):
        w(render_first_audio(res["latency"]))

    # -- machine limits -------------------------------------------------------------------
    L = res.get("machine_limits", {})
    if _ok(L):
        t = L.get("threads", 2)
        w("## Machine limits (measured in the same run)\n")
        w("| measurement | best | median | how |\n|---|---|---|---|")
        w(f"| memory read, 1 thread | {_f(L.get('read_gbs_1t'), 1)} GB/s | {_f(L.get('read_gbs_1t_median'), 1)} GB/s | "
          f"best of numpy sum / max / dot over a {L.get('buffer_mib')} MiB buffer |")
        if t != 1:
            w(f"| memory read, {t} threads | {_f(L.get(f'read_gbs_{t}t'), 1)} GB/s | "
              f"{_f(L.get(f'read_gbs_{t}t_median'), 1)} GB/s | same, {t} threads on equal slices |")
            w(f"| memory copy, {t} threads | {_f(L.get(f'copy_gbs_{t}t'), 1)} GB/s | "
              f"{_f(L.get(f'copy_gbs_{t}t_median'), 1)} GB/s | read + write counted (STREAM convention) |")
        w(f"| ORT fp32 M=1 MatMul chain | {_f(L.get('gemv_stream_gbs'), 1)} GB/s | {_f(L.get('gemv_stream_gbs_median'), 1)} GB/s | "
          f"8 × [1,1024]·[1024,3072]-sized weights (100 MB), weight bytes / time, {t} threads |")
        w(f"| ORT fp32 GEMM | {_f(L.get('gemm_gflops'))} GFLOP/s | {_f(L.get('gemm_gflops_median'))} GFLOP/s | "
          f"[256,2048]·[2048,2048], {t} threads |")
        w(f"| ORT fp32 Conv1d | {_f(L.get('conv_gflops'))} GFLOP/s | {_f(L.get('conv_gflops_median'))} GFLOP/s | "
          f"384→384 channels, k7, dilation 3, 1280 samples (a codec residual unit), {t} threads |")
        w(f"| numpy fp32 GEMM | {_f(L.get('numpy_gemm_gflops'))} GFLOP/s | {_f(L.get('numpy_gemm_gflops_median'))} GFLOP/s | "
          f"2048³, OpenBLAS |")
        w("")
        w("The lower bounds above use the best weight-streaming rate (the larger of the memory reads and the ORT "
          "MatMul chain) and the best Conv1d throughput measured here, at the start and at the end of the run. "
          + _probe_spread(res) + "On a shared or virtual machine the bandwidth varies with the neighbours, so a "
          "bound is a floor for *this* run, not a constant.\n")

    w("## Reproduce\n")
    w("```\n. .venv/bin/activate\npython -m bench --quick      # < 5 min: 0.6B, q8_0; its report goes to bench/out/benchmarks-quick.md\n"
      "python -m bench              # every quant, thread sweep, 0.6B and 1.7B, busy machine, memory, overlap, codec\n"
      "python -m bench --only busy  # ~15 min: only the busy-machine block, merged into the last full results\n"
      "python -m bench --only memory    # ~4 min: RSS per part and at 8 streams, per KV-cache precision; 1.7B\n"
      "python -m bench --only overlap   # ~8 min: the codec inline against overlapped, every way; --preset fast on OpenVINO\n"
      "python -m bench --only codec     # ~3 min: the codec graph in other precisions, speed and SNR\n"
      "python -m bench --only latency   # ~2 min: time to first audio of the configurations a user can choose\n"
      "python -m bench --shapes 0.6b --quants q8_0,q4_k_m --reps 3   # a subset\n```\n")
    w("Checkpoints and converted models are cached in `bench/cache/` (rebuilt when the generator or the converter "
      "changes); raw results go to `bench/out/results-*.json` and `python -m bench --render FILE` re-renders this page. "
      "Prototypes of engine changes (ONNX Runtime thread spinning, llama.cpp repacking, code predictor precision and "
      "block size, batching the codec, the codec's thread, the converter's presets, talker quants side by side with "
      "their agreement, glibc's mmap threshold, OpenMP's spin count and wait policy, the converter's graph variants, other llama_cpp builds) "
      "are measured separately by `python -m bench.experiments "
      f"{'|'.join(EXPERIMENTS)}` (`--load {'|'.join(STRESS_ARGS)}` beside a stress-ng load).\n")
    return "\n".join(out) + "\n"


def _goal(value: float, digits: int = 1, unit: str = "") -> str:
    return f"≤ {value:.{digits}f}{unit}"


def _verdict(value, goal) -> str:
    if value is None:
        return "not measured"
    return "**reached**" if value <= goal else "**not reached**"


def render_targets(res: dict) -> str:
    """The "Targets" section: each goal of the issue *Real-time CPU* next to this run's figure for each
    model, a verdict, and for each goal not reached what bounds it (from the same run's figures)."""
    lim = _limits(res)
    labels = {"0.6b": "0.6B", "1.7b": "1.7B"}
    shapes = list(res["shapes"])
    rows: list[tuple[str, str, list[str], str]] = []  # target, goal, figure per shape, verdict (the first shape)
    bounds: list[str] = []

    def add(target: str, goal: str, figures: list, digits: int, verdict: str, unit: str = "") -> None:
        rows.append((target, goal, [_f(v, digits) + (unit if v is not None else "") for v in figures], verdict))

    heads = {shape: _headline_run(entry) for shape, entry in res["shapes"].items()}
    first = shapes[0]
    key0, head0 = heads[first]
    label0 = labels.get(first, first)

    # one stream
    rtf = [_med(h["single"], "rtf") if h else None for _, h in heads.values()]
    default = PRESETS[DEFAULT_PRESET]
    quant0, cp0 = _split(key0)[:2] if key0 else ("?", "?")
    is_default = (quant0, cp0) == (default.quant, default.cp_precision)
    add(f"one stream, {'default' if is_default else 'headline (not the default)'} configuration (talker "
        f"{quant0}, code predictor {cp0}): RTF", _goal(RTF_TARGET), rtf, 2,
        _verdict(rtf[0], RTF_TARGET) if is_default or not key0
        else "not the target's configuration (`--quants` / `--cp` chose another)")
    stage_bounds = {shape: _stage_bounds(res["shapes"][shape], lim) for shape in shapes}
    stages = stage_bounds[first]
    if rtf[0] is not None and rtf[0] > RTF_TARGET and head0:
        s = head0["single"]
        t, c, k = (_med(s, x) for x in ("talker_step_ms", "predictor_ms", "codec_ms_per_frame"))
        floor = sum(b for name, _, b in stages if name != "codec")
        bounds.append(
            f"One stream ({label0}): a frame is {1e3 / FRAME_RATE:.0f} ms of audio; in the engine its talker step took "
            f"{_f(t)} ms and its code predictor call {_f(c)} ms one after the other, and its codec {_f(k)} ms on a "
            f"thread of its own beside them, on the same {res['plan']['threads'][0]} cores. "
            + (f"At this run's measured bandwidth the talker and code predictor alone cannot take less than "
               f"{floor:.0f} ms per frame (RTF ≥ {floor * FRAME_RATE / 1e3:.2f}), however well the codec overlaps."
               if floor else "") + _one_row_rate_bound(res, head0, stages, floor))
    fast = PRESETS["fast"]
    fast_rtf = []
    for shape, (key, _) in heads.items():
        run = res["shapes"][shape].get("ours", {}).get(f"{fast.quant}+{fast.cp_precision}/t{_split(key)[2]}") if key else None
        fast_rtf.append(_med(run["single"], "rtf") if _ok(run) and run.get("single") else None)
    add(f"one stream, `--preset fast` ({_preset_words('fast')}; agreement in "
        "*Agreement of the quantized paths*): RTF", _goal(FAST_RTF_TARGET), fast_rtf, 2,
        _verdict(fast_rtf[0], FAST_RTF_TARGET))
    if fast_rtf[0] is not None and fast_rtf[0] > FAST_RTF_TARGET and key0:
        line = _fast_bound(res, first, f"{fast.quant}+{fast.cp_precision}/t{_split(key0)[2]}", stages)
        if line:
            bounds.append(line)

    # playback without a stall
    pbs = [h.get("playback") if h and _ok(h.get("playback")) else None for _, h in heads.values()]
    pb = pbs[0]
    if pb is None:
        verdict = "not measured"
    elif (pb.get("rtf") or 0) < STALL_FREE_BELOW_RTF:
        verdict = "**reached**" if not pb.get("stalls") else "**not reached**"
    else:
        verdict = (f"not testable here (RTF {pb['rtf']:.2f}); reached in `tests/test_chunking.py`'s simulations of RTF "
                   f"0.3-0.89")
    rows.append((f"a 30 s text plays without a stall when one stream's RTF < {STALL_FREE_BELOW_RTF}: stalls", "0",
                 ["–" if p is None else f"{p.get('stalls')} (RTF {_f(p.get('rtf'), 2)})" for p in pbs], verdict))

    # first audio
    latency = [_latency_medians(h) for _, h in heads.values()]
    for case, goal in TTFA_TARGETS.items():
        figures = [lat.get(case, {}).get("first_audio_s") for lat in latency]
        mode, prefix = case.split("/")
        add(f"time to first audio, {mode} text, {prefix}" + (" (words 0.4 s after the stream opened)" if mode == "live"
                                                              else "") + ", s",
            _goal(goal, 2), figures, 3, _verdict(figures[0], goal))
    streaming = _streaming_bound(label0, latency[0], res.get("latency") or {})
    cold = latency[0].get("non-streaming/cold")
    if cold and cold.get("first_audio_s", 0) > TTFA_TARGETS["non-streaming/cold"]:
        bounds.append(
            f"First audio ({label0}, non-streaming, cold): the first frame needs the whole prompt prefilled "
            f"({_f(cold.get('prefill_rows'), 0)} rows: {_ms(cold.get('prefill_s'))} ms), one code predictor call "
            f"({_ms(cold.get('predictor_s'))} ms) and one codec call ({_ms(cold.get('codec_s'))} ms), one after the "
            f"other: the prefill's rows share each weight it reads and are bound by the arithmetic, the code "
            f"predictor's 15 steps read their layers from memory each time, and a one-frame codec call reads every "
            f"codec weight for a single frame. A cached voice prefix and live text (the voice prefilled "
            f"while the words are on their way) remove most of the prefill: see *Time to first audio*."
            + _fastest_cold_words(res.get("latency") or {}))
    if streaming:
        bounds.append(streaming)

    # eight streams
    aggs = [next((c for c in (h or {}).get("concurrency") or [] if c["streams"] == 8), None) for _, h in heads.values()]
    add("eight streams: aggregate RTF", _goal(CONCURRENT_RTF_TARGET), [c and c["aggregate_rtf"] for c in aggs], 2,
        _verdict(aggs[0] and aggs[0]["aggregate_rtf"], CONCURRENT_RTF_TARGET))
    c8 = aggs[0]
    if c8 and c8["aggregate_rtf"] > CONCURRENT_RTF_TARGET and c8.get("talker_call_ms") and c8.get("frames_total"):
        per_frame = (c8["talker_call_ms"] + c8["predictor_call_ms"]) / 8
        codec = 1e3 * c8["codec_s"] / c8["frames_total"]
        bounds.append(
            f"Eight streams ({label0}): one iteration makes a frame for each stream: the batched talker step took "
            f"{c8['talker_call_ms']:.0f} ms and the batched code predictor call {c8['predictor_call_ms']:.0f} ms, "
            f"{per_frame:.0f} ms per frame together; the codec does not batch across streams (`python -m "
            f"bench.experiments codec-batch`) and took {codec:.0f} ms per frame on the same cores. Their sum, "
            f"{per_frame + codec:.0f} ms per {1e3 / FRAME_RATE:.0f} ms frame, is RTF {(per_frame + codec) * FRAME_RATE / 1e3:.2f} "
            f"before any overlap.")

    # stages
    stage_figs = [", ".join(f"{name} {meas / bound:.1f}×" for name, meas, bound in st) if st else None
                  for st in stage_bounds.values()]
    worst = max((meas / bound for _, meas, bound in stages), default=None)
    rows.append(("each stage against its lower bound (*Each stage next to its physical limit*)",
                 _goal(STAGE_BOUND_TARGET, 1, "×"), [f or "–" for f in stage_figs], _verdict(worst, STAGE_BOUND_TARGET)))
    if worst is not None and worst > STAGE_BOUND_TARGET:
        alone = head0.get("isolated") if _ok(head0.get("isolated")) else {}
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
        sd = _busy_slowdowns(busy)
        ones = [sd[k]["ours"][2] for k in ("cpu1", "stream1") if k in sd and sd[k]["ours"][2] is not None]
        one = max(ones) if ones else None
        weighted = _weighted_slowdown(busy)
        extra.append(f"| one busy process (`stress-ng --cpu 1`, `--stream 1`): slowdown | {_goal(ONE_PROCESS_TARGET)}× | "
                     f"{_f(one, 2)}× ({label0})"
                     + (f"; {weighted:.2f}× under `--cpu 1` with a larger CPU weight (autogroup nice "
                        f"{busy.get('weighted_nice')})" if weighted is not None else "")
                     + f" | {_verdict(one, ONE_PROCESS_TARGET)}"
                     + (f"; with the larger CPU weight {_verdict(weighted, ONE_PROCESS_TARGET)}" if weighted is not None
                        else "") + " (*Busy machine* says what bounds it) |")
        o2, f2 = (_busy_figure(sd, "cpu2", who, 2) for who in ("ours", "official"))
        extra.append(f"| two busy processes (`stress-ng --cpu 2`): slowdown | ≤ official's ({_f(f2, 2)}×) | "
                     f"{_f(o2, 2)}× ({label0}) | {_verdict(o2, f2) if f2 is not None else 'not measured'} |")
    if mem:
        kv, peak = _lowest_peak({k: v for k, v in mem.get("kv", {}).items() if _ok(v.get("peak"))})
        measured = f"{_f(peak, 0)} (`{mem.get('model', '?')}`, KV cache {kv})"
        verdict = _verdict(peak, MEMORY_TARGET_MB)
        lean = _lean_memory(mem)
        if lean and (peak is None or lean[3] < peak):
            label, model, lean_kv, lean_peak = lean
            measured += f"; {_f(lean_peak, 0)} with {_config_words(label)} (`{model}`, KV cache {lean_kv})"
            verdict = (f"{_verdict(lean_peak, MEMORY_TARGET_MB)} with {_config_words(label)} and KV cache {lean_kv}; "
                       f"with the default weights {_verdict(peak, MEMORY_TARGET_MB)}"
                       if lean_peak <= MEMORY_TARGET_MB else verdict)
        extra.append(f"| peak RSS, one model serving 8 streams, MiB | ≤ {MEMORY_TARGET_MB} | {measured} | {verdict} "
                     "(*Memory* says where it goes) |")

    extra += _overlap_targets(res.get("overlap") or {})
    extra += _first_audio_targets(res.get("latency") or {})

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


def _one_row_floor(res: dict, weight_bytes: float, stages: list[tuple[str, float, float]]) -> tuple[float, float] | None:
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
    bw, gemv = _limits(res)["bw"], res.get("machine_limits", {}).get("gemv_stream_gbs")
    found = _one_row_floor(res, floor * bw * 1e6, stages) if bw and floor else None
    if found is None or gemv >= bw:
        return ""
    weights, codec = found
    alone = head.get("isolated") if _ok(head.get("isolated")) else {}
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
    if not (_ok(run) and run.get("single") and found):
        return None
    stream, codec = found
    rate = res["machine_limits"]["gemv_stream_gbs"]
    t, c, k = (_med(run["single"], x) for x in ("talker_step_ms", "predictor_ms", "codec_ms_per_frame"))
    total = stream + codec
    openvino = _overlap_medians((res.get("overlap") or {}).get("fast") or {}, OVERLAP_RUNTIMES[1])[0]
    label = {"0.6b": "0.6B", "1.7b": "1.7B"}.get(shape, shape)
    return (f"`--preset fast` ({label}): in the engine its talker "
            f"step took {_f(t)} ms, its code predictor call {_f(c)} ms and its codec {_f(k)} ms per frame. Its "
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
            f"({_ms(cached.get('prefill_s'))} ms, the voice's prefix cached) the first frame needs the code predictor call ({_ms(cached['predictor_s'])} "
            f"ms) and a one-frame codec call ({_ms(cached['codec_s'])} ms): {1e3 * after:.0f} ms"
            + (f", above the {1e3 * TTFA_TARGETS['streaming/cached']:.0f} ms goal on their own"
               if after > TTFA_TARGETS["streaming/cached"] else "")
            + (f"; cold, the prompt's {_f(cold.get('prefill_rows'), 0)} rows add a {_ms(cold.get('prefill_s'))} ms "
               "prefill" if cold.get("prefill_s") is not None else "") + ".")
    meds = _first_audio_medians(block)
    fastest, value = _first_audio_best(meds, "streaming/cached")
    if fastest:
        best = meds[fastest]["streaming/cached"]
        line += (f" The fastest configuration measured, {fastest}, took {_ms(best.get('predictor_s'))} + "
                 f"{_ms(best.get('codec_s'))} ms for those two calls ({value:.3f} s in all; *Time to first audio per "
                 "configuration*).")
    return line


def _latency_medians(head: dict | None) -> dict[str, dict]:
    """{case: {measure: median}} of a headline run's time-to-first-audio runs."""
    runs = [r["cases"] for r in (head or {}).get("latency") or [] if _ok(r)]
    cases = {case for r in runs for case in r}
    return {case: {k: _med([r[case] for r in runs if case in r], k)
                   for k in ("first_audio_s", "prefill_rows", "prefill_s", "predictor_s", "codec_s")} for case in cases}


def _render_shape(w, shape: str, entry: dict, res: dict, lim: dict, plan: dict) -> None:
    label = {"0.6b": "0.6B", "1.7b": "1.7B"}.get(shape, shape)
    w(f"## {label} CustomVoice\n")
    if entry.get("vocab") != "qwen2-bpe":
        w("Note: the real vocabulary was not available, so the checkpoint uses a byte-level one and the prompt "
          "is longer than with the real tokenizer.\n")
    key, head = _headline_run(entry)
    off = entry.get("official")
    off_ok = _ok(off)
    costs = entry.get("costs", {})
    talker_costs = costs.get("talker_by_quant", {})
    predictors = costs.get("predictors") or ({"fp32": costs["predictor"]} if costs.get("predictor") else {})
    cc = costs.get("codec", {})
    head_q, head_cp, head_t = _split(key) if key else (None, None, None)
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
            a, b = _med(s, key_a), _med(o, key_b)
            ab, bb = _best(s, key_a), _best(o, key_b)
            fa = (lambda x: _f(None if x is None else x * scale, digits))
            w(f"| {name} | {fa(a)} ({fa(ab)}) | {fa(b)} ({fa(bb)}){note} | {_x(b, a)} ({_x(bb, ab)}) |")
            return a, b, ab, bb

        stages = [row("talker, ms per frame (one decode step)", "talker_step_ms"),
                  row("code predictor, ms per frame (15 steps)", "predictor_ms"),
                  row("codec, ms per frame", "codec_ms_per_frame")]
        tot = [sum(v[i] for v in stages) if all(v[i] for v in stages) else None for i in range(4)]
        w(f"| sum of the three, ms per frame (real time = {1e3 / FRAME_RATE:.0f}) | {_f(tot[0])} ({_f(tot[2])}) | "
          f"{_f(tot[1])} ({_f(tot[3])}) | {_x(tot[1], tot[0])} ({_x(tot[3], tot[2])}) |")
        row(f"talker prefill ({head.get('prompt_rows')} prompt rows), ms", "prefill_s", scale=1e3)
        row("time to first audio, s", "first_audio_s", digits=2, note=" (not streaming)")
        row("real-time factor (compute s / audio s)", "rtf", digits=2)
        w(f"| peak RSS | {_mb(head.get('peak_rss_single_mb'))} | {_mb(off.get('peak_rss_mb') if off_ok else None)} | |")
        w(f"| background load (other jobs), median | {_bg(s)} | {_bg(o)} | |")
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
          f"limits*). Compute-bound codec: bound = FLOPs / {_f(lim.get('conv'))} GFLOP/s (best measured ORT Conv1d); "
          f"it also re-reads its weights once per call.\n")
        w("| stage | weights | read per frame | work per frame | lower bound, ms/frame | alone, ms/frame "
          "| in the engine (median), ms/frame | × above bound | official, ms/frame |")
        w("|---|---|---|---|---|---|---|---|---|")
        o = off["runs"] if off_ok else []
        iso = head.get("isolated") if _ok(head.get("isolated")) else {}
        for quant, tc in talker_costs.items():
            run = entry["ours"].get(f"{quant}+{head_cp}/t{head_t}")
            meas = _med(run["single"], "talker_step_ms") if _ok(run) and run.get("single") else None
            bound = 1e3 * tc["bytes_per_step"] / (lim["bw"] * 1e9)
            alone = _f(iso.get("talker_step_ms")) if quant == head_q else ""
            w(f"| talker step | {quant} | {_gb(tc['bytes_per_step'])} | {tc['flops_per_step'] / 1e9:.2f} GFLOP | "
              f"{bound:.1f} | {alone} | {_f(meas)} | {_x(meas, bound)} | "
              f"{_f(_med(o, 'talker_step_ms')) + ' (fp32)' if quant == head_q else ''} |")
        for cp, pcost in predictors.items():
            run = entry["ours"].get(f"{head_q}+{cp}/t{head_t}")
            meas = _med(run["single"], "predictor_ms") if _ok(run) and run.get("single") else None
            bound = 1e3 * pcost["bytes_per_frame"] / (lim["bw"] * 1e9)
            alone = _f(iso.get("predictor_ms")) if cp == head_cp else ""
            w(f"| code predictor (15 steps) | {cp} | {_gb(pcost['bytes_per_frame'])} | "
              f"{pcost['flops_per_frame'] / 1e9:.2f} GFLOP | {bound:.1f} | {alone} | {_f(meas)} | {_x(meas, bound)} | "
              f"{_f(_med(o, 'predictor_ms')) + ' (fp32)' if cp == head_cp else ''} |")
        if cc:
            bound = 1e3 * cc["flops_per_frame"] / (lim["conv"] * 1e9) if lim.get("conv") else None
            meas = _med(head["single"], "codec_ms_per_frame")
            chunks = head["single"][0].get("codec_chunks") or []
            avg_chunk = sum(chunks) / len(chunks) if chunks else 1
            w(f"| codec | fp32 | {_gb(cc['weight_bytes_per_call'])} per call (avg {avg_chunk:.1f} frames/call) | "
              f"{cc['flops_per_frame'] / 1e9:.2f} GFLOP | {_f(bound)} | {_f(iso.get('codec_ms_per_frame'))} (4 frames/call) | "
              f"{_f(meas)} | {_x(meas, bound)} | {_f(_med(o, 'codec_ms_per_frame'))} (fp32) |")
        w("")
        w("*Alone*: the same loaded objects called back to back outside the engine loop (talker: 16 single-row "
          "steps after the real prompt; code predictor: one frame per call; codec: 4 frames per call). *In the "
          "engine*: the per-call medians of the single-stream runs above, where the three stages alternate.\n")
        ratios = [(meas - bound, meas / bound, name, meas, bound) for name, meas, bound in _stage_bounds(entry, lim)]
        if ratios:
            gap = max(ratios)
            far = max(ratios, key=lambda r: r[1])
            share = max(ratios, key=lambda r: r[3])
            w(f"Headline configuration: furthest from its bound: **{far[2]}** ({far[1]:.1f}×: {far[3]:.0f} ms measured vs {far[4]:.0f} ms). "
              f"Largest absolute gap: **{gap[2]}** ({gap[3] - gap[4]:.0f} ms per frame above its bound). "
              f"Largest share of each frame: **{share[2]}** ({share[3]:.0f} of "
              f"{sum(r[3] for r in ratios):.0f} ms). The {head_cp} code predictor reads "
              f"{_gb(pc.get('bytes_per_frame', 0))} per frame "
              f"({pc.get('bytes_per_frame', 0) / max(talker_costs.get(head_q, {}).get('bytes_per_step', 1), 1):.1f}× "
              f"the {head_q} talker step): its 5 layers are read once per each of its 15 steps.\n")

    # -- single stream per configuration ---------------------------------------------------
    if entry.get("ours"):
        w("### Our engine, one stream, per configuration\n")
        w("| talker | code predictor | text mode | threads | time to first audio, s | RTF | talker step, ms | "
          "prefill, ms | code predictor, ms/frame | codec, ms/frame | peak RSS | load, s | bg |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for k, r in entry["ours"].items():
            quant, cp, t = _split(k)
            if not _ok(r) or not r.get("single"):
                w(f"| {quant} | {cp} | | {t} | failed: {r.get('error') or '; '.join(r.get('errors', []))} | | | | | | | | |")
                continue
            s = r["single"]
            preset = next((f" (`--preset {name}`)" for name, p in PRESETS.items()
                           if name != "default" and (p.quant, p.cp_precision) == (quant, cp)), "")
            w(f"| {quant}{preset} | {r.get('predictor_precision')} | {r.get('text_mode')} | {t} | "
              f"{_f(_med(s, 'first_audio_s'), 2)} ({_f(_best(s, 'first_audio_s'), 2)}) | "
              f"{_f(_med(s, 'rtf'), 2)} ({_f(_best(s, 'rtf'), 2)}) | "
              f"{_f(_med(s, 'talker_step_ms'))} ({_f(_best(s, 'talker_step_ms'))}) | {_ms(_med(s, 'prefill_s'))} | "
              f"{_f(_med(s, 'predictor_ms_per_frame'))} ({_f(_best(s, 'predictor_ms_per_frame'))}) | "
              f"{_f(_med(s, 'codec_ms_per_frame'))} ({_f(_best(s, 'codec_ms_per_frame'))}) | "
              f"{_mb(r.get('peak_rss_single_mb'))} | {_f(r.get('load_s'), 1)} | {_bg(s)} |")
        w("")
        w("Time to first audio is measured by the caller: `Engine.submit` → first `AudioChunk` in hand (the engine "
          "emits audio after 1 frame, then chunks of 2, 4, 8 frames). RTF = wall seconds / audio seconds for the "
          "whole utterance, prefill included. Talker step = one `llama_decode` of one row; code predictor = one "
          "ONNX call for the 15 codebooks of a frame, sampling in the graph; codec = stateful ONNX decoder time "
          "divided by frames. Peak RSS is the worker process's (weights are memory-mapped or loaded once).\n")

    if head and head.get("latency"):
        _render_latency(w, head, head_q, head_cp, head_t)
    if head and _ok(head.get("playback")):
        _render_playback(w, head["playback"], head_q, head_cp, head_t)

    # -- concurrency ---------------------------------------------------------------------
    conc_runs = [(k, r) for k, r in entry.get("ours", {}).items() if _ok(r) and r.get("concurrency")]
    if conc_runs:
        w("### Concurrent streams\n")
        w("N requests submitted at once; the engine steps them together (one batched talker decode and one batched "
          "code-predictor call per iteration; the codec runs once per stream and chunk). Aggregate RTF = wall time "
          "until the last stream ends / total audio of all streams (below 1 = faster than real time in total); "
          "per-stream RTF = each stream's own wall time / its audio.\n")
        w("| talker | code predictor | threads | streams | aggregate RTF | per-stream RTF | first audio, median / max s | "
          "talker ms per iteration | code predictor ms per call | codec ms per frame | peak RSS | bg |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for k, r in conc_runs:
            quant, cp, t = _split(k)
            for c in r["concurrency"]:
                codec_pf = 1e3 * c["codec_s"] / c["frames_total"] if c.get("frames_total") else None
                w(f"| {quant} | {cp} | {t} | {c['streams']} | {_f(c['aggregate_rtf'], 2)} | {_f(c['per_stream_rtf'], 2)} | "
                  f"{_f(c['first_audio_s_median'], 2)} / {_f(c['first_audio_s_max'], 2)} | {_f(c.get('talker_call_ms'))} | "
                  f"{_f(c.get('predictor_call_ms'))} (batch {_f(c.get('predictor_batch'), 0)}) | {_f(codec_pf)} | "
                  f"{_mb(r.get('peak_rss_mb'))} | {100 * c['background']:.0f} % |")
        w("")
        w("Scaling against one stream (same configuration, same run): *talker + code predictor* = N × (talker step "
          "+ code predictor call at 1 stream) / (talker + code predictor per iteration at N streams), the work the "
          "batched calls share; *end to end* = aggregate RTF at 1 stream / aggregate RTF at N (the codec runs per "
          "stream, so it does not batch).\n")
        w("| talker | code predictor | streams | talker + code predictor throughput vs 1 stream | end to end vs 1 stream |")
        w("|---|---|---|---|---|")
        for k, r in conc_runs:
            quant, cp, t = _split(k)
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
                w(f"| {quant} | {cp} | {n} | {_f(shared, 2)}× | {_x(one['aggregate_rtf'], c['aggregate_rtf'], 2)} |")
        w("")

    if _ok(entry.get("agreement")):
        _render_agreement(w, entry["agreement"])

    # -- http ----------------------------------------------------------------------------
    w("### Through the HTTP server\n")
    http = entry.get("http")
    if http is None:
        w(f"Time to first audio through the HTTP server: **{entry.get('http_status') or res.get('http_status')}**.\n")
    elif not _ok(http):
        w(f"HTTP measurement failed: {http.get('error')}\n")
    else:
        runs = http["runs"]
        w("`python -m qwen3_tts_gguf serve`, `POST /v1/audio/speech` with `response_format: \"pcm\"`, same text, "
          f"voice and seed, `max_frames` {http['frames']} (EOS not suppressed over HTTP: random weights rarely emit it).\n")
        w("| | median | best |\n|---|---|---|")
        w(f"| request sent → first PCM byte, s | {_f(_med(runs, 'first_audio_s'), 3)} | {_f(_best(runs, 'first_audio_s'), 3)} |")
        w(f"| whole response, s | {_f(_med(runs, 'total_s'), 2)} | {_f(_best(runs, 'total_s'), 2)} |")
        w(f"| RTF | {_f(_med(runs, 'rtf'), 2)} | {_f(_best(runs, 'rtf'), 2)} |")
        first = http.get("first_request") or {}
        if first:
            w(f"| the first request after the start (the server's warm-up spoke this voice and language before its "
              f"port opened), first PCM byte, s | {_f(first.get('first_audio_s'), 3)} | |")
        w(f"| server start until /v1/models answers (warm-up included), s | {_f(http.get('startup_s'), 1)} | |")
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
        w(f"| {_ms(_med(o, 'prefill_s'))} | {_f(_med(o, 'talker_step_ms'))} | {_f(_med(o, 'predictor_ms'))} | "
          f"{_f(_med(o, 'codec_ms_per_frame'))} | {_f(_med(o, 'other_s'), 2)} | {_f(_med(o, 'first_codes_s'), 2)} | "
          f"{_f(_med(o, 'first_audio_s'), 1)} | {_f(_med(o, 'rtf'), 2)} | {_mb(off.get('peak_rss_mb'))} | {_bg(o)} |")
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
            w(f"Code predictor {cp}, one call ({_ms(p['call_s'])} ms in the profiled run): "
              + ", ".join(f"{op} {100 * t / tot:.0f} %" for op, t in top)
              + f". Weights read per call {_gb(p['bytes_per_frame'])} → {p['bytes_per_frame'] / 1e9 / p['call_s']:.1f} GB/s "
                f"achieved.\n")
        if cc.get("op_time_s_per_frame"):
            ops = cc["op_time_s_per_frame"]
            tot = sum(ops.values())
            top = list(ops.items())[:6]
            conv_t = sum(t for op, t in ops.items() if op in ("Conv", "FusedConv", "ConvTranspose"))
            w(f"Codec, {cc.get('profile_frames')} frames per call ({_ms(cc.get('call_s_per_frame'))} ms per frame in the "
              f"profiled run): " + ", ".join(f"{op} {100 * t / tot:.0f} %" for op, t in top)
              + f". Convolutions achieve about {cc['flops_per_frame'] / 1e9 / conv_t:.0f} GFLOP/s "
                f"(all {cc['flops_per_frame'] / 1e9:.1f} GFLOP per frame over the convolution time).\n")


def _render_latency(w, head: dict, quant: str, cp: str, threads: str) -> None:
    runs = [r["cases"] for r in head["latency"] if _ok(r)]
    if not runs:
        return
    w(f"### Time to first audio (talker {quant}, code predictor {cp}, {threads} threads)\n")
    w("A short sentence the engine has not seen (a new one each run), speaker ryan, `Engine.submit` → first "
      "`AudioChunk` (one frame, 80 ms of audio) in the caller's hand. *Cold*: the voice's prompt prefix (role, "
      "speaker and language rows) is prefilled with the request (prefix cache cleared first); *cached*: the "
      "same voice's previous request left its prefix in the KV cache, so only the rows after it are prefilled. "
      "Non-streaming text mode puts the whole text in the prompt (the HTTP default for CustomVoice); streaming text "
      "mode (the WebSocket and `stream_format` live text) puts only the first text token there. *Live*: a "
      "streaming-text stream opened with no text (as a WebSocket `start`), its words pushed 0.4 s later (an LLM's "
      "first token), prefix cache cleared first: timed from the words; the engine prefilled the voice prefix while "
      "the stream waited, so its prefill holds the text rows only.\n")
    w("| text mode | voice prefix | time to first audio, s | prefill rows | prefill, ms | first code predictor call, ms "
      "| first codec call (1 frame), ms | rest (prompt build, queueing), ms | target | bg |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    for case in runs[0]:
        rs = [r[case] for r in runs if case in r]
        ttfa = _med(rs, "first_audio_s")
        parts = [_med(rs, k) for k in ("prefill_s", "predictor_s", "codec_s")]
        rest = _rest_s(rs)
        mode, prefix = case.split("/")
        if mode == "live":
            mode, prefix = "streaming, live: words 0.4 s after the stream opened", "cold, prefilled while waiting"
        w(f"| {mode} | {prefix} | {_f(ttfa, 3)} ({_f(_best(rs, 'first_audio_s'), 3)}) | "
          f"{_f(_med(rs, 'prefill_rows'), 0)} | {_ms(parts[0])} | {_ms(parts[1])} | {_ms(parts[2])} | {_ms(rest)} | "
          f"{_goal(TTFA_TARGETS.get(case), 3) if case in TTFA_TARGETS else 'report'} | {_bg(rs)} |")
    w("")
    w(f"Median (best) of {len(runs)} runs. The first frame needs the prefill (its last row gives codebook 0), one "
      "code predictor call (codebooks 1-15) and one codec call; the engine emits a due chunk before the next "
      "talker step, so that step is not part of the latency.\n")


def _render_playback(w, pb: dict, quant: str, cp: str, threads: str) -> None:
    w(f"### Playback of a 30 s text (talker {quant}, code predictor {cp}, {threads} threads)\n")
    frames = pb.get("chunk_frames") or []
    ramp = " → ".join(str(f) for f in frames[:6]) + (" …" if len(frames) > 6 else "")
    w(f"One request of {pb.get('frames')} frames ({_f(pb.get('audio_s'), 1)} s of audio), chunks of {ramp} frames. "
      "A player that starts at the first chunk and plays at real time:\n")
    w("| | |\n|---|---|")
    w(f"| first audio, s | {_f(pb.get('first_audio_s'), 2)} |")
    w(f"| real-time factor of the request | {_f(pb.get('rtf'), 2)} |")
    w(f"| stalls (a chunk arrives after the previous one finished playing) | {pb.get('stalls')} |")
    w(f"| total stall time, s | {_f(pb.get('stalled_s'), 1)} |")
    first = pb.get("first_stall_at_s")
    w(f"| first stall, s of audio played | {'none' if first is None else _f(first, 2)} |")
    w(f"| pre-buffer that avoids every stall, s | {_f(pb.get('prebuffer_s'), 2)} |")
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


def _render_agreement(w, ag: dict) -> None:
    w("### Agreement of the quantized paths\n")
    ref = ag.get("reference_quant")
    w(f"Talker quants against the {ref} talker: the headline prompt, then {ag.get('steps', 0) - 1} teacher-forced "
      f"frames, every quant decoding the same rows one step at a time. Code predictor against fp32: greedy, fed the "
      f"{ref} talker's hidden states and codebook-0 codes of those steps. Random weights give small logit margins, "
      "so these agreements are pessimistic; real checkpoints must be measured again.\n")
    w("| path | against | codebook 0 / first code equal | all 15 codes equal | logits, relative RMS error (median) |")
    w("|---|---|---|---|---|")
    for quant, a in ag.get("talker", {}).items():
        w(f"| talker {quant} | talker {ref} | {100 * a['code0_agree']:.1f} % | | {100 * a['logits_rel_rms_median']:.2f} % |")
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


# -- busy machine ---------------------------------------------------------------------------

BUSY_LABELS = {"none": "none", "cpu1": "`stress-ng --cpu 1`", "cpu2": "`stress-ng --cpu 2`",
               "stream1": "`stress-ng --stream 1`"}
BUSY_WHAT = {key: what for key, _, what in BUSY_LOADS}


def _busy_slowdowns(busy: dict) -> dict:
    """{load: {who: (median RTF, best RTF, slowdown against the same block's unloaded median)}}."""
    loads = busy.get("loads", {})
    base = loads.get("none", {})
    out = {}
    for key, row in loads.items():
        out[key] = {}
        for who in ("ours", "official", "old", "one"):
            runs = row.get(who) or []
            med, best = _med(runs, "rtf"), _best(runs, "rtf")
            b = _med(base.get(who) or [], "rtf")
            out[key][who] = (med, best, med / b if med and b else None)
    return out


def _busy_figure(sd: dict, load: str, who: str, index: int = 0) -> float | None:
    """From `_busy_slowdowns`: the median RTF (index 0), best RTF (1) or slowdown (2) of `who` under `load`."""
    return sd.get(load, {}).get(who, (None,) * 3)[index]


def _weighted_slowdown(busy: dict) -> float | None:
    """Our runs at a larger CPU weight beside `stress-ng --cpu 1` against our unloaded runs."""
    weighted = _med(busy.get("loads", {}).get("cpu1", {}).get("weighted") or [], "rtf")
    base = _busy_figure(_busy_slowdowns(busy), "none", "ours")
    return weighted / base if weighted and base else None


def _cores(runs: list) -> float | None:
    """Median cores a run kept busy: its process's CPU seconds / wall seconds."""
    return median([r["cpu_s"] / r["wall_s"] for r in runs if r.get("cpu_s") is not None and r.get("wall_s")])


def _rest_s(cases: list[dict]) -> float | None:
    """Median over runs of what a first audio spent outside its prefill, code predictor and codec calls
    (prompt build, queueing): per run, so that one slow stage does not move another's share."""
    rests = [c["first_audio_s"] - c["prefill_s"] - c["predictor_s"] - c["codec_s"] for c in cases
             if all(c.get(k) is not None for k in ("first_audio_s", "prefill_s", "predictor_s", "codec_s"))]
    return median(rests) if rests else None


def _block_origin(block: dict, name: str, standalone: bool) -> str:
    """"Measured on DATE at commit C[ by `python -m bench --only NAME`; ...]" for a block that may run alone."""
    return (f"Measured on {block.get('date', '?')} at commit `{block.get('commit', '?')}`"
            + (f" (+{block['dirty_files']} modified tracked files)" if block.get("dirty_files") else "")
            + (f" by `python -m bench --only {name}`; the rest of this page comes from the run named at its top"
               if standalone else ""))


def render_busy(busy: dict, standalone: bool = False) -> str:
    """The "Busy machine" section (also spliced alone into an existing report by `--only busy`)."""
    out: list[str] = []
    w = out.append
    w("## Busy machine\n")
    w(_block_origin(busy, "busy", standalone) + ".\n")
    if busy.get("status"):
        w(f"**Not measured**: {busy['status']}.\n")
        return "\n".join(out) + "\n"
    loads = busy.get("loads", {})
    sd = _busy_slowdowns(busy)
    off_policy = (busy.get("official_summary") or {}).get("omp_wait_policy")
    off_policy = f"`{off_policy}`" if off_policy else "unset, its default"
    t, frames = busy.get("threads", 2), busy.get("frames")
    old_env = " ".join(f"{k}={v}" for k, v in (busy.get("old_policy_env") or {}).items()) or "OMP_WAIT_POLICY=ACTIVE"
    w(f"One stream of the 0.6B headline configuration (talker {busy.get('quant')}, code predictor {busy.get('cp')}, "
      f"{t} threads) and the official pipeline ({t} torch threads), {frames} frames "
      f"({(frames or 0) / FRAME_RATE:.1f} s of audio) per utterance, while other processes load the machine. "
      f"Real-time factor = wall s / audio s, median (best) of {busy.get('reps')} runs (official: "
      f"{busy.get('official_reps')}" + ("" if busy.get("official_loaded_reps", busy.get("official_reps")) == busy.get("official_reps") else f" with no load, {busy.get('official_loaded_reps')} under each load") + f"; old waits: {busy.get('old_reps')}; a single run shows one figure); slowdown = median RTF under the load / "
      f"median RTF with no load in the same block. *Old spinning waits*: our engine with `{old_env}` and no spin count, so "
      f"llama.cpp's OpenMP threads spin at every barrier instead of sleeping (the engine caps the spin at "
      f"{SPIN_COUNT} turns, GOMP_SPINCOUNT, when it loads llama.cpp, `qwen3_tts_gguf/cpus.py`); its own unloaded run "
      "is its baseline." + (f" *One thread*: our engine with `threads=1` (every stage inline on one core), "
                             f"{busy['one_reps']} runs." if busy.get("one_reps") else "") + "\n")
    w("| load | ours RTF | ours slowdown | official RTF | official slowdown | ours with the old spinning waits: "
      "RTF (slowdown) | ours on one thread: RTF | background load: the load alone; during ours / official / "
      "old-waits runs |")
    w("|---|---|---|---|---|---|---|---|")
    for key, row in loads.items():
        o, f, a, one = sd[key]["ours"], sd[key]["official"], sd[key]["old"], sd[key]["one"]

        def rtf(v, n):
            return "–" if v[0] is None else f"{v[0]:.2f}" + (f" ({v[1]:.2f})" if n > 1 else "")

        def slow(v):
            return "–" if v[2] is None else ("1.00× (baseline)" if key == "none" else f"{v[2]:.2f}×")

        old = "–" if a[0] is None else f"{a[0]:.2f}" + ("" if key == "none" or a[2] is None else f" ({a[2]:.1f}×)")
        alone = row.get("load_alone_background")
        bg = (f"{'–' if alone is None else f'{100 * alone:.0f} %'}; "
              + " / ".join(_bg(row.get(who) or []) for who in ("ours", "official", "old")))
        label = BUSY_LABELS.get(key, row.get("command") or key)
        if row.get("errors") and not row.get("ours"):
            w(f"| {label} | failed: {'; '.join(row['errors'])[:200]} | | | | | | {bg} |")
            continue
        w(f"| {label} | {rtf(o, len(row.get('ours') or []))} | {slow(o)} | {rtf(f, len(row.get('official') or []))} | "
          f"{slow(f)} | {old} | {rtf(one, len(row.get('one') or []))} | {bg} |")
    w("")
    w("The loads, each started in its own process group "
      f"{busy.get('settle_s', 2):.0f} s before the first run of its block and killed (the group checked empty) "
      "before the next one:\n")
    for key, row in loads.items():
        w(f"- {BUSY_LABELS.get(key, key)}: {BUSY_WHAT.get(key) or row.get('what', '')}.")
    w("")
    w("*Background load* is the share of both cores that other processes used (the Meter of every run): the load "
      "alone is measured while it ramps up, before any of our runs; during a run, our own threads take part of the "
      "machine, so the load gets less.\n")
    errors = [f"{BUSY_LABELS.get(k, k)}: {e}" for k, row in loads.items() for e in row.get("errors", [])
              if row.get("ours")]
    left = [k for k, row in loads.items() if (row.get("stop") or {}).get("left")]
    if errors:
        w("Failed runs: " + "; ".join(errors) + ".\n")
    if left:
        w(f"**Warning**: stress-ng processes were still alive after the kill for: {', '.join(left)}.\n")
    if busy.get("skipped"):
        w("Skipped to stay within the block's time budget: " + "; ".join(busy["skipped"]) + ".\n")

    # -- what the runs themselves used -----------------------------------------------------------
    cores = {who: {k: _cores(row.get(who) or []) for k, row in loads.items()} for who in ("ours", "official", "old")}
    names = {"ours": "ours", "official": "official", "old": "old waits"}
    w("CPU each run kept busy, in cores (its process's CPU s / wall s, median), " + ", ".join(
        BUSY_LABELS.get(k, k) for k in loads) + ": " + "; ".join(
        f"{names[who]} " + " / ".join(_f(c.get(k), 2) for k in loads) for who, c in cores.items()
        if any(v is not None for v in c.values())) + ".\n")
    q, fq = cores["ours"].get("none"), cores["official"].get("none")
    oq = cores["old"].get("none")
    old_none, new_none = _busy_figure(sd, "none", "old"), _busy_figure(sd, "none", "ours")
    if old_none and new_none and old_none > 1.1 * new_none:
        w(f"With `{old_env}` alone the idle llama.cpp threads spin between llama.cpp calls too, on the cores ONNX Runtime "
          f"needs for the code predictor and the codec (the run kept {_f(oq, 2)} cores busy with no load, against "
          f"{_f(q, 2)}), so it is slower even with no load. Before its spin cap the engine left the variables unset, "
          "and libgomp then spins about 3 ms before sleeping: no slower than the cap on a quiet machine, but it "
          "collapsed under load as well (`qwen3_tts_gguf/cpus.py` quotes RTF 2.9 quiet and 35 under `stress-ng "
          "--cpu 2`); so the quiet row overstates what the old default cost.\n")

    # -- targets -----------------------------------------------------------------------------
    w("Targets (issue *Real-time CPU*):\n")
    ones = [(k, sd[k]["ours"][2]) for k in ("cpu1", "stream1") if k in sd and sd[k]["ours"][2] is not None]
    if ones:
        worst = max(v for _, v in ones)
        figs = ", ".join(f"{v:.2f}× under {BUSY_LABELS[k]}" for k, v in ones)
        reached = worst <= ONE_PROCESS_TARGET
        w(f"- One busy background process: slowdown ≤ {ONE_PROCESS_TARGET}×. Measured: {figs}. "
          + ("**Reached.**" if reached else "**Not reached.**"))
        c1 = cores["ours"].get("cpu1")
        one_none, one_cpu1 = _busy_figure(sd, "none", "one"), _busy_figure(sd, "cpu1", "one")
        ours_none, ours_cpu1 = _busy_figure(sd, "none", "ours"), _busy_figure(sd, "cpu1", "ours")
        if not reached and q and c1 and busy.get("autogroup") and one_none and ours_none:
            w(f"  What bounds it: the core the load leaves us, and how much a second core speeds our run up. Each "
              "load runs in a session of its own, as a program started elsewhere does, and this kernel shares the "
              "CPU between sessions before threads (autogroup, `/proc/sys/kernel/sched_autogroup_enabled` = 1): "
              f"beside one busy process our run got {c1:.2f} cores, whatever its thread count (it keeps {q:.2f} "
              f"busy alone). On one thread our engine took RTF {one_none:.2f} with no load"
              + (f" and {one_cpu1:.2f} beside this load (a core of its own)" if one_cpu1 else "")
              + f", against {ours_none:.2f} on {t} threads with no load: the second core speeds our run up "
              f"{one_none / ours_none:.2f}×, and this load takes that core back. So one core gives at best about "
              f"{one_none / ours_none:.2f}× our unloaded RTF"
              + (f" (our {t} threads beside the load: {ours_cpu1:.2f}; switching to one thread under load would "
                 f"gain {ours_cpu1 / one_cpu1:.2f}×)" if one_cpu1 and ours_cpu1 else "")
              + f"; ≤ {ONE_PROCESS_TARGET}× needs a run on one core within {ONE_PROCESS_TARGET}× of a run on two.")
        elif not reached and q and c1:
            w(f"  What bounds it: the share of the CPU the run gets. With no load our run keeps {q:.2f} cores busy "
              f"(llama.cpp and ONNX Runtime with {t} threads each, one after the other); beside one busy process it "
              f"got {c1:.2f} while the load kept its own core (background "
              f"{_f(100 * (loads['cpu1'].get('load_alone_background') or 0), 0)} % alone): the CPU share alone "
              f"explains about {q / c1:.2f}×, and ≤ {ONE_PROCESS_TARGET}× needs {q / ONE_PROCESS_TARGET:.2f} of the "
              f"2 cores (an even split of the 2 cores among our {t} threads and the load's one would give "
              f"{2 * t / (t + 1):.2f}).")
        if not reached and q and c1 and "stream1" in loads:
            w("  The memory-bandwidth hog is a busy process as well (it keeps one core) and also takes the "
              "bandwidth that the talker and code predictor steps need (they read all their weights once per "
              "step, see *Each stage next to its physical limit*).")
        weighted, cpu1 = _weighted_slowdown(busy), loads.get("cpu1", {})
        if weighted is not None:
            runs = cpu1.get("weighted") or []
            nice = busy.get("weighted_nice", 0)
            w(f"  With a larger CPU weight: our engine in a session of its own at autogroup nice {nice} (a CFS "
              f"weight about {1.25 ** -nice:.1f}× the load's, 1.25× per nice step: what an operator gives a service "
              f"with systemd's `CPUWeight=` or `nice`, docs/deploy.md) took RTF {_med(runs, 'rtf'):.2f} beside "
              f"`stress-ng --cpu 1`, keeping {_f(_cores(runs), 2)} cores busy: {weighted:.2f}× our unloaded RTF, "
              + ("within" if weighted <= ONE_PROCESS_TARGET else "still above") + f" the {ONE_PROCESS_TARGET}× target.")
        elif cpu1.get("weighted_error"):
            w(f"  With a larger CPU weight: not measured ({cpu1['weighted_error'][:200]}).")
    else:
        w(f"- One busy background process: slowdown ≤ {ONE_PROCESS_TARGET}×. Not measured.")
    o2, f2 = _busy_figure(sd, "cpu2", "ours", 2), _busy_figure(sd, "cpu2", "official", 2)
    if o2 is not None and f2 is not None:
        reached = o2 <= f2
        w(f"- Two busy background processes: no worse than the official implementation's slowdown under the same "
          f"load. Measured under `stress-ng --cpu 2`: ours {o2:.2f}×, official {f2:.2f}×. "
          + ("**Reached.**" if reached else "**Not reached.**"))
        c2, rtf_o, rtf_f = cores["ours"].get("cpu2"), sd["cpu2"]["ours"][0], sd["cpu2"]["official"][0]
        fc2 = cores["official"].get("cpu2")
        if reached and q and c2 and fq and fc2:
            w(f"  Ours kept {q:.2f} cores busy alone and got {c2:.2f} under this load: the CPU share alone explains "
              f"about {q / c2:.2f}×. The official pipeline kept {fq:.2f} busy alone and got {fc2:.2f}, which explains "
              f"{fq / fc2:.2f}× of its {f2:.2f}×; the rest is not the CPU share (its PyTorch runs on OpenMP too, "
              f"libgomp with the wait policy {off_policy}).")
        if not reached and q and c2:
            w(f"  What bounds it: two processes on two cores means our {t} threads share them with the load: our "
              f"run got {c2:.2f} cores instead of the {q:.2f} it keeps busy alone, the CPU share alone explains "
              f"about {q / c2:.2f}×. The official pipeline keeps only {_f(fq, 2)} cores busy with no load (most of its time on "
              f"one thread), so losing a core costs it little: its smaller slowdown comes from using less of the "
              f"machine, not from being faster (under this load its RTF is {rtf_f:.2f}, ours {rtf_o:.2f}).")
    else:
        w("- Two busy background processes: no worse than the official implementation's slowdown under the same "
          f"load. Measured under `stress-ng --cpu 2`: ours {_f(o2, 2)}×, official {_f(f2, 2)}× (incomplete).")
    old2, new2 = _busy_figure(sd, "cpu2", "old"), _busy_figure(sd, "cpu2", "ours")
    old1, new1 = _busy_figure(sd, "cpu1", "old"), _busy_figure(sd, "cpu1", "ours")
    if (old2 and new2) or (old1 and new1):
        parts = [f"{BUSY_LABELS[k]}: RTF {o:.2f} with spinning waits, {n:.2f} with sleeping ones ({o / n:.1f}×)"
                 for k, o, n in (("cpu1", old1, new1), ("cpu2", old2, new2)) if o and n]
        w("- The lever (OpenMP wait policy): " + "; ".join(parts) + ".")
    w("")
    return "\n".join(out) + "\n"


MEMORY_PARTS = {"runtimes": "Python, numpy, ONNX Runtime, llama.cpp loaded", "tokenizer_tables":
                "tokenizer, text tables (memory-mapped; the projection's f32 weights)", "talker":
                "talker: weights (memory-mapped) + KV cache", "code_predictor": "code predictor graph",
                "codec": "codec decoder graph"}


def _lowest_peak(kvs: dict) -> tuple[str | None, float | None]:
    """The KV cache whose 8-stream peak RSS (MiB) is the lowest among the memory block's `kvs`, and that peak."""
    if not kvs:
        return None, None
    kv = min(kvs, key=lambda k: kvs[k]["peak"]["peak_mb"])
    return kv, kvs[kv]["peak"]["peak_mb"]


def _lean_memory(mem: dict) -> tuple[str, str, str, float] | None:
    """The memory block's other 0.6B configuration with the lowest 8-stream peak: (label, model, KV cache,
    peak MiB), or None."""
    found = []
    for label, block in (mem.get("shapes") or {}).items():
        if not label.startswith("0.6b "):
            continue
        for kv, entry in block.get("kv", {}).items():
            if _ok(entry.get("peak")):
                found.append((label, block.get("model", "?"), kv, entry["peak"]["peak_mb"]))
    return min(found, key=lambda f: f[3]) if found else None


def _config_words(label: str) -> str:
    """"0.6b --preset fast" -> "`--preset fast`"."""
    return f"`{label.split(' ', 1)[1]}`"


def render_memory(mem: dict, standalone: bool = False) -> str:
    """The "Memory" section (also spliced alone into an existing report by `--only memory`)."""
    out: list[str] = []
    w = out.append
    w("## Memory\n")
    w(_block_origin(mem, "memory", standalone) + f", model `{mem.get('model', '?')}`, {mem.get('threads', 2)} threads.\n")
    kvs = {k: v for k, v in mem.get("kv", {}).items() if _ok(v.get("parts")) and _ok(v.get("peak"))}
    if not kvs:
        w("**Not measured** (the workers failed; see the bench's output).\n")
        return "\n".join(out) + "\n"
    w("Resident memory (RSS) as each part is loaded, in the engine's order, each KV-cache precision in a fresh "
      "process; then the peak of the engine as `serve` runs it (`max_streams` 8) with eight streams at once. "
      "MiB.\n")
    names = list(kvs)
    w("| part | " + " | ".join(f"KV cache {k}" for k in names) + " |")
    w("|---|" + "---|" * len(names))
    for part, what in MEMORY_PARTS.items():
        w(f"| {what} | " + " | ".join(f"{kvs[k]['parts']['shares_mb'].get(part, 0):.0f}" for k in names) + " |")
    w("| of which the KV cache (computed: cells x layers x K,V x heads x width) | "
      + " | ".join(f"{kvs[k]['parts']['kv_cache_mb']:.0f} ({kvs[k]['parts']['n_ctx']} cells)" for k in names) + " |")
    w("| **loaded** | " + " | ".join(f"**{kvs[k]['parts']['loaded_mb']:.0f}**" for k in names) + " |")
    w(f"| **peak, {kvs[names[0]]['peak']['streams']} streams** | "
      + " | ".join(f"**{kvs[k]['peak']['peak_mb']:.0f}**" for k in names) + " |")
    if all(kvs[k]["parts"].get("loaded_file_mb") is not None and kvs[k]["peak"].get("after_file_mb") is not None
           for k in names):
        w("| of which pages of memory-mapped files, loaded / after the streams (clean: the kernel may drop and "
          "read them again; shared by processes mapping the same files) | "
          + " | ".join(f"{kvs[k]['parts']['loaded_file_mb']:.0f} / {kvs[k]['peak']['after_file_mb']:.0f}"
                       for k in names) + " |")
    files = kvs[names[0]]["parts"].get("files_mb", {})
    w("")
    w("Files on disk: " + ", ".join(f"{n} {mb:.0f}" for n, mb in sorted(files.items())) + " MiB.\n")
    best_kv, best = _lowest_peak(kvs)
    weights = sum(mb for n, mb in files.items() if not n.startswith("text_tables"))
    verdict = "reached" if best <= MEMORY_TARGET_MB else "not reached"
    lean = _lean_memory(mem)
    if lean and best > MEMORY_TARGET_MB:
        label, model, lean_kv, lean_peak = lean
        lean_verdict = "reached" if lean_peak <= MEMORY_TARGET_MB else "not reached"
        w(f"Target: peak ≤ {MEMORY_TARGET_MB} MiB for up to 8 streams: **{lean_verdict} with {_config_words(label)} "
          f"and KV cache {lean_kv}** ({lean_peak:.0f} MiB, `{model}`, in the table below); with the default "
          f"weights **{verdict}** ({best:.0f} MiB, KV cache {best_kv}).\n")
    else:
        w(f"Target: peak ≤ {MEMORY_TARGET_MB} MiB for up to 8 streams: **{verdict}** ({best:.0f} MiB, KV cache {best_kv}).\n")
    if best > MEMORY_TARGET_MB:
        w(f"Where the default configuration's memory goes: the three graphs' weights alone take {weights:.0f} MiB "
          "(talker q8_0, code predictor int8, codec fp32); the code predictor's resident share is ONNX Runtime's "
          "packed copy of its weights (its kernels need the packing: without it one frame took 30x longer), its "
          "embedding tables (float16 in a quantized graph) stay in the mapped file and come in as frames read "
          "them, the codec reads its fp32 weights at every call (and holds activations that grow with the frames "
          "of a call: `codec.MAX_CALL_FRAMES` bounds a call, and blocks of 1 MiB and more go back to the system "
          "when freed: `--heap-map-threshold`), and the KV cache holds "
          f"{kvs[names[0]]['parts']['n_ctx']} cells for all streams ({KV_CELLS_PER_STREAM} per stream unless "
          "`--n-ctx` says).\n")
    _render_other_shapes(w, mem.get("shapes") or {})
    return "\n".join(out) + "\n"


def _render_other_shapes(w, shapes: dict) -> None:
    """The memory block's other models and configurations: one row each, with its KV cache."""
    rows = []
    for shape, block in shapes.items():
        kv, entry = next(iter(block.get("kv", {}).items()), (None, {}))
        parts, peak = entry.get("parts", {}), entry.get("peak", {})
        if not (_ok(parts) and _ok(peak)):
            rows.append(f"| {shape} | {kv} | not measured | | | | | |")
            continue
        shares = parts["shares_mb"]
        graphs = sum(mb for n, mb in parts.get("files_mb", {}).items() if not n.startswith("text_tables"))
        rows.append(f"| {shape} (`{block.get('model', '?')}`) | {kv} | {shares.get('talker', 0):.0f} "
                    f"(KV {parts['kv_cache_mb']:.0f}) | {shares.get('code_predictor', 0):.0f} | {shares.get('codec', 0):.0f} "
                    f"| {parts['loaded_mb']:.0f} | **{peak['peak_mb']:.0f}** | {graphs:.0f} |")
    if rows:
        w("Other models and configurations, measured the same way (MiB):\n")
        w("| model | KV cache | talker (of which KV cache) | code predictor | codec | loaded | peak, 8 streams "
          "| the three graphs' files |")
        w("|---|---|---|---|---|---|---|---|")
        for row in rows:
            w(row)
        w("")


def render_overlap(block: dict, standalone: bool = False) -> str:
    """The "Codec overlap" section (also spliced alone into an existing report by `--only overlap`)."""
    out: list[str] = []
    w = out.append
    w("## Codec overlap\n")
    w(_block_origin(block, "overlap", standalone) + f": 0.6B, talker q8_0, code predictor int8, "
      f"{block.get('threads', 2)} threads, {block.get('frames')} frames per utterance, {block.get('rounds')} rounds "
      "with the variants alternating, each in its own worker; then eight concurrent streams each.\n")
    w("*Inline*: the engine thread calls the codec between the code predictor and the talker step, so the three "
      "stages add up. *Overlapped*: the codec runs on threads of its own while the talker and code predictor make "
      "the next frames (a stream's first chunk still goes inline, for first audio): by default one call at a time "
      "on every core; with `--codec-threads 1`, calls of one thread each in lanes side by side (a lane per core; a "
      "stream keeps its lane, so its calls stay in order). Overlapped, a one-row talker step (one stream's) leaves "
      "a core to a codec call in flight (`qwen3_tts_gguf/cpus.py`, `stage_threads`). The samples are the same every way (the codec carries its "
      "state; the tests hold chunked audio to one whole decode), except on OpenVINO (`--codec-runtime openvino`: the "
      "same graph compiled by another runtime, samples within fp32 rounding, *Codec precision*).\n")
    w(block.get("markdown", "**Not measured.**"))
    inline, default, lanes, openvino = OVERLAP_VARIANTS
    for label, before, after in (("The default (overlapped) against inline", inline, default),
                                 ("Codec calls of one thread in lanes (`--codec-threads 1`) against the default",
                                  default, lanes),
                                 ("The codec on OpenVINO (`--codec-runtime openvino`) against the default",
                                  default, openvino)):
        line = _overlap_comparison(label, block, before, after)
        if line:
            w("\n" + line)
    fast = block.get("fast")
    if fast:
        w(f"\nWith `--preset fast` ({_preset_words('fast')}), the default codec and OpenVINO's, measured the same way "
          "after the table above:\n")
        w(fast.get("markdown", "**Not measured.**"))
        line = _overlap_comparison("`--preset fast`: the codec on OpenVINO against the default", fast, default,
                                   openvino)
        if line:
            w("\n" + line)
    w("")
    return "\n".join(out) + "\n"


def _overlap_targets(block: dict) -> list[str]:
    """Rows of the targets' block table from the overlap block's OpenVINO variants: one stream with `--preset
    fast` and the codec on OpenVINO, and eight streams on OpenVINO with either weights."""
    _, openvino = OVERLAP_RUNTIMES
    default, fast = _overlap_medians(block, openvino), _overlap_medians(block.get("fast") or {}, openvino)
    rows = []
    if fast[0] is not None:
        rows.append(f"| one stream, `--preset fast` ({_preset_words('fast')}) with `--codec-runtime openvino`: RTF | "
                    f"{_goal(FAST_RTF_TARGET)} | {_f(fast[0], 2)} (0.6B; peak RSS after eight streams "
                    f"{_f(fast[3], 0)} MiB) | {_verdict(fast[0], FAST_RTF_TARGET)} (*Codec overlap*) |")
    eight = [(f"{_f(v, 2)} with {words}", v) for v, words in ((default[1], "the default weights"),
                                                               (fast[1], "`--preset fast`")) if v is not None]
    if eight:
        best = min(v for _, v in eight)
        rows.append(f"| eight streams with `--codec-runtime openvino`: aggregate RTF | {_goal(CONCURRENT_RTF_TARGET)} | "
                    f"{'; '.join(t for t, _ in eight)} (0.6B) | {_verdict(best, CONCURRENT_RTF_TARGET)} "
                    "(*Codec overlap*) |")
    return rows


def _preset_words(name: str) -> str:
    """'fast' -> 'talker q4_k_m, code predictor int4'"""
    return f"talker {PRESETS[name].quant}, code predictor {PRESETS[name].cp_precision}"


def _overlap_medians(block: dict, variant: str) -> tuple[float | None, float | None, float | None, float | None]:
    """(one stream's median RTF, eight streams' aggregate RTF, median first audio s, peak RSS MiB) of a variant
    in an overlap comparison (the block's "runs" and "concurrency"); None where not measured."""
    runs = (block.get("runs") or {}).get(variant) or []
    conc = (block.get("concurrency") or {}).get(variant) or {}
    first = [r["first_audio_s"] for r in runs if r.get("first_audio_s")]
    return (median([r["rtf"] for r in runs]) if runs else None, conc.get("aggregate_rtf"),
            median(first) if first else None, conc.get("peak_rss_mb"))


def _overlap_comparison(label: str, block: dict, before: str, after: str) -> str | None:
    """"label: one stream's RTF a → b (%); eight streams' ...; first audio ...; peak RSS ...." or None
    when either variant has no single-stream runs."""
    (a, ca, fa, pa), (b, cb, fb, pb) = _overlap_medians(block, before), _overlap_medians(block, after)
    if not (a and b):
        return None
    line = f"{label}: one stream's RTF {a:.2f} → {b:.2f} ({100 * (b / a - 1):+.0f} %)"
    if ca and cb:
        line += f"; eight streams' aggregate RTF {ca:.2f} → {cb:.2f} ({100 * (cb / ca - 1):+.0f} %)"
    if fa and fb:
        line += f"; first audio {fa:.2f} → {fb:.2f} s"
    if pa and pb:
        line += f"; peak RSS after eight streams {pa:.0f} → {pb:.0f} MiB"
    return line + "."


def render_codec(block: dict, standalone: bool = False) -> str:
    """The "Codec precision" section (also spliced alone into an existing report by `--only codec`)."""
    from .codec_precision import GATE_DB, GATE_SPEEDUP, OPT_IN, REFERENCE, speed_ratio, verdict

    out: list[str] = []
    w = out.append
    w("## Codec precision\n")
    w(_block_origin(block, "codec", standalone) + f": the 0.6B headline model's codec, {block.get('threads', 2)} "
      f"threads, {block.get('frames')} random frames decoded in the engine's chunks "
      f"({' + '.join(map(str, block.get('chunks', [])))}), {block.get('rounds')} rounds with the variants "
      "alternating, one process.\n")
    variants = block.get("variants") or {}
    if "error" in block or not variants:
        w(f"**Not measured**: {block.get('error', 'no variant ran')}.\n")
        return "\n".join(out) + "\n"
    w("Each variant is built by the bench from the converted fp32 graph (*Snake with Sin* from the model's source "
      "checkpoint, as the converter built the codec before its polynomial Snake; *OpenVINO*: the same graph compiled by "
      "OpenVINO instead of ONNX Runtime). *SNR* and *max difference*: its samples against the fp32 graph's for the same "
      "chunks. A variant may become the default only at an SNR of at least "
      f"{GATE_DB:.0f} dB and if it is at least {100 * (1 - GATE_SPEEDUP):.0f} % faster (less is within the rounds' "
      "noise). Random weights only: real checkpoints must be measured again.\n")
    ref = variants.get(REFERENCE, {})
    w("| codec graph | what changes | file, MiB | ms per frame, median (best) | × fp32 (per round) | SNR, dB "
      "| max difference | verdict | bg |")
    w("|---|---|---|---|---|---|---|---|---|")
    for name, v in variants.items():
        ms = v.get("ms_per_frame") or []
        speed = f"{median(ms):.1f} ({min(ms):.1f})" if ms else "–"
        ratio = speed_ratio(v, ref)
        ratio = f"{ratio:.2f}" if ratio is not None else "–"
        snr = "exact" if name == REFERENCE else (f"{v['snr_db']:.1f}" if v.get("snr_db") is not None else "–")
        diff = f"{v['max_abs_diff']:.1e}" if "max_abs_diff" in v and name != REFERENCE else ""
        bg = f"{100 * median(v['background']):.0f} %" if v.get("background") else "–"
        w(f"| {name} | {v.get('changes', '')} | {v.get('file_mb', 0):.0f} | {speed} | {ratio} | {snr} "
          f"| {diff} | {verdict(name, v, ref)} | {bg} |")
    passing = [n for n, v in variants.items() if n != REFERENCE and verdict(n, v, ref).startswith("meets the gate")]
    opt_in = [n for n in passing if n in OPT_IN]
    default = [n for n in passing if n not in OPT_IN]
    w("")
    if default:
        w("Meets the gate: " + ", ".join(default) + ".\n")
    if opt_in:
        w(f"Meets the gate as an option: {', '.join(opt_in)} ({', '.join(OPT_IN[n] for n in opt_in)}). It stays opt-in: "
          "its compiled graph keeps its own copies of the weights in its kernels' layouts, so a server holds more memory "
          "(*Codec overlap* gives the peak with eight streams), against the peak-memory target of the issue *Real-time "
          "CPU*.\n")
    if not default:
        w("No variant of ONNX Runtime's graph meets the gate, so the fp32 codec on ONNX Runtime stays the default. "
          "ONNX Runtime's CPU kernels set the limits there: integer convolutions quantize every activation to 8 bits "
          "per tensor, which random weights' wide activations do not survive; fp16 gains little without native fp16 "
          "arithmetic; and the Snake's `Sin` runs on one thread where the polynomial runs on all. OpenVINO's bf16 "
          "keeps 8 bits of mantissa: below the gate like fp16.\n")
    return "\n".join(out) + "\n"


FIRST_AUDIO_CASES = {"non-streaming/cold": "non-streaming, cold", "non-streaming/cached": "non-streaming, cached",
                     "streaming/cold": "streaming, cold", "streaming/cached": "streaming, cached",
                     "live/cold": "live, cold"}
"""OursSession.LATENCY_CASES' keys -> column headings of the time-to-first-audio block"""


def _first_audio_medians(block: dict) -> dict[str, dict[str, dict]]:
    """{configuration: {case: {measure: median}}} of the time-to-first-audio block."""
    return {label: _latency_medians({"latency": c.get("runs") or []})
            for label, c in (block.get("configs") or {}).items()}


def render_first_audio(block: dict, standalone: bool = False) -> str:
    """The "Time to first audio per configuration" section (also spliced alone by `--only latency`)."""
    out: list[str] = []
    w = out.append
    w("## Time to first audio per configuration\n")
    w(_block_origin(block, "latency", standalone) + f": 0.6B, {block.get('threads', 2)} threads, "
      f"{block.get('rounds')} rounds with the configurations alternating, each in its own worker. The cases are those "
      "of the headline's *Time to first audio* table (the same sentences, a new one each run); the configurations "
      "are those a user can choose with the converter's and the server's options. The first frame waits for the "
      "prefill, one code predictor call and one codec call, one after the other: the talker's quant decides how fast "
      "its prompt rows go (llama.cpp repacks q4_k_m and iq4_nl on this CPU, `talker.repack_pays`), the code "
      "predictor's precision and the codec's runtime the other two.\n")
    configs = block.get("configs") or {}
    if not configs:
        w("**Not measured.**\n")
        return "\n".join(out) + "\n"
    meds = _first_audio_medians(block)
    w("| configuration (model) | " + " | ".join(f"{words}, s" for words in FIRST_AUDIO_CASES.values()) + " | bg |")
    w("|---|" + "---|" * len(FIRST_AUDIO_CASES) + "---|")
    for label, c in configs.items():
        runs = [r["cases"] for r in c.get("runs") or [] if _ok(r)]
        cells = []
        for case in FIRST_AUDIO_CASES:
            rs = [r[case] for r in runs if case in r]
            cells.append(f"{_f(_med(rs, 'first_audio_s'), 3)} ({_f(_best(rs, 'first_audio_s'), 3)})" if rs else "–")
        bg = _bg([r[case] for r in runs for case in r])
        errors = f"; {len(c['errors'])} runs failed: {c['errors'][0]}" if c.get("errors") else ""
        w(f"| {label} (`{c.get('model')}`{errors}) | " + " | ".join(cells) + f" | {bg} |")
    w("| target | " + " | ".join(_goal(TTFA_TARGETS[case], 2) if case in TTFA_TARGETS else "report"
                                  for case in FIRST_AUDIO_CASES) + " | |")
    w("")
    w("Median (best) of each configuration's runs. Where the non-streaming cold case's time goes (medians, ms):\n")
    w("| configuration | prefill rows | prefill | first code predictor call | first codec call (1 frame) | rest |")
    w("|---|---|---|---|---|---|")
    for label, m in meds.items():
        cold = m.get("non-streaming/cold") or {}
        runs = [r["cases"]["non-streaming/cold"] for r in configs[label].get("runs") or []
                if _ok(r) and "non-streaming/cold" in r.get("cases", {})]
        w(f"| {label} | {_f(cold.get('prefill_rows'), 0)} | {_ms(cold.get('prefill_s'))} | "
          f"{_ms(cold.get('predictor_s'))} | {_ms(cold.get('codec_s'))} | {_ms(_rest_s(runs))} |")
    w("")
    lines = [line for line in (_first_audio_target(meds, case, goal) for case, goal in TTFA_TARGETS.items()) if line]
    if lines:
        w("Against the targets (the lowest median of the configurations):\n")
        out.extend(f"- {line[0]}" for line in lines)
        w("")
    return "\n".join(out) + "\n"


def _first_audio_best(meds: dict[str, dict[str, dict]], case: str) -> tuple[str | None, float | None]:
    """The configuration with the lowest median first audio in `case`, and that median."""
    figures = [(m[case]["first_audio_s"], label) for label, m in meds.items()
               if m.get(case, {}).get("first_audio_s") is not None]
    if not figures:
        return None, None
    value, label = min(figures)
    return label, value


def _first_audio_target(meds: dict, case: str, goal: float) -> tuple[str, str, float, str] | None:
    """(sentence, the configuration, its median, verdict) of the lowest median of `case` against `goal`."""
    label, value = _first_audio_best(meds, case)
    if label is None:
        return None
    verdict = _verdict(value, goal) + (" with that configuration" if value <= goal else "")
    return f"{FIRST_AUDIO_CASES[case]}: {value:.3f} s with {label} against ≤ {goal:.2f} s: {verdict}", label, value, verdict


def _fastest_cold_words(block: dict) -> str:
    """" The fastest configuration measured, X, ..." for the non-streaming cold bound line; "" without one."""
    meds = _first_audio_medians(block)
    label, value = _first_audio_best(meds, "non-streaming/cold")
    if label is None:
        return ""
    cold = meds[label]["non-streaming/cold"]
    return (f" The configuration with the fastest first audio here, {label}, took {value:.3f} s: prefill "
            f"{_ms(cold.get('prefill_s'))} ms, code predictor {_ms(cold.get('predictor_s'))} ms, codec "
            f"{_ms(cold.get('codec_s'))} ms (*Time to first audio per configuration*).")


def _first_audio_targets(block: dict) -> list[str]:
    """Rows of the targets' block table from the time-to-first-audio block: per target, the lowest median
    of the configurations."""
    meds = _first_audio_medians(block)
    rows = []
    for case, goal in TTFA_TARGETS.items():
        found = _first_audio_target(meds, case, goal)
        if found is None:
            continue
        _, label, value, verdict = found
        rows.append(f"| time to first audio, {FIRST_AUDIO_CASES[case]}: the fastest configuration, s | "
                    f"{_goal(goal, 2)} | {value:.3f} with {label} (0.6B) | {verdict} (*Time to first audio per "
                    "configuration*) |")
    return rows


ONLY_RENDERERS = {"busy": render_busy, "memory": render_memory, "overlap": render_overlap, "codec": render_codec,
                  "latency": render_first_audio}
"""`--only NAME` -> the renderer of its section"""


def splice_section(doc: str, title: str, section: str) -> str:
    """`doc` with its `title` section (a "## " line) replaced by `section` (inserted before "## Machine limits",
    else before "## Reproduce", else appended, when it has none); every other section is kept as it is."""
    lines = doc.splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    section = section.rstrip("\n") + "\n\n"
    start = next((i for i in heads if lines[i].strip() == title), None)
    if start is not None:
        end = next((i for i in heads if i > start), len(lines))
    else:
        start = end = next((i for name in ("## Machine limits", "## Reproduce") for i in heads
                            if lines[i].startswith(name)), len(lines))
        if start == len(lines) and lines and not lines[-1].endswith("\n\n"):
            section = "\n" + section
    return "".join(lines[:start]) + section + "".join(lines[end:])
