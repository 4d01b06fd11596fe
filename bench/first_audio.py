"""The time-to-first-audio block: the same five cases as each headline's *Time to first audio* table, for
the configurations a user can choose, side by side (`python -m bench --only latency`).

The first frame waits for the prefill, one code predictor call and one codec call, one after the other, so
the configurations differ where those three differ: the talker's quant (its prompt rows take the kernel
path of its format: repacked iq4_nl and q4_k_m against q8_0), the code predictor's precision and the codec's
runtime. Each configuration runs in a worker of its own; their rounds alternate, so they share the
background load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3_tts_gguf.convert.presets import PRESETS

from bench.common import wait_for_quiet


@dataclass(frozen=True)
class Config:
    """One configuration: the converted model's talker quant and code predictor precision, and engine
    settings (EngineSettings fields)."""

    label: str  # markdown: the options that select it
    quant: str
    cp: str
    engine: dict = field(default_factory=dict)


_DEFAULT, _FAST = PRESETS["default"], PRESETS["fast"]
CONFIGS = (
    Config(f"default (talker {_DEFAULT.quant}, code predictor {_DEFAULT.cp_precision})", _DEFAULT.quant,
           _DEFAULT.cp_precision),
    Config(f"`--preset fast` (talker {_FAST.quant}, code predictor {_FAST.cp_precision})", _FAST.quant,
           _FAST.cp_precision),
    Config("`--preset fast`, `--codec-runtime openvino`", _FAST.quant, _FAST.cp_precision,
           {"codec_runtime": "openvino"}),
    Config(f"`--preset fast --quant iq4_nl` (talker iq4_nl, code predictor {_FAST.cp_precision}), "
           "`--codec-runtime openvino`", "iq4_nl", _FAST.cp_precision, {"codec_runtime": "openvino"}),
)
ROUNDS = 5
WARMUP_FRAMES = 4


def measure(progress, threads: int, quiet_s: float, model_dir, rounds: int = ROUNDS,
            configs: tuple[Config, ...] = CONFIGS) -> dict:
    """Each configuration's time-to-first-audio runs (OursSession.latency), rounds alternating.
    `model_dir(quant, cp)`: the converted 0.6B folder of that pair. Returns {"threads", "rounds",
    "configs": {label: {"model", "quant", "cp", "engine", "runs", "errors"}}}."""
    from bench.session import Session

    sessions, out = {}, {}
    for c in configs:
        folder = model_dir(c.quant, c.cp)
        progress.bar.set_postfix_str(f"load: {c.quant} + {c.cp}")
        sessions[c.label] = Session(progress, c.label, "ours", dict(
            model_dir=str(folder), threads=threads, frames=WARMUP_FRAMES, warmup_frames=WARMUP_FRAMES,
            concurrency_frames=WARMUP_FRAMES, engine=c.engine))
        out[c.label] = {"model": folder.name, "quant": c.quant, "cp": c.cp, "engine": c.engine, "runs": [],
                        "errors": []}
    try:
        for r in range(rounds):
            for label, s in sessions.items():
                progress.bar.set_postfix_str(f"round {r + 1}/{rounds}: {label[:40]}")
                wait_for_quiet(quiet_s)
                res = s.call(op="latency", rep=r)
                (out[label]["errors"] if "error" in res else out[label]["runs"]).append(res.get("error", res))
    finally:
        for s in sessions.values():
            s.close()
    return {"threads": threads, "rounds": rounds, "configs": out}
