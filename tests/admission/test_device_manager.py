"""Device manager, static policy: selectors, inventory, hints with the
kubelet's rules, distance-ordered allocation."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.admission.device_manager import (
    DeviceAllocationError,
    DeviceConfigError,
    DeviceInventory,
    DeviceResource,
    DeviceSelector,
    InventoryDevice,
    allocate_devices,
    allocate_request_devices,
    device_hints,
    device_refusal_reason,
    pci_closeness,
    resolve_inventory,
)
from numa_agent.core.hints import NumaMask, TopologyHint
from numa_agent.core.topology import PciDevice
from numa_agent.discovery.sysfs import read_topology
from tests.support.synthetic import make_topology

GPU = ("0x030200", "0x10de", "0x20b0", None, "nvidia")


def gpu(node):
    cls, vendor, dev, _, driver = GPU
    return (cls, vendor, dev, node, driver)


def machine(gpu_nodes, extra=(), sockets=2, nodes_per_socket=2):
    """Four nodes by default: {0,1} on socket 0, {2,3} on socket 1 (distance 12
    within a socket, 21 across). GPUs get addresses 0000:01:00.0, 02, ... in order."""
    return make_topology(sockets=sockets, nodes_per_socket=nodes_per_socket, cores_per_node=1,
                         devices=[gpu(n) for n in gpu_nodes] + list(extra))


GPU_RESOURCE = DeviceResource("gpu", DeviceSelector(vendor="0x10de", class_prefixes=("0x0302", "0x0300")))


def inventory(gpu_nodes, **kw):
    return resolve_inventory(machine(gpu_nodes, **kw), [GPU_RESOURCE])


def addr(i):
    """Address of the i-th synthetic device (0-based)."""
    return f"0000:{i + 1:02x}:00.0"


def listed(hintset):
    return [(h.mask.nodes() if h.mask else None, h.preferred) for h in hintset.hints()]


# --------------------------------------------------------------- selectors


def pci(address="0000:3b:00.0", cls="0x030200", vendor="0x10de", device="0x20b0", driver="nvidia", node=0):
    return PciDevice(address=address, pci_class=cls, vendor=vendor, device=device,
                     numa_node=node, driver=driver)


def test_selector_criteria_all_must_match_case_insensitively():
    d = pci()
    assert DeviceSelector(vendor="10DE").matches(d)
    assert DeviceSelector(vendor="0x10de", device="20B0", driver="nvidia").matches(d)
    assert DeviceSelector(class_prefixes=("0x0300", "0302")).matches(d)
    assert DeviceSelector(addresses=("0000:3B:00.0",)).matches(d)
    assert not DeviceSelector(vendor="0x10de", driver="vfio-pci").matches(d)
    assert not DeviceSelector(class_prefixes=("0x0200",)).matches(d)
    assert not DeviceSelector(device="0x20b1").matches(d)
    assert not DeviceSelector(addresses=("0000:3b:00.1",)).matches(d)


def test_bridges_never_match():
    bridge = pci(cls="0x060400", vendor="0x8086", device="0x2030", driver="pcieport")
    host = pci(cls="0x060000", vendor="0x8086", device="0x2020", driver=None)
    for d in (bridge, host):
        assert not DeviceSelector(vendor="0x8086").matches(d)
        assert not DeviceSelector(addresses=(d.address,)).matches(d)


@pytest.mark.parametrize("name", ["gpu", "nic", "nvme", "vendor.com/x", "a", "sriov-nic", "x" * 63])
def test_valid_resource_names(name):
    assert DeviceResource(name, DeviceSelector(vendor="0x10de")).name == name


@pytest.mark.parametrize("name", ["", "GPU", "-gpu", "gpu-", "gpu/", "gpu nic", "x" * 64, "gpu_1"])
def test_invalid_resource_names(name):
    with pytest.raises(DeviceConfigError, match=f"invalid device resource name {name!r}"):
        DeviceResource(name, DeviceSelector(vendor="0x10de"))


def test_empty_selector_is_refused():
    with pytest.raises(DeviceConfigError, match="device resource 'gpu' has an empty selector"):
        DeviceResource("gpu", DeviceSelector())


# --------------------------------------------------------------- inventory


def test_inventory_groups_devices_by_resource_sorted_by_address():
    nic = ("0x020000", "0x8086", "0x1592", 3, "ice")
    bridge = ("0x060400", "0x10de", "0x1234", 0, "pcieport")
    topo = machine([1, -1, 0], extra=[nic, bridge])
    inv = resolve_inventory(topo, [
        DeviceResource("nic", DeviceSelector(class_prefixes=("0x0200",))),
        GPU_RESOURCE,
        DeviceResource("nvme", DeviceSelector(class_prefixes=("0x0108",))),
    ])
    assert inv.names == ("gpu", "nic", "nvme")
    assert inv.devices("gpu") == (
        InventoryDevice(addr(0), 1), InventoryDevice(addr(1), -1), InventoryDevice(addr(2), 0))
    assert inv.devices("nic") == (InventoryDevice(addr(3), 3),)
    assert inv.devices("nvme") == () and inv.has("nvme")
    assert not inv.has("fpga") and inv.devices("fpga") == ()


def test_device_selected_twice_is_a_config_error():
    topo = machine([0, 1])
    both = [GPU_RESOURCE, DeviceResource("accel", DeviceSelector(addresses=(addr(1),)))]
    with pytest.raises(DeviceConfigError, match=(
            r"PCI device 0000:02:00.0 is selected by both 'accel' and 'gpu'; narrow one of the selectors")):
        resolve_inventory(topo, both)


def test_resource_configured_twice_is_a_config_error():
    with pytest.raises(DeviceConfigError, match="device resource 'gpu' is configured twice"):
        resolve_inventory(machine([0]), [GPU_RESOURCE, GPU_RESOURCE])


# ------------------------------------------------------------------- hints


def test_hints_prefer_the_narrowest_mask_counting_all_devices():
    inv = inventory([0, 0, 1, 2])
    hs = device_hints(inv, {}, "gpu", 2, [0, 1, 2, 3])
    assert listed(hs)[:4] == [((0,), True), ((0, 1), False), ((0, 2), False), ((0, 3), False)]
    assert ((1, 2), False) in listed(hs) and ((1, 3), False) not in listed(hs)
    # One GPU of node 0 in use: node 0 alone no longer fits, but one node is still the
    # preferred size (it could hold two), so no hint is preferred.
    busy = {"gpu": frozenset({addr(0)})}
    hs = device_hints(inv, busy, "gpu", 2, [0, 1, 2, 3])
    assert [m for m, p in listed(hs) if p] == []
    assert listed(hs)[:3] == [((0, 1), False), ((0, 2), False), ((1, 2), False)]


def test_hints_over_a_subset_of_nodes_ignore_devices_elsewhere():
    inv = inventory([0, 2, 2])
    assert listed(device_hints(inv, {}, "gpu", 2, [0, 1])) == []
    assert device_hints(inv, {}, "gpu", 2, [0, 1]).kind == "impossible"
    assert listed(device_hints(inv, {}, "gpu", 2, [2, 3])) == [((2,), True), ((2, 3), False)]


def test_zero_devices_is_no_preference_and_negative_is_an_error():
    inv = inventory([0])
    assert device_hints(inv, {}, "gpu", 0, [0, 1]).kind == "none"
    assert device_hints(inv, {}, "fpga", 0, [0, 1]).kind == "none"
    with pytest.raises(ValueError, match="device count for 'gpu' must be >= 0, got -1"):
        device_hints(inv, {}, "gpu", -1, [0, 1])
    with pytest.raises(ValueError, match="device count for 'gpu' must be >= 0, got -1"):
        allocate_devices(inv, {}, "gpu", -1, None, {})


def test_resource_without_any_known_node_has_no_preference():
    inv = inventory([-1, -1])
    assert device_hints(inv, {}, "gpu", 2, [0, 1]).kind == "none"
    assert device_refusal_reason(inv, {}, "gpu", 2, [0, 1]) is None


def test_unknown_node_devices_never_count_towards_a_mask():
    # The kubelet's rule: one device with a known node makes the resource care about
    # alignment, and devices without one are outside every mask.
    inv = inventory([0, -1])
    assert listed(device_hints(inv, {}, "gpu", 1, [0, 1])) == [((0,), True), ((0, 1), False)]
    hs = device_hints(inv, {}, "gpu", 2, [0, 1])
    assert hs.kind == "impossible"
    assert device_refusal_reason(inv, {}, "gpu", 2, [0, 1]) == (
        "gpu: requested 2 devices, only 1 free devices have a NUMA node among {0,1} "
        "(1 free devices have no known NUMA node)")


@pytest.mark.parametrize("resource, count, allocated, reason", [
    ("fpga", 1, {}, "unknown device resource 'fpga' (known: gpu)"),
    ("gpu", 4, {}, "gpu: requested 4 devices, the machine has 3"),
    ("gpu", 2, {"gpu": frozenset({addr(0), addr(2)})}, "gpu: requested 2 devices, 1 of 3 are free"),
])
def test_impossible_requests_have_a_reason(resource, count, allocated, reason):
    inv = inventory([0, 1, 1])
    assert device_hints(inv, allocated, resource, count, [0, 1, 2, 3]).kind == "impossible"
    assert device_refusal_reason(inv, allocated, resource, count, [0, 1, 2, 3]) == reason
    assert device_refusal_reason(inv, allocated, resource, count) == reason
    with pytest.raises(DeviceAllocationError):
        allocate_devices(inv, allocated, resource, count, None, {})


def test_refusal_reason_is_none_when_hints_exist():
    inv = inventory([0, 1, 1])
    assert device_refusal_reason(inv, {}, "gpu", 3) is None
    assert device_refusal_reason(inv, {}, "gpu", 0) is None


def test_hints_scale_to_64_nodes():
    topo = make_topology(sockets=64, cores_per_node=1, threads_per_core=1,
                         devices=[gpu(n) for n in (5, 9, 9, 40)])
    inv = resolve_inventory(topo, [GPU_RESOURCE])
    hs = device_hints(inv, {}, "gpu", 3, range(64))
    assert hs.kind == "generated" and hs.min_size == 2
    assert hs.fits(NumaMask([5, 9])) and hs.fits(NumaMask([9, 40]))
    assert not hs.fits(NumaMask([5, 40]))


# -------------------------------------------------------------- allocation


def test_devices_inside_the_affinity_first_lowest_address_first():
    inv = inventory([1, 0, 0, 0])
    assert allocate_devices(inv, {}, "gpu", 2, NumaMask([0]), {}) == (addr(1), addr(2))
    busy = {"gpu": frozenset({addr(1)})}
    assert allocate_devices(inv, busy, "gpu", 2, NumaMask([0]), {}) == (addr(2), addr(3))


def test_fallback_goes_to_the_closest_node_then_to_unknown_nodes():
    # Node 0's neighbours: node 1 (same socket, 12), nodes 2 and 3 (21).
    topo = machine([3, 2, 1, -1, 0])
    inv = resolve_inventory(topo, [GPU_RESOURCE])
    pick = lambda n: allocate_devices(inv, {}, "gpu", n, NumaMask([0]), topo.distance)
    assert pick(1) == (addr(4),)
    assert pick(2) == (addr(2), addr(4))  # node 1 is the closest
    assert pick(3) == (addr(0), addr(2), addr(4))  # nodes 3 and 2 tie at 21: lower address
    assert pick(5) == tuple(addr(i) for i in range(5))  # the unknown-node device last


def test_distance_can_be_a_mapping_and_ties_use_the_sum_over_the_mask():
    inv = inventory([2, 3])
    distances = {0: {0: 10, 1: 20, 2: 30, 3: 30}, 1: {0: 20, 1: 10, 2: 40, 3: 30},
                 2: {0: 30, 1: 40, 2: 10, 3: 20}, 3: {0: 30, 1: 30, 2: 20, 3: 10}}
    # Both GPUs are 30 away from node 0; the one on node 3 is closer to node 1.
    assert allocate_devices(inv, {}, "gpu", 1, NumaMask([0, 1]), distances) == (addr(1),)


def test_without_affinity_known_nodes_by_address_then_unknown():
    inv = inventory([-1, 3, 1])
    assert allocate_devices(inv, {}, "gpu", 2, None, {}) == (addr(1), addr(2))


def test_not_enough_free_devices_lists_the_free_ones():
    inv = inventory([0, -1, 1])
    busy = {"gpu": frozenset({addr(0)})}
    with pytest.raises(DeviceAllocationError) as err:
        allocate_devices(inv, busy, "gpu", 3, NumaMask([0]), {})
    assert str(err.value) == ("gpu: requested 3 devices, 2 of 3 are free "
                              "(0000:02:00.0 on node unknown, 0000:03:00.0 on node 1)")
    with pytest.raises(DeviceAllocationError, match=r"unknown device resource 'nic' \(known: gpu\)"):
        allocate_devices(inv, {}, "nic", 1, None, {})
    assert allocate_devices(inv, {}, "nic", 0, None, {}) == ()


# -------------------------------------------------------------- properties


def reference_hints(inv, allocated, resource, count, nodes):
    """The kubelet's generator written the obvious way."""
    devices = inv.devices(resource)
    free = [d for d in devices if d.address not in allocated.get(resource, frozenset())]
    min_size = len(nodes)
    out = []
    for k in range(1, len(nodes) + 1):
        for combo in combinations(nodes, k):
            if sum(d.numa_node in combo for d in devices) >= count:
                min_size = min(min_size, k)
            if sum(d.numa_node in combo for d in free) >= count:
                out.append(combo)
    return [TopologyHint(NumaMask(c), len(c) == min_size) for c in out]


