"""The converter's contract: refusals, atomic output, manifest, make-random, the command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qwen3_tts_gguf.convert import pipeline
from qwen3_tts_gguf.convert.checkpoint import Checkpoint, CheckpointError
from qwen3_tts_gguf.convert.pipeline import convert_checkpoint
from qwen3_tts_gguf.convert.random_checkpoint import make_random_checkpoint
from qwen3_tts_gguf.model.loaded import LoadedModel
from qwen3_tts_gguf.model.manifest import ModelFolderError, load_manifest
from qwen3_tts_gguf.model.safetensors_io import SafetensorsFile, write_safetensors
from qwen3_tts_gguf.model.settings import EngineSettings

from tests.conftest import ROOT


def _cli(*args, check=True, **kw):
    return subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, check=check, **kw)


@pytest.fixture
def ckpt_copy(tiny_cv, tmp_path):
    """A writable copy of the tiny checkpoint (to break it in various ways)."""
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_cv, dst)
    return dst


def test_manifest_describes_the_model(tiny_cv, tmp_path):
    m = convert_checkpoint(tiny_cv, tmp_path / "m", "f32", show_progress=False)
    on_disk = load_manifest(tmp_path / "m", verify_hashes=True)
    assert on_disk.model_type == m.model_type == "custom_voice" and on_disk.model_size == "1.7b"
    assert on_disk.speakers["eric"] == {"id": 2875, "dialect": "sichuan_dialect"}
    assert on_disk.languages["english"] == 2050 and on_disk.languages["beijing_dialect"] == 2074
    assert on_disk.default_text_mode == "non-streaming" and on_disk.instruct_supported
    assert on_disk.sampling["repetition_penalty"] == 1.05 and on_disk.sampling["subtalker_top_k"] == 50
    assert on_disk.codec_ids["eos"] == 2150 and on_disk.text_ids["tts_pad"] == 151671
    assert on_disk.tokenizer["pretokenizer"] == "mistral-fixed"
    assert {"talker.gguf", "code_predictor.onnx", "code_predictor.onnx.data", "codec_decoder.onnx",
            "text_tables.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json"} <= set(on_disk.files)
    checks = on_disk.source["self_check"]
    assert checks["talker_logits_rel_rms"] < 1e-4 and checks["codec_max_abs"] < 2e-4
    assert on_disk.code_predictor["precision"] == "int8"  # both graphs checked against the source weights
    assert checks["predictor_logits_rel_rms"] < 0.08 and checks["predictor_cpu_logits_rel_rms"] < 0.08


def test_the_cpu_code_predictor_graph_reads_the_portable_graphs_weights(tiny_cv_f32, tmp_path):
    """code_predictor_cpu.onnx (opset 23 Attention) holds no weights of its own: every initializer the
    portable graph keeps in code_predictor.onnx.data is read from there; both give the same frame."""
    import onnx

    from qwen3_tts_gguf.model.manifest import PREDICTOR_CPU_FILE, PREDICTOR_FILE
    from qwen3_tts_gguf.model.predictor import CodePredictor
    from qwen3_tts_gguf.model.sampler import SamplingParams

    def external(path):
        return {t.name: {e.key: e.value for e in t.external_data}
                for t in onnx.load(str(path), load_external_data=False).graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL}

    portable, cpu = external(tiny_cv_f32 / PREDICTOR_FILE), external(tiny_cv_f32 / PREDICTOR_CPU_FILE)
    weights = {n for n in portable if n.endswith(".weight")}
    assert weights and weights <= set(cpu) and all(cpu[n] == portable[n] for n in weights)
    assert ((tiny_cv_f32 / PREDICTOR_CPU_FILE).stat().st_size
            < (tiny_cv_f32 / f"{PREDICTOR_FILE}.data").stat().st_size / 20)
    assert not list(tiny_cv_f32.glob(f"{PREDICTOR_CPU_FILE}.*"))
    rng = np.random.default_rng(5)
    graphs = [CodePredictor(tiny_cv_f32 / f, threads=1) for f in (PREDICTOR_FILE, PREDICTOR_CPU_FILE)]
    hidden = rng.standard_normal((3, graphs[0].hidden_size)).astype(np.float32)
    a, b = (g.predict(hidden, np.array([1, 7, 300]), SamplingParams(), rand=np.full((3, 15), 0.5, np.float32))
            for g in graphs)
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_allclose(a.frame_embedding, b.frame_embedding, atol=1e-5)


def test_a_graph_shares_only_equal_weights_and_only_beside_them(tmp_path):
    """save_model_sharing_weights: an initializer of the same name and bytes is read from the other graph's
    data file; one of the same name but other bytes, or a new one, stays inside the graph."""
    import onnx
    import onnxruntime as ort

    from qwen3_tts_gguf.convert.onnx_builder import GraphBuilder, save_model, save_model_sharing_weights

    rng = np.random.default_rng(0)
    w, other = rng.standard_normal((2, 64, 64)).astype(np.float32)

    def graph(second: np.ndarray) -> onnx.ModelProto:
        b = GraphBuilder("g")
        x = b.input("x", "float", [1, 64])
        b.output(b.op("MatMul", b.op("MatMul", x, b.weight("w", w)), b.weight("v", second)), "y", "float", [1, 64])
        return b.model()

    save_model(graph(w), tmp_path / "a.onnx", external=True)
    save_model_sharing_weights(graph(other), tmp_path / "b.onnx", tmp_path / "a.onnx")
    kept = {t.name: t.data_location
            for t in onnx.load(str(tmp_path / "b.onnx"), load_external_data=False).graph.initializer}
    assert kept == {"w": onnx.TensorProto.EXTERNAL, "v": onnx.TensorProto.DEFAULT}
    x = rng.standard_normal((1, 64)).astype(np.float32)
    y = ort.InferenceSession(str(tmp_path / "b.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ w @ other, rtol=1e-4, atol=1e-4)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ValueError, match="beside"):
        save_model_sharing_weights(graph(w), tmp_path / "elsewhere" / "c.onnx", tmp_path / "a.onnx")


def test_the_engine_runs_the_cpu_graph_on_the_cpu_only(tiny_cv_f32, tmp_path, monkeypatch):
    """The CPU's fused-attention graph where the folder has one and the device is the CPU; a folder converted
    before it, or another device, runs the portable graph."""
    from qwen3_tts_gguf.model import loaded as model_module
    from qwen3_tts_gguf.model.manifest import MANIFEST, PREDICTOR_CPU_FILE, PREDICTOR_FILE, Manifest, file_entries

    model = LoadedModel(tiny_cv_f32, EngineSettings(threads=1))
    try:
        assert model.predictor_file == PREDICTOR_CPU_FILE
        monkeypatch.setattr(model_module, "resolve_device", lambda device: type("Dev", (), {"name": "cuda"})())
        assert model.predictor_file == PREDICTOR_FILE
    finally:
        model.close()
    monkeypatch.undo()
    older = tmp_path / "older"
    shutil.copytree(tiny_cv_f32, older, ignore=shutil.ignore_patterns(PREDICTOR_CPU_FILE))
    manifest = Manifest.from_dict(json.loads((older / MANIFEST).read_text()))
    manifest.files = file_entries(older)
    (older / MANIFEST).write_text(manifest.to_json())
    model = LoadedModel(older, EngineSettings(threads=1))
    try:
        assert model.predictor_file == PREDICTOR_FILE
    finally:
        model.close()


def test_defaults_per_model_type(checkpoint_factory, tmp_path):
    vd = convert_checkpoint(checkpoint_factory("tiny_vd"), tmp_path / "vd", "f32", show_progress=False, verify=False)
    assert vd.speakers == {} and vd.instruct_supported and vd.default_text_mode == "non-streaming"
    assert "sichuan_dialect" not in vd.languages
    small = convert_checkpoint(checkpoint_factory("tiny0b6_cv_bf16"), tmp_path / "s", "q8_0", show_progress=False)
    assert small.model_size == "0.6b" and not small.instruct_supported  # the wrapper drops it on 0.6B
    assert small.source["self_check"]["talker_logits_rel_rms"] < 0.06
    base = convert_checkpoint(checkpoint_factory("tiny_base"), tmp_path / "b", "f32", show_progress=False, verify=False)
    assert base.default_text_mode == "streaming" and not base.instruct_supported


def test_refuses_missing_files(ckpt_copy, tmp_path):
    (ckpt_copy / "speech_tokenizer" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing speech_tokenizer/model.safetensors"):
        convert_checkpoint(ckpt_copy, tmp_path / "out", "f32", show_progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field,value,message", [
    ("tokenizer_type", "qwen3_tts_tokenizer_25hz", "only the 12 Hz models"),
    ("tts_model_type", "voice_morph", "unknown tts_model_type 'voice_morph'"),
])
def test_refuses_25hz_and_unknown_types(ckpt_copy, tmp_path, field, value, message):
    config = json.loads((ckpt_copy / "config.json").read_text())
    config[field] = value
    (ckpt_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        convert_checkpoint(ckpt_copy, tmp_path / "out", "f32", show_progress=False)


def test_refuses_a_tensor_that_does_not_match_its_config(ckpt_copy, tmp_path):
    config = json.loads((ckpt_copy / "config.json").read_text())
    config["talker_config"]["intermediate_size"] += 1
    (ckpt_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"mlp.gate_proj.weight has shape \[128, 64\] but config.json implies "
                                              r"\[129, 64\]"):
        Checkpoint.open(ckpt_copy)


def test_refuses_a_dropped_tensor(ckpt_copy):
    f = SafetensorsFile(ckpt_copy / "model.safetensors")
    # copies: the file is rewritten
    tensors = {k: np.array(f[k]) for k in f if k != "talker.text_projection.linear_fc1.bias"}
    del f
    write_safetensors(ckpt_copy / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match="no tensor talker.text_projection.linear_fc1.bias"):
        Checkpoint.open(ckpt_copy)


def test_refuses_a_truncated_safetensors(ckpt_copy):
    path = ckpt_copy / "speech_tokenizer" / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        Checkpoint.open(ckpt_copy)


def test_interrupted_conversion_leaves_no_output(tiny_cv, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "write_text_tables", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(tiny_cv, tmp_path / "out", "f32", show_progress=False)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_not_overwritten_without_force(tiny_cv, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        convert_checkpoint(tiny_cv, tmp_path / "out", "f32", show_progress=False)


def _fail_on(monkeypatch, owner, attr: str, when, exc: BaseException) -> None:
    """Make owner.attr raise `exc` for the calls where when(*args) holds (others run as usual)."""
    real = getattr(owner, attr)

    def failing(*args, **kwargs):
        if when(*args):
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, failing)


def test_force_keeps_the_old_model_when_the_final_rename_fails(tiny_cv, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert_checkpoint(tiny_cv, out, "f32", name="old", show_progress=False, verify=False)
    _fail_on(monkeypatch, Path, "rename", lambda src, dst: ".partial-" in src.name, OSError("disk said no"))
    with pytest.raises(OSError, match="disk said no"):
        convert_checkpoint(tiny_cv, out, "f32", name="new", overwrite=True, show_progress=False, verify=False)
    assert load_manifest(out, verify_hashes=True).name == "old" and list(tmp_path.iterdir()) == [out]


def test_force_interrupted_before_the_old_model_is_deleted(tiny_cv, tmp_path, monkeypatch):
    """The new model is in place; the old one waits aside and the next conversion deletes it."""
    out = tmp_path / "out"
    convert_checkpoint(tiny_cv, out, "f32", name="old", show_progress=False, verify=False)
    with monkeypatch.context() as m:
        _fail_on(m, shutil, "rmtree", lambda path, *a: ".previous-" in Path(path).name, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            convert_checkpoint(tiny_cv, out, "f32", name="new", overwrite=True, show_progress=False, verify=False)
    (aside,) = tmp_path.glob(".out.previous-*")
    assert load_manifest(out, verify_hashes=True).name == "new" and load_manifest(aside).name == "old"
    convert_checkpoint(tiny_cv, out, "f32", name="newer", overwrite=True, show_progress=False, verify=False)
    assert load_manifest(out).name == "newer" and list(tmp_path.iterdir()) == [out]


def test_a_crash_between_the_two_renames_is_recovered_by_the_next_run(tiny_cv, tmp_path):
    """Killed after moving the old model aside: the next run puts it back and drops the half-done one."""
    out = tmp_path / "out"
    convert_checkpoint(tiny_cv, out, "f32", name="old", show_progress=False, verify=False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out.rename(tmp_path / f".out.previous-{dead.pid}")
    (tmp_path / f".out.partial-{dead.pid}").mkdir()
    (tmp_path / f".out.partial-{os.getpid()}").mkdir()  # this process's own leftover: stale too
    assert load_manifest(tmp_path / f".out.previous-{dead.pid}").name == "old"  # loadable where it waits
    with pytest.raises(FileExistsError):  # restored, so not replaced without --force
        convert_checkpoint(tiny_cv, out, "f32", name="new", show_progress=False, verify=False)
    assert load_manifest(out, verify_hashes=True).name == "old" and list(tmp_path.iterdir()) == [out]


def test_damaged_model_folders_are_refused_clearly(tiny_cv_f32, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_cv_f32, broken)
    (broken / "codec_decoder.onnx").unlink()
    with pytest.raises(ModelFolderError, match="codec_decoder.onnx is missing"):
        LoadedModel(broken, EngineSettings())
    shutil.copy(tiny_cv_f32 / "codec_decoder.onnx", broken / "codec_decoder.onnx")
    with open(broken / "talker.gguf", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelFolderError, match="talker.gguf has 1000 bytes"):
        LoadedModel(broken, EngineSettings())
    shutil.copy(tiny_cv_f32 / "talker.gguf", broken / "talker.gguf")
    with open(broken / "talker.gguf", "r+b") as f:  # the right size, not a GGUF file
        f.write(b"XXXX")
    with pytest.raises(ModelFolderError, match="llama.cpp could not load the talker"):
        LoadedModel(broken, EngineSettings())
    with pytest.raises(ModelFolderError, match="no manifest.json"):
        LoadedModel(tmp_path, EngineSettings())


def test_a_talker_context_llama_cpp_refuses_is_an_error_not_a_crash(tiny_cv_f32):
    """More sequences than llama.cpp holds (256): a clear error, and the model it had loaded freed once
    (it was freed twice, a segfault at exit, when `serve --max-streams` had no bound)."""
    script = ("import gc, sys\n"
              "from qwen3_tts_gguf.model.talker import Talker, TalkerError, TalkerSettings\n"
              "try:\n"
              f"    Talker({str(tiny_cv_f32 / 'talker.gguf')!r}, TalkerSettings(n_ctx=4096, max_streams=300))\n"
              "except TalkerError as e:\n"
              "    print(e)\n"
              "gc.collect()\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "could not create a context for the talker (4096 KV cells, 300 sequences)" in done.stdout


def test_make_random_then_convert_then_synth_offline(tmp_path):
    """The offline try-out of the README: numpy-only checkpoint, conversion, speech."""
    ckpt = _cli("make-random", tmp_path / "rnd", "--shape", "tiny", "--type", "custom_voice")
    assert "wrote a random tiny custom_voice checkpoint" in ckpt.stdout
    convert = _cli("convert", tmp_path / "rnd", "-o", tmp_path / "model", "--quant", "q8_0")
    assert "converted" in convert.stdout
    synth = _cli("synth", "Hello from a random model.", "--model", tmp_path / "model", "--max-frames", "6",
                 "--ignore-eos", "--seed", "3", "-o", tmp_path / "out.flac")
    assert "6 frames" in synth.stderr
    import soundfile as sf

    audio, rate = sf.read(tmp_path / "out.flac")
    assert rate == 24000 and len(audio) == 6 * 1920


def test_make_random_real_shape_layout_matches_the_official_names(tmp_path):
    """make-random's tensor names and shapes are the official ones (checked against the config)."""
    out = make_random_checkpoint(tmp_path / "vd", "tiny", "voice_design", seed=1)
    ckpt = Checkpoint.open(out)
    assert ckpt.weights.dtype_of("talker.codec_head.weight") == "BF16"
    assert ckpt.codec_weights.dtype_of("decoder.pre_conv.conv.weight") == "F32"


