"""Boots a real 2node guest once (QEMU under emulation, 10-40 s). Opt-in: NUMA_AGENT_VM=1."""

import os
import re

import pytest
from vmharness import SHAPES, run_in_guest

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMA_AGENT_VM") != "1" or os.environ.get("NUMA_AGENT_IN_VM") == "1",
    reason="boots a QEMU guest; set NUMA_AGENT_VM=1 to run (never inside a guest)",
)

# One boot answers every question: sections are separated by '== name' lines.
GUEST_SCRIPT = r"""
echo "== nodes"; ls /sys/devices/system/node | grep '^node[0-9]'
for n in /sys/devices/system/node/node[0-9]*; do echo "${n##*/} $(cat $n/cpulist)"; done > "$NUMA_AGENT_VM_OUT/cpulists"
echo "== controllers"; cat /sys/fs/cgroup/cgroup.controllers
echo "== subtree"; cat /sys/fs/cgroup/cgroup.subtree_control
echo "== pci"; for d in /sys/bus/pci/devices/*; do echo "${d##*/} $(cat $d/numa_node)"; done
echo "== pinned"
mkdir /sys/fs/cgroup/pinned && echo 4-7 > /sys/fs/cgroup/pinned/cpuset.cpus && echo 1 > /sys/fs/cgroup/pinned/cpuset.mems
sh -c 'echo $$ > /sys/fs/cgroup/pinned/cgroup.procs && grep -E "^(Cpus|Mems)_allowed_list" /proc/self/status'
echo "== env"; echo "in_vm=$NUMA_AGENT_IN_VM shape=$NUMA_AGENT_VM_SHAPE switch=${NUMA_AGENT_VM-unset} cwd=$(pwd)"
echo "to stderr" >&2
exit 3
"""


def sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = out.setdefault(line[3:], [])
        elif current is not None and line.strip():
            current.append(line.strip())
    return out


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("vm-out")
    result = run_in_guest("2node", ["sh", "-c", GUEST_SCRIPT], timeout=300, out_dir=out_dir)
    return result, sections(result.stdout.decode()), out_dir


def test_guest_runs_the_command_and_returns_its_status_and_output(guest):
    result, parts, _ = guest
    assert result.exit_code == 3 and not result.timed_out
    assert result.stderr == b"to stderr\n"
    assert parts["env"] == [f"in_vm=1 shape=2node switch=unset cwd={os.getcwd()}"]


def test_guest_has_the_shapes_two_numa_nodes_and_their_cpus(guest):
    _, parts, out_dir = guest
    assert parts["nodes"] == ["node0", "node1"]
    # written through the out share, so it also proves the share is writable from the guest
    expected = [f"node{node} {cpus[0]}-{cpus[-1]}" for node, cpus in SHAPES["2node"].expected_node_cpus().items()]
    assert (out_dir / "cpulists").read_text().splitlines() == expected == ["node0 0-3", "node1 4-7"]


def test_cgroup_v2_offers_and_delegates_cpuset(guest):
    _, parts, _ = guest
    assert "cpuset" in parts["controllers"][0].split()
    assert "cpuset" in parts["subtree"][0].split()


def test_a_pci_device_reports_numa_node_1(guest):
    _, parts, _ = guest
    nodes = dict(line.split() for line in parts["pci"])
    assert nodes["0000:81:00.0"] == "1"  # the NVMe behind the expander bridge
    assert any(node == "-1" for node in nodes.values())  # root-complex devices: no node


def test_a_process_moved_into_a_cpuset_cgroup_is_pinned(guest):
    _, parts, _ = guest
    pinned = dict(re.split(r":\s+", line) for line in parts["pinned"])
    assert pinned == {"Cpus_allowed_list": "4-7", "Mems_allowed_list": "1"}
