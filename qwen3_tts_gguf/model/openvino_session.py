"""The codec graph on OpenVINO's CPU runtime instead of ONNX Runtime (`--codec-runtime openvino`).

The same ONNX file, compiled by OpenVINO (oneDNN kernels): its convolutions are faster on x86 than
ONNX Runtime's and its chains of elementwise ops (the Snakes) run fused. 0.6B codec, 2 cores, 48 frames
in the engine's chunks (`python -m bench --only codec`, 2026-12-02 01:33, 01:44, 01:47, and the full
bench at 04:16): 0.84, 0.87, 0.77 and 0.76 of ONNX Runtime's time per frame, samples within fp32
rounding of ONNX Runtime's (SNR 80 dB). The price is memory: the compiled graph keeps its own copies
of the weights in the layouts its kernels want (the engine's peak after eight streams, 0.6B, side by
side in docs/benchmarks.md's Codec overlap, 2026-12-02 10:09: 1932 -> 2044 MiB, at 04:39 1925 -> 2055;
compiled from the ONNX file before the cache below, 1922 -> 2459 at 04:09 and 1932 -> 2893 at 01:38).
Opt-in, CPU only, never in the parity profile (`--deterministic` keeps ONNX Runtime's exact path).

Precision is pinned to f32: on CPUs with AVX-512 BF16 or AMX, OpenVINO's default is bf16, which the
codec does not survive (SNR 24 dB on random weights).

Most of that memory was a copy: compiled from the ONNX file, the graph keeps the file's weights as
read besides its own reordered ones. Compiled from OpenVINO's model cache (a `.openvino/` folder in
the model folder), the cached blob's weights are mapped from the file instead, and once a call of a
new shape has reordered what it needs, those pages go back (madvise): 0.6B codec alone, after calls
of 1-9 frames, 1230 MiB -> about 600 MiB of anonymous memory (2026-12-02, /proc/self/status). A
child process fills the cache on the first start, so this process never holds the copy either, and
drops the blobs another OpenVINO or an earlier version of the file left; a model folder it cannot
write to compiles from the ONNX file as before (a warning says so).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from qwen3_tts_gguf.data_dirs import PROJECT_ROOT  # where the cache-filling child imports this package from
from qwen3_tts_gguf.model.stage_runtimes import CODEC_RUNTIMES, CodecRuntimeError  # noqa: F401 (CodecRuntimeError: its home for callers)

log = logging.getLogger("qwen3_tts_gguf.model.openvino_session")

def openvino_installed() -> bool:
    return importlib.util.find_spec("openvino") is not None


def openvino_version() -> str | None:
    """The installed OpenVINO's version ("2026.4.1"), None when it is not installed."""
    if not openvino_installed():
        return None
    import openvino

    return openvino.__version__.split("-")[0]


def check_codec_runtime(runtime: str, device: str = "cpu", deterministic: bool = False) -> str:
    """CodecRuntimeError when `runtime` cannot run here with these settings; else a few words for the
    start-up plan ("" for ONNX Runtime, which `--device` already describes)."""
    if runtime not in CODEC_RUNTIMES:
        raise CodecRuntimeError(f"--codec-runtime {runtime!r}: expected one of {', '.join(CODEC_RUNTIMES)}")
    if runtime != "openvino":  # the others' checks: model/stage_runtimes.py
        return ""
    version = openvino_version()
    if version is None:
        raise CodecRuntimeError("--codec-runtime openvino: the openvino package is not installed "
                                "(pip install openvino; docs/benchmarks.md, Codec precision)")
    if device != "cpu":
        raise CodecRuntimeError(f"--codec-runtime openvino runs the codec on the CPU; --device {device} asks "
                                "ONNX Runtime for another device: drop one of them")
    if deterministic:
        raise CodecRuntimeError("--codec-runtime openvino is not bit-exact; --deterministic (the parity profile) "
                                "keeps ONNX Runtime's codec")
    return f"codec on OpenVINO {version} (CPU, f32)"