def test_make_random_base_converts_and_clones_a_voice(tmp_path):
    """A numpy-only Base checkpoint has the voice encoders: convert (self-check on), then clone a voice."""
    from qwen3_tts_gguf.voicebank.clone import VoiceCloner

    ckpt = _cli("make-random", tmp_path / "rnd", "--shape", "tiny", "--type", "base")
    assert "wrote a random tiny base checkpoint" in ckpt.stdout
    codec = Checkpoint.open(tmp_path / "rnd").codec_weights
    assert codec.dtype_of("encoder.encoder.layers.0.conv.weight") == "F32"
    convert = _cli("convert", tmp_path / "rnd", "-o", tmp_path / "model", "--quant", "f32")
    assert "converted" in convert.stdout
    manifest = load_manifest(tmp_path / "model", verify_hashes=True)
    assert manifest.model_type == "base" and manifest.source["self_check"]["talker_logits_rel_rms"] < 1e-4

    cloner = VoiceCloner(tmp_path / "model", threads=1)
    t = np.arange(int(1.5 * 24000)) / 24000  # a 1.5 s gliding, tremolo tone with a little noise
    wav = 0.3 * np.sin(2 * np.pi * (150 + 40 * np.sin(2 * np.pi * 3 * t)) * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    wav = (wav + 0.02 * np.random.default_rng(0).standard_normal(t.size)).astype(np.float32)
    xvec, codes = cloner.extract((wav, 24000), trailing_silence=0.5)
    assert xvec.shape == (64,) and xvec.dtype == np.float32 and np.isfinite(xvec).all() and np.abs(xvec).max() > 0
    assert codes.shape == (-(-(wav.size + 12000) // 1920), 16) and codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() < 2048
    assert all(len(set(codes[:-6, k])) > 1 for k in range(16))  # the clip's frames are not all one code
    profile = cloner.create_profile("randvoice", (wav, 24000), ref_text="Hello there.")
    assert profile.mode == "icl" and np.array_equal(profile.ref_codes, codes)


def test_make_random_base_layout_is_the_official_one(checkpoint_factory, tmp_path):
    """Every tensor name and shape of make-random's Base checkpoint (speaker and codec encoders
    included) is what the official qwen-tts classes save for the same config."""
    official = checkpoint_factory("tiny_base")
    mine = make_random_checkpoint(tmp_path / "base", "tiny", "base", seed=1)
    for rel in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        a, b = SafetensorsFile(mine / rel), SafetensorsFile(official / rel)
        assert {k: a.shape_of(k) for k in a} == {k: b.shape_of(k) for k in b}, rel


def test_cli_errors_are_one_line_with_exit_code(tmp_path):
    r = _cli("convert", tmp_path / "nothing", "-o", tmp_path / "out", check=False)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    r = _cli("synth", "hi", "--model", tmp_path, check=False)
    assert r.returncode == 2 and "no manifest.json" in r.stderr and "Traceback" not in r.stderr


def test_pull_from_a_downloaded_folder(tiny_cv, tmp_path):
    r = _cli("pull", "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "--from-dir", tiny_cv, "--quant", "f32",
             "--output", tmp_path)
    target = tmp_path / "Qwen3-TTS-12Hz-0.6B-CustomVoice-f32"
    assert f"ready: {target}" in r.stdout
    assert load_manifest(target).quant == "f32"


def test_a_preset_chooses_both_formats_and_a_flag_overrides_half(tiny_cv, tmp_path):
    from qwen3_tts_gguf.cli import _weight_formats, build_parser

    def formats(*argv):
        return _weight_formats(build_parser().parse_args(["convert", "ckpt", "-o", "out", *argv]))

    assert formats() == ("q8_0", "int8")
    assert formats("--preset", "fast") == ("q4_k_m", "int4")
    assert formats("--preset", "exact") == ("f32", "fp32")
    assert formats("--preset", "fast", "--cp-precision", "int8") == ("q4_k_m", "int8")
    assert formats("--quant", "q5_k_m") == ("q5_k_m", "int8")
    r = _cli("pull", "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "--from-dir", tiny_cv, "--preset", "fast",
             "--output", tmp_path)
    target = tmp_path / "Qwen3-TTS-12Hz-0.6B-CustomVoice-q4_k_m-cpint4"
    assert f"ready: {target}" in r.stdout
    assert load_manifest(target).quant == "q4_k_m"
    assert load_manifest(target).code_predictor["block_size"] == 128
    assert "MatMulNBits" in {n.op_type for n in __import__("onnx").load(target / "code_predictor.onnx").graph.node}


def test_the_code_predictor_block_size_is_a_choice_of_convert_and_pull(tiny_cv, tmp_path):
    import onnx

    r = _cli("pull", "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "--from-dir", tiny_cv, "--quant", "f32",
             "--cp-block-size", "32", "--output", tmp_path)
    target = tmp_path / "Qwen3-TTS-12Hz-0.6B-CustomVoice-f32-cpblock32"  # int8 at a block size not the default
    assert f"ready: {target}" in r.stdout
    predictor = load_manifest(target).code_predictor
    assert (predictor["precision"], predictor["block_size"]) == ("int8", 32)
    graph = onnx.load(target / "code_predictor.onnx").graph
    assert {a.i for n in graph.node if n.op_type == "MatMulNBits"
            for a in n.attribute if a.name == "block_size"} == {32}
    bad = _cli("convert", tiny_cv, "-o", tmp_path / "bad", "--cp-block-size", "48", check=False)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and not (tmp_path / "bad").exists()


def test_an_output_it_cannot_write_is_a_one_line_error(tiny_cv, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for argv in (["make-random", blocker / "ckpt"], ["convert", tiny_cv, "-o", blocker / "model", "--quant", "f32"]):
        r = _cli(*argv, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines()[-1].startswith("error: Not a directory: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
