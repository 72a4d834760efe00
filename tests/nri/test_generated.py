"""The checked-in NRI modules are what the pinned grpcio-tools makes of the
.protos today, and the vendored API is containerd/nri v0.6.1's."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ("numa_agent/nri/nri_api.proto", "numa_agent/nri/ttrpc_wire.proto")


def test_generated_modules_are_current(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) is not installed")
    shutil.copytree(ROOT / "numa_agent" / "nri", tmp_path / "numa_agent" / "nri",
                    ignore=shutil.ignore_patterns("*.py", "*.pyi", "__pycache__"))
    for proto in PROTOS:
        r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", proto],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        name = Path(proto).stem + "_pb2.py"
        fresh = (tmp_path / "numa_agent" / "nri" / name).read_text()
        kept = (ROOT / "numa_agent" / "nri" / name).read_text()
        assert kept == fresh, f"numa_agent/nri/{name} is stale: regenerate it with the command at the top of {proto}"


def test_the_vendored_api_keeps_its_licence_and_names():
    from numa_agent.nri import nri_api_pb2 as pb

    text = (ROOT / "numa_agent" / "nri" / "nri_api.proto").read_text()
    assert "containerd/nri v0.6.1" in text and "(gogoproto." not in text and "gogo.proto" not in text
    assert (ROOT / "numa_agent" / "nri" / "LICENSE-nri").read_text().split()[:2] == ["Apache", "License"]
    assert pb.DESCRIPTOR.package == "nri.pkg.api.v1alpha1"
    assert pb.DESCRIPTOR.name == "numa_agent/nri/nri_api.proto"  # not api.proto: no clash with CRI's
    assert [m.name for m in pb.DESCRIPTOR.services_by_name["Plugin"].methods] == \
        ["Configure", "Synchronize", "Shutdown", "CreateContainer", "UpdateContainer", "StopContainer",
         "StateChange"]
    assert [m.name for m in pb.DESCRIPTOR.services_by_name["Runtime"].methods] == \
        ["RegisterPlugin", "UpdateContainers"]
    assert {f.name: f.number for f in pb.RegisterPluginRequest.DESCRIPTOR.fields} == \
        {"plugin_name": 1, "plugin_idx": 2}
    assert {f.name: f.number for f in pb.ConfigureResponse.DESCRIPTOR.fields} == {"events": 2}


def test_ttrpcs_envelope_has_the_protocols_field_numbers():
    from numa_agent.nri import ttrpc_wire_pb2 as wire

    def numbers(message):
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(wire.Request) == {"service": 1, "method": 2, "payload": 3, "timeout_nano": 4, "metadata": 5}
    assert numbers(wire.Response) == {"status": 1, "payload": 2}
    assert numbers(wire.Status) == {"code": 1, "message": 2}
    assert numbers(wire.KeyValue) == {"key": 1, "value": 2}
