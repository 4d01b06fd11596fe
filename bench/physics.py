"""Physical limits: this machine's memory bandwidth and arithmetic throughput, and each stage's
bytes of weights and floating-point work per frame, read from the converted model files.

Lower bound per frame = bytes of weights streamed / best measured read bandwidth (talker, code
predictor: one token at a time, so every weight is read once per step and the arithmetic is
negligible), or FLOPs / best measured convolution throughput (codec: ~5 GFLOP per frame of
convolutions over up to 1920 output samples). Bounds use the *best* of several measurements,
figures use medians.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.model.manifest import CODEC_FILE, PREDICTOR_FILE, TALKER_FILE, load_manifest


# -- machine ---------------------------------------------------------------------------------
def _best(fn, repeats: int) -> float:
    """Smallest wall time of `repeats` calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), float(np.median(times))


def memory_bandwidth(threads: int, mib: int = 512, repeats: int = 9) -> dict:
    """Read and copy bandwidth of a buffer far larger than the caches, with 1..threads threads.

    numpy releases the GIL inside its reduction, dot and copy loops, so a thread pool over equal
    slices measures what `threads` cores pull from memory together. Read = the best of a sum, a
    max and a self dot product (different kernels saturate differently)."""
    n = mib * 2**20 // 4
    a = np.ones(n, np.float32)
    b = np.empty_like(a)
    out = {"buffer_mib": mib}
    for t in sorted({1, threads}):
        spans = [(i * n // t, (i + 1) * n // t) for i in range(t)]
        with ThreadPoolExecutor(t) as pool:
            def over(fn):
                return lambda: list(pool.map(lambda s: fn(a[s[0]:s[1]], b[s[0]:s[1]]), spans))

            reads = [_best(over(fn), repeats) for fn in (lambda x, _: np.add.reduce(x),
                                                          lambda x, _: x.max(),
                                                          lambda x, _: np.dot(x, x))]
            best = min(r[0] for r in reads)
            med = min(r[1] for r in reads)
            out[f"read_gbs_{t}t"] = a.nbytes / best / 1e9
            out[f"read_gbs_{t}t_median"] = a.nbytes / med / 1e9
            best, med = _best(over(lambda x, y: np.copyto(y, x)), repeats)
            out[f"copy_gbs_{t}t"] = 2 * a.nbytes / best / 1e9  # STREAM convention: read + write
            out[f"copy_gbs_{t}t_median"] = 2 * a.nbytes / med / 1e9
    return out


def _ort_session(model, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])


def ort_throughput(threads: int, repeats: int = 7) -> dict:
    """ONNX Runtime fp32 (the code predictor's and codec's runtime): GEMM and Conv1d GFLOP/s, and
    the weight-streaming rate of a chain of M=1 MatMuls (what one code-predictor step does)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    out = {}

    def run(model, feeds, flops=None, nbytes=None, key=""):
        sess = _ort_session(model, threads)
        best, med = _best(lambda: sess.run(None, feeds), repeats)
        if flops:
            out[f"{key}_gflops"] = flops / best / 1e9
            out[f"{key}_gflops_median"] = flops / med / 1e9
        if nbytes:
            out[f"{key}_gbs"] = nbytes / best / 1e9
            out[f"{key}_gbs_median"] = nbytes / med / 1e9

    # GEMM [256, 2048] x [2048, 2048]
    M, K, N = 256, 2048, 2048
    w = numpy_helper.from_array(rng.standard_normal((K, N), dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])], [w])
    run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
        {"x": rng.standard_normal((M, K), dtype=np.float32)}, flops=2 * M * K * N, key="gemm")

    # M=1 chain: 8 layers 1024 -> 3072 -> 1024 (100 MB of fp32 weights, 3x the L3 cache)
    nodes, inits, prev = [], [], "x"
    for i in range(8):
        k, n = (1024, 3072) if i % 2 == 0 else (3072, 1024)
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n), dtype=np.float32) * 0.02), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    g = helper.make_graph(nodes, "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 1024])], inits)
    nbytes = sum(int(np.prod(i.dims)) * 4 for i in inits)
    run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
        {"x": rng.standard_normal((1, 1024), dtype=np.float32)}, nbytes=nbytes, key="gemv_stream")

    # Conv1d like the codec's residual units: 384 -> 384 channels, k7, dilation 3, 1280 samples
    C, L, k, d = 384, 1280, 7, 3
    w = numpy_helper.from_array(rng.standard_normal((C, C, k), dtype=np.float32) * 0.02, "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], dilations=[d])], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, L + (k - 1) * d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, L])], [w])
    run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
        {"x": rng.standard_normal((1, C, L + (k - 1) * d), dtype=np.float32)}, flops=2 * C * C * k * L, key="conv")
    return out


def numpy_gemm(repeats: int = 5) -> dict:
    n = 2048
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    best, med = _best(lambda: a @ b, repeats)
    return {"numpy_gemm_gflops": 2 * n**3 / best / 1e9, "numpy_gemm_gflops_median": 2 * n**3 / med / 1e9}


def machine_limits(threads: int) -> dict:
    out = memory_bandwidth(threads)
    out.update(ort_throughput(threads))
    out.update(numpy_gemm())
    out["threads"] = threads
    return out


# -- stage costs -------------------------------------------------------------------------------
def talker_cost(gguf_path: str | Path) -> dict:
    """Bytes of weights read and FLOPs per talker step (every tensor but the unused token table)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    nbytes, flops, types = 0, 0, defaultdict(int)
    for t in reader.tensors:
        if t.name == "token_embd.weight":  # the engine feeds embeddings, never token ids
            continue
        nbytes += int(t.n_bytes)
        types[t.tensor_type.name] += int(t.n_bytes)
        if len(t.shape) == 2:
            flops += 2 * int(np.prod(t.shape))
    return {"bytes_per_step": nbytes, "flops_per_step": flops, "bytes_by_type": dict(types)}


def _initializers(model) -> dict:
    """Initializer name -> bytes."""
    out = {}
    for init in model.graph.initializer:
        dims = int(np.prod(init.dims)) if init.dims else 1
        size = {1: 4, 10: 2, 11: 8, 7: 8, 16: 2, 3: 1, 2: 1, 6: 4, 12: 4, 13: 8}.get(init.data_type, 4)
        out[init.name] = dims * size
    return out


def predictor_cost(onnx_path: str | Path) -> dict:
    """Bytes of weights read and FLOPs per frame (one call, batch 1) of the unrolled 15-step graph.

    Each MatMul (or MatMulNBits: packed weights + scales) node reads its constant weight once per
    call; shared weights appear once per step that uses them, so the sum over nodes is the
    per-frame traffic. Gathers read one row and are left out."""
    import onnx

    model = onnx.load(str(onnx_path))
    inits = _initializers(model)
    nbytes = flops = 0
    seen = set()
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in inits:
            nbytes += inits[node.input[1]]
            seen.add(node.input[1])
            flops += 2 * inits[node.input[1]] // 4  # one row (the first step has two)
        elif node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            for name in node.input[1:]:
                if name in inits:
                    nbytes += inits[name]
                    seen.add(name)
            flops += 2 * int(attrs.get("K", 0)) * int(attrs.get("N", 0))
    meta = {p.key: p.value for p in model.metadata_props}
    return {"bytes_per_frame": nbytes, "flops_per_frame": flops, "distinct_weight_bytes": sum(inits[w] for w in seen),
            "file_bytes": Path(onnx_path).stat().st_size, "steps": 15, "precision": meta.get("precision", "fp32")}


def _shape(entry) -> list[int]:
    return list(next(iter(entry.values())))


def _node_flops(op: str, ins: list, outs: list) -> int:
    if not outs or not ins:
        return 0
    y = outs[0]
    if op in ("Conv", "FusedConv"):
        w = ins[1]  # [Cout, Cin/g, k]
        return 2 * int(np.prod(y)) * int(np.prod(w[1:]))
    if op == "ConvTranspose":
        x, w = ins[0], ins[1]  # x [B, Cin, L], w [Cin, Cout/g, k]
        return 2 * int(np.prod(x)) * int(np.prod(w[1:]))
    if op in ("MatMul", "FusedMatMul", "Gemm", "MatMulNBits", "MatMulInteger"):
        return 2 * int(np.prod(y)) * int(ins[0][-1])
    return 0


def profile_graph(onnx_path: str | Path, feeds: dict, threads: int, runs: int = 3) -> dict:
    """Run an ONNX graph with ORT's profiler; FLOPs from the recorded shapes and time per op type
    (median over `runs` calls after a warm-up)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "prof")
        sess = ort.InferenceSession(str(onnx_path), sess_options=opts, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    calls = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    node_events = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    # split node events by run (they come in order; drop the warm-up)
    per_run = max(len(node_events) // (runs + 1), 1)
    node_events = node_events[per_run:]
    by_op_time, flops = defaultdict(float), 0
    for e in node_events:
        args = e.get("args", {})
        op = args.get("op_name", "?")
        by_op_time[op] += e.get("dur", 0) / 1e6 / runs
        ins = [_shape(x) for x in args.get("input_type_shape", [])]
        outs = [_shape(x) for x in args.get("output_type_shape", [])]
        flops += _node_flops(op, ins, outs)
    run_times = sorted(e["dur"] / 1e6 for e in calls[1:])
    return {"flops_per_call": flops // runs, "op_time_s": dict(sorted(by_op_time.items(), key=lambda kv: -kv[1])),
            "call_s": float(np.median(run_times)) if run_times else None}


def codec_cost(onnx_path: str | Path, threads: int, frames: int = 8) -> dict:
    """FLOPs per frame (from a profiled call on `frames` frames), weight bytes (read once per call)."""
    import onnx

    from qwen3_tts_gguf.model.codec import CodecDecoder

    model = onnx.load(str(onnx_path))
    weight_bytes = sum(_initializers(model).values())
    del model
    dec = CodecDecoder(onnx_path, threads=threads)
    state = dec.new_state(1)
    rng = np.random.default_rng(0)
    feeds = {"codes": rng.integers(0, dec.codebook_size, (1, frames, dec.num_quantizers)).astype(np.int64)}
    feeds.update({f"in_{k}": v for k, v in state.tensors.items()})
    prof = profile_graph(onnx_path, feeds, threads)
    return {"flops_per_frame": prof["flops_per_call"] / frames, "weight_bytes_per_call": weight_bytes,
            "profile_frames": frames, "op_time_s_per_frame": {k: v / frames for k, v in prof["op_time_s"].items()},
            "call_s_per_frame": prof["call_s"] / frames if prof["call_s"] else None}


def predictor_profile(onnx_path: str | Path, threads: int) -> dict:
    from qwen3_tts_gguf.model.sampler import SamplingParams, pack

    rng = np.random.default_rng(0)
    feeds = {"hidden": rng.standard_normal((1, 1024), dtype=np.float32), "code0": np.array([7], np.int64),
             "rand": rng.random((1, 15), dtype=np.float32), **pack(SamplingParams(), 1)}
    import onnxruntime as ort

    sess_inputs = {i.name: i
                   for i in ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).get_inputs()}
    feeds["hidden"] = rng.standard_normal((1, sess_inputs["hidden"].shape[1]), dtype=np.float32)
    prof = profile_graph(onnx_path, feeds, threads)
    return {"op_time_s": prof["op_time_s"], "call_s": prof["call_s"], "flops_profiled": prof["flops_per_call"]}


def model_costs(model_dir: str | Path, threads: int, profile: bool = True,
                predictor_dirs: dict | None = None) -> dict:
    """Costs of the headline model folder; `predictor_dirs` {precision: folder} adds the code
    predictor of other folders (other precisions), each profiled too."""
    model_dir = Path(model_dir)
    out = {"talker": talker_cost(model_dir / TALKER_FILE)}
    if profile:
        out["codec"] = codec_cost(model_dir / CODEC_FILE, threads)
    from qwen3_tts_gguf.model.loaded import predictor_file

    out["predictors"] = {}
    for precision, folder in (predictor_dirs or {"?": model_dir}).items():
        cost = predictor_cost(Path(folder) / PREDICTOR_FILE)  # the weights and their file
        if profile:  # the graph the engine runs on the CPU
            cost.update(predictor_profile(Path(folder) / predictor_file(load_manifest(folder)), threads))
        out["predictors"][cost["precision"] if precision == "?" else precision] = cost
    return out
