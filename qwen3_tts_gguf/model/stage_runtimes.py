"""Which runtime runs the code predictor and the codec (`--cp-runtime`, `--codec-runtime`): ONNX Runtime
(the default on a CPU and on the devices it has a provider for), OpenVINO (the codec, opt-in), or the
project's own ggml graphs (`ggml/`: the streaming codec and the batched code predictor, on every ggml
backend, Vulkan and CUDA included).

When the talker is offloaded (`--gpu-layers`) to a device ONNX Runtime has no provider for (`--device`
left on the CPU: Vulkan's GPUs, a CUDA machine without onnxruntime-gpu), `auto` puts both stages on the
project's ggml graphs on the talker's device (the code predictor where the model folder has its llama
stages file, whose weights it reads; the codec unless its inputs, as measured at conversion, pass what f16
holds); ONNX Runtime otherwise (the parity profile always keeps it).
On a CPU ONNX Runtime measures fastest for both stages (docs/benchmarks.md, *Stage runtimes*). The runtime
is a choice of implementation behind the stage's interface, never a branch in the engine. (llama.cpp's own
graphs, libmtmd's windowed `code2wav` and one-stream `code_gen`, were a runtime until 2026-12-06: they lost
every measurement, docs/gpu.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen3_tts_gguf.model.manifest import LLAMA_STAGES_FILE, Manifest

CP_RUNTIMES = ("auto", "onnxruntime", "ggml")
"""What `--cp-runtime` accepts."""
CODEC_RUNTIMES = ("auto", "onnxruntime", "openvino", "ggml")
"""What `--codec-runtime` accepts."""


_PAST_F16 = ("this model's codec inputs peak at {peak:.3g} (measured at conversion), past what a GPU's matrix "
             "kernels take when they round their inputs to f16 (ggml-vulkan's do)")


class StageRuntimeError(ValueError):
    """A runtime these settings or this model folder cannot use (one line at start)."""


class CodecRuntimeError(StageRuntimeError):
    """A codec runtime this installation or these settings cannot use."""


@dataclass(frozen=True)
class StageRuntimes:
    """The runtime of each stage, and why (for the start-up plan and `doctor`)."""

    predictor: str
    codec: str
    why: str


def check_stage_runtimes(cp_runtime: str, codec_runtime: str, *, deterministic: bool = False) -> None:
    """StageRuntimeError for a choice no folder could satisfy (the folder's own check: `resolve`)."""
    if cp_runtime not in CP_RUNTIMES:
        raise StageRuntimeError(f"--cp-runtime {cp_runtime!r}: expected one of {', '.join(CP_RUNTIMES)}")
    if codec_runtime not in CODEC_RUNTIMES:
        raise CodecRuntimeError(f"--codec-runtime {codec_runtime!r}: expected one of {', '.join(CODEC_RUNTIMES)}")
    if deterministic and codec_runtime == "ggml":
        raise CodecRuntimeError("--codec-runtime ggml agrees with the parity codec to about 85 dB, it "
                                "is not bit-exact; --deterministic (the parity profile) keeps ONNX Runtime's codec")


def resolve(cp_runtime: str, codec_runtime: str, manifest: Manifest, *, gpu_layers: int, onnx_device: str,
            deterministic: bool = False) -> StageRuntimes:
    """Each stage's runtime for this folder: `auto` resolved (see the module docstring); the ggml code
    predictor asked of a folder without its llama stages file is a StageRuntimeError saying how to add it."""
    check_stage_runtimes(cp_runtime, codec_runtime, deterministic=deterministic)
    has_stages = manifest.llama_stages_missing is None
    on_gpu = bool(gpu_layers) and onnx_device == "cpu" and not deterministic
    why = ("auto: the talker is on a GPU ONNX Runtime has no provider for" if on_gpu else "auto: ONNX Runtime")
    if on_gpu and not has_stages:
        why += " (the code predictor on ONNX Runtime: this folder has no llama stages file)"
    cp = ("ggml" if on_gpu and has_stages else "onnxruntime") if cp_runtime == "auto" else cp_runtime
    peak = manifest.codec_peak_past_f16
    if on_gpu and peak is not None:
        why += f" (the codec on ONNX Runtime: {_PAST_F16.format(peak=peak)})"
    codec = ("ggml" if on_gpu and peak is None else "onnxruntime") if codec_runtime == "auto" else codec_runtime
    if codec == "ggml" and gpu_layers and peak is not None:
        raise CodecRuntimeError(f"--codec-runtime ggml would run the codec on the talker's GPU, but "
                                f"{_PAST_F16.format(peak=peak)}; leave the codec on onnxruntime")
    if cp == "ggml" and not has_stages:
        raise StageRuntimeError(f"--cp-runtime ggml reads the code predictor of {LLAMA_STAGES_FILE}, which "
                                f"{manifest.name} has not: {manifest.llama_stages_missing}")
    if "auto" not in (cp_runtime, codec_runtime):
        why = "as asked"
    return StageRuntimes(cp, codec, why)
