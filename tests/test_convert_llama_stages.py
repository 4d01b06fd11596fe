"""The llama stages file (convert/llama_stages.py): written beside the talker where libmtmd can load it,
listed in the manifest, said why not elsewhere, added to older folders (`--only-llama-stages`) atomically.

Its layout is checked here with `gguf` against the spec libmtmd loads; the ggml code predictor that reads
it is tests/test_ggml_predictor.py's. The real-codec fixtures (tiny talker, published codec decoder)
take about 20 s each to build and convert the first time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from qwen3_tts_gguf.convert import pipeline
from qwen3_tts_gguf.convert.checkpoint import Checkpoint, CheckpointError
from qwen3_tts_gguf.convert.llama_stages import unsupported_reason
from qwen3_tts_gguf.convert.pipeline import add_llama_stages
from qwen3_tts_gguf.convert.presets import PRESETS
from qwen3_tts_gguf.convert.random_checkpoint import make_random_checkpoint
from qwen3_tts_gguf.convert.verify import VerificationError, check_llama_stages
from qwen3_tts_gguf.model.manifest import (
    LLAMA_STAGES_FILE,
    MANIFEST,
    Manifest,
    ModelFolderError,
    load_manifest,
    sha256_file,
)
from qwen3_tts_gguf.model.safetensors_io import SafetensorsFile

from tests.conftest import ROOT, converted_model, official_checkpoint


def _cli(*args, check=True):
    return subprocess.run([sys.executable, "-m", "qwen3_tts_gguf", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, check=check)


def _reader(folder: Path) -> tuple[dict, dict]:
    """The llama stages file's metadata (name -> value) and tensors (name -> ReaderTensor)."""
    reader = gguf.GGUFReader(str(folder / LLAMA_STAGES_FILE))
    return ({k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")},
            {t.name: t for t in reader.tensors})


def _ne(tensor) -> list[int]:
    return [int(n) for n in tensor.shape]


def test_convert_writes_the_file_and_lists_it_with_its_hash(realcodec_cv_exact):
    manifest = load_manifest(realcodec_cv_exact, verify_hashes=True)
    entry = manifest.files[LLAMA_STAGES_FILE]
    path = realcodec_cv_exact / LLAMA_STAGES_FILE
    assert entry.bytes == path.stat().st_size and entry.sha256 == sha256_file(path)
    assert manifest.llama_stages == {"temperature": 0.9, "code_predictor": "f32", "codec": "f32",
                                     "speaker_encoder": "dummy", "f32_weights": []}
    assert manifest.llama_stages_missing is None
    assert manifest.source["self_check"]["llama_stages_tensors"] == 345


def test_the_file_has_the_layout_libmtmd_loads(realcodec_cv_exact):
    meta, tensors = _reader(realcodec_cv_exact)
    assert meta["general.architecture"] == "clip" and "clip.projector_type" not in meta
    assert {k: meta[k] for k in ("clip.has_vision_encoder", "clip.has_audio_encoder", "clip.has_gen_audio_encoder",
                                 "clip.audio.projector_type", "clip.gen.audio.projector_type")} == {
        "clip.has_vision_encoder": False, "clip.has_audio_encoder": True, "clip.has_gen_audio_encoder": True,
        "clip.audio.projector_type": "qwen3tts_spkenc", "clip.gen.audio.projector_type": "qwen3tts_gen"}
    # tiny talker: width 64; code predictor 32 wide, 2 layers, 4 heads (2 kv), ffn 96
    assert {k: meta[f"clip.{k}"] for k in (
        "audio.projection_dim", "audio.num_mel_bins", "audio.block_count", "audio.embedding_length",
        "audio.feed_forward_length", "audio.attention.head_count", "gen.audio.projection_dim",
        "gen.audio.embedding_length", "gen.audio.feed_forward_length", "gen.audio.block_count",
        "gen.audio.attention.head_count", "gen.audio.attention.head_count_kv")} == {
        "audio.projection_dim": 64, "audio.num_mel_bins": 128, "audio.block_count": 3,
        "audio.embedding_length": 1536, "audio.feed_forward_length": 1536, "audio.attention.head_count": 1,
        "gen.audio.projection_dim": 64, "gen.audio.embedding_length": 32, "gen.audio.feed_forward_length": 96,
        "gen.audio.block_count": 2, "gen.audio.attention.head_count": 4, "gen.audio.attention.head_count_kv": 2}
    assert meta["clip.gen.audio.attention.layer_norm_epsilon"] == pytest.approx(1e-6)
    assert meta["clip.audio.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    # ggml dimensions (ne) and types, as the spec lists them
    expected = {
        "a.conv1d.0.weight": ([5, 128, 8], "F32"), "a.blk.3.res2.6.weight": ([3, 1, 1], "F32"),
        "mm.a.fc.weight": ([1, 48, 64], "F32"),  # the dummy speaker encoder, 64 wide like the talker
        "a.gen.code.proj_in.weight": ([64, 32], "F32"), "a.gen.code.proj_in.bias": ([32], "F32"),
        "a.gen.code.embd.weight": ([64, 2048, 15], "F32"), "a.gen.code.head.weight": ([32, 2048, 15], "F32"),
        "a.gen.code.out_embd.weight": ([64, 3072], "F32"), "a.gen.code.blk.1.attn_k.weight": ([32, 32], "F32"),
        "a.gen.code.blk.1.attn_q_norm.weight": ([16], "F32"), "a.gen.code.output_norm.weight": ([32], "F32"),
        "a.gen.wav.quant.first.codebook.weight": ([256, 2048], "F32"),
        "a.gen.wav.quant.rest.codebook.weight": ([256, 2048, 15], "F32"),
        "a.gen.wav.quant.rest.in_proj.weight": ([512, 256], "F32"),
        "a.gen.wav.pre_conv.weight": ([3, 512, 1024], "F16"), "a.gen.wav.pre_conv.bias": ([1024], "F32"),
        "a.gen.wav.tfm.in_proj.weight": ([1024, 512], "F32"), "a.gen.wav.tfm.blk.7.attn_q.weight": ([512, 1024], "F32"),
        "a.gen.wav.tfm.blk.7.ls2.weight": ([512], "F32"), "a.gen.wav.tfm.output_norm.weight": ([512], "F32"),
        "a.gen.wav.up.blk.1.conv.weight": ([2, 1024, 1024], "F32"),
        "a.gen.wav.up.blk.1.dwconv.weight": ([7, 1, 1024], "F16"),
        "a.gen.wav.up.blk.1.pw1.weight": ([1024, 4096], "F32"),
        "a.gen.wav.up.blk.1.gamma": ([1024], "F32"), "a.gen.wav.dac.entry.weight": ([7, 1024, 1536], "F16"),
        "a.gen.wav.dac.blk.0.conv.weight": ([16, 768, 1536], "F32"),
        "a.gen.wav.dac.blk.3.conv.weight": ([6, 96, 192], "F32"), "a.gen.wav.dac.blk.3.snake.alpha": ([192], "F32"),
        "a.gen.wav.dac.blk.3.res.2.conv1.weight": ([7, 96, 96], "F16"),
        "a.gen.wav.dac.blk.3.res.2.conv2.weight": ([1, 96, 96], "F16"),
        "a.gen.wav.dac.blk.3.res.2.act2.beta": ([96], "F32"), "a.gen.wav.dac.post_snake.alpha": ([96], "F32"),
        "a.gen.wav.dac.post_conv.weight": ([7, 96, 1], "F16"),
    }
    assert {n: (_ne(tensors[n]), tensors[n].tensor_type.name) for n in expected} == expected
    assert len(tensors) == 345 and all(t.tensor_type.name in ("F32", "F16") for t in tensors.values())
    prefixes = {n.split(".")[0] + "." + n.split(".")[1] for n in tensors}
    assert prefixes == {"a.conv1d", "a.blk", "a.conv_out", "a.asp_attn", "a.asp_tdnn", "mm.a", "a.gen"}


def test_values_are_folded_as_the_graph_expects(realcodec_cv_exact):
    """Snake parameters as exp(alpha), 1 / (exp(beta) + 1e-9); codebooks divided by their usage; the heads
    divided by the checkpoint's code-predictor temperature (libmtmd samples at temperature 1)."""
    ckpt = Checkpoint.open(official_checkpoint("tiny_realcodec_cv"))
    _, tensors = _reader(realcodec_cv_exact)
    w, cw = ckpt.weights, ckpt.codec_weights
    alpha, beta = cw["decoder.decoder.2.block.3.act1.alpha"], cw["decoder.decoder.2.block.3.act1.beta"]
    np.testing.assert_array_equal(tensors["a.gen.wav.dac.blk.1.res.1.act1.alpha"].data, np.exp(alpha))
    np.testing.assert_array_equal(tensors["a.gen.wav.dac.blk.1.res.1.act1.beta"].data, 1.0 / (np.exp(beta) + 1e-9))
    book = "decoder.quantizer.rvq_rest.vq.layers.4._codebook."
    np.testing.assert_array_equal(tensors["a.gen.wav.quant.rest.codebook.weight"].data[4],
                                  cw[book + "embedding_sum"] / np.maximum(cw[book + "cluster_usage"], 1e-5)[:, None])
    np.testing.assert_array_equal(tensors["a.gen.code.head.weight"].data[14],
                                  w["talker.code_predictor.lm_head.14.weight"] / np.float32(0.9))
    np.testing.assert_array_equal(tensors["a.gen.code.embd.weight"].data[3],
                                  w["talker.code_predictor.model.codec_embedding.3.weight"])


def test_the_default_preset_halves_the_code_predictor_and_a_base_model_brings_its_speaker_encoder(
        realcodec_base_default):
    manifest = load_manifest(realcodec_base_default)
    assert manifest.llama_stages == {"temperature": 0.9, "code_predictor": "f16", "codec": "f32",
                                     "speaker_encoder": "real", "f32_weights": []}
    _, tensors = _reader(realcodec_base_default)
    types = {n: t.tensor_type.name for n, t in tensors.items()}
    assert types["a.gen.code.blk.0.ffn_up.weight"] == types["a.gen.code.out_embd.weight"] == "F16"
    assert types["a.gen.code.blk.0.ln1.weight"] == types["a.gen.wav.tfm.blk.0.ffn_up.weight"] == "F32"
    assert types["a.gen.wav.dac.entry.weight"] == "F16" and types["a.gen.wav.up.blk.0.conv.weight"] == "F32"
    speaker = Checkpoint.open(official_checkpoint("tiny_realcodec_base")).weights
    np.testing.assert_array_equal(tensors["mm.a.fc.weight"].data.reshape(64, 192, 1),
                                  speaker["speaker_encoder.fc.weight"])
    np.testing.assert_array_equal(tensors["a.blk.2.res2.3.weight"].data,
                                  speaker["speaker_encoder.blocks.2.res2net_block.blocks.3.conv.weight"])
    assert len(tensors) == 345


def test_a_codec_of_another_shape_gets_no_file_and_the_manifest_says_why(tiny_cv, tmp_path):
    r = _cli("convert", tiny_cv, "-o", tmp_path / "m", "--preset", "exact", "--no-verify")
    said = [line for line in r.stdout.splitlines() if LLAMA_STAGES_FILE in line]
    assert len(said) == 1 and "codec decoder is not the published shape llama.cpp hard-codes" in said[0]
    assert "num_layers 2 (llama.cpp hard-codes 8)" in said[0]
    manifest = load_manifest(tmp_path / "m")
    assert LLAMA_STAGES_FILE not in manifest.files and not (tmp_path / "m" / LLAMA_STAGES_FILE).exists()
    assert set(manifest.llama_stages) == {"missing"}
    reason = manifest.llama_stages["missing"]
    assert manifest.llama_stages_missing == reason and reason in said[0]


def test_a_folder_converted_before_the_file_says_how_to_add_it(realcodec_cv_exact):
    raw = json.loads((realcodec_cv_exact / MANIFEST).read_text())
    del raw["llama_stages"], raw["files"][LLAMA_STAGES_FILE]
    older = Manifest.from_dict(raw)
    assert older.llama_stages is None
    assert "--only-llama-stages" in older.llama_stages_missing and "converted before" in older.llama_stages_missing


def test_make_random_builds_the_real_codec_shape_quickly(checkpoint_factory, tmp_path):
    """`make-random --shape tiny-realcodec`: the official layout, and a llama stages file would be written."""
    mine = make_random_checkpoint(tmp_path / "base", "tiny-realcodec", "base", seed=1)
    assert unsupported_reason(Checkpoint.open(mine).config) is None
    official = checkpoint_factory("tiny_realcodec_base")
    for rel in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        a, b = SafetensorsFile(mine / rel), SafetensorsFile(official / rel)
        assert {k: a.shape_of(k) for k in a} == {k: b.shape_of(k) for k in b}, rel


# -- --only-llama-stages ---------------------------------------------------------------------------


def _older_copy(folder: Path, dst: Path) -> Path:
    """`folder` as a model folder converted before the llama stages file: the file and its manifest
    entry removed. Files are hard links into the cache (the code under test only renames over them;
    their hashes are checked after) and the manifest a copy."""
    def link(src: str, to: str) -> None:
        try:
            os.link(src, to)
        except OSError:
            shutil.copy2(src, to)

    shutil.copytree(folder, dst, copy_function=link, ignore=shutil.ignore_patterns(LLAMA_STAGES_FILE, MANIFEST))
    raw = json.loads((folder / MANIFEST).read_text())
    del raw["llama_stages"], raw["files"][LLAMA_STAGES_FILE]
    raw["source"]["self_check"].pop("llama_stages_tensors")
    (dst / MANIFEST).write_text(json.dumps(raw, indent=2))
    return dst


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir())}


