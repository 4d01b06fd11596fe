"""`python -m bench [--quick]`: build the inputs, run every measurement, write docs/benchmarks.md (a quick run:
bench/out/benchmarks-quick.md).

`python -m bench --only busy`: only the busy-machine block (0.6B headline configuration under
stress-ng loads, ours and official side by side), merged into the latest saved full results.
`python -m bench --only memory`: only the memory block (RSS per part and at 8 streams, per KV cache; 1.7B too).
`python -m bench --only overlap`: only the codec-overlap block (codec inline vs overlapped, every way; the
`--preset fast` model with the codec on ONNX Runtime and on OpenVINO).
`python -m bench --only codec`: only the codec-precision block (fp16, int8, the Snake with `Sin`: speed and SNR).
`python -m bench --only latency`: only the time to first audio of the configurations a user can choose.
`python -m bench --only stages [--shapes 0.6b,1.7b]`: only the code predictor and the codec on ONNX Runtime and the
project's ggml graphs (ms per frame for one stream and eight, the codec at fixed chunks with
its GFLOP a frame, memory, agreement).
`python -m bench --only peers [--shapes 0.6b,1.7b]`: only the peer engines on PyPI (qwentts.cpp, vox-tts; each in a
venv of its own under bench/cache/) beside ours on the same checkpoint: RTF, first audio, peak RSS.

`python -m bench soak [--minutes 30] [--model DIR] ...`: the server under mixed load (bench/soak/).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path

from qwen3_tts_gguf.convert.presets import PRESETS
from qwen3_tts_gguf.convert.talker_gguf import QUANTS as TALKER_QUANTS
from qwen3_tts_gguf.model.manifest import MANIFEST, PREDICTOR_FILE, TALKER_FILE

from bench.common import CACHE, LONG_FRAMES, OUT, ROOT, wait_for_quiet
from bench.session import Budget, Progress, Session, one_shot

QUANTS = ("f16", "q8_0", "q5_k_m", "q4_k_m")  # the full run's; `--quants` takes any of TALKER_QUANTS
CP_PRECISIONS = ("int8", "fp32", "int4")  # the first is the users' default (the converter's default)

MODES = {
    # 0.6B only, one quant, fewer frames and repeats; a time budget keeps it under 5 minutes
    "quick": dict(shapes=["0.6b"], quants=["q8_0"], cp_precisions=["int8", "fp32"], threads=[2], sweep_threads=[],
                  frames=24, reps=3, warmup=4,
                  concurrency=[1, 2, 4, 8], concurrency_frames=12, concurrency_quants=["q8_0"],
                  official_frames=12, official_reps=1, http_reps=2, quiet_s=2.0, limits_quiet_s=8.0,
                  latency_reps=3, playback=True, budget_s=270.0, busy=False, memory=False),
    # every quant, 50 frames (4 s of audio, as reference-harness.md §4), a thread sweep, 1.7B too
    "full": dict(shapes=["0.6b", "1.7b"], quants=list(QUANTS), cp_precisions=list(CP_PRECISIONS), threads=[2],
                 sweep_threads=[1], frames=50, reps=5,
                 warmup=4, concurrency=[1, 2, 4, 8], concurrency_frames=32, concurrency_quants=list(QUANTS),
                 official_frames=50, official_reps=3, http_reps=5, quiet_s=8.0, limits_quiet_s=60.0,
                 latency_reps=5, playback=True, budget_s=None, busy=True, memory=True),
}
# The busy-machine block (bench/busy.py), the same in every mode: fewer frames than the headline runs and one
# official run per load, because an official run under load takes 80-90 s on 2 cores (RTF ~45); about 12 minutes,
# its own budget (measured runs only) keeps it under 15.
BUSY = dict(busy_frames=24, busy_reps=3, busy_official_reps=2, busy_official_loaded_reps=1, busy_old_reps=1,
            busy_one_reps=3, busy_weighted_reps=3, busy_budget_s=780.0, busy_timeout_s=600.0)


PUBLISHED_REPORT = ROOT / "docs" / "benchmarks.md"
QUICK_REPORT = OUT / "benchmarks-quick.md"


def report_path(args: argparse.Namespace) -> Path:
    """Where the report goes: --doc, else the published page, except for a quick run (bench/out)."""
    if args.doc is not None:
        return args.doc
    return QUICK_REPORT if args.quick and not args.only else PUBLISHED_REPORT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="0.6B, q8_0 only, fewer frames and repeats (< 5 min)")
    p.add_argument("--shapes", help="comma list of 0.6b,1.7b (default: quick 0.6b; full both)")
    p.add_argument("--quants", help=f"comma list of talker quants (default: {','.join(QUANTS)}; any of the "
                                    f"converter's {','.join(TALKER_QUANTS)})")
    p.add_argument("--cp", help=f"comma list of code predictor precisions {','.join(CP_PRECISIONS)} "
                                "(the first one goes with every talker quant, the others with q8_0)")
    p.add_argument("--threads", type=int, help="threads per runtime for every run (default 2)")
    p.add_argument("--sweep-threads", help="extra thread counts for a q8_0 single-stream run (full: 1)")
    p.add_argument("--frames", type=int, help="frames per utterance (12.5 per second of audio)")
    p.add_argument("--reps", type=int, help="measured repeats per configuration (medians are reported)")
    p.add_argument("--official-reps", type=int, help="measured repeats of the official pipeline")
    p.add_argument("--quiet-wait", type=float, help="seconds to wait for other jobs to calm down before each run")
    p.add_argument("--budget", type=float, help="seconds; optional runs are skipped past it (quick: 270)")
    p.add_argument("--no-official", action="store_true", help="skip the official PyTorch pipeline")
    p.add_argument("--no-http", action="store_true", help="skip time to first audio through the HTTP server")
    p.add_argument("--doc", type=Path, help=f"report to write (default {PUBLISHED_REPORT.relative_to(ROOT)}; "
                                            f"with --quick {QUICK_REPORT.relative_to(ROOT)}, so that a quick run "
                                            "never replaces the published full one)")
    p.add_argument("--no-doc", action="store_true", help="only save the JSON results under bench/out/")
    p.add_argument("--busy", action="store_true",
                   help="quick mode: also run the busy-machine block (full mode always runs it): the 0.6B headline "
                        "configuration under no load, `stress-ng --cpu 1`, `--cpu 2` and `--stream 1`, ours and "
                        "official alternating, plus ours with the old spinning OpenMP waits (about 12 min)")
    p.add_argument("--only", choices=list(ONLY_BLOCKS),
                   help="run only one block, merge it into the latest saved full results "
                        "(bench/out/results-full-*.json) and re-render the report (without a saved full run, only "
                        "its section of the report is replaced): busy, the busy-machine block (about 12 min); "
                        "memory, resident memory per part and at 8 streams for each KV-cache precision (about 2 "
                        "min), then the 1.7B model with the default KV cache (unless --shapes 0.6b; its first run "
                        "converts it); overlap, the codec inline against overlapped, both ways (about 5 min); codec, "
                        "the codec graph in other precisions (speed and SNR against fp32, about 2 min); latency, time "
                        "to first audio for the configurations a user can choose, side by side (about 2 min, and about "
                        "2 min for each model it has to convert); stages, the code predictor and the codec on each "
                        "runtime; stages-gpu, the ggml graphs on --stages-device beside their ONNX references "
                        "(with a GPU build's libraries: LLAMA_CPP_LIB_PATH=.venv-vulkan/lib/python3.11/site-packages/"
                        "llama_cpp/lib, and GGML_VK_VISIBLE_DEVICES=0 for lavapipe; about 9 min at 0.6b there); "
                        "peers, the peer engines on PyPI beside ours (its first run installs each peer into a "
                        "venv under bench/cache/ and converts the checkpoint for it); honours --threads, --quiet-wait, "
                        "--no-official, --doc, --no-doc")
    p.add_argument("--stages-device", default="Vulkan0", metavar="NAME",
                   help="the ggml device of --only stages-gpu (llama.cpp's name, as `doctor` lists it; lavapipe needs "
                        "GGML_VK_VISIBLE_DEVICES=0; default %(default)s)")
    p.add_argument("--render", type=Path, help="re-render the report from a saved results JSON and exit")
    return p


def _plan(args) -> dict:
    mode = "quick" if args.quick else "full"
    plan = dict(MODES[mode], **BUSY, mode=mode)
    if args.busy:
        plan["busy"] = True
    if args.shapes:
        plan["shapes"] = args.shapes.split(",")
    if args.quants:
        every = plan["concurrency_quants"] == plan["quants"]  # the mode runs concurrency for each of its quants
        plan["quants"] = args.quants.split(",")
        plan["concurrency_quants"] = list(plan["quants"]) if every else [
            q for q in plan["concurrency_quants"] if q in plan["quants"]]
    if args.cp:
        plan["cp_precisions"] = args.cp.split(",")
    if args.threads:
        plan["threads"] = [args.threads]
    if args.sweep_threads is not None:
        plan["sweep_threads"] = [int(t) for t in args.sweep_threads.split(",") if t]
    if args.frames:
        plan["frames"] = plan["official_frames"] = args.frames
    if args.reps:
        plan["reps"] = args.reps
    if args.official_reps:
        plan["official_reps"] = args.official_reps
    if args.quiet_wait is not None:
        plan["quiet_s"] = args.quiet_wait
    if args.budget is not None:
        plan["budget_s"] = args.budget
    bad = [q for q in plan["quants"] if q not in TALKER_QUANTS] + [c for c in plan["cp_precisions"]
                                                                    if c not in CP_PRECISIONS]
    if bad:
        raise SystemExit(f"unknown quant/precision {bad}; choose talker quants from {TALKER_QUANTS}, "
                         f"code predictor precisions from {CP_PRECISIONS}")
    return plan


def run(args) -> dict:
    from tqdm import tqdm

    from bench import machine, prepare
    from bench.physics import predictor_cost, talker_cost

    plan = _plan(args)
    info = machine.describe()
    http_ok = importlib.util.find_spec("api") is not None and importlib.util.find_spec("api.server") is not None
    do_http = not args.no_http and http_ok
    results = {"plan": plan, "machine": info, "shapes": {}, "started": time.time(),
               "http_status": ("measured" if do_http else
                               "skipped (--no-http)" if args.no_http else "skipped: `api.server` is not importable")}
    budget = Budget(plan["budget_s"])
    OUT.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    threads = plan["threads"][0]
    steps = (2 + len(plan["shapes"]) * (3 + (1 if do_http else 0)) + (1 if plan["busy"] else 0)
             + (6 if plan["memory"] else 0))
    with tqdm(total=steps, unit="step", dynamic_ncols=True) as bar:
        log, progress = bar.write, Progress(bar)

        def gate() -> None:
            if plan["quiet_s"]:
                wait_for_quiet(plan["quiet_s"])

        def step(label: str) -> None:
            bar.set_description(label)
            bar.set_postfix_str("")

        step("machine limits")
        limits = [one_shot(progress, "machine", {"threads": threads, "quiet_s": plan["limits_quiet_s"]}, 900)]
        bar.update()
        for shape in plan["shapes"]:
            # configurations: the users' default (first CP precision) with every talker quant, the other
            # CP precisions with q8_0, and the thread sweep on the headline configuration
            head_quant = "q8_0" if "q8_0" in plan["quants"] else plan["quants"][0]
            cp0 = plan["cp_precisions"][0]
            configs = [(head_quant, cp0, threads)] + [(q, cp0, threads) for q in plan["quants"] if q != head_quant]
            configs += [(head_quant, cp, threads) for cp in plan["cp_precisions"][1:]]
            fast = PRESETS["fast"]  # the converter's fastest preset, both of its formats together
            if fast.quant in plan["quants"] and fast.cp_precision in plan["cp_precisions"]:
                configs.append((fast.quant, fast.cp_precision, threads))
            configs += [(head_quant, cp0, t) for t in plan["sweep_threads"] if t != threads]
            bar.total += len(configs)
            step(f"{shape}: checkpoint + conversions")
            ckpt, vocab = prepare.ensure_checkpoint(shape, log)
            folders = {(head_quant, cp0): prepare.ensure_converted(ckpt, shape, head_quant, cp0, threads, log)}
            for quant, cp, _ in configs[1:]:  # the rest now if cached, else just before their runs
                if (prepare.converted_path(ckpt, shape, quant, cp) / MANIFEST).exists():
                    folders[(quant, cp)] = prepare.ensure_converted(ckpt, shape, quant, cp, threads, log)
            entry = results["shapes"][shape] = {"checkpoint": str(ckpt.relative_to(ROOT)), "vocab": vocab, "ours": {}}
            bar.update()
            step(f"{shape}: stage costs")
            head_dir = folders[(head_quant, cp0)]
            cached = (CACHE / "costs"
                      / f"{head_dir.name}+{'+'.join(sorted(cp for q, cp in folders if q == head_quant))}.json")
            if plan["mode"] == "quick" and cached.exists():  # static bytes/FLOPs; the ORT profile is from that run
                costs = json.loads(cached.read_text())
            else:
                costs = one_shot(progress, "costs", {
                    "model_dir": str(head_dir), "threads": threads, "quiet_s": plan["limits_quiet_s"],
                    "predictor_dirs": {cp: str(f) for (q, cp), f in folders.items() if q == head_quant}}, 900)
                if "error" not in costs:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    costs["measured_at"] = time.strftime("%Y-%m-%d %H:%M")
                    cached.write_text(json.dumps(costs))
            costs["talker_by_quant"] = {q: talker_cost(f / TALKER_FILE) for (q, cp), f in folders.items() if cp == cp0}
            entry["costs"] = costs
            entry["headline"] = f"{head_quant}+{cp0}/t{threads}"
            bar.update()

            for i, (quant, cp, t) in enumerate(configs):
                key = f"{quant}+{cp}/t{t}"
                paired = i == 0 and not args.no_official
                if i and not budget.allows(f"{shape} {key}", 30 if (quant, cp) in folders else 60):
                    bar.update()
                    continue
                if (quant, cp) not in folders:
                    step(f"{shape}: convert {quant}/{cp}")
                    folders[(quant, cp)] = prepare.ensure_converted(ckpt, shape, quant, cp, threads, log)
                    if cp == cp0:
                        costs["talker_by_quant"][quant] = talker_cost(folders[(quant, cp)] / TALKER_FILE)
                    if quant == head_quant and cp not in costs.setdefault("predictors", {}):
                        costs["predictors"][cp] = predictor_cost(folders[(quant, cp)] / PREDICTOR_FILE)
                step(f"{shape}: ours {key}" + (" + official" if paired else ""))
                ours = Session(progress, key, "ours", dict(
                    model_dir=str(folders[(quant, cp)]), threads=t, frames=plan["frames"], warmup_frames=plan["warmup"],
                    concurrency_frames=plan["concurrency_frames"], max_streams=max(8, *plan["concurrency"])))
                off = Session(progress, "official", "official", dict(
                    checkpoint=str(ckpt), threads=threads, frames=plan["official_frames"], warmup_frames=3)) \
                    if paired else None
                singles, off_runs, conc = [], [], []
                walls = {"ours": None, "official": None}

                def single(session, runs, who, rep):
                    label = f"{shape} {key if who == 'ours' else 'official'} run {rep + 1}"
                    if rep == 0 or budget.allows(label, walls[who] or 0):
                        gate()
                        runs.append(session.call(op="single", rep=rep))
                        walls[who] = runs[-1].get("wall_s", walls[who])

                def pair(rep):
                    # our runs and the official runs alternate, so both see the same load on a shared machine
                    if rep < plan["reps"]:
                        single(ours, singles, "ours", rep)
                    if off and rep < plan["official_reps"]:
                        single(off, off_runs, "official", rep)

                pair(0)
                if i == 0:
                    gate()
                isolated = ours.call(op="isolated") if i == 0 else None
                # priorities under a time budget: one run of each, then concurrency, then the other repeats
                if i == 0 or (quant in plan["concurrency_quants"] and cp == cp0 and t == threads):
                    for n in plan["concurrency"]:
                        est = (walls["ours"] or 0) * plan["concurrency_frames"] / plan["frames"] * max(1.0, 0.5 * n)
                        if budget.allows(f"{shape} {key} {n} streams", est + 5):
                            gate()
                            conc.append(ours.call(op="concurrency", n=n))
                latency, playback = [], None
                if i == 0:  # time to first audio by text mode and prefix cache, then the 30 s playback check
                    for r in range(plan["latency_reps"]):
                        if r == 0 or budget.allows(f"{shape} {key} time to first audio run {r + 1}", 6):
                            gate()
                            latency.append(ours.call(op="latency", rep=r))
                for r in range(1, max(plan["reps"], plan["official_reps"] if off else 0)):
                    pair(r)
                if i == 0 and plan["playback"]:
                    est = (walls["ours"] or 10) * LONG_FRAMES / plan["frames"] + 5
                    if budget.allows(f"{shape} {key} 30 s playback check", est):
                        gate()
                        playback = ours.call(op="playback")
                if off:
                    entry["official"] = {**off.close(), "runs": [x for x in off_runs if "error" not in x],
                                         "errors": [x["error"] for x in off_runs if "error" in x]}
                summary = ours.close()
                entry["ours"][key] = {**summary, "isolated": isolated,
                                      "single": [x for x in singles if "error" not in x],
                                      "concurrency": [x for x in conc if "error" not in x],
                                      "latency": [x for x in latency if "error" not in x], "playback": playback,
                                      "errors": [x["error"] for x in singles + conc + latency if "error" in x]}
                if "error" in summary and not entry["ours"][key]["single"]:
                    entry["ours"][key]["error"] = summary["error"]
                bar.update()
            entry["models"] = {f"{q}/{cp}": str(f.relative_to(ROOT)) for (q, cp), f in folders.items()}
            step(f"{shape}: agreement of the quantized paths")
            if budget.allows(f"{shape} agreement", 40):
                entry["agreement"] = one_shot(progress, "agreement", {
                    "folders": {k: str(ROOT / v) for k, v in entry["models"].items()}, "threads": threads}, 900)
            bar.update()
            if do_http:
                step(f"{shape}: HTTP server")
                est = 15 + (plan["http_reps"] + 1) * (entry["ours"].get(entry["headline"], {})
                                                       .get("single", [{}])[0].get("wall_s", 10))
                if not budget.allows(f"{shape} HTTP", est):
                    entry["http_status"] = "skipped to stay within the time budget"
                else:
                    entry["http"] = one_shot(progress, "http", dict(
                        model_dir=str(head_dir), threads=threads, frames=plan["frames"],
                        reps=plan["http_reps"], quiet_s=plan["quiet_s"]), 1200)
                bar.update()
        if plan["busy"]:
            step("busy machine")
            results["busy"] = _busy(progress, log, step, plan, threads, official=not args.no_official)
            bar.update()
        if plan["memory"]:
            step("memory")
            results["memory"] = _memory(progress, threads, plan["shapes"])
            bar.update()
            step("codec overlap")
            results["overlap"] = _overlap(threads, plan["quiet_s"])
            bar.update()
            step("codec precisions")
            results["codec"] = _codec(progress, threads, plan["quiet_s"])
            bar.update()
            step("time to first audio per configuration")
            results["latency"] = _first_audio(progress, threads, plan["quiet_s"])
            bar.update()
            step("stage runtimes")
            results["stages"] = _stage_runtimes(progress, threads, plan["shapes"], plan["quiet_s"])
            bar.update()
            step("peer engines")
            results["peers"] = _peers(progress, step, threads, plan["shapes"], plan["quiet_s"])
            bar.update()
        # again at the end: other jobs depress bandwidth and GFLOP/s, and a bound must use the best seen
        step("machine limits (again)")
        if budget.allows("machine limits, second measurement", 20):
            limits.append(one_shot(progress, "machine",
                                   {"threads": threads, "quiet_s": min(plan["limits_quiet_s"], 5)}, 900))
        bar.update()
    results["machine_limits_runs"] = limits
    results["machine_limits"] = _best_limits(limits)
    results["skipped"] = budget.skipped
    results["finished"] = time.time()
    results["loadavg_end"] = machine.loadavg()
    return results


def _busy(progress, log, step, plan: dict, threads: int, official: bool) -> dict:
    """The busy-machine block on the 0.6B headline configuration (q8_0 talker, int8 code predictor)."""
    from bench import busy

    ckpt, folder = _headline_model(threads, log)
    return busy.measure(progress, log, model_dir=str(folder), checkpoint=str(ckpt), threads=threads,
                        frames=plan["busy_frames"], reps=plan["busy_reps"], official_reps=plan["busy_official_reps"],
                        official_loaded_reps=plan["busy_official_loaded_reps"], old_reps=plan["busy_old_reps"],
                        one_reps=plan.get("busy_one_reps", 0), weighted_reps=plan.get("busy_weighted_reps", 0),
                        quiet_s=plan["quiet_s"], budget_s=plan["busy_budget_s"],
                        official=official, timeout_s=plan["busy_timeout_s"], step=step)


def _converted_model(threads: int, log, shape: str, quant: str, cp: str) -> tuple[Path, Path]:
    """The checkpoint of `shape` and its folder converted to talker `quant`, code predictor `cp`."""
    from bench import prepare

    ckpt, _ = prepare.ensure_checkpoint(shape, log)
    return ckpt, prepare.ensure_converted(ckpt, shape, quant, cp, threads, log)


def _headline_model(threads: int, log, shape: str | None = None) -> tuple[Path, Path]:
    """The checkpoint and converted folder of the headline configuration (busy.HEADLINE: 0.6B, or `shape`)."""
    from bench import busy

    headline, quant, cp = busy.HEADLINE
    return _converted_model(threads, log, shape or headline, quant, cp)


LEAN_MEMORY = ("fast", "q4_0")
"""The memory block's leanest 0.6B configuration: converter preset, KV cache."""


