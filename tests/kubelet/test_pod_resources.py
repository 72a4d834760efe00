"""The kubelet's node-local interfaces served by the real agent on a written
sysfs tree with devices (simulated cgroup tree): PodResources v1 over gRPC,
read with a client generated from the project's .proto, and the
kubelet-shaped state files, both against what `status --json` shows."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest

from numa_agent.kubelet import podresources_pb2 as pb
from numa_agent.kubelet import podresources_pb2_grpc as pb_grpc
from numa_agent.kubelet.state_files import checksum_ok
from tests.support.agent_process import DEVICES_CONFIG, AgentProcess, NumaRuns, machine_with_devices, wait_for

CONFIG = """
[kubelet]
namespace = "node-tools"
""" + DEVICES_CONFIG


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    work = tmp_path_factory.mktemp("podres-agent")
    root = machine_with_devices(work / "machine")
    a = AgentProcess(work, "--sysfs-root", str(root), config=CONFIG).start()
    a.pod_resources = str(work / "pod-resources.sock")  # beside the API socket by default
    yield a
    a.stop()


@pytest.fixture
def stub(agent):
    with grpc.insecure_channel(f"unix:{agent.pod_resources}") as channel:
        yield pb_grpc.PodResourcesListerStub(channel)


@pytest.fixture
def launch(agent):
    runs = NumaRuns(agent)
    yield runs
    runs.stop()
    deadline = time.monotonic() + 10
    while status(agent)["workloads"] and time.monotonic() < deadline:
        time.sleep(0.05)


def status(agent):
    code, body = agent.call("GET", "/v1/status")
    assert code == 200
    return body


def _nodes(topology):
    return [n.ID for n in topology.nodes]


def _seen(container):
    """A container as the gRPC answer shows it, in status's terms."""
    return {"cpus": sorted(container.cpu_ids),
            "memory": sorted((m.memory_type, m.size, tuple(_nodes(m.topology))) for m in container.memory),
            "devices": sorted((d.resource_name, tuple(d.device_ids), tuple(_nodes(d.topology)))
                              for d in container.devices)}


def _expected(workload):
    """A workload of `status --json` in the same terms: its CPUs, its memory and
    each hugepage size as one block over its memory nodes, its devices."""
    from numa_agent.core.cpuset import CpuSet

    memory = []
    if workload["memory_bytes"]:
        memory.append(("memory", sum(workload["memory_bytes"].values()),
                       tuple(sorted(int(n) for n in workload["memory_bytes"]))))
    for size, per_node in workload["hugepages"].items():
        assert size == "2048kB"
        memory.append(("hugepages-2Mi", sum(per_node.values()), tuple(sorted(int(n) for n in per_node))))
    return {"cpus": list(CpuSet.parse(workload["cpus"])),
            "memory": sorted(memory),
            "devices": sorted((d["resource"], (d["address"],), (d["numa_node"],)) for d in workload["devices"])}


