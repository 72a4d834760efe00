"""Machine shapes and the QEMU command derived from them (no guest is booted)."""

from dataclasses import replace
from pathlib import Path

import pytest
from vmharness.shapes import SHAPES, Node, ShapeError, get_shape, guest_address, guest_mac, qemu_args


def _args(shape, out_dir=None, guest=0):
    return qemu_args(shape, kernel=Path("/k/vmlinux"), initrd=Path("/k/initrd"), job_dir=Path("/j"),
                     out_dir=out_dir, guest=guest, net_dir=Path("/n") if shape.guests > 1 else None)


def _values(args, flag):
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shape_gives_a_consistent_qemu_command(name):
    shape = SHAPES[name]
    args = _args(shape)
    # per-node memory must add up to -m exactly, or QEMU refuses to start
    backends = [int(v.split("size=")[1].rstrip("M")) for v in _values(args, "-object")]
    assert sum(backends) == int(_values(args, "-m")[0].split(",")[0]) == shape.memory_mib
    assert _values(args, "-smp")[0].startswith(f"{shape.cpus},sockets={shape.sockets},")
    # QEMU wants a distance for every pair of nodes
    dists = {frozenset(v.split(",")[1:3]) for v in _values(args, "-numa") if v.startswith("dist,")}
    n = len(shape.nodes)
    assert len(dists) == n * (n - 1) // 2
    # devices outside the expander bridges must name pcie.0 explicitly
    for device in _values(args, "-device"):
        assert "bus=" in device, device
        bus = device.split("bus=")[1].split(",")[0]
        assert bus == "pcie.0" or bus.startswith(("pxb", "rp")), device
    assert "-accel" in args and _values(args, "-accel") == ["tcg"]
    assert "mount_tag=out" not in " ".join(args)


def test_out_share_is_added_only_when_asked():
    args = _args(SHAPES["2node"], out_dir=Path("/host/out"))
    assert "local,id=out,path=/host/out,security_model=none" in _values(args, "-fsdev")


def test_hotplug_memory_gives_slots_room_and_a_monitor_socket_in_the_job_folder():
    args = _args(SHAPES["2node"])
    assert _values(args, "-m") == ["2048,slots=2,maxmem=2560M"]
    assert _values(args, "-qmp") == ["unix:/j/qmp.sock,server=on,wait=off"]
    plain = _args(SHAPES["4node"])
    assert _values(plain, "-m") == ["2048"] and "-qmp" not in plain
    assert "-qmp" not in _args(SHAPES["systemd"])


@pytest.mark.parametrize("engine", ["podman", "slurm", "containerd"])
def test_the_engines_guests_are_the_2node_machine_without_dimm_slots(engine):
    shape = get_shape(engine)
    assert shape.name == engine and not shape.boots_systemd and shape.hotplug_mib == 0
    assert shape.expected_node_cpus() == SHAPES["2node"].expected_node_cpus()
    assert _values(_args(shape), "-m") == ["2048"] and "-qmp" not in _args(shape)


def test_expected_cpus_per_node_follow_socket_major_numbering():
    assert SHAPES["2node"].expected_node_cpus() == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert SHAPES["4node"].expected_node_cpus() == {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}
    assert SHAPES["cpuless"].expected_node_cpus() == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7), 2: ()}
    assert SHAPES["snc"].expected_node_cpus() == {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}
    assert SHAPES["2node"].cpu_location(5) == (1, 0, 0, 1)
    assert SHAPES["2node"].expected_device_nodes() == (1,)


def test_2node_matches_the_recipe_topology():
    args = _args(SHAPES["2node"])
    assert "cpu,node-id=1,socket-id=1" in _values(args, "-numa")
    assert "pxb-pcie,id=pxb0,bus_nr=128,numa_node=1,bus=pcie.0" in _values(args, "-device")
    assert any(d.startswith("nvme,bus=rp1") for d in _values(args, "-device"))
    assert "e1000e,id=nic1,bus=rp2" in _values(args, "-device")


def _netdev(value: str) -> dict[str, str]:
    kind, *pairs = value.split(",")
    return {"kind": kind, **dict(p.split("=", 1) for p in pairs)}


