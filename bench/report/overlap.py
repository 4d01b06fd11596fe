"""The *Codec overlap* section: the codec inline against overlapped, every way, and on OpenVINO; and the rows
it adds to *Targets*."""

from __future__ import annotations

from bench.common import median
from bench.experiments import OVERLAP_RUNTIMES, OVERLAP_VARIANTS
from bench.report.format import block_origin, fmt_goal, fmt_verdict, num, preset_words
from bench.report.goals import CONCURRENT_RTF_TARGET, FAST_RTF_TARGET


def render_overlap(block: dict, standalone: bool = False) -> str:
    """The "Codec overlap" section (also spliced alone into an existing report by `--only overlap`)."""
    out: list[str] = []
    w = out.append
    w("## Codec overlap\n")
    w(block_origin(block, "overlap", standalone) + f": 0.6B, talker q8_0, code predictor int8, "
      f"{block.get('threads', 2)} threads, {block.get('frames')} frames per utterance, {block.get('rounds')} rounds "
      "with the variants alternating, each in its own worker; then eight concurrent streams each.\n")
    w("*Inline*: the engine thread calls the codec between the code predictor and the talker step, so the three "
      "stages add up. *Overlapped*: the codec runs on threads of its own while the talker and code predictor make "
      "the next frames (a stream's first chunk still goes inline, for first audio): by default one call at a time "
      "on every core; with `--codec-threads 1`, calls of one thread each in lanes side by side (a lane per core; a "
      "stream keeps its lane, so its calls stay in order). Overlapped, a one-row talker step (one stream's) leaves "
      "a core to a codec call in flight (`qwen3_tts_gguf/host/cpus.py`, `stage_threads`). The samples are the same "
      "every way (the codec carries its state; the tests hold chunked audio to one whole decode), except on OpenVINO "
      "(`--codec-runtime openvino`: the same graph compiled by another runtime, samples within fp32 rounding, *Codec "
      "precision*).\n")
    w(block.get("markdown", "**Not measured.**"))
    inline, default, lanes, openvino = OVERLAP_VARIANTS
    for label, before, after in (("The default (overlapped) against inline", inline, default),
                                 ("Codec calls of one thread in lanes (`--codec-threads 1`) against the default",
                                  default, lanes),
                                 ("The codec on OpenVINO (`--codec-runtime openvino`) against the default",
                                  default, openvino)):
        line = _overlap_comparison(label, block, before, after)
        if line:
            w("\n" + line)
    fast = block.get("fast")
    if fast:
        w(f"\nWith `--preset fast` ({preset_words('fast')}), the default codec and OpenVINO's, measured the same way "
          "after the table above:\n")
        w(fast.get("markdown", "**Not measured.**"))
        line = _overlap_comparison("`--preset fast`: the codec on OpenVINO against the default", fast, default,
                                   openvino)
        if line:
            w("\n" + line)
    w("")
    return "\n".join(out) + "\n"


def overlap_targets(block: dict) -> list[str]:
    """Rows of the targets' block table from the overlap block's OpenVINO variants: one stream with `--preset
    fast` and the codec on OpenVINO, and eight streams on OpenVINO with either weights."""
    _, openvino = OVERLAP_RUNTIMES
    default, fast = overlap_medians(block, openvino), overlap_medians(block.get("fast") or {}, openvino)
    rows = []
    if fast[0] is not None:
        rows.append(f"| one stream, `--preset fast` ({preset_words('fast')}) with `--codec-runtime openvino`: RTF | "
                    f"{fmt_goal(FAST_RTF_TARGET)} | {num(fast[0], 2)} (0.6B; peak RSS after eight streams "
                    f"{num(fast[3], 0)} MiB) | {fmt_verdict(fast[0], FAST_RTF_TARGET)} (*Codec overlap*) |")
    eight = [(f"{num(v, 2)} with {words}", v) for v, words in ((default[1], "the default weights"),
                                                               (fast[1], "`--preset fast`")) if v is not None]
    if eight:
        best = min(v for _, v in eight)
        rows.append(f"| eight streams with `--codec-runtime openvino`: aggregate RTF | "
                    f"{fmt_goal(CONCURRENT_RTF_TARGET)} "
                    f"| {'; '.join(t for t, _ in eight)} (0.6B) | {fmt_verdict(best, CONCURRENT_RTF_TARGET)} "
                    "(*Codec overlap*) |")
    return rows


def overlap_medians(block: dict, variant: str) -> tuple[float | None, float | None, float | None, float | None]:
    """(one stream's median RTF, eight streams' aggregate RTF, median first audio s, peak RSS MiB) of a variant
    in an overlap comparison (the block's "runs" and "concurrency"); None where not measured."""
    runs = (block.get("runs") or {}).get(variant) or []
    conc = (block.get("concurrency") or {}).get(variant) or {}
    first = [r["first_audio_s"] for r in runs if r.get("first_audio_s")]
    return (median([r["rtf"] for r in runs]) if runs else None, conc.get("aggregate_rtf"),
            median(first) if first else None, conc.get("peak_rss_mb"))


def _overlap_comparison(label: str, block: dict, before: str, after: str) -> str | None:
    """"label: one stream's RTF a → b (%); eight streams' ...; first audio ...; peak RSS ...." or None
    when either variant has no single-stream runs."""
    (a, ca, fa, pa), (b, cb, fb, pb) = overlap_medians(block, before), overlap_medians(block, after)
    if not (a and b):
        return None
    line = f"{label}: one stream's RTF {a:.2f} → {b:.2f} ({100 * (b / a - 1):+.0f} %)"
    if ca and cb:
        line += f"; eight streams' aggregate RTF {ca:.2f} → {cb:.2f} ({100 * (cb / ca - 1):+.0f} %)"
    if fa and fb:
        line += f"; first audio {fa:.2f} → {fb:.2f} s"
    if pa and pb:
        line += f"; peak RSS after eight streams {pa:.0f} → {pb:.0f} MiB"
    return line + "."
