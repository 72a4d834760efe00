"""The pci.ids edge: the first readable file, read once per set of ids."""

from __future__ import annotations

from numa_agent.core.pci import NO_NAMES
from numa_agent.core.topology import PciDevice
from numa_agent.discovery.pci_ids import PciIdsFile

NIC = PciDevice(address="0000:02:00.0", pci_class="0x020000", vendor="0x8086", device="0x1521", numa_node=0)


def _ids(path):
    path.write_text("8086  Intel Corporation\n\t1521  I350 Gigabit Network Connection\n"
                    "C 02  Network controller\n\t00  Ethernet controller\n")
    return str(path)


def test_first_readable_file_is_used_and_read_once(tmp_path):
    source = PciIdsFile([str(tmp_path / "missing.ids"), _ids(tmp_path / "pci.ids")])
    names = source.names([NIC])
    assert (names.class_name(NIC), names.vendor_name(NIC), names.device_name(NIC)) == (
        "Ethernet controller", "Intel Corporation", "I350 Gigabit Network Connection")
    (tmp_path / "pci.ids").unlink()
    assert source.names([NIC]) is names  # cached for the run: not read again


def test_no_database_means_no_names(tmp_path):
    assert PciIdsFile([str(tmp_path / "missing.ids")]).names([NIC]) is NO_NAMES
    assert PciIdsFile([str(tmp_path)]).names([NIC]) is NO_NAMES  # a directory: unreadable
    assert PciIdsFile([_ids(tmp_path / "pci.ids")]).names([]) is NO_NAMES
