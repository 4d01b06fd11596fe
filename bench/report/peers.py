"""The *Peer engines* section: ours beside the peer engines on PyPI, on the same random checkpoint."""

from __future__ import annotations

from bench.report.format import block_origin, fmt_background, low, mid, num


def _spread(runs: list[dict], key: str, digits: int) -> str:
    """"median (best)" of `key` over `runs` (lower is better), or "–"."""
    best = low(runs, key)
    return "–" if best is None else f"{num(mid(runs, key), digits)} ({num(best, digits)})"


def _frames(runs: list[dict], key: str) -> str:
    """The frames each run of `key` (short/long) produced: "50", or "47–50 of 50" when some stopped early."""
    got = [r[key]["frames"] for r in runs if "frames" in r.get(key, {})]
    asked = max((r[key].get("requested_frames") or 0 for r in runs if key in r), default=0)
    if not got:
        return "–"
    if min(got) == max(got) and (not asked or got[0] == asked):
        return str(got[0])
    return f"{min(got)}–{max(got)}" + (f" of {asked}" if asked else "")


def engine_row(label: str, e: dict) -> str:
    """One engine's row of a shape's table."""
    if "error" in e:
        return f"| {label} | {e.get('format', '–')} | not measured: {e['error']} | | | | | |"
    runs = [r for r in e.get("runs") or [] if "error" not in r.get("long", {}) and "error" not in r.get("short", {})]
    failed = len(e.get("runs") or []) - len(runs)
    summary = e.get("summary") or {}
    longs = [r["long"] for r in runs]
    note = f" ({failed} rounds failed)" if failed else ""
    return (f"| {label}{note} | {e.get('format', '–')} | {_spread(runs, 'rtf', 2)} | {_spread(longs, 'rtf', 2)} | "
            f"{_spread(longs, 'first_audio_s', 3)} | "
            f"{num(summary.get('peak_rss_mb'), 0)} | {_frames(runs, 'long')} / {_frames(runs, 'short')} | "
            f"{fmt_background([r[k] for r in runs for k in ('short', 'long')])} |")


def render_peers(block: dict, standalone: bool = False) -> str:
    """The "Peer engines" section (also spliced alone into an existing report by `--only peers`)."""
    out: list[str] = []
    w = out.append
    w("## Peer engines\n")
    short, long = block.get("short_frames", 2), block.get("long_frames", 50)
    load = block.get("loadavg_start") or []
    cpu = (f"on {block['cpu']}, {block.get('cores')} cores{' (virtual machine)' if block.get('hypervisor') else ''}"
           f", flags {', '.join(block.get('flags') or []) or '–'}; " if block.get("cpu") else "")
    w(block_origin(block, "peers", standalone) + f": {cpu}the same random checkpoint for every engine, "
      f"{block.get('threads', 2)} threads each, EOS suppressed, every engine loaded once in a worker of its own and "
      f"warmed up, then {block.get('rounds')} rounds in a rotating order, each engine making a {short}-frame and a "
      f"{long}-frame utterance per round (speaker ryan, English, the headline sentence, the shipped sampling "
      "defaults); before each run the harness waits for other jobs to go quiet"
      + (f" (load average {' '.join(load)} at the start, {' '.join(block.get('loadavg_end') or [])} at the end)"
         if load else "") + " (`bench/pipelines/peers.py`).\n")
    w(f"*RTF*: (wall({long}) − wall({short})) / (audio({long}) − audio({short})) of one round, inside one process: "
      "the compute time per second of audio without the fixed costs of an utterance (prefill, first chunk); "
      f"*whole {long}-frame RTF*: the wall time of the {long}-frame utterance over its audio; *first audio*: when "
      f"the {long}-frame utterance's first chunk reached the caller, warm; *peak RSS*: the worker's high-water mark "
      "over the whole block (the engine's own memory: each runs alone in its process); *frames*: what each "
      f"{long}- / {short}-frame request produced (fewer: the engine stopped early; its RTF is then per produced "
      "frame); *bg*: the share of all CPUs other processes used during the runs (median). Median (best) over the "
      "rounds." + (f" The block took {block['wall_s'] / 60:.1f} min." if block.get("wall_s") else "") + "\n")
    peers = block.get("peers") or {}
    if peers:
        w("Versions and formats:\n")
        for key, p in peers.items():
            env = f"; run with {', '.join(f'`{k}={v}`' for k, v in p['env'].items())}" if p.get("env") else ""
            w(f"- **{p['engine']}**: PyPI `{p['package']}=={p['version']}` ({p.get('what', '')}), installed by the "
              f"bench into a venv of its own (`bench/cache/peers-venv-{key}`){env}. Model: "
              f"{p.get('model_format') or '–'}.")
        w("")
    shapes = block.get("shapes") or {}
    if not shapes:
        w(f"**Not measured**: {block.get('error', 'no shape ran')}.\n")
        return "\n".join(out) + "\n"
    for shape, res in shapes.items():
        w(f"**{shape}**\n")
        engines = res.get("engines") or {}
        w(f"| engine | format | RTF | whole {long}-frame RTF | first audio, s | peak RSS, MiB | frames | bg |")
        w("|---|---|---|---|---|---|---|---|")
        for label, e in engines.items():
            w(engine_row(label, e))
        w("")
        models = [f"{label}: {e['how']} → `{e['model']}`" + (f" ({e['convert_s']:.0f} s)" if e.get("convert_s") else "")
                  for label, e in engines.items() if e.get("how")]
        if models:
            w("Models: " + "; ".join(models) + ".\n")
        natives = {e["summary"].get("native") for e in engines.values()
                   if e.get("kind") == "peer" and isinstance(e.get("summary"), dict) and e["summary"].get("native")}
        if natives:
            w(f"Native versions reported at load: {', '.join(sorted(map(str, natives)))}.\n")
    w("Caveats. **qwentts.cpp**: the wheel packages only the loader (it downloads converted files from a model hub), "
      "so the bench writes its GGUF layout itself (`bench/pipelines/qwentts_cpp_files.py`: the upstream converter's "
      "tensor names, keys and quantization policy: Q8_0 wherever rows split into blocks, conv kernels F16, RVQ and "
      "1-D tensors F32); its EOS is suppressed by an EOS id out of the sampler's reach in that file (it has no "
      "option for it); it feeds the text one token per frame (the official streaming layout) and allocates a "
      "4096-position KV cache at load, which its peak RSS includes. **vox-tts**: converted by its own "
      "`python -m vox.build`; EOS suppressed by its `VOX_DEBUG_NO_EOS=1`, the count set by `max_frames`; it hands "
      "audio over in chunks of 4 frames (its default `chunk_frames`), so its first audio waits for 4 frames where "
      "ours and qwentts.cpp hand over the first frame. **Ours**: the whole text in the prompt (non-streaming "
      "layout, a longer prefill than a per-frame text feed), the voice's prompt prefix kept prefilled between "
      "utterances (its default prefix cache; the text rows are prefilled every time), the first chunk one frame, "
      "KV cells for 8 streams (the default `max_streams`) in its peak RSS. Random weights: the speed "
      "is that of real checkpoints, the audio is noise.\n")
    return "\n".join(out) + "\n"
