"""The NodeResourceTopology object (views/nrt.py): valid against the vendored
CRD's v1alpha2 openAPIV3Schema on every real-machine snapshot, with bookings
and without; its numbers add up per zone; memory-only nodes appear without
cpu; the attributes are the ones the scheduler plugin reads."""

from __future__ import annotations

import copy
import json
import shutil
import socket
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from numa_agent.admission.admit import InvalidRequest, Refusal, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.request import Request, Resources
from numa_agent.api.client import request
from numa_agent.api.server import ApiServer
from numa_agent.cli.export_cmd import to_yaml
from numa_agent.cli.numa_agent import main
from numa_agent.discovery.sysfs import read_topology
from numa_agent.state.model import AgentState
from numa_agent.views.nrt import node_resource_topology, option_attribute, topology_policies
from tests.conftest import SNAPSHOT_NAMES
from tests.support.synthetic import make_topology

CRD = Path(__file__).resolve().parents[1] / "fixtures" / "nrt" / "crd.yaml"
INT64 = (-(1 << 63), (1 << 63) - 1)


def _structural(schema: dict) -> dict:
    """The schema as the API server applies it: fields a schema does not name are
    pruned (so an object holding one would lose it: refused here), unless
    x-kubernetes-preserve-unknown-fields; other x-kubernetes-* keys are the
    server's own (jsonschema ignores unknown keywords); int-or-string is the
    anyOf the CRD spells out."""
    schema = copy.deepcopy(schema)

    def walk(node: dict) -> None:
        if node.get("type") == "object" and "properties" in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        for child in node.get("properties", {}).values():
            walk(child)
        if isinstance(node.get("items"), dict):
            walk(node["items"])

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def validator():
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    checker = jsonschema.FormatChecker()

    @checker.checks("int64")
    def _int64(value) -> bool:
        return not isinstance(value, int) or INT64[0] <= value <= INT64[1]

    schema = _structural(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft4Validator(schema, format_checker=checker)


def _book(machine, state: AgentState) -> AgentState:
    """A few bookings: exclusive CPUs, memory, hugepages of every size the
    machine has, each device resource; what does not fit is left out."""
    asks = [Resources(cpus=2, memory_bytes=256 << 20), Resources(cpus=1), Resources(memory_bytes=1 << 30)]
    asks += [Resources(hugepages={kb: 1}) for kb in sorted(machine.hugepage_sizes_kb)]
    asks += [Resources(devices={name: 1}) for name in machine.devices.names]
    for i, ask in enumerate(asks):
        try:
            state = decide(machine, state, Request(name=f"w{i}", owner_uid=0, resources=ask)).state
        except (Refusal, InvalidRequest):
            pass
    return state


def _zones(obj: dict) -> dict[str, dict[str, dict]]:
    return {z["name"]: {r["name"]: r for r in z["resources"]} for z in obj["zones"]}


@pytest.mark.parametrize("name", SNAPSHOT_NAMES)
def test_every_snapshot_validates_against_the_crd_with_and_without_bookings(snapshot, validator, name):
    machine = build_machine(read_topology(snapshot(name)[0]), PolicyConfig())
    empty = AgentState(policy_fingerprint=machine.policy.fingerprint())
    booked = _book(machine, empty)
    for state in (empty, booked):
        obj = node_resource_topology(machine, state, "worker-1")
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]
        assert errors == []
        assert [z["name"] for z in obj["zones"]] == [f"node-{n}" for n in machine.node_ids]
        assert {z["type"] for z in obj["zones"]} == {"Node"}
    # Without bookings everything allocatable is available.
    for resources in _zones(node_resource_topology(machine, empty, "w")).values():
        assert all(r["available"] == r["allocatable"] for r in resources.values())


