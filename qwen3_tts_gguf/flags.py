"""Flags the commands share, defined once: number domains, threads, and where the engine runs.

`synth`, `doctor` and `serve` (whose own flags are the server's: `api/cli_args.py`) reach the same
engine knobs through these.
"""

from __future__ import annotations

import argparse
import math


def number(kind, minimum, maximum=None, unit: str = ""):
    """An argparse type: a finite `kind` (int or float) of at least `minimum` (None: above 0) and at
    most `maximum` (None: no bound); `unit` names what it counts in the refusal."""
    low = "above 0" if minimum is None else f"at least {minimum}"
    domain = f"{low} and at most {maximum}" if maximum is not None else low

    def parse(text: str):
        value = kind(text)
        if not (math.isfinite(value) and (value > 0 if minimum is None else value >= minimum)
                and (maximum is None or value <= maximum)):
            raise argparse.ArgumentTypeError(f"{text} is out of range ({domain}{' ' + unit if unit else ''})")
        return value
    parse.__name__ = kind.__name__
    return parse


COUNT, SECONDS, COUNT0 = number(int, 1), number(float, None, unit="seconds"), number(int, 0)
PORT = number(int, 0, 65535)
SEED = number(int, 0, 2**63 - 1)


def threads_flag(purpose: str = "") -> dict:
    """--threads of every command: 0 (the CPUs this process may use) to MAX_THREADS."""
    from qwen3_tts_gguf.model.settings import MAX_THREADS

    return dict(type=number(int, 0, MAX_THREADS), default=0, metavar="N",
                help=f"{purpose or 'CPU threads'} (default 0: the CPUs this process may use: affinity mask and "
                     f"cgroup CPU quota; at most {MAX_THREADS})")


def add_runaway_args(p: argparse.ArgumentParser) -> None:
    """The runaway guard (speak and serve alike): what a segment whose codebook 0 loops gets."""
    from qwen3_tts_gguf.model.settings import MAX_RUNAWAY_RETRIES, RUNAWAY_ACTIONS, EngineSettings

    p.add_argument("--runaway", choices=RUNAWAY_ACTIONS, default=EngineSettings.runaway,
                   help="a segment whose codebook 0 falls into a loop (a phrase or a sound repeated): end it where "
                        "the loop began, or retry from there with a new random state (the seed still decides it), "
                        "at most --runaway-retries times a stream, then end; off leaves it to the frame budget "
                        "(docs/reliability.md, Runaway; default %(default)s)")
    p.add_argument("--runaway-retries", type=number(int, 0, MAX_RUNAWAY_RETRIES),
                   default=EngineSettings.runaway_retries, metavar="N",
                   help=f"retries per stream with --runaway retry (0 to {MAX_RUNAWAY_RETRIES}, default %(default)s)")


def add_device_args(p: argparse.ArgumentParser) -> None:
    """Where and how the engine runs: the devices and the talker's KV cache (speak and serve alike)."""
    from qwen3_tts_gguf.host.devices import ONNX_DEVICES, parse_gpu_layers
    from qwen3_tts_gguf.host.heap import MAP_THRESHOLD, MAX_MAP_THRESHOLD
    from qwen3_tts_gguf.model.settings import KV_CELLS_PER_STREAM, MAX_KV_CELLS, MAX_THREADS, MIN_KV_CELLS
    from qwen3_tts_gguf.model.stage_runtimes import CODEC_RUNTIMES, CP_RUNTIMES
    from qwen3_tts_gguf.model.talker import KV_CACHE_TYPES

    p.add_argument("--device", choices=ONNX_DEVICES, default="cpu",
                   help="ONNX Runtime execution provider for the code predictor and codec, among those installed "
                        "(cuda needs onnxruntime-gpu, webgpu the onnxruntime-ep-webgpu plugin); auto: the best "
                        "installed, named at start (default cpu; `doctor` lists them)")
    p.add_argument("--gpu-layers", type=parse_gpu_layers, default=0, metavar="N|all",
                   help="talker layers to offload to the GPU, or all (a llama-cpp-python built with Vulkan or "
                        "CUDA: README, GPU backends); refused at start on a build without one (default 0)")
    p.add_argument("--kv-cache", choices=KV_CACHE_TYPES, default="q8_0",
                   help="talker KV cache precision: q8_0 takes half the memory of f16, q4_0 a quarter (agreement: "
                        "docs/benchmarks.md); "
                        "--deterministic always uses f32 (default %(default)s)")
    min_n_ctx = 512
    p.add_argument("--n-ctx", type=number(int, min_n_ctx, MAX_KV_CELLS), default=None, metavar="CELLS",
                   help="talker KV cells shared by all of a model's streams: memory (60 KiB per cell at 0.6B "
                        f"with q8_0, 112 with f16) against how many long texts run at once (default "
                        f"{KV_CELLS_PER_STREAM} per stream, --max-streams for serve and one for speak, "
                        f"at least {MIN_KV_CELLS}; "
                        f"{min_n_ctx} to {MAX_KV_CELLS})")
    p.add_argument("--no-codec-overlap", action="store_true",
                   help="decode audio on the engine thread between steps instead of on a thread of its own beside "
                        "the talker and code predictor (the fast profile overlaps them on 2+ threads)")
    p.add_argument("--codec-threads", type=number(int, 1, MAX_THREADS), default=None, metavar="N",
                   help="threads of one overlapped codec call (default: --threads): fewer run several streams' "
                        "calls side by side, in a lane each: more throughput with many streams, later first audio "
                        "(docs/benchmarks.md, Codec overlap)")
    p.add_argument("--cp-runtime", choices=CP_RUNTIMES, default="auto",
                   help="what runs the code predictor: onnxruntime, or ggml (the project's batched code predictor "
                        "on ggml, on the talker's device: every GPU llama.cpp runs on, Vulkan included; docs/gpu.md; "
                        "it reads the model folder's llama stages file); auto: ggml when the talker is offloaded to "
                        "a GPU that --device cannot reach and the model folder has its llama stages file, else "
                        "onnxruntime (default %(default)s)")
    p.add_argument("--codec-runtime", choices=CODEC_RUNTIMES, default="auto",
                   help="what runs the codec: onnxruntime; openvino (pip install openvino; CPU only, not with "
                        "--deterministic) decodes about a fifth faster than ONNX Runtime but holds more memory "
                        "(0.6B, eight streams: about 130 MiB more at the peak, with a writable model folder for its "
                        "cache; docs/benchmarks.md, Codec overlap); ggml (the project's streaming codec on ggml, on "
                        "the talker's device: every GPU llama.cpp runs on; not with --deterministic); auto: ggml "
                        "when the talker is offloaded to a GPU that --device cannot reach, else "
                        "onnxruntime (default %(default)s)")
    p.add_argument("--heap-map-threshold", type=number(int, 0, MAX_MAP_THRESHOLD), default=MAP_THRESHOLD,
                   metavar="BYTES",
                   help="blocks of at least this size are mapped on their own and unmapped when freed (glibc): "
                        "a lower peak memory with many streams; 0 leaves malloc's own dynamic threshold, and "
                        "MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES, when set, win (default %(default)s)")
