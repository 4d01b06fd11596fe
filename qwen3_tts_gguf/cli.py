"""Command line: `python -m qwen3_tts_gguf <command>`.

Each command's arguments are a contract that scripts and tests rely on. Errors print one line to
stderr and exit non-zero; heavy imports happen inside the command that needs them (`serve`
imports the HTTP server lazily: the engine package itself never imports FastAPI).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .env_flags import EnvArgumentParser, env_name
from .model_shapes import MODEL_TYPES, SHAPES

SERVE_ENV_PREFIX = "QTTS_"
"""`serve` flags read QTTS_<FLAG> from the environment (`env_flags.py`)."""


class CliError(Exception):
    """An error reported to the user as one line, exit code 2."""


def _cmd_convert(args: argparse.Namespace) -> int:
    from .checkpoint import CheckpointError
    from .convert.pipeline import convert_checkpoint
    from .convert.verify import VerificationError

    try:
        quant, cp_precision = _weight_formats(args)
        convert_checkpoint(args.hf_dir, args.output, quant, name=args.name, cp_precision=cp_precision,
                           cp_block_size=args.cp_block_size, overwrite=args.force, verify=not args.no_verify,
                           threads=args.threads)
    except (CheckpointError, VerificationError) as e:
        raise CliError(str(e)) from e
    except OSError as e:
        raise CliError(_os_message(e)) from e
    return 0


def _os_message(e: OSError, path: Path | str | None = None) -> str:
    """One line for a file system error: FileExistsError's own message (it says to use --force), else
    the user's `path` (or the error's own file) and what the system said."""
    if isinstance(e, FileExistsError) or not e.strerror:
        return f"{path}: {e}" if path is not None else str(e)
    if path is not None:
        return f"{path}: {e.strerror}"
    return f"{e.strerror}: {e.filename}" if e.filename else e.strerror


def _cmd_make_random(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .random_checkpoint import make_random_checkpoint

    with tqdm(desc=f"make-random {args.shape} {args.type}", unit="tensor") as bar:
        def tick(name: str) -> None:
            bar.update()
            bar.set_postfix_str(name[-40:])

        try:
            make_random_checkpoint(args.out_dir, args.shape, args.type, seed=args.seed,
                                   tokenizer_dir=args.tokenizer_dir, progress=tick)
        except OSError as e:  # an existing folder (without --force), or one it cannot write
            raise CliError(_os_message(e)) from e
    print(f"wrote a random {args.shape} {args.type} checkpoint to {args.out_dir}")
    return 0


def resolve_model_dir(model: Path | None) -> Path:
    """--model, or the only converted model under model-base/."""
    from .paths import installed_models, model_base_dir

    if model is not None:
        return model
    found = installed_models()
    if len(found) == 1:
        return found[0]
    if not found:
        raise CliError(f"no converted model under {model_base_dir()}: `pull` one, `convert` a checkpoint, "
                       "or try `make-random` then `convert` (see README)")
    raise CliError(f"several models under {model_base_dir()}: pick one with --model "
                   f"({', '.join(p.name for p in found)})")


def _voice_store(folder: Path | None):
    from .voices import VoiceStore

    store = VoiceStore(folder)
    try:
        store.check()
    except NotADirectoryError as e:
        raise CliError(f"--voices-dir: {e}") from e
    return store


def _find_profile(name: str | None, voices_dir: Path | None, model: Path | None):
    """The voice profile `name` when it is one (a model speaker of that name wins when --model has it)."""
    from .manifest import load_manifest
    from .voices import VoiceNotFoundError, VoiceProfileError

    if not name:
        return None
    if model is not None:
        try:
            if name.lower() in load_manifest(model).speakers:
                return None
        except ValueError:
            pass  # the model folder's own error is reported when it is loaded
    try:
        return _voice_store(voices_dir).get(name)
    except VoiceNotFoundError:
        return None
    except VoiceProfileError as e:
        raise CliError(str(e)) from e


def model_for_profile(profile) -> Path:
    """The converted model a profile names, else the only Base model of its size."""
    from .manifest import load_manifest
    from .paths import installed_models

    candidates = []
    for folder in installed_models():
        m = load_manifest(folder)
        if profile.model and profile.model in (m.name, folder.name):
            return folder
        if m.model_type == "base" and m.model_size == profile.model_size:
            candidates.append(folder)
    if len(candidates) == 1:
        return candidates[0]
    raise CliError(f"voice {profile.name!r} needs its {profile.model_size} Base model "
                   f"({profile.model or 'unnamed'}): pass --model" if not candidates else
                   f"several {profile.model_size} Base models fit voice {profile.name!r}: pass --model")


def _cmd_voice(args: argparse.Namespace) -> int:
    from .manifest import ModelFolderError
    from .voice_clone import ReferenceAudioError, VoiceCloner
    from .voices import VoiceProfileError

    store = _voice_store(args.voices_dir)
    try:
        if args.voice_command == "list":
            from .manifest import load_manifest
            from .paths import installed_models

            for folder in installed_models():
                m = load_manifest(folder)
                for speaker in m.speakers:
                    print(f"{speaker}\tbuilt-in\t{m.name}")
            for name in store.list():
                p = store.get(name)
                print(f"{name}\t{p.mode} clone\t{p.model or p.model_size + ' base'}")
            return 0
        if args.voice_command == "delete":
            store.delete(args.name)
            print(f"deleted voice {args.name}")
            return 0
        from .voices import validate_name

        validate_name(args.name)
        if store.exists(args.name) and not args.force:
            raise CliError(f"voice {args.name!r} exists already (pass --force to replace it)")
        cloner = VoiceCloner(resolve_model_dir(args.model), threads=args.threads or None)
        if args.voice_command == "create":
            profile = cloner.create_profile(args.name, args.audio, ref_text=args.text, language=args.language,
                                            trailing_silence=args.trailing_silence)
        else:  # design
            from .model import EngineSettings, LoadedModel
            from .scheduler import Engine
            from .voice_design import reference_text, speak_reference

            text = args.text or reference_text(args.language)
            with Engine(LoadedModel(args.design_model, EngineSettings(threads=args.threads, max_streams=1))) as engine:
                wav = speak_reference(engine, args.instructions, text, args.language, seed=args.seed,
                                      max_frames=args.max_frames)
            profile = cloner.create_profile(args.name, (wav, 24000), ref_text=text, language=args.language,
                                            trailing_silence=args.trailing_silence)
        path = store.save(profile, overwrite=args.force)
    except (VoiceProfileError, ReferenceAudioError, ModelFolderError, ValueError) as e:
        raise CliError(str(e)) from e
    print(f"saved voice {profile.name} ({profile.mode}, {len(profile.ref_codes) if profile.ref_codes is not None else 0} "
          f"reference frames) to {path}")
    return 0


def _sampling_from_args(args: argparse.Namespace, defaults: dict):
    from .request import TalkerSampling
    from .sampler import SamplingParams

    def pick(value, key, fallback):
        return value if value is not None else defaults.get(key, fallback)

    talker = SamplingParams(
        temperature=pick(args.temperature, "temperature", 0.9), top_k=pick(args.top_k, "top_k", 50),
        top_p=pick(args.top_p, "top_p", 1.0), greedy=args.greedy or not defaults.get("do_sample", True))
    predictor = SamplingParams(
        temperature=pick(args.cp_temperature, "subtalker_temperature", 0.9),
        top_k=pick(args.cp_top_k, "subtalker_top_k", 50), top_p=pick(args.cp_top_p, "subtalker_top_p", 1.0),
        greedy=args.greedy or not defaults.get("subtalker_dosample", True))
    penalty = pick(args.repetition_penalty, "repetition_penalty", 1.05)
    return TalkerSampling(talker, penalty), predictor


def _cmd_synth(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    from .audio_encoding import AudioFileWriter
    from .devices import DeviceError, check_device_settings
    from .manifest import ModelFolderError
    from .model import EngineSettings, LoadedModel
    from .prompt import PromptError, VoiceSpec
    from .request import SynthesisRequest
    from .scheduler import Engine

    profile = _find_profile(args.voice, args.voices_dir, args.model)
    folder = args.model or (model_for_profile(profile) if profile else resolve_model_dir(None))
    try:
        print(check_device_settings(args.gpu_layers, args.device, args.codec_runtime), file=sys.stderr)
    except DeviceError as e:
        raise CliError(str(e)) from e
    try:
        model = LoadedModel(folder, EngineSettings(threads=args.threads, max_streams=1, device=args.device,
                                                   gpu_layers=args.gpu_layers, kv_cache=args.kv_cache,
                                                   n_ctx=args.n_ctx or 0, codec_overlap=not args.no_codec_overlap,
                                                   codec_threads=args.codec_threads or 0,
                                                   heap_map_threshold=args.heap_map_threshold,
                                                   codec_runtime=args.codec_runtime))
    except (ModelFolderError, OSError) as e:
        raise CliError(str(e)) from e
    manifest = model.manifest
    if profile is not None:
        try:
            profile.check_model(manifest.model_type, manifest.model_size, manifest.talker["hidden_size"])
        except ValueError as e:
            raise CliError(str(e)) from e
        voice_spec = profile.voice_spec(None if args.language == "auto" else args.language, args.instruct)
    else:
        voice = args.voice
        if voice is None and manifest.speakers:
            voice = next(iter(manifest.speakers))
        if manifest.model_type == "voice_design" and not args.instruct:
            raise CliError("a VoiceDesign model needs --instruct describing the voice")
        if manifest.model_type == "base":
            raise CliError(f"a Base model speaks with a voice profile: no profile named {args.voice!r} "
                           "(see `voice create`)" if args.voice else
                           "a Base model needs --voice naming a voice profile (see `voice create`)")
        voice_spec = VoiceSpec(speaker=voice, instruct=args.instruct, language=args.language)
    try:
        talker, predictor = _sampling_from_args(args, manifest.sampling)
        request = SynthesisRequest(
            text=args.text, voice=voice_spec,
            text_mode=args.text_mode, talker=talker, code_predictor=predictor, seed=args.seed,
            max_frames=args.max_frames, ignore_eos=args.ignore_eos)
    except ValueError as e:
        raise CliError(str(e)) from e
    if args.ignore_eos and args.max_frames is None:
        raise CliError("--ignore-eos needs --max-frames")
    if args.codes_out and not args.codes_out.resolve().parent.is_dir():  # known now, not after the synthesis
        raise CliError(f"--codes-out {args.codes_out}: no such folder")
    started = time.monotonic()
    with Engine(model) as engine:
        try:
            stream = engine.submit(request)
        except PromptError as e:
            raise CliError(str(e)) from e
        try:
            with AudioFileWriter(args.output if str(args.output) != "-" else "-", sample_rate=model.sample_rate) as out:
                try:
                    for chunk in stream:
                        out.write(chunk.samples)
                except KeyboardInterrupt:
                    stream.cancel()
                    for _ in stream:  # drain until the engine confirms
                        pass
                    raise
        except (ValueError, OSError) as e:  # a format it cannot tell, a folder it cannot write to
            stream.cancel()
            raise CliError(_os_message(e, args.output) if isinstance(e, OSError) else str(e)) from e
    result = stream.result
    if result.finish_reason == "error":
        raise CliError(f"synthesis failed: {result.error}")
    if args.codes_out:
        _save_codes(args.codes_out, result.codes.astype(np.int64))
    seconds = result.frames * manifest.codec["samples_per_frame"] / model.sample_rate
    elapsed = time.monotonic() - started
    ttfa = result.timings.get("first_audio_s")
    print(f"{result.frames} frames, {seconds:.2f} s of audio in {elapsed:.2f} s (RTF {elapsed / max(seconds, 1e-9):.2f}"
          + (f", first audio after {ttfa * 1000:.0f} ms" if ttfa is not None else "")
          + f"), finished by {result.finish_reason}", file=sys.stderr)
    model.close()
    return 0


def _save_codes(path: Path, codes) -> None:
    """`codes` as a .npy file at `path`, written whole or not at all (a temporary file, then renamed)."""
    import os
    import tempfile

    import numpy as np

    try:
        fd, tmp = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, codes)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise CliError(f"--codes-out {_os_message(e, path)}") from e


def _cmd_pull(args: argparse.Namespace) -> int:
    from .checkpoint import CheckpointError
    from .convert.pipeline import convert_checkpoint
    from .convert.presets import CP_BLOCK_SIZE
    from .convert.verify import VerificationError
    from .download import DownloadError, download_checkpoint
    from .paths import model_base_dir

    repo_name = args.repo_id.rstrip("/").split("/")[-1]
    quant, cp_precision = _weight_formats(args)
    suffix = quant if cp_precision == "int8" else f"{quant}-cp{cp_precision}"  # int8: the names pull always gave
    if cp_precision != "fp32" and args.cp_block_size != CP_BLOCK_SIZE:
        suffix += f"-cpblock{args.cp_block_size}"
    out = (args.output or model_base_dir()) / f"{repo_name}-{suffix}"
    try:
        source = args.from_dir or download_checkpoint(args.repo_id, args.source)
        convert_checkpoint(source, out, quant, cp_precision=cp_precision, cp_block_size=args.cp_block_size,
                           overwrite=args.force)
    except (DownloadError, CheckpointError, VerificationError) as e:
        raise CliError(str(e)) from e
    except OSError as e:
        raise CliError(_os_message(e)) from e
    print(f"ready: {out}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from api.server import run_server  # the engine package never imports the server at module level

    return run_server(args)


def _add_weight_args(p: argparse.ArgumentParser) -> None:
    """--preset, --quant, --cp-precision (`_weight_formats` resolves these three) and --cp-block-size
    (convert and pull)."""
    from .convert.presets import CP_BLOCK_SIZE, CP_BLOCK_SIZES, CP_PRECISIONS, DEFAULT_PRESET, PRESETS
    from .convert.talker_gguf import QUANTS

    p.add_argument("--preset", choices=list(PRESETS), default=DEFAULT_PRESET,
                   help="weight formats chosen together: " + "; ".join(f"{name}: {preset.summary}"
                                                                       for name, preset in PRESETS.items())
                        + " (default %(default)s)")
    p.add_argument("--quant", choices=QUANTS, help="talker weight format (default: the preset's; f32 is exact)")
    p.add_argument("--cp-precision", choices=CP_PRECISIONS,
                   help="code predictor weights (default: the preset's; int8 is ~2-3x faster than fp32, the "
                        "parity precision)")
    p.add_argument("--cp-block-size", type=int, choices=CP_BLOCK_SIZES, default=CP_BLOCK_SIZE,
                   help="int8/int4 code predictor: weights per scale (default %(default)s; 32 agrees more closely "
                        "with fp32 and is about a quarter slower, docs/benchmarks.md)")


def _weight_formats(args: argparse.Namespace) -> tuple[str, str]:
    from .convert.presets import weight_formats

    return weight_formats(args.preset, args.quant, args.cp_precision)


def _add_device_args(p: argparse.ArgumentParser) -> None:
    """Where and how the engine runs: the devices and the talker's KV cache (speak and serve alike)."""
    from .devices import ONNX_DEVICES, parse_gpu_layers
    from .heap import MAP_THRESHOLD, MAX_MAP_THRESHOLD
    from .model import KV_CELLS_PER_STREAM, MAX_KV_CELLS, MAX_THREADS, MIN_KV_CELLS
    from .openvino_session import RUNTIMES as CODEC_RUNTIMES
    from .talker import KV_CACHE_TYPES

    p.add_argument("--device", choices=ONNX_DEVICES, default="cpu",
                   help="ONNX Runtime execution provider for the code predictor and codec, among those installed "
                        "(cuda needs onnxruntime-gpu, webgpu the onnxruntime-ep-webgpu plugin); auto: the best "
                        "installed, named at start (default cpu; `doctor` lists them)")
    p.add_argument("--gpu-layers", type=parse_gpu_layers, default=0, metavar="N|all",
                   help="talker layers to offload to the GPU, or all (a llama-cpp-python built with Vulkan or "
                        "CUDA: README, GPU backends); refused at start on a build without one (default 0)")
    p.add_argument("--kv-cache", choices=KV_CACHE_TYPES, default="q8_0",
                   help="talker KV cache precision: q8_0 takes half the memory of f16, q4_0 a quarter (agreement: "
                        "docs/benchmarks.md); "
                        "--deterministic always uses f32 (default %(default)s)")
    min_n_ctx = 512
    p.add_argument("--n-ctx", type=_number(int, min_n_ctx, MAX_KV_CELLS), default=None, metavar="CELLS",
                   help="talker KV cells shared by all of a model's streams: memory (60 KiB per cell at 0.6B "
                        f"with q8_0, 112 with f16) against how many long texts run at once (default "
                        f"{KV_CELLS_PER_STREAM} per stream, --max-streams for serve and one for speak, at least {MIN_KV_CELLS}; "
                        f"{min_n_ctx} to {MAX_KV_CELLS})")
    p.add_argument("--no-codec-overlap", action="store_true",
                   help="decode audio on the engine thread between steps instead of on a thread of its own beside "
                        "the talker and code predictor (the fast profile overlaps them on 2+ threads)")
    p.add_argument("--codec-threads", type=_number(int, 1, MAX_THREADS), default=None, metavar="N",
                   help="threads of one overlapped codec call (default: --threads): fewer run several streams' "
                        "calls side by side, in a lane each: more throughput with many streams, later first audio "
                        "(docs/benchmarks.md, Codec overlap)")
    p.add_argument("--codec-runtime", choices=CODEC_RUNTIMES, default="onnxruntime",
                   help="what runs the codec: openvino (pip install openvino; CPU only, not with --deterministic) "
                        "decodes about a fifth faster than ONNX Runtime but holds more memory (0.6B, eight streams: "
                        "about 130 MiB more at the peak, with a writable model folder for its cache; "
                        "docs/benchmarks.md, Codec overlap; default %(default)s)")
    p.add_argument("--heap-map-threshold", type=_number(int, 0, MAX_MAP_THRESHOLD), default=MAP_THRESHOLD,
                   metavar="BYTES",
                   help="blocks of at least this size are mapped on their own and unmapped when freed (glibc): "
                        "a lower peak memory with many streams; 0 leaves malloc's own dynamic threshold, and "
                        "MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES, when set, win (default %(default)s)")