def test_a_wrong_object_is_refused_by_the_check(validator):
    """The check can fail: a quantity that is no quantity, a field the CRD does not
    have (the API server would prune it), a resource without `available`."""
    machine = build_machine(make_topology(), PolicyConfig())
    good = node_resource_topology(machine, AgentState(policy_fingerprint=""), "n")
    assert validator.is_valid(good)
    for spoil in (lambda o: o["zones"][0]["resources"][0].update(capacity="lots"),
                  lambda o: o["zones"][0].update(numaId=0),
                  lambda o: o["zones"][0]["resources"][0].pop("available"),
                  lambda o: o["zones"][0]["costs"][0].update(value=1 << 64)):
        bad = copy.deepcopy(good)
        spoil(bad)
        assert not validator.is_valid(bad)


def test_available_is_allocatable_less_what_the_bookings_hold_per_zone():
    gpu = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")
    topo = make_topology(sockets=2, nodes_per_socket=1, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=8 << 30, hugepages_2m_per_node=64, devices=(gpu,))
    reserved = {0: {"memory": 1 << 30}, 1: {"hugepages-2048kB": 8 << 21}}  # 8 pages
    machine = build_machine(topo, PolicyConfig(reserved_cpus="0", reserved_memory=reserved,
                                               topology_policy="single-numa-node",
                                               devices={"gpu": {"vendor": "0x10de"}}))
    state = AgentState(policy_fingerprint=machine.policy.fingerprint())
    before = _zones(node_resource_topology(machine, state, "n"))
    # capacity less the reservations
    assert before["node-0"]["cpu"]["capacity"] == 8 and before["node-0"]["cpu"]["allocatable"] == 7
    assert before["node-1"]["cpu"]["allocatable"] == 8
    mem0 = before["node-0"]["memory"]
    assert mem0["allocatable"] == mem0["capacity"] - (1 << 30)
    hp1 = before["node-1"]["hugepages-2Mi"]
    assert (hp1["capacity"], hp1["allocatable"]) == (64 << 21, 56 << 21)
    assert before["node-1"]["gpu"] == {"name": "gpu", "capacity": 1, "allocatable": 1, "available": 1}

    ask = Resources(cpus=2, memory_bytes=512 << 20, hugepages={2048: 4}, devices={"gpu": 1})
    decision = decide(machine, state, Request(name="a", owner_uid=0, resources=ask))
    state = decision.state
    booking = state.workload("a").booking
    after = _zones(node_resource_topology(machine, state, "n"))
    held = 0
    for zone, resources in after.items():
        node = int(zone.split("-")[1])
        for name, r in resources.items():
            assert r["available"] == r["allocatable"] - (before[zone][name]["available"] - r["available"])
            if name == "cpu":
                booked = len(booking.cpus & machine.cpus_of_nodes((node,)))
                assert r["allocatable"] - r["available"] == booked
                held += booked
            elif name == "memory":
                assert r["allocatable"] - r["available"] == booking.memory.get(node, {}).get("memory", 0)
    assert held == 2
    assert after["node-1"]["gpu"]["available"] == 0  # the GPU is on node 1: single-numa-node put all there
    assert after["node-1"]["hugepages-2Mi"]["available"] == hp1["allocatable"] - (4 << 21)
    assert after["node-0"] == before["node-0"]


def test_memory_only_nodes_have_no_cpu(validator):
    topo = make_topology(sockets=2, cores_per_node=2, cpuless_node_ids=(2, 3))
    machine = build_machine(topo, PolicyConfig())
    obj = node_resource_topology(machine, AgentState(policy_fingerprint=""), "n")
    assert validator.is_valid(obj)
    zones = _zones(obj)
    assert set(zones) == {"node-0", "node-1", "node-2", "node-3"}
    for name in ("node-2", "node-3"):
        assert "cpu" not in zones[name] and zones[name]["memory"]["capacity"] > 0
    assert "cpu" in zones["node-0"]
    costs = {z["name"]: {c["name"]: c["value"] for c in z["costs"]} for z in obj["zones"]}
    assert costs["node-0"]["node-0"] == 10 and costs["node-0"]["node-2"] == machine.distances[0][2]


