"""A PodResources server that cannot start stops the agent's start with one
clear line, never a silent absence; the files and the socket follow the
configuration; both come back unchanged after kill -9 and a restart."""

import json
import socket
import subprocess
import sys

import grpc
import pytest

from numa_agent.kubelet import podresources_pb2 as pb
from numa_agent.kubelet import podresources_pb2_grpc as pb_grpc
from tests.support.agent_process import AgentProcess, numa_run, wait_for
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=4 << 30)
    return write_sysfs(topo, tmp_path_factory.mktemp("podres-startup") / "machine")


def serve(tmp_path, machine, *args):
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "serve", "--sysfs-root", str(machine),
                           "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "agent.sock"),
                           "--metrics-address", "", "--no-hotplug", *args],
                          capture_output=True, text=True, timeout=60)


def test_a_path_another_server_answers_on_stops_the_start(tmp_path, machine):
    taken = tmp_path / "taken.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(taken))
    listener.listen()
    try:
        r = serve(tmp_path, machine, "--pod-resources-socket", str(taken))
    finally:
        listener.close()
    assert r.returncode == 1
    assert f"numa-agent: cannot serve PodResources on {taken} (kubelet.pod_resources_socket, " \
           f"--pod-resources-socket): another agent is already serving on {taken}" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "agent.sock").exists()  # the API socket bound before it is taken back


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_a_path_that_cannot_be_a_socket_stops_the_start(tmp_path, machine, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a socket")
    path = blocker if where == "file" else blocker / "pod-resources.sock"
    r = serve(tmp_path, machine, "--pod-resources-socket", str(path))
    last = r.stderr.strip().splitlines()[-1]  # the log goes to stderr too; the error is the last line
    if where == "file":
        assert r.returncode == 78 and last.startswith(
            f"numa-agent: cannot serve PodResources on {path} (kubelet.pod_resources_socket, "
            "--pod-resources-socket): ")
        assert "exists and is not a socket" in last
    else:  # the socket's directory is checked first: a configuration to fix
        assert r.returncode == 78 and last == f"numa-agent: socket directory {blocker}: {blocker} is not a directory"
    assert blocker.read_text() == "not a socket"


def test_off_means_no_socket_and_no_files(tmp_path, machine):
    agent = AgentProcess(tmp_path, "--sysfs-root", str(machine), "--pod-resources-socket", "",
                         "--kubelet-state-dir", "").start()
    try:
        assert not (tmp_path / "pod-resources.sock").exists()
        assert not (agent.state_dir / "cpu_manager_state").exists()
        code, docs = agent.call("GET", "/v1/kubelet")  # still there to read, built on request
        assert code == 200 and docs["directory"] is None and docs["cpu_manager_state"]["policyName"] == "static"
    finally:
        agent.stop()


def test_state_files_and_list_unchanged_after_kill_and_restart(tmp_path, machine):
    kubelet_dir = tmp_path / "kubelet"
    agent = AgentProcess(tmp_path, "--sysfs-root", str(machine), "--kubelet-state-dir", str(kubelet_dir)).start()
    sleeper = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                                "--cpus", "2", "--memory", "64Mi", "--name", "keeps", "--", "sleep", "60"])
    try:
        wait_for(lambda: (kubelet_dir / "cpu_manager_state").exists()
                 and "keeps" in json.loads((kubelet_dir / "cpu_manager_state").read_text())["entries"], 20)
        before = {n: (kubelet_dir / n).read_text() for n in ("cpu_manager_state", "memory_manager_state")}
        listed = _list(tmp_path)
        agent.kill()
        agent.start()
        after = {n: (kubelet_dir / n).read_text() for n in ("cpu_manager_state", "memory_manager_state")}
        assert {n: json.loads(v) for n, v in after.items()} == {n: json.loads(v) for n, v in before.items()}
        assert _list(tmp_path) == listed
        assert numa_run(agent.socket, "--cpus", "1", "--", "true").returncode == 0
    finally:
        sleeper.kill()
        sleeper.wait()
        agent.stop()


def _list(tmp_path):
    with grpc.insecure_channel(f"unix:{tmp_path / 'pod-resources.sock'}") as channel:
        return pb_grpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(), timeout=10)


def test_the_pod_resources_gate_is_scraped_beside_the_metrics_listener(tmp_path, machine):
    import urllib.request

    agent = AgentProcess(tmp_path, "--sysfs-root", str(machine)).start()
    try:
        wait_for(lambda: (tmp_path / "pod-resources.sock").exists(), 20)
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=30) as r:
            text = r.read().decode()
    finally:
        agent.stop()
    assert 'numa_agent_pod_resources_refused_connections_total{reason="per_peer_limit"} 0.0' in text
    assert "numa_agent_pod_resources_max_connections " in text