def _memory(progress, threads: int, shapes: list[str]) -> dict:
    """The memory block on the 0.6B headline configuration (every KV cache), the leanest configuration
    (LEAN_MEMORY), and the other shapes in `shapes` (the default KV cache only)."""
    from qwen3_tts_gguf.convert.presets import PRESETS

    from bench import memory

    _, folder = _headline_model(threads, progress.bar.write)
    block = memory.measure(progress, str(folder), threads, frames=MEMORY_FRAMES)
    preset, kv = LEAN_MEMORY
    _, lean = _converted_model(threads, progress.bar.write, "0.6b", PRESETS[preset].quant, PRESETS[preset].cp_precision)
    others = block.setdefault("shapes", {})
    others[f"0.6b --preset {preset}"] = memory.measure(progress, str(lean), threads, frames=MEMORY_FRAMES,
                                                       kv_caches=(kv,))
    for shape in [s for s in shapes if s != "0.6b"]:
        _, other = _headline_model(threads, progress.bar.write, shape)
        others[shape] = memory.measure(progress, str(other), threads, frames=MEMORY_FRAMES,
                                       kv_caches=memory.KV_CACHES[:1])
    return block


def _overlap(threads: int, quiet_s: float) -> dict:
    """The codec-overlap block (bench.experiments.codec_overlap): the codec inline against overlapped, every
    way, on the default weights; then the default against OpenVINO with `--preset fast` (under "fast")."""
    from bench import experiments, machine

    origin = machine.block_origin()

    def compare(preset: str, only: tuple[str, ...] | None) -> dict:
        args = experiments.build_parser().parse_args(
            ["codec-overlap", "--shape", "0.6b", "--preset", preset, "--threads", str(threads), "--frames",
             str(OVERLAP_FRAMES), "--rounds", str(OVERLAP_ROUNDS), "--quiet-wait", str(quiet_s)])
        return experiments.codec_overlap(args, only)

    res = compare("default", None)
    res["fast"] = compare("fast", experiments.OVERLAP_RUNTIMES)
    return {**origin, "threads": threads, "frames": OVERLAP_FRAMES, "rounds": OVERLAP_ROUNDS, **res}


