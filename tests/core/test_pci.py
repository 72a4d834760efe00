"""The PCI kinds shown by default, OS names, and the pci.ids parser."""

from __future__ import annotations

import pytest

from numa_agent.core.pci import NO_NAMES, device_kind, os_names, parse_pci_ids, wanted_ids
from numa_agent.core.topology import PciDevice

IDS = """\
# comment lines and subsystems are skipped
8086  Intel Corporation
\t0953  PCIe Data Center SSD
\t\t8086 3702  DC P3700 SSD
\t1521  I350 Gigabit Network Connection
15b3  Mellanox Technologies
\t1013  MT27700 Family [ConnectX-4]
C 01  Mass storage controller
\t08  Non-Volatile memory controller
\t\t02  NVM Express
C 02  Network controller
\t00  Ethernet controller
C 12  Processing accelerators
"""


def _dev(pci_class: str, vendor: str = "0x8086", device: str = "0x0953", **kw) -> PciDevice:
    return PciDevice(address="0000:01:00.0", pci_class=pci_class, vendor=vendor, device=device,
                     numa_node=0, **kw)


@pytest.mark.parametrize("pci_class, children, kind", [
    ("0x020000", {}, "network"),
    ("0x028000", {"net": ("ib0",), "infiniband": ("mlx4_0",)}, "infiniband"),  # ConnectX-3: class "other"
    ("0x020700", {}, "infiniband"),
    ("0x0c0600", {}, "infiniband"),
    ("0x010802", {}, "storage"),
    ("0x010601", {}, "storage"),
    ("0x030200", {}, "gpu"),
    ("0x038000", {"other_children": ("drm/card1",)}, "gpu"),
    ("0x120000", {}, "accelerator"),
    ("0x0b4000", {"other_children": ("mic/mic0",)}, "accelerator"),
    ("0xff0000", {"other_children": ("fpga_region/region0",)}, "accelerator"),
    ("0x060400", {}, None),  # PCI bridge
    ("0x088000", {"other_children": ("dma/dma0chan0",)}, None),  # DMA engine
    ("0x110100", {}, None),  # uncore performance counters
    ("0x0c0330", {}, None),  # USB
])
def test_device_kind(pci_class, children, kind):
    assert device_kind(_dev(pci_class, **children)) == kind


def test_os_names_are_what_a_user_types():
    nic = _dev("0x020000", net=("eth0",))
    ib = _dev("0x028000", net=("ib0",), infiniband=("mlx4_0",))
    nvme = _dev("0x010802", block=("nvme0n1",), other_children=("nvme/nvme0",))
    bare_nvme = _dev("0x010802", other_children=("nvme/nvme0",))
    gpu = _dev("0x030000", other_children=("drm/card0", "drm/renderD128", "drm/controlD64"))
    dma = _dev("0x088000", other_children=("dma/dma0chan0",))
    assert [os_names(d) for d in (nic, ib, nvme, bare_nvme, gpu, dma)] == [
        ("eth0",), ("ib0", "mlx4_0"), ("nvme0n1",), ("nvme0",), ("card0",), ()]


def test_parse_pci_ids_keeps_only_the_ids_asked_for():
    nvme = _dev("0x010802")
    nic = _dev("0x020000", device="0x1521")
    names = parse_pci_ids(IDS.splitlines(), wanted_ids([nvme]))
    assert names.vendors == {"8086": "Intel Corporation"}
    assert names.devices == {("8086", "0953"): "PCIe Data Center SSD"}
    assert names.classes == {"01": "Mass storage controller", "0108": "Non-Volatile memory controller"}
    assert names.device_name(nic) is None  # not asked for
    both = parse_pci_ids(IDS.splitlines(), wanted_ids([nvme, nic]))
    assert both.device_name(nic) == "I350 Gigabit Network Connection"
    assert both.class_name(nic) == "Ethernet controller"


def test_class_name_falls_back_to_the_class_and_unknown_ids_have_no_name():
    accel = _dev("0x120000", vendor="0x1d0f", device="0xefa1")
    names = parse_pci_ids(IDS.splitlines(), wanted_ids([accel]))
    assert names.class_name(accel) == "Processing accelerators"
    assert names.vendor_name(accel) is None and names.device_name(accel) is None
    assert NO_NAMES.class_name(accel) is None


@pytest.mark.parametrize("fields, path", [
    ({"vendor": "0x10de", "nvidia_minor": 3}, "/dev/nvidia3"),  # the driver's Device Minor
    ({"other_children": ("nvme/nvme2",), "block": ("nvme2n1",)}, "/dev/nvme2"),
    ({"other_children": ("drm/card1", "drm/renderD129")}, "/dev/dri/renderD129"),
    ({"other_children": ("drm/card1",)}, None),  # a display card without a render node
    ({"net": ("eth0",)}, None),
    ({"other_children": ("nvme-subsystem/nvme-subsys0",)}, None),
])
def test_the_device_file_a_program_opens(fields, path):
    from numa_agent.core.pci import device_file

    assert device_file(_dev("0x030200", **fields)) == path
