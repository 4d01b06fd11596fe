"""Checkpoint folder -> converted model folder, atomically, with a self-check before success.

Everything is written into a hidden temporary folder beside the target and renamed at the end: an
interrupted conversion never leaves a half model under the target name. Replacing a model (`--force`)
moves the old one aside first (`.NAME.previous-PID`), renames the new one in, then deletes the old
one: a crash at any moment leaves a loadable model at the target or in that aside folder, which the
next conversion to the same target puts back (target missing) or deletes.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from tqdm import tqdm

from qwen3_tts_gguf import __version__
from qwen3_tts_gguf.convert.checkpoint import Checkpoint, CheckpointError
from qwen3_tts_gguf.convert.onnx_builder import save_model, save_model_sharing_weights
from qwen3_tts_gguf.convert.predictor_graph import build_code_predictor, quantize_code_predictors
from qwen3_tts_gguf.convert.presets import CP_BLOCK_SIZE, CP_BLOCK_SIZES, CP_PRECISIONS
from qwen3_tts_gguf.convert.talker_gguf import QUANTS, write_talker_gguf
from qwen3_tts_gguf.convert.text_tables import write_text_tables
from qwen3_tts_gguf.model.manifest import (
    CODEC_ENCODER_FILE,
    CODEC_FILE,
    MANIFEST,
    PREDICTOR_CPU_FILE,
    PREDICTOR_FILE,
    SPEAKER_ENCODER_FILE,
    TALKER_FILE,
    TEXT_TABLES_FILE,
    Manifest,
    ModelFolderError,
    file_entries,
    load_manifest,
)
from qwen3_tts_gguf.model.tokenizer import TOKENIZER_FILES, official_pretokenizer

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
        if int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue  # still running
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # another user's process
        if kind == "previous" and not out_dir.exists() and _loadable(side):
            side.rename(out_dir)
        else:
            shutil.rmtree(side, ignore_errors=True)


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
               "sliding_window": cfg.codec.sliding_window, "frame_rate": cfg.codec.sample_rate / cfg.codec.samples_per_frame},
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
                       cp_precision: str = "int8", cp_block_size: int = CP_BLOCK_SIZE, overwrite: bool = False,
                       verify: bool = True, threads: int = 0, show_progress: bool = True) -> Manifest:
    """Convert an official checkpoint folder into a model folder at `out_dir`; returns its manifest.

    `quant` is the talker's weight format, `cp_precision` the code predictor's (fp32 | int8 | int4;
    fp32 is the parity precision, int8 the users' default), quantized with `cp_block_size` weights per scale."""
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
    stages = ["talker", "text tables", "code predictor", "codec decoder", "tokenizer", "self-check"]
    if ckpt.config.model_type == "base":
        stages.insert(4, "voice encoders")
    bar = tqdm(total=len(stages), desc=f"convert {name}", unit="stage", disable=not show_progress)
    started = time.monotonic()
    try:
        def stage(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)

        stage("talker")
        write_talker_gguf(ckpt, tmp / TALKER_FILE, quant, name=name, threads=threads,
                          progress=lambda t: bar.set_postfix_str(f"talker {t}", refresh=False))
        bar.update()
        stage("text tables")
        write_text_tables(ckpt, tmp / TEXT_TABLES_FILE)
        bar.update()
        stage("code predictor")
        # its weights beside the graph: ONNX Runtime maps that file, its MatMul kernels pack their own
        # copy and never read the mapped one again (143 MiB less resident at 0.6B, same speed; the codec
        # gains nothing this way: its convolutions read the weights at every call); then the CPU's graph,
        # fused attention on those same weights (manifest.PREDICTOR_CPU_FILE)
        portable, cpu = quantize_code_predictors(
            [build_code_predictor(ckpt), build_code_predictor(ckpt, attention="standard")], cp_precision, cp_block_size)
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
        stage("tokenizer")
        for f in TOKENIZER_FILES:
            shutil.copy(ckpt.path / f, tmp / f)
        manifest = build_manifest(ckpt, quant, name)
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
    return manifest


__all__ = ["convert_checkpoint", "build_manifest"]
