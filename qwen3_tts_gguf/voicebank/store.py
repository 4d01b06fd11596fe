"""Voice profiles: one JSON file per cloned voice in a folder (default `paths.voices_dir()`).

A profile holds what a Base model needs to speak in a cloned voice: the speaker embedding
(x-vector, float32 [H], base64) and, for ICL cloning, the reference transcript and reference codes
(int16 [T, 16], base64; a plain list of lists is accepted on load). It records the model it was
made with (family, type "base", size, hidden size): an x-vector only fits the speaker encoder and
talker of that model size.

File layout (`<name>.json`, format_version 1)::

    {"format_version": 1, "name": "alice", "model_family": "qwen3-tts-12hz", "model_type": "base",
     "model_size": "0.6b", "hidden_size": 1024, "language": "auto", "mode": "icl",
     "ref_text": "...", "created_at": "2026-01-01T00:00:00Z",
     "speaker_embedding": {"dtype": "float32", "shape": [1024], "data": "<base64, little endian>"},
     "ref_codes": {"dtype": "int16", "shape": [T, 16], "data": "<base64, little endian>"}}

`VoiceStore` writes through a temporary file in the same folder: a profile file is either the old
complete file or the new complete file, never a partial one. Creating (overwrite=False) links the
finished temporary file to its name (`os.link` fails if the name exists), so of several concurrent
creates of one name exactly one succeeds and the others get `VoiceExistsError`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
MODEL_FAMILY = "qwen3-tts-12hz"
MODEL_TYPE = "base"
MODES = ("xvector", "icl")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_FILE_BYTES = 4 * 1024 * 1024
NUM_CODEBOOKS = 16
CODEBOOK_SIZE = 2048
SUFFIX = ".json"
_STALE_TEMP_SECONDS = 3600


class VoiceProfileError(ValueError):
    """A voice profile (or name) that cannot be used; the message says why."""


class VoiceNotFoundError(VoiceProfileError, LookupError):
    """No profile of that name."""


class VoiceExistsError(VoiceProfileError):
    """A profile of that name exists already (save with overwrite=True to replace it)."""


def validate_name(name: object) -> str:
    """The name if it is a safe profile name, else VoiceProfileError."""
    if not isinstance(name, str) or not name:
        raise VoiceProfileError("a voice name must be a non-empty string")
    if not NAME_RE.fullmatch(name) or ".." in name:
        raise VoiceProfileError(
            f"invalid voice name {name!r}: use 1-64 characters A-Z a-z 0-9 _ . -, starting with a letter or "
            "digit, without '..'")
    return name


def _encode_array(a: np.ndarray, dtype: str) -> dict:
    arr = np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))
    return {"dtype": dtype, "shape": list(arr.shape), "data": base64.b64encode(arr.tobytes()).decode("ascii")}


def _decode_array(obj: object, dtype: str, what: str) -> np.ndarray:
    if isinstance(obj, list):  # plain JSON numbers
        try:
            arr = np.asarray(obj, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise VoiceProfileError(f"{what} is not a numeric array ({e})") from e
        if np.dtype(dtype).kind in "iu":
            if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
                raise VoiceProfileError(f"{what} must contain integers")
        return arr.astype(dtype)
    if not isinstance(obj, dict) or set(obj) - {"dtype", "shape", "data"} or not {"shape", "data"} <= set(obj):
        raise VoiceProfileError(f"{what} must be a list or an object with dtype, shape and data")
    if obj.get("dtype", dtype) != dtype:
        raise VoiceProfileError(f"{what} has dtype {obj.get('dtype')!r}; expected {dtype!r}")
    shape = obj["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise VoiceProfileError(f"{what} has an invalid shape {shape!r}")
    try:
        raw = base64.b64decode(obj["data"], validate=True)
    except (TypeError, ValueError) as e:
        raise VoiceProfileError(f"{what} data is not valid base64 ({e})") from e
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if len(raw) != expected:
        raise VoiceProfileError(f"{what} data has {len(raw)} bytes; shape {shape} needs {expected}")
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class VoiceProfile:
    """A cloned voice for a Base model (see the module docstring for the file format)."""

    name: str
    model_size: str  # "0.6b" | "1.7b"
    hidden_size: int  # talker width = x-vector length
    speaker_embedding: np.ndarray  # float32 [hidden_size]
    mode: str = "xvector"  # "xvector" | "icl"
    language: str = "auto"
    ref_text: str | None = None  # ICL: transcript of the reference audio
    ref_codes: np.ndarray | None = None  # ICL: int64 [T, 16] codec codes of the reference audio
    created_at: str = field(default_factory=_utc_now)
    model: str = ""  # name of the converted model it was made with (the model it speaks with by default)
    model_family: str = MODEL_FAMILY
    model_type: str = MODEL_TYPE
    format_version: int = FORMAT_VERSION

    @classmethod
    def create(cls, **kwargs) -> "VoiceProfile":
        """A validated new profile."""
        profile = cls(**kwargs)
        profile.validate()
        return profile

    def validate(self) -> None:
        """Raise VoiceProfileError unless every field is consistent."""
        validate_name(self.name)
        if self.format_version != FORMAT_VERSION:
            raise VoiceProfileError(f"voice {self.name!r} has format_version {self.format_version!r}; this "
                                    f"version reads {FORMAT_VERSION}")
        if self.model_family != MODEL_FAMILY:
            raise VoiceProfileError(f"voice {self.name!r} was made for model family {self.model_family!r}, not "
                                    f"{MODEL_FAMILY!r}; create it again with this model")
        if self.model_type != MODEL_TYPE:
            raise VoiceProfileError(f"voice {self.name!r} is for a {self.model_type!r} model; cloned voices need a "
                                    "Base model")
        if not isinstance(self.model_size, str) or not self.model_size:
            raise VoiceProfileError(f"voice {self.name!r} has no model_size")
        if not isinstance(self.hidden_size, int) or isinstance(self.hidden_size, bool) or self.hidden_size <= 0:
            raise VoiceProfileError(f"voice {self.name!r} has an invalid hidden_size {self.hidden_size!r}")
        if self.mode not in MODES:
            raise VoiceProfileError(f"voice {self.name!r} has mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if not isinstance(self.language, str) or not self.language:
            raise VoiceProfileError(f"voice {self.name!r} has an invalid language {self.language!r}")
        if not isinstance(self.model, str):
            raise VoiceProfileError(f"voice {self.name!r} has an invalid model name")
        if not isinstance(self.created_at, str):
            raise VoiceProfileError(f"voice {self.name!r} has an invalid created_at")
        emb = np.asarray(self.speaker_embedding)
        if emb.shape != (self.hidden_size,):
            raise VoiceProfileError(f"voice {self.name!r}: speaker embedding has shape {list(emb.shape)}, expected "
                                    f"[{self.hidden_size}]")
        if not np.all(np.isfinite(emb)):
            raise VoiceProfileError(f"voice {self.name!r}: speaker embedding has NaN or infinite values")
        self.speaker_embedding = emb.astype(np.float32)
        if self.mode == "icl":
            if not isinstance(self.ref_text, str) or not self.ref_text.strip():
                raise VoiceProfileError(f"voice {self.name!r} is an ICL voice but has no reference text")
            if self.ref_codes is None:
                raise VoiceProfileError(f"voice {self.name!r} is an ICL voice but has no reference codes")
        elif self.ref_text is not None and not isinstance(self.ref_text, str):
            raise VoiceProfileError(f"voice {self.name!r} has an invalid ref_text")
        if self.ref_codes is not None:
            codes = np.asarray(self.ref_codes)
            if codes.ndim != 2 or codes.shape[1] != NUM_CODEBOOKS or codes.shape[0] < 1:
                raise VoiceProfileError(f"voice {self.name!r}: reference codes have shape {list(codes.shape)}, "
                                        f"expected [T >= 1, {NUM_CODEBOOKS}]")
            if codes.dtype.kind not in "iu" or codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
                raise VoiceProfileError(f"voice {self.name!r}: reference codes must be integers in "
                                        f"0..{CODEBOOK_SIZE - 1}")
            self.ref_codes = codes.astype(np.int64)

    def check_model(self, model_type: str, model_size: str, hidden_size: int) -> None:
        """Raise VoiceProfileError unless this voice fits a model (type, size, hidden size)."""
        if model_type != MODEL_TYPE:
            raise VoiceProfileError(f"voice {self.name!r} is a cloned voice; it needs a Base model, not "
                                    f"{model_type!r}")
        if model_size != self.model_size or int(hidden_size) != self.hidden_size:
            raise VoiceProfileError(f"voice {self.name!r} was made with the {self.model_size} Base model "
                                    f"(hidden {self.hidden_size}); this model is {model_size} (hidden "
                                    f"{hidden_size}): create the voice again with this model")

    def voice_spec(self, language: str | None = None, instruct: str | None = None):
        """The engine's VoiceSpec for this voice (x-vector, plus transcript and codes in ICL mode)."""
        from qwen3_tts_gguf.model.prompt import ReferencePrompt, VoiceSpec

        reference = ReferencePrompt(self.ref_text, self.ref_codes) if self.mode == "icl" else None
        return VoiceSpec(speaker_embedding=self.speaker_embedding, instruct=instruct,
                         language=language or self.language, reference=reference)

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        self.validate()
        d = {
            "format_version": self.format_version, "name": self.name, "model_family": self.model_family,
            "model_type": self.model_type, "model_size": self.model_size, "hidden_size": self.hidden_size,
            "language": self.language, "mode": self.mode, "ref_text": self.ref_text, "created_at": self.created_at,
            "model": self.model,
            "speaker_embedding": _encode_array(self.speaker_embedding, "float32"),
            "ref_codes": None if self.ref_codes is None else _encode_array(self.ref_codes, "int16"),
        }
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: object, *, source: str = "voice profile") -> "VoiceProfile":
        if not isinstance(d, dict):
            raise VoiceProfileError(f"{source} is not a JSON object")
        if d.get("format_version") != FORMAT_VERSION:
            raise VoiceProfileError(f"{source} has format_version {d.get('format_version')!r}; this version reads "
                                    f"{FORMAT_VERSION}")
        if d.get("model_family") != MODEL_FAMILY:
            raise VoiceProfileError(f"{source} was made for model family {d.get('model_family')!r}, not "
                                    f"{MODEL_FAMILY!r}; create the voice again with this model")
        known = {"format_version", "name", "model_family", "model_type", "model_size", "hidden_size", "language",
                 "mode", "ref_text", "created_at", "speaker_embedding", "ref_codes", "model"}
        missing = {"name", "model_type", "model_size", "hidden_size", "mode", "speaker_embedding"} - set(d)
        if missing:
            raise VoiceProfileError(f"{source} lacks {', '.join(sorted(missing))}")
        unknown = set(d) - known
        if unknown:
            raise VoiceProfileError(f"{source} has unknown fields {', '.join(sorted(unknown))}")
        codes = d.get("ref_codes")
        profile = cls(
            name=d["name"], model_size=d["model_size"], hidden_size=d["hidden_size"],
            speaker_embedding=_decode_array(d["speaker_embedding"], "float32", f"{source}: speaker_embedding"),
            mode=d["mode"], language=d.get("language", "auto"), ref_text=d.get("ref_text"),
            ref_codes=None if codes is None else _decode_array(codes, "int16", f"{source}: ref_codes"),
            created_at=d.get("created_at", ""), model=d.get("model", ""), model_family=d["model_family"],
            model_type=d["model_type"],
            format_version=d["format_version"],
        )
        profile.validate()
        return profile

    @classmethod
    def from_json(cls, text: str, *, source: str = "voice profile") -> "VoiceProfile":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise VoiceProfileError(f"{source} is not valid JSON ({e})") from e
        return cls.from_dict(d, source=source)


