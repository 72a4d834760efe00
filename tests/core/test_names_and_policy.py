"""One rule for each name and one type for the topology policies: the config,
the API and the enforcement layer accept and refuse the same things."""

import json

import pytest

from numa_agent.admission.device_manager import DeviceConfigError, DeviceResource, DeviceSelector
from numa_agent.admission.topology_manager import admit
from numa_agent.api.errors import BadRequest
from numa_agent.api.validation import parse_admit_request, validate_name
from numa_agent.core.hints import NumaMask, TopologyHint
from numa_agent.core.policy import POLICY_NAMES, TopologyPolicy
from numa_agent.enforcement.plan import safe_component

RESOURCE_NAMES = ["gpu", "nic", "nvidia.com/gpu", "a", "gpu-0", "x" * 63, "x" * 64, "GPU", "-gpu", "gpu-",
                  "gpu/", "/gpu", "a/b/c", "gpu nic", "gpu_1", "Nvidia.com/gpu", ""]
WORKLOAD_NAMES = ["web", "a", "db-1", "x.y_z", "x" * 63, "x" * 64, "Web", "-a", "a-", "a..b", "a/b", "", "a\x00"]


def _config_accepts(name: str) -> bool:
    try:
        DeviceResource(name, DeviceSelector(vendor="10de"))
    except DeviceConfigError:
        return False
    return True


def _api_accepts(name: str) -> bool:
    try:
        parse_admit_request(json.dumps({"cpus": 1, "devices": {name: 1}, "command": ["true"]}).encode())
    except BadRequest:
        return False
    return True


@pytest.mark.parametrize("name", RESOURCE_NAMES)
def test_config_and_api_agree_on_device_resource_names(name):
    assert _config_accepts(name) == _api_accepts(name), name


def test_resource_rule_accepts_qualified_and_refuses_uppercase():
    assert _api_accepts("nvidia.com/gpu") and not _api_accepts("GPU") and not _api_accepts("gpu_1")


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_api_and_cgroup_layer_agree_on_workload_names(name):
    try:
        validate_name(name)
        api = True
    except BadRequest:
        api = False
    try:
        safe_component(name)
        cgroup = True
    except ValueError:
        cgroup = False
    assert api == cgroup, name


def test_policy_type_is_the_kubelet_names_and_rules():
    assert POLICY_NAMES == ("none", "best-effort", "restricted", "single-numa-node")
    assert TopologyPolicy("single-numa-node") == "single-numa-node"
    assert json.dumps(TopologyPolicy.RESTRICTED) == '"restricted"'
    not_preferred = TopologyHint(NumaMask([0, 1]), False)
    assert [admit(p, not_preferred) for p in POLICY_NAMES] == [True, True, False, False]
    assert TopologyPolicy.NONE.rule == "" and "single-node" in TopologyPolicy.SINGLE_NUMA_NODE.rule
    with pytest.raises(ValueError, match="expected one of none, best-effort, restricted, single-numa-node"):
        TopologyPolicy.parse("strict")


def test_engine_derived_names_are_their_owners():
    from numa_agent.core.names import engine_name_refusal
    assert engine_name_refusal("slurm-12-0-0-u1000", 1000) is None
    assert "Slurm task" in (engine_name_refusal("slurm-12-0-0-u1000", 1001) or "")
    assert "Slurm task" in (engine_name_refusal("slurm-12-0-0", 1000) or "")  # whose is not said
    assert "Slurm task" in (engine_name_refusal("slurm-12-0-0-u10001", 1000) or "")  # not a prefix
    assert "container" in (engine_name_refusal("ctr-0123456789ab", 1000) or "")
    assert all(engine_name_refusal(n, 0) is None for n in ("slurm-12-0-0", "ctr-0123456789ab"))
    assert all(engine_name_refusal(n, 1000) is None for n in ("slurm-web", "ctr-web", "web", "slurm-12x"))