def _cmd_doctor(args: argparse.Namespace) -> int:
    import json

    from .devices import report

    r = report(args.gpu_layers, args.device)
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(r), indent=2))
    else:
        from .devices import format_report

        print(format_report(r))
    return 1 if r.problems else 0


def _number(kind, minimum, maximum=None, unit: str = ""):
    """An argparse type: a finite `kind` (int or float) of at least `minimum` (None: above 0) and at
    most `maximum` (None: no bound); `unit` names what it counts in the refusal."""
    low = "above 0" if minimum is None else f"at least {minimum}"
    domain = f"{low} and at most {maximum}" if maximum is not None else low

    def parse(text: str):
        value = kind(text)
        if not (math.isfinite(value) and (value > 0 if minimum is None else value >= minimum)
                and (maximum is None or value <= maximum)):
            raise argparse.ArgumentTypeError(f"{text} is out of range ({domain}{' ' + unit if unit else ''})")
        return value
    parse.__name__ = kind.__name__
    return parse


_COUNT, _SECONDS, _COUNT0 = _number(int, 1), _number(float, None, unit="seconds"), _number(int, 0)
_PORT = _number(int, 0, 65535)
_SEED = _number(int, 0, 2**63 - 1)


def _threads(purpose: str = "") -> dict:
    """--threads of every command: 0 (the CPUs this process may use) to MAX_THREADS."""
    from .model import MAX_THREADS

    return dict(type=_number(int, 0, MAX_THREADS), default=0, metavar="N",
                help=f"{purpose or 'CPU threads'} (default 0: the CPUs this process may use: affinity mask and "
                     f"cgroup CPU quota; at most {MAX_THREADS})")


