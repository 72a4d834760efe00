"""The service on a simulated cgroup tree, started the way the agent starts
it: restore the checkpoint, then make the tree match."""

from __future__ import annotations

from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs
from numa_agent.service.agent_service import AgentService
from numa_agent.service.recovery import restore
from numa_agent.state.checkpoint import CheckpointStore


def start(machine, state_dir, cg_root, partitions="off", isolation=None, service_options=None, **kw):
    """`service_options`: AgentService's keyword arguments (quotas, owner, ...); `kw`: restore's."""
    enforcer = CgroupEnforcer(CgroupV2(cg_root, SimulatedCgroupfs(cg_root)), partitions=partitions)
    store = CheckpointStore(state_dir)
    enforcer.setup()
    state, report = restore(machine, store, enforcer, **kw)
    service = AgentService(machine, store, enforcer, isolation=isolation, **(service_options or {}))
    service.install(state)
    return service, report


def cg_file(root, rel, name):
    return (root / rel / name).read_text().strip()
