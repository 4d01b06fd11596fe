"""The browser SDK (`webui/browser-sdk/`: ES modules and their `.d.ts`) as an npm package tarball, built in
memory: the same sources give the same bytes.

An npm tarball is a gzipped tar whose entries lie under `package/`: `package.json` (written here: name,
version, `"type": "module"`, the entry point and its types) and the package's files. Every entry has npm's
own fixed time (`npm pack` writes 1985-10-26 08:15 UTC), mode 0644 and owner 0, in sorted order; the gzip
header has no time or name.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

from api.sdk.sources import source_files

NAME = "qwen3-tts-x"
DESCRIPTION = ("Browser SDK for Qwen3-TTS-X servers: the qtts.v1 socket (/v1/ws), OpenAI's Realtime API "
               "(/v1/realtime) and playback through WebAudio")
ENTRY, TYPES = "index.js", "index.d.ts"
NPM_MTIME = 499162500
"""1985-10-26T08:15:00Z, the time `npm pack` gives every entry."""


def package_json(version: str, files: list[str]) -> bytes:
    doc = {"name": NAME, "version": version, "description": DESCRIPTION, "type": "module", "main": f"./{ENTRY}",
           "module": f"./{ENTRY}", "types": f"./{TYPES}",
           "exports": {".": {"types": f"./{TYPES}", "import": f"./{ENTRY}", "default": f"./{ENTRY}"}},
           "files": files, "sideEffects": False, "keywords": ["tts", "text-to-speech", "websocket", "webaudio"]}
    return (json.dumps(doc, indent=2) + "\n").encode()


def build_tarball(sdk_dir: Path, version: str) -> tuple[str, bytes]:
    """(file name, bytes) of the npm package of the browser SDK in `sdk_dir` (its `*.js` and `*.d.ts`).
    ValueError when its entry point or types are missing."""
    files = source_files(sdk_dir, ("*.js", "*.d.ts"))
    names = [name for name, _ in files]
    if ENTRY not in names or TYPES not in names:
        raise ValueError(f"{sdk_dir}: no {ENTRY} or {TYPES}")
    entries = sorted([("package.json", package_json(version, names)), *files])
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(f"package/{name}")
            info.size, info.mtime, info.mode = len(data), NPM_MTIME, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return f"{NAME}-{version}.tgz", out.getvalue()