@settings(max_examples=80, deadline=None)
@given(
    gpu_nodes=st.lists(st.sampled_from([-1, 0, 1, 2, 3]), min_size=1, max_size=8),
    steps=st.lists(st.tuples(st.integers(0, 4), st.none() | st.sets(st.integers(0, 3), min_size=1),
                             st.booleans()), max_size=6),
)
def test_property_hints_match_reference_and_allocation_takes_only_free_devices(gpu_nodes, steps):
    topo = machine(gpu_nodes)
    inv = resolve_inventory(topo, [GPU_RESOURCE])
    nodes = [0, 1, 2, 3]
    initial = device_hints(inv, {}, "gpu", 1, nodes).hints()
    live: list[tuple[str, ...]] = []
    in_use: frozenset[str] = frozenset()
    for count, affinity, release_first in steps:
        if release_first and live:
            in_use = in_use - set(live.pop(0))
        allocated = {"gpu": in_use}
        hs = device_hints(inv, allocated, "gpu", count, nodes)
        reason = device_refusal_reason(inv, allocated, "gpu", count, nodes)
        known = [d for d in inv.devices("gpu") if d.numa_node >= 0]
        if count == 0 or (not known and reason is None):
            assert hs.kind == "none"
        elif reason is not None:
            assert hs.kind == "impossible"
        else:
            assert hs.hints() == reference_hints(inv, allocated, "gpu", count, nodes)
        free = len(inv.devices("gpu")) - len(in_use)
        mask = None if affinity is None else NumaMask(affinity)
        if count > free:
            with pytest.raises(DeviceAllocationError):
                allocate_devices(inv, allocated, "gpu", count, mask, topo.distance)
            continue
        got = allocate_devices(inv, allocated, "gpu", count, mask, topo.distance)
        assert len(set(got)) == count and not set(got) & in_use
        assert set(got) <= {d.address for d in inv.devices("gpu")}
        if mask is not None:
            inside = [d.address for d in inv.devices("gpu")
                      if d.numa_node in mask.nodes() and d.address not in in_use]
            assert set(inside[:count]) <= set(got)  # affinity devices are taken first
        in_use = in_use | set(got)
        live.append(got)
    # Releasing every allocation restores the first hints.
    for got in live:
        in_use = in_use - set(got)
    assert in_use == frozenset()
    assert device_hints(inv, {"gpu": in_use}, "gpu", 1, nodes).hints() == initial