CACHE_FOLDER = ".openvino"
"""OpenVINO's model cache, in the model folder beside the graph it compiles (hidden: never a file of the
model's manifest)."""


def _graph_metadata(model) -> dict[str, str]:
    """An OpenVINO model's ONNX metadata_props (its reader keeps them in rt_info["framework"])."""
    return {key: value.astype(str) for key, value in model.get_rt_info()["framework"].items()}


def fill_cache_child(path: str, config_json: str, cache: str) -> None:
    """The child process that fills the cache (`_fill_cache`): compiles `path` with the config into
    `cache` and prints the graph's metadata (the compiled model imported from the cache carries none)."""
    import openvino as ov

    core = ov.Core()
    metadata = _graph_metadata(core.read_model(path))
    core.compile_model(path, "CPU", dict(json.loads(config_json), CACHE_DIR=cache))
    print(json.dumps(metadata))


_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
          "from qwen3_tts_gguf.model.openvino_session import fill_cache_child; fill_cache_child(*sys.argv[2:])")

_MADV_PAGEOUT = 21  # Linux 5.4+: drop these pages of the mapping (file pages are read again when touched)


def _config(threads: int, streams: int, precision: str) -> dict:
    return {
        "INFERENCE_PRECISION_HINT": precision,  # f32 in the engine (module docstring); bf16 only in the bench
        "INFERENCE_NUM_THREADS": threads * streams,  # OpenVINO counts the threads of all its streams
        "NUM_STREAMS": streams,
        "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_CPU_PINNING": False,  # the cores are shared with llama.cpp and the code predictor
    }


