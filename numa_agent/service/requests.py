"""What a client asks of the agent, as the use-cases take it.

`AdmitRequest` and `ResizeRequest` are the application's own request values:
the HTTP API decodes a body straight into them and checks what their types
cannot say (`api/validation.py`); the service turns an admission, with the
caller's identity, into the pure core's `Request` (`to_admission_request`).
Their bounds keep any request small: a CPU list's ids, a node id, counts.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from numa_agent.admission.admit import InvalidRequest, Request, Resources
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.policy import AllocationStrategy, TopologyPolicy
from numa_agent.state.model import RuntimeRef
from numa_agent.state.model import replace as replace_value

# RuntimeRef (a container its runtime enforces, NRI) is declared with the state,
# which records it on the workload (state/ may not import service/), and is this
# module's as much: AdmitRequest.runtime names it.
__all__ = ["AdmitRequest", "PodBudget", "ResizeRequest", "RuntimeRef", "empty_runtime_id", "to_admission_request",
           "with_engine_grant"]


def empty_runtime_id(ref: RuntimeRef) -> str | None:
    """The id field (`container_id`, `sandbox_id`) a runtime's container left empty, or
    None: its runtime's calls name it by both, so neither may be empty."""
    return next((what for what in ("container_id", "sandbox_id") if not getattr(ref, what)), None)

MAX_CPUS = 4096
MAX_MEMORY_BYTES = 2 ** 50
MAX_HUGEPAGE_COUNT = 2 ** 31
MAX_DEVICE_COUNT = 64
# Highest CPU / NUMA node id a client may name. Bounds the bitmask that a
# CPU list turns into, so "0-999999999" cannot make the agent allocate memory.
MAX_CPU_ID = 8191
MAX_NODE_ID = 1023
MAX_CPU_LIST_CHARS = 4096
MAX_COMMAND_ARGS = 1024
MAX_CGROUP_CHARS = 4096

Policy = TopologyPolicy
CpuCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_CPUS)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_MEMORY_BYTES)]
HugepageCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_HUGEPAGE_COUNT)]
DeviceCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_DEVICE_COUNT)]
NodeId = Annotated[int, msgspec.Meta(ge=0, le=MAX_NODE_ID)]
NodeList = Annotated[list[NodeId], msgspec.Meta(min_length=1, max_length=MAX_NODE_ID + 1)]
ShortStr = Annotated[str, msgspec.Meta(max_length=256)]
Hugepages = Annotated[dict[ShortStr, HugepageCount], msgspec.Meta(max_length=16)]
Devices = Annotated[dict[ShortStr, DeviceCount], msgspec.Meta(max_length=64)]
Command = Annotated[list[Annotated[str, msgspec.Meta(max_length=4096)]],
                    msgspec.Meta(max_length=MAX_COMMAND_ARGS)]


class PodBudget(msgspec.Struct, forbid_unknown_fields=True):
    cpus: CpuCount = 0
    memory_bytes: Bytes = 0
    hugepages: Hugepages = {}
    devices: Devices = {}


# A client's random id for one admission (128 bits or more, lower-case hex),
# so that a retry after a lost answer returns the admission instead of booking twice.
RequestId = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32,64}$")]


class AdmitRequest(msgspec.Struct, forbid_unknown_fields=True):
    name: ShortStr | None = None
    pod: ShortStr | None = None
    cpus: CpuCount = 0
    shared: bool = False
    memory_bytes: Bytes = 0
    hugepages: Hugepages = {}
    devices: Devices = {}
    policy: Policy | None = None
    numa_allocation_strategy: AllocationStrategy | None = None
    physcpubind: Annotated[str, msgspec.Meta(max_length=MAX_CPU_LIST_CHARS)] | None = None
    cpunodebind: NodeList | None = None
    membind: NodeList | None = None
    pod_budget: PodBudget | None = None
    command: Command = []
    request_id: RequestId | None = None
    isolate: Annotated[list[ShortStr], msgspec.Meta(max_length=8)] | None = None  # irqs, idle, freq, all
    isolate_strict: bool = False
    # Enforce on an engine's cgroup instead of moving the caller: `cgroup` names
    # it (root only: a container's, from its OCI hook), `in_place` means the
    # caller's own (numa-run inside a Slurm task's cgroup).
    cgroup: Annotated[str, msgspec.Meta(max_length=MAX_CGROUP_CHARS)] | None = None
    in_place: bool = False
    # With in_place: the caller's cgroup holds other tasks booked apart (a Slurm
    # step's tasks in one cgroup), so the agent pins the caller's process inside
    # it instead of writing the cgroup (exclusive CPUs only).
    pinned: bool = False
    # The caller's own bound on where its CPUs may lie (numa-run: the CPUs Slurm's
    # task/affinity bound the task to); narrows, never widens, what is booked.
    within_cpus: Annotated[str, msgspec.Meta(max_length=MAX_CPU_LIST_CHARS)] | None = None
    # A container its runtime enforces (root only: the NRI plugin). Booked as any
    # admission, but the agent makes no cgroup for it, moves no process and never
    # writes its cgroup: the runtime enforces the answer's cpus and mems.
    runtime: RuntimeRef | None = None


class ResizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """PATCH /v1/workloads/NAME: the workload's new exclusive CPU count, its new
    memory booking, or both."""

    cpus: CpuCount | None = None
    memory_bytes: Bytes | None = None


def to_admission_request(req: AdmitRequest, caller: Caller, *, name: str, created_unix: float) -> Request:
    """The admission's Request for `req` asked by `caller`, under `name`.
    InvalidRequest if `req` (built without `parse_admit_request`) names a bad
    CPU list."""
    physcpubind = None
    if req.physcpubind is not None:
        try:
            physcpubind = CpuSet.parse(req.physcpubind)
        except CpuSetParseError as exc:
            raise InvalidRequest(f"physcpubind: {exc}") from None
    return Request(
        name=name, owner_uid=caller.uid, pid=caller.pid, pid_identity=caller.identity, resources=_resources(req),
        shared=req.shared, policy=req.policy, physcpubind=physcpubind,
        numa_allocation_strategy=req.numa_allocation_strategy,
        cpunodebind=_node_ids(req.cpunodebind), membind=_node_ids(req.membind), pod=req.pod,
        pod_budget=_resources(req.pod_budget) if req.pod_budget is not None else None,
        command=tuple(req.command), created_unix=created_unix,
        within_cpus=CpuSet.parse(req.within_cpus) if req.within_cpus is not None else None)


def with_engine_grant(req: Request, cgroup: str, cpus: CpuSet, mems: tuple[int, ...],
                      granted_by: str | None = None) -> Request:
    """`req` enforced on the engine's cgroup `cgroup`, booked inside what its engine granted
    (the cpuset of `granted_by`; None: of the cgroup's parent)."""
    return replace_value(req, cgroup=cgroup, within_cpus=cpus, within_mems=mems, granted_by=granted_by)


def _resources(r: AdmitRequest | PodBudget) -> Resources:
    return Resources(cpus=r.cpus, memory_bytes=r.memory_bytes,
                     hugepages={int(k): v for k, v in r.hugepages.items()}, devices=dict(r.devices))


def _node_ids(nodes: list[int] | None) -> tuple[int, ...] | None:
    return None if nodes is None else tuple(sorted(nodes))
