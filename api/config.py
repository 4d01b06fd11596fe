"""Server settings: what `python -m qwen3_tts_gguf serve` was asked for."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from qwen3_tts_gguf import EngineSettings
from qwen3_tts_gguf.data_dirs import PROJECT_ROOT, voices_dir

from api.limits import ServerLimits, parse_networks

API_KEY_ENV = "QTTS_API_KEY"
SERVE_WARM_UP_VOICES = ("alloy",)  # OpenAI's best-known voice: what most clients send first
DEFAULT_WEBUI_DIR = PROJECT_ROOT / "webui"
DEFAULT_CLIENT_DIR = PROJECT_ROOT / "qtts_client"


@dataclass(frozen=True)
class ServerConfig:
    """Everything the HTTP layer needs to know besides the models themselves."""

    host: str = "127.0.0.1"
    port: int = 8100
    api_key: str | None = None
    """Required as `Authorization: Bearer <key>` on the API routes; None = open server."""
    public_listings: bool = False
    """GET /v1/audio/voices and /v1/audio/models answer without the key (Open WebUI reads them keyless)."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed to call the API ("*" = any); empty = no CORS headers."""
    voices_dir: Path | None = None
    """Voice profiles folder (used by the voice-profile store, see `voices.VoiceProfiles`)."""
    webui_dir: Path | None = DEFAULT_WEBUI_DIR
    """Static web console served at `/` when the folder exists."""
    limits: ServerLimits = ServerLimits()
    """Bounds on size, time and count (`api/limits.py`)."""
    drain_timeout_s: float = 60.0
    """On SIGTERM/SIGINT, how long streams in flight may take to finish (`api/ops/lifecycle.py`)."""
    log_format: Literal["text", "json"] = "text"
    """"text", or "json": one object per log line and an access record per request (`api/ops/logs.py`)."""
    usage_log: Path | None = None
    """A file that gets one JSON line per finished stream, every route (`api/speaking/usage.py`); None = none."""
    wyoming_port: int | None = None
    """A TCP port for Wyoming, Home Assistant's voice protocol (`api/protocols/wyoming.py`); None = none, 0 = any
    free one."""
    wyoming_host: str | None = None
    """Where the Wyoming port listens; None = `host`."""
    warm_up_voices: tuple[str, ...] = ()
    """Voices that speak a short text before the port opens (`api/speaking/warm_up.py`); `serve` defaults to
    alloy, an app made in code to none (its engines may be test doubles)."""
    root_path: str = ""
    """The path prefix a proxy serves this server under ("/tts"; "" = none): uvicorn's `root_path`
    (`api/ops/forwarded.py`; a trusted proxy's `X-Forwarded-Prefix` stands in for it per request)."""
    ssl_certfile: Path | None = None
    """TLS: the certificate chain (PEM) served on the port; None = plain HTTP (uvicorn's `ssl_certfile`)."""
    ssl_keyfile: Path | None = None
    """TLS: its private key (PEM); None = in `ssl_certfile`."""
    replica_id: str | None = None
    """This replica's name behind a load balancer ("r1"; None = none): it prefixes every resume token
    (`r1.` + the secret part) so a balancer can send a resume to the replica that holds its stream
    (`api/protocols/resume.py`, docs/deploy.md "Many machines")."""
    client_dir: Path | None = DEFAULT_CLIENT_DIR
    """The Python client package (`qtts_client/`) served as a wheel under `/sdk/` when it exists
    (`api/sdk/`); the browser SDK is `webui_dir / "browser-sdk"`."""

    @property
    def scheme(self) -> str:
        """"https" when the port speaks TLS, else "http"."""
        return "https" if self.ssl_certfile is not None else "http"

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServerConfig:
        """From the `serve` arguments (a flag left out keeps its default); QTTS_API_KEY stands in for a
        missing --api-key."""
        given = {name: getattr(args, name) for name in ("drain_timeout_s", "log_format", "usage_log", "wyoming_port",
                                                        "wyoming_host", "root_path", "ssl_certfile", "ssl_keyfile",
                                                        "replica_id")
                 if getattr(args, name, None) is not None}
        warm_up_voices = getattr(args, "warm_up_voices", None)
        return cls(
            host=args.host,
            port=args.port,
            api_key=args.api_key or environ.get(API_KEY_ENV) or None,
            public_listings=bool(getattr(args, "public_listings", False)),
            cors_origins=tuple(args.cors_origin or ()),
            voices_dir=args.voices_dir or voices_dir(),
            limits=limits_from_args(args),
            warm_up_voices=SERVE_WARM_UP_VOICES if warm_up_voices is None else warm_up_voices,
            **given,
        )


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """ServerLimits from the `serve` flags (one per field, same name): each flag given overrides its
    default. ValueError for a --trusted-proxies entry that is no address or network."""
    given = {f.name: getattr(args, f.name) for f in fields(ServerLimits) if getattr(args, f.name, None) is not None}
    for name in ("trusted_proxies", "allowed_hosts"):
        if name in given:
            given[name] = tuple(given[name])
    parse_networks(given.get("trusted_proxies", ()))
    return ServerLimits(**given)


def engine_settings_from_args(args: argparse.Namespace, *, check_devices: bool = True) -> EngineSettings:
    """The engine knobs of `serve` (--threads, --max-streams, --max-queue, --max-live-waiting,
    --max-buffered-audio-s, --deterministic, --gpu-layers, --device, --kv-cache, --n-ctx, --no-codec-overlap,
    --codec-threads, --heap-map-threshold, --cp-runtime, --codec-runtime, --prefix-cache, --runaway,
    --runaway-retries). The device settings are checked against this installation
    (`qwen3_tts_gguf.host.devices`): ValueError (DeviceError) when GPU layers are asked of a llama.cpp without a
    GPU backend or device, or --device names a provider not installed; the resolved plan is logged."""
    if check_devices:
        from qwen3_tts_gguf.doctor import check_device_settings

        plan = check_device_settings(args.gpu_layers, args.device, args.codec_runtime, args.deterministic,
                                     cp_runtime=args.cp_runtime)
        logging.getLogger("api.server").info("devices: %s", plan)
    return EngineSettings(threads=args.threads, max_streams=args.max_streams, max_pending=args.max_queue,
                          max_pending_live=args.max_live_waiting, max_buffered_audio_s=args.max_buffered_audio_s,
                          deterministic=args.deterministic, gpu_layers=args.gpu_layers, device=args.device,
                          kv_cache=args.kv_cache, n_ctx=args.n_ctx or 0, codec_overlap=not args.no_codec_overlap,
                          codec_threads=args.codec_threads or 0, heap_map_threshold=args.heap_map_threshold,
                          codec_runtime=args.codec_runtime, cp_runtime=args.cp_runtime,
                          prefix_cache=args.prefix_cache, runaway=args.runaway, runaway_retries=args.runaway_retries)
