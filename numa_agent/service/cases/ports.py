"""What the use cases are given: the assembled service's parts as Protocols."""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Protocol

from numa_agent.admission.machine import Machine
from numa_agent.admission.quota import Owner, Quotas
from numa_agent.core.caller import Caller
from numa_agent.enforcement.protocol import Enforcer, Layout
from numa_agent.isolation.keeper import IsolationKeeper
from numa_agent.service.counters import Counters
from numa_agent.service.hugepage_counters import CounterReader
from numa_agent.state.model import AgentState, Workload


class CaseParts(Protocol):
    @property
    def machine(self) -> Machine: ...

    @property
    def state(self) -> AgentState: ...

    @property
    def lock(self) -> threading.RLock: ...

    counters: Counters
    quotas: Quotas
    owner: Callable[[int], Owner]
    enforcer: Enforcer
    clock: Callable[[], float]

    def stage(self, new_state: AgentState, released: Workload | None = None, *,
              admitted: Workload | None = None, move: tuple[str, int] | None = None,
              caller: Caller | None = None) -> Any:
        """Checkpoint and install `new_state` (the lock held: service/commit.py),
        `released` out of the request ids and engine cgroups kept, `admitted`
        into them; `move`: (cgroup, pid) the caller's process goes into."""

    def apply(self, pending: Any) -> None:
        """The staged change's kernel writes, without the lock."""

    def wait_written(self, relpath: str) -> bool:
        """Wait (the lock not held) for the changes staged so far that write
        `relpath`; False when there was none."""

    def admission_view(self, state: AgentState, w: Workload, explanation: Mapping[str, Any],
                       dry_run: bool) -> dict[str, Any]: ...


class AdmitParts(CaseParts, Protocol):
    """What admission is given besides: the settings it judges by, the indexes
    kept in step with the state, and the two checks that read the kernel."""
    isolation: IsolationKeeper | None
    isolate_default: tuple[str, ...]
    isolate_gid: int | None
    hugepage_counters: CounterReader | None

    @property
    def layout(self) -> Layout: ...

    def request_index(self) -> Mapping[str, str]:
        """request id -> workload name, of the state that stands."""

    def engine_index(self) -> list[str]:
        """The engine cgroups booked, sorted."""

    def rejoin(self, w: Workload, caller: Caller) -> None:
        """A replayed admission's process put (again) where `w` is enforced."""

    def check_own_cgroup(self, cgroup: str, caller: Caller) -> None:
        """in_place by a caller other than root: `cgroup` is root's and every
        process in it the caller's, or NotPermitted."""
