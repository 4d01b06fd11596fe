"""How closely the quantized paths follow the precise ones, on the benchmark models.

Talker quants against f16 (the bench's widest talker; the tests hold q8_0 and q4_k_m against f32
on tiny models): the real prompt, then teacher-forced frames, each quant decoding the same rows
one step at a time; per step the codebook-0 argmax and the logits' relative RMS error.
Code predictor int8/int4 against fp32: greedy, fed the f16 talker's hidden states and codebook-0
codes of those steps; the first code (same inputs) and all 15 (each precision follows its own
draws, so one early difference changes the rest). Codec: chunked decoding (the engine's
1, 2, 4, 8 ramp) against one call over the same codes, as an SNR.

Random weights have small logit margins, so these agreements are pessimistic; real checkpoints
must be measured again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qwen3_tts_gguf.model.manifest import CODEC_FILE, PREDICTOR_FILE, TALKER_FILE, TEXT_TABLES_FILE

from bench.codec_precision import CHUNKS, decode_chunked, snr_db
from bench.common import LANGUAGE, SPEAKER, TEXT, TEXT_MODE

STEPS = sum(CHUNKS)  # teacher-forced talker steps after the prompt (48): their codes are also decoded in CHUNKS


def _rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


def _talker_run(folder: Path, quant: str, rows: np.ndarray, threads: int,
                kv_cache: str = "f16") -> tuple[np.ndarray, np.ndarray]:
    """Logits and hidden states after each of the last STEPS+1 rows, decoded one row at a time."""
    from qwen3_tts_gguf.model.talker import Talker, TalkerSettings, repack_pays

    talker = Talker(folder / TALKER_FILE, TalkerSettings(n_ctx=512, max_streams=1, threads=threads,
                                                             repack=repack_pays(quant), kv_cache=kv_cache))
    try:
        return talker.decode_steps(0, rows, len(rows) - STEPS)
    finally:
        talker.close()


def _teacher_rows(folder: Path, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The headline prompt's rows, then STEPS frames of random codes (teacher forcing): (rows, codes)."""
    from qwen3_tts_gguf.model.embeddings import EmbeddingTables
    from qwen3_tts_gguf.model.manifest import load_manifest
    from qwen3_tts_gguf.model.prompt import PromptBuilder, VoiceSpec
    from qwen3_tts_gguf.model.tokenizer import TextTokenizer

    manifest = load_manifest(folder)
    tables = EmbeddingTables(folder / TEXT_TABLES_FILE)
    prompts = PromptBuilder(manifest, TextTokenizer(folder, manifest.tokenizer["pretokenizer"]), tables)
    prompt = prompts.build(TEXT, VoiceSpec(speaker=SPEAKER, language=LANGUAGE), TEXT_MODE)
    codes = np.random.default_rng(seed).integers(0, 2048, (STEPS, 16))
    rows = np.concatenate([prompt.rows, tables.frame_rows(codes) + prompt.pad_row]).astype(np.float32)
    return rows, codes


def talker_agreement(talkers: dict[str, Path], ref_quant: str, threads: int,
                     seed: int = 0) -> tuple[dict, tuple[np.ndarray, np.ndarray]]:
    """Each quant of `talkers` ({quant: model folder}) against `ref_quant`'s on the code sequence of
    `seed`: codebook 0 equal, logits' relative RMS error (median over the steps). Also returns the
    reference's (logits, hidden states)."""
    rows, _ = _teacher_rows(talkers[ref_quant], seed)
    ref_logits, ref_hidden = _talker_run(talkers[ref_quant], ref_quant, rows, threads)
    out = {}
    for quant, folder in talkers.items():
        if quant == ref_quant:
            continue
        logits, _ = _talker_run(folder, quant, rows, threads)
        out[quant] = {
            "code0_agree": float((logits.argmax(-1) == ref_logits.argmax(-1)).mean()),
            "logits_rel_rms_median": float(np.median([_rel_rms(a, b) for a, b in zip(logits, ref_logits)])),
        }
    return out, (ref_logits, ref_hidden)


def measure(folders: dict[str, str], threads: int) -> dict:
    """`folders`: {"quant/cp": model folder} as the orchestrator converted them."""
    from qwen3_tts_gguf.model.codec import CodecDecoder
    from qwen3_tts_gguf.model.predictor import CodePredictor
    from qwen3_tts_gguf.model.sampler import SamplingParams, pack

    folders = {k: Path(v) for k, v in folders.items()}
    talkers = {k.split("/")[0]: f for k, f in folders.items()}
    predictors = {k.split("/")[1]: f for k, f in folders.items() if k.startswith("q8_0/")}
    ref_quant = "f16" if "f16" in talkers else sorted(talkers)[0]
    rows, codes = _teacher_rows(talkers[ref_quant])

    out: dict = {"reference_quant": ref_quant, "steps": STEPS + 1, "code_predictor": {}}
    out["talker"], (ref_logits, ref_hidden) = talker_agreement(talkers, ref_quant, threads)
    ref_code0 = ref_logits.argmax(-1)

    # the KV cache's precision, on the headline talker: each quantized cache's cells against f16 cells
    from qwen3_tts_gguf.model.talker import KV_CACHE_TYPES

    kv_quant = "q8_0" if "q8_0" in talkers else ref_quant
    f16_cells, _ = ((ref_logits, None) if kv_quant == ref_quant
                    else _talker_run(talkers[kv_quant], kv_quant, rows, threads))
    out["kv_cache"] = {"talker": kv_quant}
    for kv in (k for k in KV_CACHE_TYPES if k != "f16"):
        cells, _ = _talker_run(talkers[kv_quant], kv_quant, rows, threads, kv_cache=kv)
        out["kv_cache"][kv] = {
            "code0_agree": float((cells.argmax(-1) == f16_cells.argmax(-1)).mean()),
            "logits_rel_rms_median": float(np.median([_rel_rms(a, b) for a, b in zip(cells, f16_cells)]))}

    if "fp32" in predictors:
        n = len(ref_hidden)
        feeds = {"hidden": ref_hidden.astype(np.float32), "code0": ref_code0.astype(np.int64),
                 "rand": np.zeros((n, 15), np.float32), **pack(SamplingParams(greedy=True), n)}
        runs = {cp: CodePredictor(f / PREDICTOR_FILE, threads=threads).session.run(["codes", "logits"], feeds)
                for cp, f in predictors.items()}
        ref_codes, ref_cp_logits = runs["fp32"]
        for cp, (cp_codes, cp_logits) in runs.items():
            if cp == "fp32":
                continue
            out["code_predictor"][cp] = {
                "first_code_agree": float((cp_codes[:, 0] == ref_codes[:, 0]).mean()),
                "all_codes_agree": float((cp_codes == ref_codes).mean()),
                "first_logits_rel_rms_median": float(np.median(
                    [_rel_rms(a, b) for a, b in zip(cp_logits[:, 0], ref_cp_logits[:, 0])])),
            }

    codec = CodecDecoder(talkers[ref_quant] / CODEC_FILE, threads=threads)
    whole = codec.decode_all(codes)
    chunked, _ = decode_chunked(codec, codes)
    out["codec"] = {"frames": len(codes), "chunks": list(CHUNKS), "max_abs_diff": float(np.abs(chunked - whole).max()),
                    "snr_db": snr_db(chunked, whole)}
    return out
