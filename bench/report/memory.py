"""The *Memory* section: resident memory per part of a model and the peak with eight streams, per KV cache,
and the other models and configurations measured the same way."""

from __future__ import annotations

from qwen3_tts_gguf.model.settings import KV_CELLS_PER_STREAM

from bench.report.format import block_origin, ok_result
from bench.report.goals import MEMORY_TARGET_MB

MEMORY_PARTS = {"runtimes": "Python, numpy, ONNX Runtime, llama.cpp loaded", "tokenizer_tables":
                "tokenizer, text tables (memory-mapped; the projection's f32 weights)", "talker":
                "talker: weights (memory-mapped) + KV cache", "code_predictor": "code predictor graph",
                "codec": "codec decoder graph"}


def lowest_peak(kvs: dict) -> tuple[str | None, float | None]:
    """The KV cache whose 8-stream peak RSS (MiB) is the lowest among the memory block's `kvs`, and that peak."""
    if not kvs:
        return None, None
    kv = min(kvs, key=lambda k: kvs[k]["peak"]["peak_mb"])
    return kv, kvs[kv]["peak"]["peak_mb"]


def lean_memory(mem: dict) -> tuple[str, str, str, float] | None:
    """The memory block's other 0.6B configuration with the lowest 8-stream peak: (label, model, KV cache,
    peak MiB), or None."""
    found = []
    for label, block in (mem.get("shapes") or {}).items():
        if not label.startswith("0.6b "):
            continue
        for kv, entry in block.get("kv", {}).items():
            if ok_result(entry.get("peak")):
                found.append((label, block.get("model", "?"), kv, entry["peak"]["peak_mb"]))
    return min(found, key=lambda f: f[3]) if found else None


def config_words(label: str) -> str:
    """"0.6b --preset fast" -> "`--preset fast`"."""
    return f"`{label.split(' ', 1)[1]}`"


