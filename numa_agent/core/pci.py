"""What a PCI device is to the people who place work by it: its kind, the
names the OS gave it, and its vendor/device/class names from pci.ids.

Pure: the pci.ids lines are handed in (numa_agent.discovery.pci_ids reads
the file), and only the lines of the ids asked for are split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from numa_agent.core.topology import PciDevice

# Kinds shown by default, in the order a device is tested against them.
KINDS = ("infiniband", "network", "storage", "gpu", "accelerator")

# Class children that name a device the way lstopo does (besides net, block,
# infiniband): DRM cards, Xeon Phi and NEC VE cards, the kernel's compute
# accelerators; an NVMe controller only where it has no namespace.
_NAMED_CHILD_CLASSES = ("mic", "ve", "accel")


def _bare(hex_id: str) -> str:
    """"0x8086" -> "8086", lower case, as pci.ids writes ids."""
    return hex_id.strip().lower().removeprefix("0x")


def device_kind(dev: PciDevice) -> str | None:
    """One of KINDS, or None for plumbing (bridges, uncore, DMA engines, USB,
    SMBus ...). By the class code, or by what the kernel made of it."""
    cls = _bare(dev.pci_class)
    child_classes = {child.partition("/")[0] for child in dev.other_children}
    if dev.infiniband or cls.startswith(("0207", "0c06")):
        return "infiniband"
    if dev.net or cls.startswith("02"):
        return "network"
    if dev.block or cls.startswith("01"):
        return "storage"
    if cls.startswith("03") or "drm" in child_classes:
        return "gpu"
    # Processing accelerators (FPGAs, AI cards), co-processors, FPGA managers.
    if cls.startswith(("12", "0b40")) or any(c.startswith("fpga") for c in child_classes):
        return "accelerator"
    return None


def os_names(dev: PciDevice) -> tuple[str, ...]:
    """eth0, ib0, mlx5_0, nvme0n1, card0, mic0 ...: the names a user types."""
    names = [*dev.net, *dev.infiniband, *dev.block]
    for child in dev.other_children:
        cls, _, name = child.partition("/")
        if ((cls == "drm" and name.startswith("card")) or cls in _NAMED_CHILD_CLASSES
                or (cls == "nvme" and not dev.block)):
            names.append(name)
    return tuple(names)


def device_file(dev: PciDevice) -> str | None:
    """The character device a program opens to use this PCI device, where it has one:
    an NVIDIA GPU's /dev/nvidia<minor> (the driver's "Device Minor"), an NVMe
    controller's /dev/nvmeN, a DRM device's render node /dev/dri/renderDN. None for the
    rest (a NIC is reached by its interface name, not a file)."""
    if dev.nvidia_minor is not None:
        return f"/dev/nvidia{dev.nvidia_minor}"
    for prefix, directory in (("nvme/nvme", "/dev/"), ("drm/renderD", "/dev/dri/")):
        names = sorted(child.partition("/")[2] for child in dev.other_children
                       if child.startswith(prefix) and child[len(prefix):].isdigit())
        if names:
            return directory + names[0]
    return None


@dataclass(frozen=True)
class PciNames:
    """Names from pci.ids for some ids; a missing name is None."""

    vendors: Mapping[str, str] = field(default_factory=dict)  # "8086" -> "Intel Corporation"
    devices: Mapping[tuple[str, str], str] = field(default_factory=dict)  # ("8086", "0953") -> ...
    classes: Mapping[str, str] = field(default_factory=dict)  # "01" and "0108" -> ...

    def vendor_name(self, dev: PciDevice) -> str | None:
        return self.vendors.get(_bare(dev.vendor))

    def device_name(self, dev: PciDevice) -> str | None:
        return self.devices.get((_bare(dev.vendor), _bare(dev.device)))

    def class_name(self, dev: PciDevice) -> str | None:
        """The subclass's name ("Ethernet controller"), else the class's."""
        cls = _bare(dev.pci_class)
        return self.classes.get(cls[:4]) or self.classes.get(cls[:2])


NO_NAMES = PciNames()


def wanted_ids(devices: Iterable[PciDevice]) -> frozenset[tuple[str, str, str]]:
    """(vendor, device, class) of each device, bare: the lookup's cache key."""
    return frozenset((_bare(d.vendor), _bare(d.device), _bare(d.pci_class)) for d in devices)


def parse_pci_ids(lines: Iterable[str], wanted: frozenset[tuple[str, str, str]]) -> PciNames:
    """The names of the wanted ids from pci.ids lines:

        8086  Intel Corporation          vendor
        <TAB>0953  PCIe Data Center SSD  device of the vendor above
        <TAB><TAB>...                    subsystem (not used)
        C 01  Mass storage controller    class
        <TAB>08  Non-Volatile memory ... subclass of the class above
    """
    vendors = {v for v, _, _ in wanted}
    devices = {(v, d) for v, d, _ in wanted}
    classes = {c[:2] for _, _, c in wanted} | {c[:4] for _, _, c in wanted}
    found_vendors: dict[str, str] = {}
    found_devices: dict[tuple[str, str], str] = {}
    found_classes: dict[str, str] = {}
    vendor = cls = None  # the vendor or class whose sub-lines follow, if wanted
    for line in lines:
        if not line or line[0] == "#" or line.startswith("\t\t"):
            continue
        if line[0] == "\t":
            sub, _, name = line[1:].partition("  ")
            sub = sub.lower()
            if vendor is not None and (vendor, sub) in devices:
                found_devices[(vendor, sub)] = name.strip()
            elif cls is not None and cls + sub in classes:
                found_classes[cls + sub] = name.strip()
            continue
        head, _, name = line.partition("  ")
        head = head.lower()
        vendor = cls = None
        if head.startswith("c "):
            if head[2:] in classes:
                cls = head[2:]
                found_classes[cls] = name.strip()
        elif head in vendors:
            vendor = head
            found_vendors[vendor] = name.strip()
    return PciNames(found_vendors, found_devices, found_classes)
