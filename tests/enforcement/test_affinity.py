"""Memory binding of the affinity fallback: what this machine allows, exercised on child
processes. (Its CPU pinning is AffinityEnforcer's: test_repin.py, test_strays.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from numa_agent.core.mempolicy import MPOL_BIND
from numa_agent.enforcement.mempolicy import PolicyResult, bind_self, get_policy

REPO = Path(__file__).resolve().parents[2]


def status_field(pid, name):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{name} not in /proc/{pid}/status")


def run_child(code):
    """Memory policy is per thread: try it in a throwaway interpreter."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_bind_self_in_a_child():
    lines = run_child("""
        from numa_agent.enforcement.mempolicy import bind_self, get_policy
        before = get_policy()
        result = bind_self([0])
        after = get_policy()
        print(before.mode if before else None)
        print(result.applied)
        print(result.reason)
        print(after.mode if after else None, sorted(after.nodes) if after else None)
    """)
    before, applied, reason, after = (lines + [""])[:4]
    assert before == "0"  # MPOL_DEFAULT until bound
    if applied == "True":
        assert after == f"{MPOL_BIND} [0]"
    else:
        # A sandbox (seccomp) refusing the call must be reported, not hidden.
        assert reason.startswith("set_mempolicy(MPOL_BIND, nodes 0) failed: E")


def test_bind_to_absent_node_reports_the_kernel_error():
    lines = run_child("""
        from numa_agent.enforcement.mempolicy import bind_self
        r = bind_self([1000])
        print(r.applied, r.reason, sep="|")
    """)
    applied, reason = lines[0].split("|")
    assert applied == "False"
    assert reason.startswith("set_mempolicy(MPOL_BIND, nodes 1000) failed: E")


def test_bind_on_unknown_architecture():
    result = bind_self([0], machine="sparc64")
    assert result == PolicyResult(False, "set_mempolicy syscall number unknown for "
                                         "architecture 'sparc64'")
    assert not result
    assert get_policy(machine="sparc64") is None


def test_bind_validates_nodes():
    with pytest.raises(ValueError, match="at least one NUMA node"):
        bind_self([])
    with pytest.raises(ValueError, match="NUMA node id must be >= 0"):
        bind_self([-1])