def test_only_llama_stages_adds_the_file_and_leaves_the_rest_untouched(realcodec_cv_default, tmp_path):
    older = _older_copy(realcodec_cv_default, tmp_path / "older")
    before, manifest_before = _hashes(older), json.loads((older / MANIFEST).read_text())
    r = _cli("convert", official_checkpoint("tiny_realcodec_cv"), "-o", older, "--only-llama-stages")
    assert f"added {LLAMA_STAGES_FILE} to {older} (code predictor f16, codec f32)" in r.stdout
    after = _hashes(older)
    assert set(after) == set(before) | {LLAMA_STAGES_FILE}
    assert {n: after[n] for n in before if n != MANIFEST} == {n: h for n, h in before.items() if n != MANIFEST}
    # the formats the folder was converted with (default preset): the same bytes a new conversion writes
    assert after[LLAMA_STAGES_FILE] == sha256_file(realcodec_cv_default / LLAMA_STAGES_FILE)
    manifest = load_manifest(older, verify_hashes=True)
    assert manifest.llama_stages == load_manifest(realcodec_cv_default).llama_stages
    raw = json.loads((older / MANIFEST).read_text())
    assert raw["files"][LLAMA_STAGES_FILE]["sha256"] == after[LLAMA_STAGES_FILE]
    assert raw["source"]["self_check"]["llama_stages_tensors"] == 345
    for key in ("llama_stages", "files", "source"):
        raw.pop(key), manifest_before.pop(key, None)
    assert raw == manifest_before
    again = _cli("convert", official_checkpoint("tiny_realcodec_cv"), "-o", older, "--only-llama-stages", check=False)
    assert again.returncode == 2 and f"has {LLAMA_STAGES_FILE} already (pass --force" in again.stderr
    forced = _cli("convert", official_checkpoint("tiny_realcodec_cv"), "-o", older, "--only-llama-stages",
                  "--force", "--preset", "exact")
    assert "(code predictor f32, codec f32)" in forced.stdout
    assert load_manifest(older, verify_hashes=True).llama_stages["code_predictor"] == "f32"
    assert {n: h for n, h in _hashes(older).items() if n not in (MANIFEST, LLAMA_STAGES_FILE)} == \
        {n: h for n, h in before.items() if n != MANIFEST}


