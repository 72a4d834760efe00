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

Between snapshots, `commit(state)` appends only what changed to
`checkpoint.journal` (state/journal.py: one checksummed line per change,
naming the snapshot it follows by its checksum and a sequence number) and
fdatasyncs it: O(change) per admission or release. Every `COMPACT_EVERY`
entries, or when the journal would outgrow the snapshot (and
`COMPACT_MIN_BYTES`), the commit writes a whole snapshot instead, which
empties the journal. A journal is emptied
*before* a snapshot is renamed in place when some entry names that
snapshot's checksum (replaying it onto the new snapshot would be wrong; the
old snapshot alone already holds the new content), else after the rename (a
crash between them leaves entries that name another snapshot: stale,
never replayed).

`load` uses `checkpoint.json`, or `checkpoint.json.prev` when the current one
is missing or damaged, with the journal entries that follow it replayed;
`load_generation` also says which one, how many entries, and what was wrong
with the rest. A torn last entry (an interrupted append) is ignored and goes
with the next snapshot; damage in the middle of the journal is reported like
a damaged checkpoint (the entries before it are used, the file is moved aside
by recovery).
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import msgspec

from numa_agent.state import journal
from numa_agent.state.model import AgentState
from numa_agent.state.trusted_dir import TrustedDir, UntrustedDirectory, open_directory, write_all

VERSION = 1
FILE_NAME = "checkpoint.json"
PREVIOUS_NAME = f"{FILE_NAME}.prev"  # the generation before the current one
JOURNAL_NAME = "checkpoint.journal"  # changes since the current snapshot
COMPACT_EVERY = 1000  # journal entries between two snapshots, at most
# The journal may grow to the snapshot's size, or to this much when the
# snapshot is smaller: a small state must not pay a snapshot every few changes
# (that would be the p99 of a commit); replaying this much takes milliseconds.
COMPACT_MIN_BYTES = 256 * 1024
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
    """Saving failed. Unless `landed`, the previous checkpoint (if any) is still
    what a load reads; `landed`: the new one may be (it was renamed into place,
    or its journal entry could not be cut off again), but is not known durable."""

    def __init__(self, message: str, *, landed: bool = False) -> None:
        super().__init__(message)
        self.landed = landed


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
    journal_entries: int = 0  # replayed onto the snapshot
    torn_bytes: int = 0  # of an interrupted last append, ignored

    @property
    def fallback(self) -> bool:
        """The payload is the previous generation's."""
        return self.path is not None and self.path.name == PREVIOUS_NAME


def canonical_json(data: object) -> bytes:
    return msgspec.json.encode(data, order="sorted")


def checksum_of(data: object) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(data)).hexdigest()