def _writable_cache(graph: Path) -> Path | None:
    """The cache folder beside `graph`, created if need be; None where it cannot be made or written
    (a read-only model folder)."""
    cache = graph.parent / CACHE_FOLDER
    try:
        cache.mkdir(exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            pass
        return cache
    except OSError:
        return None


def _identity(graph: Path) -> list:
    """What names this graph file's contents: its path, size and time."""
    st = graph.stat()
    return [str(graph.resolve()), st.st_size, st.st_mtime_ns]


def _stamp(graph: Path, config: dict) -> str:
    """A name for this graph file compiled with `config` by this OpenVINO."""
    key = json.dumps([_identity(graph), openvino_version(), config], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _fill_cache(graph: Path, cache: Path, config: dict, ready: Path) -> dict[str, str] | None:
    """Compile `graph` in a child process, which leaves OpenVINO's blob in `cache`, and write `ready`:
    the graph's metadata, and what the blob was made from; the metadata, or None when the child
    failed. The blob is written in a folder of its own and moved into `cache` whole. Then the blobs
    of another OpenVINO or of an earlier version of the file go (`_drop_stale`)."""
    work = Path(tempfile.mkdtemp(prefix=".fill-", dir=cache))
    try:
        child = [sys.executable, "-c", _CHILD, str(PROJECT_ROOT), str(graph), json.dumps(config), str(work)]
        done = subprocess.run(child, capture_output=True, text=True, timeout=900, check=True)
        metadata = json.loads(done.stdout.strip().splitlines()[-1])
        blobs = []
        for blob in work.iterdir():
            with open(blob, "rb") as f:  # on disk before it has its name, and its pages clean (droppable)
                os.fsync(f.fileno())
            os.replace(blob, cache / blob.name)
            blobs.append(blob.name)
        part = work / ready.name  # written in this fill's own folder, like the blobs: no other fill writes there
        part.write_text(json.dumps({"graph": _identity(graph), "openvino": openvino_version(), "config": config,
                                    "blobs": blobs, "metadata": metadata}))
        os.replace(part, ready)
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or ""
        log.warning("OpenVINO's cache for %s could not be filled (%s%s); compiling from the file, which holds "
                    "more memory", graph, e, f": {detail.strip().splitlines()[-1]}" if detail.strip() else "")
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _drop_stale(graph, cache)
    return metadata


def _read_stamp(path: Path) -> dict | None:
    try:
        stamp = json.loads(path.read_text())
        return stamp if isinstance(stamp, dict) and isinstance(stamp.get("metadata"), dict) else None
    except (OSError, ValueError):
        return None


def _drop_stale(graph: Path, cache: Path) -> None:
    """Remove the stamps in `cache` made by another OpenVINO or from another version of `graph`, and
    their blobs (unless a stamp kept names them too): a cache never holds more than the blobs of the
    configurations this file and this OpenVINO were compiled with."""
    current, version = _identity(graph), openvino_version()
    stamps = {p: _read_stamp(p) for p in cache.glob("*.json")}
    stale = {p for p, st in stamps.items() if st is None or st.get("openvino") != version or st.get("graph") != current}
    kept = {name for p, st in stamps.items() if p not in stale for name in st.get("blobs", [])}
    for p in stale:
        for name in (stamps[p] or {}).get("blobs", []):
            if name not in kept and "/" not in name:
                (cache / name).unlink(missing_ok=True)
        p.unlink(missing_ok=True)


def _page_out(path_part: str) -> None:
    """Give back the resident pages of this process's read-only mappings of files whose path contains
    `path_part` (the cached blob's weights): the kernel reads them again if they are touched."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and path_part in fields[5] and "w" not in fields[1]:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    libc.madvise(start, end - start, _MADV_PAGEOUT)
    except (OSError, AttributeError, ValueError):
        pass  # not Linux, or no madvise: the pages stay until the kernel needs them


class OpenVINOSession:
    """An ONNX graph compiled by OpenVINO for the CPU, called like an ONNX Runtime session
    (`run(output_names, feeds)`). `threads` per call; `streams` calls may run at once (one infer
    request per calling thread), as the engine's codec lanes do. `metadata`: the file's
    metadata_props (ONNX Runtime's custom_metadata_map). It compiles through OpenVINO's model cache
    beside the graph where it can (module docstring), else from the file."""

    def __init__(self, path: str | Path, *, threads: int, streams: int = 1, precision: str = "f32"):
        import openvino as ov

        path = Path(path)
        config = _config(threads, streams, precision)
        core = ov.Core()
        folder = _writable_cache(path)
        metadata = None
        if folder is not None:
            ready = folder / f"{_stamp(path, config)}.json"
            stamp = _read_stamp(ready)
            metadata = stamp["metadata"] if stamp else _fill_cache(path, folder, config, ready)
        else:
            log.warning("%s cannot hold OpenVINO's cache (%s; read-only?): the codec on OpenVINO compiles from "
                        "the file and holds more memory", path.parent, CACHE_FOLDER)
        if metadata is not None:
            self._cache: Path | None = folder
            self.metadata: dict[str, str] = metadata
            self._compiled = core.compile_model(str(path), "CPU", dict(config, CACHE_DIR=str(folder)))
        else:
            self._cache = None
            model = core.read_model(str(path))
            self.metadata = _graph_metadata(model)
            self._compiled = core.compile_model(model, "CPU", config)
            del model  # the compiled model has what it needs
        self._port = {}  # output name -> index in the compiled model's outputs
        for i, port in enumerate(self._compiled.outputs):
            for name in port.get_names():
                self._port[name] = i
        self._local = threading.local()
        self._shapes: set[tuple] = set()  # input shapes called with: a new one reorders weights
        self._shapes_lock = threading.Lock()
        self._page_out()

    def _page_out(self) -> None:
        if self._cache is not None:
            _page_out(str(self._cache.resolve()))

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request = getattr(self._local, "request", None)
        if request is None:  # an infer request is not thread-safe: one per calling thread
            request = self._local.request = self._compiled.create_infer_request()
        request.infer(feeds)
        # copies: the request reuses its output buffers on the next call
        out = [np.array(request.get_output_tensor(self._port[name]).data) for name in output_names]
        if self._cache is not None:
            shape = tuple(np.shape(v) for v in feeds.values())
            with self._shapes_lock:
                new = shape not in self._shapes
                self._shapes.add(shape)
            if new:  # its first call read weights from the blob to reorder them: give those pages back
                self._page_out()
        return out
