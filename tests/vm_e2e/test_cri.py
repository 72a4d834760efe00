"""The containerd guest's pieces that need no guest: the vendored CRI API and its checked-in
modules, the requests the client makes as the kubelet would, containerd's configuration and
the image archive."""

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRI_DIR = ROOT / "tests" / "vm_e2e" / "cri"
PROTO = "tests/vm_e2e/cri/cri_api.proto"
GENERATED = ("cri_api_pb2.py", "cri_api_pb2_grpc.py")


def test_generated_modules_are_current(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) is not installed")
    shutil.copytree(CRI_DIR, tmp_path / "tests" / "vm_e2e" / "cri",
                    ignore=shutil.ignore_patterns("*.py", "*.pyi", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--grpc_python_out=.",
                        PROTO], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in GENERATED:
        fresh = (tmp_path / "tests" / "vm_e2e" / "cri" / name).read_text()
        assert (CRI_DIR / name).read_text() == fresh, f"{name} is stale: regenerate it with the command in {PROTO}"


def test_the_vendored_api_is_cri_api_0_32_3_with_its_licence_under_its_own_name():
    from numa_agent.nri import nri_api_pb2  # loaded in the same process: no descriptor clash
    from tests.vm_e2e.cri import cri_api_pb2 as cri

    text = (CRI_DIR / "cri_api.proto").read_text()
    assert "kubernetes/cri-api v0.32.3" in text and "(gogoproto." not in text and "gogo.proto" not in text
    assert (CRI_DIR / "LICENSE-cri-api").read_text().split()[:2] == ["Apache", "License"]
    assert cri.DESCRIPTOR.package == "runtime.v1" and cri.DESCRIPTOR.name == PROTO
    assert nri_api_pb2.DESCRIPTOR.name != cri.DESCRIPTOR.name
    methods = [m.name for m in cri.DESCRIPTOR.services_by_name["RuntimeService"].methods]
    for wanted in ("RunPodSandbox", "CreateContainer", "StartContainer", "UpdateContainerResources",
                   "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox", "ExecSync"):
        assert wanted in methods
    assert {f.name: f.number for f in cri.LinuxContainerResources.DESCRIPTOR.fields
            if f.name.startswith(("cpu", "memory_limit"))} == \
        {"cpu_period": 1, "cpu_quota": 2, "cpu_shares": 3, "memory_limit_in_bytes": 4, "cpuset_cpus": 6,
         "cpuset_mems": 7}


def test_a_guaranteed_pod_is_asked_for_as_the_kubelet_does():
    from tests.vm_e2e.cri import client
    from tests.vm_e2e.cri import cri_api_pb2 as cri

    pod = client.Pod(name="web", uid="u-1", namespace="ns", container="app", cpus=2, memory=64 << 20)
    sandbox = client.sandbox_config(pod, "/logs")
    assert sandbox.linux.cgroup_parent == "/kubepods/podu-1"
    assert sandbox.hostname == ""  # host network: no UTS namespace of its own
    options = sandbox.linux.security_context.namespace_options
    assert (options.network, options.pid, options.ipc) == (cri.NODE, cri.CONTAINER, cri.POD)
    assert (sandbox.metadata.name, sandbox.metadata.uid, sandbox.metadata.namespace) == ("web", "u-1", "ns")
    container = client.container_config(pod, "img", ["sh"])
    r = container.linux.resources
    assert (r.cpu_period, r.cpu_quota, r.cpu_shares, r.memory_limit_in_bytes, r.oom_score_adj) == \
        (100_000, 200_000, 2048, 64 << 20, -997)
    assert sandbox.linux.resources == r  # one container: the pod's sum is its own
    assert container.metadata.name == "app" and container.labels["io.kubernetes.container.name"] == "app"
    assert container.labels["io.kubernetes.pod.uid"] == "u-1"
    assert container.linux.security_context.namespace_options.network == cri.NODE


def test_a_besteffort_pod_goes_below_besteffort_with_minimal_shares_and_no_limits():
    from tests.vm_e2e.cri import client

    pod = client.Pod(name="be", uid="u-2")
    assert pod.cgroup_parent == "/kubepods/besteffort/podu-2" and not pod.guaranteed
    r = client.container_config(pod, "img", ["sh"]).linux.resources
    assert (r.cpu_period, r.cpu_quota, r.cpu_shares, r.memory_limit_in_bytes, r.oom_score_adj) == \
        (0, 0, 2, 0, 1000)
    with pytest.raises(ValueError, match="CPUs and memory"):
        client.Pod(name="half", uid="u-3", cpus=1)


def test_containerd_is_configured_with_nri_cgroupfs_and_the_imported_image():
    import tomllib

    from tests.vm_e2e import containerd_scenarios as ctrd

    config = tomllib.loads(ctrd.containerd_config(Path("/x/runc")))
    assert config["root"] == "/var/lib/containerd"
    nri = config["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and nri["socket_path"] == "/var/run/nri/nri.sock"
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == ctrd.IMAGE
    runc = cri["containerd"]["runtimes"]["runc"]
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    assert runc["options"] == {"BinaryName": "/x/runc", "SystemdCgroup": False}
    agent = tomllib.loads(ctrd.CONTAINERD_AGENT_CONFIG)
    assert agent["nri"] == {"enabled": True, "socket": "/var/run/nri/nri.sock"}
    assert tomllib.loads(ctrd.SINGLE_NUMA_CONFIG)["topology_manager"]["policy"] == "single-numa-node"


def test_the_image_archive_is_a_docker_archive_of_busybox_with_its_applets(tmp_path):
    from tests.vm_e2e import containerd_scenarios as ctrd

    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF stand-in")
    with tarfile.open(fileobj=io.BytesIO(ctrd.image_archive(busybox, "localhost/x:t", ["sleep", "1"]))) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        assert manifest[0]["RepoTags"] == ["localhost/x:t"]
        config_bytes = tar.extractfile(manifest[0]["Config"]).read()
        layer = tar.extractfile(manifest[0]["Layers"][0]).read()
    config = json.loads(config_bytes)
    assert manifest[0]["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert (config["os"], config["architecture"], config["config"]["Cmd"]) == ("linux", "amd64", ["sleep", "1"])
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        assert tar.extractfile("bin/busybox").read() == b"\x7fELF stand-in"
        assert tar.getmember("bin/busybox").mode == 0o755
        links = {m.name: m.linkname for m in tar.getmembers() if m.issym()}
    assert links["bin/sh"] == links["bin/grep"] == links["bin/sleep"] == "busybox"


def test_the_plugin_connection_count_reads_containerds_log_lines():
    from tests.vm_e2e import containerd_scenarios as ctrd

    log = ('time="t" level=info msg="starting plugins..."\n'
           'time="t" level=info msg="plugin \\"10-numa-agent\\" connected"\n'
           'time="t" level=info msg="plugin \\"10-numa-agent\\" connected"\n')
    assert len(ctrd.PLUGIN_CONNECTED.findall(log)) == 2
