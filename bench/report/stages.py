"""The *Stage runtimes* section: the code predictor and the codec on ONNX Runtime and the project's ggml graphs."""

from __future__ import annotations

from bench.report.format import block_origin, fmt_share
from bench.stage_runtimes import CHUNKS


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def render_stages(block: dict, standalone: bool = False, *, heading: str = "## Stage runtimes",
                  name: str = "stages") -> str:
    """The "Stage runtimes" section (also spliced alone into an existing report by `--only stages`)."""
    out: list[str] = []
    w = out.append
    w(f"{heading}\n")
    shapes = block.get("shapes") or {}
    first = next(iter(shapes.values()), {})
    w(block_origin(block, name, standalone) + f": {first.get('threads', 2)} threads, {first.get('frames')} "
      "random frames per stream (random talker states into the code predictor; random codes into the codec, "
      f"decoded in the engine's chunks {' + '.join(map(str, first.get('chunks', [])))}), "
      f"{first.get('rounds')} rounds with the variants alternating, one process per shape "
      "(`bench/stage_runtimes.py`). Eight streams: the code predictors decode them in one batched call a step. "
      "*Loaded*: resident memory its file added when it was loaded (each variant loads its own copy). "
      "*Agreement*: against the fp32 ONNX graph: greedy codes equal on the same states (code predictor), SNR of the "
      "audio (codec). Random weights: speed does not depend on them; agreement must be measured again on real "
      "checkpoints.\n")
    if not shapes:
        w(f"**Not measured**: {block.get('error', 'no shape ran')}.\n")
        return "\n".join(out) + "\n"
    for shape, res in shapes.items():
        w(f"**{shape}**\n")
        variants = res.get("variants") or {}
        if "error" in res or not variants:
            w(f"Not measured: {res.get('error', 'no variant ran')}.\n")
            continue
        w("| stage | runtime | precision | ms per frame, 1 stream | ms per frame, 8 streams | loaded, MiB | agreement "
          "| background |")
        w("|---|---|---|---|---|---|---|---|")
        for name, v in variants.items():
            if "error" in v:
                w(f"| {v['stage']} | {_runtime(v)} | {v['precision']} | cannot run: {v['error']} | | | | |")
                continue
            agreement = ("the reference" if v.get("reference") else
                         f"{100 * v['codes_equal']:.1f} % codes equal" if "codes_equal" in v
                         else "–" if v.get("snr_db") is None else f"SNR {v['snr_db']:.1f} dB")
            w(f"| {v['stage']} | {_runtime(v)} | {v['precision']} | {_ms(v.get('median_ms_1'))} | "
              f"{_ms(v.get('median_ms_8'))} | {v.get('loaded_mb', 0):.0f} | {agreement} | "
              f"{fmt_share(v.get('background', []))} |")
        w("")
        codecs = {name: v for name, v in variants.items() if v["stage"] == "codec" and "error" not in v}
        if codecs:
            w("The codec at fixed chunks, one stream: ms per frame (GFLOP per frame)\n")
            w("| runtime | " + " | ".join(f"chunk {c}" for c in CHUNKS) + " |")
            w("|---|" + "---|" * len(CHUNKS))
            for name, v in codecs.items():
                flops = v.get("gflop_per_frame") or {}
                cells = [f"{_ms(v.get(f'median_chunk_ms_{c}'))} ({flops.get(c, flops.get(str(c), 0)):.2f})"
                         for c in CHUNKS]
                w(f"| {_runtime(v)} | " + " | ".join(cells) + " |")
            w("")
    if name == "stages":
        w("On a CPU each stage keeps ONNX Runtime by default (`--cp-runtime auto`, `--codec-runtime auto`), which "
          "measures fastest there; the ggml graphs are `auto`'s on a GPU that ONNX Runtime cannot reach (Vulkan; "
          "docs/gpu.md).\n")
    return "\n".join(out) + "\n"


def render_stages_gpu(block: dict, standalone: bool = False) -> str:
    """The "Stage runtimes on a GPU device" section (`--only stages-gpu`): the ggml graphs on a ggml device beside
    their fp32 ONNX references on the CPU."""
    text = render_stages(block, standalone, heading="## Stage runtimes on a GPU device", name="stages-gpu")
    return text + (f"The ggml graphs on `{block.get('device', '?')}` (`python -m bench --only stages-gpu` with the "
                   "Vulkan build's libraries, `LLAMA_CPP_LIB_PATH`); lavapipe, Mesa's software Vulkan device, runs "
                   "every shader on the CPU: its figures say how the work scales with chunks and streams, never how "
                   "fast a GPU is (docs/gpu.md).\n\n")


def _runtime(variant: dict) -> str:
    device = variant.get("device")
    return variant["runtime"] if device in (None, "CPU") else f"{variant['runtime']} on {device}"
