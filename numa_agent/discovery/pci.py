"""PCI devices from `sys/bus/pci/devices`, with their NUMA node.

Firmware often leaves `numa_node` at -1 (uncore devices, NVMe behind a
socket's root port, whole 4-socket machines). The device's `local_cpulist`
still tells where it sits: when its online CPUs all belong to exactly one
NUMA node, that node is the device's node (source "local_cpulist").
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Mapping

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.names import is_pci_address
from numa_agent.core.topology import UNKNOWN_NODE, PciDevice
from numa_agent.discovery.files import (
    DiscoveryError,
    link_basename,
    numbered_entries,
    read_cpus,
    read_int,
    read_text,
)

# nvme0n1 is a namespace; nvme0c0n1 is one hidden path of a multipath namespace.
_NVME_NAMESPACE = re.compile(r"^nvme\d+n\d+$")
_VIRTIO_DEVICE = re.compile(r"^virtio\d+$")
# Subdirectories of a device directory that are not class children.
_NOT_CLASS_DIRS = frozenset({"power", "msi_irqs", "iommu_group", "driver", "subsystem",
                             "firmware_node", "physfn", "link", "ptp_pin"})


def read_pci_devices(sys_dir: str, online: CpuSet, node_of_cpu: Mapping[int, int],
                     proc_dir: str | None = None) -> tuple[PciDevice, ...]:
    """Every device under `sys_dir/bus/pci/devices`, sorted by address.

    `online` and `node_of_cpu` (online CPU -> NUMA node) drive the
    local_cpulist fallback for devices with no numa_node. Under `proc_dir`, the
    NVIDIA driver's `driver/nvidia/gpus/<address>/information` gives a GPU's
    device minor (its /dev/nvidia<minor>)."""
    base = os.path.join(sys_dir, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except (FileNotFoundError, NotADirectoryError):
        return ()
    devices_dir = os.path.realpath(os.path.join(sys_dir, "devices"))
    devices = []
    for name in names:
        path = os.path.join(base, name)
        # Entries are symlinks into sys/devices/pci*/... on real kernels and
        # plain directories in some captured trees; realpath handles both.
        real = os.path.realpath(path)
        if not os.path.isdir(real):
            continue
        device = _read_device(name, real, online, node_of_cpu, pci_path_of(real, devices_dir))
        if proc_dir is not None and device.vendor.lower() == NVIDIA_VENDOR:
            minor = nvidia_minor(os.path.join(proc_dir, "driver", "nvidia", "gpus", name, "information"))
            device = replace(device, nvidia_minor=minor)
        devices.append(device)
    return tuple(devices)


# A host bridge's directory: "pci0000:80", "pci10000:00" (a VMD domain).
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")


def pci_path_of(real: str, devices_dir: str) -> tuple[str, ...]:
    """A device's place in the PCI tree from the realpath of its sys/bus/pci/devices entry:
    `<devices_dir>/pci0000:80/0000:80:00.0/0000:81:00.0` -> ("pci0000:80", "0000:80:00.0"),
    the first host bridge below `devices_dir` (sys/devices, resolved) and every directory
    below it down to the device's parent. () when the entry does not lead into
    `devices_dir` through a host bridge (a plain directory of a captured tree). The host
    bridge may sit below other devices (`platform/.../pci0000:00` on device-tree machines,
    a Hyper-V VMBus device): what lies above it is no PCI hierarchy."""
    rel = os.path.relpath(real, devices_dir)
    if rel == os.curdir or rel.startswith(os.pardir):
        return ()
    parts = rel.split(os.sep)[:-1]
    for i, part in enumerate(parts):
        if _HOST_BRIDGE.match(part):
            return tuple(parts[i:])
    return ()


NVIDIA_VENDOR = "0x10de"


def nvidia_minor(path: str) -> int | None:
    """The "Device Minor:" of the NVIDIA driver's information file, None without one
    (nothing else depends on it: an unreadable file is no reason to fail discovery)."""
    try:
        text = read_text(path) or ""
    except DiscoveryError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Device Minor" and value.strip().isdigit():
            return int(value.strip())
    return None


def _read_device(address: str, path: str, online: CpuSet, node_of_cpu: Mapping[int, int],
                 pci_path: tuple[str, ...]) -> PciDevice:
    def attr(name: str) -> str | None:
        return read_text(os.path.join(path, name))

    local_cpus = read_cpus(path, ("local_cpulist",), ("local_cpus",)) or CpuSet()
    raw_node = read_int(os.path.join(path, "numa_node"))
    if raw_node is not None and raw_node >= 0:
        node, source = raw_node, "numa_node"
    else:
        node = _node_from_local_cpus(local_cpus, online, node_of_cpu)
        source = "local_cpulist" if node != UNKNOWN_NODE else "unknown"

    virtfns = tuple(
        vf for _, vf in (
            (n, link_basename(os.path.join(path, entry)))
            for n, entry in numbered_entries(path, "virtfn")
        ) if vf
    )
    children = _class_children(path)
    return PciDevice(
        address=address,
        pci_class=attr("class") or "",
        vendor=attr("vendor") or "",
        device=attr("device") or "",
        numa_node=node,
        numa_node_source=source,
        subsystem_vendor=attr("subsystem_vendor"),
        subsystem_device=attr("subsystem_device"),
        driver=link_basename(os.path.join(path, "driver")),
        local_cpus=local_cpus,
        physfn=link_basename(os.path.join(path, "physfn")),
        virtfns=virtfns,
        sriov_totalvfs=read_int(os.path.join(path, "sriov_totalvfs")),
        sriov_numvfs=read_int(os.path.join(path, "sriov_numvfs")),
        net=children.pop("net", ()),
        block=children.pop("block", ()),
        infiniband=children.pop("infiniband", ()),
        other_children=tuple(
            f"{cls}/{child}" for cls in sorted(children) for child in children[cls]
        ),
        pci_path=pci_path,
    )


def _node_from_local_cpus(local: CpuSet, online: CpuSet, node_of_cpu: Mapping[int, int]) -> int:
    """The one NUMA node holding every online CPU of `local`, else UNKNOWN_NODE."""
    nodes = {node_of_cpu.get(cpu, UNKNOWN_NODE) for cpu in local & online}
    if len(nodes) == 1:
        return nodes.pop()  # may itself be UNKNOWN_NODE: CPUs in no node
    return UNKNOWN_NODE


def _class_children(path: str) -> dict[str, tuple[str, ...]]:
    """class name -> child names, e.g. {"net": ("eth0",), "block": ("nvme0n1",)}.

    A class directory is a real subdirectory (not a nested PCI function) that
    itself holds subdirectories. NVMe controllers put their namespaces one
    level deeper (`nvme/nvme0/nvme0n1`); those count as block devices."""
    out: dict[str, list[str]] = {}
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    for entry in _class_dirs(entries):
        subdirs = sorted(e.name for e in os.scandir(entry.path) if e.is_dir(follow_symlinks=False))
        if not subdirs:
            continue
        out.setdefault(entry.name, []).extend(subdirs)
        if entry.name == "nvme":
            for controller in subdirs:
                ctrl_path = os.path.join(entry.path, controller)
                namespaces = sorted(
                    e.name for e in os.scandir(ctrl_path)
                    if e.is_dir(follow_symlinks=False) and _NVME_NAMESPACE.match(e.name)
                )
                block = out.setdefault("block", [])
                block.extend(n for n in namespaces if n not in block)
    return {cls: tuple(names) for cls, names in out.items()}


def _class_dirs(entries: list[os.DirEntry]) -> list[os.DirEntry]:
    """The class directories among a device's entries. A virtio device
    (`virtio2/`) stands between the PCI function and its classes
    (`virtio2/net/eth0`): its own class directories count as the function's."""
    found = []
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir() or entry.name in _NOT_CLASS_DIRS:
            continue
        if is_pci_address(entry.name):
            continue
        if _VIRTIO_DEVICE.match(entry.name):
            found.extend(_class_dirs(sorted(os.scandir(entry.path), key=lambda e: e.name)))
            continue
        found.append(entry)
    return found


__all__ = ["read_pci_devices", "pci_path_of", "DiscoveryError"]
