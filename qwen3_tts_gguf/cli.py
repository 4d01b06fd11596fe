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

    try:
        convert_checkpoint(args.hf_dir, args.output, args.quant, name=args.name, overwrite=args.force,
                           verify=not args.no_verify, threads=args.threads)
    except (CheckpointError, FileExistsError) as e:
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
