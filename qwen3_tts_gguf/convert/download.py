"""Fetch an official checkpoint: Hugging Face Hub (resumable, with progress) or ModelScope.

A Hub download is checked before anything converts it: each file of the snapshot is a link to a blob
named by its ETag, which for the Hub is the file's content hash (sha256 for LFS files such as
`model.safetensors`, the git blob sha1 for the others). A file whose bytes do not match is removed
from the cache (so the next run downloads it again) and the pull fails, naming it.

Progress: on a terminal, huggingface_hub's bars. Without one (a Kubernetes Job's log, a pipe) those
show only the count of files, so a line says the bytes on disk against the repository's total every
5 % (or 30 s) instead (`ProgressLines`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import re
import sys
import threading
import time
from pathlib import Path

ALLOW = ["*.json", "*.safetensors", "*.txt", "speech_tokenizer/*"]


class DownloadError(RuntimeError):
    """A download that could not complete, with what to do about it."""


def download_checkpoint(repo_id: str, source: str = "huggingface", cache_dir: Path | None = None) -> Path:
    """Download `repo_id` (resuming partial files) and return the local checkpoint folder."""
    if source == "modelscope":
        try:
            from modelscope import snapshot_download as ms_download
        except ImportError as e:
            raise DownloadError("ModelScope downloads need `pip install modelscope`") from e
        try:
            return Path(ms_download(repo_id, cache_dir=str(cache_dir) if cache_dir else None))
        except Exception as e:
            raise DownloadError(f"ModelScope download of {repo_id} failed: {e}") from e
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    lines = None if sys.stderr.isatty() else ProgressLines(repo_id, cache_dir)
    try:
        with lines or contextlib.nullcontext():
            folder = Path(snapshot_download(repo_id, allow_patterns=ALLOW, cache_dir=cache_dir))
    except LocalEntryNotFoundError as e:
        raise DownloadError(
            f"cannot reach the Hugging Face Hub to download {repo_id} (offline?). Download the folder "
            f"elsewhere and run `pull {repo_id} --from-dir DIR`, or try offline with `make-random`.") from e
    except HfHubHTTPError as e:
        raise DownloadError(f"download of {repo_id} failed: {e}") from e
    verify_snapshot(folder, repo_id)
    return folder


_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")


def _content_hash(path: Path, git_blob: bool) -> str:
    """sha256 of the file, or its git blob sha1 (`sha1("blob <size>\\0" + content)`)."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size) if git_blob else hashlib.sha256()  # noqa: S324 - git's
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify_snapshot(folder: Path, repo_id: str) -> None:
    """Every file of a Hub cache snapshot whose blob is named by a content hash has that hash; DownloadError
    (after removing the bad blob and its link, so the next run fetches it again) when one has not."""
    for link in sorted(p for p in folder.rglob("*") if p.is_symlink()):
        blob = link.resolve()
        expected = blob.name
        git_blob = bool(_GIT_SHA1.fullmatch(expected))
        if not blob.is_file() or not (git_blob or _SHA256.fullmatch(expected)):
            continue  # not a content-addressed blob (another cache layout): nothing to check against
        got = _content_hash(blob, git_blob)
        if got != expected:
            blob.unlink(missing_ok=True)
            link.unlink(missing_ok=True)
            raise DownloadError(
                f"download of {repo_id} is corrupted: {link.relative_to(folder)} has "
                f"{'git sha1' if git_blob else 'sha256'} {got}, the Hub says {expected}. The file was removed from "
                "the download cache: run pull again to download it anew.")


class ProgressLines:
    """While a Hub download runs: a line on stderr each time the bytes in the repository's cache folder
    (finished and partial files) grow by 5 % of the total (the allowed files' sizes, from the Hub's
    file list; unknown: every 30 s), and one at the end."""

    POLL_S = 0.5
    STEP = 5.0
    QUIET_S = 30.0

    def __init__(self, repo_id: str, cache_dir: Path | None):
        from huggingface_hub import constants

        self.repo_id = repo_id
        cache = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
        self.blobs = cache / f"models--{repo_id.replace('/', '--')}" / "blobs"
        self.total: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="download-progress", daemon=True)

    def _total(self) -> int | None:
        try:
            from huggingface_hub import HfApi

            info = HfApi().model_info(self.repo_id, files_metadata=True)
            sizes = [s.size for s in info.siblings or [] if any(fnmatch.fnmatch(s.rfilename, p) for p in ALLOW)]
            return sum(sizes) if sizes and None not in sizes else None
        except Exception:  # noqa: BLE001 - only the percentage is lost
            return None

    def _on_disk(self) -> int:
        try:
            return sum(p.stat().st_size for p in self.blobs.iterdir() if p.is_file())
        except OSError:
            return 0

    def _say(self, done: int) -> None:
        of = f" of {self.total / 1e6:.1f} MB ({100 * done / self.total:.0f} %)" if self.total else ""
        print(f"downloading {self.repo_id}: {done / 1e6:.1f} MB{of}", file=sys.stderr, flush=True)

    def _run(self) -> None:
        self.total = self._total()
        said, said_at, last = -self.STEP, time.monotonic(), -1
        while not self._stop.wait(self.POLL_S):
            done = self._on_disk()
            if done == last:
                continue
            last = done
            percent = 100 * done / self.total if self.total else None
            if (percent is not None and percent - said >= self.STEP) or time.monotonic() - said_at >= self.QUIET_S:
                self._say(done)
                said, said_at = percent if percent is not None else said, time.monotonic()

    def __enter__(self) -> ProgressLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        if exc[0] is None:
            self._say(self._on_disk())
