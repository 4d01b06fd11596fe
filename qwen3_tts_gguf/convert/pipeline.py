"""Checkpoint folder -> converted model folder, atomically, with a self-check before success.

Everything is written into a hidden temporary folder beside the target and renamed at the end: an
interrupted conversion never leaves a half model under the target name. Replacing a model (`--force`)
moves the old one aside first (`.NAME.previous-PID`), renames the new one in, then deletes the old
one: a crash at any moment leaves a loadable model at the target or in that aside folder, which the
next conversion to the same target puts back (target missing) or deletes.

`add_llama_stages` (`convert --only-llama-stages`) gives a folder converted before the llama stages
file existed that file alone: written beside the others under a hidden name, checked, renamed in, then
the manifest replaced (a temporary file renamed over it). Until that last rename the folder is the
model it was.

Before any reduced-precision file is written, each matrix product's input range is measured on the
checkpoint's own weights (`precision/activation_ranges.py`); the weights whose input a file's format
could not take stay f32 there, and the manifest's `activations` lists them with their peaks.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from qwen3_tts_gguf import __version__
from qwen3_tts_gguf.convert.checkpoint import Checkpoint, CheckpointError
from qwen3_tts_gguf.convert.llama_stages import f32_weights, unsupported_reason, write_llama_stages
from qwen3_tts_gguf.convert.onnx_builder import save_model, save_model_sharing_weights
from qwen3_tts_gguf.convert.precision.activation_ranges import ActivationRanges, keep_f32, measure
from qwen3_tts_gguf.convert.predictor_graph import build_code_predictor, quantize_code_predictors
from qwen3_tts_gguf.convert.presets import (
    CP_BLOCK_SIZE,
    CP_BLOCK_SIZES,
    CP_PRECISIONS,
    DEFAULT_PRESET,
    PRESETS,
    LlamaStagesFormat,
    Preset,
)
from qwen3_tts_gguf.convert.talker_gguf import QUANTS, write_talker_gguf
from qwen3_tts_gguf.convert.text_tables import table_sources, write_text_tables
from qwen3_tts_gguf.model.embeddings import EmbeddingTables
from qwen3_tts_gguf.model.manifest import (
    CODEC_ENCODER_FILE,
    CODEC_FILE,
    LLAMA_STAGES_FILE,
    MANIFEST,
    PREDICTOR_CPU_FILE,
    PREDICTOR_FILE,
    SPEAKER_ENCODER_FILE,
    TALKER_FILE,
    TEXT_TABLES_FILE,
    FileEntry,
    Manifest,
    ModelFolderError,
    file_entries,
    load_manifest,
    sha256_file,
)
from qwen3_tts_gguf.model.prompt import PromptBuilder
from qwen3_tts_gguf.model.safetensors_io import SafetensorsFile
from qwen3_tts_gguf.model.tokenizer import TOKENIZER_FILES, TextTokenizer, official_pretokenizer

_SIZES = {"0b6": "0.6b", "1b7": "1.7b"}


def _side_dir(out_dir: Path, kind: str) -> Path:
    """This process's hidden folder beside `out_dir`: "partial" (being written) or "previous" (replaced)."""
    return out_dir.parent / f".{out_dir.name}.{kind}-{os.getpid()}"


def _recover(out_dir: Path) -> None:
    """Tidy up after conversions that died: put back a replaced model whose successor never arrived,
    delete every other leftover. Folders of conversions still running in other processes are left alone."""
    for side in sorted(out_dir.parent.glob(f".{out_dir.name}.*-*")):
        kind, _, pid = side.name[len(out_dir.name) + 2:].rpartition("-")
        if kind not in ("partial", "previous") or not pid.isdigit():
            continue
        if _running_elsewhere(int(pid)):
            continue
        if kind == "previous" and not out_dir.exists() and _loadable(side):
            side.rename(out_dir)
        else:
            shutil.rmtree(side, ignore_errors=True)


