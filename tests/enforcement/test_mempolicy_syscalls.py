"""set_mempolicy/get_mempolicy through libc's syscall(), in throwaway interpreters
(a memory policy is per thread), and the readings numa-run --show prints."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.mempolicy import mems_allowed, node_cpus, set_policy

REPO = Path(__file__).resolve().parents[2]


def run_child(code):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


@pytest.mark.parametrize("mode,nodes,expected", [
    (3, [0], "3 (0,) 0"),        # interleave: the next interleave node is read too
    (1, [0], "1 (0,) None"),     # preferred
    (4, [], "4 () None"),        # local: no mask
])
def test_set_then_get_in_a_child(mode, nodes, expected):
    lines = run_child(f"""
        from numa_agent.enforcement.mempolicy import get_policy, set_policy
        r = set_policy({mode}, {nodes}, label="test")
        print(r.applied, r.errno_name, r.reason, sep="|")
        p = get_policy()
        print(p.mode, p.nodes, p.next_node)
    """)
    applied, errno_name, reason = lines[0].split("|")
    if applied != "True":  # a sandbox (seccomp) refusing it is reported, not hidden
        assert errno_name.startswith("E") and reason.startswith("set_mempolicy(test) failed: E")
        return
    assert lines[1] == expected


def test_unknown_mode_is_einval():
    # What a kernel before 6.9 answers for MPOL_WEIGHTED_INTERLEAVE; numa-run names the need.
    lines = run_child("""
        from numa_agent.enforcement.mempolicy import set_policy
        r = set_policy(99, [0], label="mode 99")
        print(r.applied, r.errno_name, sep="|")
    """)
    assert lines == ["False|EINVAL"]


def test_unknown_architecture_is_said():
    r = set_policy(3, [0], label="x", machine="sparc64")
    assert not r and r.errno_name == "" and "architecture 'sparc64'" in r.reason


def test_mems_allowed_and_node_cpus_from_written_files(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tx\nMems_allowed:\t00000003\nMems_allowed_list:\t0-1\n")
    assert mems_allowed(str(status)) == (0, 1)
    for node, cpus in ((0, "0-3"), (2, "4-7")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "possible").write_text("0-2\n")
    assert node_cpus(str(tmp_path)) == {0: CpuSet.parse("0-3"), 2: CpuSet.parse("4-7")}
    assert node_cpus(str(tmp_path / "absent")) == {}
