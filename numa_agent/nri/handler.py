"""The Kubernetes meaning of NRI's calls: `KubernetesHandler`, the `NriHandler`
the plugin session (plugin.py) is given.

What a container gets is kubernetes.py's rule; this module asks the service
for it through `AgentApi` (service/ports.py), as root and the agent's own pid:

- CreateContainer: an exclusive container is admitted (`AdmitRequest` with
  `runtime=RuntimeRef(...)`: the agent books, the runtime enforces), named
  `ctr-<id12>` with the request id derived from its id, so a retried call
  replays the booking. Its adjustment is the answer's `cpus` and `mems`.
  A shared container's adjustment is the shared pool's CPUs (its `mems` left
  as the runtime has them). Whenever the pool differs from the one the shared
  containers were last given, the answer carries an update for each of them.
  A refusal fails the creation with one line, the kubelet's reason first.
  A container created again (the runtime retried) is answered as before
  when it is the same kind in the same pod, and refused otherwise: it keeps
  what it had.
- UpdateContainer (the kubelet's in-place resize): an exclusive container's
  new whole CPU count or memory limit is a resize, answered with its new
  cpuset; a resize that would leave it no whole CPUs is refused (the kubelet
  does not take exclusive CPUs back in place either). A shared container
  follows the pool. One already at its new size whose cpuset is not the
  booked one (the resize's answer was lost) is given its booked cpuset.
- StopContainer and a container's removal release its booking (only the one
  this container's id made; one already gone is fine); a pod sandbox's
  removal releases what its containers still hold, and with the last member
  the pod's budget. The pool that grows is given to the shared containers in
  the stop's answer; a removal's event has no answer, so they get it in the
  next answer that can carry updates.
- Synchronize (at every registration: the agent or the runtime restarted):
  a runtime booking whose container is gone (or stopped) is released; one
  whose container runs keeps its CPUs (its cpuset written again if the
  runtime's differs); a container that qualifies for exclusive CPUs but has no
  booking was created while the agent was down, and is booked now (refused:
  it stays on the shared pool, in a log line); every shared container gets the
  pool. Nothing is booked twice: a booking is found by the container's name
  and id before anything is admitted.

Pod scope (`[topology] scope = "pod"`, read from the published machine):
when the runtime gives the pod's totals (`linux.pod_resources`) in whole CPUs,
the first exclusive container books the pod's budget (`sbx-<sandbox id12>`)
and every exclusive container of the pod takes from it; otherwise (or when
another sandbox whose id shares those 12 hex digits holds that budget) each
container is booked alone, as under container scope.

The shared pool is `admission/view.py`'s `shared_pool` of the published state.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from numa_agent.admission.machine import Machine
from numa_agent.admission.view import shared_pool
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.engines.annotations import AnnotationError
from numa_agent.nri import kubernetes as k8s
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri.plugin import NriRefusal
from numa_agent.service.ports import AgentApi
from numa_agent.service.refusals import ServiceRefusal, UnknownWorkload
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.model import AgentState, Workload
from numa_agent.state.runtime_pods import runtime_pods

log = logging.getLogger("numa_agent.nri")

_SHORT = 256  # RuntimeRef's ShortStr: what only names the container for people is cut to fit
_GONE = frozenset({api.CONTAINER_STOPPED})  # a container in this state holds nothing


class KubernetesHandler:
    """What a Kubernetes node's runtime calls mean to the agent (module docstring).
    Called from one thread, in the runtime's order (plugin.py)."""

    def __init__(self, api: AgentApi, *, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.clock = clock
        self.caller = Caller(pid=os.getpid(), uid=0, gid=0)
        self._shared: dict[str, str] = {}  # container on the shared pool -> its sandbox id
        self._pool: str | None = None  # the pool the shared containers were last given
        self.pool_changed_unix: float | None = None

    # ------------------------------------------------------------ the runtime's calls
    def create_container(self, request: Any) -> Any:
        pod, ctr = request.pod, request.container
        what = k8s.describe(pod, ctr)
        placement = k8s.classify(pod, ctr)
        body = self._annotations(pod, what)
        if (refusal := k8s.annotation_refusal(body, placement)) is not None:
            line = k8s.refusal_line(what, k8s.UNEXPECTED_ADMISSION_ERROR, refusal)
            log.warning("NRI: %s", line)
            raise NriRefusal(line)
        if notes := k8s.annotation_notes(body, placement):
            log.info("NRI: %s: ignored annotations: %s", what, "; ".join(notes))
        self._check_created_once(pod, ctr, placement, what)
        if not placement.exclusive:
            machine, state = self._view()
            pool = _pool_text(machine, state)
            response = self._following(api.CreateContainerResponse(adjust=k8s.adjustment(pool)), pool)
            self._shared[ctr.id] = pod.id or ctr.pod_sandbox_id
            log.info("NRI: %s runs on the shared pool %s: %s", what, pool or "(empty)", placement.why)
            return response
        answer = self._admit(pod, ctr, placement, body, what)
        machine, state = self._view()
        return self._following(api.CreateContainerResponse(adjust=k8s.adjustment(answer["cpus"], _mems(answer))),
                               _pool_text(machine, state))

    def update_container(self, request: Any) -> Any:
        pod, ctr = request.pod, request.container
        what = k8s.describe(pod, ctr)
        machine, state = self._view()
        w = _booking(state, ctr.id)
        if w is None:
            if ctr.id not in self._shared:
                log.warning("NRI: UpdateContainer for %s, which numa-agent neither booked nor placed: "
                            "left as the runtime has it", what)
            return self._following(api.UpdateContainerResponse(), _pool_text(machine, state))
        placement = k8s.classify(pod, ctr, k8s.updated_resources(ctr.linux.resources, request.linux_resources))
        if not placement.exclusive:
            line = k8s.refusal_line(what, k8s.UNEXPECTED_ADMISSION_ERROR, (
                f"it holds exclusive CPUs {w.booking.cpus.format()}, and the resize would make it "
                f"{placement.why}; exclusive CPUs are not given back in place: create the container again"))
            log.warning("NRI: %s", line)
            raise NriRefusal(line)
        cpus = placement.cpus if placement.cpus != len(w.booking.cpus) else None
        asked = placement.memory_bytes  # none (no limit now): the booking's memory stays
        memory = asked if asked and asked != int(w.request.get("memory_bytes") or 0) else None
        if cpus is None and memory is None:
            response = api.UpdateContainerResponse()
            booked, has = w.booking.cpus.format(), ctr.linux.resources.cpu.cpus
            if has and not _same_cpus(has, booked):  # an earlier answer was lost: its cpuset again
                response.update.append(k8s.update(ctr.id, booked, k8s.mems_text(w.booking.mems)))
            return self._following(response, _pool_text(machine, state))
        try:
            answer = self.api.resize(w.name, self.caller, cpus=cpus, memory_bytes=memory)
        except ServiceRefusal as e:
            line = k8s.service_refusal_line(what, e)
            log.warning("NRI: resize: %s", line)
            raise NriRefusal(line) from None
        machine, state = self._view()
        response = api.UpdateContainerResponse(update=[k8s.update(ctr.id, answer["cpus"], _mems(answer))])
        return self._following(response, _pool_text(machine, state))

    def stop_container(self, request: Any) -> Any:
        ctr = request.container
        what = k8s.describe(request.pod, ctr)
        released = self._release(ctr.id, "container stopped", what)
        if self._shared.pop(ctr.id, None) is None and not released:
            log.info("NRI: StopContainer for %s, which holds nothing of numa-agent's", what)
        machine, state = self._view()
        return self._following(api.StopContainerResponse(), _pool_text(machine, state))

    def state_change(self, event: Any) -> None:
        if event.event == api.REMOVE_CONTAINER and event.HasField("container"):
            self._release(event.container.id, "container removed", k8s.describe(event.pod, event.container))
            self._shared.pop(event.container.id, None)
        elif event.event == api.REMOVE_POD_SANDBOX and event.HasField("pod"):
            self._remove_pod(event.pod)

    def synchronize(self, pods: Sequence[Any], containers: Sequence[Any]) -> Sequence[Any]:
        alive = {c.id: c for c in containers if c.state not in _GONE}
        by_id = {p.id: p for p in pods}
        _, state = self._view()
        for w in _runtime_workloads(state, runtime_pods(state).sandboxes.values()):
            if w.runtime.container_id not in alive:
                self._release(w.runtime.container_id, "container gone (synchronize)", w.name)
        answer = api.SynchronizeResponse()
        updates = answer.update
        self._shared.clear()
        kept = booked = 0
        for c in alive.values():
            pod = by_id.get(c.pod_sandbox_id) or api.PodSandbox(id=c.pod_sandbox_id)
            placed = self._synchronized(pod, c)
            if placed is None:
                self._shared[c.id] = c.pod_sandbox_id
                continue
            kept, booked = (kept + 1, booked) if placed[0] else (kept, booked + 1)
            if not _same_cpus(c.linux.resources.cpu.cpus, placed[1]):
                updates.append(k8s.update(c.id, placed[1], placed[2]))
        machine, state = self._view()
        self._pool = pool = _pool_text(machine, state)
        self.pool_changed_unix = self.clock()
        k8s.add_pool_updates(updates, [cid for cid in self._shared
                                       if not _same_cpus(alive[cid].linux.resources.cpu.cpus, pool)], pool)
        log.info("NRI: synchronized %d containers: %d keep their bookings, %d booked now, %d on the shared "
                 "pool %s; %d updates", len(alive), kept, booked, len(self._shared), pool or "(empty)", len(updates))
        return updates

    def answer_lost(self, method: str) -> None:
        """An answer of ours the runtime never got may have carried the pool to the
        shared containers: the next answer that can carry updates gives it to all."""
        log.info("NRI: the answer to %s was lost: the shared containers get the pool again", method)
        self._pool = None

    # ------------------------------------------------------------ the parts
    def _check_created_once(self, pod: Any, ctr: Any, placement: k8s.Placement, what: str) -> None:
        """A container created again (a retry) must be what it was: booked in the same
        pod, or shared in the same pod; else NriRefusal, and it keeps what it had (a
        booked one put on the pool's updates too would leave its CPUs for the pool's)."""
        _, state = self._view()
        held = _booking(state, ctr.id)
        sandbox_id = pod.id or ctr.pod_sandbox_id
        if held is not None and held.runtime is not None:
            if placement.exclusive and held.runtime.sandbox_id == sandbox_id:
                return  # the admission replays the booking
            had = f"holds exclusive CPUs {held.booking.cpus.format()} in pod sandbox {held.runtime.sandbox_id[:12]}"
        elif ctr.id in self._shared:
            if not placement.exclusive and self._shared[ctr.id] == sandbox_id:
                return
            had = f"runs on the shared pool in pod sandbox {self._shared[ctr.id][:12]}"
        else:
            return
        line = k8s.refusal_line(what, k8s.UNEXPECTED_ADMISSION_ERROR, (
            f"the container was already created and {had}; created again as {placement.why} in pod sandbox "
            f"{sandbox_id[:12]}, it is refused"))
        log.warning("NRI: %s", line)
        raise NriRefusal(line)

    def _synchronized(self, pod: Any, c: Any) -> tuple[bool, str, str] | None:
        """(kept: True, booked now: False; cpus; mems) for a container with exclusive
        CPUs after synchronizing; None for one on the shared pool."""
        _, state = self._view()
        w = _booking(state, c.id)
        if w is not None:
            return True, w.booking.cpus.format(), k8s.mems_text(w.booking.mems)
        placement = k8s.classify(pod, c)
        if not placement.exclusive:
            return None
        what = k8s.describe(pod, c)
        try:
            answer = self._admit(pod, c, placement, self._annotations(pod, what), what)
        except NriRefusal as e:
            log.warning("NRI: %s, created while numa-agent was away, stays on the shared pool: %s", what, e)
            return None
        log.info("NRI: %s, created while numa-agent was away, booked: cpus %s", what, answer["cpus"])
        return False, answer["cpus"], _mems(answer)

    def _annotations(self, pod: Any, what: str) -> dict[str, Any]:
        try:
            return k8s.annotations_of(pod)
        except AnnotationError as e:
            line = k8s.refusal_line(what, k8s.UNEXPECTED_ADMISSION_ERROR, str(e))
            log.warning("NRI: %s", line)
            raise NriRefusal(line) from None

    def _admit(self, pod: Any, ctr: Any, placement: k8s.Placement, body: dict[str, Any], what: str) -> dict:
        sandbox_id = pod.id or ctr.pod_sandbox_id
        fields: dict[str, Any] = {
            "name": k8s.workload_name(ctr.id), "request_id": k8s.request_id(ctr.id), "cpus": placement.cpus,
            "memory_bytes": placement.memory_bytes, "hugepages": dict(placement.hugepages),
            **k8s.placement_fields(body),
            "runtime": {"runtime": "nri", "container_id": ctr.id, "sandbox_id": sandbox_id,
                        "namespace": pod.namespace[:_SHORT], "pod": pod.name[:_SHORT],
                        "pod_uid": pod.uid[:_SHORT], "container": ctr.name[:_SHORT]}}
        machine, state = self._view()
        held = state.workload(fields["name"])
        if held is not None and (held.runtime is None or held.runtime.container_id != ctr.id):
            whose = "another container" if held.runtime is not None else "a workload the agent enforces"
            line = k8s.refusal_line(what, k8s.UNEXPECTED_ADMISSION_ERROR, (
                f"its booking's name {held.name} (from the container id's first 12 hex digits) is held by "
                f"{whose}; a container created again gets a new id"))
            log.warning("NRI: %s", line)
            raise NriRefusal(line)
        if machine.policy.topology_scope == "pod" and (budget := k8s.pod_budget(pod)) is not None:
            name = k8s.pod_name(sandbox_id)
            budget_held = state.pod(name)
            if budget_held is None:
                fields.update(pod=name, pod_budget=budget)
            elif all(m.runtime is not None and m.runtime.sandbox_id == sandbox_id for m in state.members_of(name)):
                fields["pod"] = name
            else:  # another sandbox's budget under the same 12 hex digits: never taken from
                log.warning("NRI: %s: pod budget %s belongs to another pod sandbox; booked alone", what, name)
        try:
            req = msgspec.convert(fields, AdmitRequest)
        except msgspec.ValidationError as e:  # a field past its bound (an id too long for a request)
            line = k8s.refusal_line(what, k8s.UNEXPECTED_ADMISSION_ERROR, f"cannot ask the agent: {e}")
            log.error("NRI: %s", line)
            raise NriRefusal(line) from None
        try:
            answer = self.api.admit(req, self.caller)
        except ServiceRefusal as e:
            line = k8s.service_refusal_line(what, e)
            log.warning("NRI: %s", line)
            raise NriRefusal(line) from None
        log.info("NRI: %s: %s: cpus %s mems %s", what, placement.why, answer["cpus"], _mems(answer) or "-")
        return answer

    def _release(self, container_id: str, reason: str, what: str) -> bool:
        """Release the booking `container_id` made, if there is one: True when released."""
        _, state = self._view()
        w = _booking(state, container_id)
        if w is None:
            return False
        try:
            self.api.release(w.name, None, reason=reason, request_id=k8s.request_id(container_id))
        except UnknownWorkload:
            return False  # gone meanwhile: fine
        except ServiceRefusal as e:
            log.warning("NRI: cannot release %s (%s): %s", what, reason, e.message)
            return False
        return True

    def _remove_pod(self, pod: Any) -> None:
        _, state = self._view()
        for w in _runtime_workloads(state, [runtime_pods(state).sandboxes.get(pod.id) or ()]):
            self._release(w.runtime.container_id, "pod sandbox removed", w.name)
        for cid in [cid for cid, sandbox in self._shared.items() if sandbox == pod.id]:
            del self._shared[cid]

    def _following(self, response: Any, pool: str) -> Any:
        """`response` with the shared containers' updates when `pool` is not the one
        they were last given."""
        if pool != self._pool:
            self._pool, self.pool_changed_unix = pool, self.clock()
            if self._shared:
                log.info("NRI: the shared pool is now %s: %d containers follow", pool or "(empty)", len(self._shared))
            k8s.add_pool_updates(response.update, self._shared, pool)
        return response

    def _view(self) -> tuple[Machine, AgentState]:
        view = self.api.view()
        if view is None:
            raise NriRefusal(f"{k8s.UNEXPECTED_ADMISSION_ERROR}: numa-agent is starting and has no state yet")
        return view


def _booking(state: AgentState, container_id: str) -> Workload | None:
    """The runtime booking `container_id` made: its name's workload, made for this id."""
    w = state.workload(k8s.workload_name(container_id))
    if w is None:
        return None
    ref = w.runtime
    return w if ref is not None and ref.container_id == container_id else None


def _runtime_workloads(state: AgentState, groups: Iterable[Sequence[str]]) -> list[Any]:
    """The runtime bookings named in `groups` (the runtime-pod index's values)."""
    return [w for names in groups for name in names
            if (w := state.workload(name)) is not None and w.runtime is not None]


def _pool_text(machine: Machine, state: AgentState) -> str:
    return shared_pool(machine, state).format()


def _mems(answer: dict) -> str:
    return k8s.mems_text(answer.get("mems") or [])


def _same_cpus(text: str, cpus: str) -> bool:
    try:
        return CpuSet.parse(text) == CpuSet.parse(cpus)
    except CpuSetParseError:
        return False