# ------------------------------------------------------------- PCI closeness

NIC_RESOURCE = DeviceResource("nic", DeviceSelector(class_prefixes=("0x0200",)))
ROOT_A = ("pci0000:00", "0000:00:01.0")  # a root port under host bridge A
ROOT_B = ("pci0000:80", "0000:80:01.0")


def placed(address, cls, node, path):
    vendor = "0x10de" if cls.startswith("0x03") else "0x8086"
    return PciDevice(address=address, pci_class=cls, vendor=vendor, device="0x0001", numa_node=node,
                     pci_path=path)


def two_roots_node():
    """Node 0 holds two GPUs and two NICs under two host bridges, the addresses in no
    order of their roots: GPU 01 and NIC 04 under A, GPU 02 and NIC 03 under B."""
    topo = machine([], extra=[placed("0000:01:00.0", "0x030200", 0, ROOT_A),
                              placed("0000:02:00.0", "0x030200", 0, ROOT_B),
                              placed("0000:03:00.0", "0x020000", 0, ROOT_B),
                              placed("0000:04:00.0", "0x020000", 0, ROOT_A)])
    return resolve_inventory(topo, [GPU_RESOURCE, NIC_RESOURCE])


def in_use(pairs):
    out: dict[str, frozenset[str]] = {}
    for resource, address in pairs:
        out[resource] = out.get(resource, frozenset()) | {address}
    return out


