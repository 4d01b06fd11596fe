"""The Python client (`qtts_client/`) as a wheel, built in memory: the same sources give the same bytes.

A wheel is a zip (PEP 427): the package's modules, then `<name>-<version>.dist-info/` with METADATA (core
metadata 2.1: name, version, `Requires-Dist`, the package docstring as its description), WHEEL (pure
Python, `py3-none-any`) and RECORD (each file's sha256 and size), written last. Every entry has the same
timestamp and mode, in sorted order, so no build time or file system shows in the bytes.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import zipfile
from pathlib import Path

from api.sdk.sources import source_files

NAME = "qtts_client"
SUMMARY = "Client for Qwen3-TTS-X servers: speech over HTTP, live text over the qtts.v1 WebSocket"
REQUIRES_PYTHON = ">=3.9"
REQUIRES = ("websockets>=13",)
"""`websockets.asyncio.client` came in 13.0; the rest is the standard library."""
TIMESTAMP = (1980, 1, 1, 0, 0, 0)
"""The earliest time a zip can say: every entry's, so that the bytes depend on the sources alone."""
WHEEL_FILE = (b"Wheel-Version: 1.0\nGenerator: qwen3-tts-x (api/sdk/wheel.py)\nRoot-Is-Purelib: true\n"
              b"Tag: py3-none-any\n")


def package_facts(package_dir: Path) -> tuple[str, str]:
    """(`__version__`, the module docstring) of the package's `__init__.py`, read without importing it.
    ValueError when it has no `__version__ = "..."`."""
    tree = ast.parse((package_dir / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value, ast.get_docstring(tree) or ""
    raise ValueError(f"{package_dir / '__init__.py'} sets no __version__")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _metadata(version: str, description: str) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {version}", f"Summary: {SUMMARY}",
             f"Requires-Python: {REQUIRES_PYTHON}", *(f"Requires-Dist: {r}" for r in REQUIRES),
             "Description-Content-Type: text/plain"]
    return "\n".join(lines) + "\n\n" + description + "\n"


def build_wheel(package_dir: Path) -> tuple[str, str, bytes]:
    """(file name, version, bytes) of the wheel of the package in `package_dir` (its `*.py` files)."""
    version, description = package_facts(package_dir)
    dist_info = f"{NAME}-{version}.dist-info"
    entries = [(f"{NAME}/{name}", data) for name, data in source_files(package_dir, ("*.py",))]
    entries += [(f"{dist_info}/METADATA", _metadata(version, description).encode()),
                (f"{dist_info}/WHEEL", WHEEL_FILE)]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=TIMESTAMP)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data, compresslevel=9)
    return f"{NAME}-{version}-py3-none-any.whl", version, out.getvalue()