def _running_elsewhere(pid: int) -> bool:
    """Whether `pid` is another process still running (its leftovers are not stale)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _loadable(folder: Path) -> bool:
    """Whether `folder` is a complete model folder (manifest and file sizes)."""
    try:
        load_manifest(folder)
        return True
    except ModelFolderError:
        return False


def _install(tmp: Path, out_dir: Path) -> None:
    """Rename the finished folder to `out_dir`; a model it replaces waits aside until the new one is in."""
    aside = _side_dir(out_dir, "previous") if out_dir.exists() else None
    if aside:
        out_dir.rename(aside)
    try:
        tmp.rename(out_dir)
    except BaseException:
        if aside:
            aside.rename(out_dir)
        raise
    if aside:
        shutil.rmtree(aside, ignore_errors=True)  # what stays is removed by the next conversion


def build_manifest(ckpt: Checkpoint, quant: str, name: str) -> Manifest:
    """The manifest of a conversion (files are filled in once written)."""
    cfg = ckpt.config
    t = cfg.talker
    speakers = {n: {"id": i, "dialect": t.speaker_dialects.get(n) or False} for n, i in t.speaker_ids.items()}
    size = _SIZES.get(cfg.model_size, cfg.model_size)
    return Manifest(
        name=name, model_type=cfg.model_type, model_size=size, quant=quant,
        talker={"hidden_size": t.hidden_size, "num_layers": t.num_layers, "vocab_size": t.vocab_size,
                "text_vocab_size": t.text_vocab_size, "text_hidden_size": t.text_hidden_size,
                "num_code_groups": t.num_code_groups},
        code_predictor={"hidden_size": cfg.code_predictor.hidden_size, "num_layers": cfg.code_predictor.num_layers,
                        "mtp_projection": cfg.has_mtp_projection, "precision": "fp32"},
        codec={"sample_rate": cfg.codec.sample_rate, "samples_per_frame": cfg.codec.samples_per_frame,
               "sliding_window": cfg.codec.sliding_window,
               "frame_rate": cfg.codec.sample_rate / cfg.codec.samples_per_frame},
        text_ids=dict(cfg.special_text_ids), codec_ids=dict(t.codec_ids), languages=dict(t.language_ids),
        speakers=speakers, sampling=dict(ckpt.generation_config),
        default_text_mode="streaming" if cfg.model_type == "base" else "non-streaming",
        # the official wrapper drops instructions on 0.6B CustomVoice and never takes one on Base
        instruct_supported=cfg.model_type == "voice_design" or (cfg.model_type == "custom_voice" and size != "0.6b"),
        tokenizer={"pretokenizer": official_pretokenizer(cfg.raw.get("transformers_version"))},
        speaker_encoder=cfg.speaker_encoder, converter_version=__version__,
        source={"path": str(ckpt.path.resolve()), "transformers_version": cfg.raw.get("transformers_version")},
    )


def convert_checkpoint(hf_dir: str | Path, out_dir: str | Path, quant: str = "q8_0", *, name: str | None = None,
                       cp_precision: str = "int8", cp_block_size: int = CP_BLOCK_SIZE,
                       llama_stages: LlamaStagesFormat = PRESETS[DEFAULT_PRESET].llama_stages,
                       overwrite: bool = False, verify: bool = True, threads: int = 0,
                       show_progress: bool = True) -> Manifest:
    """Convert an official checkpoint folder into a model folder at `out_dir`; returns its manifest.

    `quant` is the talker's weight format, `cp_precision` the code predictor's (fp32 | int8 | int4;
    fp32 is the parity precision, int8 the users' default), quantized with `cp_block_size` weights per scale;
    `llama_stages` the matrix types of the llama stages file (written where libmtmd can load it)."""
    if quant not in QUANTS:
        raise CheckpointError(f"unknown quant {quant!r}; choose one of {', '.join(QUANTS)}")
    if cp_precision not in CP_PRECISIONS:
        raise CheckpointError(f"unknown code predictor precision {cp_precision!r}; choose {', '.join(CP_PRECISIONS)}")
    if cp_block_size not in CP_BLOCK_SIZES:
        raise CheckpointError(f"code predictor block size must be one of {CP_BLOCK_SIZES}, got {cp_block_size}")
    out_dir = Path(out_dir)
    _recover(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists (pass --force to replace it)")
    ckpt = Checkpoint.open(hf_dir)
    name = name or out_dir.name
    tmp = _side_dir(out_dir, "partial")
    tmp.mkdir(parents=True)
    stages = ["text tables", "activation ranges", "talker", "code predictor", "codec decoder", "llama stages",
              "tokenizer", "self-check"]
    if ckpt.config.model_type == "base":
        stages.insert(5, "voice encoders")
    no_stages = unsupported_reason(ckpt.config)
    bar = tqdm(total=len(stages), desc=f"convert {name}", unit="stage", disable=not show_progress)
    started = time.monotonic()
    try:
        def stage(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)

        stage("text tables")
        write_text_tables(ckpt, tmp / TEXT_TABLES_FILE)
        bar.update()
        stage("activation ranges")
        manifest = build_manifest(ckpt, quant, name)
        ranges = measure(ckpt, prompt_builder(ckpt.path, manifest, tmp / TEXT_TABLES_FILE))
        kept = {TALKER_FILE: keep_f32(ranges, quant, "talker"),
                PREDICTOR_FILE: keep_f32(ranges, cp_precision, "code_predictor")}
        if not no_stages:
            kept[LLAMA_STAGES_FILE] = f32_weights(ranges, llama_stages)
        bar.update()
        stage("talker")
        write_talker_gguf(ckpt, tmp / TALKER_FILE, quant, name=name, threads=threads, keep=kept[TALKER_FILE],
                          progress=lambda t: bar.set_postfix_str(f"talker {t}", refresh=False))
        bar.update()
        stage("code predictor")
        # its weights beside the graph: ONNX Runtime maps that file, its MatMul kernels pack their own
        # copy and never read the mapped one again (143 MiB less resident at 0.6B, same speed; the codec
        # gains nothing this way: its convolutions read the weights at every call); then the CPU's graph,
        # fused attention on those same weights (manifest.PREDICTOR_CPU_FILE)
        portable, cpu = quantize_code_predictors(
            [build_code_predictor(ckpt), build_code_predictor(ckpt, attention="standard")], cp_precision,
            cp_block_size, kept[PREDICTOR_FILE])
        save_model(portable, tmp / PREDICTOR_FILE, external=True)
        save_model_sharing_weights(cpu, tmp / PREDICTOR_CPU_FILE, tmp / PREDICTOR_FILE)
        bar.update()
        stage("codec decoder")
        from qwen3_tts_gguf.convert.codec_graph import build_codec_decoder

        save_model(build_codec_decoder(ckpt), tmp / CODEC_FILE)
        bar.update()
        if ckpt.config.model_type == "base":  # voice cloning: reference audio -> x-vector, reference codes
            stage("voice encoders")
            from qwen3_tts_gguf.convert.codec_encoder_graph import build_codec_encoder
            from qwen3_tts_gguf.convert.speaker_encoder_graph import build_speaker_encoder

            save_model(build_speaker_encoder(ckpt), tmp / SPEAKER_ENCODER_FILE)
            save_model(build_codec_encoder(ckpt), tmp / CODEC_ENCODER_FILE)
            bar.update()
        stage("llama stages")
        stages_entry = ({"missing": no_stages} if no_stages else
                        write_llama_stages(ckpt, tmp / LLAMA_STAGES_FILE, llama_stages, kept[LLAMA_STAGES_FILE]))
        bar.update()
        stage("tokenizer")
        for f in TOKENIZER_FILES:
            shutil.copy(ckpt.path / f, tmp / f)
        manifest.llama_stages = stages_entry
        manifest.activations = ranges.report(kept)
        manifest.code_predictor["precision"] = cp_precision
        if cp_precision != "fp32":
            manifest.code_predictor["block_size"] = cp_block_size
        manifest.files = file_entries(tmp)
        (tmp / MANIFEST).write_text(manifest.to_json())
        bar.update()
        if verify:
            stage("self-check")
            from qwen3_tts_gguf.convert.verify import verify_conversion

            manifest.source["self_check"] = verify_conversion(ckpt, tmp)
            (tmp / MANIFEST).write_text(manifest.to_json())
        bar.update()
        _install(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()
    if show_progress:
        print(f"converted {ckpt.path} -> {out_dir} ({quant}) in {time.monotonic() - started:.1f} s")
        if no_stages:
            print(f"no {LLAMA_STAGES_FILE} (the ONNX Runtime stages only): {no_stages}")
        _print_activations(ranges, kept)
    return manifest


def add_llama_stages(hf_dir: str | Path, folder: str | Path, llama_stages: LlamaStagesFormat | None = None, *,
                     overwrite: bool = False, verify: bool = True, show_progress: bool = True) -> Manifest:
    """Write the llama stages file into `folder`, converted from `hf_dir` before that file existed, and
    list it in the manifest; every other file stays as it is. `llama_stages` None: the formats of the
    preset the folder was converted with (its talker's and code predictor's), else the default preset's."""
    folder = Path(folder)
    manifest = load_manifest(folder)
    ckpt = Checkpoint.open(hf_dir)
    _check_source(ckpt, manifest, folder)
    if LLAMA_STAGES_FILE in manifest.files and not overwrite:
        raise FileExistsError(f"{folder} has {LLAMA_STAGES_FILE} already (pass --force to write it again)")
    if reason := unsupported_reason(ckpt.config):
        raise CheckpointError(f"{ckpt.path} gets no {LLAMA_STAGES_FILE}: {reason}")
    fmt = llama_stages or _preset_of(manifest).llama_stages
    for stale in [*folder.glob(f".{LLAMA_STAGES_FILE}.partial-*"), *folder.glob(f".{MANIFEST}.partial-*")]:
        pid = stale.name.rpartition("-")[2]  # what an interrupted run left
        if pid.isdigit() and not _running_elsewhere(int(pid)):
            stale.unlink(missing_ok=True)
    started = time.monotonic()
    part = folder / f".{LLAMA_STAGES_FILE}.partial-{os.getpid()}"
    try:
        ranges = measure(ckpt, prompt_builder(folder, manifest, folder / TEXT_TABLES_FILE))
        keep = f32_weights(ranges, fmt)
        entry = write_llama_stages(ckpt, part, fmt, keep)
        if verify:
            from qwen3_tts_gguf.convert.verify import check_llama_stages

            manifest.source.setdefault("self_check", {}).update(check_llama_stages(ckpt, part, fmt, keep))
        written = FileEntry(bytes=part.stat().st_size, sha256=sha256_file(part))
        if LLAMA_STAGES_FILE in manifest.files:  # replaced: the manifest forgets the old file first
            del manifest.files[LLAMA_STAGES_FILE]
            manifest.llama_stages = None
            _replace_manifest(folder, manifest)
        os.replace(part, folder / LLAMA_STAGES_FILE)
    finally:
        part.unlink(missing_ok=True)
    manifest.files = dict(sorted({**manifest.files, LLAMA_STAGES_FILE: written}.items()))
    manifest.llama_stages = entry
    kept = {**{file: frozenset(weights) for file, weights in (manifest.activations or {}).get("kept_f32", {}).items()},
            LLAMA_STAGES_FILE: keep}
    manifest.activations = ranges.report(kept)
    _replace_manifest(folder, manifest)
    if show_progress:
        print(f"added {LLAMA_STAGES_FILE} to {folder} (code predictor {fmt.code_predictor}, codec {fmt.codec}) "
              f"in {time.monotonic() - started:.1f} s")
        _print_activations(ranges, {LLAMA_STAGES_FILE: keep})
    return manifest


def prompt_builder(tokenizer_dir: Path, manifest: Manifest, tables: Path) -> PromptBuilder:
    """The prompts of a model being converted: its manifest, the tokenizer files in `tokenizer_dir`, its
    text tables file."""
    return PromptBuilder(manifest, TextTokenizer(tokenizer_dir, manifest.tokenizer["pretokenizer"]),
                         EmbeddingTables(tables))


def _print_activations(ranges: ActivationRanges, kept: dict[str, frozenset[str]]) -> None:
    """The convert report's lines on activation ranges: the largest peaks, what each file keeps at f32."""
    report = ranges.report(kept)
    peaks = "; ".join(f"{stage} {max(found.values(), default=0):.4g}"
                      for stage, found in report["largest_peaks"].items())
    print(f"activation peaks ({report['measured']}): {peaks}")
    for file, weights in report["kept_f32"].items():
        if weights:
            print(f"{file} keeps at f32 (their inputs leave its format's range): " + ", ".join(
                f"{name} (peak {r['peak']:.4g}, {r['peak_to_median']:.4g}x the median)"
                for name, r in weights.items()))


def _check_source(ckpt: Checkpoint, manifest: Manifest, folder: Path) -> None:
    """Refuse a checkpoint that is not the one `folder` was converted from (its facts, and the codec
    embedding the text tables copied word for word)."""
    mine = build_manifest(ckpt, manifest.quant, manifest.name)

    def same(key: str) -> bool:  # of a dict, the entries the folder's (perhaps older) manifest has
        theirs, ours = getattr(manifest, key), getattr(mine, key)
        return {k: ours.get(k) for k in theirs} == theirs if isinstance(theirs, dict) else ours == theirs

    differ = [key for key in ("model_type", "model_size", "talker", "codec", "codec_ids", "speakers") if not same(key)]
    if not differ:
        source = table_sources(ckpt)["codec_embedding.0"]
        if not np.array_equal(SafetensorsFile(folder / TEXT_TABLES_FILE)["codec_embedding.0"], ckpt.weights[source]):
            differ.append("weights")
    if differ:
        raise CheckpointError(f"{ckpt.path} is not the checkpoint {folder} was converted from "
                              f"(its {', '.join(differ)} differ)")


def _preset_of(manifest: Manifest) -> Preset:
    """The preset whose talker and code predictor formats the folder has, else the default one."""
    precision = manifest.code_predictor.get("precision", "fp32")
    return next((p for p in PRESETS.values() if (p.quant, p.cp_precision) == (manifest.quant, precision)),
                PRESETS[DEFAULT_PRESET])


def _replace_manifest(folder: Path, manifest: Manifest) -> None:
    """Write `folder`'s manifest.json through a temporary file renamed over it (never half written)."""
    tmp = folder / f".{MANIFEST}.partial-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(manifest.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["convert_checkpoint", "add_llama_stages", "build_manifest", "prompt_builder"]