def test_list_get_and_allocatable_show_what_status_shows(agent, stub, launch):
    launch("--pod", "trade", "--pod-cpus", "6", "--pod-memory", "1Gi", "--cpus", "4", "--memory", "512Mi",
           "--name", "engine")
    launch("--pod", "trade", "--name", "logger")
    launch("--cpus", "2", "--memory", "256Mi", "--hugepages", "2Mi=16", "--name", "db")
    launch("--cpus", "1", "--device", "gpu=1", "--name", "infer")
    st = status(agent)
    by_name = {w["name"]: w for w in st["workloads"]}
    assert set(by_name) == {"engine", "logger", "db", "infer"}

    listed = stub.List(pb.ListPodResourcesRequest())
    pods = {p.name: p for p in listed.pod_resources}
    assert set(pods) == {"trade", "db", "infer"}
    assert {p.namespace for p in pods.values()} == {"node-tools"}
    assert sorted(c.name for c in pods["trade"].containers) == ["engine", "logger"]
    for p in pods.values():
        for c in p.containers:
            assert _seen(c) == _expected(by_name[c.name]), c.name
    # the things each was asked for are there (not only equal to status)
    infer = _seen(pods["infer"].containers[0])
    assert [d[0] for d in infer["devices"]] == ["gpu"] and infer["devices"][0][2] == (1,)
    assert [m[:2] for m in _seen(pods["db"].containers[0])["memory"]] == [("hugepages-2Mi", 16 * (2 << 20)),
                                                                           ("memory", 256 << 20)]
    engine = _seen(next(c for c in pods["trade"].containers if c.name == "engine"))
    # a member's --memory is a limit inside the pod's budget, booked by the pod, not by it
    assert len(engine["cpus"]) == 4 and engine["memory"] == []
    logger = _seen(next(c for c in pods["trade"].containers if c.name == "logger"))
    assert len(logger["cpus"]) == 2  # the pod's shared part

    # who may connect: the socket's mode and group, the API socket's
    assert os.stat(agent.pod_resources).st_mode & 0o777 == os.stat(agent.socket).st_mode & 0o777 == 0o660

    got = stub.Get(pb.GetPodResourcesRequest(pod_name="trade", pod_namespace="node-tools"))
    assert got.pod_resources == pods["trade"]
    with pytest.raises(grpc.RpcError) as info:
        stub.Get(pb.GetPodResourcesRequest(pod_name="trade", pod_namespace="default"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

    alloc = stub.GetAllocatableResources(pb.AllocatableResourcesRequest())
    capacity = sum(n["cpus"]["capacity"] - n["cpus"]["reserved"] for n in st["nodes"])
    assert len(alloc.cpu_ids) == capacity
    assert sorted((d.resource_name, d.device_ids[0], _nodes(d.topology)[0]) for d in alloc.devices) == \
        [("gpu", "0000:01:00.0", 1), ("nic", "0000:02:00.0", 2)]
    memory = {(m.memory_type, _nodes(m.topology)[0]): m.size for m in alloc.memory}
    for n in st["nodes"]:
        mem = n["memory_bytes"]
        assert memory[("memory", n["id"])] == mem["capacity"] - mem["reserved"]
        hp = n["hugepages"]["2048kB"]
        assert memory[("hugepages-2Mi", n["id"])] == (hp["capacity"] - hp["reserved"]) * (2 << 20)

    _check_state_files(agent, st, pods)
    _check_cli(agent, listed)
    _check_decode_raw(agent, listed)


def _check_cli(agent, listed):
    """`numa-agent pod-resources list` (the API socket's directory names the service's) prints the same answer."""
    from google.protobuf.json_format import MessageToDict

    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "pod-resources", "list",
                          "--socket", agent.socket], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == MessageToDict(listed, preserving_proto_field_name=True,
                                                   always_print_fields_with_no_presence=True)
    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "pod-resources", "get", "nope",
                          "--namespace", "node-tools", "--socket", agent.socket], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 1 and "NOT_FOUND: pod 'nope' not found in namespace 'node-tools'" in out.stderr


def _check_state_files(agent, st, pods):
    """The files in the state directory, as `status --kubelet --json` prints them, agree with List."""
    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--kubelet", "--json",
                          "--socket", agent.socket], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    names = ("cpu_manager_state", "memory_manager_state")

    def files():
        return {name: (agent.state_dir / name).read_bytes() for name in names}

    # the files are written by a thread of their own, just after the change
    assert wait_for(lambda: {n: json.loads(d) for n, d in files().items()} == {n: shown[n] for n in names}, 10)
    assert all(checksum_ok(data) for data in files().values())
    cpu, memory = shown["cpu_manager_state"], shown["memory_manager_state"]
    assert cpu["policyName"] == "static" and cpu["defaultCpuSet"] == st["shared_pool"]
    from numa_agent.core.cpuset import CpuSet
    assert {(p, c): list(CpuSet.parse(v)) for p, cs in cpu["entries"].items() for c, v in cs.items()} == \
        {(p.name, c.name): sorted(c.cpu_ids) for p in pods.values() for c in p.containers}
    assert memory["policyName"] == "Static"
    db = memory["entries"]["db"]["db"]
    assert [(b["type"], b["size"]) for b in db] == [("hugepages-2Mi", 16 * (2 << 20)), ("memory", 256 << 20)]
    assert set(memory["entries"]) == {"db"}  # the pod's memory is its budget's, no member's
    # reserved: what the bookings hold, the pod's budget (1 GiB) with db's 256 MiB
    assert sum(n["memoryMap"]["memory"]["reserved"] for n in memory["machineState"].values()) == (1 << 30) + (256 << 20)
    for node, entry in memory["machineState"].items():
        assert int(node) in entry["cells"]
        if entry["memoryMap"]["memory"]["reserved"]:
            assert entry["numberOfAssignments"] >= 1
    for node in st["nodes"]:
        table = memory["machineState"][str(node["id"])]["memoryMap"]
        for row in table.values():
            assert row["reserved"] + row["free"] == row["allocatable"] == row["total"] - row["systemReserved"]
        assert table["memory"]["free"] == node["memory_bytes"]["free"]
        assert table["hugepages-2Mi"]["free"] == node["hugepages"]["2048kB"]["free"] * (2 << 20)


