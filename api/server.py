"""`python -m qwen3_tts_gguf serve`: load the models, then run the app on uvicorn until a signal
drains and stops it (`lifecycle.py`)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from qwen3_tts_gguf import ModelFolderError, VoiceStore
from qwen3_tts_gguf.data_dirs import installed_models, model_base_dir

from api.app import create_app
from api.config import ServerConfig, engine_settings_from_args
from api.ops import logs
from api.ops.connections import check_tls, uvicorn_config
from api.ops.hosts import is_loopback
from api.ops.lifecycle import DrainingServer
from api.registry import ModelRegistry
from api.speaking.usage import UsageLog

log = logging.getLogger("api.server")

DEFAULT_REPO = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
DEFAULT_QUANT = "q8_0"
EXIT_NO_MODEL = 2


def how_to_get_a_model(base: Path) -> str:
    """What to run when there is no model (printed before `serve` gives up)."""
    return (f"no converted model under {base}. Get one with\n"
            f"  python -m qwen3_tts_gguf pull {DEFAULT_REPO}\n"
            "or, offline, a random-weight model to try the server with (it speaks noise):\n"
            "  python -m qwen3_tts_gguf make-random /tmp/qtts-random\n"
            f"  python -m qwen3_tts_gguf convert /tmp/qtts-random -o {base / 'random-tiny'}\n"
            "then run `serve` again, or point it at a model folder with --model DIR.")


def pull_default_model(base: Path) -> Path | None:
    """First start without a model: download and convert the default one (None when that fails)."""
    from qwen3_tts_gguf.convert.download import download_checkpoint
    from qwen3_tts_gguf.convert.pipeline import convert_checkpoint

    out = base / f"{DEFAULT_REPO.rsplit('/', 1)[-1]}-{DEFAULT_QUANT}"
    print(f"no model under {base}: downloading {DEFAULT_REPO} and converting it to {out} ...", file=sys.stderr)
    try:
        convert_checkpoint(download_checkpoint(DEFAULT_REPO), out, DEFAULT_QUANT)
    except Exception as e:  # DownloadError (offline, hub error), CheckpointError, OSError, ...
        print(f"error: {e}", file=sys.stderr)
        return None
    return out


def model_base(args: argparse.Namespace) -> Path:
    """--model-base, else model-base/ (or QTTS_MODEL_BASE)."""
    return getattr(args, "model_base", None) or model_base_dir()


def model_folders(args: argparse.Namespace) -> list[Path]:
    """--model folders, else every model under --model-base, else the default model pulled now."""
    if args.model:
        return list(args.model)
    base = model_base(args)
    found = installed_models(base)
    if found:
        return found
    pulled = pull_default_model(base)
    return [pulled] if pulled else []


def run_server(args: argparse.Namespace) -> int:
    """Serve until a signal drains and stops the server (exit code 0); 2 when no model can be loaded."""
    try:
        config = ServerConfig.from_args(args)
    except ValueError as e:  # a limit out of its domain (a bad --trusted-proxies address, ...)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NO_MODEL
    try:
        check_tls(config)  # fail now, not once the models are loaded
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NO_MODEL
    if config.voices_dir is not None:  # fail now, not at every request that names a voice
        try:
            VoiceStore(config.voices_dir).check()
        except NotADirectoryError as e:
            print(f"error: --voices-dir: {e}", file=sys.stderr)
            return EXIT_NO_MODEL
    if config.usage_log is not None:  # fail now, not at the first finished stream
        try:
            UsageLog(config.usage_log).check()
        except OSError as e:
            print(f"error: --usage-log {config.usage_log}: {e}", file=sys.stderr)
            return EXIT_NO_MODEL
    uvicorn_logging = logs.configure(config.log_format)
    folders = model_folders(args)
    if not folders:
        print(f"error: {how_to_get_a_model(model_base(args))}", file=sys.stderr)
        return EXIT_NO_MODEL
    try:
        registry = ModelRegistry.load(folders, engine_settings_from_args(args))
    except (ModelFolderError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NO_MODEL
    try:
        app = create_app(config, registry)
        _announce(config, registry)
        DrainingServer(uvicorn_config(app, config, **uvicorn_logging), config.drain_timeout_s).run()
    finally:
        registry.close()
    return 0


def _announce(config: ServerConfig, registry: ModelRegistry) -> None:
    for served in registry.models:
        extra = f" (default; also {', '.join(registry.aliases)})" if served is registry.default else ""
        log.info("model %s: %s %s%s", served.id, served.manifest.model_type, served.manifest.model_size, extra)
    root = f"{config.scheme}://{config.host}:{config.port}"
    log.info("OpenAI base_url: %s/v1 (API key %s); the SDKs: %s/sdk/", root,
             "required" if config.api_key else "not required", root)
    if not config.api_key and not is_loopback(config.host):
        log.warning("%s is reachable from other machines and no API key is set: anyone who can reach it can "
                    "use it (set --api-key or QTTS_API_KEY, or bind 127.0.0.1)", config.host)
