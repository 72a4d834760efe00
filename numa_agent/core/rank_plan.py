"""Which NUMA node each rank of `numa-run --tasks N` goes to, decided before anything is
booked: a pure function of what each node has free and what one rank asks for.

A node holds as many ranks as its scarcest asked resource allows (free CPUs over the
CPUs per rank, free memory over the memory per rank, and for each device resource its
free devices over the devices per rank). The distributions are srun's:

- `block`: consecutive ranks share a node; a node is filled before the next (lowest
  node id first);
- `cyclic`: rank k goes to the next node round the nodes that still hold one.

`cuda_indices` says which CUDA device index a GPU has when CUDA enumerates the
machine's NVIDIA GPUs in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from numa_agent.core.units import format_bytes

DISTRIBUTIONS = ("block", "cyclic")
NVIDIA_VENDOR = "0x10de"
_DISPLAY_CLASS = "0x03"  # PCI base class 03: display controllers (VGA 0x0300, 3D 0x0302)


class PlanError(ValueError):
    """The ranks do not fit: one line saying which rank is the first that fits nowhere and why."""


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """What one NUMA node has free: CPUs, memory in bytes, devices per resource."""

    node: int
    cpus: int
    memory_bytes: int = 0
    devices: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RankAsk:
    """What each rank asks for; `tasks` ranks in all."""

    tasks: int
    cpus: int
    memory_bytes: int = 0
    devices: Mapping[str, int] = field(default_factory=dict)
    distribution: str = "block"

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"tasks must be 1 or more, got {self.tasks}")
        if self.cpus < 1:
            raise ValueError(f"cpus per rank must be 1 or more, got {self.cpus}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}")


def holds(room: NodeRoom, ask: RankAsk) -> int:
    """How many ranks `room` holds."""
    limits = [max(room.cpus, 0) // ask.cpus]
    if ask.memory_bytes > 0:
        limits.append(max(room.memory_bytes, 0) // ask.memory_bytes)
    limits.extend(max(room.devices.get(resource, 0), 0) // count
                  for resource, count in ask.devices.items() if count > 0)
    return min(limits)


def plan_ranks(ask: RankAsk, rooms: Iterable[NodeRoom]) -> tuple[int, ...]:
    """The node of each rank, rank 0 first; PlanError when they do not all fit."""
    rooms = sorted(rooms, key=lambda r: r.node)
    room_for = {room.node: holds(room, ask) for room in rooms}
    if sum(room_for.values()) < ask.tasks:
        raise PlanError(_shortage(ask, rooms, room_for))
    if ask.distribution == "block":
        plan = [node for node, count in room_for.items() for _ in range(count)]
        return tuple(plan[:ask.tasks])
    left = dict(room_for)
    order = [node for node in room_for if left[node] > 0]
    cyclic: list[int] = []
    while len(cyclic) < ask.tasks:
        for node in order:
            if left[node] > 0 and len(cyclic) < ask.tasks:
                cyclic.append(node)
                left[node] -= 1
    return tuple(cyclic)


def _shortage(ask: RankAsk, rooms: Sequence[NodeRoom], room_for: Mapping[int, int]) -> str:
    fit = sum(room_for.values())
    each = [f"{ask.cpus} CPU{'' if ask.cpus == 1 else 's'}"]
    if ask.memory_bytes > 0:
        each.append(_bytes_text(ask.memory_bytes))
    each.extend(f"{count} {resource}" for resource, count in sorted(ask.devices.items()) if count > 0)
    why = _total_short(ask, rooms)
    nodes = "; ".join(_node_text(room, ask, room_for[room.node]) for room in rooms) or "no NUMA node"
    return (f"rank {fit} of {ask.tasks} fits on no NUMA node ({', '.join(each)} per rank, "
            f"all on one node){why}: {nodes}")


def _total_short(ask: RankAsk, rooms: Sequence[NodeRoom]) -> str:
    """What the whole machine lacks, when it lacks something whatever the nodes."""
    for resource, count in sorted(ask.devices.items()):
        free = sum(max(r.devices.get(resource, 0), 0) for r in rooms)
        if count > 0 and free < count * ask.tasks:
            return f": more tasks than {resource} devices ({count * ask.tasks} needed, {free} free on known nodes)"
    if ask.cpus > max((r.cpus for r in rooms), default=0):
        return f": a rank's {ask.cpus} CPUs fit on no node"
    free_cpus = sum(max(r.cpus, 0) for r in rooms)
    if free_cpus < ask.cpus * ask.tasks:
        return f": more tasks than CPUs ({ask.cpus * ask.tasks} needed, {free_cpus} free)"
    return ""


def _node_text(room: NodeRoom, ask: RankAsk, count: int) -> str:
    parts = [f"{room.cpus} CPU{'' if room.cpus == 1 else 's'}"]
    if ask.memory_bytes > 0:
        parts.append(_bytes_text(room.memory_bytes))
    parts.extend(f"{room.devices.get(resource, 0)} {resource}"
                 for resource, n in sorted(ask.devices.items()) if n > 0)
    return f"node {room.node} holds {count} ({', '.join(parts)} free)"


def _bytes_text(value: int) -> str:
    return format_bytes(value)


def cuda_indices(gpus: Iterable[str], devices: Iterable[Mapping[str, object]]) -> list[int]:
    """The CUDA index of each PCI address in `gpus` among `devices` (the machine's PCI
    devices as the agent's topology lists them: address, vendor, class), counting the
    NVIDIA display controllers in PCI bus order, as CUDA does with
    CUDA_DEVICE_ORDER=PCI_BUS_ID. An address that is no NVIDIA GPU there is left out."""
    order = sorted(str(d.get("address", "")).lower() for d in devices
                   if str(d.get("vendor", "")).lower() == NVIDIA_VENDOR
                   and str(d.get("class", "")).lower().startswith(_DISPLAY_CLASS))
    index = {address: i for i, address in enumerate(order)}
    return [index[a.lower()] for a in gpus if a.lower() in index]