def render_memory(mem: dict, standalone: bool = False) -> str:
    """The "Memory" section (also spliced alone into an existing report by `--only memory`)."""
    out: list[str] = []
    w = out.append
    w("## Memory\n")
    w(block_origin(mem, "memory", standalone)
      + f", model `{mem.get('model', '?')}`, {mem.get('threads', 2)} threads.\n")
    kvs = {k: v for k, v in mem.get("kv", {}).items() if ok_result(v.get("parts")) and ok_result(v.get("peak"))}
    if not kvs:
        w("**Not measured** (the workers failed; see the bench's output).\n")
        return "\n".join(out) + "\n"
    w("Resident memory (RSS) as each part is loaded, in the engine's order, each KV-cache precision in a fresh "
      "process; then the peak of the engine as `serve` runs it (`max_streams` 8) with eight streams at once. "
      "MiB.\n")
    names = list(kvs)
    w("| part | " + " | ".join(f"KV cache {k}" for k in names) + " |")
    w("|---|" + "---|" * len(names))
    for part, what in MEMORY_PARTS.items():
        w(f"| {what} | " + " | ".join(f"{kvs[k]['parts']['shares_mb'].get(part, 0):.0f}" for k in names) + " |")
    w("| of which the KV cache (computed: cells x layers x K,V x heads x width) | "
      + " | ".join(f"{kvs[k]['parts']['kv_cache_mb']:.0f} ({kvs[k]['parts']['n_ctx']} cells)" for k in names) + " |")
    w("| **loaded** | " + " | ".join(f"**{kvs[k]['parts']['loaded_mb']:.0f}**" for k in names) + " |")
    w(f"| **peak, {kvs[names[0]]['peak']['streams']} streams** | "
      + " | ".join(f"**{kvs[k]['peak']['peak_mb']:.0f}**" for k in names) + " |")
    if all(kvs[k]["parts"].get("loaded_file_mb") is not None and kvs[k]["peak"].get("after_file_mb") is not None
           for k in names):
        w("| of which pages of memory-mapped files, loaded / after the streams (clean: the kernel may drop and "
          "read them again; shared by processes mapping the same files) | "
          + " | ".join(f"{kvs[k]['parts']['loaded_file_mb']:.0f} / {kvs[k]['peak']['after_file_mb']:.0f}"
                       for k in names) + " |")
    files = kvs[names[0]]["parts"].get("files_mb", {})
    w("")
    w("Files on disk: " + ", ".join(f"{n} {mb:.0f}" for n, mb in sorted(files.items())) + " MiB.\n")
    best_kv, best = lowest_peak(kvs)
    weights = sum(mb for n, mb in files.items() if not n.startswith("text_tables"))
    verdict = "reached" if best <= MEMORY_TARGET_MB else "not reached"
    lean = lean_memory(mem)
    if lean and best > MEMORY_TARGET_MB:
        label, model, lean_kv, lean_peak = lean
        lean_verdict = "reached" if lean_peak <= MEMORY_TARGET_MB else "not reached"
        w(f"Target: peak ≤ {MEMORY_TARGET_MB} MiB for up to 8 streams: **{lean_verdict} with {config_words(label)} "
          f"and KV cache {lean_kv}** ({lean_peak:.0f} MiB, `{model}`, in the table below); with the default "
          f"weights **{verdict}** ({best:.0f} MiB, KV cache {best_kv}).\n")
    else:
        w(f"Target: peak ≤ {MEMORY_TARGET_MB} MiB for up to 8 streams: **{verdict}** ({best:.0f} MiB, KV cache "
          f"{best_kv}).\n")
    if best > MEMORY_TARGET_MB:
        w(f"Where the default configuration's memory goes: the three graphs' weights alone take {weights:.0f} MiB "
          "(talker q8_0, code predictor int8, codec fp32); the code predictor's resident share is ONNX Runtime's "
          "packed copy of its weights (its kernels need the packing: without it one frame took 30x longer), its "
          "embedding tables (float16 in a quantized graph) stay in the mapped file and come in as frames read "
          "them, the codec reads its fp32 weights at every call (and holds activations that grow with the frames "
          "of a call: `codec.MAX_CALL_FRAMES` bounds a call, and blocks of 1 MiB and more go back to the system "
          "when freed: `--heap-map-threshold`), and the KV cache holds "
          f"{kvs[names[0]]['parts']['n_ctx']} cells for all streams ({KV_CELLS_PER_STREAM} per stream unless "
          "`--n-ctx` says).\n")
    _render_other_shapes(w, mem.get("shapes") or {})
    return "\n".join(out) + "\n"


def _render_other_shapes(w, shapes: dict) -> None:
    """The memory block's other models and configurations: one row each, with its KV cache."""
    rows = []
    for shape, block in shapes.items():
        kv, entry = next(iter(block.get("kv", {}).items()), (None, {}))
        parts, peak = entry.get("parts", {}), entry.get("peak", {})
        if not (ok_result(parts) and ok_result(peak)):
            rows.append(f"| {shape} | {kv} | not measured | | | | | |")
            continue
        shares = parts["shares_mb"]
        graphs = sum(mb for n, mb in parts.get("files_mb", {}).items() if not n.startswith("text_tables"))
        rows.append(f"| {shape} (`{block.get('model', '?')}`) | {kv} | {shares.get('talker', 0):.0f} "
                    f"(KV {parts['kv_cache_mb']:.0f}) | {shares.get('code_predictor', 0):.0f} | "
                    f"{shares.get('codec', 0):.0f} | {parts['loaded_mb']:.0f} | **{peak['peak_mb']:.0f}** | "
                    f"{graphs:.0f} |")
    if rows:
        w("Other models and configurations, measured the same way (MiB):\n")
        w("| model | KV cache | talker (of which KV cache) | code predictor | codec | loaded | peak, 8 streams "
          "| the three graphs' files |")
        w("|---|---|---|---|---|---|---|---|")
        for row in rows:
            w(row)
        w("")
