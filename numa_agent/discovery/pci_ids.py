"""The pci.ids database on this machine (the edge behind `PciNameSource`).

Read from the host, not from a `--sysfs-root` snapshot (hwloc-gather-topology
does not capture it), as lspci and lstopo do. Absent or unreadable: no names,
and the views show the numeric ids.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

from numa_agent.core.pci import NO_NAMES, PciNames, parse_pci_ids, wanted_ids
from numa_agent.core.topology import PciDevice

# Debian/Ubuntu (pci.ids, pciutils), then Fedora/RHEL/SUSE (hwdata).
PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids")


class PciNameSource(Protocol):
    def names(self, devices: Iterable[PciDevice]) -> PciNames:
        """Names for these devices' vendor, device and class ids."""
        ...


class PciIdsFile:
    """The first of `paths` that exists, scanned once per set of ids asked for."""

    def __init__(self, paths: Sequence[str] = PCI_IDS_PATHS) -> None:
        self.paths = tuple(paths)
        self._cache: dict[frozenset[tuple[str, str, str]], PciNames] = {}

    def names(self, devices: Iterable[PciDevice]) -> PciNames:
        wanted = wanted_ids(devices)
        if not wanted:
            return NO_NAMES
        if wanted not in self._cache:
            self._cache[wanted] = self._read(wanted)
        return self._cache[wanted]

    def _read(self, wanted: frozenset[tuple[str, str, str]]) -> PciNames:
        for path in self.paths:
            try:
                # The file is UTF-8; a stray byte must not cost every name.
                with open(path, encoding="utf-8", errors="replace") as f:
                    return parse_pci_ids((line.rstrip("\n") for line in f), wanted)
            except OSError:
                continue
        return NO_NAMES
