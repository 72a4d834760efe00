"""The kubelet-shaped state documents and the PodResources List answer:
kept per pod and rebuilt for what changed, they always equal what is built
afresh; the kubelet guide's
arithmetic holds; the checksum tells a whole file from a damaged one; the
writer replaces each file whole."""

from __future__ import annotations

import json
import random

import pytest

from numa_agent.admission.admit import decide, release
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.request import Request, Resources
from numa_agent.kubelet import podresources_pb2 as pb
from numa_agent.kubelet.files import StateFiles, StateFilesError
from numa_agent.kubelet.pod_resources import ListEncoder
from numa_agent.kubelet.state_files import StateDocuments, checksum_ok, documents, kubelet_resource
from numa_agent.state.model import AgentState
from tests.support.pod_resources import list_response
from tests.support.synthetic import make_topology

GPU = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")


def machine():
    topo = make_topology(sockets=2, nodes_per_socket=2, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=4 << 30, hugepages_2m_per_node=64, devices=(GPU,))
    return build_machine(topo, PolicyConfig(devices={"gpu": {"vendor": "0x10de"}}))


def admit(m, state, name, **kwargs):
    pod = kwargs.pop("pod", None)
    budget = kwargs.pop("pod_budget", None)
    shared = kwargs.pop("shared", False)
    req = Request(name=name, owner_uid=0, resources=Resources(**kwargs), shared=shared, pod=pod, pod_budget=budget)
    return decide(m, state, req).state


def test_hugepage_names_are_the_kubelets():
    assert kubelet_resource("hugepages-2048kB") == "hugepages-2Mi"
    assert kubelet_resource("hugepages-1048576kB") == "hugepages-1Gi"
    assert kubelet_resource("hugepages-64kB") == "hugepages-64Ki"
    assert kubelet_resource("memory") == "memory"


def test_kept_documents_and_list_answer_follow_admissions_and_releases_exactly():
    m = machine()
    rng = random.Random(7)
    state = AgentState(policy_fingerprint=m.policy.fingerprint())
    docs = StateDocuments()
    listed = ListEncoder("ns")
    live: list[str] = []
    for step in range(120):
        name = f"w{step}"
        choice = rng.random()
        try:
            if live and choice < 0.35:
                state = release(state, live.pop(rng.randrange(len(live))))[0]
            elif choice < 0.5:
                pod = f"p{rng.randrange(3)}"
                budget = None if state.pod(pod) else Resources(cpus=4, memory_bytes=256 << 20)
                state = admit(m, state, name, pod=pod, pod_budget=budget, cpus=rng.choice((0, 1)))
                live.append(name)
            else:
                state = admit(m, state, name, cpus=rng.choice((0, 1, 2)), memory_bytes=rng.choice((0, 64 << 20)),
                              hugepages={2048: rng.choice((0, 4))}, devices={"gpu": 1} if rng.random() < 0.1 else {},
                              shared=False)
                live.append(name)
        except Exception as exc:  # a refusal (full machine) changes nothing
            if type(exc).__name__ not in ("Refusal", "InvalidRequest"):
                raise
        assert _parsed(docs.update(m, state)) == _parsed(documents(m, state)), step
        kept = pb.ListPodResourcesResponse.FromString(listed.update(m, state))
        assert sorted(kept.pod_resources, key=lambda p: p.name) == \
            sorted(list_response(m, state, "ns").pod_resources, key=lambda p: p.name), step


def _parsed(docs):
    """The documents' content (entries are kept in the order pods came; JSON objects have none)."""
    out = []
    for d in docs:
        assert checksum_ok(d)
        doc = json.loads(d)
        del doc["checksum"]
        out.append(doc)
    return out


def test_the_guides_arithmetic_holds():
    m = machine()
    state = AgentState(policy_fingerprint=m.policy.fingerprint())
    state = admit(m, state, "big", memory_bytes=6 << 30)  # more than one node: a group of nodes
    state = admit(m, state, "hp", cpus=2, hugepages={2048: 8})
    cpu_doc, mem_doc = (json.loads(d) for d in documents(m, state))
    machine_state = mem_doc["machineState"]
    group = mem_doc["entries"]["big"]["big"][0]["numaAffinity"]
    assert len(group) > 1
    assert all(machine_state[str(n)]["cells"] == group for n in group)
    assert sum(machine_state[str(n)]["memoryMap"]["memory"]["reserved"] for n in group) == 6 << 30
    for entry in machine_state.values():
        for row in entry["memoryMap"].values():
            assert row["reserved"] + row["free"] == row["allocatable"]
    hp_nodes = mem_doc["entries"]["hp"]["hp"][0]["numaAffinity"]
    assert machine_state[str(hp_nodes[0])]["numberOfAssignments"] == 1
    assert set(cpu_doc["entries"]) == {"hp"} and len(cpu_doc["entries"]["hp"]["hp"].split(",")) >= 1


def test_checksum_tells_a_damaged_file():
    m = machine()
    cpu, memory = documents(m, AgentState(policy_fingerprint=m.policy.fingerprint()))
    assert checksum_ok(cpu) and checksum_ok(memory)
    assert isinstance(json.loads(cpu)["checksum"], int)
    assert not checksum_ok(cpu.replace(b'"static"', b'"statix"'))
    assert not checksum_ok(cpu[:-5])


