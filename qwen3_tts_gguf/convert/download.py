"""Fetch an official checkpoint: Hugging Face Hub (resumable, with progress) or ModelScope."""

from __future__ import annotations

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

    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW, cache_dir=cache_dir))
    except LocalEntryNotFoundError as e:
        raise DownloadError(
            f"cannot reach the Hugging Face Hub to download {repo_id} (offline?). Download the folder "
            f"elsewhere and run `pull {repo_id} --from-dir DIR`, or try offline with `make-random`.") from e
    except HfHubHTTPError as e:
        raise DownloadError(f"download of {repo_id} failed: {e}") from e
