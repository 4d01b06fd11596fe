"""Prototypes of engine changes, measured on the benchmark models (not part of `python -m bench`).

    python -m bench.experiments engine-knobs [--rounds 6]   # llama.cpp repack, OMP wait, threads
    python -m bench.experiments codec-overlap [--rounds 6]  # codec inline vs overlapped, both ways, and on OpenVINO
    python -m bench.experiments cp-quant [--rounds 6]       # code predictor fp32 / int8 / int4: speed, agreement
    python -m bench.experiments codec-batch [--rounds 4]    # codec: one call per stream vs all streams stacked
    python -m bench.experiments presets [--rounds 6]        # convert --preset default against --preset fast
    python -m bench.experiments talker-quants [--quants q4_k_m,iq4_nl]  # the preset's model with each talker quant
    python -m bench.experiments malloc [--thresholds 131072] # glibc's dynamic mmap threshold against fixed ones
    python -m bench.experiments omp-spin [--load cpu1]      # llama.cpp's OpenMP threads: how long they spin
                                                            # before sleeping
    python -m bench.experiments graphs [--rounds 6]         # the codec's polynomial Snake, the fused code-predictor
                                                            # MatMuls, GQA
    python -m bench.experiments llama-builds --builds DIR   # llama_cpp builds installed in DIR (pip --target)
                                                            # beside the engine's
    python -m bench.experiments cp-spike [--devices CPU,Vulkan0]  # the ggml code predictor at --shape with the
                                                            # published 0.6B's activation spike planted

`--load cpu1|cpu2|stream1` runs the comparison beside that `stress-ng` load (bench/busy.py's LOADS).

Nothing here changes the engine: variants pass EngineSettings fields, patch a worker process
(`ours._with_llama_repack`) or set environment variables. (ONNX Runtime's threads no longer spin in the engine
itself.) Variants alternate round by round so they share the background load of this machine; medians and best runs
are printed as markdown and saved under bench/out/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.model.manifest import (
    CODEC_FILE,
    MANIFEST,
    PREDICTOR_CPU_FILE,
    PREDICTOR_FILE,
    Manifest,
    file_entries,
    load_manifest,
)

from bench.busy import LOADS, SETTLE_S, StressLoad
from bench.common import CACHE, OUT, Meter, median, wait_for_quiet


def _model_dir(shape: str, quant: str, cp: str = "int8") -> Path:
    from bench import prepare

    ckpt, _ = prepare.ensure_checkpoint(shape)
    return prepare.ensure_converted(ckpt, shape, quant, cp, 2)


def _table(rows: list[list], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def engine_knobs(args) -> dict:
    base = _session_base(args)
    return _compare(args, {
        "default, 2 threads": (dict(base, threads=2), {}),
        "llama.cpp repack, 2 threads": (dict(base, threads=2, llama_repack=True), {}),
        "OMP_WAIT_POLICY=PASSIVE, 2 threads": (dict(base, threads=2), {"OMP_WAIT_POLICY": "PASSIVE"}),
        "default, 1 thread": (dict(base, threads=1), {}),
    })


OVERLAP_VARIANTS = {
    "codec inline (one thread of work)": {"codec_overlap": False},
    "codec overlapped, one call at a time on every core (default)": {"codec_overlap": True},
    "codec overlapped, calls of 1 thread in parallel lanes (`--codec-threads 1`)":
        {"codec_overlap": True, "codec_threads": 1},
    "codec overlapped, on OpenVINO (`--codec-runtime openvino`)": {"codec_overlap": True, "codec_runtime": "openvino"},
}


OVERLAP_RUNTIMES = tuple(name for name, v in OVERLAP_VARIANTS.items() if v == {"codec_overlap": True}
                         or "codec_runtime" in v)
"""The overlapped codec on ONNX Runtime (the default) and on OpenVINO: the pair `python -m bench` also
compares with `--preset fast`."""


def codec_overlap(args, only: tuple[str, ...] | None = None) -> dict:
    """The codec on the engine thread against the codec on threads of its own (cpus.stage_threads):
    one call at a time on every core, or calls of one thread in lanes side by side; and overlapped on
    OpenVINO instead of ONNX Runtime (openvino_session.py). `only`: these of OVERLAP_VARIANTS."""
    base = dict(_session_base(args), threads=args.threads)
    return _compare(args, {name: (dict(base, engine=dict(base.get("engine", {}), **v)), {})
                           for name, v in OVERLAP_VARIANTS.items() if only is None or name in only})


def presets(args) -> dict:
    """The converter's presets side by side: `default` (q8_0 + int8) against `fast` (q4_k_m + int4)."""
    from qwen3_tts_gguf.convert.presets import PRESETS

    variants = {}
    for name in ("default", "fast"):
        preset = PRESETS[name]
        model = _model_dir(args.shape, preset.quant, preset.cp_precision)
        variants[f"--preset {name} ({preset.quant} + {preset.cp_precision})"] = (
            dict(_session_base(args), model_dir=str(model), threads=args.threads), {})
    return _compare(args, variants)


