"""`numa-agent oci-hook STAGE` against a stand-in agent: a plain container never connects; an
annotated one is admitted on its own cgroup, idempotently; refusals and an unreachable agent fail
it closed with the reason; poststop releases, a workload already gone is fine."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from numa_agent.cli import common
from numa_agent.engines import annotations as oci_hook_annotations
from numa_agent.engines import oci_hook

from .fake_agent import FakeAgent

CID = "1a2f523b4fed3b9595a2e7c16f055e83217e0ee7bf0db84676814bb6db1c0467"
CGROUP = f"/libpod_parent/libpod-{CID}"
PID = 4242


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="na-hook-", dir="/tmp")  # a socket path is at most 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent(sock_dir):
    fake = FakeAgent(f"{sock_dir}/agent.sock")
    yield fake
    fake.close()


@pytest.fixture
def proc(tmp_path):
    """A /proc with the container's process in its cgroup (as the engine's host sees it)."""
    (tmp_path / str(PID)).mkdir()
    (tmp_path / str(PID) / "cgroup").write_text(f"0::{CGROUP}\n")
    return str(tmp_path)


@pytest.fixture(autouse=True)
def no_retry(monkeypatch):
    monkeypatch.setenv("NUMA_AGENT_RETRY_SECONDS", "0")  # an absent agent: fail at once


def state(annotations=None, *, cid=CID, pid=PID, status="created") -> bytes:
    doc = {"ociVersion": "1.0", "id": cid, "status": status, "bundle": "/var/lib/b",
           "annotations": {"io.container.manager": "libpod", **(annotations or {})}}
    if pid is not None:
        doc["pid"] = pid
    return json.dumps(doc).encode()


def hook(stage, raw, socket_path, proc_root="/proc"):
    return oci_hook.run(stage, raw, socket_path, proc_root=proc_root, refusal_lines=common.refusal_lines)


# ------------------------------------------------------------ not ours
@pytest.mark.parametrize("stage", oci_hook.STAGES)
def test_a_plain_container_is_left_alone_without_connecting(agent, stage):
    assert hook(stage, state(), agent.path) == (0, [])
    assert agent.requests == []


def test_a_plain_container_passes_even_when_no_agent_runs(sock_dir):
    assert hook("createRuntime", state(), f"{sock_dir}/absent.sock") == (0, [])


# ------------------------------------------------------------ admission
@pytest.mark.parametrize("stage", oci_hook.CREATE_STAGES)
def test_an_annotated_container_is_admitted_on_its_own_cgroup(agent, proc, stage):
    status, lines = hook(stage, state({"numa-agent.io/cpus": "2", "numa-agent.io/memory": "64Mi"}),
                         agent.path, proc)
    assert (status, lines) == (0, [])
    ((method, path, body),) = agent.requests
    assert (method, path) == ("POST", "/v1/workloads")
    assert body == {"name": f"ctr-{CID[:12]}", "cgroup": CGROUP, "request_id": CID, "cpus": 2,
                    "shared": False, "memory_bytes": 64 << 20, "hugepages": {}, "devices": {}}


def test_a_retried_hook_asks_with_the_same_request_id(agent, proc):
    for _ in range(2):
        hook("createRuntime", state({"numa-agent.io/cpus": "1"}), agent.path, proc)
    assert [b["request_id"] for _, _, b in agent.requests] == [CID, CID]


def test_an_id_that_is_not_64_hex_digits_is_hashed_for_the_request_id_and_name(agent, proc):
    cid = "My-Container_1"
    digest = hashlib.sha256(cid.encode()).hexdigest()
    assert hook("createRuntime", state({"numa-agent.io/cpus": "1"}, cid=cid), agent.path, proc)[0] == 0
    body = agent.requests[0][2]
    assert body["request_id"] == digest and body["name"] == f"ctr-{digest[:12]}"


def test_a_refusal_fails_the_container_with_the_agents_reason(agent, proc):
    reason = "TopologyAffinityError: 5 CPUs requested; 7 free, but at most 4 on one NUMA node"
    agent.answer = (409, {"error": {"code": "topology_affinity_error", "message": reason,
                                    "details": {"reason": reason, "free": {"0": {"cpus": 4}}}}})
    status, lines = hook("createRuntime", state({"numa-agent.io/cpus": "5"}), agent.path, proc)
    assert status == 1
    assert lines[0] == f"numa-agent: container {CID[:12]} refused: {reason}"
    assert "  free: node 0: 4 CPUs" in lines


def test_a_forbidden_answer_is_a_refusal_too(agent, proc):
    agent.answer = (403, {"error": {"code": "forbidden", "message": "cgroup is for root callers only"}})
    status, lines = hook("createRuntime", state({"numa-agent.io/cpus": "1"}), agent.path, proc)
    assert status == 1 and lines == [f"numa-agent: container {CID[:12]} refused: cgroup is for root callers only"]


def test_an_unreachable_agent_fails_an_annotated_container_closed(sock_dir, proc):
    path = f"{sock_dir}/absent.sock"
    status, lines = hook("createRuntime", state({"numa-agent.io/cpus": "1"}), path, proc)
    assert status == 1
    assert lines == [f"numa-agent: cannot reach the agent at {path} (No such file or directory); container "
                     f"{CID[:12]} is not started (annotated containers fail closed)"]


def test_a_bad_annotation_fails_the_container_without_asking_the_agent(agent, proc):
    status, lines = hook("createRuntime", state({"numa-agent.io/memory": "12X"}), agent.path, proc)
    assert status == 1 and agent.requests == []
    assert lines[0].startswith(f"numa-agent: container {CID[:12]} refused: annotation numa-agent.io/memory='12X': ")
    assert "(syntax: SIZE" in lines[0]


def test_no_pid_at_create_is_an_error(agent, proc):
    status, lines = hook("createRuntime", state({"numa-agent.io/cpus": "1"}, pid=None), agent.path, proc)
    assert status == 1 and "has no pid" in lines[0] and agent.requests == []


def test_a_process_without_a_cgroup_v2_line_is_an_error(agent, tmp_path):
    (tmp_path / str(PID)).mkdir()
    (tmp_path / str(PID) / "cgroup").write_text("4:memory:/x\n")
    status, lines = hook("createRuntime", state({"numa-agent.io/cpus": "1"}), agent.path, str(tmp_path))
    assert status == 1 and "no cgroup v2 (0::) line" in lines[0] and agent.requests == []


# ------------------------------------------------------------ release
@pytest.mark.parametrize("answer", [(200, {"name": f"ctr-{CID[:12]}"}),
                                    (404, {"error": {"code": "not_found", "message": "no workload"}})])
def test_poststop_releases_and_a_workload_already_gone_is_fine(agent, answer):
    agent.answer = answer
    assert hook("poststop", state({"numa-agent.io/cpus": "1"}, pid=None, status="stopped"), agent.path) == (0, [])
    assert agent.requests == [("DELETE", f"/v1/workloads/ctr-{CID[:12]}?request_id={CID}", None)]


def test_poststop_says_when_the_agent_refuses_the_release(agent):
    agent.answer = (403, {"error": {"code": "forbidden", "message": "not yours"}})
    status, lines = hook("poststop", state({"numa-agent.io/cpus": "1"}, pid=None), agent.path)
    assert status == 1 and lines == [f"numa-agent: cannot release ctr-{CID[:12]} (container {CID[:12]}): not yours"]


# ------------------------------------------------------------ bad input
@pytest.mark.parametrize("raw,says", [
    (b"", "stdin is not an OCI state"),
    (b"{not json", "stdin is not an OCI state"),
    (b"[1, 2]", "a JSON list"),
    (b'{"pid": 1}', "has no container id"),
    (b'{"id": "x", "annotations": []}', "\"annotations\" is not an object"),
    (b'{"id": "x", "pid": -4}', "\"pid\" is -4"),
    (b"\xff\xfe", "stdin is not an OCI state"),
    (b" " * (oci_hook.MAX_STATE_BYTES + 1), "over 1048576 bytes"),
    (b"[" * 200_000, "stdin is not an OCI state"),  # nested past the parser's recursion limit
    (b'{"id": "x", "annotations": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001, "stdin is not an OCI state"),
])
def test_malformed_state_is_one_clear_line_and_exit_1(agent, raw, says):
    status, lines = hook("createRuntime", raw, agent.path)
    assert status == 1 and len(lines) == 1 and says in lines[0] and lines[0].startswith("numa-agent: oci-hook: ")
    assert agent.requests == []


# ------------------------------------------------------------ the command
def run_command(stage, raw, socket_path):
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "oci-hook", stage,
                           "--socket", socket_path], input=raw, capture_output=True, timeout=60,
                          env={**os.environ, "NUMA_AGENT_RETRY_SECONDS": "0"})


def test_the_command_admits_this_process_cgroup(agent):
    done = run_command("createRuntime", state({"numa-agent.io/cpus": "1"}, pid=os.getpid()), agent.path)
    assert done.returncode == 0, done.stderr
    own = oci_hook.cgroup_from_proc(Path("/proc/self/cgroup").read_text())
    assert agent.requests[0][2]["cgroup"] == own


def test_the_command_prints_the_refusal_on_stderr_and_exits_1(agent):
    agent.answer = (409, {"error": {"code": "admission_refused", "message": "no CPUs left"}})
    done = run_command("createRuntime", state({"numa-agent.io/cpus": "9"}, pid=os.getpid()), agent.path)
    assert done.returncode == 1
    assert done.stderr.decode() == f"numa-agent: container {CID[:12]} refused: no CPUs left\n"


def test_the_command_takes_only_the_known_stages(agent):
    done = run_command("poststart", state(), agent.path)
    assert done.returncode == 2 and b"invalid choice" in done.stderr


def test_the_pod_a_container_joins_is_of_its_own_sandbox():
    sandbox = "5" * 64
    for key in oci_hook_annotations.SANDBOX_KEYS:
        st = oci_hook.parse_state(state({"numa-agent.io/pod": "db", key: sandbox}))
        assert oci_hook.admission(st, CGROUP)["pod"] == f"sbx-{sandbox[:12]}-db"
    st = oci_hook.parse_state(state({"numa-agent.io/pod": "db", "io.kubernetes.cri.sandbox-id": "pod-x"}))
    assert oci_hook.admission(st, CGROUP)["pod"] == f"sbx-{hashlib.sha256(b'pod-x').hexdigest()[:12]}-db"
    st = oci_hook.parse_state(state({"numa-agent.io/pod": "db"}))
    with pytest.raises(oci_hook_annotations.AnnotationError, match="names no sandbox"):
        oci_hook.admission(st, CGROUP)
    st = oci_hook.parse_state(state({"numa-agent.io/pod": "d" * 50, "io.kubernetes.cri.sandbox-id": sandbox}))
    with pytest.raises(oci_hook_annotations.AnnotationError, match="longer than 46"):
        oci_hook.admission(st, CGROUP)


def test_two_sandboxes_named_by_the_two_engines_keys_are_refused():
    # containerd writes its own key; a tenant whose pod annotations it passes through
    # could add CRI-O's, which is read first, naming another tenant's sandbox.
    own, other = "5" * 64, "6" * 64
    st = oci_hook.parse_state(state({"numa-agent.io/pod": "db", "io.kubernetes.cri.sandbox-id": own,
                                     "io.kubernetes.cri-o.SandboxID": other}))
    with pytest.raises(oci_hook_annotations.AnnotationError, match="two different sandboxes"):
        oci_hook.admission(st, CGROUP)
    st = oci_hook.parse_state(state({"numa-agent.io/pod": "db", "io.kubernetes.cri.sandbox-id": own,
                                     "io.kubernetes.cri-o.SandboxID": own}))
    assert oci_hook.admission(st, CGROUP)["pod"] == f"sbx-{own[:12]}-db"
