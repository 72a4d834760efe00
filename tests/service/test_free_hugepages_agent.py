"""The agent reads the kernel's free hugepages (of its --sysfs-root tree) for an
admission that asks for some, and refuses, naming the node and the shortfall,
when pages the bookings leave free were taken outside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from numa_agent.api import errors
from numa_agent.api.refusals import api_error
from numa_agent.cli.common import refusal_lines
from numa_agent.core.caller import Caller
from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import Agent
from numa_agent.enforcement.plan import workload_relpath
from numa_agent.service.refusals import HugepagesTaken
from numa_agent.service.requests import AdmitRequest
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

ME = Caller(pid=os.getpid(), uid=0, gid=0)
PAGE = 2 << 20


def set_free(root, node, pages):
    (root / f"sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/free_hugepages").write_text(f"{pages}\n")


@pytest.fixture
def machine_root(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=2, threads_per_core=1, memory_per_node_bytes=4 << 30,
                         hugepages_2m_per_node=8)
    return write_sysfs(topo, tmp_path / "machine")


@pytest.fixture
def agent(machine_root, tmp_path):
    cfg = AgentConfig(sysfs_root=str(machine_root), state_dir=str(tmp_path / "state"),
                      socket=str(tmp_path / "agent.sock"), metrics_address=None, hotplug=False,
                      pod_resources_socket="")
    running = Agent(cfg).start()
    yield running
    running.stop()


def test_pages_taken_outside_the_agent_refuse_naming_node_and_shortfall(agent, machine_root):
    service = agent.service
    set_free(machine_root, 0, 2)
    set_free(machine_root, 1, 1)
    with pytest.raises(HugepagesTaken) as refused:
        service.admit(AdmitRequest(name="db", hugepages={"2048": 4}), ME)
    assert refused.value.message.startswith("node 0: 2 free 2 MiB hugepages, 4 requested; 2 more needed")
    details = refused.value.details
    assert details["reason_code"] == "hugepages_not_free"
    assert details["hugepages_short"] == [{"node": 0, "page_size_bytes": PAGE, "free_pages": 2,
                                           "requested_pages": 4, "missing_pages": 2}]
    assert service.counters.errors["hugepages_not_free"] == 1
    assert service.counters.pinning_errors["memory"] == 1  # the memory manager's refusal
    answer = api_error(refused.value)
    assert (type(answer), answer.status) == (errors.AdmissionRefused, 409)

    # numa-agent explain (a dry run) gives the same reason first, then the reasoning.
    with pytest.raises(HugepagesTaken) as explained:
        service.admit(AdmitRequest(name="db", hugepages={"2048": 4}), ME, dry_run=True)
    lines = refusal_lines("would refuse", api_error(explained.value).to_dict()["error"])
    assert lines[0].startswith("would refuse: node 0: 2 free 2 MiB hugepages, 4 requested; 2 more needed")

    # The pages come back on node 1: the same request is placed there.
    set_free(machine_root, 1, 8)
    placed = service.admit(AdmitRequest(name="db", hugepages={"2048": 4}), ME, dry_run=True)
    assert (placed["mems"], placed["hugepages"]) == ([1], {"2048kB": {"1": 4 * PAGE}})


def test_a_request_without_hugepages_reads_no_counter(agent):
    service = agent.service
    asked = []
    read = service.hugepage_counters

    def spy(pools):
        asked.append(pools)
        return read(pools)

    service.hugepage_counters = spy
    service.admit(AdmitRequest(name="plain", cpus=1), ME, dry_run=True)
    assert asked == []
    service.admit(AdmitRequest(name="paged", hugepages={"2048": 1}), ME, dry_run=True)
    assert asked == [((0, 2048), (1, 2048))]


def test_pages_a_workload_has_faulted_in_are_not_held_back_twice(agent, machine_root):
    service = agent.service
    first = service.admit(AdmitRequest(name="first", hugepages={"2048": 4}), ME)
    (node,) = first["mems"]
    other = 1 - node
    # first has faulted its 4 pages in: gone from the kernel's free count. An outsider
    # took every page of the other node.
    set_free(machine_root, node, 4)
    set_free(machine_root, other, 0)
    ask = AdmitRequest(name="second", hugepages={"2048": 4})
    with pytest.raises(HugepagesTaken):  # not known in use: held back as still to come out of free
        service.admit(ask, ME, dry_run=True)
    cgroup = service.enforcer.path_of(workload_relpath(service.state.workload("first")))
    (Path(cgroup) / "hugetlb.2MB.numa_stat").write_text(f"total={4 * PAGE} N{node}={4 * PAGE} N{other}=0\n")
    placed = service.admit(ask, ME, dry_run=True)
    assert placed["hugepages"] == {"2048kB": {str(node): 4 * PAGE}}


def test_in_use_counts_no_more_than_was_booked_and_nothing_unreadable(tmp_path):
    from numa_agent.service.hugepage_counters import booked_in_use
    from numa_agent.state.model import AgentState, Booking, Workload

    def workload(name, memory):
        return Workload(name=name, owner_uid=0, booking=Booking(memory=memory), shared=True)

    state = (AgentState()
             .with_workload(workload("a", {0: {"hugepages-2048kB": 2 * PAGE}, 1: {"hugepages-2048kB": 2 * PAGE}}))
             .with_workload(workload("b", {0: {"hugepages-2048kB": 4 * PAGE}})))
    (tmp_path / "a").mkdir()
    # a faulted 3 pages on node 0 (one more than it booked there) and none on node 1.
    (tmp_path / "a/hugetlb.2MB.numa_stat").write_text(f"total={3 * PAGE} N0={3 * PAGE} N1=0\n")
    paths = {"shared/a": str(tmp_path / "a"), "shared/b": str(tmp_path / "b")}  # b's file is missing
    assert booked_in_use(state, paths.get, (2048,)) == (
        (0, 2048, 2 * PAGE),)
    assert booked_in_use(state, lambda rel: None, (2048,)) == ()


def _hugepage_holder(name, pages=0, pod=None, kind="workload"):
    from numa_agent.state.model import Booking, Pod, Workload
    booking = Booking(memory={0: {"hugepages-2048kB": pages * PAGE}} if pages else {0: {"memory": 1 << 20}})
    if kind == "pod":
        return Pod(name=name, owner_uid=0, booking=booking)
    return Workload(name=name, owner_uid=0, booking=booking, shared=True, pod=pod)


def test_the_holders_of_hugepages_follow_admissions_and_releases():
    """The index of the top-level holders of hugepages, followed from state to
    state, is the one a fresh look at every holder gives."""
    from numa_agent.service.hugepage_counters import hugepage_holders
    from numa_agent.state.model import AgentState

    def fresh(state):
        return hugepage_holders(AgentState(workloads=state.workloads, pods=state.pods))

    state = AgentState()
    for i in range(20):
        state = state.with_workload(_hugepage_holder(f"w{i:02d}", pages=i % 3))
    assert set(hugepage_holders(state)) == {f"shared/w{i:02d}" for i in range(20) if i % 3}
    steps = [lambda s: s.without_workload("w01"),                        # a holder released
             lambda s: s.with_workload(_hugepage_holder("w02", pages=0)),  # resized: none any more
             lambda s: s.with_workload(_hugepage_holder("w03", pages=2)),  # resized: some now
             lambda s: s.with_pod(_hugepage_holder("p", pages=4, kind="pod")),
             lambda s: s.with_workload(_hugepage_holder("m", pod="p")),   # out of its pod's budget
             lambda s: s.without_workload("m").without_pod("p"),
             lambda s: s.without_workload("w00")]                          # holds none: nothing changes
    for step in steps:
        state = step(state)
        assert dict(hugepage_holders(state)) == dict(fresh(state))
    assert "pod-p" not in hugepage_holders(state) and "shared/w03" in hugepage_holders(state)


def test_a_hugepage_admission_does_not_walk_every_live_workload(tmp_path, monkeypatch):
    """Once known, the holders of hugepages follow each change: the pages in use
    of the next state are found without a look at the workloads that hold none."""
    from numa_agent.service.hugepage_counters import booked_in_use
    from numa_agent.state.model import AgentState

    state = AgentState()
    for i in range(200):
        state = state.with_workload(_hugepage_holder(f"w{i:03d}"))
    state = state.with_workload(_hugepage_holder("big", pages=4))
    (tmp_path / "big").mkdir()
    (tmp_path / "big/hugetlb.2MB.numa_stat").write_text(f"total={2 * PAGE} N0={2 * PAGE}\n")
    paths = {"shared/big": str(tmp_path / "big")}
    assert booked_in_use(state, paths.get, (2048,)) == ((0, 2048, 2 * PAGE),)
    walked = []
    real = AgentState.top_level_holders
    monkeypatch.setattr(AgentState, "top_level_holders", lambda self: walked.append(self) or real(self))
    state = state.with_workload(_hugepage_holder("next", pages=2))  # admitted
    assert booked_in_use(state, paths.get, (2048,)) == ((0, 2048, 2 * PAGE),)
    assert walked == []