def test_pci_closeness_is_the_depth_of_the_deepest_common_ancestor():
    switch = ROOT_A + ("0000:01:00.0",)
    assert pci_closeness(switch + ("0000:02:08.0",), switch + ("0000:02:10.0",)) == 3  # one switch
    assert pci_closeness(ROOT_A + ("0000:01:00.0",), ROOT_A) == 2  # one root port
    assert pci_closeness(ROOT_A, ("pci0000:00", "0000:00:02.0")) == 1  # one host bridge
    assert pci_closeness(ROOT_A, ROOT_B) == 0
    assert pci_closeness((), ROOT_A) == 0  # unknown: as far as another host bridge


def test_each_admission_takes_the_nic_under_its_gpus_host_bridge():
    inv = two_roots_node()
    ask = {"gpu": 1, "nic": 1}
    first = allocate_request_devices(inv, {}, ask, NumaMask([0]), {})
    assert first == (("gpu", "0000:01:00.0"), ("nic", "0000:04:00.0"))  # both under A
    second = allocate_request_devices(inv, in_use(first), ask, NumaMask([0]), {})
    assert second == (("gpu", "0000:02:00.0"), ("nic", "0000:03:00.0"))  # both under B


def test_the_resource_with_fewer_choices_anchors_and_the_other_follows():
    inv = two_roots_node()
    # NIC 04 (A) went to a workload without a GPU: the one NIC left anchors under B.
    got = allocate_request_devices(inv, in_use([("nic", "0000:04:00.0")]), {"gpu": 1, "nic": 1},
                                   NumaMask([0]), {})
    assert got == (("gpu", "0000:02:00.0"), ("nic", "0000:03:00.0"))