MAX_WARM_UP_VOICES = 16


def _voice_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated voice names (at most 16, each at most 128 characters);
    "" or "none": none."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if names == ("none",):
        return ()
    if len(names) > MAX_WARM_UP_VOICES or any(len(name) > 128 for name in names):
        raise argparse.ArgumentTypeError(f"at most {MAX_WARM_UP_VOICES} voice names of at most 128 characters")
    return names


def _resume_window(text: str) -> float:
    """An argparse type: seconds from 0 to 600 (api.limits.MAX_RESUME_WINDOW_S)."""
    value = float(text)
    if not 0 <= value <= 600:
        raise argparse.ArgumentTypeError(f"{text} is out of range (0 to 600 seconds)")
    return value


_resume_window.__name__ = "float"

# serve's limits: one flag per field of api.limits.ServerLimits (same name); a flag left out keeps the
# field's default, which the help shows (read from ServerLimits only when help is printed)
SERVE_LIMITS: tuple[tuple[str, object, str], ...] = (
    ("max_body_bytes", _COUNT, "bytes of a JSON request body (413 above)"),
    ("max_upload_bytes", _COUNT, "bytes of a voice upload (multipart; 413 above)"),
    ("max_form_fields", _COUNT, "parts of a voice upload, the audio file included (400 above)"),
    ("body_timeout_s", _SECONDS, "seconds for a request body to arrive after its headers (408)"),
    ("header_timeout_s", _SECONDS, "seconds for a connection to send a complete request head (then closed)"),
    ("max_connections", _COUNT, "open connections in all (503 above)"),
    ("max_requests_per_client", _COUNT, "speech streams (active + waiting) of one client address (429 above); "
                                        "default: half the default model's --max-streams, at least 1"),
    ("trusted_proxies", str, "proxy address or network whose X-Forwarded-For names the client (repeat; "
                             "default none)"),
    ("allowed_hosts", str, "Host name accepted (repeat; '*' = any, '*.example.com' = subdomains); default: the "
                           "loopback names when bound to a loopback address, else any"),
    ("send_timeout_s", _SECONDS, "seconds a client may read none of its audio before it is ended"),
    ("ws_max_message_bytes", _COUNT, "bytes of one WebSocket message"),
    ("ws_max_session_chars", _COUNT, "characters of text one WebSocket stream may take"),
    ("ws_max_session_s", _SECONDS, "seconds one WebSocket stream may last"),
    ("ws_idle_timeout_s", _SECONDS, "seconds a WebSocket stream may go without text before it is stopped"),
    ("max_sockets", _COUNT, "open WebSockets in all"),
    ("max_sockets_per_client", _COUNT, "open WebSockets of one client"),
    ("resume_window_s", _resume_window, "seconds a resumable WebSocket stream whose connection was lost waits "
                                        "(paused) for its resume before it is cancelled; 0 = no resume (0-600)"),
    ("max_detached_streams", _COUNT0, "resumable WebSocket streams waiting for their resume at once; past it a "
                                      "lost stream is cancelled"),
    ("voice_workers", _COUNT, "threads that clone and design voices"),
    ("voice_queue", _COUNT0, "voice jobs waiting for a worker (429 above)"),
)
_REPEATED = {"trusted_proxies": "ADDRESS", "allowed_hosts": "HOST"}


