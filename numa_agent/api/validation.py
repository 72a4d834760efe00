"""Validation of everything a client sends to the local API.

Two stages: msgspec decodes the JSON body into strict Structs (no coercion,
unknown fields rejected, numeric bounds), then the rules msgspec cannot say
(name syntax checked with `fullmatch`, CPU list syntax and size) are checked
here. Every failure is a `BadRequest` whose message names the field, so a
hostile or mistaken request never reaches the service.

The service receives the checked `AdmitRequest` (its own request type,
`service/requests.py`: CPU list in canonical form, node lists sorted,
resource tables in key order).
"""

from __future__ import annotations

import re

import msgspec

from numa_agent.api.errors import BadRequest
from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.names import NAME_RULE, is_resource_name, is_workload_name
from numa_agent.isolation.plan import IsolateSyntaxError, parse_kinds
from numa_agent.service.requests import (
    MAX_CPU_ID,
    MAX_CPU_LIST_CHARS,
    AdmitRequest,
    RequestId,
    ResizeRequest,
    empty_runtime_id,
)

MAX_BODY_BYTES = 64 * 1024

_HUGEPAGE_KEY_RE = re.compile(r"[1-9][0-9]{0,9}")
_CPU_LIST_CHARS_RE = re.compile(r"[0-9,:\- ]*")
# An absolute cgroup path as /proc/PID/cgroup writes it; each component checked below.
_CGROUP_COMPONENT_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,255}")


def parse_request_id(value: str, what: str = "request_id") -> str:
    """`value` if it is a request id (the RequestId form), else BadRequest."""
    try:
        return msgspec.convert(value, RequestId)
    except msgspec.ValidationError:
        raise BadRequest(f"{what} must be 32 to 64 lower-case hex digits, got {_shown(value)}",
                         details={"field": what}) from None


def validate_name(name: str, what: str = "name") -> str:
    """Return `name` if it is a valid workload/pod name, else raise BadRequest."""
    if not is_workload_name(name):
        raise BadRequest(f"invalid {what} {_shown(name)}: {NAME_RULE}",
                         details={"field": what})
    return name


def parse_admit_request(body: bytes) -> AdmitRequest:
    """Decode and check a POST /v1/workloads body; return it normalised."""
    return _check(_decoded_json(body, AdmitRequest))


def _decoded_json(body: bytes, kind: type):
    """`body` decoded as `kind`; BadRequest saying what is wrong otherwise."""
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 (byte {exc.start})") from None
    if not body.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None


def parse_resize_request(body: bytes) -> ResizeRequest:
    """Decode and check a PATCH /v1/workloads/NAME body."""
    req: ResizeRequest = _decoded_json(body, ResizeRequest)
    if req.cpus is None and req.memory_bytes is None:
        raise BadRequest("a resize names cpus, memory_bytes or both")
    return req


def _check(req: AdmitRequest) -> AdmitRequest:
    if req.name is not None:
        validate_name(req.name, "name")
    if req.pod is not None:
        validate_name(req.pod, "pod")
    if req.shared and req.cpus:
        raise BadRequest("a shared workload cannot also ask for exclusive CPUs "
                         f"(shared=true, cpus={req.cpus})", details={"field": "cpus"})
    physcpubind = None
    if req.physcpubind is not None:
        physcpubind = parse_cpu_list(req.physcpubind, "physcpubind").format()
    if req.pod_budget is not None and req.pod is None:
        raise BadRequest("pod_budget needs a pod name", details={"field": "pod_budget"})
    budget = None
    if req.pod_budget is not None:
        b = req.pod_budget
        budget = msgspec.structs.replace(b, hugepages=_hugepages(b.hugepages, "pod_budget.hugepages"),
                                         devices=_devices(b.devices, "pod_budget.devices"))
    for arg in req.command:
        if "\x00" in arg:
            raise BadRequest("command arguments cannot contain NUL", details={"field": "command"})
    isolate = _isolate(req)
    if req.runtime is not None:
        _check_runtime(req)
    if req.cgroup is not None:
        _check_cgroup(req.cgroup, req.in_place)
    if req.pinned and not req.in_place:
        raise BadRequest("pinned goes with in_place: the caller's own cgroup, shared with other tasks",
                         details={"field": "pinned"})
    if req.pinned and (req.shared or (req.cpus < 1 and req.physcpubind is None)):
        raise BadRequest("pinned books exclusive CPUs (cpus, or physcpubind): a process pinned inside a "
                         "cgroup it shares cannot follow the shared pool", details={"field": "pinned"})
    within = None if req.within_cpus is None else parse_cpu_list(req.within_cpus, "within_cpus").format()
    return msgspec.structs.replace(
        req, isolate=isolate, within_cpus=within, hugepages=_hugepages(req.hugepages, "hugepages"), devices=_devices(req.devices, "devices"),
        physcpubind=physcpubind, cpunodebind=_nodes(req.cpunodebind, "cpunodebind"),
        membind=_nodes(req.membind, "membind"), pod_budget=budget)