def test_a_farther_nic_of_the_node_is_given_when_the_close_one_is_taken():
    inv = two_roots_node()
    busy = in_use([("gpu", "0000:01:00.0"), ("nic", "0000:03:00.0")])  # A's GPU, B's NIC
    got = allocate_request_devices(inv, busy, {"gpu": 1, "nic": 1}, NumaMask([0]), {})
    assert got == (("gpu", "0000:02:00.0"), ("nic", "0000:04:00.0"))  # B's GPU, A's NIC: no refusal


def test_the_numa_rule_decides_before_pci_closeness():
    # A NIC on node 1 under the GPU's very root port loses to node 0's NIC under another root.
    topo = machine([], extra=[placed("0000:01:00.0", "0x030200", 0, ROOT_A),
                              placed("0000:02:00.0", "0x020000", 1, ROOT_A),
                              placed("0000:03:00.0", "0x020000", 0, ROOT_B)])
    inv = resolve_inventory(topo, [GPU_RESOURCE, NIC_RESOURCE])
    got = allocate_request_devices(inv, {}, {"gpu": 1, "nic": 1}, NumaMask([0]), topo.distance)
    assert got == (("gpu", "0000:01:00.0"), ("nic", "0000:03:00.0"))


def test_the_first_gpu_goes_where_a_nic_is_free():
    # GPUs under B and A, NICs under A and C: the only aligned pair is A's.
    root_c = ("pci0000:c0", "0000:c0:01.0")
    topo = machine([], extra=[placed("0000:01:00.0", "0x030200", 0, ROOT_B),
                              placed("0000:02:00.0", "0x030200", 0, ROOT_A),
                              placed("0000:03:00.0", "0x020000", 0, root_c),
                              placed("0000:04:00.0", "0x020000", 0, ROOT_A)])
    inv = resolve_inventory(topo, [GPU_RESOURCE, NIC_RESOURCE])
    got = allocate_request_devices(inv, {}, {"gpu": 1, "nic": 1}, NumaMask([0]), {})
    assert got == (("gpu", "0000:02:00.0"), ("nic", "0000:04:00.0"))


