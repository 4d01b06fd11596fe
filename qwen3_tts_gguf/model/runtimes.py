"""Which runtime runs the code predictor and the codec (`--cp-runtime`, `--codec-runtime`): ONNX Runtime
(the default on a CPU and on the devices it has a provider for), OpenVINO (the codec, opt-in), or
llama.cpp's own Qwen3-TTS graphs (`llama_stages.py`: every ggml backend, Vulkan included).

`auto` picks llama.cpp for both stages when the talker is offloaded (`--gpu-layers`) to a device ONNX
Runtime has no provider for (`--device` left on the CPU: Vulkan's GPUs, a CUDA machine without
onnxruntime-gpu) and the model folder has its llama stages file; ONNX Runtime otherwise (the parity
profile always keeps it). The runtime is a choice of implementation behind the stage's interface,
never a branch in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen3_tts_gguf.model.manifest import LLAMA_STAGES_FILE, Manifest

CP_RUNTIMES = ("auto", "onnxruntime", "llama")
"""What `--cp-runtime` accepts."""
CODEC_RUNTIMES = ("auto", "onnxruntime", "openvino", "llama")
"""What `--codec-runtime` accepts."""


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
    if deterministic and codec_runtime == "llama":
        raise CodecRuntimeError("--codec-runtime llama agrees with the parity codec to about 40 dB, it is not "
                                "bit-exact; --deterministic (the parity profile) keeps ONNX Runtime's codec")


def resolve(cp_runtime: str, codec_runtime: str, manifest: Manifest, *, gpu_layers: int, onnx_device: str,
            deterministic: bool = False) -> StageRuntimes:
    """Each stage's runtime for this folder: `auto` resolved (see the module docstring); llama.cpp asked
    of a folder without its llama stages file is a StageRuntimeError saying how to add it."""
    check_stage_runtimes(cp_runtime, codec_runtime, deterministic=deterministic)
    has_stages = LLAMA_STAGES_FILE in manifest.files
    offloaded_beyond_onnx = bool(gpu_layers) and onnx_device == "cpu"
    auto_llama = offloaded_beyond_onnx and has_stages and not deterministic
    why = ("auto: the talker is on a GPU ONNX Runtime has no provider for" if auto_llama else
           "auto: ONNX Runtime" + ("" if has_stages else " (this folder has no llama stages file)"))
    cp = ("llama" if auto_llama else "onnxruntime") if cp_runtime == "auto" else cp_runtime
    codec = ("llama" if auto_llama else "onnxruntime") if codec_runtime == "auto" else codec_runtime
    if "llama" in (cp, codec) and not has_stages:
        raise StageRuntimeError(f"--{'cp' if cp == 'llama' else 'codec'}-runtime llama: {manifest.name} has no "
                                f"{LLAMA_STAGES_FILE}: {manifest.llama_stages_missing}")
    if "auto" not in (cp_runtime, codec_runtime):
        why = "as asked"
    return StageRuntimes(cp, codec, why)
