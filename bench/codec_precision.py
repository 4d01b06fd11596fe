"""Codec precisions: what a narrower or rewritten codec graph costs in fidelity and gains in speed
(`python -m bench --only codec`, also part of the full run).

Each variant is built here from the headline model's converted fp32 codec graph:
- fp16: every tensor in float16 (ONNX Runtime's float16 converter), inputs and outputs kept fp32;
- int8 (Conv + MatMul): ONNX Runtime's dynamic quantization, int8 weights per channel and uint8
  activations quantized per tensor at run time;
- int8 (MatMul only): the same for the MatMuls (the pre-transformer and the upsampling), convolutions fp32;
- Snake with Sin: fp32, each Snake's sin² computed by ONNX `Sin` (one thread in ONNX Runtime) and a
  square, as the converter did before its polynomial (`codec_graph.sin_pi_squared`); built from the
  model's source checkpoint;
- OpenVINO fp32 / bf16: the converted graph itself, compiled by OpenVINO instead of ONNX Runtime
  (`--codec-runtime openvino`, f32; bf16 is OpenVINO's own default on CPUs with AVX-512 BF16).
Every variant decodes the same random frames in the engine's chunks (1, 2, 4, 8, ...), rounds
alternating; speed is ms per frame over the whole utterance, fidelity the SNR and largest sample
difference against the fp32 graph decoding the same chunks. A variant may become the default only at
an SNR of at least 40 dB and if it is at least 5 % faster (less is within the rounds' noise). Measured on random
weights: real checkpoints must be measured again.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import Meter, median, wait_for_quiet

CHUNKS = (1, 2, 4, 8, 8, 8, 8, 9)  # 48 frames as the engine emits them
GATE_DB = 40.0
GATE_SPEEDUP = 0.95  # at most this fraction of fp32's ms per frame: smaller gains are within the noise
QUIET_BACKGROUND = 0.05  # a speed verdict counts only with other processes at most this share of the CPUs
REFERENCE = "fp32 (default)"
SNAKE_SIN = "Snake with Sin"
VARIANTS = {  # name -> what changes
    REFERENCE: "the converted graph",
    "fp16": "every tensor float16; inputs and outputs fp32",
    "int8, Conv + MatMul": "dynamic quantization: int8 weights per channel, uint8 activations per tensor",
    "int8, MatMul only": "dynamic quantization of the MatMuls; convolutions fp32",
    SNAKE_SIN: "fp32; each Snake's sin² by ONNX `Sin` (one thread) and a square instead of the polynomial",
    "OpenVINO fp32": "the converted graph compiled by OpenVINO (oneDNN kernels) at f32",
    "OpenVINO bf16": "the converted graph compiled by OpenVINO at bf16 (AVX-512 BF16 where the CPU has it)",
}
OPENVINO_PRECISIONS = {"OpenVINO fp32": "f32", "OpenVINO bf16": "bf16"}
OPT_IN = {"OpenVINO fp32": "`--codec-runtime openvino`"}
"""Variants the engine offers as an option: one that meets the gate stays opt-in (it costs memory)."""


def build_variants(model_dir: Path, out_dir: Path) -> dict[str, Path]:
    """Each variant's graph file under `out_dir` (the reference is the model's own codec graph)."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from qwen3_tts_gguf.convert.checkpoint import Checkpoint
    from qwen3_tts_gguf.convert.codec_graph import build_codec_decoder
    from qwen3_tts_gguf.convert.onnx_builder import save_model
    from qwen3_tts_gguf.model.manifest import CODEC_FILE, load_manifest

    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    source = model_dir / CODEC_FILE
    paths = {REFERENCE: source}
    fp16 = convert_float_to_float16(onnx.load(source), keep_io_types=True, disable_shape_infer=True)
    onnx.save(fp16, paths.setdefault("fp16", out_dir / "codec_fp16.onnx"))
    for name, ops, file in (("int8, Conv + MatMul", ["Conv", "MatMul"], "codec_int8_conv_matmul.onnx"),
                            ("int8, MatMul only", ["MatMul"], "codec_int8_matmul.onnx")):
        paths[name] = out_dir / file
        quantize_dynamic(source, paths[name], op_types_to_quantize=ops, per_channel=True,
                         weight_type=QuantType.QUInt8, extra_options={"MatMulConstBOnly": True})
    checkpoint = Checkpoint.open(load_manifest(model_dir).source["path"])
    save_model(build_codec_decoder(checkpoint, snake_sin=True), paths.setdefault(SNAKE_SIN, out_dir / "codec_sin.onnx"))
    for name in OPENVINO_PRECISIONS:
        paths[name] = source
    return paths