def _shown(name: str, value) -> str:
    if name.endswith("_bytes") and value % 1024 == 0:
        return f"{value // 1024} KiB" if value < 1024 * 1024 or value % (1024 * 1024) else f"{value >> 20} MiB"
    return f"{value:g}" if isinstance(value, float) else str(value)


class _ServeHelp(argparse.HelpFormatter):
    """Appends each flag's environment variable, and the default of a flag whose default lives in
    api.limits.ServerLimits or api.config.ServerConfig (read from there when help is shown)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None:
            from api.config import ServerConfig
            from api.limits import ServerLimits

            for owner in (ServerLimits(), ServerConfig()):
                default = getattr(owner, action.dest, None)
                if default not in (None, ()):
                    text += f" (default {_shown(action.dest, default)})"
                    break
        name = env_name(action, SERVE_ENV_PREFIX)
        return f"{text} [${name}]" if name else text


def _add_limit_args(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("limits", "bounds on what one client may send or hold (api/README.md, Limits)")
    for name, kind, helptext in SERVE_LIMITS:
        flag = "--" + name.replace("_", "-")
        if name in _REPEATED:
            group.add_argument(flag, dest=name, action="append", help=helptext, metavar=_REPEATED[name])
        else:
            group.add_argument(flag, dest=name, type=kind, help=helptext,
                               metavar="SECONDS" if kind in (_SECONDS, _resume_window)
                               else "BYTES" if name.endswith("_bytes") else "N")


def build_parser() -> argparse.ArgumentParser:
    from .model import MAX_BUFFERED_AUDIO_S, MAX_PENDING, MAX_PREFIX_CACHE, MAX_STREAMS, EngineSettings

    parser = argparse.ArgumentParser(prog="python -m qwen3_tts_gguf",
                                     description="Qwen3-TTS-X: local streaming Qwen3-TTS.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=EnvArgumentParser)

    p = sub.add_parser("convert", help="convert an official Hugging Face checkpoint into a model folder")
    p.add_argument("hf_dir", type=Path, help="checkpoint folder as published (config.json, model.safetensors, ...)")
    p.add_argument("-o", "--output", type=Path, required=True, help="model folder to write, e.g. model-base/<name>")
    p.add_argument("--name", help="model name (default: the output folder's name)")
    _add_weight_args(p)
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--no-verify", action="store_true", help="skip the self-check of the written graphs")
    p.add_argument("--threads", **_threads("threads for quantization"))
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("make-random", help="write a random-weight checkpoint in the real layout (numpy only)")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--shape", choices=SHAPES, default="tiny")
    p.add_argument("--type", choices=MODEL_TYPES, default="custom_voice")
    p.add_argument("--seed", type=_SEED, default=0)
    p.add_argument("--tokenizer-dir", type=Path, help="copy vocab.json/merges.txt/tokenizer_config.json from here "
                                                     "(default: a byte-level vocabulary)")
    p.set_defaults(func=_cmd_make_random)

    p = sub.add_parser("synth", help="speak TEXT into a file (written while it is generated)")
    p.add_argument("text")
    p.add_argument("--model", type=Path, help="model folder (default: the only one under model-base/)")
    p.add_argument("--voice", help="speaker name or voice profile (default: the model's first speaker)")
    p.add_argument("--language", default="auto", help="auto, chinese, english, ... (default auto)")
    p.add_argument("--instruct", help="instruction (1.7B CustomVoice, VoiceDesign)")
    p.add_argument("--text-mode", choices=("non-streaming", "streaming"),
                   help="prompt layout (default: the model's official default)")
    p.add_argument("--greedy", action="store_true", help="no sampling, for talker and code predictor")
    p.add_argument("--temperature", type=_number(float, None))
    p.add_argument("--top-k", type=_COUNT0, help="0: off")
    p.add_argument("--top-p", type=_number(float, 0, 1.0))
    p.add_argument("--cp-temperature", type=_number(float, None),
                   help="code predictor temperature (official subtalker_*)")
    p.add_argument("--cp-top-k", type=_COUNT0)
    p.add_argument("--cp-top-p", type=_number(float, 0, 1.0))
    p.add_argument("--repetition-penalty", type=_number(float, None))
    p.add_argument("--seed", type=_SEED)
    p.add_argument("--max-frames", type=_COUNT, help="cap on frames (80 ms each); EOS still ends earlier")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-frames frames")
    p.add_argument("-o", "--output", default="out.wav",
                   help="wav, flac, mp3, opus, aac or pcm file; '-' writes raw s16le 24 kHz mono to stdout")
    p.add_argument("--codes-out", type=Path, help="save the codes as an int array [frames, 16] (.npy)")
    p.add_argument("--voices-dir", type=Path, help="voice profiles folder (default: voices/, or QTTS_VOICES_DIR)")
    p.add_argument("--threads", **_threads())
    _add_device_args(p)
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("voice", help="cloned voices: create, design, list, delete")
    vsub = p.add_subparsers(dest="voice_command", required=True)
    for name, helptext in (("create", "clone a voice from a few seconds of audio"),
                           ("design", "design a voice from instructions, then clone it (stable across requests)")):
        q = vsub.add_parser(name, help=helptext)
        q.add_argument("name")
        if name == "create":
            q.add_argument("--audio", type=Path, required=True, help="reference clip, any common format, 1-30 s")
            q.add_argument("--text", help="exactly what the clip says (in-context clone); omit for x-vector only")
        else:
            q.add_argument("--instructions", required=True, help="the voice, e.g. 'a calm, low elderly voice'")
            q.add_argument("--design-model", type=Path, required=True, help="a VoiceDesign model folder")
            q.add_argument("--text", help="the reference sentence VoiceDesign speaks (default: one per language)")
            q.add_argument("--seed", type=_SEED, default=0)
            q.add_argument("--max-frames", type=_COUNT, default=600)
        q.add_argument("--model", type=Path, help="the Base model folder (default: the only model under model-base/)")
        q.add_argument("--language", default="auto")
        q.add_argument("--trailing-silence", type=_number(float, 0, 5.0, unit="seconds"), default=0.5,
                       help="seconds of silence appended to the reference (stops its last sound bleeding in)")
        q.add_argument("--force", action="store_true", help="replace an existing voice of that name")
        q.add_argument("--threads", **_threads())
        q.add_argument("--voices-dir", type=Path, help="voice profiles folder (default: voices/, or QTTS_VOICES_DIR)")
    q = vsub.add_parser("list", help="built-in speakers and voice profiles")
    q.add_argument("--voices-dir", type=Path)
    q = vsub.add_parser("delete", help="remove a voice profile")
    q.add_argument("name")
    q.add_argument("--voices-dir", type=Path)
    p.set_defaults(func=_cmd_voice)

    p = sub.add_parser("pull", help="download an official checkpoint and convert it into model-base/")
    p.add_argument("repo_id", help="e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    p.add_argument("--source", choices=("huggingface", "modelscope"), default="huggingface")
    _add_weight_args(p)
    p.add_argument("--from-dir", type=Path, help="use a checkpoint folder already downloaded")
    p.add_argument("--output", type=Path, help="parent folder (default: model-base/)")
    p.add_argument("--force", action="store_true", help="replace an existing converted model")
    p.set_defaults(func=_cmd_pull)

    p = sub.add_parser("doctor", help="llama.cpp backends, ONNX Runtime providers, devices, and what serve would use")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    _add_device_args(p)
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("serve", help="OpenAI-compatible speech server with the web console",
                       formatter_class=_ServeHelp, env_prefix=SERVE_ENV_PREFIX,
                       description="Every flag also reads the environment variable QTTS_<FLAG> (--max-streams: "
                                   "QTTS_MAX_STREAMS; repeatable flags: a comma-separated list; on/off flags: "
                                   "1/true/yes or 0/false/no); a flag on the command line wins.")
    p.add_argument("--model", type=Path, action="append", help="model folder (repeat; default: all of --model-base)")
    p.add_argument("--model-base", type=Path, help="folder of converted models (default: model-base/)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    p.add_argument("--port", type=_PORT, default=8100, help="port (default %(default)s)")
    p.add_argument("--api-key", help="require this key")
    p.add_argument("--public-listings", action="store_true",
                   help="GET /v1/audio/voices and /v1/audio/models answer without the key (Open WebUI reads them "
                        "without sending it)")
    p.add_argument("--cors-origin", action="append", default=[], help="allowed CORS origin (repeat; '*' for any)")
    p.add_argument("--voices-dir", type=Path, help="voice profiles folder (default: voices/)")
    p.add_argument("--threads", **_threads("CPU threads per model"))
    p.add_argument("--max-streams", type=_number(int, 1, MAX_STREAMS), default=8, metavar="N",
                   help=f"streams synthesised at once per model (1 to {MAX_STREAMS}; default %(default)s)")
    p.add_argument("--max-queue", type=_number(int, 0, MAX_PENDING), default=32, metavar="N",
                   help=f"requests waiting for a slot before 429 (0 to {MAX_PENDING}; default %(default)s)")
    p.add_argument("--max-live-waiting", type=_number(int, 0, MAX_PENDING), default=64, metavar="N",
                   help="live-text streams (WebSocket) waiting for their first words, apart from --max-queue; "
                        f"429 above (0 to {MAX_PENDING}; default %(default)s)")
    p.add_argument("--max-buffered-audio-s", type=_number(float, None, MAX_BUFFERED_AUDIO_S, unit="seconds"),
                   default=10.0, metavar="SECONDS",
                   help="seconds of audio a stream may make ahead of its reader before it is paused "
                        f"(above 0, at most {MAX_BUFFERED_AUDIO_S:g}; default %(default)g)")
    p.add_argument("--deterministic", action="store_true", help="F32 KV cache, flash attention off (parity)")
    p.add_argument("--drain-timeout-s", type=_SECONDS, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, seconds streams in flight may take to finish before the server stops")
    p.add_argument("--log-format", choices=("text", "json"), help="json: one JSON object per log line, with an "
                                                                  "access record per request")
    p.add_argument("--usage-log", type=Path, metavar="PATH",
                   help="append one JSON line per finished stream (every route: usage, finish reason) to PATH")
    p.add_argument("--wyoming-port", type=_PORT, metavar="PORT",
                   help="also serve Wyoming, Home Assistant's voice protocol, on this TCP port (10200 is the usual "
                        "one; no API key there: docs/integrations.md)")
    p.add_argument("--wyoming-host", metavar="ADDRESS", help="address the Wyoming port binds (default: --host)")
    p.add_argument("--warm-up-voices", type=_voice_list, metavar="VOICES",
                   help="before the port opens, each of these voices (comma-separated VOICE or VOICE:LANGUAGE, all "
                        "for every model's speakers and fitting profiles up to --prefix-cache, or none) speaks a short "
                        "text on every model it fits, so that first requests find the runtimes warm and that voice's "
                        "prompt prefix cached (default alloy, language auto)")
    p.add_argument("--prefix-cache", type=_number(int, 0, MAX_PREFIX_CACHE), default=EngineSettings.prefix_cache,
                   metavar="N",
                   help="voice prompt prefixes (role, speaker and language rows) each model keeps prefilled, so a "
                        "voice's next request prefills only its text; least recently used first out, and given back "
                        f"whenever streams need the KV cells (0 to {MAX_PREFIX_CACHE}, 0: off; default %(default)s)")
    _add_device_args(p)
    _add_limit_args(p)
    p.set_defaults(func=_cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
