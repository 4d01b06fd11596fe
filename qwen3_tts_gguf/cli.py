"""Command line: `python -m qwen3_tts_gguf <command>`.

Each command's arguments are a contract that scripts and tests rely on. Errors print one line to
stderr and exit non-zero; heavy imports happen inside the command that needs them (`serve`
imports the HTTP server lazily: the engine package itself never imports FastAPI).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qwen3_tts_gguf.convert.model_shapes import MODEL_TYPES, SHAPES
from qwen3_tts_gguf.env_flags import EnvArgumentParser
from qwen3_tts_gguf.flags import COUNT, COUNT0, SEED, add_device_args, add_runaway_args, number, threads_flag

"""`serve` flags read QTTS_<FLAG> from the environment (`env_flags.py`)."""


class CliError(Exception):
    """An error reported to the user as one line, exit code 2."""


def _cmd_convert(args: argparse.Namespace) -> int:
    from qwen3_tts_gguf.convert.checkpoint import CheckpointError
    from qwen3_tts_gguf.convert.pipeline import add_llama_stages, convert_checkpoint
    from qwen3_tts_gguf.convert.verify import VerificationError
    from qwen3_tts_gguf.model.manifest import ModelFolderError

    try:
        if args.only_llama_stages:  # without --preset: the formats of the preset the folder was converted with
            add_llama_stages(args.hf_dir, args.output, _llama_stages_format(args) if args.preset else None,
                             overwrite=args.force, verify=not args.no_verify)
            return 0
        quant, cp_precision = _weight_formats(args)
        convert_checkpoint(args.hf_dir, args.output, quant, name=args.name, cp_precision=cp_precision,
                           cp_block_size=args.cp_block_size, llama_stages=_llama_stages_format(args),
                           overwrite=args.force, verify=not args.no_verify, threads=args.threads)
    except (CheckpointError, VerificationError, ModelFolderError) as e:
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

    from qwen3_tts_gguf.convert.random_checkpoint import make_random_checkpoint

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
    from qwen3_tts_gguf.data_dirs import installed_models, model_base_dir

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
    from qwen3_tts_gguf.voicebank.store import VoiceStore

    store = VoiceStore(folder)
    try:
        store.check()
    except NotADirectoryError as e:
        raise CliError(f"--voices-dir: {e}") from e
    return store


def _find_profile(name: str | None, voices_dir: Path | None, model: Path | None):
    """The voice profile `name` when it is one (a model speaker of that name wins when --model has it)."""
    from qwen3_tts_gguf.model.manifest import load_manifest
    from qwen3_tts_gguf.voicebank.store import VoiceNotFoundError, VoiceProfileError

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
    from qwen3_tts_gguf.data_dirs import installed_models
    from qwen3_tts_gguf.model.manifest import load_manifest

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
    from qwen3_tts_gguf.model.manifest import ModelFolderError
    from qwen3_tts_gguf.voicebank.clone import ReferenceAudioError, VoiceCloner
    from qwen3_tts_gguf.voicebank.store import VoiceProfileError

    store = _voice_store(args.voices_dir)
    try:
        if args.voice_command == "list":
            from qwen3_tts_gguf.data_dirs import installed_models
            from qwen3_tts_gguf.model.manifest import load_manifest

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
        from qwen3_tts_gguf.voicebank.store import validate_name

        validate_name(args.name)
        if store.exists(args.name) and not args.force:
            raise CliError(f"voice {args.name!r} exists already (pass --force to replace it)")
        cloner = VoiceCloner(resolve_model_dir(args.model), threads=args.threads or None)
        if args.voice_command == "create":
            profile = cloner.create_profile(args.name, args.audio, ref_text=args.text, language=args.language,
                                            trailing_silence=args.trailing_silence)
        else:  # design
            from qwen3_tts_gguf.engine.scheduler import Engine
            from qwen3_tts_gguf.model.loaded import LoadedModel
            from qwen3_tts_gguf.model.settings import EngineSettings
            from qwen3_tts_gguf.voicebank.design import reference_text, speak_reference

            text = args.text or reference_text(args.language)
            with Engine(LoadedModel(args.design_model, EngineSettings(threads=args.threads, max_streams=1))) as engine:
                wav = speak_reference(engine, args.instructions, text, args.language, seed=args.seed,
                                      max_frames=args.max_frames)
            profile = cloner.create_profile(args.name, (wav, 24000), ref_text=text, language=args.language,
                                            trailing_silence=args.trailing_silence)
        path = store.save(profile, overwrite=args.force)
    except (VoiceProfileError, ReferenceAudioError, ModelFolderError, ValueError) as e:
        raise CliError(str(e)) from e
    print(f"saved voice {profile.name} ({profile.mode}, "
          f"{len(profile.ref_codes) if profile.ref_codes is not None else 0} reference frames) to {path}")
    return 0


def _sampling_from_args(args: argparse.Namespace, defaults: dict):
    from qwen3_tts_gguf.engine.request import TalkerSampling
    from qwen3_tts_gguf.model.sampler import SamplingParams

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

    from qwen3_tts_gguf.audio.file_writer import AudioFileWriter
    from qwen3_tts_gguf.doctor import check_device_settings
    from qwen3_tts_gguf.engine.request import SynthesisRequest
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.host.devices import DeviceError
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.manifest import ModelFolderError
    from qwen3_tts_gguf.model.prompt import PromptError, VoiceSpec
    from qwen3_tts_gguf.model.settings import EngineSettings

    profile = _find_profile(args.voice, args.voices_dir, args.model)
    folder = args.model or (model_for_profile(profile) if profile else resolve_model_dir(None))
    try:
        print(check_device_settings(args.gpu_layers, args.device, args.codec_runtime,
                                    cp_runtime=args.cp_runtime), file=sys.stderr)
    except DeviceError as e:
        raise CliError(str(e)) from e
    try:
        model = LoadedModel(folder, EngineSettings(threads=args.threads, max_streams=1, device=args.device,
                                                   gpu_layers=args.gpu_layers, kv_cache=args.kv_cache,
                                                   n_ctx=args.n_ctx or 0, codec_overlap=not args.no_codec_overlap,
                                                   codec_threads=args.codec_threads or 0,
                                                   heap_map_threshold=args.heap_map_threshold,
                                                   codec_runtime=args.codec_runtime, cp_runtime=args.cp_runtime,
                                                   runaway=args.runaway, runaway_retries=args.runaway_retries))
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
    from qwen3_tts_gguf.convert.checkpoint import CheckpointError
    from qwen3_tts_gguf.convert.download import DownloadError, download_checkpoint
    from qwen3_tts_gguf.convert.pipeline import convert_checkpoint
    from qwen3_tts_gguf.convert.presets import CP_BLOCK_SIZE
    from qwen3_tts_gguf.convert.verify import VerificationError
    from qwen3_tts_gguf.data_dirs import model_base_dir

    repo_name = args.repo_id.rstrip("/").split("/")[-1]
    quant, cp_precision = _weight_formats(args)
    suffix = quant if cp_precision == "int8" else f"{quant}-cp{cp_precision}"  # int8: the names pull always gave
    if cp_precision != "fp32" and args.cp_block_size != CP_BLOCK_SIZE:
        suffix += f"-cpblock{args.cp_block_size}"
    out = (args.output or model_base_dir()) / f"{repo_name}-{suffix}"
    try:
        source = args.from_dir or download_checkpoint(args.repo_id, args.source)
        convert_checkpoint(source, out, quant, cp_precision=cp_precision, cp_block_size=args.cp_block_size,
                           llama_stages=_llama_stages_format(args), overwrite=args.force)
    except (DownloadError, CheckpointError, VerificationError) as e:
        raise CliError(str(e)) from e
    except OSError as e:
        raise CliError(_os_message(e)) from e
    print(f"ready: {out}")
    return 0


def _add_serve_command(sub: argparse._SubParsersAction) -> None:
    """The serve hand-off: `serve`'s flags and its run belong to the server (`api/cli_args.py`); the one
    place where the engine imports `api`."""
    from api.cli_args import add_serve_command

    add_serve_command(sub)


def _add_weight_args(p: argparse.ArgumentParser) -> None:
    """--preset, --quant, --cp-precision (`_weight_formats` resolves these three) and --cp-block-size
    (convert and pull)."""
    from qwen3_tts_gguf.convert.presets import CP_BLOCK_SIZE, CP_BLOCK_SIZES, CP_PRECISIONS, DEFAULT_PRESET, PRESETS
    from qwen3_tts_gguf.convert.talker_gguf import QUANTS

    p.add_argument("--preset", choices=list(PRESETS),
                   help="weight formats chosen together: " + "; ".join(
                       f"{name}: {preset.summary} (llama stages: code predictor {preset.llama_stages.code_predictor}, "
                       f"codec {preset.llama_stages.codec})" for name, preset in PRESETS.items())
                        + f" (default {DEFAULT_PRESET})")
    p.add_argument("--quant", choices=QUANTS, help="talker weight format (default: the preset's; f32 is exact)")
    p.add_argument("--cp-precision", choices=CP_PRECISIONS,
                   help="code predictor weights (default: the preset's; int8 is ~2-3x faster than fp32, the "
                        "parity precision)")
    p.add_argument("--cp-block-size", type=int, choices=CP_BLOCK_SIZES, default=CP_BLOCK_SIZE,
                   help="int8/int4 code predictor: weights per scale (default %(default)s; 32 agrees more closely "
                        "with fp32 and is about a quarter slower, docs/benchmarks.md)")


def _weight_formats(args: argparse.Namespace) -> tuple[str, str]:
    from qwen3_tts_gguf.convert.presets import DEFAULT_PRESET, weight_formats

    return weight_formats(args.preset or DEFAULT_PRESET, args.quant, args.cp_precision)


def _llama_stages_format(args: argparse.Namespace):
    """The llama stages file's formats: --preset's (the default preset's without one)."""
    from qwen3_tts_gguf.convert.presets import DEFAULT_PRESET, PRESETS

    return PRESETS[args.preset or DEFAULT_PRESET].llama_stages


def _cmd_doctor(args: argparse.Namespace) -> int:
    import json

    from qwen3_tts_gguf.doctor import report

    r = report(args.gpu_layers, args.device, args.cp_runtime, args.codec_runtime)
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(r), indent=2))
    else:
        from qwen3_tts_gguf.doctor import format_report

        print(format_report(r))
    return 1 if r.problems else 0


