"""A fake of the AgentService contract for API and CLI tests.

Two NUMA nodes with 4 CPUs each (CPU 0 reserved), one GPU on node 1. It
admits by taking the lowest free CPUs of a single node, refuses with a
TopologyAffinityError when no single node fits, and records every call so
tests can assert that hostile input never reached it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.service.refusals import InConflict, NotPermitted, TopologyRefused, UnknownWorkload
from numa_agent.service.requests import AdmitRequest

NODE_CPUS = {0: CpuSet.parse("1-3"), 1: CpuSet.parse("4-7")}
GPU = {"resource": "gpu", "address": "0000:3b:00.0", "numa_node": 1, "vendor": "0x10de"}


class FakeService:
    sysfs_root = "/"  # the machine it answers for: this host
    def __init__(self, enforcement: str = "cgroup") -> None:
        self.enforcement = enforcement
        self.calls: list[tuple[str, Any]] = []
        self.callers: list[Caller] = []
        self.viewers: list[int | None] = []  # on whose behalf status and listings were asked
        self.pidfd_was_open: list[bool] = []
        self.workloads: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self._counter = 0
        self.user_names: dict[int, str] = {}  # uid -> name for status; none known by default

    # -- helpers --------------------------------------------------------
    def _record(self, name: str, arg: Any, caller: Caller | None = None) -> None:
        self.calls.append((name, arg))
        if caller is not None:
            self.callers.append(caller)
            self.pidfd_was_open.append(_fd_open(caller.pidfd))

    def _free(self, node: int) -> CpuSet:
        used = CpuSet()
        for wl in self.workloads.values():
            used = used | CpuSet.parse(wl["cpus"])
        return NODE_CPUS[node] - used

    def _explanation(self, request: AdmitRequest, admit: bool, mask: list[int], reason: str) -> dict:
        free = {str(n): {"cpus": len(self._free(n)), "memory_bytes": 8 << 30} for n in NODE_CPUS}
        fits = [n for n in NODE_CPUS if len(self._free(n)) >= request.cpus]
        hints = [f"{{{n}}} preferred" for n in fits] + (["{0,1}"] if request.cpus else [])
        return {"admit": admit,
                "topology": {"policy": request.policy or "single-numa-node", "scope": "container",
                             "verdict": "aligned" if admit else "not-aligned"},
                "providers": [{"provider": "cpu", "resource": "cpu", "hints": hints, "more": 0}],
                "merged": {"mask": mask, "preferred": admit},
                "requested": {"cpus": request.cpus, "memory_bytes": request.memory_bytes,
                              "hugepages": dict(request.hugepages), "devices": dict(request.devices)},
                "free": free, "reason": reason}

    # -- the contract ---------------------------------------------------
    def admit(self, request: AdmitRequest, caller: Caller, dry_run: bool = False) -> dict:
        self._record("admit", (request, dry_run), caller)
        with self.lock:
            self._counter += 1
            name = request.name or f"wl-{self._counter}"
            if name in self.workloads:
                raise InConflict(f"workload name {name!r} is in use")
            want = request.cpus
            node = next((n for n in NODE_CPUS if len(self._free(n)) >= want), None)
            if node is None:
                total = sum(len(self._free(n)) for n in NODE_CPUS)
                reason = (f"TopologyAffinityError: {want} CPUs requested; {total} free, but at most "
                          f"{max(len(self._free(n)) for n in NODE_CPUS)} on one NUMA node")
                raise TopologyRefused(reason,
                                            details=self._explanation(request, False, [0, 1], reason))
            cpus = CpuSet(self._free(node).ids()[:want]) if want else CpuSet()
            devices = [dict(GPU)] if request.devices.get("gpu") else []
            result = {"name": name, "pod": request.pod, "cpus": cpus.format(),
                      # membind decides the memory nodes, as the memory manager does
                      "exclusive": bool(want), "mems": list(request.membind or [node]),
                      "numa_nodes": [node],
                      "memory_bytes": {str(node): request.memory_bytes}, "hugepages": {},
                      "devices": devices,
                      "cgroup": None if self.enforcement == "affinity" else f"/fake/wl-{name}",
                      "enforcement": self.enforcement,
                      "explanation": self._explanation(request, True, [node], "admitted"),
                      "dry_run": dry_run}
            if not dry_run:
                self.workloads[name] = {**result, "owner_uid": caller.uid, "pid": caller.pid,
                                        "created_unix": time.time(),
                                        "command": request.command}
            return result

    def release(self, name: str, caller: Caller) -> dict:
        self._record("release", name, caller)
        with self.lock:
            wl = self.workloads.get(name)
            if wl is None:
                raise UnknownWorkload(f"no workload named {name!r}")
            if caller.uid != 0 and caller.uid != wl["owner_uid"]:
                raise NotPermitted(f"workload {name!r} belongs to uid {wl['owner_uid']}")
            del self.workloads[name]
            return {"name": name, "released": True, "cpus": wl["cpus"]}

    def resize(self, name: str, caller: Caller, cpus: int | None = None, memory_bytes: int | None = None) -> dict:
        self._record("resize", {"name": name, "cpus": cpus, "memory_bytes": memory_bytes}, caller)
        with self.lock:
            wl = self.workloads.get(name)
            if wl is None:
                raise UnknownWorkload(f"no workload named {name!r}")
            if caller.uid != 0 and caller.uid != wl["owner_uid"]:
                raise NotPermitted(f"workload {name!r} belongs to uid {wl['owner_uid']}")
            most = sum(len(c) for c in NODE_CPUS.values())
            if cpus is not None and cpus > most:
                reason = f"TopologyAffinityError: {cpus} CPUs asked; {most} on the machine"
                asked = AdmitRequest(cpus=cpus)
                raise TopologyRefused(reason, details=self._explanation(asked, False, [0, 1], reason))
            if cpus is not None:
                wl["cpus"] = f"0-{cpus - 1}"
            return {"name": name, "cpus": wl["cpus"], "memory_limit_bytes": memory_bytes}

    def list_workloads(self, viewer_uid: int | None = None) -> list[dict]:
        self._record("list_workloads", None)
        self.viewers.append(viewer_uid)
        return [self._status_entry(wl) for _, wl in sorted(self.workloads.items())]

    def _status_entry(self, wl: dict) -> dict:
        return {"name": wl["name"], "owner_uid": wl["owner_uid"],
                "owner": self.user_names.get(wl["owner_uid"]), "pod": wl["pod"],
                "pid": wl["pid"], "cpus": wl["cpus"], "exclusive": wl["exclusive"],
                "numa_nodes": wl["numa_nodes"], "mems": wl["mems"],
                "memory_bytes": wl["memory_bytes"], "hugepages": {}, "devices": wl["devices"],
                "created_unix": wl["created_unix"], "command": wl["command"],
                "aligned": {"numa_node": True, "physical_core": True, "l3": True}, "lost": []}

    def status(self, viewer_uid: int | None = None, memory: bool = False) -> dict:
        self._record("status", memory or None)
        self.viewers.append(viewer_uid)
        nodes = []
        for n, cpus in NODE_CPUS.items():
            free = len(self._free(n))
            reserved = 1 if n == 0 else 0
            nodes.append({
                "id": n,
                "cpus": {"capacity": 4, "reserved": reserved, "allocated": len(cpus) - free,
                         "free": free},
                "memory_bytes": {"capacity": 16 << 30, "reserved": 1 << 30, "allocated": 0,
                                 "free": 15 << 30},
                "hugepages": {"2048kB": {"capacity": 512, "reserved": 0, "allocated": 0,
                                         "free": 512}},
                "devices": {"gpu": {"capacity": n, "allocated": 0, "free": n}} if n else {},
            })
        return {"enforcement": self.enforcement,
                "policy": {"topology": "single-numa-node", "scope": "container",
                           "cpu": "static", "memory": "static"},
                "shared_pool": "0", "nodes": nodes,
                "workloads": [self._status_entry(wl) for _, wl in sorted(self.workloads.items())],
                "pods": []}

    def topology(self) -> dict:
        self._record("topology", None)
        return {"numa_nodes": [{"id": n, "cpus": c.format()} for n, c in NODE_CPUS.items()],
                "online_cpus": "0-7", "allowed_cpus": None, "allowed_mems": None}

    def health(self) -> dict:
        self._record("health", None)
        return {"status": "ok", "enforcement": self.enforcement, "reason": None,
                "uptime_seconds": 1.0, "sysfs_root": self.sysfs_root}

    def metrics_snapshot(self) -> dict:
        return {"status": self.status(), "counters": {}}

    def service_calls(self) -> list[str]:
        return [name for name, _ in self.calls]


def _fd_open(fd: int | None) -> bool:
    if fd is None:
        return False
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
