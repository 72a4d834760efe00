"""What the use cases are given: the assembled service's parts as Protocols."""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Protocol

from numa_agent.admission.machine import Machine
from numa_agent.admission.quota import Owner, Quotas
from numa_agent.enforcement.protocol import Enforcer
from numa_agent.service.counters import Counters
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

    def stage(self, new_state: AgentState, released: Workload | None = None) -> Any:
        """Checkpoint and install `new_state` (the lock held: service/commit.py),
        `released` out of the request ids and engine cgroups kept."""

    def apply(self, pending: Any) -> None:
        """The staged change's kernel writes, without the lock."""

    def wait_written(self, relpath: str) -> bool:
        """Wait (the lock not held) for the changes staged so far that write
        `relpath`; False when there was none."""

    def admission_view(self, state: AgentState, w: Workload, explanation: Mapping[str, Any],
                       dry_run: bool) -> dict[str, Any]: ...
