"""The *Codec precision* section: the codec graph in other precisions and runtimes, speed and SNR against fp32."""

from __future__ import annotations

from bench.common import median
from bench.report.format import block_origin


def render_codec(block: dict, standalone: bool = False) -> str:
    """The "Codec precision" section (also spliced alone into an existing report by `--only codec`)."""
    from bench.codec_precision import GATE_DB, GATE_SPEEDUP, OPT_IN, REFERENCE, speed_ratio, verdict

    out: list[str] = []
    w = out.append
    w("## Codec precision\n")
    w(block_origin(block, "codec", standalone) + f": the 0.6B headline model's codec, {block.get('threads', 2)} "
      f"threads, {block.get('frames')} random frames decoded in the engine's chunks "
      f"({' + '.join(map(str, block.get('chunks', [])))}), {block.get('rounds')} rounds with the variants "
      "alternating, one process.\n")
    variants = block.get("variants") or {}
    if "error" in block or not variants:
        w(f"**Not measured**: {block.get('error', 'no variant ran')}.\n")
        return "\n".join(out) + "\n"
    w("Each variant is built by the bench from the converted fp32 graph (*Snake with Sin* from the model's source "
      "checkpoint, as the converter built the codec before its polynomial Snake; *OpenVINO*: the same graph compiled "
      "by OpenVINO instead of ONNX Runtime). *SNR* and *max difference*: its samples against the fp32 graph's for the "
      "same chunks. A variant may become the default only at an SNR of at least "
      f"{GATE_DB:.0f} dB and if it is at least {100 * (1 - GATE_SPEEDUP):.0f} % faster (less is within the rounds' "
      "noise). Random weights only: real checkpoints must be measured again.\n")
    ref = variants.get(REFERENCE, {})
    w("| codec graph | what changes | file, MiB | ms per frame, median (best) | × fp32 (per round) | SNR, dB "
      "| max difference | verdict | bg |")
    w("|---|---|---|---|---|---|---|---|---|")
    for name, v in variants.items():
        ms = v.get("ms_per_frame") or []
        speed = f"{median(ms):.1f} ({min(ms):.1f})" if ms else "–"
        ratio = speed_ratio(v, ref)
        ratio = f"{ratio:.2f}" if ratio is not None else "–"
        snr = "exact" if name == REFERENCE else (f"{v['snr_db']:.1f}" if v.get("snr_db") is not None else "–")
        diff = f"{v['max_abs_diff']:.1e}" if "max_abs_diff" in v and name != REFERENCE else ""
        bg = f"{100 * median(v['background']):.0f} %" if v.get("background") else "–"
        w(f"| {name} | {v.get('changes', '')} | {v.get('file_mb', 0):.0f} | {speed} | {ratio} | {snr} "
          f"| {diff} | {verdict(name, v, ref)} | {bg} |")
    passing = [n for n, v in variants.items() if n != REFERENCE and verdict(n, v, ref).startswith("meets the gate")]
    opt_in = [n for n in passing if n in OPT_IN]
    default = [n for n in passing if n not in OPT_IN]
    w("")
    if default:
        w("Meets the gate: " + ", ".join(default) + ".\n")
    if opt_in:
        w(f"Meets the gate as an option: {', '.join(opt_in)} ({', '.join(OPT_IN[n] for n in opt_in)}). It stays "
          "opt-in: its compiled graph keeps its own copies of the weights in its kernels' layouts, so a server holds "
          "more memory (*Codec overlap* gives the peak with eight streams), against the peak-memory target of the "
          "issue *Real-time CPU*.\n")
    if not default:
        w("No variant of ONNX Runtime's graph meets the gate, so the fp32 codec on ONNX Runtime stays the default. "
          "ONNX Runtime's CPU kernels set the limits there: integer convolutions quantize every activation to 8 bits "
          "per tensor, which random weights' wide activations do not survive; fp16 gains little without native fp16 "
          "arithmetic; and the Snake's `Sin` runs on one thread where the polynomial runs on all. OpenVINO's bf16 "
          "keeps 8 bits of mantissa: below the gate like fp16.\n")
    return "\n".join(out) + "\n"