def _first_audio(progress, threads: int, quiet_s: float) -> dict:
    """The time-to-first-audio block (bench/first_audio.py): the configurations side by side, 0.6B."""
    from bench import first_audio, machine

    origin = machine.block_origin()

    def model_dir(quant: str, cp: str) -> Path:
        return _converted_model(threads, progress.bar.write, "0.6b", quant, cp)[1]

    return {**origin, **first_audio.measure(progress, threads, quiet_s, model_dir)}


def _codec(progress, threads: int, quiet_s: float) -> dict:
    """The codec-precision block on the headline model's codec (bench/codec_precision.py), in a worker."""
    from bench import machine

    _, folder = _headline_model(threads, progress.bar.write)
    origin = machine.block_origin()
    res = one_shot(progress, "codec", {"model_dir": str(folder), "threads": threads, "rounds": CODEC_ROUNDS,
                                       "quiet_s": quiet_s}, 900)
    return {**origin, **res}


GPU_STAGE_FRAMES, GPU_STAGE_ROUNDS = 8, 1
"""The stage-runtimes block on a ggml GPU device: fewer frames and one round (on lavapipe, a software device, a
frame of the published codec takes seconds)."""


def _stage_runtimes(progress, threads: int, shapes: list[str], quiet_s: float, device: str | None = None) -> dict:
    """The stage-runtimes block (bench/stage_runtimes.py) per shape, each in a worker: the code predictor on ONNX
    Runtime (fp32, int8) and the project's ggml graphs (f32, f16), the codec on ONNX Runtime and the ggml graphs
    (f32). With `device` (`--only stages-gpu`), the ggml graphs on that ggml device (the f16 code predictor of the
    default preset and the f32 codec) beside their fp32 ONNX references on the CPU, at GPU_STAGE_FRAMES frames,
    GPU_STAGE_ROUNDS round."""
    from qwen3_tts_gguf.convert.checkpoint import Checkpoint
    from qwen3_tts_gguf.convert.llama_stages import write_llama_stages
    from qwen3_tts_gguf.convert.presets import PRESETS
    from qwen3_tts_gguf.model.manifest import LLAMA_STAGES_FILE

    from bench import machine

    out = {**machine.block_origin(), "shapes": {}}
    params = {"threads": threads, "rounds": STAGE_ROUNDS, "quiet_s": quiet_s}
    on, tag = {}, ""
    if device is not None:
        out["device"], on, tag = device, {"device": device}, f" {device}"
        params.update(frames=GPU_STAGE_FRAMES, rounds=GPU_STAGE_ROUNDS)
    for shape in shapes:
        ckpt, fp32 = _converted_model(threads, progress.bar.write, shape, "q8_0", "fp32")
        _, int8 = _converted_model(threads, progress.bar.write, shape, "q8_0", "int8")
        cpu_only = []
        if device is None:
            exact = fp32.parent / f"{fp32.name}-stages-exact.gguf"  # the default preset's folders hold f16/f32
            if not exact.exists():
                progress.bar.write(f"writing the exact llama stages of {shape}")
                write_llama_stages(Checkpoint.open(ckpt), exact.with_suffix(".tmp"), PRESETS["exact"].llama_stages)
                exact.with_suffix(".tmp").rename(exact)
            cpu_only = [
                dict(name="cp onnx int8", stage="predictor", runtime="onnxruntime", folder=str(int8),
                     precision="int8"),
                dict(name="cp ggml f32", stage="predictor", runtime="ggml", folder=str(fp32), stages_file=str(exact),
                     precision="f32"),
            ]
        variants = [
            dict(name="cp onnx fp32", stage="predictor", runtime="onnxruntime", folder=str(fp32), precision="fp32"),
            *cpu_only,
            dict(name=f"cp ggml f16{tag}", stage="predictor", runtime="ggml", folder=str(int8),
                 stages_file=str(int8 / LLAMA_STAGES_FILE), precision="f16", **on),
            dict(name="codec onnx fp32", stage="codec", runtime="onnxruntime", folder=str(int8), precision="fp32"),
            dict(name=f"codec ggml f32{tag}", stage="codec", runtime="ggml", folder=str(int8), precision="f32", **on),
        ]
        out["shapes"][shape] = one_shot(progress, "stages", {"variants": variants, **params}, 3600)
    return out