def talker_quants(args) -> dict:
    """`--preset`'s model with each talker quant of `--quants` (its code predictor precision kept): the
    engine repacks each quant it measured faster that way (`talker.repack_pays`)."""
    from qwen3_tts_gguf.convert.presets import PRESETS

    from bench.agreement import talker_agreement

    preset = PRESETS[args.preset]
    base = dict(_session_base(args), threads=args.threads)
    variants, folders = {}, {}
    for quant in args.quants:
        folders[quant] = _model_dir(args.shape, quant, preset.cp_precision)
        mark = f" (`--preset {args.preset}`)" if quant == preset.quant else ""
        variants[f"talker {quant}{mark}"] = (dict(base, model_dir=str(folders[quant])), {})
    result = _compare(args, variants)
    folders["f16"] = _model_dir(args.shape, "f16", preset.cp_precision)
    rows = []
    for seed in range(3):  # three teacher-forced code sequences: the spread says how far one run is from another
        agree, _ = talker_agreement(folders, "f16", args.threads, seed)
        rows.append(agree)
    table = _table([[quant, " / ".join(f"{100 * r[quant]['code0_agree']:.1f} %" for r in rows),
                     " / ".join(f"{100 * r[quant]['logits_rel_rms_median']:.1f} %" for r in rows)]
                    for quant in args.quants],
                   ["talker", "codebook 0 equal to f16's (3 code sequences)", "logits' relative RMS error (median)"])
    result["agreement"] = rows
    result["markdown"] += "\n\nAgainst the f16 talker (bench/agreement.py, random weights):\n\n" + table
    return result


def malloc(args) -> dict:
    """glibc's dynamic mmap threshold (a freed large block raises it, so later blocks of that size stay in
    the heap) against fixed ones (`--thresholds`, the engine's `heap_map_threshold`: every larger block
    mapped and unmapped)."""
    from qwen3_tts_gguf.host.heap import MAP_THRESHOLD

    base = dict(_session_base(args), threads=args.threads)

    def threshold(size: int) -> dict:
        return dict(base, engine=dict(base.get("engine", {}), heap_map_threshold=size))

    variants = {"glibc's dynamic mmap threshold (`--heap-map-threshold 0`)": (threshold(0), {})}
    for size in sorted({MAP_THRESHOLD, *args.thresholds}):
        default = " (default)" if size == MAP_THRESHOLD else ""
        variants[f"mmap threshold fixed at {size // 1024:,} KiB{default}"] = (threshold(size), {})
    return _compare(args, variants)


def omp_spin(args) -> dict:
    """llama.cpp's OpenMP threads at a barrier: spin GOMP_SPINCOUNT turns, then sleep, under the engine's
    wait policy. The engine's default is `cpus.SPIN_COUNT`; 0 sleeps at once; libgomp's own default, with
    no wait policy set, is 300,000 (about 3 ms). GOMP_SPINCOUNT wins over the wait policy in libgomp."""
    from qwen3_tts_gguf.host.cpus import SPIN_COUNT, WAIT_POLICY

    base = dict(_session_base(args), threads=args.threads)
    variants = {}
    for spins in sorted({SPIN_COUNT, *args.spins}):
        if spins == SPIN_COUNT:
            variants[f"spin {spins:,} then sleep (default)"] = (base, {})
        else:
            what = " (sleep at once)" if spins == 0 else " (libgomp's default)" if spins == 300000 else ""
            variants[f"spin {spins:,} then sleep{what}"] = (base, {"OMP_WAIT_POLICY": WAIT_POLICY,
                                                                   "GOMP_SPINCOUNT": str(spins)})
    return _compare(args, variants)