def test_files_are_replaced_whole_and_readable(tmp_path):
    m = machine()
    files = StateFiles(tmp_path / "kubelet")
    files.check()
    state = admit(m, AgentState(policy_fingerprint=m.policy.fingerprint()), "a", cpus=2)
    files.publish(m, state)
    assert files.flush()
    first = (tmp_path / "kubelet" / "cpu_manager_state").stat().st_ino
    files.publish(m, release(state, "a")[0])
    assert files.flush()
    cpu = tmp_path / "kubelet" / "cpu_manager_state"
    assert cpu.stat().st_ino != first  # renamed over, never written in place
    assert cpu.stat().st_mode & 0o777 == 0o644
    assert json.loads(cpu.read_bytes())["entries"] == {}
    assert sorted(p.name for p in (tmp_path / "kubelet").iterdir()) == ["cpu_manager_state", "memory_manager_state"]


def test_a_change_that_leaves_a_document_as_it_was_writes_nothing(tmp_path):
    m = machine()
    files = StateFiles(tmp_path)
    state = admit(m, AgentState(policy_fingerprint=m.policy.fingerprint()), "a", cpus=2)
    files.publish(m, state)
    assert files.flush()
    inodes = {p.name: p.stat().st_ino for p in tmp_path.iterdir()}
    files.publish(m, admit(m, state, "shared", shared=True))  # no exclusive CPUs, no memory: both unchanged
    assert files.flush()
    assert {p.name: p.stat().st_ino for p in tmp_path.iterdir()} == inodes
    files.publish(m, admit(m, state, "mem", shared=True, memory_bytes=1 << 20))  # only the memory document
    assert files.flush()
    after = {p.name: p.stat().st_ino for p in tmp_path.iterdir()}
    assert after["cpu_manager_state"] == inodes["cpu_manager_state"]
    assert after["memory_manager_state"] != inodes["memory_manager_state"]


def test_a_failed_write_is_logged_once_and_made_good_by_the_next_change(tmp_path, caplog):
    import shutil

    m = machine()
    where = tmp_path / "kubelet"
    files = StateFiles(where)
    files.check()
    state = AgentState(policy_fingerprint=m.policy.fingerprint())
    shutil.rmtree(where)  # the directory gone under the agent
    for name in ("a", "b"):
        state = admit(m, state, name, cpus=1)
        files.publish(m, state)
        assert files.flush()
    assert [r.message for r in caplog.records].count(next(r.message for r in caplog.records
                                                         if "cannot write" in r.message)) == 1
    where.mkdir()
    state = admit(m, state, "c", shared=True)  # changes neither document: both written all the same
    files.publish(m, state)
    assert files.flush()
    assert set(json.loads((where / "cpu_manager_state").read_bytes())["entries"]) == {"a", "b"}
    assert (where / "memory_manager_state").exists()
    assert any("written again" in r.message for r in caplog.records)


def test_a_directory_that_cannot_take_files_is_a_startup_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateFilesError, match="kubelet state directory .*file/sub: .*file is not a directory"):
        StateFiles(blocker / "sub").check()


def _published(files, name="a"):
    m = machine()
    state = admit(m, AgentState(policy_fingerprint=m.policy.fingerprint()), name, cpus=1)
    files.publish(m, state)
    assert files.flush()


def test_links_planted_in_the_directory_are_never_written_through(tmp_path):
    """At the files' names and at the temporary names an older agent used
    (`.<name>.<pid>.tmp`): replaced or left, the files they lead to untouched."""
    import os

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    where = tmp_path / "kubelet"
    files = StateFiles(where)
    files.check()
    for name in ("cpu_manager_state", "memory_manager_state"):
        os.symlink(victim, where / name)
        os.symlink(victim, where / f".{name}.{os.getpid()}.tmp")
    _published(files)
    files.close()
    assert victim.read_bytes() == b"precious"
    assert "a" in json.loads((where / "cpu_manager_state").read_bytes())["entries"]


def test_a_directory_swapped_for_a_link_after_start_is_not_followed(tmp_path):
    import os

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = tmp_path / "kubelet"
    files = StateFiles(where)
    files.check()
    os.rename(where, tmp_path / "moved")
    os.symlink(elsewhere, where)
    _published(files)
    files.close()
    assert os.listdir(elsewhere) == []
    assert (tmp_path / "moved" / "cpu_manager_state").exists()


@pytest.mark.parametrize("setup", ["world-writable", "above world-writable", "another owner"])
def test_a_directory_others_can_change_is_refused_at_start(tmp_path, setup):
    import os

    from numa_agent.kubelet.files import StateFilesUntrusted

    if setup == "another owner" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    where = tmp_path / "above" / "kubelet"
    where.mkdir(parents=True)
    if setup == "world-writable":
        os.chmod(where, 0o777)
    elif setup == "above world-writable":
        os.chmod(where.parent, 0o777)
    else:
        os.chown(where, 54321, -1)
    with pytest.raises(StateFilesUntrusted, match="kubelet state directory .*kubelet.* is (writable|owned)"):
        StateFiles(where).check()
    assert os.listdir(where) == []
