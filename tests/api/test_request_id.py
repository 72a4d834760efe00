"""A repeated admission request id books once: across retries, across an
agent restart with a real checkpoint, and never for another user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.api.client import new_request_id
from numa_agent.api.refusals import api_error
from numa_agent.api.validation import parse_admit_request
from numa_agent.core.caller import Caller
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.service.refusals import RequestIdTaken
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.support import simulated_service
from tests.support.agent_process import AgentProcess
from tests.support.synthetic import make_topology

REPO = Path(__file__).resolve().parents[2]
ME = Caller(pid=os.getpid(), uid=1000, gid=1000)


_started: list = []


def start(*args, **kw):
    """simulated_service.start, remembered so the enforcer's inotify instance
    is closed after the test (the kernel allows 128 per user)."""
    service, report = simulated_service.start(*args, **kw)
    _started.append(service)
    return service, report


@pytest.fixture
def env(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    machine = build_machine(topo, PolicyConfig(topology_policy="best-effort"))
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    yield machine, tmp_path / "state", cg_root
    while _started:
        _started.pop().enforcer.close()


@pytest.mark.parametrize("bad", ["", "abc", "A" * 32, "g" * 32, "a" * 65, "a" * 31])
def test_request_id_must_be_128_bit_hex_or_more(bad):
    from numa_agent.api.errors import BadRequest
    with pytest.raises(BadRequest, match="request_id"):
        parse_admit_request(json.dumps({"cpus": 1, "request_id": bad}).encode())


def test_repeated_request_id_returns_the_admission_not_a_second_booking(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    rid = new_request_id()
    first = service.admit(AdmitRequest(cpus=2, request_id=rid, command=["app"]), ME)
    again = service.admit(AdmitRequest(cpus=2, request_id=rid, command=["app"]), ME)
    assert "replayed" not in first and again["replayed"] is True
    assert again["name"] == first["name"] and again["cpus"] == first["cpus"]
    assert [w.name for w in service.state.workloads] == [first["name"]]
    assert service.counters.requests["admitted"] == 1
    # Stored with the workload, in the checkpoint.
    saved = CheckpointStore(state_dir).load()
    assert [w["request"]["request_id"] for w in saved["workloads"]] == [rid]


def test_repeated_request_id_with_a_name_is_not_a_name_conflict(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    rid = new_request_id()
    service.admit(AdmitRequest(name="web", cpus=1, request_id=rid), ME)
    assert service.admit(AdmitRequest(name="web", cpus=1, request_id=rid), ME)["replayed"] is True


def test_request_id_of_another_user_or_process_is_409(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    rid = new_request_id()
    service.admit(AdmitRequest(cpus=1, request_id=rid), ME)
    for other in (Caller(pid=os.getpid(), uid=1001, gid=1001), Caller(pid=1, uid=1000, gid=1000),
                  Caller(pid=os.getpid(), uid=0, gid=0)):
        with pytest.raises(RequestIdTaken) as info:
            service.admit(AdmitRequest(cpus=1, request_id=rid), other)
        assert api_error(info.value).status == 409 and api_error(info.value).code == "request_id_in_use"
    assert len(service.state.workloads) == 1


def test_after_release_the_id_is_forgotten_and_dry_runs_ignore_it(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    rid = new_request_id()
    dry = service.admit(AdmitRequest(cpus=1, request_id=rid), ME, dry_run=True)
    assert dry["dry_run"] is True and service.state.workloads == ()
    first = service.admit(AdmitRequest(cpus=1, request_id=rid), ME)
    service.release(first["name"], ME)
    assert service._request_index() == {}
    fresh = service.admit(AdmitRequest(cpus=1, request_id=rid), ME)
    assert "replayed" not in fresh


def test_repeated_request_id_after_a_restart_from_the_checkpoint(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    rid = new_request_id()
    first = service.admit(AdmitRequest(cpus=2, request_id=rid), ME)
    restarted, _ = start(machine, state_dir, root)  # a new agent on the same state and tree
    again = restarted.admit(AdmitRequest(cpus=2, request_id=rid), ME)
    assert again["replayed"] is True and again["cpus"] == first["cpus"]
    assert len(restarted.state.workloads) == 1
    # The process is (again) in its workload's cgroup: the agent may have died before moving it.
    procs = (root / f"wl-{first['name']}" / "cgroup.procs").read_text().split()
    assert str(os.getpid()) in procs


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: one reserved, one to hand out")
def test_same_request_id_across_a_real_agent_restart_books_once(tmp_path):
    """One client process admits, the agent is stopped and started again from
    its checkpoint, the client repeats the same request id: one booking."""
    agent = AgentProcess(tmp_path / "agent", "--cgroup-root", "none").start()
    client = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(REPO)!r})
        from numa_agent.api.client import request
        body = {{"cpus": 1, "name": "idem", "request_id": "{new_request_id()}"}}
        for _ in range(2):
            print(json.dumps(request({agent.socket!r}, "POST", "/v1/workloads", body)), flush=True)
            sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None and client.stdin is not None
        status, first = json.loads(client.stdout.readline())
        assert status == 201, first
        agent.stop()
        agent = AgentProcess(tmp_path / "agent", "--cgroup-root", "none").start()
        client.stdin.write("\n")
        client.stdin.flush()
        status, again = json.loads(client.stdout.readline())
        assert status == 201 and again["replayed"] is True, again
        assert again["name"] == "idem" and again["cpus"] == first["cpus"]
        listed = agent.call("GET", "/v1/workloads")[1]["workloads"]
        assert [w["name"] for w in listed] == ["idem"]
        assert listed[0]["pid"] == client.pid
    finally:
        client.kill()
        client.wait()
        agent.stop()