def omp_policy(args) -> dict:
    """The wait policy beside the engine's spin count, with one model loaded and with two (each engine on
    its own thread, the second idle after one request). Two threads that called llama.cpp make libgomp
    manage more threads than there are CPUs, and it then spins its *throttled* count, which the policy
    sets: PASSIVE 0, none 100, ACTIVE min(1000, GOMP_SPINCOUNT)."""
    from qwen3_tts_gguf.host.cpus import SPIN_COUNT, WAIT_POLICY

    base = dict(_session_base(args), threads=args.threads)
    variants = {}
    for second, served in ((False, "one model"), (True, "two models served")):
        for policy in ("PASSIVE", "", "ACTIVE"):
            default = " (default)" if policy == WAIT_POLICY else ""
            name = f"{policy or 'no policy'} + spin {SPIN_COUNT}, {served}{default}"
            env = {"GOMP_SPINCOUNT": str(SPIN_COUNT), **({"OMP_WAIT_POLICY": policy} if policy else {})}
            variants[name] = (dict(base, second_model=second), env)
    return _compare(args, variants)


def llama_builds(args) -> dict:
    """The engine's llama_cpp against other builds of it (`--builds`: folders a wheel was installed into with
    `pip install --no-deps --target DIR`), each put first on the worker's PYTHONPATH: e.g. a build with
    CMAKE_ARGS="-DGGML_OPENMP=OFF" (ggml's own thread pool instead of OpenMP's)."""
    if not args.builds:
        raise SystemExit("llama-builds: --builds DIR[,DIR] (llama_cpp installed there with pip --target)")
    if missing := [f for f in args.builds if not (Path(f) / "llama_cpp").is_dir()]:
        raise SystemExit(f"llama-builds: {', '.join(missing)} holds no llama_cpp package")
    base = dict(_session_base(args), threads=args.threads)
    variants = {"the engine's llama_cpp (default)": (base, {})}
    for folder in args.builds:
        variants[f"llama_cpp from {folder}"] = (base, {"PYTHONPATH": str(Path(folder).resolve())})
    return _compare(args, variants)


GRAPH_VARIANTS = {"sin": "codec Snake with Sin", "separate": "code predictor q, k, v and gate, up separate",
                  "both": "both (the graphs before 2026-12-01)",
                  "gqa": "code predictor attention as GroupQueryAttention",
                  "portable": "code predictor attention in MatMuls (the graph other devices run)"}


def graph_variants(model: Path, out: Path, keys=tuple(GRAPH_VARIANTS)) -> dict[str, Path]:
    """GRAPH_VARIANTS (`keys` of them) of the model folder `model`, each a copy under `out` with its graphs
    rebuilt from the model's checkpoint (code predictor int8, as the default converts it) and its manifest
    updated; keyed by the variants' names. A variant of the code predictor drops the CPU's graph
    (PREDICTOR_CPU_FILE), so that the engine runs the variant's; `portable` only drops it."""
    from qwen3_tts_gguf.convert.checkpoint import Checkpoint
    from qwen3_tts_gguf.convert.codec_graph import build_codec_decoder
    from qwen3_tts_gguf.convert.onnx_builder import save_model
    from qwen3_tts_gguf.convert.predictor_graph import build_code_predictor, quantize_code_predictor

    ckpt = Checkpoint.open(load_manifest(model).source["path"])

    portable = {PREDICTOR_CPU_FILE: None}  # file -> how to build it again; None: left out

    def predictor(**kw) -> dict:
        return {**portable, PREDICTOR_FILE: lambda p: save_model(
            quantize_code_predictor(build_code_predictor(ckpt, **kw), "int8"), p, external=True)}

    sin = {CODEC_FILE: lambda p: save_model(build_codec_decoder(ckpt, snake_sin=True), p)}
    builds = {"sin": sin, "separate": predictor(fuse=False), "both": {**sin, **predictor(fuse=False)},
              "gqa": predictor(attention="gqa"), "portable": portable}
    folders = {}
    for key in keys:
        files = builds[key]
        folder = folders[GRAPH_VARIANTS[key]] = out / key
        shutil.copytree(model, folder, ignore=shutil.ignore_patterns(*(f + "*" for f in files)))
        for file, build in files.items():
            if build is not None:
                build(folder / file)
        manifest = Manifest.from_dict(json.loads((folder / MANIFEST).read_text()))
        manifest.files = file_entries(folder)
        (folder / MANIFEST).write_text(manifest.to_json())
    return folders


