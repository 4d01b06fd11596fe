"""Measurements in fresh processes, so that peak RSS, thread pools and runtimes (PyTorch for the
official pipeline, llama.cpp + ONNX Runtime for ours) never mix.

One-shot tasks: `python -m bench.worker TASK PARAMS_JSON OUT_JSON` with TASK machine (bandwidth,
GFLOP/s), costs (bytes/FLOPs of a model folder), agreement (quantized paths against precise ones),
memory (resident memory per part, `bench/memory.py`), codec (the codec graph's precisions,
`bench/codec_precision.py`), stages (each stage on ONNX Runtime and on the ggml graphs, `bench/stage_runtimes.py`)
or http (the HTTP server).

Sessions: `python -m bench.worker session ours|official|peer PARAMS_JSON` loads a model once (in a session
of its own at that autogroup nice when PARAMS has `autogroup_nice`), answers `{"ready": ...}`, then runs one
operation per JSON line read from stdin (`{"op": "single", "rep": r}`, with `"frames": n` an utterance of n
frames; `{"op": "concurrency", "n": n}`, `{"op": "summary"}` which also ends it) and answers each with one
JSON line. Results go to the original stdout; anything libraries print goes to
stderr. Sessions let the orchestrator interleave our runs with the official ones, so both see
the same background load on a shared machine.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def _one_shot(task: str, params: dict, out: Path) -> int:
    from bench.common import Meter, progress, wait_for_quiet

    try:
        if task == "machine":
            from bench.physics import machine_limits

            quiet = wait_for_quiet(params.get("quiet_s", 0.0))
            with Meter() as m:
                result = machine_limits(params["threads"])
            result.update(quiet, background=m.background)
        elif task == "costs":
            from bench.physics import model_costs

            wait_for_quiet(params.get("quiet_s", 0.0))  # the ORT profile is a timing too
            result = model_costs(params["model_dir"], params["threads"], params.get("profile", True),
                                 params.get("predictor_dirs"))
        elif task == "agreement":
            from bench.agreement import measure

            result = measure(params["folders"], params["threads"])
        elif task == "memory":
            from bench import memory

            args = (params["model_dir"], params["threads"], params["kv_cache"])
            result = memory.parts(*args) if params["phase"] == "parts" else memory.peak(*args, params["frames"])
        elif task == "codec":
            from bench import codec_precision

            result = codec_precision.measure(progress=progress, **params)
        elif task == "stages":
            from bench import stage_runtimes

            result = stage_runtimes.measure(progress=progress, **params)
        elif task == "http":
            from bench.http_ttfa import run

            result = run(progress=progress, **params)
        else:
            raise SystemExit(f"unknown task {task!r}")
    except Exception as e:  # reported to the orchestrator, which records the failure in the report
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
    out.write_text(json.dumps(result, default=_jsonable))
    return 0 if "error" not in result else 1


def _own_session_at(nice: int) -> None:
    """Leave the orchestrator's session for one of our own and set its autogroup's nice (where the kernel
    shares the CPU between sessions first, this is the CPU weight of everything this process runs; a
    negative value needs privileges)."""
    os.setsid()
    with open("/proc/self/autogroup", "w") as f:
        f.write(str(nice))


def _session(kind: str, params: dict) -> int:
    from bench.common import progress

    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (banners, warnings) must not corrupt the result channel
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        channel.write(json.dumps(obj, default=_jsonable) + "\n")
        channel.flush()

    try:
        nice = params.pop("autogroup_nice", None)
        if nice is not None:
            _own_session_at(nice)
        if kind == "ours":
            from bench.pipelines.ours import OursSession

            session = OursSession(progress=progress, **params)
        elif kind == "official":
            from bench.pipelines.official import OfficialSession

            session = OfficialSession(progress=progress, **params)
        elif kind == "peer":  # in the peer's own venv: nothing of the project's but bench/
            from bench.pipelines.peers import PeerSession

            session = PeerSession(progress=progress, **params)
        else:
            raise SystemExit(f"unknown session kind {kind!r}")
    except Exception as e:
        traceback.print_exc()
        send({"error": f"{type(e).__name__}: {e}"})
        return 1
    send({"ready": True})
    for line in sys.stdin:
        op = json.loads(line)
        try:
            if op["op"] == "single":
                send(session.single(op["rep"], **({"frames": op["frames"]} if "frames" in op else {})))
            elif op["op"] == "isolated":
                send(session.isolated())
            elif op["op"] == "latency":
                send(session.latency(op["rep"]))
            elif op["op"] == "playback":
                send(session.playback())
            elif op["op"] == "concurrency":
                send(session.concurrency(op["n"]))
            elif op["op"] == "summary":
                send(session.summary())
                return 0
            else:
                send({"error": f"unknown op {op['op']!r}"})
        except Exception as e:
            traceback.print_exc()
            send({"error": f"{type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "session":
        sys.exit(_session(args[1], json.loads(args[2])))
    sys.exit(_one_shot(args[0], json.loads(args[1]), Path(args[2])))