def test_an_interrupted_addition_leaves_the_folder_as_it_was(realcodec_cv_default, tmp_path, monkeypatch):
    older = _older_copy(realcodec_cv_default, tmp_path / "older")
    before = _hashes(older)
    ckpt = official_checkpoint("tiny_realcodec_cv")
    real_write, written = gguf.GGUFWriter.write_tensor_data, []

    def dies_midway(self, tensor, *args, **kwargs):
        written.append(1)
        if len(written) == 100:
            raise KeyboardInterrupt
        return real_write(self, tensor, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(gguf.GGUFWriter, "write_tensor_data", dies_midway)
        with pytest.raises(KeyboardInterrupt):
            add_llama_stages(ckpt, older, show_progress=False)
    assert _hashes(older) == before  # no partial file left, the manifest as it was

    def no_manifest(*args):
        raise OSError("disk full")

    with monkeypatch.context() as m:  # the file renamed in, the manifest not yet rewritten
        m.setattr(pipeline, "_replace_manifest", no_manifest)
        with pytest.raises(OSError, match="disk full"):
            add_llama_stages(ckpt, older, show_progress=False)
    assert {n: h for n, h in _hashes(older).items() if n != LLAMA_STAGES_FILE} == before
    assert "converted before" in load_manifest(older, verify_hashes=True).llama_stages_missing
    (older / f".{LLAMA_STAGES_FILE}.partial-{os.getpid()}").write_bytes(b"left by a killed run")
    add_llama_stages(ckpt, older, show_progress=False)  # a second run completes it and tidies up
    assert load_manifest(older, verify_hashes=True).llama_stages_missing is None
    assert sorted(p.name for p in older.iterdir()) == sorted([*before, LLAMA_STAGES_FILE])


def test_only_llama_stages_refuses_another_checkpoint_and_a_codec_it_cannot_serve(realcodec_cv_default, tiny_cv,
                                                                                  tmp_path):
    older = _older_copy(realcodec_cv_default, tmp_path / "older")
    with pytest.raises(CheckpointError, match="is not the checkpoint .* was converted from \\(its model_type"):
        add_llama_stages(official_checkpoint("tiny_realcodec_base"), older, show_progress=False)
    tiny = converted_model("tiny_cv")
    r = _cli("convert", tiny_cv, "-o", tiny, "--only-llama-stages", check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"gets no {LLAMA_STAGES_FILE}: the codec decoder is not the published shape" in r.stderr
    r = _cli("convert", tiny_cv, "-o", tmp_path / "nothing", "--only-llama-stages", check=False)
    assert r.returncode == 2 and "no manifest.json" in r.stderr
    assert sorted(p.name for p in older.iterdir()) == sorted(p.name for p in realcodec_cv_default.iterdir()
                                                             if p.name != LLAMA_STAGES_FILE)


def test_a_damaged_llama_stages_file_is_refused(realcodec_cv_default, tmp_path):
    """Like every listed file: truncated (size) or altered (hash, and the self-check's values)."""
    folder = _older_copy(realcodec_cv_default, tmp_path / "m")
    shutil.copy(realcodec_cv_default / MANIFEST, folder / MANIFEST)
    damaged = folder / LLAMA_STAGES_FILE
    shutil.copy(realcodec_cv_default / LLAMA_STAGES_FILE, damaged)  # a copy of its own: it is written to
    size = damaged.stat().st_size
    with open(damaged, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(ModelFolderError, match=f"{LLAMA_STAGES_FILE} has {size - 1000} bytes"):
        load_manifest(folder)
    shutil.copy(realcodec_cv_default / LLAMA_STAGES_FILE, damaged)
    reader = gguf.GGUFReader(str(damaged))
    (embd,) = [t for t in reader.tensors if t.name == "a.gen.code.out_embd.weight"]
    offset = int(embd.data_offset) + 100
    del reader, embd
    with open(damaged, "r+b") as f:
        f.seek(offset)
        f.write(b"\x7f\x7f")
    with pytest.raises(ModelFolderError, match=f"{LLAMA_STAGES_FILE} is corrupt"):
        load_manifest(folder, verify_hashes=True)
    with pytest.raises(VerificationError, match="a.gen.code.out_embd.weight differs from the source weights"):
        check_llama_stages(Checkpoint.open(official_checkpoint("tiny_realcodec_cv")), damaged,
                           PRESETS["default"].llama_stages)