def graphs(args) -> dict:
    """The converter's graph choices side by side in the engine (`graph_variants`): the codec's Snake with
    ONNX `Sin` instead of the polynomial, the code predictor's q, k, v and gate, up as separate MatMuls
    (both the converter's before 2026-12-01), its attention as ONNX Runtime's GroupQueryAttention, or in
    MatMuls (the graph other devices run) instead of the CPU graph's opset-23 Attention."""
    import tempfile

    base = _session_base(args)
    with tempfile.TemporaryDirectory(prefix="graphs-") as scratch:
        variants = {"this converter (default)": (dict(base, threads=args.threads), {})}
        for name, folder in graph_variants(Path(base["model_dir"]), Path(scratch), args.graphs).items():
            variants[name] = (dict(base, model_dir=str(folder), threads=args.threads), {})
        return _compare(args, variants)


def _session_base(args) -> dict:
    """The worker's parameters every variant starts from: `--preset`'s model, `--kv-cache`."""
    from qwen3_tts_gguf.convert.presets import PRESETS

    preset = PRESETS[args.preset]
    model = _model_dir(args.shape, preset.quant, preset.cp_precision)
    base = dict(model_dir=str(model), frames=args.frames, warmup_frames=4, concurrency_frames=args.frames)
    return dict(base, engine={"kv_cache": args.kv_cache}) if args.kv_cache else base


def _compare(args, variants: dict) -> dict:
    """Worker sessions per variant (params, environment), single-stream runs alternating round by
    round, then eight streams each: a markdown table of medians (best runs)."""
    from tqdm import tqdm

    from bench.session import Progress, Session

    runs: dict[str, list] = {k: [] for k in variants}
    conc: dict[str, dict] = {}
    with tqdm(total=len(variants) * (args.rounds + 2), unit="run") as bar:
        progress = Progress(bar)
        sessions = {}
        for name, (params, env) in variants.items():
            bar.set_description(f"load: {name[:40]}")
            sessions[name] = Session(progress, name, "ours", params, env=env)
            bar.update()
        for r in range(args.rounds):
            for name, s in sessions.items():
                bar.set_description(f"round {r + 1}: {name[:40]}")
                wait_for_quiet(args.quiet_wait)
                res = s.call(op="single", rep=r)
                if "error" not in res:
                    runs[name].append(res)
                bar.update()
        for name, s in sessions.items():
            bar.set_description(f"8 streams: {name[:40]}")
            wait_for_quiet(args.quiet_wait)
            conc[name] = s.call(op="concurrency", n=8)
            bar.update()
        for s in sessions.values():
            s.close()
    rows = []
    for name, rs in runs.items():
        def f(key, scale=1.0, d=0):
            v = [x[key] * scale for x in rs]
            return f"{median(v):.{d}f} ({min(v):.{d}f})" if v else "–"
        c = conc.get(name, {})
        rows.append([name, f("talker_step_ms"), f("predictor_ms"), f("codec_ms_per_frame"), f("prefill_s", 1e3),
                     f("first_audio_s", 1, 2), f("rtf", 1, 2),
                     f"{c['aggregate_rtf']:.2f} ({c['talker_call_ms']:.0f} / {c['predictor_call_ms']:.0f})"
                     if "aggregate_rtf" in c else "–",
                     f"{c['peak_rss_mb']:.0f}" if "peak_rss_mb" in c else "–",
                     f"{100 * median([x['background'] for x in rs]):.0f} %" if rs else "–"])
    from qwen3_tts_gguf.convert.presets import PRESETS

    preset = PRESETS[args.preset]
    weights = f"talker {preset.quant} + code predictor {preset.cp_precision}" + (
        f", KV cache {args.kv_cache}" if args.kv_cache else "")
    table = _table(rows, [f"variant ({args.shape}; {weights} unless it says)",
                          "talker step ms", "code predictor ms/frame",
                          "codec ms/frame", "prefill ms", "first audio s", "RTF",
                          "8 streams: aggregate RTF (talker / CP ms per iteration)", "peak RSS after 8 streams, MiB",
                          "bg"])
    return {"runs": runs, "concurrency": conc, "markdown": table}


