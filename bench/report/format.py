"""How the report writes a figure: numbers with their units, ratios, verdicts against a goal, a configuration's
key and words, and the line that dates a block that may run alone."""

from __future__ import annotations

from qwen3_tts_gguf.convert.presets import PRESETS

from bench.common import median


def num(x, digits: int = 0, unit: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and digits == 0 and abs(x) < 10:
        digits = 1
    return f"{x:,.{digits}f}{unit}"


def msec(x) -> str:
    return "–" if x is None else num(1e3 * x)


def _vals(runs: list, key: str) -> list:
    return [r.get(key) for r in runs if r.get(key) is not None]


def mid(runs, key):
    return median(_vals(runs, key))


def low(runs, key):
    v = _vals(runs, key)
    return min(v) if v else None


def gib(x) -> str:
    return "–" if x is None else f"{x / 1024:.2f} GB"


def fmt_bytes(nbytes) -> str:
    return f"{nbytes / 1e9:.3f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def fmt_ratio(a, b, digits: int = 1) -> str:
    if not a or not b:
        return "–"
    return f"{a / b:.{digits}f}×"


def fmt_share(values) -> str:
    """The median of shares (0..1) as a percentage, or "–"."""
    m = median(values)
    return "–" if m is None else f"{100 * m:.0f} %"


def fmt_background(runs) -> str:
    return fmt_share(_vals(runs, "background"))


def ok_result(r) -> bool:
    return isinstance(r, dict) and "error" not in r


def split_config(key: str) -> tuple[str, str, str]:
    """'q8_0+int8/t2' -> ('q8_0', 'int8', '2')"""
    qc, t = key.split("/t")
    q, _, cp = qc.partition("+")
    return q, cp or "fp32", t


def fmt_goal(value: float, digits: int = 1, unit: str = "") -> str:
    return f"≤ {value:.{digits}f}{unit}"


def fmt_verdict(value, goal) -> str:
    if value is None:
        return "not measured"
    return "**reached**" if value <= goal else "**not reached**"


def preset_words(name: str) -> str:
    """'fast' -> 'talker q4_k_m, code predictor int4'"""
    return f"talker {PRESETS[name].quant}, code predictor {PRESETS[name].cp_precision}"


def block_origin(block: dict, name: str, standalone: bool) -> str:
    """"Measured on DATE at commit C[ by `python -m bench --only NAME`; ...]" for a block that may run alone."""
    return (f"Measured on {block.get('date', '?')} at commit `{block.get('commit', '?')}`"
            + (f" (+{block['dirty_files']} modified tracked files)" if block.get("dirty_files") else "")
            + (f" by `python -m bench --only {name}`; the rest of this page comes from the run named at its top"
               if standalone else ""))
