"""`serve`'s command line: every flag of the server, derived from its settings where they live.

The limits' flags come from `ServerLimits`' fields (`api/limits.py`: each field's help and type);
the engine's knobs are the ones `synth` takes too (`qwen3_tts_gguf/flags.py`). Every flag also reads
`QTTS_<FLAG>` (`qwen3_tts_gguf/env_flags.py`). The engine's CLI hands the `serve` command over here
(`qwen3_tts_gguf/cli.py`), the one place where the engine reaches into the server.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

from qwen3_tts_gguf import EngineSettings
from qwen3_tts_gguf.env_flags import env_name
from qwen3_tts_gguf.flags import PORT, SECONDS, add_device_args, add_runaway_args, number, threads_flag
from qwen3_tts_gguf.model.settings import MAX_BUFFERED_AUDIO_S, MAX_PENDING, MAX_PREFIX_CACHE, MAX_STREAMS

from api.limits import ServerLimits, resume_window
from api.ops.path_prefix import path_prefix

SERVE_ENV_PREFIX = "QTTS_"


MAX_WARM_UP_VOICES = 16


def voice_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated voice names (at most 16, each at most 128 characters);
    "" or "none": none."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if names == ("none",):
        return ()
    if len(names) > MAX_WARM_UP_VOICES or any(len(name) > 128 for name in names):
        raise argparse.ArgumentTypeError(f"at most {MAX_WARM_UP_VOICES} voice names of at most 128 characters")
    return names


def root_path(text: str) -> str:
    """An argparse type: a path prefix ("/tts"; "tts" and "/tts/" are the same; "" or "/": none)."""
    try:
        return path_prefix(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


root_path.__name__ = "path"

MAX_REPLICA_ID_CHARS = 63
"""A DNS label's length: a pod's name fits (QTTS_REPLICA_ID from the downward API, deploy/kubernetes)."""
_REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def replica_id(text: str) -> str | None:
    """An argparse type: a replica's name (letters, digits, `-` and `_`, at most MAX_REPLICA_ID_CHARS;
    no dot: it ends the resume token's prefix); "" = none."""
    if not text:
        return None
    if len(text) > MAX_REPLICA_ID_CHARS or not _REPLICA_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a replica id is letters, digits, - and _ (at most "
                                         f"{MAX_REPLICA_ID_CHARS} characters)")
    return text


replica_id.__name__ = "name"


def _shown(name: str, value) -> str:
    if name.endswith("_bytes") and value % 1024 == 0:
        return f"{value // 1024} KiB" if value < 1024 * 1024 or value % (1024 * 1024) else f"{value >> 20} MiB"
    return f"{value:g}" if isinstance(value, float) else str(value)


