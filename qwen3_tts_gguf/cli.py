"""Command line: `python -m qwen3_tts_gguf <command>`.

Each command's arguments are a contract that scripts and tests rely on. Errors print one line to
stderr and exit non-zero; heavy imports happen inside the command that needs them (`serve`
imports the HTTP server lazily: the engine package itself never imports FastAPI).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .model_shapes import MODEL_TYPES, SHAPES


class CliError(Exception):
    """An error reported to the user as one line, exit code 2."""


def _cmd_convert(args: argparse.Namespace) -> int:
    from .checkpoint import CheckpointError
    from .convert.pipeline import convert_checkpoint
    from .convert.verify import VerificationError

    try:
        convert_checkpoint(args.hf_dir, args.output, args.quant, name=args.name, overwrite=args.force,
                           verify=not args.no_verify, threads=args.threads)
    except (CheckpointError, FileExistsError, VerificationError) as e:
        raise CliError(str(e)) from e
    return 0


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
        except FileExistsError as e:
            raise CliError(str(e)) from e
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
    from .manifest import ModelFolderError
    from .model import EngineSettings, LoadedModel
    from .prompt import PromptError, VoiceSpec
    from .request import SynthesisRequest
    from .scheduler import Engine

    folder = resolve_model_dir(args.model)
    try:
        model = LoadedModel(folder, EngineSettings(threads=args.threads, max_streams=1, device=args.device,
                                                   gpu_layers=args.gpu_layers))
    except (ModelFolderError, OSError) as e:
        raise CliError(str(e)) from e
    manifest = model.manifest
    voice = args.voice
    if voice is None and manifest.speakers:
        voice = next(iter(manifest.speakers))
    if manifest.model_type == "voice_design" and not args.instruct:
        raise CliError("a VoiceDesign model needs --instruct describing the voice")
    if manifest.model_type == "base" and voice is None:
        raise CliError("a Base model needs --voice naming a voice profile (see `voice create`)")
    try:
        talker, predictor = _sampling_from_args(args, manifest.sampling)
        request = SynthesisRequest(
            text=args.text, voice=VoiceSpec(speaker=voice, instruct=args.instruct, language=args.language),
            text_mode=args.text_mode, talker=talker, code_predictor=predictor, seed=args.seed,
            max_frames=args.max_frames, ignore_eos=args.ignore_eos)
    except ValueError as e:
        raise CliError(str(e)) from e
    if args.ignore_eos and args.max_frames is None:
        raise CliError("--ignore-eos needs --max-frames")
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
        except ValueError as e:
            raise CliError(str(e)) from e
    result = stream.result
    if result.finish_reason == "error":
        raise CliError(f"synthesis failed: {result.error}")
    if args.codes_out:
        np.save(args.codes_out, result.codes.astype(np.int64))
    seconds = result.frames * manifest.codec["samples_per_frame"] / model.sample_rate
    elapsed = time.monotonic() - started
    ttfa = result.timings.get("first_audio_s")
    print(f"{result.frames} frames, {seconds:.2f} s of audio in {elapsed:.2f} s (RTF {elapsed / max(seconds, 1e-9):.2f}"
          + (f", first audio after {ttfa * 1000:.0f} ms" if ttfa is not None else "")
          + f"), finished by {result.finish_reason}", file=sys.stderr)
    model.close()
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from .checkpoint import CheckpointError
    from .convert.pipeline import convert_checkpoint
    from .convert.verify import VerificationError
    from .download import DownloadError, download_checkpoint
    from .paths import model_base_dir

    repo_name = args.repo_id.rstrip("/").split("/")[-1]
    out = (args.output or model_base_dir()) / f"{repo_name}-{args.quant}"
    try:
        source = args.from_dir or download_checkpoint(args.repo_id, args.source)
        convert_checkpoint(source, out, args.quant, overwrite=args.force)
    except (DownloadError, CheckpointError, FileExistsError, VerificationError) as e:
        raise CliError(str(e)) from e
    print(f"ready: {out}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from api.server import run_server  # the engine package never imports the server at module level

    return run_server(args)


def _add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="ONNX Runtime provider for the code predictor and codec (cuda needs onnxruntime-gpu)")
    p.add_argument("--gpu-layers", type=int, default=0,
                   help="talker layers to offload (llama-cpp-python built with CUDA or Vulkan)")


def build_parser() -> argparse.ArgumentParser:
    from .convert.talker_gguf import QUANTS

    parser = argparse.ArgumentParser(prog="python -m qwen3_tts_gguf",
                                     description="Qwen3-TTS-X: local streaming Qwen3-TTS.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="convert an official Hugging Face checkpoint into a model folder")
    p.add_argument("hf_dir", type=Path, help="checkpoint folder as published (config.json, model.safetensors, ...)")
    p.add_argument("-o", "--output", type=Path, required=True, help="model folder to write, e.g. model-base/<name>")
    p.add_argument("--quant", choices=QUANTS, default="q8_0", help="talker weight format (default q8_0; f32 is exact)")
    p.add_argument("--name", help="model name (default: the output folder's name)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--no-verify", action="store_true", help="skip the self-check of the written graphs")
    p.add_argument("--threads", type=int, default=0, help="threads for quantization (default: all)")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("make-random", help="write a random-weight checkpoint in the real layout (numpy only)")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--shape", choices=SHAPES, default="tiny")
    p.add_argument("--type", choices=MODEL_TYPES, default="custom_voice")
    p.add_argument("--seed", type=int, default=0)
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
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--cp-temperature", type=float, help="code predictor temperature (official subtalker_*)")
    p.add_argument("--cp-top-k", type=int)
    p.add_argument("--cp-top-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--max-frames", type=int, help="cap on frames (80 ms each); EOS still ends earlier")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-frames frames")
    p.add_argument("-o", "--output", default="out.wav",
                   help="wav, flac, mp3, opus, aac or pcm file; '-' writes raw s16le 24 kHz mono to stdout")
    p.add_argument("--codes-out", type=Path, help="save the codes as an int array [frames, 16] (.npy)")
    p.add_argument("--threads", type=int, default=0)
    _add_device_args(p)
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("pull", help="download an official checkpoint and convert it into model-base/")
    p.add_argument("repo_id", help="e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    p.add_argument("--quant", choices=QUANTS, default="q8_0")
    p.add_argument("--source", choices=("huggingface", "modelscope"), default="huggingface")
    p.add_argument("--from-dir", type=Path, help="use a checkpoint folder already downloaded")
    p.add_argument("--output", type=Path, help="parent folder (default: model-base/)")
    p.add_argument("--force", action="store_true", help="replace an existing converted model")
    p.set_defaults(func=_cmd_pull)

    p = sub.add_parser("serve", help="OpenAI-compatible speech server with the web console")
    p.add_argument("--model", type=Path, action="append", help="model folder (repeat; default: all of model-base/)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--api-key", help="require this key (or set QTTS_API_KEY)")
    p.add_argument("--cors-origin", action="append", default=[], help="allowed CORS origin (repeat; '*' for any)")
    p.add_argument("--voices-dir", type=Path, help="voice profiles folder (default: voices/)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--max-streams", type=int, default=8)
    p.add_argument("--max-queue", type=int, default=32, help="requests waiting for a slot before 429")
    p.add_argument("--deterministic", action="store_true", help="F32 KV cache, flash attention off (parity)")
    _add_device_args(p)
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
