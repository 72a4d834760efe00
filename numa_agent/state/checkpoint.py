"""The agent's checkpoint, in two generations.

`checkpoint.json` holds `{"version": 1, "checksum": "sha256:<hex>", "data": {...}}`
where the checksum covers the canonical JSON of `data` (sorted keys, no
whitespace). It is replaced atomically: temp file in the same directory,
write, fsync; then the current checkpoint, if it verifies, is hard-linked to
a temp name and renamed over `checkpoint.json.prev`, and the directory
fsynced; then the temp file is renamed over `checkpoint.json` and the
directory fsynced again. A crash at any point leaves `checkpoint.json`
either old or new, never a mix, and `.prev` a good generation whenever the
current one was good when it was set aside.

`load` uses `checkpoint.json`, or `checkpoint.json.prev` when the current one
is missing or damaged; `load_generation` also says which one and what was
wrong with the other.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import msgspec

VERSION = 1
FILE_NAME = "checkpoint.json"
PREVIOUS_NAME = f"{FILE_NAME}.prev"  # the generation before the current one
_TEMP_PREFIX = f".{FILE_NAME}."
_TEMP_SUFFIX = ".tmp"
_PREVIOUS_TEMP = f"{_TEMP_PREFIX}prev{_TEMP_SUFFIX}"


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


@dataclass(frozen=True)
class Loaded:
    """What `load_generation` found: the payload (None when there is no good
    generation), the file it came from, and the generations it tried first and
    found damaged (newest first)."""

    data: dict | None
    path: Path | None
    damaged: tuple[CheckpointCorruptError, ...] = ()

    @property
    def fallback(self) -> bool:
        """The payload is the previous generation's."""
        return self.path is not None and self.path.name == PREVIOUS_NAME


def canonical_json(data: object) -> bytes:
    return msgspec.json.encode(data, order="sorted")


def checksum_of(data: object) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(data)).hexdigest()


class CheckpointStore:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        # (device, inode, size, mtime) of the checkpoint this store last wrote:
        # while the file still matches, it is known good without reading it.
        self._written: tuple[int, int, int, int] | None = None
        self.path = self.directory / FILE_NAME
        self.previous_path = self.directory / PREVIOUS_NAME

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
            self._keep_previous()
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
            self._written = _signature(os.stat(self.path))
        except OSError:
            self._written = None  # the next save reads it back instead
        try:
            _fsync_directory(self.directory)
        except OSError as exc:
            raise CheckpointWriteError(
                f"checkpoint {self.path} was replaced but fsync of {self.directory} failed: "
                f"{_describe(exc)}; the new checkpoint may not survive a power loss") from None

    def _current_is_good(self) -> bool:
        """The checkpoint in place verifies: the one this store wrote and nobody
        touched since (one stat per save), else read and checked."""
        try:
            if self._written is not None and _signature(os.stat(self.path)) == self._written:
                return True
        except OSError:
            return False
        try:
            return self._read(self.path) is not None
        except (CheckpointCorruptError, CheckpointReadError):
            return False

    def _ensure_directory(self) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointWriteError(f"cannot create state directory {self.directory}: "
                                       f"{_describe(exc)}") from None

    def _keep_previous(self) -> None:
        """Make the current checkpoint the previous generation, if it is a good
        one (a damaged one never replaces a good `.prev`). The same file is
        linked, not copied: it was fsynced when it was written."""
        if not self._current_is_good():
            return
        staged = self.directory / _PREVIOUS_TEMP
        _unlink_quietly(str(staged))
        try:
            os.link(self.path, staged)
        except OSError:
            # No hard links here: an fsynced copy instead.
            _copy_synced(self.path, staged)
        try:
            os.replace(staged, self.previous_path)
        except OSError:
            _unlink_quietly(str(staged))
            raise
        # `.prev` is on disk before the current checkpoint is replaced.
        _fsync_directory(self.directory)

    def _remove_stale_temps(self) -> None:
        # Left by a crash between mkstemp and rename; never a live checkpoint.
        for entry in sorted(self.directory.glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}")):
            _unlink_quietly(str(entry))

    # ---- load -----------------------------------------------------------------
    def load(self) -> dict | None:
        """The newest good payload: the current checkpoint's, else the previous
        generation's. None when there is neither; CheckpointCorruptError (the
        current one's) when what there is cannot be trusted."""
        loaded = self.load_generation()
        if loaded.data is None and loaded.damaged:
            raise loaded.damaged[0]
        return loaded.data

    def load_generation(self) -> Loaded:
        """The newest good generation, which file it is, and the damaged ones
        tried before it. A checkpoint that cannot be read at all (permissions,
        I/O) raises CheckpointReadError rather than fall back."""
        damaged: list[CheckpointCorruptError] = []
        for path in (self.path, self.previous_path):
            try:
                data = self._read(path)
            except CheckpointCorruptError as exc:
                damaged.append(exc)
                continue
            if data is not None:
                return Loaded(data, path, tuple(damaged))
        return Loaded(None, None, tuple(damaged))

    def _read(self, path: Path) -> dict | None:
        """The verified payload of one generation; None if the file is absent."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointReadError(f"cannot read checkpoint {path}: "
                                      f"{_describe(exc)}") from None
        if not raw.strip():
            raise CheckpointCorruptError(path, "file is empty")
        try:
            document = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise CheckpointCorruptError(path, f"not valid JSON ({exc})") from None
        if not isinstance(document, dict):
            raise CheckpointCorruptError(path, "top level is not a JSON object")
        if "version" not in document:
            raise CheckpointCorruptError(path, "no 'version' field")
        version = document["version"]
        if version != VERSION or isinstance(version, bool):
            raise CheckpointCorruptError(
                path, f"unsupported version {version!r} (this agent reads version {VERSION})")
        data = document.get("data")
        if not isinstance(data, dict):
            raise CheckpointCorruptError(path, "'data' is missing or not a JSON object")
        stated = document.get("checksum")
        if not isinstance(stated, str) or not stated.startswith("sha256:"):
            raise CheckpointCorruptError(path, f"checksum {stated!r} is missing or not "
                                               "'sha256:<hex>'")
        actual = checksum_of(data)
        if stated != actual:
            raise CheckpointCorruptError(path, f"checksum mismatch: file says {stated}, "
                                               f"data hashes to {actual}")
        return data

    # ---- quarantine --------------------------------------------------------------
    def quarantine(self, now: datetime | None = None, path: Path | None = None) -> Path | None:
        """Move a checkpoint (the current one unless `path` names the previous)
        aside as `<its name>.corrupt-<UTC time>`, never deleting it, and return
        the new path; None if there is none."""
        source = self.path if path is None else path
        if not source.exists():
            return None
        stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
        base = f"{source.name}.corrupt-{stamp.strftime('%Y%m%dT%H%M%SZ')}"
        target = self.directory / base
        counter = 1
        while target.exists():
            target = self.directory / f"{base}.{counter}"
            counter += 1
        try:
            os.rename(source, target)
            _fsync_directory(self.directory)
        except OSError as exc:
            raise CheckpointWriteError(f"cannot move {source} aside to {target}: "
                                       f"{_describe(exc)}") from None
        return target


def _write_all(fd: int, content: bytes) -> None:
    view = memoryview(content)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write returned no progress")
        view = view[written:]


def _copy_synced(source: Path, target: Path) -> None:
    content = source.read_bytes()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, content)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        _unlink_quietly(str(target))
        raise
    os.close(fd)


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


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