def test_the_two_guests_of_slurm2_are_joined_by_unix_sockets_and_nothing_else():
    shape = SHAPES["slurm2"]
    assert shape.guests == 2
    ends = []
    for guest in (0, 1):
        args = _args(shape, guest=guest)
        (netdev,) = _values(args, "-netdev")
        fields = _netdev(netdev)
        # A datagram link whose two ends are unix sockets in the run's private folder: no
        # address of any IP network, loopback included, so nothing can leave the host.
        assert fields == {"kind": "dgram", "id": "link0", "local.type": "unix", "local.path": f"/n/guest{guest}.sock",
                          "remote.type": "unix", "remote.path": f"/n/guest{1 - guest}.sock"}
        ends.append((fields["local.path"], fields["remote.path"]))
        line = " ".join(args)
        for word in ("inet", "host=", "port=", "udp=", "listen=", "connect=", "-net ", "user,", "tap,"):
            assert word not in line, word
        assert _values(args, "-nic") == ["none"]  # no default network besides the link
        assert f"virtio-net-pci,netdev=link0,mac={guest_mac(guest)},bus=pcie.0" in _values(args, "-device")
    assert ends[0] == ends[1][::-1]  # each guest sends to the other's end
    assert guest_mac(0) != guest_mac(1) and (guest_address(0), guest_address(1)) == ("10.0.2.11", "10.0.2.12")
    # one guest's machine: 2 NUMA nodes of 256 MiB, whole cores for two tasks beside the reserved one
    assert shape.expected_node_cpus() == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)} and shape.memory_mib == 512
    assert "-qmp" not in _args(shape) and not shape.expanders


@pytest.mark.parametrize("name", sorted(n for n, s in SHAPES.items() if s.guests == 1))
def test_a_one_guest_shape_has_no_network(name):
    args = _args(SHAPES[name])
    assert "-netdev" not in args and _values(args, "-nic") == ["none"]


def test_a_two_guest_shape_needs_its_link_folder_and_a_guest_it_has():
    shape = SHAPES["slurm2"]
    with pytest.raises(ShapeError, match="guest 0 of 2 needs the folder of its link's sockets"):
        qemu_args(shape, kernel=Path("/k"), initrd=Path("/i"), job_dir=Path("/j"))
    with pytest.raises(ShapeError, match="guest 2 of 2 needs"):
        _args(shape, guest=2)
    with pytest.raises(ShapeError, match=r"guests must be 1 to 2 \(one link joins two\), not 3"):
        _args(replace(shape, guests=3))


def test_unknown_shape_names_the_known_ones():
    with pytest.raises(ShapeError, match=r"unknown machine shape 'big'; known shapes: 2node, 4node"):
        get_shape("big")


two = SHAPES["2node"]


@pytest.mark.parametrize(
    "shape, message",
    [
        (replace(two, nodes=(Node(0, 1024, (0,)), Node(0, 1024, (1,)))), r"NUMA node ids repeat: \[0, 0\]"),
        (replace(two, nodes=()), "needs at least one NUMA node"),
        (replace(two, distances=()), r"needs a distance for every node pair; missing \[\(0, 1\)\]"),
        (replace(two, distances=((0, 1, 5),)), "distance 0->1 is 5; it must be 11-255"),
        (replace(two, distances=((0, 2, 21),)), "distance 0->2 names an unknown node"),
        (replace(two, nodes=(Node(0, 1024, (0,)), Node(1, 1024, (2,)))), "names socket 2, but the machine has sockets 0-1"),
        (replace(two, nodes=(Node(0, 1024, (0,)), Node(1, 1024, ()))), r"CPU 4 \(socket 1, die 0\) is in no NUMA node"),
        (replace(two, nodes=(Node(0, 64, (0,)), Node(1, 1024, (1,)))), "node 0 has 64 MiB"),
        (replace(two, expanders=((128, 5, ("nvme",)),)), "expander bridge on bus 128 names unknown node 5"),
        (replace(two, cores=0), "cores must be at least 1"),
        (replace(SHAPES["snc"], nodes=(Node(0, 512, (), ((0, 2),)),), distances=()), "names socket 0 die 2"),
    ],
)
def test_invalid_shapes_are_refused_with_the_reason(shape, message):
    with pytest.raises(ShapeError, match=message):
        _args(shape)