def test_several_devices_of_one_resource_stay_behind_one_switch():
    switch = ROOT_A + ("0000:01:00.0",)
    ports = [switch + (f"0000:02:{p:02x}.0",) for p in (8, 16)]
    topo = machine([], extra=[placed("0000:03:00.0", "0x030200", 0, ports[0]),
                              placed("0000:04:00.0", "0x030200", 0, ROOT_B),
                              placed("0000:05:00.0", "0x030200", 0, ports[1])])
    inv = resolve_inventory(topo, [GPU_RESOURCE])
    assert allocate_devices(inv, {}, "gpu", 2, NumaMask([0]), {}) == ("0000:03:00.0", "0000:05:00.0")


def test_a_real_machine_pairs_each_hca_with_a_vector_engine_of_its_switch(snapshot):
    # Skylake-SP, node 0: under host bridges pci0000:17 and pci0000:3a, one switch each
    # with a ConnectX HCA (class 0x0207) and five NEC vector engines (0x0b40).
    root, _ = snapshot("intel-skx-2s-ht-2numa-pci-nec-ve")
    topo = read_topology(root)
    inv = resolve_inventory(topo, [DeviceResource("hca", DeviceSelector(class_prefixes=("0x0207",))),
                                   DeviceResource("ve", DeviceSelector(class_prefixes=("0x0b40",)))])
    ask = {"hca": 1, "ve": 1}
    booked: list[tuple[str, str]] = []
    for _ in range(2):
        got = allocate_request_devices(inv, in_use(booked), ask, NumaMask([0]), topo.distance)
        assert len({topo.device(a).pci_root for _, a in got}) == 1, got
        booked.extend(got)
    assert [a for r, a in booked if r == "hca"] == ["0000:1a:00.0", "0000:3e:00.0"]
    # Without PCI closeness the second admission's engine came from pci0000:17 (0000:1c:00.0).
    assert [a for r, a in booked if r == "ve"] == ["0000:1b:00.0", "0000:3d:00.0"]


def test_a_request_is_refused_in_name_order_and_never_for_pci_distance():
    inv = two_roots_node()
    busy = in_use([("gpu", "0000:01:00.0"), ("gpu", "0000:02:00.0"), ("nic", "0000:03:00.0"),
                   ("nic", "0000:04:00.0")])
    with pytest.raises(DeviceAllocationError, match=r"^gpu: requested 1 devices, 0 of 2 are free"):
        allocate_request_devices(inv, busy, {"nic": 1, "gpu": 1}, NumaMask([0]), {})
    with pytest.raises(DeviceAllocationError, match=r"unknown device resource 'fpga'"):
        allocate_request_devices(inv, {}, {"fpga": 1, "gpu": 1}, None, {})
    with pytest.raises(ValueError, match="device count for 'nic' must be >= 0, got -1"):
        allocate_request_devices(inv, {}, {"nic": -1}, None, {})
    assert allocate_request_devices(inv, busy, {"gpu": 0, "nic": 0}, None, {}) == ()


PATHS = st.sampled_from([(), ROOT_A, ROOT_B, ROOT_A + ("0000:01:00.0",),
                         ROOT_A + ("0000:01:00.0", "0000:02:08.0"), ROOT_A + ("0000:01:00.0", "0000:02:10.0"),
                         ("pci0000:00", "0000:00:02.0"), ("pci0000:c0",)])
DEVICES = st.lists(st.tuples(st.sampled_from(["gpu", "nic", "nvme"]), st.sampled_from([-1, 0, 1, 2, 3]), PATHS),
                   min_size=1, max_size=10)


def synthetic_inventory(devices, with_paths=True):
    groups: dict[str, list[InventoryDevice]] = {"gpu": [], "nic": [], "nvme": []}
    for i, (resource, node, path) in enumerate(devices):
        groups[resource].append(InventoryDevice(addr(i), node, path if with_paths else ()))
    return DeviceInventory(tuple((r, tuple(d)) for r, d in groups.items()))


