"""Machine shapes the guest can boot as, and the QEMU arguments for each.

A shape is a plain value: CPU topology, NUMA nodes (memory and the sockets
they own), the node distance table and the PCI devices that should report a
node. The QEMU command is derived from it, so memory sizes always add up and
the expected guest view (CPUs per node) can be computed without booting.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .monitor import SOCKET as MONITOR_SOCKET

HOTPLUG_SLOTS = 2
# A shape of two guests joins them by one virtual link (virtio-net) whose QEMU side is a
# pair of datagram sockets: unix sockets in a private folder of the host, so no frame is
# ever on an IP network, loopback included. Guest i has a fixed MAC and 10.0.2.(11 + i).
MAX_GUESTS = 2
GUEST_NETWORK = "10.0.2.0/24"


class ShapeError(ValueError):
    """A shape that QEMU would refuse or that would not boot as described."""


@dataclass(frozen=True)
class Node:
    id: int
    memory_mib: int
    sockets: tuple[int, ...]  # empty: a memory-only node
    dies: tuple[tuple[int, int], ...] = ()  # (socket, die) pairs, for one node per die


@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    sockets: int
    dies: int
    cores: int
    threads: int
    nodes: tuple[Node, ...]
    distances: tuple[tuple[int, int, int], ...]  # (a, b, distance) for every pair a < b
    # PCIe expander bridges: (bus number, NUMA node, devices behind it as QEMU
    # -device values without bus=, one root port each)
    expanders: tuple[tuple[int, int, tuple[str, ...]], ...] = ()
    # PID 1 of the guest: "chroot" (the harness's own init runs the command in a
    # chroot) or "systemd" (the host's systemd boots and a unit runs it).
    init: str = "chroot"
    # Room for DIMMs plugged while the guest runs (MiB, 0: none): QEMU then has
    # hotplug slots and a QMP socket in the job folder (see monitor.py).
    hotplug_mib: int = 0
    # Guests booted at once, each this machine, joined by one link (see MAX_GUESTS).
    guests: int = 1

    @property
    def cpus(self) -> int:
        return self.sockets * self.dies * self.cores * self.threads

    @property
    def memory_mib(self) -> int:
        return sum(n.memory_mib for n in self.nodes)

    def cpu_location(self, cpu: int) -> tuple[int, int, int, int]:
        """(socket, die, core, thread) of a CPU index; QEMU numbers CPUs socket-major."""
        thread = cpu % self.threads
        core = (cpu // self.threads) % self.cores
        die = (cpu // (self.threads * self.cores)) % self.dies
        socket = cpu // (self.threads * self.cores * self.dies)
        return socket, die, core, thread

    def node_of_cpu(self, cpu: int) -> int:
        socket, die, _, _ = self.cpu_location(cpu)
        for node in self.nodes:
            if (socket, die) in node.dies or (not node.dies and socket in node.sockets):
                return node.id
        raise ShapeError(f"shape {self.name}: CPU {cpu} (socket {socket}, die {die}) is in no NUMA node")

    def expected_node_cpus(self) -> dict[int, tuple[int, ...]]:
        """CPU ids per NUMA node as the guest kernel reports them (memory-only nodes: ())."""
        result: dict[int, tuple[int, ...]] = {n.id: () for n in self.nodes}
        for cpu in range(self.cpus):
            node = self.node_of_cpu(cpu)
            result[node] = result[node] + (cpu,)
        return result

    def expected_device_nodes(self) -> tuple[int, ...]:
        """NUMA nodes that at least one PCI device behind an expander bridge reports."""
        return tuple(sorted({node for _, node, _ in self.expanders}))

    def validate(self) -> None:
        """Refuse a shape QEMU or the guest could not honour, naming what is wrong."""
        self._validate_counts()
        ids = [n.id for n in self.nodes]
        self._validate_nodes(ids)
        for cpu in range(self.cpus):
            self.node_of_cpu(cpu)  # raises for a CPU no node owns
        self._validate_distances(ids)
        for bus, node, _ in self.expanders:
            if node not in ids:
                raise ShapeError(f"shape {self.name}: expander bridge on bus {bus} names unknown node {node}")

    @property
    def boots_systemd(self) -> bool:
        return self.init == "systemd"

    def _validate_counts(self) -> None:
        if not 1 <= self.guests <= MAX_GUESTS:
            raise ShapeError(f"shape {self.name}: guests must be 1 to {MAX_GUESTS} (one link joins two), "
                             f"not {self.guests}")
        if self.init not in ("chroot", "systemd"):
            raise ShapeError(f"shape {self.name}: init must be chroot or systemd, not {self.init!r}")
        for field in ("sockets", "dies", "cores", "threads"):
            if getattr(self, field) < 1:
                raise ShapeError(f"shape {self.name}: {field} must be at least 1")

    def _validate_nodes(self, ids: list[int]) -> None:
        if not ids:
            raise ShapeError(f"shape {self.name}: needs at least one NUMA node")
        if len(set(ids)) != len(ids):
            raise ShapeError(f"shape {self.name}: NUMA node ids repeat: {ids}")
        for node in self.nodes:
            if node.memory_mib < 128 or node.memory_mib % 2:
                raise ShapeError(
                    f"shape {self.name}: node {node.id} has {node.memory_mib} MiB; "
                    "give every node an even size of at least 128 MiB"
                )
            for socket in node.sockets:
                if not 0 <= socket < self.sockets:
                    raise ShapeError(f"shape {self.name}: node {node.id} names socket {socket}, "
                                     f"but the machine has sockets 0-{self.sockets - 1}")
            for socket, die in node.dies:
                if not (0 <= socket < self.sockets and 0 <= die < self.dies):
                    raise ShapeError(f"shape {self.name}: node {node.id} names socket {socket} die {die}, "
                                     "which the machine does not have")

    def _validate_distances(self, ids: list[int]) -> None:
        given = {}
        for a, b, distance in self.distances:
            if a not in ids or b not in ids or a == b:
                raise ShapeError(f"shape {self.name}: distance {a}->{b} names an unknown node or a node to itself")
            if not 10 < distance <= 255:
                raise ShapeError(f"shape {self.name}: distance {a}->{b} is {distance}; it must be 11-255")
            given[frozenset((a, b))] = distance
        if len(ids) > 1:
            missing = [(a, b) for i, a in enumerate(ids) for b in ids[i + 1:] if frozenset((a, b)) not in given]
            if missing:
                raise ShapeError(f"shape {self.name}: QEMU needs a distance for every node pair; missing {missing}")


def guest_address(guest: int) -> str:
    """The IPv4 address of guest `guest` (0-based) of a multi-guest shape."""
    return f"10.0.2.{11 + guest}"


def guest_mac(guest: int) -> str:
    return f"52:54:00:00:02:{11 + guest:02x}"


def link_sockets(net_dir: Path, guest: int) -> tuple[Path, Path]:
    """(this guest's end, the other guest's end) of the link of a two-guest shape."""
    return net_dir / f"guest{guest}.sock", net_dir / f"guest{1 - guest}.sock"


def qemu_args(shape: Shape, *, kernel: Path, initrd: Path, job_dir: Path,
              out_dir: Path | None = None, qemu: str = "qemu-system-x86_64",
              guest: int = 0, net_dir: Path | None = None) -> list[str]:
    """The full QEMU command line that boots `shape` with the job share at `job_dir`; for a
    shape of two guests, guest `guest` of them, its link's sockets in `net_dir`."""
    shape.validate()
    if shape.guests > 1 and (net_dir is None or not 0 <= guest < shape.guests):
        raise ShapeError(f"shape {shape.name}: guest {guest} of {shape.guests} needs the folder of its link's sockets")
    args = [
        qemu, "-accel", "tcg", "-cpu", "max,vendor=GenuineIntel", "-machine", "q35",
        "-m", str(shape.memory_mib) if not shape.hotplug_mib else
              f"{shape.memory_mib},slots={HOTPLUG_SLOTS},maxmem={shape.memory_mib + shape.hotplug_mib}M",
        "-smp", f"{shape.cpus},sockets={shape.sockets},dies={shape.dies},"
                f"cores={shape.cores},threads={shape.threads}",
    ]
    for node in shape.nodes:
        args += ["-object", f"memory-backend-ram,id=m{node.id},size={node.memory_mib}M",
                 "-numa", f"node,nodeid={node.id},memdev=m{node.id}"]
    for node in shape.nodes:
        if node.dies:
            for socket, die in node.dies:
                args += ["-numa", f"cpu,node-id={node.id},socket-id={socket},die-id={die}"]
        for socket in node.sockets if not node.dies else ():
            args += ["-numa", f"cpu,node-id={node.id},socket-id={socket}"]
    for a, b, distance in shape.distances:
        args += ["-numa", f"dist,src={a},dst={b},val={distance}"]
    # Devices on the root complex report numa_node -1, like real machines without _PXM.
    args += ["-device", "e1000e,id=nic0,bus=pcie.0"]
    chassis = 0
    for index, (bus, node, devices) in enumerate(shape.expanders):
        pxb = f"pxb{index}"
        args += ["-device", f"pxb-pcie,id={pxb},bus_nr={bus},numa_node={node},bus=pcie.0"]
        for device in devices:
            chassis += 1
            port = f"rp{chassis}"
            args += ["-device", f"pcie-root-port,id={port},bus={pxb},chassis={chassis},slot=0"]
            if device.startswith("nvme"):
                drive = f"nvm{chassis}"
                args += ["-drive", f"if=none,id={drive},driver=null-co,size=1G",
                         "-device", f"{device},bus={port},drive={drive},serial=vmnvme{chassis}"]
            else:
                args += ["-device", f"{device},bus={port}"]
    args += [
        "-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot,bus=pcie.0",
        "-fsdev", f"local,id=job,path={job_dir},security_model=none",
        "-device", "virtio-9p-pci,fsdev=job,mount_tag=job,bus=pcie.0",
    ]
    if shape.guests > 1:
        assert net_dir is not None
        here, there = link_sockets(net_dir, guest)
        args += ["-netdev", f"dgram,id=link0,local.type=unix,local.path={here},"
                            f"remote.type=unix,remote.path={there}",
                 "-device", f"virtio-net-pci,netdev=link0,mac={guest_mac(guest)},bus=pcie.0"]
    if out_dir is not None:
        args += ["-fsdev", f"local,id=out,path={out_dir},security_model=none",
                 "-device", "virtio-9p-pci,fsdev=out,mount_tag=out,bus=pcie.0"]
    if shape.hotplug_mib:
        args += ["-qmp", f"unix:{job_dir / MONITOR_SOCKET},server=on,wait=off"]
    args += [
        "-kernel", str(kernel), "-initrd", str(initrd),
        "-append", "console=ttyS0 loglevel=7 panic=-1 cgroup_no_v1=all mitigations=off",
        "-display", "none", "-monitor", "none", "-serial", f"file:{job_dir / 'console.log'}",
        "-nic", "none", "-no-reboot",
    ]
    return args


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape(
            name="2node",
            description="2 sockets x 2 cores x 2 threads, one node per socket; NVMe and NIC on node 1",
            sockets=2, dies=1, cores=2, threads=2,
            nodes=(Node(0, 1024, (0,)), Node(1, 1024, (1,))),
            distances=((0, 1, 21),),
            expanders=((128, 1, ("nvme", "e1000e,id=nic1")),),
            hotplug_mib=512,
        ),
        Shape(
            name="4node",
            description="4 sockets x 2 cores, one node per socket; NVMe on node 3",
            sockets=4, dies=1, cores=2, threads=1,
            nodes=(Node(0, 512, (0,)), Node(1, 512, (1,)), Node(2, 512, (2,)), Node(3, 512, (3,))),
            # A ring: neighbours at 21, the opposite socket at 31.
            distances=((0, 1, 21), (0, 2, 31), (0, 3, 21), (1, 2, 21), (1, 3, 31), (2, 3, 21)),
            expanders=((128, 3, ("nvme",)),),
        ),
        Shape(
            name="cpuless",
            description="2 sockets x 2 cores x 2 threads on nodes 0-1, node 2 memory only (distance 30)",
            sockets=2, dies=1, cores=2, threads=2,
            nodes=(Node(0, 768, (0,)), Node(1, 768, (1,)), Node(2, 512, ())),
            distances=((0, 1, 21), (0, 2, 30), (1, 2, 30)),
            expanders=((128, 1, ("nvme",)),),
        ),
        Shape(
            name="snc",
            description="2 sockets x 2 dies x 2 cores, one node per die (sub-NUMA clustering)",
            sockets=2, dies=2, cores=2, threads=1,
            nodes=(Node(0, 512, (), ((0, 0),)), Node(1, 512, (), ((0, 1),)),
                   Node(2, 512, (), ((1, 0),)), Node(3, 512, (), ((1, 1),))),
            distances=((0, 1, 12), (0, 2, 21), (0, 3, 21), (1, 2, 21), (1, 3, 21), (2, 3, 12)),
            expanders=((128, 2, ("nvme",)),),
        ),
    )
}