def _peers(progress, step, threads: int, shapes: list[str], quiet_s: float) -> dict:
    """The peers block (bench/pipelines/peers.py): ours and the peer engines on PyPI, side by side, per shape."""
    from bench.pipelines import peers

    return peers.measure(progress, threads, shapes, quiet_s, step=step)


STAGE_ROUNDS = 2
MEMORY_FRAMES = 24  # frames per stream of the memory block's eight streams
OVERLAP_FRAMES, OVERLAP_ROUNDS = MODES["full"]["frames"], 5  # utterances as long as the one-stream table's
CODEC_ROUNDS = 5
ONLY_BLOCKS = {"busy": "## Busy machine", "memory": "## Memory", "overlap": "## Codec overlap",
               "codec": "## Codec precision", "latency": "## Time to first audio per configuration",
               "stages": "## Stage runtimes", "stages-gpu": "## Stage runtimes on a GPU device",
               "peers": "## Peer engines"}
"""--only NAME -> its section of the report"""


def run_only(args) -> dict:
    """`--only NAME`: one block alone; results {"only": NAME, NAME: {...}}."""
    from tqdm import tqdm

    plan = _plan(args)
    OUT.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with tqdm(total=1, unit="block", dynamic_ncols=True) as bar:
        progress = Progress(bar)

        def step(label: str) -> None:
            bar.set_description(label)
            bar.set_postfix_str("")

        if args.only == "busy":
            block = _busy(progress, bar.write, step, plan, plan["threads"][0], official=not args.no_official)
        elif args.only == "memory":
            block = _memory(progress, plan["threads"][0], plan["shapes"])
        elif args.only == "codec":
            block = _codec(progress, plan["threads"][0], plan["quiet_s"])
        elif args.only == "latency":
            block = _first_audio(progress, plan["threads"][0], plan["quiet_s"])
        elif args.only == "stages":
            block = _stage_runtimes(progress, plan["threads"][0], plan["shapes"], plan["quiet_s"])
        elif args.only == "stages-gpu":
            block = _stage_runtimes(progress, plan["threads"][0], plan["shapes"], plan["quiet_s"],
                                    device=args.stages_device)
        elif args.only == "peers":
            block = _peers(progress, step, plan["threads"][0], plan["shapes"], plan["quiet_s"])
        else:
            block = _overlap(plan["threads"][0], plan["quiet_s"])
        bar.update()
    return {"only": args.only, "plan": plan, args.only: block, "started": started, "finished": time.time()}


