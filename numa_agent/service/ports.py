"""What the adapters hold of the service: the HTTP API (api/server.py), the
PodResources server (kubelet/grpc_server.py), the metrics (views/metrics.py)
and any later one (an NRI plugin, say). They name this Protocol, never the
implementation (service/agent_service.py's AgentService, which satisfies it):
tests/test_import_graph.py holds them to it."""

from __future__ import annotations

from typing import Any, Protocol

from numa_agent.admission.machine import Machine
from numa_agent.core.caller import Caller
from numa_agent.service.counters import Counters
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.model import AgentState


class PublishedView(Protocol):
    """The (machine, state) pair as last published, read in one step without
    the service's lock (None before the first state is installed)."""

    def view(self) -> tuple[Machine, AgentState] | None: ...


class AgentApi(PublishedView, Protocol):
    """The service's use cases and read side, as its adapters call them."""

    @property
    def counters(self) -> Counters: ...

    def admit(self, request: AdmitRequest, caller: Caller, dry_run: bool = False) -> dict[str, Any]: ...

    def release(self, name: str, caller: Caller | None, reason: str = "requested",
                request_id: str | None = None) -> dict[str, Any]: ...

    def resize(self, name: str, caller: Caller, cpus: int | None = None,
               memory_bytes: int | None = None) -> dict[str, Any]: ...

    def status(self, viewer_uid: int | None = None, memory: bool = False) -> dict[str, Any]: ...

    def health(self) -> dict[str, Any]: ...

    def topology(self) -> dict[str, Any]: ...

    def list_workloads(self, viewer_uid: int | None = None) -> list[dict[str, Any]]: ...

    def metrics_snapshot(self) -> dict[str, Any]: ...