class CheckpointStore:
    """The checkpoint files in one directory: the agent's held state directory
    (a TrustedDir: every file is opened relative to it, never through a
    symlink), or a path, checked and opened on first use."""

    def __init__(self, directory: str | os.PathLike | TrustedDir, compact_every: int = COMPACT_EVERY) -> None:
        self._held = directory if isinstance(directory, TrustedDir) else None
        self._given = self._held is not None
        self.directory = directory.path if isinstance(directory, TrustedDir) else Path(directory)
        # (device, inode, size, mtime) of the checkpoint this store last wrote:
        # while the file still matches, it is known good without reading it.
        self._written: tuple[int, int, int, int] | None = None
        self.path = self.directory / FILE_NAME
        self.previous_path = self.directory / PREVIOUS_NAME
        self.journal_path = self.directory / JOURNAL_NAME
        self.compact_every = compact_every
        # What this store wrote last, so that a commit appends only the change:
        # the state (immutable, kept by reference), the checksum of the
        # snapshot the journal follows, how many entries and bytes follow it,
        # and the size of that snapshot. None: unknown, the next commit writes
        # a whole snapshot.
        self._last: AgentState | None = None
        self._base: str | None = None
        self._seq = 0
        self._journal_size = 0
        self._snapshot_size = 0
        self._journal_sig: tuple[int, int, int] | None = None  # (device, inode, size)

    def close(self) -> None:
        """Let go of the directory this store opened itself (one given is the giver's)."""
        if self._held is not None and not self._given:
            self._held.close()
            self._held = None

    # ---- commit -------------------------------------------------------------
    def commit(self, state: AgentState, *, snapshot: bool = False) -> str | None:
        """Make `state` durable: the change from the state this store last
        committed, appended to the journal and fdatasynced, or a whole
        snapshot (the first commit, `snapshot=True`, every `compact_every`
        entries, when the journal would outgrow the snapshot, or when the
        files are not as this store left them). Returns "journal",
        "snapshot", or None when nothing changed. CheckpointWriteError when
        it is not durable (any OSError on the way is one); the state last
        committed then still stands, unless the error says it `landed`."""
        try:
            return self._commit(state, snapshot)
        except OSError as exc:  # a step not wrapped on its own: the same refusal
            raise self._not_written(exc) from None

    def _commit(self, state: AgentState, snapshot: bool) -> str | None:
        last = self._last
        if snapshot or last is None or self._base is None or not self._files_as_left():
            return self._snapshot(state)
        delta = journal.state_delta(last, state)
        if delta is None:
            self._last = state
            return None
        line = journal.encode_entry(self._base, self._seq + 1, delta)
        if self._seq + 1 > self.compact_every or \
                self._journal_size + len(line) > max(self._snapshot_size, COMPACT_MIN_BYTES):
            return self._snapshot(state)
        self._append(line)
        self._last = state
        return "journal"

    def _snapshot(self, state: AgentState) -> str:
        self._last = None
        self.save(state.to_json())
        self._last = state
        return "snapshot"

    def _files_as_left(self) -> bool:
        """The snapshot and the journal are the files this store wrote last
        (one stat each): nobody replaced, truncated or appended to them."""
        try:
            if self._written is None or _signature(self._dir().lstat(FILE_NAME)) != self._written:
                return False
            if self._journal_sig is None:
                return not self._dir().exists(JOURNAL_NAME)
            st = self._dir().lstat(JOURNAL_NAME)
        except (OSError, CheckpointError):
            return False
        return (st.st_dev, st.st_ino, st.st_size) == self._journal_sig

    def _append(self, line: bytes) -> None:
        # Opened per append, not held: one more syscall beside an fdatasync,
        # and nothing to leak or to go stale when the file is moved aside.
        fd = -1
        try:
            fd = self._open_journal()
            write_all(fd, line)
            os.fdatasync(fd)
        except OSError as exc:
            # Part of the entry may be there: cut it off so no later entry
            # follows it; whatever happens, the next commit is a snapshot.
            self._base = None
            landed = False
            if fd >= 0:
                try:
                    os.ftruncate(fd, self._journal_size)
                except OSError:
                    landed = True  # the entry may stay and be replayed
            raise CheckpointWriteError(f"appending to {self.journal_path} failed: {describe_oserror(exc)}; "
                                       + ("the entry may remain" if landed else
                                          "the checkpoint still holds the previous state"),
                                       landed=landed) from None
        finally:
            if fd >= 0:
                os.close(fd)
        self._seq += 1
        self._journal_size += len(line)
        dev, ino, _ = self._journal_sig or (0, 0, 0)
        self._journal_sig = (dev, ino, self._journal_size)

    def _open_journal(self) -> int:
        fd = self._dir().open(JOURNAL_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            st = os.fstat(fd)
            if st.st_size != self._journal_size:
                os.ftruncate(fd, self._journal_size)
            if self._journal_sig is None:
                self._dir().fsync()  # a new journal's name is on disk before an entry counts
        except OSError:
            os.close(fd)
            raise
        self._journal_sig = (st.st_dev, st.st_ino, self._journal_size)
        return fd

    # ---- save ---------------------------------------------------------------
    def save(self, payload: dict) -> None:
        """Write `payload` as the whole checkpoint (a snapshot) and empty the
        journal. CheckpointWriteError for any OSError on the way."""
        try:
            self._save(payload)
        except OSError as exc:  # a step not wrapped on its own (listing stale temporaries...)
            raise self._not_written(exc) from None

    def _not_written(self, exc: OSError) -> CheckpointWriteError:
        self._last = self._base = None  # the next commit writes a whole snapshot
        return CheckpointWriteError(f"checkpoint in {self.directory} not written: {describe_oserror(exc)}; "
                                    "the previous checkpoint is unchanged")

    def _save(self, payload: dict) -> None:
        if not isinstance(payload, dict):
            raise TypeError(f"checkpoint payload must be a dict, got {type(payload).__name__}")
        try:
            # Round-trip once so that what is hashed is exactly what a later
            # load decodes (e.g. int dict keys become strings).
            data = msgspec.json.decode(msgspec.json.encode(payload))
        except (TypeError, msgspec.EncodeError, msgspec.DecodeError) as exc:
            raise ValueError(f"checkpoint payload is not JSON-encodable: {exc}") from None
        checksum = checksum_of(data)
        document = {"version": VERSION, "checksum": checksum, "data": data}
        content = msgspec.json.format(canonical_json(document), indent=1) + b"\n"

        self._last = None  # a payload, not a state: the next commit is a snapshot
        held = self._dir()
        self._remove_stale_temps()
        empty_first = self._journal_names(checksum)
        if empty_first:
            self._empty_journal()
        fd = -1
        temp = ""
        try:
            fd, temp = held.create_temporary(FILE_NAME)
            write_all(fd, content)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            self._keep_previous()
            held.rename(temp, FILE_NAME)
            temp = ""
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            if temp:
                _unlink_quietly(held, temp)
            raise CheckpointWriteError(f"saving checkpoint {self.path} failed: {describe_oserror(exc)}; "
                                       "the previous checkpoint is unchanged") from None
        self._base = None  # until the journal is known to follow this snapshot
        try:
            self._written = _signature(held.lstat(FILE_NAME))
        except OSError:
            self._written = None  # the next save reads it back instead
        try:
            held.fsync()
        except OSError as exc:
            raise CheckpointWriteError(
                f"checkpoint {self.path} was replaced but fsync of {self.directory} failed: "
                f"{describe_oserror(exc)}; the new checkpoint may not survive a power loss", landed=True) from None
        if not empty_first:
            try:
                self._empty_journal()
            except CheckpointWriteError as exc:
                raise CheckpointWriteError(str(exc), landed=True) from None
        self._base, self._seq, self._snapshot_size = checksum, 0, len(content)

    def _journal_names(self, checksum: str) -> bool:
        """Some journal entry that a load would replay follows a snapshot with
        this checksum (so the journal must go before such a snapshot is put in place)."""
        if self._base is not None and self._files_as_left():
            return self._seq > 0 and self._base == checksum
        try:
            raw = self._dir().read_bytes(JOURNAL_NAME)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # unreadable: empty it first, to be safe
        return any(e.base == checksum for e in journal.parse_journal(raw).entries)

    def _empty_journal(self) -> None:
        """Truncate the journal to nothing, durably (it stays, empty, for the next append)."""
        self._seq = self._journal_size = 0
        self._journal_sig = None
        try:
            fd = self._dir().open(JOURNAL_NAME, os.O_WRONLY)
        except FileNotFoundError:
            return
        except OSError as exc:
            self._base = None
            raise CheckpointWriteError(f"cannot empty the journal {self.journal_path}: "
                                       f"{describe_oserror(exc)}") from None
        try:
            st = os.fstat(fd)
            if st.st_size:
                os.ftruncate(fd, 0)
                os.fsync(fd)
        except OSError as exc:
            self._base = None
            raise CheckpointWriteError(f"cannot empty the journal {self.journal_path}: "
                                       f"{describe_oserror(exc)}") from None
        finally:
            os.close(fd)
        self._journal_sig = (st.st_dev, st.st_ino, 0)

    def _current_is_good(self) -> bool:
        """The checkpoint in place verifies: the one this store wrote and nobody
        touched since (one stat per save), else read and checked."""
        try:
            if self._written is not None and _signature(self._dir().lstat(FILE_NAME)) == self._written:
                return True
        except OSError:
            return False
        try:
            return self._read(self.path) is not None
        except (CheckpointCorruptError, CheckpointReadError):
            return False

    def _dir(self, create: bool = True) -> TrustedDir:
        """The directory, held open: the one given, or this path's checked and
        made (0700) on first use, and again if it was removed meanwhile.
        FileNotFoundError when it is missing and not to be made (a load)."""
        if self._held is not None and (self._given or not self._held.removed()):
            return self._held
        if self._held is not None:
            self._held.close()
            self._held = None
        try:
            self._held = open_directory(self.directory, "state directory",
                                        create_mode=0o700 if create else None)
        except UntrustedDirectory as exc:
            raise CheckpointWriteError(str(exc)) from None
        except FileNotFoundError:
            if not create:
                raise
            raise CheckpointWriteError(f"cannot create state directory {self.directory}: "
                                       "a directory above it is missing") from None
        except OSError as exc:
            raise CheckpointWriteError(f"cannot create state directory {self.directory}: "
                                       f"{describe_oserror(exc)}") from None
        return self._held

    def _keep_previous(self) -> None:
        """Make the current checkpoint the previous generation, if it is a good
        one (a damaged one never replaces a good `.prev`). The same file is
        linked, not copied: it was fsynced when it was written."""
        if not self._current_is_good():
            return
        held = self._dir()
        _unlink_quietly(held, _PREVIOUS_TEMP)
        try:
            held.link(FILE_NAME, _PREVIOUS_TEMP)
        except OSError:
            # No hard links here: an fsynced copy instead.
            _copy_synced(held, FILE_NAME, _PREVIOUS_TEMP)
        try:
            held.rename(_PREVIOUS_TEMP, PREVIOUS_NAME)
        except OSError:
            _unlink_quietly(held, _PREVIOUS_TEMP)
            raise
        # `.prev` is on disk before the current checkpoint is replaced.
        held.fsync()

    def _remove_stale_temps(self) -> None:
        # Left by a crash between mkstemp and rename; never a live checkpoint.
        held = self._dir()
        for name in sorted(fnmatch.filter(held.listdir(), f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}")):
            _unlink_quietly(held, name)

    # ---- load -----------------------------------------------------------------
    def load(self) -> dict | None:
        """The newest good payload: the current checkpoint's (with the journal
        replayed), else the previous generation's. None when there is
        neither; CheckpointCorruptError (the current one's) when what there is
        cannot be trusted."""
        loaded = self.load_generation()
        if loaded.data is None and loaded.damaged:
            raise loaded.damaged[0]
        return loaded.data

    def load_generation(self, replay: bool = True) -> Loaded:
        """The newest good generation with the journal entries that follow it
        replayed (unless `replay` is False), which file it is, and the damaged
        files met on the way (generations tried before it, then the journal).
        A checkpoint that cannot be read at all (permissions, I/O) raises
        CheckpointReadError rather than fall back."""
        damaged: list[CheckpointCorruptError] = []
        for path in (self.path, self.previous_path):
            try:
                found = self._read_document(path)
            except CheckpointCorruptError as exc:
                damaged.append(exc)
                continue
            if found is None:
                continue
            data, checksum = found
            if not replay:
                return Loaded(data, path, tuple(damaged))
            return self._replayed(data, checksum, path, damaged)
        try:
            orphan = self._dir(create=False).lstat(JOURNAL_NAME).st_size > 0
        except (OSError, CheckpointError):
            orphan = False
        if orphan:
            # Changes after a snapshot that is gone: moved aside, never emptied.
            damaged.append(CheckpointCorruptError(self.journal_path, "follows no checkpoint that is present"))
        return Loaded(None, None, tuple(damaged))

    def _replayed(self, data: dict, checksum: str, path: Path,
                  damaged: list[CheckpointCorruptError]) -> Loaded:
        try:
            raw = self._dir(create=False).read_bytes(JOURNAL_NAME)
        except FileNotFoundError:
            return Loaded(data, path, tuple(damaged))
        except OSError as exc:
            raise CheckpointReadError(f"cannot read the journal {self.journal_path}: "
                                      f"{describe_oserror(exc)}") from None
        read = journal.parse_journal(raw)
        entries, inconsistency = journal.replayable(read, checksum)
        problem = read.damage or inconsistency
        if not entries and read.entries and path == self.previous_path and not problem:
            # It follows the current checkpoint, which is damaged or gone:
            # unusable, but it is what that one lacked; moved aside, never emptied.
            problem = f"follows {FILE_NAME}, which is damaged or missing, not {PREVIOUS_NAME}"
        if problem:
            damaged.append(CheckpointCorruptError(self.journal_path, problem))
        try:
            data = journal.replay(data, (e.delta for e in entries))
        except ValueError as exc:
            damaged.append(CheckpointCorruptError(self.journal_path, f"an entry does not apply: {exc}"))
            return Loaded(data, path, tuple(damaged))
        return Loaded(data, path, tuple(damaged), journal_entries=len(entries), torn_bytes=read.torn_bytes)

    def _read(self, path: Path) -> dict | None:
        """The verified payload of one generation; None if the file is absent."""
        found = self._read_document(path)
        return None if found is None else found[0]

    def _read_document(self, path: Path) -> tuple[dict, str] | None:
        """(verified payload, its checksum) of one generation; None if absent."""
        try:
            raw = self._dir(create=False).read_bytes(path.name)
        except FileNotFoundError:
            return None
        except CheckpointWriteError as exc:  # an untrusted directory: not read
            raise CheckpointReadError(str(exc)) from None
        except OSError as exc:
            raise CheckpointReadError(f"cannot read checkpoint {path}: "
                                      f"{describe_oserror(exc)}") from None
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
        return data, actual

    # ---- quarantine --------------------------------------------------------------
    def quarantine(self, now: datetime | None = None, path: Path | None = None) -> Path | None:
        """Move a checkpoint file (the current one unless `path` names the
        previous one or the journal) aside as `<its name>.corrupt-<UTC time>`,
        never deleting it, and return the new path; None if there is none."""
        source = self.path if path is None else path
        try:
            held = self._dir(create=False)
        except FileNotFoundError:
            return None
        if not held.exists(source.name):
            return None
        if source == self.journal_path:
            self._base = None  # the next commit starts over with a snapshot
        stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
        base = f"{source.name}.corrupt-{stamp.strftime('%Y%m%dT%H%M%SZ')}"
        target = self.directory / base
        counter = 1
        while held.exists(target.name):
            target = self.directory / f"{base}.{counter}"
            counter += 1
        try:
            held.rename(source.name, target.name)
            held.fsync()
        except OSError as exc:
            raise CheckpointWriteError(f"cannot move {source} aside to {target}: "
                                       f"{describe_oserror(exc)}") from None
        return target


def _copy_synced(held: TrustedDir, source: str, target: str) -> None:
    content = held.read_bytes(source)
    fd = held.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        write_all(fd, content)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        _unlink_quietly(held, target)
        raise
    os.close(fd)


def _unlink_quietly(held: TrustedDir, name: str) -> None:
    try:
        held.unlink(name)
    except OSError:
        pass


def describe_oserror(exc: OSError) -> str:
    """An OSError in one line: its errno's name and text ("EMFILE (Too many open files)")."""
    code = exc.errno
    if code is None:
        return str(exc)
    return f"{errno.errorcode.get(code, 'E?')} ({os.strerror(code)})"


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
