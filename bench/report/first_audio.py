"""The *Time to first audio per configuration* section, and the lowest first audio of its configurations
against each target (for *Targets*)."""

from __future__ import annotations

from bench.report.format import (
    block_origin,
    fmt_background,
    fmt_goal,
    fmt_verdict,
    low,
    mid,
    msec,
    num,
    ok_result,
)
from bench.report.goals import TTFA_TARGETS
from bench.report.results import latency_medians, rest_s

FIRST_AUDIO_CASES = {"non-streaming/cold": "non-streaming, cold", "non-streaming/cached": "non-streaming, cached",
                     "streaming/cold": "streaming, cold", "streaming/cached": "streaming, cached",
                     "live/cold": "live, cold"}
"""OursSession.LATENCY_CASES' keys -> column headings of the time-to-first-audio block"""


def first_audio_medians(block: dict) -> dict[str, dict[str, dict]]:
    """{configuration: {case: {measure: median}}} of the time-to-first-audio block."""
    return {label: latency_medians({"latency": c.get("runs") or []})
            for label, c in (block.get("configs") or {}).items()}


def render_first_audio(block: dict, standalone: bool = False) -> str:
    """The "Time to first audio per configuration" section (also spliced alone by `--only latency`)."""
    out: list[str] = []
    w = out.append
    w("## Time to first audio per configuration\n")
    w(block_origin(block, "latency", standalone) + f": 0.6B, {block.get('threads', 2)} threads, "
      f"{block.get('rounds')} rounds with the configurations alternating, each in its own worker. The cases are those "
      "of the headline's *Time to first audio* table (the same sentences, a new one each run); the configurations "
      "are those a user can choose with the converter's and the server's options. The first frame waits for the "
      "prefill, one code predictor call and one codec call, one after the other: the talker's quant decides how fast "
      "its prompt rows go (llama.cpp repacks q4_k_m and iq4_nl on this CPU, `talker.repack_pays`), the code "
      "predictor's precision and the codec's runtime the other two.\n")
    configs = block.get("configs") or {}
    if not configs:
        w("**Not measured.**\n")
        return "\n".join(out) + "\n"
    meds = first_audio_medians(block)
    w("| configuration (model) | " + " | ".join(f"{words}, s" for words in FIRST_AUDIO_CASES.values()) + " | bg |")
    w("|---|" + "---|" * len(FIRST_AUDIO_CASES) + "---|")
    for label, c in configs.items():
        runs = [r["cases"] for r in c.get("runs") or [] if ok_result(r)]
        cells = []
        for case in FIRST_AUDIO_CASES:
            rs = [r[case] for r in runs if case in r]
            cells.append(f"{num(mid(rs, 'first_audio_s'), 3)} ({num(low(rs, 'first_audio_s'), 3)})" if rs else "–")
        bg = fmt_background([r[case] for r in runs for case in r])
        errors = f"; {len(c['errors'])} runs failed: {c['errors'][0]}" if c.get("errors") else ""
        w(f"| {label} (`{c.get('model')}`{errors}) | " + " | ".join(cells) + f" | {bg} |")
    w("| target | " + " | ".join(fmt_goal(TTFA_TARGETS[case], 2) if case in TTFA_TARGETS else "report"
                                  for case in FIRST_AUDIO_CASES) + " | |")
    w("")
    w("Median (best) of each configuration's runs. Where the non-streaming cold case's time goes (medians, ms):\n")
    w("| configuration | prefill rows | prefill | first code predictor call | first codec call (1 frame) | rest |")
    w("|---|---|---|---|---|---|")
    for label, m in meds.items():
        cold = m.get("non-streaming/cold") or {}
        runs = [r["cases"]["non-streaming/cold"] for r in configs[label].get("runs") or []
                if ok_result(r) and "non-streaming/cold" in r.get("cases", {})]
        w(f"| {label} | {num(cold.get('prefill_rows'), 0)} | {msec(cold.get('prefill_s'))} | "
          f"{msec(cold.get('predictor_s'))} | {msec(cold.get('codec_s'))} | {msec(rest_s(runs))} |")
    w("")
    lines = [line for line in (_first_audio_target(meds, case, goal) for case, goal in TTFA_TARGETS.items()) if line]
    if lines:
        w("Against the targets (the lowest median of the configurations):\n")
        out.extend(f"- {line[0]}" for line in lines)
        w("")
    return "\n".join(out) + "\n"


def first_audio_best(meds: dict[str, dict[str, dict]], case: str) -> tuple[str | None, float | None]:
    """The configuration with the lowest median first audio in `case`, and that median."""
    figures = [(m[case]["first_audio_s"], label) for label, m in meds.items()
               if m.get(case, {}).get("first_audio_s") is not None]
    if not figures:
        return None, None
    value, label = min(figures)
    return label, value


def _first_audio_target(meds: dict, case: str, goal: float) -> tuple[str, str, float, str] | None:
    """(sentence, the configuration, its median, verdict) of the lowest median of `case` against `goal`."""
    label, value = first_audio_best(meds, case)
    if label is None:
        return None
    verdict = fmt_verdict(value, goal) + (" with that configuration" if value <= goal else "")
    return (f"{FIRST_AUDIO_CASES[case]}: {value:.3f} s with {label} against ≤ {goal:.2f} s: {verdict}", label, value,
            verdict)


def fastest_cold_words(block: dict) -> str:
    """" The fastest configuration measured, X, ..." for the non-streaming cold bound line; "" without one."""
    meds = first_audio_medians(block)
    label, value = first_audio_best(meds, "non-streaming/cold")
    if label is None:
        return ""
    cold = meds[label]["non-streaming/cold"]
    return (f" The configuration with the fastest first audio here, {label}, took {value:.3f} s: prefill "
            f"{msec(cold.get('prefill_s'))} ms, code predictor {msec(cold.get('predictor_s'))} ms, codec "
            f"{msec(cold.get('codec_s'))} ms (*Time to first audio per configuration*).")


def first_audio_targets(block: dict) -> list[str]:
    """Rows of the targets' block table from the time-to-first-audio block: per target, the lowest median
    of the configurations."""
    meds = first_audio_medians(block)
    rows = []
    for case, goal in TTFA_TARGETS.items():
        found = _first_audio_target(meds, case, goal)
        if found is None:
            continue
        _, label, value, verdict = found
        rows.append(f"| time to first audio, {FIRST_AUDIO_CASES[case]}: the fastest configuration, s | "
                    f"{fmt_goal(goal, 2)} | {value:.3f} with {label} (0.6B) | {verdict} (*Time to first audio per "
                    "configuration*) |")
    return rows
