"""The codec graph on OpenVINO's CPU runtime instead of ONNX Runtime (`--codec-runtime openvino`).

The same ONNX file, compiled by OpenVINO (oneDNN kernels): its convolutions are faster on x86 than
ONNX Runtime's and its chains of elementwise ops (the Snakes) run fused. 0.6B codec, 2 cores, 48 frames
in the engine's chunks (`python -m bench --only codec`, 2026-12-02 01:33, 01:44, 01:47, and the full
bench at 04:16): 0.84, 0.87, 0.77 and 0.76 of ONNX Runtime's time per frame, samples within fp32
rounding of ONNX Runtime's (SNR 80 dB). The price is memory: the compiled graph keeps its own copies
of the weights in the layouts its kernels want (the engine's peak after eight streams went 1922 -> 2459
MiB in docs/benchmarks.md's Codec overlap, 2026-12-02 04:09; 1932 -> 2893 in a run at 01:38).
Opt-in, CPU only, never in the parity profile (`--deterministic` keeps ONNX Runtime's exact path).

Precision is pinned to f32: on CPUs with AVX-512 BF16 or AMX, OpenVINO's default is bf16, which the
codec does not survive (SNR 24 dB on random weights).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np

RUNTIMES = ("onnxruntime", "openvino")
"""What `--codec-runtime` accepts."""


class CodecRuntimeError(ValueError):
    """A codec runtime this installation or these settings cannot use (one line at start)."""


def openvino_installed() -> bool:
    return importlib.util.find_spec("openvino") is not None


def openvino_version() -> str | None:
    """The installed OpenVINO's version ("2026.4.1"), None when it is not installed."""
    if not openvino_installed():
        return None
    import openvino

    return openvino.__version__.split("-")[0]


def check_codec_runtime(runtime: str, device: str = "cpu", deterministic: bool = False) -> str:
    """CodecRuntimeError when `runtime` cannot run here with these settings; else a few words for the
    start-up plan ("" for ONNX Runtime, which `--device` already describes)."""
    if runtime not in RUNTIMES:
        raise CodecRuntimeError(f"--codec-runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if runtime == "onnxruntime":
        return ""
    version = openvino_version()
    if version is None:
        raise CodecRuntimeError("--codec-runtime openvino: the openvino package is not installed "
                                "(pip install openvino; docs/benchmarks.md, Codec precision)")
    if device != "cpu":
        raise CodecRuntimeError(f"--codec-runtime openvino runs the codec on the CPU; --device {device} asks "
                                "ONNX Runtime for another device: drop one of them")
    if deterministic:
        raise CodecRuntimeError("--codec-runtime openvino is not bit-exact; --deterministic (the parity profile) "
                                "keeps ONNX Runtime's codec")
    return f"codec on OpenVINO {version} (CPU, f32)"


class OpenVINOSession:
    """An ONNX graph compiled by OpenVINO for the CPU, called like an ONNX Runtime session
    (`run(output_names, feeds)`). `threads` per call; `streams` calls may run at once (one infer
    request per calling thread), as the engine's codec lanes do. `metadata`: the file's
    metadata_props (ONNX Runtime's custom_metadata_map)."""

    def __init__(self, path: str | Path, *, threads: int, streams: int = 1, precision: str = "f32"):
        import openvino as ov

        config = {
            "INFERENCE_PRECISION_HINT": precision,  # f32 in the engine (module docstring); bf16 only in the bench
            "INFERENCE_NUM_THREADS": threads * streams,  # OpenVINO counts the threads of all its streams
            "NUM_STREAMS": streams,
            "PERFORMANCE_HINT": "LATENCY",
            "ENABLE_CPU_PINNING": False,  # the cores are shared with llama.cpp and the code predictor
        }
        core = ov.Core()
        model = core.read_model(str(path))
        framework = model.get_rt_info()["framework"]  # where OpenVINO's ONNX reader keeps metadata_props
        self.metadata: dict[str, str] = {key: value.astype(str) for key, value in framework.items()}
        self._compiled = core.compile_model(model, "CPU", config)
        del model  # the compiled model has what it needs
        self._port = {}  # output name -> index in the compiled model's outputs
        for i, port in enumerate(self._compiled.outputs):
            for name in port.get_names():
                self._port[name] = i
        self._local = threading.local()

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request = getattr(self._local, "request", None)
        if request is None:  # an infer request is not thread-safe: one per calling thread
            request = self._local.request = self._compiled.create_infer_request()
        request.infer(feeds)
        # copies: the request reuses its output buffers on the next call
        return [np.array(request.get_output_tensor(self._port[name]).data) for name in output_names]