def cp_quant(args) -> dict:
    """The code predictor in each precision and MatMulNBits block size (`--blocks`), each quantized here
    from the converted fp32 graph as the converter does: speed at batch 1 and 8, agreement with fp32."""
    import tempfile

    import onnx

    from qwen3_tts_gguf.convert.onnx_builder import save_model
    from qwen3_tts_gguf.convert.predictor_graph import quantize_code_predictor
    from qwen3_tts_gguf.convert.presets import CP_BLOCK_SIZE
    from qwen3_tts_gguf.model.predictor import CodePredictor
    from qwen3_tts_gguf.model.sampler import SamplingParams, pack

    fp32 = _model_dir(args.shape, "q8_0", "fp32") / PREDICTOR_FILE
    scratch = tempfile.TemporaryDirectory(prefix="cp-quant-")
    paths = {"fp32": fp32}
    for precision in ("int8", "int4"):
        for block in sorted({CP_BLOCK_SIZE, *args.blocks}):
            path = Path(scratch.name) / f"cp-{precision}-{block}.onnx"
            save_model(quantize_code_predictor(onnx.load(str(fp32)), precision, block), path, external=True)
            paths[f"{precision}, block {block}" + (" (default)" if block == CP_BLOCK_SIZE else "")] = path
    preds = {k: CodePredictor(p, threads=args.threads) for k, p in paths.items()}
    rng = np.random.default_rng(0)
    H = preds["fp32"].hidden_size
    n = 256
    hidden = rng.standard_normal((n, H)).astype(np.float32)
    code0 = rng.integers(0, 2048, n)
    feeds = {"hidden": hidden, "code0": code0, "rand": np.zeros((n, 15), np.float32),
             **pack(SamplingParams(greedy=True), n)}
    ref_codes, ref_logits = preds["fp32"].session.run(["codes", "logits"], feeds)
    accuracy = {}
    for k, p in preds.items():
        codes, logits = p.session.run(["codes", "logits"], feeds)
        err = np.sqrt(((logits[:, 0] - ref_logits[:, 0]) ** 2).mean(-1) / (ref_logits[:, 0] ** 2).mean(-1))
        accuracy[k] = {"step1_agree": float((codes[:, 0] == ref_codes[:, 0]).mean()),
                       "all_agree": float((codes == ref_codes).mean()), "step1_rel_rms": float(np.median(err))}
    times = {(k, b): [] for k in preds for b in (1, 8)}
    bgs = []
    for _ in range(args.rounds):
        for b in (1, 8):
            for k, p in preds.items():
                h = rng.standard_normal((b, H)).astype(np.float32)
                with Meter() as m:
                    p.predict(h, rng.integers(0, 2048, b), SamplingParams(),
                              rngs=[np.random.default_rng(i) for i in range(b)])
                times[(k, b)].append(m.wall)
                bgs.append(m.background)
    rows = []
    for k, p in paths.items():
        t1, t8 = times[(k, 1)], times[(k, 8)]
        a = accuracy[k]
        size = sum(f.stat().st_size for f in p.parent.glob(p.name + "*"))  # the graph and its weights
        rows.append([k, f"{size / 1e6:.0f} MB", f"{1e3 * median(t1):.1f} ({1e3 * min(t1):.1f})",
                     f"{1e3 * median(t8) / 8:.1f} ({1e3 * min(t8) / 8:.1f})", f"{100 * a['step1_agree']:.1f} %",
                     f"{100 * a['all_agree']:.1f} %", f"{100 * a['step1_rel_rms']:.2f} %"])
    scratch.cleanup()
    table = _table(rows, ["code predictor", "files", "ms per frame, batch 1", "ms per frame, batch 8",
                          "greedy code 1 = fp32", "all 15 codes = fp32", "step-1 logits, relative RMS error (median)"])
    table += f"\n\nbackground load median {100 * median(bgs):.0f} %; {args.threads} threads; " \
             f"agreement over {n} random hidden states (random weights: small logit margins, a pessimistic case)"
    return {"times": {f"{k}/b{b}": v for (k, b), v in times.items()}, "accuracy": accuracy, "markdown": table}