def test_the_attributes_are_those_the_scheduler_plugin_reads():
    machine = build_machine(make_topology(), PolicyConfig(
        topology_policy="restricted", topology_scope="pod",
        topology_options={"max-allowable-numa-nodes": "16"}))
    obj = node_resource_topology(machine, AgentState(policy_fingerprint=""), "n")
    attrs = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attrs["topologyManagerPolicy"] == "restricted"
    assert attrs["topologyManagerScope"] == "pod"
    assert attrs["topologyManagerMaxNUMANodes"] == "16"
    assert attrs["topologyManagerOptionMaxAllowableNumaNodes"] == "16"
    assert attrs["topologyManagerOptionPreferClosestNumaNodes"] == "true"
    assert obj["topologyPolicies"] == ["RestrictedPodLevel"]
    assert obj["metadata"] == {"name": "n"}
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2" and obj["kind"] == "NodeResourceTopology"


def test_deprecated_policy_names():
    assert topology_policies("single-numa-node", "container") == ["SingleNUMANodeContainerLevel"]
    assert topology_policies("best-effort", "pod") == ["BestEffortPodLevel"]
    assert topology_policies("none", "container") == ["None"]
    assert option_attribute("numa-allocation-strategy") == "topologyManagerOptionNumaAllocationStrategy"


class _ViewOnly:
    """A service that has only what GET /v1/nrt reads: its (machine, state) view."""

    def __init__(self, view) -> None:
        self._view = view

    def view(self):
        return self._view


@pytest.fixture
def served():
    """(machine, booked state, the service, the socket path of an ApiServer serving its view)."""
    machine = build_machine(make_topology(), PolicyConfig())
    state = _book(machine, AgentState(policy_fingerprint=machine.policy.fingerprint()))
    sock_dir = tempfile.mkdtemp(prefix="na-nrt-", dir="/tmp")  # short: a unix socket path
    service = _ViewOnly((machine, state))
    server = ApiServer(service, f"{sock_dir}/agent.sock", request_deadline=1.0, poll_interval=0.02).start()
    try:
        yield machine, state, service, server.socket_path
    finally:
        server.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_get_v1_nrt_serves_the_object_of_the_services_view(validator, served):
    machine, state, service, path = served
    status, body = request(path, "GET", "/v1/nrt")
    assert status == 200
    assert body == node_resource_topology(machine, state, socket.gethostname())
    assert validator.is_valid(body)
    service._view = None  # not started yet: no machine to describe
    status, body = request(path, "GET", "/v1/nrt")
    assert status == 503 and body["error"]["code"] == "unavailable"


def test_export_asks_the_agent_so_available_counts_its_bookings(served, capsys):
    machine, state, _, path = served
    assert main(["export", "nrt", "--socket", path, "--node-name", "worker-7"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == node_resource_topology(machine, state, "worker-7")
    assert any(r["available"] < r["allocatable"] for z in printed["zones"] for r in z["resources"])


def test_export_without_an_agent_is_one_line(capsys):
    assert main(["export", "nrt", "--socket", "/tmp/na-nrt-no-such.sock"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("numa-agent export: error: ")


@pytest.mark.parametrize("name", ["power9-2s-smt4-gpu-numa-nodes", "intel-snb-2s-2numa-pci-nvme-nic"])
def test_export_from_a_machine_in_json_and_yaml_is_the_same_object(snapshot, capsys, validator, name):
    root = str(snapshot(name)[0])
    machine = build_machine(read_topology(root), PolicyConfig())
    expected = node_resource_topology(machine, AgentState(policy_fingerprint=""), "n1")
    for output, parse in (("json", json.loads), ("yaml", yaml.safe_load)):
        assert main(["export", "nrt", "--sysfs-root", root, "--node-name", "n1", "-o", output]) == 0
        assert parse(capsys.readouterr().out) == expected
    assert validator.is_valid(expected)


def test_the_yaml_emitter_keeps_every_value_its_type():
    doc = {"a": "10", "b": 10, "c": ["true", True, None, "x: y", "- z"], "d": [], "e": {}, "f": [{"g": [1]}],
           "h": "quote\" \\ and \u00e9"}
    assert yaml.safe_load(to_yaml(doc)) == doc
