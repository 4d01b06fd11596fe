"""The converter's self-check: reload what was written and run one forward pass of each graph.

Each graph is compared with a plain-numpy forward computed from the source weights
(`numpy_reference`); the codec graph must also decode a few frames identically whole and in chunks.
The llama stages file is read back with `gguf` (its metadata, every tensor's name, shape and type, and
a few tensors' values against the source weights); running its code predictor on the ggml graphs is
that runtime's test. A conversion that fails any check is not reported as a success.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.numpy_reference import code_predictor_logits, decode_codes, decoder_stack
from qwen3_tts_gguf.convert.presets import LlamaStagesFormat

# relative RMS error of the talker's logits against an f32 numpy forward, per weight format
TALKER_REL_RMS = {"f32": 1e-4, "bf16": 0.03, "f16": 0.01, "q8_0": 0.06, "q5_k_m": 0.15, "q4_k_m": 0.3, "iq4_nl": 0.35}
# relative RMS error of the code predictor's logits against the numpy forward, per precision
PREDICTOR_REL_RMS = {"fp32": 1e-4, "int8": 0.08, "int4": 0.6}
CODEC_TOL = 2e-4  # fp32 rounding-order noise of the deep conv stack (4e-5 tiny, 6e-5 real shape measured)


class VerificationError(RuntimeError):
    """A converted graph disagrees with the source weights."""


def _rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - b) ** 2)) / (np.sqrt(np.mean(np.square(b))) + 1e-30))


def verify_conversion(ckpt: Checkpoint, folder: Path, seed: int = 0) -> dict:
    """Check the talker, code predictor and codec in `folder`; returns the measured errors."""
    from qwen3_tts_gguf.model.codec import CodecDecoder
    from qwen3_tts_gguf.model.manifest import (
        CODEC_FILE,
        LLAMA_STAGES_FILE,
        PREDICTOR_CPU_FILE,
        PREDICTOR_FILE,
        TALKER_FILE,
        load_manifest,
    )
    from qwen3_tts_gguf.model.predictor import CodePredictor
    from qwen3_tts_gguf.model.talker import DecodeItem, Talker, TalkerSettings

    manifest = load_manifest(folder, verify_hashes=True)
    cfg = ckpt.config
    rng = np.random.default_rng(seed)
    report: dict = {}

    talker = Talker(folder / TALKER_FILE, TalkerSettings(n_ctx=64, max_streams=1, deterministic=True))
    try:
        rows = rng.standard_normal((6, cfg.talker.hidden_size)).astype(np.float32)
        logits, hidden = talker.decode([DecodeItem(0, 0, rows)])
    finally:
        talker.close()
    ref_hidden = decoder_stack(ckpt.weights, "talker.model", cfg.talker, rows, dtype=np.float32)[-1]
    ref_logits = ref_hidden @ ckpt.weights["talker.codec_head.weight"].T
    report["talker_logits_rel_rms"] = err = _rel_rms(logits[0], ref_logits)
    if not err <= TALKER_REL_RMS[manifest.quant]:  # NaN too
        raise VerificationError(f"talker ({manifest.quant}) logits differ from the source weights: "
                                f"relative RMS {err:.3g} > {TALKER_REL_RMS[manifest.quant]}")

    precision = manifest.code_predictor.get("precision", "fp32")
    h = rng.standard_normal((1, cfg.talker.hidden_size)).astype(np.float32)
    code0 = int(rng.integers(0, 2048))
    for file, key in ((PREDICTOR_FILE, "predictor"), (PREDICTOR_CPU_FILE, "predictor_cpu")):
        if file in manifest.files:
            predictor = CodePredictor(folder / file, threads=1)
            report.update(_check_predictor(predictor, ckpt, precision, h, code0, key, file))

    codec = CodecDecoder(folder / CODEC_FILE, threads=1)
    codes = rng.integers(0, cfg.codec.codebook_size, (3, 16))
    whole = codec.decode_all(codes)
    first, state = codec.decode(codes[:1])
    rest, _ = codec.decode(codes[1:], state)
    report["codec_chunk_max_abs"] = chunk_diff = float(np.abs(whole - np.concatenate([first, rest])).max())
    report["codec_max_abs"] = diff = float(np.abs(whole - decode_codes(ckpt.codec_weights, cfg.codec, codes)).max())
    if not np.isfinite(whole).all() or diff > CODEC_TOL or chunk_diff > CODEC_TOL:
        raise VerificationError(f"codec decoder differs from the source weights by {diff:.3g} "
                                f"(chunked vs whole: {chunk_diff:.3g})")
    if LLAMA_STAGES_FILE in manifest.files:
        stages = manifest.llama_stages or {}
        fmt = LlamaStagesFormat(stages.get("code_predictor", ""), stages.get("codec", ""))
        keep = frozenset(stages.get("f32_weights", ()))
        report.update(check_llama_stages(ckpt, folder / LLAMA_STAGES_FILE, fmt, keep))
    return report


def check_llama_stages(ckpt: Checkpoint, path: Path, fmt: LlamaStagesFormat, keep: frozenset[str] = frozenset()
                       ) -> dict:
    """The llama stages file at `path` read back: metadata, every tensor's name, shape and type as
    planned (`keep`: the weights kept F32), and a few tensors (one per stage) equal to the source weights
    in the stored type."""
    import gguf

    from qwen3_tts_gguf.convert.llama_stages import metadata, plan_llama_stages

    name = path.name
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise VerificationError(f"{name} is not a readable GGUF file ({e})") from e
    for key, want in metadata(ckpt).items():
        field = reader.get_field(key)
        got = field.contents() if field is not None else None
        if got != want and not (isinstance(want, float) and got is not None and np.isclose(got, want, rtol=1e-6)):
            raise VerificationError(f"{name}: metadata {key} is {got!r}, expected {want!r}")
    if reader.get_field("clip.projector_type") is not None:
        raise VerificationError(f"{name} sets clip.projector_type (it would override both projector types)")
    planned = {t.name: t for t in plan_llama_stages(ckpt, fmt, keep)[0]}
    stored = {t.name: t for t in reader.tensors}
    if set(stored) != set(planned):
        raise VerificationError(f"{name}: tensors missing {sorted(set(planned) - set(stored))[:5]}, "
                                f"unexpected {sorted(set(stored) - set(planned))[:5]}")
    for t in stored.values():
        want = planned[t.name]
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        if (t.tensor_type.name, shape) != (want.type, want.shape):
            raise VerificationError(f"{name}: {t.name} is {t.tensor_type.name} {list(shape)}, "
                                    f"expected {want.type} {list(want.shape)}")
    last = ckpt.config.code_predictor.num_layers - 1
    post_conv = f"decoder.decoder.{len(ckpt.config.codec.upsample_rates) + 2}.conv.weight"
    for tensor, source in (("a.gen.code.out_embd.weight", ckpt.weights["talker.model.codec_embedding.weight"]),
                           (f"a.gen.code.blk.{last}.ffn_down.weight",
                            ckpt.weights[f"talker.code_predictor.model.layers.{last}.mlp.down_proj.weight"]),
                           ("a.gen.wav.tfm.blk.0.attn_q.weight",
                            ckpt.codec_weights["decoder.pre_transformer.layers.0.self_attn.q_proj.weight"]),
                           ("a.gen.wav.dac.post_conv.weight", ckpt.codec_weights[post_conv])):
        data = np.asarray(stored[tensor].data)
        if not np.array_equal(data.reshape(source.shape), source.astype(data.dtype)):
            raise VerificationError(f"{name}: {tensor} differs from the source weights")
    return {"llama_stages_tensors": len(stored)}


def _check_predictor(predictor, ckpt: Checkpoint, precision: str, h: np.ndarray, code0: int, key: str,
                     file: str) -> dict:
    """One greedy frame of the code predictor graph `file` against the numpy forward; the errors as `key`_..."""
    from qwen3_tts_gguf.model.sampler import SamplingParams, pack

    feeds = {"hidden": h, "code0": np.array([code0]), "rand": np.zeros((1, 15), np.float32),
             **pack(SamplingParams(greedy=True), 1)}
    logits, codes = predictor.session.run(["logits", "codes"], feeds)
    ref = code_predictor_logits(ckpt.weights, ckpt.config, h[0], code0, codes[0].tolist(), dtype=np.float32)
    err = _rel_rms(logits[0], ref)
    name = f"code predictor {file} ({precision})"
    if not err <= PREDICTOR_REL_RMS[precision]:  # NaN too
        raise VerificationError(f"{name} logits differ from the source weights: "
                                f"relative RMS {err:.3g} > {PREDICTOR_REL_RMS[precision]}")
    if precision == "fp32":
        # the graph's greedy choice must be the reference's wherever the reference is not near-tied
        top2 = np.sort(ref, axis=-1)[:, -2:]
        decided = (top2[:, 1] - top2[:, 0]) > 1e-3 * (np.abs(top2[:, 1]) + 1)
        if not np.array_equal(ref.argmax(-1)[decided], codes[0][decided]):
            raise VerificationError(f"{name} greedy codes {codes[0].tolist()} differ from the source "
                                    f"weights' {ref.argmax(-1).tolist()}")
    return {f"{key}_logits_rel_rms": err, f"{key}_codes_equal": bool(np.array_equal(ref.argmax(-1), codes[0]))}