class VoiceStore:
    """Voice profiles as `<name>.json` files in one folder."""

    def __init__(self, folder: str | os.PathLike | None = None):
        if folder is None:
            from qwen3_tts_gguf.data_dirs import voices_dir

            folder = voices_dir()
        self.folder = Path(folder)

    def check(self) -> None:
        """Raise NotADirectoryError when the folder is something other than a folder (it need not exist
        yet: the first saved voice makes it)."""
        if self.folder.exists() and not self.folder.is_dir():
            raise NotADirectoryError(f"{self.folder} is not a folder")

    def path(self, name: str) -> Path:
        return self.folder / (validate_name(name) + SUFFIX)

    def list(self) -> list[str]:
        """Names of the stored profiles (files with a valid name), sorted."""
        if not self.folder.is_dir():
            return []
        names = []
        for p in self.folder.iterdir():
            if p.suffix == SUFFIX and p.is_file() and NAME_RE.fullmatch(p.stem) and ".." not in p.stem:
                names.append(p.stem)
        return sorted(names)

    def get(self, name: str) -> VoiceProfile:
        """The profile `name`, validated; VoiceNotFoundError / VoiceProfileError otherwise."""
        path = self.path(name)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError):  # (a folder that is not one holds no voice, as in list)
            raise VoiceNotFoundError(f"no voice named {name!r}") from None
        except IsADirectoryError:
            raise VoiceProfileError(f"voice profile {name!r} is not a file") from None
        if len(raw) > MAX_FILE_BYTES:
            raise VoiceProfileError(f"voice profile {name!r} is larger than {MAX_FILE_BYTES} bytes; not a voice "
                                    "profile")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VoiceProfileError(f"voice profile {name!r} is not UTF-8 text (byte {e.start})") from e
        profile = VoiceProfile.from_json(text, source=f"voice profile {name!r}")
        if profile.name != name:
            raise VoiceProfileError(f"voice profile {name!r} holds voice {profile.name!r}")
        return profile

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    def save(self, profile: VoiceProfile, overwrite: bool = False) -> Path:
        """Write `profile` atomically; VoiceExistsError if it exists and overwrite is False."""
        path = self.path(profile.name)
        data = profile.to_json().encode("utf-8")
        if len(data) > MAX_FILE_BYTES:  # `get` would refuse it: never save what cannot be read back
            raise VoiceProfileError(f"voice {profile.name!r} would take {len(data)} bytes; a profile holds at most "
                                    f"{MAX_FILE_BYTES} (a shorter transcript or reference clip fits)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()
        fd, tmp = tempfile.mkstemp(prefix=f".{profile.name}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:
                self._create_exclusive(tmp, path, profile.name)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self._fsync_folder()
        return path

    def _create_exclusive(self, tmp: str, path: Path, name: str) -> None:
        try:
            os.link(tmp, path)  # atomic, fails when the name exists: one of concurrent creates wins
            return
        except FileExistsError:
            raise VoiceExistsError(f"a voice named {name!r} exists already (overwrite to replace it)") from None
        except (AttributeError, OSError):
            pass  # no hard links here (platform or file system)
        # file systems without hard links: an O_EXCL lock file serialises creators
        lock = path.with_name(f".{name}.lock")
        try:
            lock_fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise VoiceExistsError(f"a voice named {name!r} is being created by another request") from None
        try:
            if path.exists():
                raise VoiceExistsError(f"a voice named {name!r} exists already (overwrite to replace it)")
            os.replace(tmp, path)
        finally:
            os.close(lock_fd)
            os.unlink(lock)

    def _fsync_folder(self) -> None:
        try:
            fd = os.open(self.folder, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _remove_stale_temps(self) -> None:
        """Temporary files of writers that died (older than an hour)."""
        now = time.time()
        for p in self.folder.glob(".*.tmp"):
            try:
                if now - p.stat().st_mtime > _STALE_TEMP_SECONDS:
                    p.unlink()
            except OSError:
                pass

    def delete(self, name: str) -> None:
        """Remove profile `name`; VoiceNotFoundError if there is none."""
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            raise VoiceNotFoundError(f"no voice named {name!r}") from None


__all__ = ["VoiceProfile", "VoiceStore", "VoiceProfileError", "VoiceNotFoundError", "VoiceExistsError",
           "validate_name", "MODEL_FAMILY", "FORMAT_VERSION"]