def numa_rank(d, affinity, distance):
    """allocate_devices' NUMA order written out (its key without the address)."""
    near = affinity.nodes() if affinity else ()
    if d.numa_node < 0:
        return (2, 0, 0)
    if d.numa_node in near:
        return (0, 0, 0)
    if not near:
        return (1, 0, 0)
    gaps = [distance(d.numa_node, n) for n in near]
    return (1, min(gaps), sum(gaps))


@settings(max_examples=150, deadline=None)
@given(devices=DEVICES, taken=st.sets(st.integers(0, 9)),
       counts=st.fixed_dictionaries({"gpu": st.integers(0, 3), "nic": st.integers(0, 3), "nvme": st.integers(0, 2)}),
       affinity=st.none() | st.sets(st.integers(0, 3), min_size=1))
def test_property_pci_closeness_only_breaks_the_numa_rules_ties(devices, taken, counts, affinity):
    topo = machine([], sockets=2, nodes_per_socket=2)
    mask = None if affinity is None else NumaMask(affinity)
    inv = synthetic_inventory(devices)
    allocated = in_use((r, addr(i)) for i, (r, _, _) in enumerate(devices) if i in taken)
    free = {r: [d for d in inv.devices(r) if d.address not in allocated.get(r, frozenset())] for r in counts}
    if any(counts[r] > len(free[r]) for r in counts):
        with pytest.raises(DeviceAllocationError):
            allocate_request_devices(inv, allocated, counts, mask, topo.distance)
        return
    got = allocate_request_devices(inv, allocated, counts, mask, topo.distance)
    # Never refused, exactly what was asked, only free devices, each once.
    assert len(got) == len(set(got)) == sum(counts.values())
    rank = {d.address: numa_rank(d, mask, topo.distance) for r in counts for d in inv.devices(r)}
    for resource, count in counts.items():
        mine = [a for r, a in got if r == resource]
        assert len(mine) == count and set(mine) <= {d.address for d in free[resource]}
        # As many devices from each NUMA rank as the NUMA rule alone takes.
        alone = sorted(free[resource], key=lambda d: (rank[d.address], d.address))[:count]
        assert sorted(rank[a] for a in mine) == sorted(rank[d.address] for d in alone)
    # Where no device says where it sits, nothing changes: each resource by the NUMA
    # rule then the lowest address, as before.
    blind = synthetic_inventory(devices, with_paths=False)
    assert allocate_request_devices(blind, allocated, counts, mask, topo.distance) == tuple(sorted(
        (r, a) for r, c in counts.items() if c
        for a in allocate_devices(blind, allocated, r, c, mask, topo.distance)))


@settings(max_examples=150, deadline=None)
@given(devices=DEVICES, taken=st.sets(st.integers(0, 9)), affinity=st.sets(st.integers(0, 3), min_size=1))
def test_property_one_gpu_and_one_nic_are_as_close_as_any_equally_ranked_pair(devices, taken, affinity):
    topo = machine([], sockets=2, nodes_per_socket=2)
    mask = NumaMask(affinity)
    inv = synthetic_inventory(devices)
    allocated = in_use((r, addr(i)) for i, (r, _, _) in enumerate(devices) if i in taken)
    free = {r: [d for d in inv.devices(r) if d.address not in allocated.get(r, frozenset())]
            for r in ("gpu", "nic")}
    if not free["gpu"] or not free["nic"]:
        return
    got = dict(allocate_request_devices(inv, allocated, {"gpu": 1, "nic": 1}, mask, topo.distance))
    path = {d.address: d.pci_path for r in free for d in free[r]}

    def best_ranked(resource):
        ranks = {d.address: numa_rank(d, mask, topo.distance) for d in free[resource]}
        top = min(ranks.values())
        return [a for a, k in ranks.items() if k == top]

    gpus, nics = best_ranked("gpu"), best_ranked("nic")
    assert got["gpu"] in gpus and got["nic"] in nics
    closest = max(pci_closeness(path[g], path[n]) for g in gpus for n in nics)
    assert pci_closeness(path[got["gpu"]], path[got["nic"]]) == closest
