"""numa-run --tasks: the pure rank-to-node plan (block and cyclic, as srun's
--distribution) and the CUDA index of a GPU in PCI bus order."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_agent.core.rank_plan import NodeRoom, PlanError, RankAsk, cuda_indices, holds, plan_ranks

GPU = {"gpu": 1}


def rooms(*gpus_per_node, cpus=16):
    return [NodeRoom(node=n, cpus=cpus, memory_bytes=64 << 30, devices={"gpu": g})
            for n, g in enumerate(gpus_per_node)]


def test_block_fills_one_nodes_devices_first():
    assert plan_ranks(RankAsk(8, 2, devices=GPU), rooms(4, 4)) == (0, 0, 0, 0, 1, 1, 1, 1)


def test_cyclic_goes_round_the_nodes():
    assert plan_ranks(RankAsk(8, 2, devices=GPU, distribution="cyclic"), rooms(4, 4)) == \
        (0, 1, 0, 1, 0, 1, 0, 1)


def test_cyclic_skips_a_node_once_it_is_full():
    assert plan_ranks(RankAsk(5, 1, devices=GPU, distribution="cyclic"), rooms(1, 3, 1)) == (0, 1, 2, 1, 1)


def test_block_with_fewer_tasks_than_the_first_node_holds_stays_there():
    assert plan_ranks(RankAsk(2, 2, devices=GPU), rooms(4, 4)) == (0, 0)


def test_a_node_without_the_device_gets_no_rank():
    assert plan_ranks(RankAsk(3, 1, devices=GPU, distribution="cyclic"), rooms(0, 2, 1)) == (1, 2, 1)


def test_without_devices_cpus_decide():
    ask = RankAsk(4, 3, distribution="cyclic")
    assert plan_ranks(RankAsk(3, 3, distribution="cyclic"), [NodeRoom(0, 6), NodeRoom(1, 3)]) == (0, 1, 0)
    # node 0 holds 2 ranks of 3 CPUs, node 1 one: four do not fit
    with pytest.raises(PlanError, match=r"rank 3 of 4 .*more tasks than CPUs \(12 needed, 9 free\)"):
        plan_ranks(ask, [NodeRoom(0, 6), NodeRoom(1, 3)])


def test_memory_per_rank_limits_a_node():
    ask = RankAsk(3, 1, memory_bytes=8 << 30)
    assert plan_ranks(ask, [NodeRoom(0, 8, 16 << 30), NodeRoom(1, 8, 16 << 30)]) == (0, 0, 1)


def test_more_tasks_than_devices_says_which_rank_and_why():
    with pytest.raises(PlanError) as err:
        plan_ranks(RankAsk(5, 2, devices=GPU), rooms(2, 2))
    assert str(err.value) == (
        "rank 4 of 5 fits on no NUMA node (2 CPUs, 1 gpu per rank, all on one node): more tasks "
        "than gpu devices (5 needed, 4 free on known nodes): node 0 holds 2 (16 CPUs, 2 gpu free); "
        "node 1 holds 2 (16 CPUs, 2 gpu free)")


def test_a_rank_too_big_for_any_node_is_named():
    with pytest.raises(PlanError, match=r"rank 0 of 2 .*: a rank's 12 CPUs fit on no node: node 0 holds 0"):
        plan_ranks(RankAsk(2, 12), [NodeRoom(0, 8), NodeRoom(1, 8)])


def test_a_devices_node_short_of_cpus_holds_fewer_ranks():
    # 4 GPUs on node 0 but only 4 free CPUs there: two ranks of 2 CPUs, the rest on node 1
    room = [NodeRoom(0, 4, devices={"gpu": 4}), NodeRoom(1, 16, devices={"gpu": 4})]
    assert plan_ranks(RankAsk(4, 2, devices=GPU), room) == (0, 0, 1, 1)


def test_the_ask_refuses_what_no_plan_can_mean():
    for bad in (dict(tasks=0, cpus=1), dict(tasks=1, cpus=0), dict(tasks=1, cpus=1, distribution="plane")):
        with pytest.raises(ValueError):
            RankAsk(**bad)


room_lists = st.lists(
    st.builds(lambda cpus, gpus, nics: (cpus, gpus, nics),
              st.integers(0, 64), st.integers(0, 8), st.integers(0, 4)),
    min_size=1, max_size=8).map(
        lambda rows: [NodeRoom(n, c, 1 << 40, {"gpu": g, "nic": k}) for n, (c, g, k) in enumerate(rows)])


@given(room_lists, st.integers(1, 40), st.integers(1, 8), st.integers(0, 2), st.integers(0, 1),
       st.sampled_from(["block", "cyclic"]))
def test_a_plan_never_overfills_a_node_and_refuses_only_what_does_not_fit(nodes, tasks, cpus, gpus, nics,
                                                                         distribution):
    ask = RankAsk(tasks, cpus, devices={"gpu": gpus, "nic": nics}, distribution=distribution)
    room = {r.node: holds(r, ask) for r in nodes}
    try:
        plan = plan_ranks(ask, nodes)
    except PlanError as exc:
        assert sum(room.values()) < tasks
        assert str(exc).startswith(f"rank {sum(room.values())} of {tasks} fits on no NUMA node")
        return
    assert len(plan) == tasks
    for node, count in Counter(plan).items():
        assert count <= room[node]
        r = next(r for r in nodes if r.node == node)
        assert count * cpus <= r.cpus and count * gpus <= r.devices["gpu"] and count * nics <= r.devices["nic"]
    if distribution == "block":
        # consecutive ranks share a node, nodes in id order, each full before the next
        assert list(plan) == sorted(plan)
        used = sorted(set(plan))
        assert all(Counter(plan)[n] == room[n] for n in used[:-1])
        assert all(room[n] == 0 for n in room if n < used[-1] and n not in used)
    else:
        # cyclic: at every rank, no node holding fewer ranks so far had room left
        seen: Counter = Counter()
        for node in plan:
            assert all(seen[other] >= seen[node] or seen[other] >= room[other]
                       for other in room if other < node)
            seen[node] += 1


def test_cuda_indices_count_nvidia_gpus_in_pci_bus_order():
    devices = [
        {"address": "0000:c1:00.0", "vendor": "0x10de", "class": "0x030200"},
        {"address": "0000:3b:00.0", "vendor": "0x10de", "class": "0x030000"},
        {"address": "0000:3b:00.1", "vendor": "0x10de", "class": "0x040300"},  # the card's audio
        {"address": "0000:5e:00.0", "vendor": "0x15b3", "class": "0x020000"},  # a NIC
        {"address": "0000:86:00.0", "vendor": "0x10DE", "class": "0x030200"},
    ]
    assert cuda_indices(["0000:86:00.0"], devices) == [1]
    assert cuda_indices(["0000:C1:00.0", "0000:3b:00.0"], devices) == [2, 0]
    assert cuda_indices(["0000:5e:00.0"], devices) == []