def codec_batch(args) -> dict:
    from qwen3_tts_gguf.model.codec import CodecDecoder, stack_states

    model = _model_dir(args.shape, "q8_0")
    dec = CodecDecoder(model / CODEC_FILE, threads=args.threads)
    rng = np.random.default_rng(0)
    S = 8
    states = []
    for _ in range(S):
        _, st = dec.decode(rng.integers(0, 2048, (1, 4, 16)))
        states.append(st)
    res: dict = {}
    bgs = []
    for _ in range(args.rounds):
        for k in (1, 2, 4, 8):
            codes = rng.integers(0, 2048, (S, k, 16))
            with Meter() as m:
                for i in range(S):
                    dec.decode(codes[i:i + 1], states[i])
            res.setdefault((k, "separate"), []).append(m.wall / (S * k))
            stacked = stack_states(states)
            with Meter() as m2:
                dec.decode(codes, stacked)
            res.setdefault((k, "stacked"), []).append(m2.wall / (S * k))
            bgs += [m.background, m2.background]
    rows = [[k, f"{1e3 * median(res[(k, 'separate')]):.0f} ({1e3 * min(res[(k, 'separate')]):.0f})",
             f"{1e3 * median(res[(k, 'stacked')]):.0f} ({1e3 * min(res[(k, 'stacked')]):.0f})"] for k in (1, 2, 4, 8)]
    table = _table(rows, [f"frames per stream per call ({S} streams)", "one call per stream, ms/frame",
                          "all streams in one call, ms/frame"])
    table += f"\n\nbackground load median {100 * median(bgs):.0f} %; {args.threads} threads"
    return {"markdown": table}


STRESS_ARGS = {key: args for key, args, _ in LOADS if args}  # --load: stress-ng's arguments per load

def cp_spike(args) -> dict:
    """The ggml code predictor on the random checkpoint of `--shape` with the published 0.6B's activation spike
    planted (tests/planted_spike.py): greedy codes of the f16 llama stages file as the converter writes it (the
    layers whose inputs f16 cannot hold kept f32) and as it was written before (every matrix f16), against the
    float64 reference, on each of `--devices` (a Vulkan device needs the Vulkan build's LLAMA_CPP_LIB_PATH)."""
    from qwen3_tts_gguf.convert.checkpoint import Checkpoint
    from qwen3_tts_gguf.convert.llama_stages import f32_weights, write_llama_stages
    from qwen3_tts_gguf.convert.presets import PRESETS
    from qwen3_tts_gguf.ggml.batched_predictor import GgmlCodePredictor
    from qwen3_tts_gguf.ggml.graph import Backend
    from qwen3_tts_gguf.model.sampler import SamplingParams

    from bench import prepare
    from tests.greedy_agreement import NEAR_TIE
    from tests.planted_spike import CP_DOWN, against_reference, plant

    source, _ = prepare.ensure_checkpoint(args.shape)
    work = CACHE / f"spiked-{source.name}"
    shutil.rmtree(work, ignore_errors=True)
    ranges = plant(source, work / "checkpoint")
    ckpt = Checkpoint.open(work / "checkpoint")
    fmt = PRESETS["default"].llama_stages
    files = {"kept f32 (as converted)": f32_weights(ranges, fmt), "all f16 (as before)": frozenset()}
    rng = np.random.default_rng(2)
    hidden = rng.standard_normal((8, ckpt.config.talker.hidden_size)).astype(np.float32)
    code0 = rng.integers(0, ckpt.config.codec.codebook_size, len(hidden))
    rows = []
    for label, kept in files.items():
        path = work / f"stages-{len(kept)}.gguf"
        write_llama_stages(ckpt, path, fmt, kept)
        for device in args.devices:
            backend = Backend(None if device == "CPU" else device, threads=args.threads)
            predictor = GgmlCodePredictor(path, backend)
            codes = predictor.predict(hidden, code0, SamplingParams(greedy=True),
                                      rand=np.zeros((len(hidden), 15), np.float32)).codes
            predictor.close()
            backend.close()
            differ, near = against_reference(ckpt, hidden, code0, codes)
            rows.append([label, device, len(kept), codes.size, differ - near, near])
    shutil.rmtree(work, ignore_errors=True)
    peak = ranges.inputs[CP_DOWN].peak
    markdown = (f"The code predictor of a random `{args.shape}` checkpoint, its first layer's `down_proj` input "
                f"planted to peak at {peak:.3g} on the measured prompts; greedy codes of {len(hidden)} random "
                "talker states against the float64 reference (a near tie: top-2 logits within "
                f"{NEAR_TIE}):\n\n" + _table(rows, ["llama stages file", "device", "matrices kept f32", "codes",
                                                      "wrong", "near ties"]))
    return {"rows": rows, "peak": peak, "markdown": markdown}


