"""The checked-in PodResources modules are what the pinned grpcio-tools makes
of the project's .proto today: regenerated into a scratch directory and
compared byte for byte."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO = "numa_agent/kubelet/podresources.proto"
GENERATED = ("podresources_pb2.py", "podresources_pb2_grpc.py")


def test_generated_modules_are_current(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) is not installed")
    shutil.copytree(ROOT / "numa_agent" / "kubelet", tmp_path / "numa_agent" / "kubelet",
                    ignore=shutil.ignore_patterns("*.py", "*.pyi", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--grpc_python_out=.", PROTO], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for name in GENERATED:
        fresh = (tmp_path / "numa_agent" / "kubelet" / name).read_text()
        kept = (ROOT / "numa_agent" / "kubelet" / name).read_text()
        assert kept == fresh, (f"numa_agent/kubelet/{name} is stale: regenerate it with the command at the "
                               f"top of {PROTO}")


def test_the_service_name_and_field_numbers_are_the_kubelets():
    from numa_agent.kubelet import podresources_pb2 as pb

    assert pb.DESCRIPTOR.package == "v1"
    assert [m.full_name for m in pb.DESCRIPTOR.services_by_name["PodResourcesLister"].methods] == \
        ["v1.PodResourcesLister.List", "v1.PodResourcesLister.GetAllocatableResources", "v1.PodResourcesLister.Get"]
    numbers = {name: {f.name: f.number for f in pb.DESCRIPTOR.message_types_by_name[name].fields}
               for name in ("ListPodResourcesResponse", "PodResources", "ContainerResources", "ContainerMemory",
                            "ContainerDevices", "TopologyInfo", "NUMANode", "AllocatableResourcesResponse",
                            "GetPodResourcesRequest", "GetPodResourcesResponse")}
    assert numbers == {
        "ListPodResourcesResponse": {"pod_resources": 1},
        "PodResources": {"name": 1, "namespace": 2, "containers": 3},
        "ContainerResources": {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4},
        "ContainerMemory": {"memory_type": 1, "size": 2, "topology": 3},
        "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
        "TopologyInfo": {"nodes": 1},
        "NUMANode": {"ID": 1},
        "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
        "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
        "GetPodResourcesResponse": {"pod_resources": 1},
    }