def load_variant(name: str, path: Path, threads: int):
    """The variant's CodecDecoder: ONNX Runtime's session, or OpenVINO's at the variant's precision."""
    from qwen3_tts_gguf.model.codec import CodecDecoder
    from qwen3_tts_gguf.model.openvino_session import OpenVINOSession

    if name not in OPENVINO_PRECISIONS:
        return CodecDecoder(path, threads=threads)
    codec = CodecDecoder(path, threads=threads, runtime="openvino")
    if OPENVINO_PRECISIONS[name] != "f32":  # not an engine setting: the bench compiles its own session
        codec.session = OpenVINOSession(path, threads=threads, precision=OPENVINO_PRECISIONS[name])
    return codec


def snr_db(samples: np.ndarray, reference: np.ndarray) -> float | None:
    """Signal-to-noise ratio of `samples` against `reference`, dB; None when they are equal."""
    noise = float(np.mean((samples - reference) ** 2))
    return float(10 * np.log10(np.mean(reference ** 2) / noise)) if noise > 0 else None


def decode_chunked(codec, codes: np.ndarray) -> tuple[np.ndarray, float]:
    """The utterance decoded in CHUNKS; (samples, seconds)."""
    parts, state, start = [], None, 0
    t0 = time.perf_counter()
    for n in CHUNKS:
        wav, state = codec.decode(codes[start:start + n], state)
        parts.append(wav)
        start += n
    return np.concatenate(parts), time.perf_counter() - t0


def measure(model_dir: str, threads: int, rounds: int = 3, quiet_s: float = 0.0, progress=None) -> dict:
    """Speed (ms per frame, per round) and fidelity against fp32 of every variant."""
    codes = np.random.default_rng(0).integers(0, 2048, (sum(CHUNKS), 16))
    out: dict = {"frames": len(codes), "chunks": list(CHUNKS), "threads": threads, "rounds": rounds,
                 "gate_db": GATE_DB, "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if progress:
            progress("codec precisions: building the variants")
        paths = build_variants(Path(model_dir), Path(tmp))
        codecs, reference = {}, None
        for name, path in paths.items():
            entry = out["variants"][name] = {"changes": VARIANTS[name], "file_mb": path.stat().st_size / 2**20,
                                             "ms_per_frame": [], "background": []}
            try:
                codecs[name] = load_variant(name, path, threads)
                wav, _ = decode_chunked(codecs[name], codes)  # also the warm-up
            except Exception as e:  # a runtime without a kernel for this precision: reported, not fatal
                entry["error"] = f"{type(e).__name__}: {e}"[:300]
                continue
            reference = wav if reference is None else reference
            entry["snr_db"] = snr_db(wav, reference)
            entry["max_abs_diff"] = float(np.abs(wav - reference).max())
        for r in range(rounds):
            for name, codec in list(codecs.items())[::1 if r % 2 == 0 else -1]:  # no variant always goes first
                if progress:
                    progress(f"codec precisions: round {r + 1}/{rounds}, {name}")
                wait_for_quiet(quiet_s)
                with Meter() as m:
                    _, seconds = decode_chunked(codec, codes)
                out["variants"][name]["ms_per_frame"].append(1000 * seconds / len(codes))
                out["variants"][name]["background"].append(m.background)
    return out


def speed_ratio(entry: dict, reference: dict) -> float | None:
    """Median over rounds of the variant's ms per frame over fp32's in the same round (pairs cancel
    the drift between rounds)."""
    pairs = [a / b for a, b in zip(entry.get("ms_per_frame", []), reference.get("ms_per_frame", [])) if b > 0]
    return median(pairs)


def verdict(name: str, entry: dict, reference: dict) -> str:
    """Why a variant is (not) the default."""
    if name == REFERENCE:
        return "the default"
    if "error" in entry:
        return "cannot run: " + entry["error"]
    ratio, snr = speed_ratio(entry, reference), entry.get("snr_db")
    reasons = []
    if snr is not None and snr < GATE_DB:
        reasons.append(f"SNR below {GATE_DB:.0f} dB")
    if ratio is not None and ratio > GATE_SPEEDUP:
        reasons.append(f"not {100 * (1 - GATE_SPEEDUP):.0f} % faster")
    if reasons:
        return "kept off: " + " and ".join(reasons)
    noisy = [median(e["background"]) for e in (entry, reference) if e.get("background")]
    if noisy and max(noisy) > QUIET_BACKGROUND:  # a gain measured while other jobs ran is not a gain yet
        return (f"not judged: other processes used {100 * max(noisy):.0f} % of the CPUs (rerun `python -m bench "
                "--only codec` on a quiet machine)")
    if name in OPT_IN:
        return f"meets the gate; opt-in ({OPT_IN[name]}): more memory, see *Codec overlap*"
    return "meets the gate"
