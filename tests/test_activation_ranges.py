"""Precision that survives the published weights (issue 47, item 5).

The published 0.6B code predictor's `mlp.down_proj` input peaks at about 1.3e5, twice f16's range; random
weights never come near. These tests plant such a spike: one intermediate channel of an MLP (the code
predictor's first layer, and the talker's) has its gate and up rows scaled by s and its down_proj column by
1/s^2, so the MLP's output keeps its size while down_proj's input reaches PEAK. The converter measures it
(`convert/precision/activation_ranges.py`) and keeps those weights f32, and every format stays finite and
within its stated agreement; written as before (nothing kept), the f16 talker gives NaN, the 8-bit
activations (q8_0 talker, int8 code predictor) leave their agreement and the f16 llama stages file aborts the
process (checked in a subprocess).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from qwen3_tts_gguf.convert import pipeline
from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.llama_stages import f32_weights, write_llama_stages
from qwen3_tts_gguf.convert.numpy_reference import code_predictor_logits, decode_codes, decoder_stack
from qwen3_tts_gguf.convert.pipeline import convert_checkpoint
from qwen3_tts_gguf.convert.precision.activation_ranges import (
    F16_LIMIT,
    F16_MAX,
    ActivationRanges,
    keep_f32,
)
from qwen3_tts_gguf.convert.predictor_graph import build_code_predictor, quantize_code_predictor
from qwen3_tts_gguf.convert.presets import PRESETS, LlamaStagesFormat
from qwen3_tts_gguf.convert.talker_gguf import gguf_tensor_types, write_talker_gguf
from qwen3_tts_gguf.convert.verify import PREDICTOR_REL_RMS, TALKER_REL_RMS, VerificationError, _rel_rms
from qwen3_tts_gguf.model.manifest import LLAMA_STAGES_FILE, MANIFEST, PREDICTOR_FILE, TALKER_FILE, load_manifest
from qwen3_tts_gguf.model.sampler import SamplingParams, pack
from qwen3_tts_gguf.model.stage_runtimes import CodecRuntimeError, resolve
from qwen3_tts_gguf.model.talker import DecodeItem, Talker, TalkerSettings, kv_cache_for

from tests.conftest import ROOT
from tests.planted_spike import CP_DOWN, PEAK, TALKER_DOWN, against_reference, measured, plant


@pytest.fixture(scope="module")
def planted(checkpoint_factory, tmp_path_factory):
    """name -> (planted checkpoint folder, its ranges) for tiny_cv and tiny_realcodec_cv."""
    found = {}
    for name in ("tiny_cv", "tiny_realcodec_cv"):
        dst = tmp_path_factory.mktemp(name) / "checkpoint"
        found[name] = dst, plant(checkpoint_factory(name), dst)
    return found


def test_measure_finds_the_planted_spike_and_random_weights_keep_nothing(planted, checkpoint_factory, tmp_path):
    _, ranges = planted["tiny_cv"]
    for name in (CP_DOWN, TALKER_DOWN):
        assert ranges.inputs[name].peak == pytest.approx(PEAK, rel=0.01)
    assert keep_f32(ranges, "f16") == {CP_DOWN, TALKER_DOWN}
    assert keep_f32(ranges, "q8_0", "talker") == {TALKER_DOWN}
    assert keep_f32(ranges, "int8", "code_predictor") == keep_f32(ranges, "int4", "code_predictor") == {CP_DOWN}
    assert keep_f32(ranges, "bf16") == keep_f32(ranges, "f32") == keep_f32(ranges, "fp32") == frozenset()
    random = measured(checkpoint_factory("tiny_cv"), tmp_path)
    assert max(r.peak for k, r in random.inputs.items() if not k.startswith("decoder.")) < F16_LIMIT / 100
    # the codec is measured through its vocoder (every convolution), whose residual units grow its inputs
    # even on random weights: still well inside f16
    convs = [k for k in random.inputs if k.startswith("decoder.decoder.") and k.endswith("conv.weight")]
    assert len(convs) == 2 + 7 * len(Checkpoint.open(checkpoint_factory("tiny_cv")).config.codec.upsample_rates)
    assert random.report({})["codec_peak"] < F16_LIMIT / 4
    for fmt in ("f16", "bf16", "q8_0", "q4_k_m", "iq4_nl", "int8", "int4"):
        assert keep_f32(random, fmt) == frozenset(), fmt
    assert keep_f32(ActivationRanges(random.inputs, model_size="0b6"), "f16") == {  # upstream's rule
        f"talker.code_predictor.model.layers.{i}.mlp.down_proj.weight" for i in range(2)}


@pytest.mark.parametrize("quant, fails_unkept", [("f16", True), ("q8_0", True), ("q4_k_m", False), ("iq4_nl", True)])
def test_the_talker_keeps_the_layer_f32_and_agrees(planted, tmp_path, quant, fails_unkept):
    """Kept: finite logits within the format's agreement. Written as before: f16 gives NaN, the 8-bit
    activations of q8_0 and iq4_nl leave theirs (q4_k_m's looser bound still holds)."""
    folder, ranges = planted["tiny_cv"]
    ckpt = Checkpoint.open(folder)
    rows = np.random.default_rng(0).standard_normal((6, ckpt.config.talker.hidden_size)).astype(np.float32)
    reference = decoder_stack(ckpt.weights, "talker.model", ckpt.config.talker, rows)[-1] @ \
        ckpt.weights["talker.codec_head.weight"].T

    def error(keep: frozenset[str]) -> float:
        path = tmp_path / f"{quant}-{len(keep)}.gguf"
        write_talker_gguf(ckpt, path, quant, keep=keep)
        assert (gguf_tensor_types(path)["blk.0.ffn_down.weight"] == "F32") == bool(keep)
        talker = Talker(path, TalkerSettings(n_ctx=64, max_streams=1, deterministic=True))
        try:
            logits, _ = talker.decode([DecodeItem(0, 0, rows)])
        finally:
            talker.close()
        return _rel_rms(logits[0], reference) if np.isfinite(logits).all() else float("inf")

    assert error(keep_f32(ranges, quant, "talker")) <= TALKER_REL_RMS[quant]
    assert (error(frozenset()) > TALKER_REL_RMS[quant]) == fails_unkept


@pytest.mark.parametrize("precision, fails_unkept", [("int8", True), ("int4", False)])
def test_the_code_predictor_keeps_the_matmul_fp32_and_agrees(planted, precision, fails_unkept):
    """Kept: that MatMul reads fp32 inputs, the logits agree as the self-check asks. As before: int8 leaves
    its agreement (int4's looser bound still holds)."""
    folder, ranges = planted["tiny_cv"]
    ckpt = Checkpoint.open(folder)
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((4, ckpt.config.talker.hidden_size)).astype(np.float32)
    code0 = rng.integers(0, 2048, 4)
    feeds = {"hidden": hidden, "code0": code0, "rand": np.zeros((4, 15), np.float32),
             **pack(SamplingParams(greedy=True), 4)}

    def error(keep: frozenset[str]) -> float:
        graph = quantize_code_predictor(build_code_predictor(ckpt), precision, keep=keep)
        fp32 = {n.input[1] for n in graph.graph.node if n.op_type == "MatMul"}
        assert (CP_DOWN in fp32) == bool(keep)
        session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        logits, codes = session.run(["logits", "codes"], feeds)
        reference = code_predictor_logits(ckpt.weights, ckpt.config, hidden, code0, codes, np.float32)
        return max(_rel_rms(logits[i], reference[i]) for i in range(4))

    assert error(keep_f32(ranges, precision, "code_predictor")) <= PREDICTOR_REL_RMS[precision]
    assert (error(frozenset()) > PREDICTOR_REL_RMS[precision]) == fails_unkept


@pytest.mark.parametrize("quant, cp_precision",
                         [("q8_0", "int8"), ("q4_k_m", "int4"), ("f32", "fp32"), ("f16", "int8")])
def test_a_planted_checkpoint_converts_and_the_manifest_lists_what_is_kept(planted, tmp_path, quant, cp_precision):
    """The whole conversion (its self-check holds each file to its agreement, the fp32 code predictor's greedy
    codes to the reference's) at the default, fast and exact presets' formats and an f16 talker; the manifest
    names the kept weights with their peaks (none at f32)."""
    folder, _ = planted["tiny_cv"]
    manifest = convert_checkpoint(folder, tmp_path / "model", quant, cp_precision=cp_precision, show_progress=False)
    kept = manifest.activations["kept_f32"]
    exact = quant == "f32"
    assert set(kept[TALKER_FILE]) == (set() if exact else {TALKER_DOWN})
    assert set(kept[PREDICTOR_FILE]) == (set() if exact else {CP_DOWN})
    assert manifest.activations["largest_peaks"]["code_predictor"][CP_DOWN] == pytest.approx(PEAK, rel=0.01)
    assert load_manifest(tmp_path / "model").activations == manifest.activations


def test_the_converter_as_it_was_fails_its_self_check_on_a_planted_checkpoint(planted, tmp_path, monkeypatch):
    """Nothing kept (the converter before activation ranges): the int8 code predictor and the q8_0 talker
    leave their agreement, and the self-check refuses the conversion."""
    folder, _ = planted["tiny_cv"]
    monkeypatch.setattr(pipeline, "keep_f32", lambda ranges, fmt, stage=None: frozenset())
    with pytest.raises(VerificationError):
        convert_checkpoint(folder, tmp_path / "model", "q8_0", cp_precision="int8", show_progress=False)


_PROBE = """
import json, sys
import numpy as np
from qwen3_tts_gguf.ggml.graph import Backend
from qwen3_tts_gguf.ggml.batched_predictor import GgmlCodePredictor
from qwen3_tts_gguf.model.sampler import SamplingParams
predictor = GgmlCodePredictor(sys.argv[1], Backend(threads=1))
inputs = np.load(sys.argv[2])
hidden, code0 = inputs["hidden"], inputs["code0"]
greedy, rand = SamplingParams(greedy=True), np.zeros((1, 15), np.float32)
bad_hidden = hidden[:1].copy()
bad_hidden[0, 3] = np.nan
refused = []
for name, call in (("nan hidden", lambda: predictor.predict(bad_hidden, [5], greedy, rand=rand)),
                   ("code0 -1", lambda: predictor.predict(hidden[:1], [-1], greedy, rand=rand)),
                   ("code0 2**20", lambda: predictor.predict(hidden[:1], [2**20], greedy, rand=rand))):
    try:
        call()
    except ValueError:
        refused.append(name)
codes = predictor.predict(hidden, code0, greedy, rand=np.zeros((len(hidden), 15), np.float32)).codes
print(json.dumps({"codes": codes.tolist(), "refused": refused}))
"""


def _probe(stages_file: Path, inputs: Path) -> dict | None:
    """What `_PROBE` reports on `stages_file` in a process of its own (a native abort ends only that one);
    None when that process did not end cleanly."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _PROBE, str(stages_file), str(inputs)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)
    return json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else None


def test_the_f16_llama_stages_file_keeps_the_layer_f32_and_never_aborts(planted, tmp_path):
    """The default preset's f16 code predictor in the ggml code predictor (which reads the llama stages file):
    greedy codes equal the float64 reference's up to a near tie; inputs ggml could not take are refused first.
    Written as before (the layer f16), the spike overflows f16 and the codes leave the reference (libmtmd,
    its runtime until 2026-12-06, aborted the process there: NaN, then an out-of-range gather)."""
    folder, ranges = planted["tiny_realcodec_cv"]
    ckpt = Checkpoint.open(folder)
    fmt = LlamaStagesFormat(PRESETS["default"].llama_stages.code_predictor, PRESETS["fast"].llama_stages.codec)
    assert fmt == LlamaStagesFormat("f16", "f16")
    keep = f32_weights(ranges, fmt)
    assert keep == {CP_DOWN}
    rng = np.random.default_rng(2)
    hidden = rng.standard_normal((4, ckpt.config.talker.hidden_size)).astype(np.float32)
    code0 = rng.integers(0, 2048, 4)
    np.savez(tmp_path / "inputs.npz", hidden=hidden, code0=code0)

    write_llama_stages(ckpt, tmp_path / LLAMA_STAGES_FILE, fmt, keep)
    report = _probe(tmp_path / LLAMA_STAGES_FILE, tmp_path / "inputs.npz")
    assert report is not None
    assert report["refused"] == ["nan hidden", "code0 -1", "code0 2**20"]
    spikes = ActivationRanges()
    differ, near = against_reference(ckpt, hidden, code0, np.array(report["codes"]), spikes.observe)
    assert differ == near, f"{differ - near} codes differ from the reference beyond a near tie"
    assert spikes.inputs[CP_DOWN].peak > F16_MAX  # these inputs do overflow f16

    write_llama_stages(ckpt, tmp_path / "unkept.gguf", fmt)
    unkept = _probe(tmp_path / "unkept.gguf", tmp_path / "inputs.npz")
    assert unkept is None or against_reference(ckpt, hidden, code0, np.array(unkept["codes"]))[0] > 0, \
        "the f16 layer should have overflowed"


def test_random_weights_keep_nothing_in_a_converted_folder(realcodec_cv_default):
    manifest = load_manifest(realcodec_cv_default)
    assert manifest.llama_stages["f32_weights"] == []
    assert all(not weights for weights in manifest.activations["kept_f32"].values())
    assert set(manifest.activations["kept_f32"]) == {TALKER_FILE, PREDICTOR_FILE, LLAMA_STAGES_FILE}
    assert manifest.llama_stages_missing is None
    # a file of f16 matrices written before activation ranges were measured is not used
    old = {key: value for key, value in manifest.llama_stages.items() if key != "f32_weights"}
    manifest.llama_stages = old
    assert "--only-llama-stages --force" in manifest.llama_stages_missing
    manifest.llama_stages = {**old, "code_predictor": "f32", "codec": "f32"}
    assert manifest.llama_stages_missing is None


def test_a_codec_whose_inputs_pass_f16_stays_off_the_gpu(checkpoint_factory, realcodec_cv_default):
    """The codec file is fp32 whatever the preset, but a GPU's matrix kernels may round its inputs to f16
    (ggml-vulkan's on a device with fp16). Planted: decoder.0's kernel scaled so the first block's transposed
    convolution takes inputs past f16. The measured `codec_peak` then keeps `auto` from the ggml codec when the
    talker is on a GPU, and `--codec-runtime ggml` there is refused; on the CPU backend (fp32) it stays."""
    ckpt = Checkpoint.open(checkpoint_factory("tiny_cv"))
    cfg = ckpt.config.codec
    weights = dict(ckpt.codec_weights)
    for leaf in ("weight", "bias"):
        weights[f"decoder.decoder.0.conv.{leaf}"] = np.asarray(weights[f"decoder.decoder.0.conv.{leaf}"]) * 1e5
    ranges = ActivationRanges()
    decode_codes(weights, cfg, np.random.default_rng(0).integers(0, cfg.codebook_size, (4, 16)), np.float32,
                 ranges.observe)
    assert ranges.inputs["decoder.decoder.1.block.1.conv.weight"].peak > F16_MAX
    manifest = load_manifest(realcodec_cv_default)
    assert 0 < manifest.activations["codec_peak"] < F16_LIMIT and manifest.codec_peak_past_f16 is None  # random
    assert resolve("auto", "auto", manifest, gpu_layers=-1, onnx_device="cpu").codec == "ggml"

    manifest.activations = {**manifest.activations, "codec_peak": ranges.report({})["codec_peak"]}
    assert manifest.codec_peak_past_f16 > F16_MAX
    runtimes = resolve("auto", "auto", manifest, gpu_layers=-1, onnx_device="cpu")
    assert runtimes.codec == "onnxruntime" and "f16" in runtimes.why
    with pytest.raises(CodecRuntimeError, match="f16"):
        resolve("auto", "ggml", manifest, gpu_layers=-1, onnx_device="cpu")
    assert resolve("auto", "ggml", manifest, gpu_layers=0, onnx_device="cpu").codec == "ggml"
    # a folder converted before the vocoder was measured has no `codec_peak`: nothing changes for it
    manifest.activations = {k: v for k, v in manifest.activations.items() if k != "codec_peak"}
    assert manifest.codec_peak_past_f16 is None


def test_the_talker_kv_cache_keeps_to_what_its_values_fit(checkpoint_factory, realcodec_cv_default, tmp_path):
    """What the talker's layers cache is measured too (keys normed and rotated, values): planted, a layer's
    v_proj scaled by s and its o_proj by 1/s (the layer's output unchanged, its cached values s times larger).
    Past f16's range the talker takes an f32 KV cache, whatever was asked (an f16 cache, or 8-bit blocks with
    f16 scales, would overflow); a value towering over its row keeps 8-bit blocks away (f16)."""
    ckpt = Checkpoint.open(checkpoint_factory("tiny_cv"))
    cfg = ckpt.config.talker
    weights = {n: np.asarray(w, np.float32) for n, w in ckpt.weights.items() if n.startswith("talker.model.")}
    rows = np.random.default_rng(0).standard_normal((1, 12, cfg.hidden_size)).astype(np.float32)
    plain, spiked = ActivationRanges(), ActivationRanges()
    before = decoder_stack(weights, "talker.model", cfg, rows, observe=plain.observe)
    for leaf, factor in (("v_proj", 1e6), ("o_proj", 1e-6)):
        name = f"talker.model.layers.0.self_attn.{leaf}.weight"
        weights[name] = weights[name] * np.float32(factor)
    after = decoder_stack(weights, "talker.model", cfg, rows, observe=spiked.observe)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)
    assert plain.report({})["talker_kv_cache"]["peak"] < F16_LIMIT / 100
    assert spiked.report({})["talker_kv_cache"]["peak"] > F16_MAX
    assert set(spiked.cached) == {f"talker.model.layers.{i}.self_attn.{kv}_cache" for i in range(cfg.num_layers)
                                  for kv in "kv"}
    assert not any(name.endswith("_cache") for name in spiked.inputs)  # never a weight to keep

    measured = load_manifest(realcodec_cv_default).activations
    assert 0 < measured["talker_kv_cache"]["peak"] < F16_LIMIT  # a converted folder records it
    for asked in ("f16", "q8_0", "q4_0"):
        assert kv_cache_for(asked, 128, measured) == asked
        assert kv_cache_for(asked, 128, {**measured, **spiked.report({})}) == "f32"
        towering = {**measured, "talker_kv_cache": {"peak": 100.0, "peak_to_median": 5000.0}}
        assert kv_cache_for(asked, 128, towering) == "f16"

    # the engine's talker reads it from the folder's manifest
    folder = tmp_path / "spiked-kv"
    folder.mkdir()
    for f in realcodec_cv_default.iterdir():
        (folder / f.name).symlink_to(f)
    manifest = load_manifest(realcodec_cv_default)
    manifest.activations = {**manifest.activations, **spiked.report({})}
    (folder / MANIFEST).unlink()
    (folder / MANIFEST).write_text(manifest.to_json())
    talker = Talker(folder / TALKER_FILE, TalkerSettings(max_streams=1, n_ctx=256, threads=1, kv_cache="f16",
                                                         activations=manifest.activations))
    try:
        assert talker.kv_cache == "f32"
    finally:
        talker.close()
