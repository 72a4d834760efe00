"""Small, strict readers for sysfs/procfs attribute files.

Every reader names the offending file in its error, so a broken tree is
reported as "which file, what was wrong" instead of a traceback. Kernel
noise (trailing newlines, NUL bytes on some kernels) is stripped here once.
"""

from __future__ import annotations

import os

from numa_agent.core.cpuset import CpuSet, CpuSetParseError


class DiscoveryError(Exception):
    """The sysfs/procfs tree is missing something discovery needs, or holds
    a value it cannot parse. The message names the file."""


def read_text(path: str) -> str | None:
    """File contents without NULs and surrounding whitespace; None if absent."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        raise DiscoveryError(f"{path}: expected a file, found a directory") from None
    except OSError as exc:
        raise DiscoveryError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DiscoveryError(f"{path}: not text") from None
    return text.replace("\x00", "").strip()


def read_int(path: str) -> int | None:
    """A decimal integer (possibly negative, like numa_node -1); None if absent."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, 10)
    except ValueError:
        raise DiscoveryError(f"{path}: expected an integer, got {text!r}") from None


def parse_cpulist(path: str, text: str) -> CpuSet:
    try:
        return CpuSet.parse(text)
    except CpuSetParseError as exc:
        raise DiscoveryError(f"{path}: bad CPU list: {exc}") from None


def parse_cpumask(path: str, text: str) -> CpuSet:
    try:
        return CpuSet.parse_mask(text)
    except CpuSetParseError as exc:
        raise DiscoveryError(f"{path}: bad CPU mask: {exc}") from None


def read_cpulist(path: str) -> CpuSet | None:
    text = read_text(path)
    return None if text is None else parse_cpulist(path, text)


def read_cpus(directory: str, list_names: tuple[str, ...], mask_names: tuple[str, ...]) -> CpuSet | None:
    """The first of several list files, else the first of several hex-mask
    files (old kernels only have masks); None when none exists."""
    for name in list_names:
        path = os.path.join(directory, name)
        text = read_text(path)
        if text is not None:
            return parse_cpulist(path, text)
    for name in mask_names:
        path = os.path.join(directory, name)
        text = read_text(path)
        if text is not None:
            return parse_cpumask(path, text)
    return None


def link_basename(path: str) -> str | None:
    """Basename of a symlink's target (the target may dangle); None if no link."""
    try:
        return os.path.basename(os.readlink(path).rstrip("/"))
    except (FileNotFoundError, NotADirectoryError, OSError):
        return None


def numbered_entries(directory: str, prefix: str) -> list[tuple[int, str]]:
    """(n, name) for entries named <prefix><n> in a directory, sorted by n."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    plen = len(prefix)
    for name in names:
        if name.startswith(prefix) and name[plen:].isdigit():
            out.append((int(name[plen:]), name))
    out.sort()
    return out
