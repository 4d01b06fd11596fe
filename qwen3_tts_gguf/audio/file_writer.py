"""`AudioFileWriter`: the CLI's file output; writes while audio is generated, through a temp file that takes the
final name on close (a WAV also on interruption, with a header patched to the true length)."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np

from qwen3_tts_gguf.audio.encoding import StreamingEncoder
from qwen3_tts_gguf.audio.formats import SAMPLE_RATE, check_format, format_from_path, wav_header


class AudioFileWriter:
    """Write generated audio to a file as it comes (the CLI's output).

    Args:
        path: output file, or "-" for stdout (raw s16le unless ``format`` is given, flushed per
            chunk).
        format: one of `FORMATS`; None = from the extension (`EXTENSIONS`).
        sample_rate: rate of the incoming chunks.
        speed: tempo factor, as in `StreamingEncoder`.

    Bytes go to a temp file next to ``path`` (``.<name>.*.part``) that is renamed to ``path`` by
    `close()`, so a half-written file never takes the final name. Used as a context manager,
    leaving on an exception (KeyboardInterrupt included) discards the temp file, except for WAV:
    the WAV is finished with what was made, its header patched to the true length, and renamed.
    A WAV's header carries 0xFFFFFFFF sizes until then, so even a killed run's ``.part`` decodes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: str | None = None,
        sample_rate: int = SAMPLE_RATE,
        *,
        speed: float = 1.0,
    ) -> None:
        self.path = path if path == "-" else Path(path)
        if format is None:
            format = "pcm" if path == "-" else format_from_path(path)
        self.format = check_format(format)
        self._encoder = StreamingEncoder(format, sample_rate, speed)
        self._tmp: Path | None = None
        self._closed = False
        if self.path == "-":
            self._file: BinaryIO = sys.stdout.buffer
        else:
            # not mkstemp: its 0600 mode would stick to the final file; "x" still never clobbers
            target = self.path.absolute()
            self._tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
            self._file = open(self._tmp, "x+b")

    @property
    def num_samples(self) -> int:
        """Samples written so far (after the speed change)."""
        return self._encoder.num_samples

    def write(self, chunk: np.ndarray) -> None:
        """Encode and write one chunk of float mono samples."""
        if self._closed:
            raise RuntimeError("writer is closed")
        data = self._encoder.encode(chunk)
        if data:
            self._file.write(data)
            if self._tmp is None:
                self._file.flush()

    def close(self) -> None:
        """Flush everything and give the file its final name. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._file.write(self._encoder.finish())
            self._finalize()
        except BaseException:
            self._discard()
            raise

    def abort(self) -> None:
        """Stop after an interruption: keep a WAV (valid, true length), discard other formats."""
        if self._closed:
            return
        self._closed = True
        if self.format == "wav" and self._tmp is not None:
            try:
                self._file.write(self._encoder.finish())
            except Exception:  # keep what is already in the file
                self._encoder.close()
            try:
                self._finalize()
                return
            except Exception:
                pass
        self._encoder.close()
        if self._tmp is None:  # stdout: pass on what was made, if the reader is still there
            try:
                self._file.flush()
            except OSError:
                pass
        self._discard()

    def __enter__(self) -> AudioFileWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _finalize(self) -> None:
        if self._tmp is None:
            self._file.flush()
            return
        if self.format == "wav":
            # whole samples only: the encoder never writes half of one
            size = self._file.seek(0, os.SEEK_END)
            self._file.seek(0)
            self._file.write(wav_header(self._encoder.sample_rate, (size - 44) // 2))
        elif (header := self._encoder.final_header()) is not None:
            self._file.seek(header[0])
            self._file.write(header[1])
        self._file.close()
        os.replace(self._tmp, self.path)
        self._tmp = None

    def _discard(self) -> None:
        if self._tmp is None:
            return
        self._file.close()
        self._tmp.unlink(missing_ok=True)
        self._tmp = None
