"""The peer engines on PyPI beside ours, on the same random checkpoint (`python -m bench --only peers`).

Peers: qwentts.cpp through `realtimetts-qwen-native-cpu` (ctypes over libqwen + ggml) and vox-tts (C++ with
kernels of its own). Each is pip-installed at its pinned version into a venv of its own under bench/cache/
(`peers-venv-NAME`, reused while the version matches), so the project's .venv is untouched, and runs in a
`bench.worker` session started with that venv's interpreter (this module's worker side needs only the standard
library, numpy and the peer's package). Models: vox-tts converts the checkpoint with its own converter
(`python -m vox.build`, in its venv); the qwentts.cpp wheel packages no converter, so `qwentts_cpp_files` writes its
GGUF layout.

Protocol, for every engine alike: 2 threads, EOS suppressed (ours `ignore_eos`; qwentts.cpp an EOS id out of the
sampler's reach in its GGUF; vox-tts `VOX_DEBUG_NO_EOS=1`), each engine loaded once and warmed up, then ROUNDS
rounds in a rotating order; in each round every engine makes a SHORT-frame and a LONG-frame utterance. The RTF
of a round is (wall(LONG) - wall(SHORT)) / (audio(LONG) - audio(SHORT)): the cost of a second of audio without
the per-utterance fixed costs; first audio is the first chunk of the LONG run, measured where the chunk is
handed to the caller; peak RSS is the worker's high-water mark. Frames are counted from the audio each engine
returned, so an engine that stopped early shows it (the RTF is per produced frame in any case).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    CACHE,
    LANGUAGE,
    ROOT,
    SAMPLE_RATE,
    SPEAKER,
    TEXT,
    Meter,
    peak_rss_mb,
    rss_mb,
    wait_for_quiet,
)

SHORT, LONG, ROUNDS, WARMUP = 2, 50, 3, 4
SAMPLES_PER_FRAME = 1920
VOX_DTYPE = "f16"  # the dtype vox.build's own example pairs with --quant
SAMPLING = dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)  # the shipped defaults, ours too


@dataclass(frozen=True)
class Peer:
    """A peer engine on PyPI: its package at the pinned version, the formats the block runs, its worker env."""

    key: str
    engine: str
    package: str
    version: str
    module: str
    formats: tuple[str, ...]
    env: dict = field(default_factory=dict)
    what: str = ""
    model_format: str = ""


PEERS = (
    Peer("qwentts", "qwentts.cpp", "realtimetts-qwen-native-cpu", "0.4.2", "qwentts_cpp_cpu", ("Q8_0",),
         what="ctypes over libqwen + ggml; the CPU wheel: AVX2 kernels, no OpenMP",
         model_format="two GGUF files (talker + code predictor; codec), Q8_0, its wrapper's default quant"),
    Peer("vox", "vox-tts", "vox-tts", "0.19.5", "vox", ("q8", "q4"), {"VOX_DEBUG_NO_EOS": "1"},
         what="C++ with kernels of its own",
         model_format=f"one `.tmod` each: q8 (every linear layer of talker and code predictor 8-bit) and q4 (the "
                      f"talker's attention and MLP 4-bit, the rest 8-bit), other weights {VOX_DTYPE}, codec f32"),
)


class PeerError(RuntimeError):
    """A peer that cannot be installed or converted here; the block reports the reason."""


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])[:400]


def venv_python(peer: Peer) -> Path:
    return CACHE / f"peers-venv-{peer.key}" / "bin" / "python"


def installed_version(python: Path, package: str) -> str | None:
    """The version of `package` in the venv of `python`, or None."""
    if not python.exists():
        return None
    r = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                       capture_output=True, text=True, timeout=120, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_venv(peer: Peer, log=print) -> Path:
    """The interpreter of the peer's venv with `package==version` installed (created, or re-created when another
    version is there)."""
    python = venv_python(peer)
    if installed_version(python, peer.package) == peer.version:
        return python
    folder = python.parent.parent
    log(f"installing {peer.package}=={peer.version} into {_shown(folder)}")
    shutil.rmtree(folder, ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "venv", str(folder)], capture_output=True, text=True, timeout=600,
                       check=False)
    if r.returncode != 0:
        raise PeerError(f"`python -m venv` failed: {_tail(r.stderr)}")
    r = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        f"{peer.package}=={peer.version}"], capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        raise PeerError(f"`pip install {peer.package}=={peer.version}` failed: {_tail(r.stderr or r.stdout)}")
    return python


def _shown(path: Path) -> str:
    """`path` relative to the checkout where it is inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def _writer_digest() -> str:
    return hashlib.sha256((Path(__file__).parent / "qwentts_cpp_files.py").read_bytes()).hexdigest()[:10]