EXPERIMENTS = {"engine-knobs": engine_knobs, "codec-overlap": codec_overlap, "cp-quant": cp_quant,
               "codec-batch": codec_batch, "presets": presets, "talker-quants": talker_quants, "malloc": malloc,
               "omp-spin": omp_spin, "omp-policy": omp_policy, "graphs": graphs,
               "llama-builds": llama_builds, "cp-spike": cp_spike}


def _graph_keys(value: str) -> list[str]:
    keys = value.split(",")
    if unknown := [k for k in keys if k not in GRAPH_VARIANTS]:
        raise argparse.ArgumentTypeError(f"unknown graph variant {', '.join(unknown)} (of {', '.join(GRAPH_VARIANTS)})")
    return keys


def build_parser() -> argparse.ArgumentParser:
    """The experiments' command line (also how `python -m bench` sets up the one it runs as a block)."""
    p = argparse.ArgumentParser(prog="python -m bench.experiments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", choices=tuple(EXPERIMENTS))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shape", default="0.6b")
    p.add_argument("--preset", default="default", help="the converter preset whose model every variant loads")
    p.add_argument("--kv-cache", help="the talker's KV cache precision for every variant (default: the engine's)")
    p.add_argument("--quants", type=lambda v: v.split(","), default=["q4_k_m", "iq4_nl"],
                   help="talker-quants: the talker quants to compare (the converter's QUANTS)")
    p.add_argument("--thresholds", type=lambda v: [int(x) for x in v.split(",")], default=[131072],
                   help="malloc: fixed mmap thresholds beside the engine's, bytes")
    p.add_argument("--graphs", type=_graph_keys, default=list(GRAPH_VARIANTS),
                   help=f"graphs: the variants beside the default, of {','.join(GRAPH_VARIANTS)}")
    p.add_argument("--quiet-wait", type=float, default=5.0, help="wait up to this long for other jobs before each run")
    p.add_argument("--spins", type=lambda v: [int(x) for x in v.split(",")], default=[0, 1000, 10000],
                   help="omp-spin: GOMP_SPINCOUNT values beside the engine's (libgomp's default is 300000)")
    p.add_argument("--blocks", type=lambda v: [int(x) for x in v.split(",")], default=[32, 256],
                   help="cp-quant: MatMulNBits block sizes beside the converter's")
    p.add_argument("--builds", type=lambda v: v.split(","), default=[],
                   help="llama-builds: folders holding other llama_cpp builds (pip install --target)")
    p.add_argument("--devices", type=lambda v: v.split(","), default=["CPU"],
                   help="cp-spike: the ggml devices to run the code predictor on (CPU, Vulkan0, CUDA0)")
    p.add_argument("--load", choices=tuple(STRESS_ARGS),
                   help="run beside this stress-ng load (no quiet wait then)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    started = time.time()
    if args.load:
        exe = shutil.which("stress-ng")
        if exe is None:
            p.error("--load needs stress-ng (Debian package stress-ng)")
        args.quiet_wait = 0.0
        with StressLoad(exe, STRESS_ARGS[args.load], max_s=3600):
            time.sleep(SETTLE_S)
            result = EXPERIMENTS[args.experiment](args)
        result["markdown"] += f"\n\nBeside the load `{args.load}` (`stress-ng` running throughout)."
    else:
        result = EXPERIMENTS[args.experiment](args)
    result.update(experiment=args.experiment, args=vars(args), started=started, finished=time.time())
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"experiment-{args.experiment}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    print(result["markdown"])
    print(f"\nsaved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