def build_parser() -> argparse.ArgumentParser:
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
    p.add_argument("--threads", **threads_flag("threads for quantization"))
    p.add_argument("--only-llama-stages", action="store_true",
                   help="add the llama stages file (llama.cpp's code predictor and codec) to the model folder -o, "
                        "converted from HF_DIR before that file existed, and leave its other files as they are "
                        "(--force writes it again; without --preset: the formats the folder was converted with)")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("make-random", help="write a random-weight checkpoint in the real layout (numpy only)")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--shape", choices=SHAPES, default="tiny")
    p.add_argument("--type", choices=MODEL_TYPES, default="custom_voice")
    p.add_argument("--seed", type=SEED, default=0)
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
    p.add_argument("--temperature", type=number(float, None))
    p.add_argument("--top-k", type=COUNT0, help="0: off")
    p.add_argument("--top-p", type=number(float, 0, 1.0))
    p.add_argument("--cp-temperature", type=number(float, None),
                   help="code predictor temperature (official subtalker_*)")
    p.add_argument("--cp-top-k", type=COUNT0)
    p.add_argument("--cp-top-p", type=number(float, 0, 1.0))
    p.add_argument("--repetition-penalty", type=number(float, None))
    p.add_argument("--seed", type=SEED)
    p.add_argument("--max-frames", type=COUNT, help="cap on frames (80 ms each); EOS still ends earlier")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-frames frames")
    p.add_argument("-o", "--output", default="out.wav",
                   help="wav, flac, mp3, opus, aac or pcm file; '-' writes raw s16le 24 kHz mono to stdout")
    p.add_argument("--codes-out", type=Path, help="save the codes as an int array [frames, 16] (.npy)")
    p.add_argument("--voices-dir", type=Path, help="voice profiles folder (default: voices/, or QTTS_VOICES_DIR)")
    p.add_argument("--threads", **threads_flag())
    add_device_args(p)
    add_runaway_args(p)
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
            q.add_argument("--seed", type=SEED, default=0)
            q.add_argument("--max-frames", type=COUNT, default=600)
        q.add_argument("--model", type=Path, help="the Base model folder (default: the only model under model-base/)")
        q.add_argument("--language", default="auto")
        q.add_argument("--trailing-silence", type=number(float, 0, 5.0, unit="seconds"), default=0.5,
                       help="seconds of silence appended to the reference (stops its last sound bleeding in)")
        q.add_argument("--force", action="store_true", help="replace an existing voice of that name")
        q.add_argument("--threads", **threads_flag())
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
    add_device_args(p)
    p.set_defaults(func=_cmd_doctor)

    _add_serve_command(sub)
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