def model_folder(peer: Peer, fmt: str, checkpoint: Path) -> Path:
    """Where the peer's model of `checkpoint` in `fmt` is cached (the checkpoint's folder name carries its digest)."""
    tail = f"-{_writer_digest()}" if peer.key == "qwentts" else ""
    return CACHE / "peers" / f"{checkpoint.name}-{peer.key}-{peer.version}-{fmt}{tail}"


def vox_build_command(python: Path, checkpoint: Path, fmt: str, out: Path) -> list[str]:
    """vox-tts's converter: the checkpoint folder -> one .tmod (`--no-hash`: no sha256 of the weights, which only
    lets saved voices recognise the model)."""
    return [str(python), "-m", "vox.build", "--model", str(checkpoint), "--dtype", VOX_DTYPE, "--quant", fmt,
            "--no-hash", "-o", str(out)]


def ensure_model(peer: Peer, fmt: str, checkpoint: Path, python: Path, log=print) -> dict:
    """The peer's model files of `checkpoint` in `fmt` ({"files": {...}, "how": words, "convert_s": ...}), converted
    once into bench/cache/peers/."""
    folder = model_folder(peer, fmt, checkpoint)
    names = {"talker": "talker.gguf", "codec": "codec.gguf"} if peer.key == "qwentts" else {"tmod": "model.tmod"}
    files = {k: str(folder / v) for k, v in names.items()}
    how = (f"`bench/pipelines/qwentts_cpp_files.py` (talker + codec GGUF, {fmt}, EOS id out of reach)"
           if peer.key == "qwentts" else
           f"`python -m vox.build --dtype {VOX_DTYPE} --quant {fmt} --no-hash` (vox-tts {peer.version})")
    done = folder / "done"
    if done.exists():
        return {"files": files, "how": how, "convert_s": float(done.read_text() or 0)}
    for stale in (CACHE / "peers").glob(f"{checkpoint.name.rsplit('-', 1)[0]}-*-{peer.key}-*-{fmt}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = folder.with_name(folder.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log(f"converting {checkpoint.name} for {peer.engine} ({fmt})")
    t0 = time.perf_counter()
    try:
        if peer.key == "qwentts":
            from bench.pipelines.qwentts_cpp_files import write_codec, write_talker

            write_codec(checkpoint, tmp / names["codec"], fmt)
            write_talker(checkpoint, tmp / names["talker"], fmt, suppress_eos=True)
        else:
            r = subprocess.run(vox_build_command(python, checkpoint, fmt, tmp / names["tmod"]), capture_output=True,
                               text=True, timeout=3600, check=False)
            if r.returncode != 0:
                raise PeerError(f"`python -m vox.build` failed: {_tail(r.stderr or r.stdout)}")
    except PeerError:
        raise
    except Exception as e:  # the converter's own failure: reported, not fatal
        raise PeerError(f"conversion failed: {type(e).__name__}: {e}"[:400]) from e
    seconds = time.perf_counter() - t0
    (tmp / "done").write_text(f"{seconds:.1f}")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return {"files": files, "how": how, "convert_s": seconds}


# -- worker side (runs in the peer's venv: standard library, numpy and the peer's package only) -----------------


class PeerSession:
    """One peer engine loaded in a `bench.worker` session: `single(rep, frames)` makes one utterance."""

    def __init__(self, peer: str, fmt: str, files: dict, threads: int, warmup_frames: int = WARMUP, progress=None):
        self.peer, self.fmt, self.threads = peer, fmt, threads
        self.progress = progress or (lambda m: None)
        t0 = time.perf_counter()
        if peer == "qwentts":
            import qwentts_cpp_cpu

            self.version = qwentts_cpp_cpu.__version__
            self.native = qwentts_cpp_cpu.QwenLibrary().version()
            self.tts = qwentts_cpp_cpu.QwenTTS(files["talker"], files["codec"], cpu_threads=threads)
        elif peer == "vox":
            import vox

            self.version = self.native = vox.__version__
            self.tts = vox.Engine(files["tmod"], device="cpu", threads=threads)
            self.voice = self.tts.speaker_voice(SPEAKER)
        else:
            raise ValueError(f"unknown peer {peer!r}")
        self.load_s = time.perf_counter() - t0
        self.rss_loaded = rss_mb()
        self.progress(f"{peer}: warm-up")
        self.warmup = self.single(-1, warmup_frames)

    def _chunks(self, frames: int, seed: int):
        if self.peer == "qwentts":
            for chunk, _ in self.tts.stream(text=TEXT, lang=LANGUAGE, speaker=SPEAKER, seed=seed,
                                            max_new_tokens=frames, **SAMPLING):
                yield chunk
        else:
            yield from self.tts.stream(TEXT, self.voice, max_frames=frames, seed=seed, language=LANGUAGE,
                                       sub_temperature=SAMPLING["temperature"], sub_top_k=SAMPLING["top_k"],
                                       sub_top_p=SAMPLING["top_p"], **SAMPLING)

    def single(self, rep: int, frames: int | None = None) -> dict:
        frames = frames or LONG
        self.progress(f"{self.peer} {self.fmt}: {frames} frames, run {rep + 1}")
        first, samples, chunks = None, 0, 0
        with Meter() as m:
            start = time.perf_counter()
            for chunk in self._chunks(frames, rep + 1):
                first = time.perf_counter() - start if first is None else first
                samples += len(chunk)
                chunks += 1
        audio_s = samples / SAMPLE_RATE
        return {"frames": samples // SAMPLES_PER_FRAME, "requested_frames": frames, "audio_s": audio_s,
                "first_audio_s": first, "chunks": chunks, **m.as_dict(),
                "rtf": m.wall / audio_s if audio_s else None}

    def summary(self) -> dict:
        out = {"load_s": self.load_s, "rss_loaded_mb": self.rss_loaded, "peak_rss_mb": peak_rss_mb(),
               "threads": self.threads, "version": self.version, "native": self.native, "pid": os.getpid()}
        if self.peer == "vox":
            stats = self.tts.stats()
            out["vox_ms_per_frame"] = (stats.get("backend") or {}).get("ms_per_frame")
            out["vox_plan_threads"] = (self.tts.plan or {}).get("threads")
        return out


# -- orchestrator side --------------------------------------------------------------------------------------------


def steady_rtf(short: dict, long: dict) -> float | None:
    """(wall(long) - wall(short)) / (audio(long) - audio(short)): the RTF without the fixed per-utterance costs."""
    if not short or not long or "error" in short or "error" in long:
        return None
    audio = long.get("audio_s", 0) - short.get("audio_s", 0)
    return (long["wall_s"] - short["wall_s"]) / audio if audio > 0 else None


def rotation(labels: list[str], round_: int) -> list[str]:
    """The order of round `round_`: each round starts one engine later, so none always runs first."""
    k = round_ % len(labels) if labels else 0
    return labels[k:] + labels[:k]


def engines(shape: str) -> list[dict]:
    """The engines of one shape's table, ours first: {"label", "kind", "format", and what identifies it}."""
    from qwen3_tts_gguf.convert.presets import PRESETS

    out = []
    for preset in ("default", "fast"):
        p = PRESETS[preset]
        label = "ours, default" if preset == "default" else "ours, `--preset fast`"
        out.append({"label": label, "kind": "ours", "engine": "ours", "preset": preset, "quant": p.quant,
                    "cp": p.cp_precision, "format": f"talker {p.quant} + code predictor {p.cp_precision}"})
    for peer in PEERS:
        for fmt in peer.formats:
            out.append({"label": f"{peer.engine} {fmt}", "kind": "peer", "engine": peer.engine, "peer": peer.key,
                        "format": fmt})
    return out


def _peer(key: str) -> Peer:
    return next(p for p in PEERS if p.key == key)


def _open(progress, e: dict, shape: str, threads: int, log) -> object:
    """The engine's worker session (bench.session.Session), or raise PeerError/RuntimeError with the reason."""
    from bench import prepare
    from bench.session import Session

    ckpt, _ = prepare.ensure_checkpoint(shape, log)
    if e["kind"] == "ours":
        folder = prepare.ensure_converted(ckpt, shape, e["quant"], e["cp"], threads, log)
        e["model"] = _shown(folder)
        return Session(progress, e["label"], "ours", dict(
            model_dir=str(folder), threads=threads, frames=LONG, warmup_frames=WARMUP, concurrency_frames=SHORT))
    peer = _peer(e["peer"])
    python = ensure_venv(peer, log)
    model = ensure_model(peer, e["format"], ckpt, python, log)
    e.update(model=_shown(Path(next(iter(model["files"].values()))).parent),
             how=model["how"], convert_s=model["convert_s"], package=f"{peer.package}=={peer.version}",
             env=peer.env)
    return Session(progress, e["label"], "peer", dict(peer=peer.key, fmt=e["format"], files=model["files"],
                                                       threads=threads, warmup_frames=WARMUP),
                   env=peer.env, python=str(python))


def measure_shape(progress, shape: str, threads: int, quiet_s: float, rounds: int = ROUNDS, step=None) -> dict:
    """Every engine of `shape` loaded side by side, then `rounds` rotating rounds of a SHORT and a LONG run each."""
    log = progress.bar.write
    table, sessions = engines(shape), {}
    try:
        for e in table:
            if step:
                step(f"peers {shape}: loading {e['label']}")
            try:
                s = _open(progress, e, shape, threads, log)
            except Exception as err:  # an engine that cannot install, convert or load here is reported, not fatal
                e["error"] = (str(err) if isinstance(err, PeerError) else f"{type(err).__name__}: {err}")[:400]
                continue
            if not s.ok:
                e["error"] = f"the engine did not start: {s.ready.get('error')}"[:400]
                s.close()
                continue
            sessions[e["label"]] = s
            e["runs"] = []
        for r in range(rounds):
            for label in rotation(list(sessions), r):
                e = next(x for x in table if x["label"] == label)
                if step:
                    step(f"peers {shape}: round {r + 1}/{rounds}, {label}")
                pair = {}
                for frames in (SHORT, LONG):
                    wait_for_quiet(quiet_s)
                    pair[frames] = {"requested_frames": frames,
                                    **sessions[label].call(op="single", rep=r, frames=frames)}
                e["runs"].append({"round": r, "order": rotation(list(sessions), r).index(label),
                                  "short": _keep(pair[SHORT]), "long": _keep(pair[LONG]),
                                  "rtf": steady_rtf(pair[SHORT], pair[LONG])})
    finally:
        for label, s in sessions.items():
            e = next(x for x in table if x["label"] == label)
            e["summary"] = s.close()
    return {"engines": {e.pop("label"): e for e in table}}


_KEPT = ("frames", "requested_frames", "audio_s", "wall_s", "cpu_s", "background", "first_audio_s", "rtf", "chunks",
         "error", "finish_reason")


def _keep(run: dict) -> dict:
    return {k: v for k, v in run.items() if k in _KEPT}


def measure(progress, threads: int, shapes: list[str], quiet_s: float, rounds: int = ROUNDS, step=None) -> dict:
    """The peers block: per shape, ours (default and `--preset fast`) and each peer format side by side."""
    from bench import machine

    info = machine.describe()  # a block run alone may be on another machine than the page's full run
    out = {**machine.block_origin(), "cpu": info["cpu"], "cores": info["cores"], "flags": info["flags"],
           "hypervisor": info["hypervisor"], "threads": threads, "short_frames": SHORT, "long_frames": LONG,
           "rounds": rounds, "quiet_s": quiet_s, "loadavg_start": machine.loadavg(),
           "peers": {p.key: {"engine": p.engine, "package": p.package, "version": p.version, "what": p.what,
                             "model_format": p.model_format, "env": p.env} for p in PEERS}, "shapes": {}}
    t0 = time.perf_counter()
    for shape in shapes:
        out["shapes"][shape] = measure_shape(progress, shape, threads, quiet_s, rounds, step)
    out["loadavg_end"] = machine.loadavg()
    out["wall_s"] = time.perf_counter() - t0
    return out