def latest_full_results() -> Path | None:
    """The newest saved full run (file names carry a sortable time stamp)."""
    saved = sorted(OUT.glob("results-full-*.json"))
    return saved[-1] if saved else None


def _best_limits(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0] if runs else {}
    best = dict(ok[0])
    for r in ok[1:]:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not k.startswith(("threads", "buffer", "waited", "background")):
                best[k] = max(best.get(k, v), v)
    return best


SUBCOMMANDS = {"soak": "bench.soak.run"}  # `python -m bench NAME ...`: NAME's module parses the rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    args = build_parser().parse_args(argv)
    args.doc = report_path(args)
    from bench.report.page import ONLY_RENDERERS, render, splice_section

    if args.only:
        results = run_only(args)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        saved = OUT / f"results-{args.only}-{stamp}.json"
        saved.write_text(json.dumps(results, indent=1))
        print(f"results: {saved.relative_to(ROOT)} ({(results['finished'] - results['started']) / 60:.1f} min)")
        full = latest_full_results()
        if full is not None:  # the block replaces the full run's own (or is added to it)
            merged = json.loads(full.read_text())
            merged[args.only] = results[args.only]
            full.write_text(json.dumps(merged, indent=1))
            print(f"merged into {full.relative_to(ROOT)}")
            results = merged
    elif args.render:
        results = json.loads(args.render.read_text())
    else:
        results = run(args)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        saved = OUT / f"results-{results['plan']['mode']}-{stamp}.json"
        saved.write_text(json.dumps(results, indent=1))
        print(f"results: {saved.relative_to(ROOT)} ({(results['finished'] - results['started']) / 60:.1f} min)")
    if results.get("only"):  # no full results to render from: replace this section of the report only
        block = results["only"]
        section = ONLY_RENDERERS[block](results[block], standalone=True)
        if args.no_doc:
            print(section)
            return 0
        old = args.doc.read_text() if args.doc.exists() else "# Benchmarks\n"
        args.doc.parent.mkdir(parents=True, exist_ok=True)
        args.doc.write_text(splice_section(old, ONLY_BLOCKS[block], section))
        print(f"wrote the {block} section of {args.doc} (no saved full results under {OUT.relative_to(ROOT)} "
              "to merge into)")
        return 0
    text = render(results)
    if args.no_doc:
        print(text)
    else:
        args.doc.parent.mkdir(parents=True, exist_ok=True)
        args.doc.write_text(text)
        print(f"wrote {args.doc}")
    return 0
