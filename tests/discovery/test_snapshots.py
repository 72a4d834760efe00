"""Discovery against the 14 real-machine snapshots and their EXPECTED.json."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.names import is_pci_address
from numa_agent.core.topology import UNKNOWN_NODE
from numa_agent.discovery.sysfs import read_topology

ARCHIVES = sorted((Path(__file__).parents[1] / "fixtures" / "sysfs").glob("*.tar.gz"))
NAMES = [p.name[: -len(".tar.gz")] for p in ARCHIVES]


@pytest.fixture(scope="module")
def discovered(snapshot):
    cache = {}

    def get(name):
        if name not in cache:
            root, expected = snapshot(name)
            cache[name] = (read_topology(root), expected)
        return cache[name]

    return get


def _cs(text: str) -> CpuSet:
    return CpuSet.parse(text)


def _kib(text: str) -> int:
    """EXPECTED.json's cache sizes are the kernel's text, "32K": KiB."""
    assert text.endswith("K"), text
    return int(text[:-1]) << 10


def test_all_fourteen_snapshots_are_covered():
    assert len(NAMES) == 14


@pytest.mark.parametrize("name", NAMES)
def test_numa_nodes(discovered, name):
    topo, exp = discovered(name)
    assert list(topo.node_ids) == exp["numa"]["node_ids"]
    for node_id, facts in exp["numa"]["nodes"].items():
        node = topo.node(int(node_id))
        assert node.cpus == _cs(facts["cpulist"]), node_id
        assert node.memory_total_bytes == facts["MemTotal_bytes"], node_id
        assert topo.node_cpus(node.id) == _cs(facts["online_cpus"]), node_id
        pools = {f"hugepages-{h.size_kb}kB": (h.total, h.free) for h in node.hugepages}
        expected_pools = {k: (v["nr_hugepages"], v["free_hugepages"])
                          for k, v in (facts.get("hugepages") or {}).items()}
        assert pools == expected_pools, node_id


@pytest.mark.parametrize("name", NAMES)
def test_distance_rows(discovered, name):
    topo, exp = discovered(name)
    for node_id, facts in exp["numa"]["nodes"].items():
        node = topo.node(int(node_id))
        row = facts.get("distance")
        if row is None:
            assert node.distances == {}
            continue
        assert [node.distances[k] for k in sorted(node.distances)] == row
        assert node.distances[node.id] == 10


def test_distance_row_longer_than_node_dirs_maps_to_possible_nodes(discovered):
    # node0 was removed by hand but node1's row still has two entries; the
    # row is indexed by node/possible (0-1), so node1's own distance is 10.
    topo, _ = discovered("intel-haswell-2s-offline-cpus-node0")
    assert topo.node(1).distances == {0: 21, 1: 10}
    assert topo.distance(1, 1) == 10


@pytest.mark.parametrize("name", NAMES)
def test_online_cpus_packages_and_cores(discovered, name):
    topo, exp = discovered(name)
    assert topo.online_cpus == _cs(exp["online_cpus"])
    t = exp["topology"]
    assert {str(p): cpus.format() for p, cpus in topo.packages.items()} == t["packages"]["cpus"]
    assert len(topo.cores) == t["cores"]
    histogram = collections.Counter(str(len(core)) for core in topo.cores)
    assert dict(histogram) == t["threads_per_core_histogram"]
    assert [core.format() for core in topo.cores] == t["core_cpu_groups"]
    # `core` is the lowest CPU of the sibling group, for every online CPU.
    for cpu in topo.cpus:
        if cpu.online:
            assert cpu.id in cpu.siblings and cpu.core == cpu.siblings.min()


@pytest.mark.parametrize("name", NAMES)
def test_dies_and_clusters(discovered, name):
    topo, exp = discovered(name)
    for level, attr in (("dies", "die"), ("clusters", "cluster")):
        facts = exp["topology"][level]
        groups = collections.defaultdict(set)
        for cpu in topo.cpus:
            if cpu.online and getattr(cpu, attr) is not None:
                groups[f"{cpu.package}/{getattr(cpu, attr)}"].add(cpu.id)
        got = {k: CpuSet(v).format() for k, v in groups.items()}
        assert got == (facts["cpus"] if facts else {}), level


@pytest.mark.parametrize("name", NAMES)
def test_l3_groups(discovered, name):
    topo, exp = discovered(name)
    l3 = (exp["caches"] or {}).get("L3")
    expected = sorted(g["cpus"] for g in l3["groups"]) if l3 else []
    assert sorted(g.format() for g in topo.l3_groups.values()) == expected
    for index, cpus in topo.l3_groups.items():
        assert index in cpus or index < cpus.min()  # lowest CPU of the shared set


@pytest.mark.parametrize("name", NAMES)
def test_caches_per_level(discovered, name):
    # EXPECTED.json counts the instances used by online CPUs, their sizes
    # and, for some levels, every group; ia64 has no cache directories.
    topo, exp = discovered(name)
    by_name: dict[str, list] = {}
    for cache in topo.caches:
        by_name.setdefault(cache.name, []).append(cache)
    expected = exp["caches"] or {}
    assert set(by_name) == set(expected)
    for level, facts in expected.items():
        got = by_name[level]
        assert len(got) == facts["count"], level
        assert {c.size_bytes for c in got} == {_kib(s) for s in facts["sizes"]}, level
        assert {len(c.cpus) for c in got} == set(facts["cpus_per_instance"]), level
        if "groups" in facts:
            assert sorted((c.cpus.format(), c.size_bytes) for c in got) == \
                sorted((g["cpus"], _kib(g["size"])) for g in facts["groups"]), level
    assert {c.id: c.cpus for c in topo.caches if c.level == 3} == topo.l3_groups


def test_caches_of_a_cpu_on_amd_snc_and_arm(discovered):
    clx, _ = discovered("intel-clx-2s-ht-snc2-4numa")  # SNC: one L3 per package over two nodes
    assert [(c.name, c.size_bytes, c.cpus.format()) for c in clx.cpu_caches(0)] == [
        ("L1d", 32 << 10, "0,40"), ("L2", 1 << 20, "0,40"),
        ("L3", 28160 << 10, ",".join(str(i) for i in range(0, 80, 2)))]
    amd, _ = discovered("amd-magnycours-4s-8numa-sparse-ids")
    assert {(c.name, c.size_bytes) for c in amd.caches} == {
        ("L1d", 64 << 10), ("L2", 512 << 10), ("L3", 5118 << 10)}
    arm, _ = discovered("arm64-kunpeng920-2s-4numa-clusters")
    assert [c.cpus.format() for c in arm.caches if c.level == 3][:2] == ["0-31", "32-63"]
    ia64, _ = discovered("ia64-superdome-64s-17numa-cpuless")
    assert ia64.caches == () and ia64.cpu_caches(0) == ()


@pytest.mark.parametrize("name", NAMES)
def test_restriction(discovered, name):
    topo, exp = discovered(name)
    r = exp["restriction"] or {}
    if "allowed_cpus" in r:
        assert topo.allowed_cpus == _cs(r["allowed_cpus"])
        assert topo.allowed_mems == frozenset(_cs(r["allowed_mems"]).ids())
    else:
        assert topo.allowed_cpus is None and topo.allowed_mems is None


def test_cgroup2_restriction_limits_usable_cpus(discovered):
    topo, _ = discovered("amd-magnycours-4s-8numa-cgroup2")
    assert topo.usable_cpus == _cs("0-5")
    assert topo.usable_node_ids == (0, 1, 2, 3, 4, 5)


def _expected_node_from_local_cpus(exp, local: CpuSet):
    """Independent of discovery: the one node (by EXPECTED online cpus) holding
    every online CPU of `local`."""
    online = _cs(exp["online_cpus"])
    hits = {int(n) for n, f in exp["numa"]["nodes"].items() if _cs(f["online_cpus"]) & local & online}
    covered = CpuSet()
    for n in hits:
        covered |= _cs(exp["numa"]["nodes"][str(n)]["online_cpus"])
    if len(hits) == 1 and (local & online).issubset(covered):
        return hits.pop()
    return UNKNOWN_NODE


@pytest.mark.parametrize("name", NAMES)
def test_pci_devices(discovered, name):
    topo, exp = discovered(name)
    expected = (exp["pci"] or {"devices": []})["devices"]
    assert [d.address for d in topo.pci_devices] == sorted(d["bdf"] for d in expected)
    for facts in expected:
        dev = topo.device(facts["bdf"])
        assert dev.pci_class == facts["class"]
        assert dev.vendor == facts.get("vendor", "")
        assert dev.device == facts.get("device", "")
        assert dev.driver == facts.get("driver")
        assert dev.net == tuple(facts.get("net", ()))
        assert dev.infiniband == tuple(facts.get("infiniband", ()))
        raw = facts.get("numa_node")
        if raw is not None and raw >= 0:
            assert (dev.numa_node, dev.numa_node_source) == (raw, "numa_node")
            continue
        local = _cs(facts["local_cpulist"]) if "local_cpulist" in facts else _cs(facts["local_cpus_mask_as_list"])
        assert dev.local_cpus == local
        derived = _expected_node_from_local_cpus(exp, local)
        assert dev.numa_node == derived
        assert dev.numa_node_source == ("local_cpulist" if derived != UNKNOWN_NODE else "unknown")


def test_nvme_with_numa_node_minus_one_is_placed_by_local_cpulist(discovered):
    topo, _ = discovered("intel-snb-2s-2numa-pci-nvme-nic")
    nvme = topo.device("0000:00:02.0")
    assert nvme.driver == "nvme" and nvme.block == ("nvme0n1",)
    assert (nvme.numa_node, nvme.numa_node_source) == (0, "local_cpulist")
    # Uncore devices list every CPU: no single node, so they stay unknown.
    sources = collections.Counter(d.numa_node_source for d in topo.pci_devices)
    assert sources == {"numa_node": 44, "local_cpulist": 1, "unknown": 92}
    ib = [d for d in topo.pci_devices if d.infiniband]
    assert [d.infiniband for d in ib] == [("mlx4_0",)]
    mic = [d for d in topo.pci_devices if any(c.startswith("mic/") for c in d.other_children)]
    assert len(mic) == 1


def test_power9_gpus_without_numa_node_file_follow_their_local_cpus(discovered):
    topo, exp = discovered("power9-2s-smt4-gpu-numa-nodes")
    # hwloc (default run) puts these GPUs next to nodes 0 and 8 too.
    hwloc = exp["hwloc_crosscheck"]["outputs"]["nvidiagpunumanodes.console"]["summary"]["pci"]
    for dev in topo.pci_devices:
        assert dev.vendor == "" and dev.device == ""  # bare entries: class + local_cpus only
        assert dev.numa_node_source == "local_cpulist"
        assert [dev.numa_node] == hwloc[dev.address]["locality_numa_nodes"]


def test_westmere_forced_locality_is_not_followed(discovered):
    # The hwloc test forces buses 0000:40-46 next to the 2nd package (nodes
    # 1 and 3) through an environment variable; sysfs says 0000:43:00.0 is on
    # node 2, and discovery trusts sysfs. Every other device has numa_node -1
    # and a local_cpulist naming all 40 CPUs: unknown.
    topo, exp = discovered("intel-westmere-ex-4s-4numa-pci-no-numa-node")
    hwloc_check = [c for c in exp["hwloc_crosscheck"]["checks"] if c["what"].startswith("PCI")][0]
    assert "0000:43:00.0 numa_node sysfs=2" in hwloc_check["note"]
    dev = topo.device("0000:43:00.0")
    assert (dev.numa_node, dev.numa_node_source) == (2, "numa_node")
    others = [d for d in topo.pci_devices if d.address != "0000:43:00.0"]
    assert len(others) == 36
    assert all((d.numa_node, d.numa_node_source) == (-1, "unknown") for d in others)


def test_skx_sriov_capable_nics_and_vector_engines(discovered):
    topo, _ = discovered("intel-skx-2s-ht-2numa-pci-nec-ve")
    pf = topo.device("0000:60:00.0")
    assert pf.sriov_totalvfs is not None and pf.sriov_numvfs is not None
    assert pf.net and pf.virtfns == () and pf.physfn is None
    ve = [c for d in topo.pci_devices for c in d.other_children if c.startswith("ve/")]
    assert sorted(ve) == [f"ve/ve{i}" for i in range(8)]


def test_pci_paths_follow_the_kernels_links_down_to_the_parent(discovered):
    topo, _ = discovered("intel-skx-2s-ht-2numa-pci-nec-ve")
    # A ConnectX (0x0207) and five vector engines behind one switch under each of two
    # host bridges of node 0, each behind its own downstream port.
    hca = topo.device("0000:3e:00.0")
    assert hca.pci_path == ("pci0000:3a", "0000:3a:00.0", "0000:3b:00.0", "0000:3c:08.0")
    assert hca.pci_root == "pci0000:3a"
    assert topo.device("0000:3a:00.0").pci_path == ("pci0000:3a",)  # a root port
    assert topo.device("0000:1a:00.0").pci_root == "pci0000:17"
    snb, _ = discovered("intel-snb-2s-2numa-pci-nvme-nic")
    assert snb.device("0000:05:00.0").pci_path == ("pci0000:00", "0000:00:1c.0", "0000:04:00.0")
    assert snb.device("0000:82:00.0").pci_path == ("pci0000:80", "0000:80:02.2")


def test_plain_device_directories_have_no_pci_path(discovered):
    topo, _ = discovered("power9-2s-smt4-gpu-numa-nodes")  # captured without the links
    assert topo.pci_devices and all(d.pci_path == () and d.pci_root is None for d in topo.pci_devices)


@pytest.mark.parametrize("name", NAMES)
def test_pci_paths_agree_with_the_bridges_above(discovered, name):
    topo, _ = discovered(name)
    addresses = {d.address for d in topo.pci_devices}
    for dev in topo.pci_devices:
        if not dev.pci_path:
            continue
        domain = dev.address.split(":")[0]
        assert dev.pci_root is not None and dev.pci_root.startswith(f"pci{domain}:")
        assert all(is_pci_address(p) for p in dev.pci_path[1:])
        parent = dev.pci_path[-1]
        if parent in addresses:  # a bridge the snapshot holds: its own path leads to it
            assert topo.device(parent).pci_path + (parent,) == dev.pci_path


def test_bulldozer_compute_units_count_as_smt_siblings(discovered):
    # Linux reports the two integer cores of a compute unit as thread
    # siblings; discovery follows sysfs (32 x 2), hwloc reports 64 x 1.
    topo, exp = discovered("amd-bulldozer-4s-8numa")
    assert len(topo.cores) == 32 and all(len(c) == 2 for c in topo.cores)
    assert exp["topology"]["threads_per_core_histogram"] == {"2": 32}


def test_magnycours_counts_cores_by_sibling_sets_not_core_id(discovered):
    topo, exp = discovered("amd-magnycours-4s-8numa-sparse-ids")
    assert exp["topology"]["cores_by_unique_package_die_core_id"] == 24
    assert len(topo.cores) == 48
    assert len({(c.package, c.core_id) for c in topo.cpus}) == 24
    assert topo.node_ids == (0, 1, 2, 33, 34, 45, 72, 73)


def test_haswell_offline_cpu0_and_cpus_in_no_node(discovered):
    topo, _ = discovered("intel-haswell-2s-offline-cpus-node0")
    assert not topo.cpu(0).online  # cpu0/online exists and says 0
    assert topo.node_ids == (1,)
    nodeless = CpuSet(c.id for c in topo.cpus if c.online and c.numa_node == UNKNOWN_NODE)
    assert nodeless == _cs("4,6,8,10,12,14,16,18,20")  # their node0 links dangle
    assert topo.usable_cpus == _cs("5,7,9,11,13,15,17,19")


def test_power9_cpuless_nodes_and_cpus_without_directories(discovered):
    topo, _ = discovered("power9-2s-smt4-gpu-numa-nodes")
    assert [n.id for n in topo.numa_nodes if not n.cpus] == [250, 251, 252, 253, 254, 255]
    assert topo.distance(0, 8) == 40 and topo.distance(0, 250) == 80
    # node0's cpulist names 16-87 although they have no cpu directory.
    assert not topo.cpu(16).online and topo.cpu(16).numa_node == 0
    assert {c.package for c in topo.cpus if c.online} == {0, 8}


def test_arm64_nul_bytes_ppt_offsets_and_clusters(discovered):
    topo, _ = discovered("arm64-kunpeng920-2s-4numa-clusters")
    assert set(topo.packages) == {36, 8442}
    assert topo.cpu(0).die == -1 and topo.cpu(0).cluster == 138
    assert topo.cpu(5).siblings == CpuSet([5])
    assert (topo.architecture, topo.kernel) == ("aarch64", "5.15.0-rc1-00005-g4c1b4a4d90b6-dirty")


def test_ia64_hex_masks_and_empty_online_files(discovered):
    topo, _ = discovered("ia64-superdome-64s-17numa-cpuless")
    assert len(topo.online_cpus) == 128
    assert topo.node(16).cpus == CpuSet() and topo.node(16).memory_total_bytes > 0
    assert topo.architecture == "ia64"


def test_old_xeon_offline_cpus_without_topology(discovered):
    topo, _ = discovered("intel-xeon-4s-ht-offline-cpus-uma")
    offline = [c for c in topo.cpus if not c.online]
    assert [c.id for c in offline] == [2, 5, 13, 14]
    assert all(c.package is None for c in offline)
    assert topo.node(0).cpus == _cs("0-15")  # the cpumap still lists them


@pytest.mark.parametrize("name", NAMES)
def test_platform(discovered, name):
    topo, exp = discovered(name)
    assert topo.architecture == exp["machine"]["architecture"]
    if topo.kernel is not None:
        assert topo.kernel == exp["machine"]["kernel"]


def test_live_machine():
    topo = read_topology("/")
    assert len(topo.numa_nodes) >= 1
    assert len(topo.online_cpus) >= 1
    # The kernel links every sys/bus/pci/devices entry into sys/devices below a host bridge.
    for dev in topo.pci_devices:
        assert dev.pci_root is not None, dev.address
