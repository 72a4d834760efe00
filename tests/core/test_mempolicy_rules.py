import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.mempolicy import (
    MPOL_BIND,
    MPOL_DEFAULT,
    MPOL_INTERLEAVE,
    MPOL_LOCAL,
    MPOL_PREFERRED,
    MPOL_WEIGHTED_INTERLEAVE,
    MemoryPolicy,
    PolicyRefused,
    binding_needed,
    chosen_policy,
    effective_policy,
    failure_message,
    request_membind,
    show_lines,
)


def test_one_policy_from_the_options():
    assert chosen_policy() is None
    assert chosen_policy(interleave=[1, 0, 1]) == MemoryPolicy(MPOL_INTERLEAVE, (0, 1))
    assert chosen_policy(preferred=[2]) == MemoryPolicy(MPOL_PREFERRED, (2,))
    assert chosen_policy(localalloc=True) == MemoryPolicy(MPOL_LOCAL)
    assert chosen_policy(weighted_interleave=[0]) == MemoryPolicy(MPOL_WEIGHTED_INTERLEAVE, (0,))


def test_two_policies_are_refused():
    with pytest.raises(PolicyRefused, match="--interleave and --localalloc exclude each other"):
        chosen_policy(interleave=[0], localalloc=True)


def test_preferred_takes_one_node():
    with pytest.raises(PolicyRefused, match="--preferred takes one NUMA node, not 0-1"):
        chosen_policy(preferred=[0, 1])


@pytest.mark.parametrize("policy,membind,asked", [
    (None, None, None),
    (None, [1], [1]),
    (MemoryPolicy(MPOL_INTERLEAVE, (0, 1)), None, [0, 1]),   # -i books its nodes
    (MemoryPolicy(MPOL_PREFERRED, (1,)), None, [1]),         # -p books its node
    (MemoryPolicy(MPOL_LOCAL), None, None),                  # -l: the booking decides
    (MemoryPolicy(MPOL_INTERLEAVE, (0,)), [0, 1], [0, 1]),   # an explicit -m wins
])
def test_request_membind(policy, membind, asked):
    assert request_membind(policy, membind) == asked


def test_decide_within_the_booking():
    policy = MemoryPolicy(MPOL_INTERLEAVE, (0, 1))
    assert effective_policy(policy, [0, 1, 2]) == policy
    assert effective_policy(MemoryPolicy(MPOL_LOCAL), [3]) == MemoryPolicy(MPOL_LOCAL)
    assert effective_policy(None, []) is None


def test_decide_refuses_nodes_outside_the_booking():
    with pytest.raises(PolicyRefused, match=r"--interleave 0-1: node\(s\) 1 lie outside the "
                                            r"booked memory nodes 0 .*--membind 0-1"):
        effective_policy(MemoryPolicy(MPOL_INTERLEAVE, (0, 1)), [0])
    with pytest.raises(PolicyRefused, match="no memory nodes"):
        effective_policy(MemoryPolicy(MPOL_LOCAL), [])


def test_weighted_interleave_einval_names_the_kernel_need():
    weighted = MemoryPolicy(MPOL_WEIGHTED_INTERLEAVE, (0,))
    assert "needs Linux 6.9 or later" in failure_message(weighted, "EINVAL", "x")
    assert failure_message(weighted, "EPERM", "set_mempolicy failed: EPERM") == \
        "set_mempolicy failed: EPERM"
    assert failure_message(MemoryPolicy(MPOL_INTERLEAVE, (0,)), "EINVAL", "r") == "r"


NODES = {0: CpuSet.parse("0-3"), 1: CpuSet.parse("4-7")}


def test_show_default_policy_like_numactl():
    lines = show_lines(mode=MPOL_DEFAULT, nodes=(), next_node=None, affinity=CpuSet.parse("2-5"),
                       node_cpus=NODES, mems_allowed=(0, 1))
    assert lines == ["policy: default", "preferred node: current", "physcpubind: 2 3 4 5 ",
                     "cpubind: 0 1 ", "nodebind: 0 1 ", "membind: 0 1 ", "preferred: "]


def test_show_interleave_and_bind_and_preferred():
    inter = show_lines(mode=MPOL_INTERLEAVE, nodes=(0, 1), next_node=1, affinity=CpuSet([4]),
                       node_cpus=NODES, mems_allowed=(0, 1))
    assert inter[:4] == ["policy: interleave", "preferred node: 1 (interleave next)",
                         "interleavemask: 0 1 ", "interleavenode: 1"]
    assert "nodebind: 1 " in inter
    bind = show_lines(mode=MPOL_BIND, nodes=(1,), next_node=None, affinity=CpuSet([0]),
                      node_cpus=NODES, mems_allowed=(0, 1))
    assert bind[1] == "preferred node: 1" and "membind: 1 " in bind
    pref = show_lines(mode=MPOL_PREFERRED, nodes=(1,), next_node=None, affinity=CpuSet([0]),
                      node_cpus=NODES, mems_allowed=(0, 1))
    assert pref[:2] == ["policy: preferred", "preferred node: 1"] and pref[-1] == "preferred: 1 "


@pytest.mark.parametrize(("mems", "has_memory", "needed"), [
    ([0], "0\n", False),            # the only memory node: binding restricts nothing
    ([0, 1], "0-1\n", False),
    ([1, 0, 0], "0-1", False),
    ([0], "0-1\n", True),           # fewer than every memory node: bind
    ([0, 1], "0-2", True),          # a memory-only node left out (CXL): bind
    ([0, 1, 2], "0,2", False),      # a CPU node without memory named too: nothing restricted
    ([0], None, True),              # has_memory unreadable: bind, to be safe
    ([0], "garbage", True),
    ([0], "", True),
])
def test_memory_is_bound_only_where_binding_restricts(mems, has_memory, needed):
    assert binding_needed(mems, has_memory) is needed