# The 2node machine again, booted by the host's systemd as PID 1.
SHAPES["systemd"] = replace(SHAPES["2node"], name="systemd", init="systemd", hotplug_mib=0,
                            description="the 2node machine booted by the host's systemd as PID 1; "
                                        "the command runs as a unit")


# The 2node machine for the engines' guests (podman, Slurm, containerd): chroot-booted like
# 2node, without the hotplug DIMM slots.
for _engine in ("podman", "slurm", "containerd"):
    SHAPES[_engine] = replace(SHAPES["2node"], name=_engine, hotplug_mib=0,
                              description=f"the 2node machine, for the {_engine} scenarios")

# Two guests at once, joined by a private link: a Slurm cluster of two nodes. Each is the
# 2node topology (the CPUs two tasks of whole cores need beside the agent's reserved one)
# with 256 MiB per node and no PCI devices behind expander bridges: while the scenarios'
# tasks ran, about 345 of a guest's 456 MiB stayed available (the 128 MiB floor per node
# would leave under 100).
SHAPES["slurm2"] = replace(
    SHAPES["2node"], name="slurm2", hotplug_mib=0, expanders=(), guests=2,
    nodes=(Node(0, 256, (0,)), Node(1, 256, (1,))),
    description="two 2node guests (256 MiB per node, no expander devices) joined by a private link, "
                "for the Slurm cluster scenarios")


def get_shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ShapeError(f"unknown machine shape {name!r}; known shapes: {', '.join(sorted(SHAPES))}") from None
