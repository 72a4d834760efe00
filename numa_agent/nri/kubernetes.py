"""What a Kubernetes container asks of the agent, read from NRI's messages (pure).

The kubelet has already decided a pod's QoS class and written each container's
Linux resources; the runtime hands both to the plugin. This module reads them
the way the kubelet's static CPU and memory managers do, and writes the
answers (the container's adjustment, the shared containers' updates, a
refusal's one line). No I/O: the handler (handler.py) asks the service.

## Exclusive or shared: the rule

A container gets exclusive CPUs when all of these hold, else it runs on the
shared pool (`Placement.why` says which failed, for the log):

1. Its pod is Guaranteed. The QoS class is read from the pod's cgroup parent
   (`PodSandbox.linux.cgroup_parent`; the container's `linux.cgroups_path`
   when the parent is empty), as the kubelet placed it: below `kubepods`,
   a `besteffort` or `burstable` level (cgroupfs `/kubepods/burstable/pod<uid>`,
   systemd `kubepods-burstable-pod<uid>.slice`) names that class, a `pod<uid>`
   directly below `kubepods` is Guaranteed. A cgroup outside `kubepods` is no
   Kubernetes pod's: shared.
2. Its CPU limit is a whole number of CPUs: `quota` and `period` both given,
   both positive, `quota` a multiple of `period`; N = quota / period.
3. Its CPU request equals that limit: `shares` is N * 1024 (the kubelet's
   milli-CPU * 1024 / 1000) when given.
4. The values are ones a request can hold: N at most `MAX_CPUS`, the memory
   limit at most `MAX_MEMORY_BYTES`, every hugepage limit a whole number of
   its pages (at most `MAX_HUGEPAGE_COUNT`) of a size the kernel spells
   (`2MB`, `1GB` as in `hugetlb.2MB.max`; `2Mi`, `2048kB` too).

Such a container books N exclusive CPUs, its memory limit as memory (none
without one) and each non-zero hugepage limit as pages of that size (the
kubelet writes a zero limit for every size not asked). Nothing else is read:
memory requests are not in the Linux resources, and the pod's QoS already
says they equal the limits. `pod_resources` (the pod's totals, where the
runtime gives them) serves only pod scope (`pod_budget`).

Init containers are read like the others: they run one after another and
stop before the app containers start, and their stop releases their CPUs.

## The pod's numa-agent.io/ annotations

They are read by the OCI hook's parser (`engines/annotations.py`: the same
syntax, the same one-line errors; a bad one refuses the container, as the
hook fails closed). In Kubernetes the amounts come from the container's
resources, so `cpus`, `memory` and `hugepages-*` are not used to size
anything, and `pod` is not used either (the pod is the sandbox; pod scope
is the agent's `[topology] scope`). The placement annotations (`policy`,
`numa-allocation-strategy`, `membind`, `devices`) apply to each exclusive
container of the pod. On a container that runs on the shared pool:

- `numa-agent.io/cpus` above 0 asks for exclusive CPUs its pod's QoS cannot
  have: the container is refused, with the rule it missed. A pod's author who
  wrote it wants the pinning; running unpinned would hide the mistake.
- the others have nothing to place: a log line says they are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numa_agent.core import units
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.names import SANDBOX_POD_PREFIX
from numa_agent.engines.annotations import PREFIX, admission_body
from numa_agent.engines.oci_hook import ContainerState
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.service.refusals import ServiceRefusal, TopologyRefused
from numa_agent.service.requests import MAX_CPUS, MAX_HUGEPAGE_COUNT, MAX_MEMORY_BYTES

GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"
SHARES_PER_CPU = 1024

# The kubelet's admission reasons (what `kubectl describe pod` shows); the rest is
# UnexpectedAdmissionError, as the kubelet says for a manager's other errors.
TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
SMT_ALIGNMENT_ERROR = "SMTAlignmentError"
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
_KUBELET_REASON = {"topology_affinity_error": TOPOLOGY_AFFINITY_ERROR, "smt_alignment_error": SMT_ALIGNMENT_ERROR}

# The annotations that place an exclusive container (AdmitRequest fields, as admission_body names them).
PLACEMENT_FIELDS = ("policy", "numa_allocation_strategy", "membind", "devices")
_SIZING = {"cpus": "cpus", "memory_bytes": "memory", "hugepages": "hugepages-*", "pod": "pod"}


@dataclass(frozen=True)
class Placement:
    """What a container gets: `cpus` exclusive CPUs (0: the shared pool), the
    memory and hugepages (page size in kB as text -> pages) booked with them."""

    qos: str | None  # Guaranteed, Burstable, BestEffort; None: not a Kubernetes pod
    cpus: int = 0
    memory_bytes: int = 0
    hugepages: Mapping[str, int] = field(default_factory=dict)
    why: str = ""  # one line: what it is, or why the shared pool

    @property
    def exclusive(self) -> bool:
        return self.cpus > 0


# ---------------------------------------------------------------- names
def workload_name(container_id: str) -> str:
    """`ctr-<the container id's first 12 hex>`, as the OCI hook names a container."""
    return ContainerState(id=container_id).workload_name


def request_id(container_id: str) -> str:
    """The id itself when 64 hex, else its sha256 (the OCI hook's rule): a retried
    CreateContainer replays the admission instead of booking twice."""
    return ContainerState(id=container_id).request_id


def pod_name(sandbox_id: str) -> str:
    """`sbx-<the sandbox id's first 12 hex>`: the pod's budget under pod scope."""
    return SANDBOX_POD_PREFIX + ContainerState(id=sandbox_id).short_id


# ---------------------------------------------------------------- the QoS class
def qos_of_cgroup(path: str) -> str | None:
    """The QoS class the kubelet's cgroup path says (cgroupfs or systemd form,
    the pod's parent or a container's path), None outside `kubepods`."""
    tokens: list[str] = []
    for component in path.split(":", 1)[0].split("/"):  # systemd's "slice:prefix:id"
        tokens.extend(component.removesuffix(".slice").split("-"))
    if "kubepods" not in tokens:
        return None
    for token in tokens[tokens.index("kubepods") + 1:]:
        if token == "besteffort":
            return BEST_EFFORT
        if token == "burstable":
            return BURSTABLE
        if token.startswith("pod"):
            return GUARANTEED
    return None  # kubepods itself: no pod's


def pod_qos(pod: Any, container: Any) -> str | None:
    """The pod's QoS class from its cgroup parent, else from the container's cgroups path."""
    parent = pod.linux.cgroup_parent or pod.linux.cgroups_path
    return qos_of_cgroup(parent) if parent else qos_of_cgroup(container.linux.cgroups_path)


# ---------------------------------------------------------------- the container's resources
def classify(pod: Any, container: Any, resources: Any = None) -> Placement:
    """The container's placement by the module's rule; `resources` (api.LinuxResources):
    new ones to read instead of the container's own (an UpdateContainer's)."""
    qos = pod_qos(pod, container)
    if qos != GUARANTEED:
        return Placement(qos, why=f"a {qos} pod's container" if qos else
                         "not in a Kubernetes pod's cgroup (no kubepods parent)")
    if resources is None:
        resources = container.linux.resources
    cpus, why = whole_cpus(resources.cpu)
    if not cpus:
        return Placement(qos, why=f"a Guaranteed pod's container with {why}")
    memory = resources.memory.limit.value if resources.memory.HasField("limit") else 0
    if memory < 0 or memory > MAX_MEMORY_BYTES:
        return Placement(qos, why=f"a Guaranteed pod's container with a memory limit of {memory} bytes, "
                                  "which no request can hold")
    try:
        pages = hugepages(resources.hugepage_limits)
    except ValueError as e:
        return Placement(qos, why=f"a Guaranteed pod's container with {e}")
    return Placement(qos, cpus, max(memory, 0), pages, why=f"a Guaranteed pod's container with {cpus} "
                     f"whole CPU{'s' if cpus > 1 else ''}")


def updated_resources(current: Any, new: Any) -> Any:
    """The container's resources after an update that gives `new` (api.LinuxResources):
    what `new` sets replaces what `current` has, what it leaves out stays (an update
    that says nothing of CPUs changes no CPU count)."""
    out = api.LinuxResources()
    out.CopyFrom(current)
    if new.hugepage_limits:
        del out.hugepage_limits[:]
    out.MergeFrom(new)
    return out


def whole_cpus(cpu: Any) -> tuple[int, str]:
    """(N, "") for a whole CPU count whose request equals its limit; (0, why not)."""
    if not cpu.HasField("quota") or cpu.quota.value <= 0:
        return 0, "no CPU limit (no CFS quota)"
    if not cpu.HasField("period") or cpu.period.value <= 0:
        return 0, "a CFS quota without a period"
    quota, period = cpu.quota.value, cpu.period.value
    if quota % period:
        return 0, f"a fractional CPU limit ({quota / period:g} CPUs)"
    n = quota // period
    if n > MAX_CPUS:
        return 0, f"a CPU limit of {n} CPUs, more than a request can hold ({MAX_CPUS})"
    if cpu.HasField("shares") and cpu.shares.value != n * SHARES_PER_CPU:
        return 0, (f"a CPU request (shares {cpu.shares.value}) other than its limit of {n} CPUs "
                   f"(shares {n * SHARES_PER_CPU})")
    return n, ""


def hugepages(limits: Sequence[Any]) -> dict[str, int]:
    """Page size in kB (text, as AdmitRequest.hugepages) -> pages, for the non-zero limits."""
    out: dict[str, int] = {}
    for limit in limits:
        if not limit.limit:
            continue
        size_kb = units.page_size_kb(limit.page_size)
        pages, rest = divmod(limit.limit, size_kb << 10)
        if rest or pages > MAX_HUGEPAGE_COUNT:
            raise ValueError(f"a hugepage limit of {limit.limit} bytes of {limit.page_size} pages, not a "
                             f"whole number of pages up to {MAX_HUGEPAGE_COUNT}")
        out[str(size_kb)] = out.get(str(size_kb), 0) + pages
    return out


def pod_budget(pod: Any) -> dict[str, Any] | None:
    """The pod's totals as an AdmitRequest `pod_budget`, when the runtime gives them
    (`linux.pod_resources`) as whole CPUs; None: not known, container scope."""
    if not pod.HasField("linux") or not pod.linux.HasField("pod_resources"):
        return None
    resources = pod.linux.pod_resources
    cpus, _ = whole_cpus(resources.cpu)
    memory = resources.memory.limit.value if resources.memory.HasField("limit") else 0
    if not cpus or not 0 <= memory <= MAX_MEMORY_BYTES:
        return None
    try:
        pages = hugepages(resources.hugepage_limits)
    except ValueError:
        return None
    return {"cpus": cpus, "memory_bytes": memory, "hugepages": pages}


# ---------------------------------------------------------------- annotations
def annotations_of(pod: Any) -> dict[str, Any]:
    """The pod's numa-agent.io/ annotations as the OCI hook reads them (an admission
    body's fields); AnnotationError (one line) for a bad one."""
    return admission_body({k: v for k, v in pod.annotations.items() if k.startswith(PREFIX)})


def placement_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The annotations that place an exclusive container, as AdmitRequest fields."""
    return {k: body[k] for k in PLACEMENT_FIELDS if body.get(k)}


def annotation_refusal(body: Mapping[str, Any], placement: Placement) -> str | None:
    """Why a shared container's annotations refuse it (it asks for exclusive CPUs), or None."""
    if placement.exclusive or not body.get("cpus"):
        return None
    return (f"the pod's annotation {PREFIX}cpus={body['cpus']} asks for exclusive CPUs, but the container is "
            f"{placement.why}; exclusive CPUs need a Guaranteed pod whose container's CPU request equals its "
            "limit, in whole CPUs")


def annotation_notes(body: Mapping[str, Any], placement: Placement) -> list[str]:
    """The annotations that have no effect on this container, one phrase each."""
    notes = [f"{PREFIX}{name} (Kubernetes' resources and the agent's scope decide)"
             for key, name in _SIZING.items() if body.get(key) and not (key == "cpus" and not placement.exclusive)]
    if not placement.exclusive:
        notes += [f"{PREFIX}{k.replace('_', '-')} (the container runs on the shared pool)"
                  for k in placement_fields(body)]
    return notes


# ---------------------------------------------------------------- answers
def mems_text(mems: Sequence[int] | str) -> str:
    """NUMA node ids as kernel list text ("0-1,3"); text passes through."""
    return mems if isinstance(mems, str) else CpuSet(mems).format()


def cpu_resources(cpus: str, mems: str = "") -> Any:
    """api.LinuxResources setting only the cpuset (`mems` empty: left as it is)."""
    return api.LinuxResources(cpu=api.LinuxCPU(cpus=cpus, mems=mems))


def adjustment(cpus: str, mems: str = "") -> Any:
    """CreateContainer's answer: the container's cpuset."""
    return api.ContainerAdjustment(linux=api.LinuxContainerAdjustment(resources=cpu_resources(cpus, mems)))


def update(container_id: str, cpus: str, mems: str = "", *, ignore_failure: bool = False) -> Any:
    """A ContainerUpdate setting `container_id`'s cpuset. `ignore_failure`: for the pool's
    followers, one of which may be gone by the time the runtime applies it."""
    return api.ContainerUpdate(container_id=container_id, ignore_failure=ignore_failure,
                               linux=api.LinuxContainerUpdate(resources=cpu_resources(cpus, mems)))


def add_pool_updates(updates: Any, container_ids: Iterable[str], cpus: str) -> None:
    """Append to `updates` (an answer's repeated ContainerUpdate) one update a container
    setting its CPUs to the pool's `cpus`, with `ignore_failure` (one of them may be gone
    by the time the runtime applies it). One message copied and renamed for each: a
    thousand containers follow a pool change in a fifth of the time of building each."""
    template = update("", cpus, ignore_failure=True)
    for container_id in container_ids:
        added = updates.add()
        added.CopyFrom(template)
        added.container_id = container_id


def kubelet_reason(refusal: ServiceRefusal) -> str:
    """The kubelet's reason for the service's refusal."""
    if isinstance(refusal, TopologyRefused):
        return TOPOLOGY_AFFINITY_ERROR
    return _KUBELET_REASON.get(str(refusal.details.get("reason_code", "")), UNEXPECTED_ADMISSION_ERROR)


def refusal_line(what: str, reason: str, message: str, code: str | None = None) -> str:
    """One line, the kubelet's reason first: `SMTAlignmentError: numa-agent refused
    container web (ctr-...): <the agent's reason> [smt_alignment_error]`."""
    line = f"{reason}: numa-agent refused {what}: {message}"
    line = " ".join(line.split())
    return f"{line} [{code}]" if code else line


def service_refusal_line(what: str, refusal: ServiceRefusal) -> str:
    code = refusal.details.get("reason_code")
    return refusal_line(what, kubelet_reason(refusal), refusal.message, str(code) if code else None)


def describe(pod: Any, container: Any) -> str:
    """`container NAME of pod NAMESPACE/NAME (ctr-...)` for log lines and refusals."""
    where = f" of pod {pod.namespace}/{pod.name}" if pod.name else ""
    return f"container {container.name or container.id}{where} ({workload_name(container.id)})"