def _check_cgroup(cgroup: str, in_place: bool) -> None:
    if in_place:
        raise BadRequest("cgroup and in_place exclude each other (in_place: the caller's own cgroup)",
                         details={"field": "cgroup"})
    parts = cgroup.split("/")
    if not cgroup.startswith("/") or len(parts) < 3 or not all(
            _CGROUP_COMPONENT_RE.fullmatch(p) and p not in (".", "..") for p in parts[1:]):
        raise BadRequest(f"cgroup {_shown(cgroup)} is not an engine's cgroup below the cgroup2 mount, "
                         "like '/libpod_parent/libpod-<id>'", details={"field": "cgroup"})


def _check_runtime(req: AdmitRequest) -> None:
    """A container its runtime enforces: the runtime writes its cgroup (so no
    engine cgroup, no in_place), and only its exclusive containers are booked
    (the shared ones run on the pool, which the runtime is told)."""
    assert req.runtime is not None
    if req.cgroup is not None or req.in_place:
        raise BadRequest("runtime excludes cgroup and in_place: the runtime enforces its container's cgroup",
                         details={"field": "runtime"})
    if req.shared:
        raise BadRequest("runtime: a shared container is not booked, it runs on the shared pool",
                         details={"field": "shared"})
    if (what := empty_runtime_id(req.runtime)) is not None:
        raise BadRequest(f"runtime.{what} is empty", details={"field": f"runtime.{what}"})


def _isolate(req: AdmitRequest) -> list[str] | None:
    """The isolation kinds asked for, in their one order; only with exclusive CPUs."""
    if req.isolate is None:
        if req.isolate_strict:
            raise BadRequest("isolate_strict needs isolate", details={"field": "isolate_strict"})
        return None
    try:
        kinds = list(parse_kinds(req.isolate))
    except IsolateSyntaxError as exc:
        raise BadRequest(f"isolate: {exc}", details={"field": "isolate"}) from None
    if kinds and (req.shared or (not req.cpus and req.physcpubind is None)):
        raise BadRequest("isolate needs exclusive CPUs (cpus or physcpubind), not the shared pool",
                         details={"field": "isolate"})
    return kinds


def parse_cpu_list(text: str, field: str) -> CpuSet:
    """Parse a kernel-syntax CPU list with ids bounded by MAX_CPU_ID."""
    if len(text) > MAX_CPU_LIST_CHARS or _CPU_LIST_CHARS_RE.fullmatch(text) is None:
        raise BadRequest(f"{field} {_shown(text)} is not a CPU list like '0-3,8'",
                         details={"field": field})
    for number in re.findall(r"[0-9]+", text):
        if len(number) > 5 or int(number) > MAX_CPU_ID:
            raise BadRequest(f"{field}: CPU id {number[:12]} is above {MAX_CPU_ID}",
                             details={"field": field})
    try:
        cpus = CpuSet.parse(text)
    except CpuSetParseError as exc:
        raise BadRequest(f"{field}: {exc}", details={"field": field}) from None
    if not cpus:
        raise BadRequest(f"{field} names no CPU", details={"field": field})
    return cpus


def _nodes(nodes: list[int] | None, field: str) -> list[int] | None:
    if nodes is None:
        return None
    if len(set(nodes)) != len(nodes):
        raise BadRequest(f"{field} lists a NUMA node twice: {nodes}", details={"field": field})
    return sorted(nodes)


def _hugepages(pages: dict[str, int], field: str) -> dict[str, int]:
    for key in pages:
        if _HUGEPAGE_KEY_RE.fullmatch(key) is None:
            raise BadRequest(f"{field}: key {_shown(key)} must be a page size in kB, e.g. \"2048\"",
                             details={"field": field})
    return {key: pages[key] for key in sorted(pages, key=int)}


def _devices(devices: dict[str, int], field: str) -> dict[str, int]:
    for key in devices:
        if not is_resource_name(key):
            raise BadRequest(f"{field}: invalid resource name {_shown(key)}",
                             details={"field": field})
    return {key: devices[key] for key in sorted(devices)}


def _shown(value: object) -> str:
    """A short, printable rendering of client input for error messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
