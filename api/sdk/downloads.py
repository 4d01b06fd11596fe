"""The SDK downloads: the Python client's wheel and the browser SDK's npm tarball, built on first use and
kept in memory, each with its sha256; their listing as HTML (`GET /sdk/`: links pip's `--find-links`
reads, each with its `#sha256=`) and JSON (`GET /sdk/index.json`: what the console's SDK page shows).

Only these files exist under `/sdk/`: a name is looked up in the built set, never joined to a path. A
source folder that is missing or broken leaves its package out (logged once), not the server down.
"""

from __future__ import annotations

import hashlib
import html
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from api.sdk import npm, wheel

log = logging.getLogger("api.sdk")

KINDS = {"python": "pip", "npm": "npm"}
"""Each package kind and the tool that installs it."""


@dataclass(frozen=True)
class Download:
    """One file under `/sdk/`."""

    name: str
    kind: str
    """"python" (a wheel) or "npm" (an npm package tarball)."""
    package: str
    version: str
    data: bytes
    sha256: str

    @property
    def media_type(self) -> str:
        return "application/zip" if self.kind == "python" else "application/gzip"

    def summary(self) -> dict[str, object]:
        """The file as `/sdk/index.json` lists it (`url`: relative to `/sdk/`)."""
        return {"name": self.name, "kind": self.kind, "installer": KINDS[self.kind], "package": self.package,
                "version": self.version, "sha256": self.sha256, "size": len(self.data), "url": self.name}


def _download(name: str, kind: str, package: str, version: str, data: bytes) -> Download:
    return Download(name, kind, package, version, data, hashlib.sha256(data).hexdigest())


class SdkDownloads:
    """The packages of `client_dir` (the Python client) and `browser_dir` (the browser SDK, published
    with `version`), built once, on first use, from any thread."""

    def __init__(self, client_dir: Path | None, browser_dir: Path | None, version: str):
        self.client_dir, self.browser_dir, self.version = client_dir, browser_dir, version
        self._built: dict[str, Download] | None = None
        self._lock = threading.Lock()

    def files(self) -> dict[str, Download]:
        """Every download by file name (built on the first call; the same objects after)."""
        with self._lock:
            if self._built is None:
                self._built = {d.name: d for d in self._build()}
            return self._built

    def _build(self) -> list[Download]:
        built = []
        if self.client_dir is not None and self.client_dir.is_dir():
            try:
                name, version, data = wheel.build_wheel(self.client_dir)
                built.append(_download(name, "python", wheel.NAME, version, data))
            except (OSError, ValueError, SyntaxError) as e:
                log.warning("the Python client's wheel is not served: %s", e)
        if self.browser_dir is not None and self.browser_dir.is_dir():
            try:
                name, data = npm.build_tarball(self.browser_dir, self.version)
                built.append(_download(name, "npm", npm.NAME, self.version, data))
            except (OSError, ValueError) as e:
                log.warning("the browser SDK's package is not served: %s", e)
        return built

    def listing(self) -> dict[str, object]:
        """`/sdk/index.json`."""
        return {"files": [d.summary() for d in self.files().values()]}

    def listing_html(self) -> str:
        """`/sdk/`: a link per file (relative, with its `#sha256=`, as pip checks it) and its checksum."""
        rows = "".join(
            f'<li><a href="{html.escape(d.name)}#sha256={d.sha256}">{html.escape(d.name)}</a> '
            f"({KINDS[d.kind]}, {len(d.data)} bytes)<br><code>sha256 {d.sha256}</code></li>\n"
            for d in self.files().values())
        return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Qwen3-TTS-X SDKs</title>"
                "</head>\n<body><h1>Qwen3-TTS-X SDKs</h1>\n<p>Install one with <code>pip install URL</code> or "
                "<code>npm install URL</code> (the link's address); the console's SDK panel shows the commands. "
                "<a href=\"index.json\">index.json</a> lists the same.</p>\n<ul>\n" + rows + "</ul></body></html>\n")