def _check_decode_raw(agent, listed):
    """protoc --decode_raw (Debian's protobuf-compiler) reads the captured
    answer by field number alone: the layout is the published one whatever
    the project's generated code says."""
    protoc = shutil.which("protoc")
    if protoc is None:
        pytest.skip("protoc not installed (apt-get install protobuf-compiler): --decode_raw check skipped")
    raw = subprocess.run([protoc, "--decode_raw"], input=listed.SerializeToString(), capture_output=True,
                         timeout=30)
    assert raw.returncode == 0, raw.stderr
    text = raw.stdout.decode()
    # response 1 pod_resources { PodResources 1 name, 2 namespace, 3 containers {
    #   ContainerResources 1 name, 2 devices, 3 cpu_ids, 4 memory } }
    pods = _raw_messages(text)
    assert pods and all(key == "1" for key, _ in pods)
    names = set()
    for _, body in pods:
        fields = dict((k, v) for k, v in body if not isinstance(v, list))
        assert fields["2"] == '"node-tools"'
        names.add(fields["1"].strip('"'))
        for key, container in body:
            if key != "3":
                continue
            keys = {k for k, _ in container}
            assert "1" in keys and keys <= {"1", "2", "3", "4"}
            if dict((k, v) for k, v in container if not isinstance(v, list))["1"] == '"infer"':
                devices = [v for k, v in container if k == "2"]
                assert devices and dict(devices[0])["1"] == '"gpu"'
            if any(k == "4" for k, _ in container):
                memory = dict(next(v for k, v in container if k == "4"))
                assert memory["1"].strip('"') in ("memory", "hugepages-2Mi")
    assert names == {"trade", "db", "infer"}


def _raw_messages(text):
    """protoc --decode_raw's text as nested [(field number, value or [...])]."""
    stack = [[]]
    for line in text.splitlines():
        line = line.strip()
        if line.endswith("{"):
            child = []
            stack[-1].append((line[:-1].strip(), child))
            stack.append(child)
        elif line == "}":
            stack.pop()
        elif line:
            key, _, value = line.partition(": ")
            stack[-1].append((key, value))
    return stack[0]


def test_garbage_and_a_client_that_never_finishes_change_nothing(agent, stub, launch):
    launch("--cpus", "1", "--name", "steady")
    before = stub.List(pb.ListPodResourcesRequest())
    idle = socket.socket(socket.AF_UNIX)
    idle.connect(agent.pod_resources)  # connects, says nothing, never leaves
    half = socket.socket(socket.AF_UNIX)
    half.connect(agent.pod_resources)
    half.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the HTTP/2 preface, then nothing more
    for garbage in (b"\x00" * 64, os.urandom(4096), b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(agent.pod_resources)
            s.settimeout(5)
            try:
                s.sendall(garbage)
                s.recv(4096)
            except OSError:
                pass  # reset: as good as closed
    assert stub.List(pb.ListPodResourcesRequest()) == before
    launch("--cpus", "1", "--name", "after")
    assert "after" in {p.name for p in stub.List(pb.ListPodResourcesRequest()).pod_resources}
    assert agent.call("GET", "/v1/health")[0] == 200
    idle.close()
    half.close()


def test_hundred_concurrent_lists_during_a_burst_of_admissions(agent, stub):
    """Lists never wait for admissions nor hold them up: every admission of the
    burst (30 numa-runs at once, each its own process) and every List
    answers, and the HTTP API answers meanwhile."""
    stop = threading.Event()
    answers, errors = [], []

    def lister():
        with grpc.insecure_channel(f"unix:{agent.pod_resources}") as channel:
            client = pb_grpc.PodResourcesListerStub(channel)
            while not stop.is_set():
                try:
                    answers.append(len(client.List(pb.ListPodResourcesRequest(), timeout=60).pod_resources))
                except grpc.RpcError as exc:
                    errors.append(exc.code())

    listers = [threading.Thread(target=lister) for _ in range(100)]
    for t in listers:
        t.start()
    burst = []
    try:
        burst = [subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                                   "--shared", "--name", f"burst-{i}", "--", "sleep", "60"],
                                  stderr=subprocess.PIPE, text=True) for i in range(30)]
        deadline = time.monotonic() + 120
        names = set()
        while time.monotonic() < deadline and len(names) < 30:
            assert all(p.poll() is None for p in burst), [p.stderr.read() for p in burst if p.poll() is not None]
            code, body = agent.call("GET", "/v1/workloads")  # the HTTP API answers throughout
            assert code == 200
            names = {w["name"] for w in body["workloads"]}
            time.sleep(0.1)
        after = {p.name for p in stub.List(pb.ListPodResourcesRequest()).pod_resources}
    finally:
        stop.set()
        for t in listers:
            t.join(60)
        for proc in burst:
            proc.kill()
            proc.wait()
    assert len(names) == 30
    assert not errors and len(answers) >= 100
    assert {f"burst-{i}" for i in range(30)} <= after
