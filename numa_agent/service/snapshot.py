"""A sysfs snapshot given as an archive (`--sysfs-root machine.tar.gz`):
extracted, safely, into a private temporary directory that the agent removes
when it stops.

A snapshot holds `sys/` and `proc/` (at its top or in its one top-level
directory) and many relative symlinks. Only regular files, directories and
symlinks that stay inside the snapshot are taken: no absolute or `..` names,
no devices, FIFOs or hard links, no link leading outside.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


class SnapshotError(Exception):
    pass


def is_archive(path: str) -> bool:
    """A path that names an archive rather than a directory tree."""
    return os.path.isfile(path) or (not os.path.exists(path) and path.endswith(ARCHIVE_SUFFIXES))


def extract_snapshot(archive: str) -> tuple[Path, Path]:
    """(the temporary directory to remove later, the sysfs root inside it)."""
    if not os.path.exists(archive):
        raise SnapshotError(f"sysfs snapshot {archive} does not exist")
    scratch = Path(tempfile.mkdtemp(prefix="numa-agent-snapshot-"))  # mode 0700
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = tar.getmembers()  # reads the whole archive: damage shows here
                for member in members:
                    _check_member(member)
                kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(scratch, members=members, **kwargs)  # type: ignore[arg-type]
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            # tarfile lists every method it tried, one per line: the first says enough.
            reason = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
            raise SnapshotError(f"sysfs snapshot {archive} is not a readable tar archive "
                                f"(.tar.gz, .tgz or .tar): {reason}") from None
        except OSError as exc:
            raise SnapshotError(f"cannot extract sysfs snapshot {archive}: {exc}") from None
        return scratch, _sysfs_root(scratch, archive)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def remove_snapshot(scratch: Path) -> None:
    shutil.rmtree(scratch, ignore_errors=True)


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise SnapshotError(f"unsafe path {name!r} in the archive")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise SnapshotError(f"{name!r} in the archive is not a file, directory or symlink")
    if member.issym():
        target = member.linkname
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise SnapshotError(f"symlink {name!r} -> {target!r} in the archive leads outside it")


def _sysfs_root(scratch: Path, archive: str) -> Path:
    if (scratch / "sys").is_dir():
        return scratch
    entries = [p for p in scratch.iterdir()]
    if len(entries) == 1 and (entries[0] / "sys").is_dir():
        return entries[0]
    raise SnapshotError(f"sysfs snapshot {archive} has no sys/ directory (at its top or in its "
                        "one top-level directory)")
