"""The agent's single checkpoint file.

`checkpoint.json` holds `{"version": 1, "checksum": "sha256:<hex>", "data": {...}}`
where the checksum covers the canonical JSON of `data` (sorted keys, no
whitespace). It is replaced atomically: temp file in the same directory,
write, fsync, rename over the old file, fsync the directory, so a crash
leaves either the old or the new checkpoint, never a mix.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import msgspec

VERSION = 1
FILE_NAME = "checkpoint.json"
_TEMP_PREFIX = f".{FILE_NAME}."
_TEMP_SUFFIX = ".tmp"


class CheckpointError(Exception):
    """Base of the checkpoint store's errors."""


class CheckpointCorruptError(CheckpointError):
    """The checkpoint exists but cannot be trusted; `reason` says why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path} is corrupt: {reason}")
        self.path = path
        self.reason = reason


class CheckpointWriteError(CheckpointError):
    """Saving failed; the previous checkpoint (if any) is still in place."""


class CheckpointReadError(CheckpointError):
    """The checkpoint exists but could not be read (permissions, I/O)."""


def canonical_json(data: object) -> bytes:
    return msgspec.json.encode(data, order="sorted")


def checksum_of(data: object) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(data)).hexdigest()


class CheckpointStore:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME

    # ---- save ---------------------------------------------------------------
    def save(self, payload: dict) -> None:
        if not isinstance(payload, dict):
            raise TypeError(f"checkpoint payload must be a dict, got {type(payload).__name__}")
        try:
            # Round-trip once so that what is hashed is exactly what a later
            # load decodes (e.g. int dict keys become strings).
            data = msgspec.json.decode(msgspec.json.encode(payload))
        except (TypeError, msgspec.EncodeError, msgspec.DecodeError) as exc:
            raise ValueError(f"checkpoint payload is not JSON-encodable: {exc}") from None
        document = {"version": VERSION, "checksum": checksum_of(data), "data": data}
        content = msgspec.json.format(canonical_json(document), indent=1) + b"\n"

        self._ensure_directory()
        self._remove_stale_temps()
        fd = -1
        temp = ""
        try:
            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX,
                                        dir=self.directory)
            _write_all(fd, content)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(temp, self.path)
            temp = ""
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            if temp:
                _unlink_quietly(temp)
            raise CheckpointWriteError(f"saving checkpoint {self.path} failed: {_describe(exc)}; "
                                       "the previous checkpoint is unchanged") from None
        try:
            _fsync_directory(self.directory)
        except OSError as exc:
            raise CheckpointWriteError(
                f"checkpoint {self.path} was replaced but fsync of {self.directory} failed: "
                f"{_describe(exc)}; the new checkpoint may not survive a power loss") from None

    def _ensure_directory(self) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointWriteError(f"cannot create state directory {self.directory}: "
                                       f"{_describe(exc)}") from None

    def _remove_stale_temps(self) -> None:
        # Left by a crash between mkstemp and rename; never a live checkpoint.
        for entry in sorted(self.directory.glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}")):
            _unlink_quietly(str(entry))

    # ---- load -----------------------------------------------------------------
    def load(self) -> dict | None:
        """The saved payload, or None when there is no checkpoint."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointReadError(f"cannot read checkpoint {self.path}: "
                                      f"{_describe(exc)}") from None
        if not raw.strip():
            raise CheckpointCorruptError(self.path, "file is empty")
        try:
            document = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise CheckpointCorruptError(self.path, f"not valid JSON ({exc})") from None
        if not isinstance(document, dict):
            raise CheckpointCorruptError(self.path, "top level is not a JSON object")
        if "version" not in document:
            raise CheckpointCorruptError(self.path, "no 'version' field")
        version = document["version"]
        if version != VERSION or isinstance(version, bool):
            raise CheckpointCorruptError(
                self.path, f"unsupported version {version!r} (this agent reads version {VERSION})")
        data = document.get("data")
        if not isinstance(data, dict):
            raise CheckpointCorruptError(self.path, "'data' is missing or not a JSON object")
        stated = document.get("checksum")
        if not isinstance(stated, str) or not stated.startswith("sha256:"):
            raise CheckpointCorruptError(self.path, f"checksum {stated!r} is missing or not "
                                                    "'sha256:<hex>'")
        actual = checksum_of(data)
        if stated != actual:
            raise CheckpointCorruptError(self.path, f"checksum mismatch: file says {stated}, "
                                                    f"data hashes to {actual}")
        return data

    # ---- quarantine --------------------------------------------------------------
    def quarantine(self, now: datetime | None = None) -> Path | None:
        """Move the checkpoint aside as `checkpoint.json.corrupt-<UTC time>`
        (never deleting it) and return the new path; None if there is none."""
        if not self.path.exists():
            return None
        stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
        base = f"{FILE_NAME}.corrupt-{stamp.strftime('%Y%m%dT%H%M%SZ')}"
        target = self.directory / base
        counter = 1
        while target.exists():
            target = self.directory / f"{base}.{counter}"
            counter += 1
        try:
            os.rename(self.path, target)
            _fsync_directory(self.directory)
        except OSError as exc:
            raise CheckpointWriteError(f"cannot move {self.path} aside to {target}: "
                                       f"{_describe(exc)}") from None
        return target


def _write_all(fd: int, content: bytes) -> None:
    view = memoryview(content)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write returned no progress")
        view = view[written:]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _describe(exc: OSError) -> str:
    code = exc.errno
    if code is None:
        return str(exc)
    return f"{errno.errorcode.get(code, 'E?')} ({os.strerror(code)})"