class ServeHelp(argparse.HelpFormatter):
    """Appends each flag's environment variable, and the default of a flag whose default lives in
    api.limits.ServerLimits or api.config.ServerConfig (read from there when help is shown)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None:
            from api.config import ServerConfig  # (the server's whole import: only when help is shown)

            for owner in (ServerLimits(), ServerConfig()):
                default = getattr(owner, action.dest, None)
                if default not in (None, ()):
                    text += f" (default {_shown(action.dest, default)})"
                    break
        name = env_name(action, SERVE_ENV_PREFIX)
        return f"{text} [${name}]" if name else text


def add_limit_args(p: argparse.ArgumentParser) -> None:
    """One flag per field of `ServerLimits` (same name); a flag left out keeps the field's default,
    which the help shows."""
    group = p.add_argument_group("limits", "bounds on what one client may send or hold (api/README.md, Limits)")
    for f in fields(ServerLimits):
        flag, meta = "--" + f.name.replace("_", "-"), f.metadata
        if meta["repeat"]:
            group.add_argument(flag, dest=f.name, action="append", help=meta["help"], metavar=meta["repeat"])
        else:
            group.add_argument(flag, dest=f.name, type=meta["parse"], help=meta["help"],
                               metavar="SECONDS" if meta["parse"] in (SECONDS, resume_window)
                               else "BYTES" if f.name.endswith("_bytes") else "N")


def run(args: argparse.Namespace) -> int:
    """`serve`: load the models, then serve until a signal drains the server (`api/server.py`)."""
    from api.server import run_server

    return run_server(args)


def add_serve_command(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `serve` subcommand with all its flags."""
    p = sub.add_parser("serve", help="OpenAI-compatible speech server with the web console",
                       formatter_class=ServeHelp, env_prefix=SERVE_ENV_PREFIX,
                       description="Every flag also reads the environment variable QTTS_<FLAG> (--max-streams: "
                                   "QTTS_MAX_STREAMS; repeatable flags: a comma-separated list; on/off flags: "
                                   "1/true/yes or 0/false/no); a flag on the command line wins.")
    p.add_argument("--model", type=Path, action="append", help="model folder (repeat; default: all of --model-base)")
    p.add_argument("--model-base", type=Path, help="folder of converted models (default: model-base/)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    p.add_argument("--port", type=PORT, default=8100, help="port (default %(default)s)")
    p.add_argument("--api-key", help="require this key")
    p.add_argument("--public-listings", action="store_true",
                   help="GET /v1/audio/voices and /v1/audio/models answer without the key (Open WebUI reads them "
                        "without sending it)")
    p.add_argument("--cors-origin", action="append", default=[], help="allowed CORS origin (repeat; '*' for any)")
    p.add_argument("--voices-dir", type=Path, help="voice profiles folder (default: voices/)")
    p.add_argument("--threads", **threads_flag("CPU threads per model"))
    p.add_argument("--max-streams", type=number(int, 1, MAX_STREAMS), default=8, metavar="N",
                   help=f"streams synthesised at once per model (1 to {MAX_STREAMS}; default %(default)s)")
    p.add_argument("--max-queue", type=number(int, 0, MAX_PENDING), default=32, metavar="N",
                   help=f"requests waiting for a slot before 429 (0 to {MAX_PENDING}; default %(default)s)")
    p.add_argument("--max-live-waiting", type=number(int, 0, MAX_PENDING), default=64, metavar="N",
                   help="live-text streams (WebSocket) waiting for their first words, apart from --max-queue; "
                        f"429 above (0 to {MAX_PENDING}; default %(default)s)")
    p.add_argument("--max-buffered-audio-s", type=number(float, None, MAX_BUFFERED_AUDIO_S, unit="seconds"),
                   default=10.0, metavar="SECONDS",
                   help="seconds of audio a stream may make ahead of its reader before it is paused "
                        f"(above 0, at most {MAX_BUFFERED_AUDIO_S:g}; default %(default)g)")
    p.add_argument("--deterministic", action="store_true", help="F32 KV cache, flash attention off (parity)")
    p.add_argument("--drain-timeout-s", type=SECONDS, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, seconds streams in flight may take to finish before the server stops")
    p.add_argument("--log-format", choices=("text", "json"), help="json: one JSON object per log line, with an "
                                                                  "access record per request")
    p.add_argument("--usage-log", type=Path, metavar="PATH",
                   help="append one JSON line per finished stream (every route: usage, finish reason) to PATH")
    p.add_argument("--wyoming-port", type=PORT, metavar="PORT",
                   help="also serve Wyoming, Home Assistant's voice protocol, on this TCP port (10200 is the usual "
                        "one; no API key there: docs/integrations.md)")
    p.add_argument("--wyoming-host", metavar="ADDRESS", help="address the Wyoming port binds (default: --host)")
    p.add_argument("--root-path", type=root_path, default="", metavar="PREFIX",
                   help="the path a reverse proxy serves this server under and strips (/tts: https://example.com/tts/ "
                        "is this server's /); redirects and /docs carry it (uvicorn's --root-path). A proxy among "
                        "--trusted-proxies may send X-Forwarded-Prefix instead (docs/deploy.md)")
    p.add_argument("--ssl-certfile", type=Path, metavar="PEM",
                   help="serve HTTPS and WSS on --port with this certificate (chain), PEM (uvicorn's --ssl-certfile)")
    p.add_argument("--ssl-keyfile", type=Path, metavar="PEM",
                   help="the certificate's private key, PEM, unencrypted (default: in --ssl-certfile)")
    p.add_argument("--replica-id", type=replica_id, metavar="NAME",
                   help="this replica's name behind a load balancer (letters, digits, - and _; at most "
                        f"{MAX_REPLICA_ID_CHARS}): resume tokens start with 'NAME.' so the balancer can route a "
                        "resume (opened as /v1/ws?replica=NAME) to the replica that holds its stream, and a "
                        "resume on another replica fails naming it (docs/deploy.md)")
    p.add_argument("--warm-up-voices", type=voice_list, metavar="VOICES",
                   help="before the port opens, each of these voices (comma-separated VOICE or VOICE:LANGUAGE, all "
                        "for every model's speakers and fitting profiles up to --prefix-cache, or none) speaks a short "
                        "text on every model it fits, so that first requests find the runtimes warm and that voice's "
                        "prompt prefix cached (default alloy, language auto)")
    p.add_argument("--prefix-cache", type=number(int, 0, MAX_PREFIX_CACHE), default=EngineSettings.prefix_cache,
                   metavar="N",
                   help="voice prompt prefixes (role, speaker and language rows) each model keeps prefilled (their "
                        "KV rows saved: about 0.7 MiB each at 0.6B), so a voice's next request prefills only its "
                        f"text; least recently used first out (0 to {MAX_PREFIX_CACHE}, 0: off; default %(default)s)")
    add_device_args(p)
    add_runaway_args(p)
    add_limit_args(p)
    p.set_defaults(func=run)
    return p
