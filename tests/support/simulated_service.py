"""The service on a simulated cgroup tree, started the way the agent starts
it: restore the checkpoint, then make the tree match."""

from __future__ import annotations

from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs
from numa_agent.service.agent_service import AgentService
from numa_agent.service.recovery import restore
from numa_agent.state.checkpoint import CheckpointStore


def start(machine, state_dir, cg_root, partitions="off", isolation=None, service_options=None,
          observer_of=None, **kw):
    """`service_options`: AgentService's keyword arguments (quotas, owner, ...); `kw`: restore's.
    `observer_of(enforcer, state)`: the observer given to the service, `state()` its state."""
    enforcer = CgroupEnforcer(CgroupV2(cg_root, SimulatedCgroupfs(cg_root)), partitions=partitions)
    store = CheckpointStore(state_dir)
    enforcer.setup()
    state, report = restore(machine, store, enforcer, **kw)
    options = dict(service_options or {})
    if observer_of is not None:
        options["observer"] = observer_of(enforcer, lambda: service.state)
    service = AgentService(machine, store, enforcer, isolation=isolation, **options)
    service.install(state)
    return service, report


def cg_file(root, rel, name):
    return (root / rel / name).read_text().strip()
