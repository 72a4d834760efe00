"""Slurm's view of a machine (the NodeName line, abstract CPU ids) and of a numa-run
inside a Slurm task (its workload name, which case applies)."""

from __future__ import annotations

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.slurm import (
    SlurmShapeError,
    SlurmTask,
    confinement,
    gres_lines,
    gres_name,
    gres_types,
    job_prefix,
    node_line,
    shared_cgroup_refusal,
    shares_cgroup,
    slurm_node,
    slurm_task,
    spec_note,
    step_of_cgroup,
    tasks_on_node,
)
from numa_agent.core.topology import UNKNOWN_NODE, PciDevice
from numa_agent.discovery.sysfs import read_topology
from tests.conftest import SNAPSHOT_NAMES

UNEVEN = {"amd-k8-8s-8numa-cpuset-v1", "intel-haswell-2s-offline-cpus-node0", "intel-raptorlake-hybrid-1s",
          "intel-xeon-4s-ht-offline-cpus-uma"}


@pytest.fixture(scope="module")
def topo(snapshot):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = read_topology(str(snapshot(name)[0]))
        return cache[name]
    return get


def fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line.split())


# ---------------------------------------------------------------- abstract CPU ids
def test_siblings_numbered_apart_by_the_kernel_are_adjacent_for_slurm(topo):
    # Skylake-SP, 2 x 8 cores x 2 threads: the kernel's CPU 0 has sibling 16, socket 1 starts at 8.
    node = slurm_node(topo("intel-skx-2s-ht-2numa-pci-nec-ve"))
    assert (node.sockets, node.cores_per_socket, node.threads_per_core) == (2, 8, 2)
    assert [node.abstract[c] for c in (0, 16, 1, 17, 7, 23, 8, 24, 15, 31)] == \
        [0, 1, 2, 3, 14, 15, 16, 17, 30, 31]
    assert node.abstract_ids(CpuSet.parse("0,16")).format() == "0-1"
    assert node.kernel_ids(CpuSet.parse("16-17")).format() == "8,24"


def test_sparse_package_and_cpu_ids_are_counted_not_copied(topo):
    # POWER9: packages 0 and 8, the second one's threads are the kernel's 88-103 (SMT4).
    node = slurm_node(topo("power9-2s-smt4-gpu-numa-nodes"))
    assert (node.sockets, node.cores_per_socket, node.threads_per_core) == (2, 4, 4)
    assert node.abstract_ids(CpuSet.parse("88-91")).format() == "16-19"
    assert node.abstract_ids(CpuSet.parse("103")).format() == "31"


@pytest.mark.parametrize("name", sorted(set(SNAPSHOT_NAMES) - UNEVEN))
def test_abstract_ids_number_every_online_cpu_socket_core_thread(topo, name):
    t = topo(name)
    node = slurm_node(t)
    assert sorted(node.abstract) == list(t.online_cpus.ids())
    assert sorted(node.abstract.values()) == list(range(node.cpus))
    for core in t.cores:  # a core's threads are consecutive, in the kernel's order
        ids = [node.abstract[c] for c in core.ids()]
        assert ids == list(range(ids[0], ids[0] + node.threads_per_core)) and ids[0] % node.threads_per_core == 0
    per_socket = node.cores_per_socket * node.threads_per_core
    for cpus in t.packages.values():  # a socket's CPUs are one block
        block = {node.abstract[c] // per_socket for c in cpus}
        assert len(block) == 1


@pytest.mark.parametrize("name", sorted(UNEVEN))
def test_unevenly_shaped_machines_are_refused_with_the_reason(topo, name):
    with pytest.raises(SlurmShapeError, match="not evenly shaped"):
        slurm_node(topo(name))


# ---------------------------------------------------------------- the NodeName line
def test_node_line_converts_the_reserved_cpus_and_rounds_memory(topo):
    t = topo("intel-skx-2s-ht-2numa-pci-nec-ve")
    line = node_line("c1", t, CpuSet.parse("0,8,16,24"), reserved_memory_bytes=(1 << 30) + 1)
    f = fields(line)
    assert line.startswith("NodeName=c1 CPUs=32 Boards=1 SocketsPerBoard=2 CoresPerSocket=8 ThreadsPerCore=2 ")
    assert f["CpuSpecList"] == "0-1,16-17"
    assert f["MemSpecLimit"] == "1025"  # rounded up: Slurm keeps at least what the agent does
    total = sum(n.memory_total_bytes for n in t.numa_nodes)
    assert int(f["RealMemory"]) == total >> 20 and int(f["RealMemory"]) << 20 <= total


def test_node_line_without_reservations_has_no_spec_fields(topo):
    f = fields(node_line("n", topo("intel-snb-2s-2numa-pci-nvme-nic"), CpuSet()))
    assert "CpuSpecList" not in f and "MemSpecLimit" not in f
    assert (f["CPUs"], f["SocketsPerBoard"], f["CoresPerSocket"], f["ThreadsPerCore"]) == ("16", "2", "8", "1")


# ---------------------------------------------------------------- gres.conf
def _device(address, node, **fields):
    return PciDevice(address=address, pci_class=fields.pop("pci_class", "0x030200"),
                     vendor=fields.pop("vendor", "0x10de"), device="0x20b0", numa_node=node, **fields)


GPU0 = _device("0000:3b:00.0", 0, nvidia_minor=1)
GPU1 = _device("0000:d8:00.0", 1, nvidia_minor=0)
NVME = _device("0000:5e:00.0", 1, pci_class="0x010802", vendor="0x8086", other_children=("nvme/nvme0",))
RENDER = _device("0000:af:00.0", 1, vendor="0x1002", other_children=("drm/card0", "drm/renderD128"))
NIC0 = _device("0000:18:00.0", 0, pci_class="0x020000", vendor="0x8086", net=("eth0",))
NIC0B = _device("0000:18:00.1", 0, pci_class="0x020000", vendor="0x8086", net=("eth1",))
NIC_FAR = _device("0000:00:19.0", UNKNOWN_NODE, pci_class="0x020000", vendor="0x8086", net=("eth2",))


def test_gres_lines_name_the_device_files_and_slurms_cores_not_cpus(topo):
    # Skylake-SP, 2 x 8 cores x 2 threads: node 0 is the kernel's 0-7,16-23, Slurm's cores 0-7
    # (its abstract CPU ids 0-15: Cores= counts cores, CpuSpecList threads).
    t = topo("intel-skx-2s-ht-2numa-pci-nec-ve")
    lines = gres_lines(t, [("nvidia.com/gpu", [GPU1, GPU0]), ("nvme", [NVME]), ("render", [RENDER])])
    assert [line.text("c1") for line in lines] == [
        "NodeName=c1 Name=gpu File=/dev/nvidia1 Cores=0-7",  # by PCI address, not by minor
        "NodeName=c1 Name=gpu File=/dev/nvidia0 Cores=8-15",
        "NodeName=c1 Name=nvme File=/dev/nvme0 Cores=8-15",
        "NodeName=c1 Name=render File=/dev/dri/renderD128 Cores=8-15",
    ]
    assert node_line("c1", t, CpuSet(), gres=lines).endswith(" Gres=gpu:2,nvme:1,render:1")
    assert gres_types(lines) == "GresTypes=gpu,nvme,render"


NIC1 = _device("0000:86:00.0", 1, pci_class="0x020000", vendor="0x8086", net=("eth3",))


@pytest.mark.parametrize("nics, line", [
    ([NIC0B, NIC0], "NodeName=n Name=nic Count=2 Cores=0-7"),  # both on node 0: its cores 0-7
    ([NIC0, NIC_FAR], "NodeName=n Name=nic Count=2"),  # one's node is unknown: any core
    ([NIC0, NIC1], "NodeName=n Name=nic Count=2"),  # both nodes: every core, said by saying none
])
def test_devices_without_a_file_are_one_count_near_all_their_cores(topo, nics, line):
    # slurmd refuses two lines of one GRES without File= ("gres.conf duplicate records").
    t = topo("intel-snb-2s-2numa-pci-nvme-nic")  # 2 x 8 cores, no SMT: cores 0-7 on node 0
    lines = gres_lines(t, [("nic", nics), ("empty", [])])
    assert [x.text("n") for x in lines] == [line]
    assert fields(node_line("n", t, CpuSet(), gres=lines))["Gres"] == "nic:2"


def test_the_gres_lines_of_a_fixtures_own_devices(topo):
    t = topo("intel-snb-2s-2numa-pci-nvme-nic")
    nics = [d for d in t.pci_devices if d.pci_class.startswith("0x0200")]
    (line,) = gres_lines(t, [("nic", nics)])
    assert (line.name, line.file, line.count) == ("nic", None, len(nics))
    nodes = {d.numa_node for d in nics}
    assert line.cores == (CpuSet.parse("0-7") if nodes == {0} else CpuSet.parse("8-15") if nodes == {1} else CpuSet())


@pytest.mark.parametrize("resources, message", [
    ([("nic", [NIC0, NVME])], "0000:18:00.0 has no device file .* on all of a GRES's lines or on none"),
    ([("gpu", [_device("0000:3b:00.0", 0)])], "gres/gpu needs File="),
    ([("a.com/gpu", [GPU0]), ("b.com/gpu", [GPU1])], "'a.com/gpu' and 'b.com/gpu' would both be GRES 'gpu'"),
    ([("fast.nic", [NIC0])], "no GRES name Slurm takes"),
])
def test_gres_lines_slurm_could_not_take_are_refused_with_the_reason(topo, resources, message):
    with pytest.raises(SlurmShapeError, match=message):
        gres_lines(topo("intel-skx-2s-ht-2numa-pci-nec-ve"), resources)


def test_a_gres_name_is_the_resource_without_its_domain():
    assert gres_name("nvidia.com/gpu") == "gpu" and gres_name("nic") == "nic"


# ---------------------------------------------------------------- a Slurm task
TASK_CGROUP = "/system.slice/slurmstepd.scope/job_12/step_0/user/task_1"


def test_outside_slurm_there_is_no_task():
    assert slurm_task({}) is None
    assert slurm_task({"SLURM_JOB_ID": "abc"}) is None


def test_name_from_the_environment():
    task = slurm_task({"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"})
    assert task == SlurmTask("12", "0", "3")
    assert task.workload_name(1000) == "slurm-12-0-3-u1000" and task.workload_name(1000).startswith(job_prefix("12"))


@pytest.mark.parametrize("step_id,word", [("4294967291", "batch"), ("4294967292", "extern"),
                                          ("4294967290", "interactive")])
def test_special_step_ids_are_named_as_slurm_names_their_cgroups(step_id, word):
    task = slurm_task({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": step_id, "SLURM_PROCID": "0"})
    assert task is not None and task.workload_name(5) == f"slurm-7-{word}-0-u5"


def test_the_cgroup_names_the_step_when_slurm_tracks_the_task():
    env = {"SLURM_JOB_ID": "12", "SLURM_PROCID": "1"}  # a batch script has no SLURM_STEP_ID
    assert slurm_task(env, "/system.slice/slurmstepd.scope/job_12/step_batch/user/task_0").workload_name(5) == \
        "slurm-12-batch-1-u5"
    assert slurm_task(env).workload_name(5) == "slurm-12-batch-1-u5"
    assert step_of_cgroup(TASK_CGROUP, "12") == "0"
    assert step_of_cgroup(TASK_CGROUP, "13") is None  # another job's cgroup is not this task's
    assert step_of_cgroup("/user.slice/job_12", "12") is None


ONLINE = CpuSet.parse("0-7")


def test_a_step_confined_by_task_cgroup_is_booked_in_place_inside_it():
    task = SlurmTask("12", "0", "1")
    case = confinement(task, TASK_CGROUP, online=ONLINE, cgroup_cpus=CpuSet.parse("2-5"),
                       cgroup_mems=CpuSet.parse("0"), affinity=ONLINE)
    assert case.in_place and case.confined and case.cpus.format() == "2-5"
    assert case.line() == "Slurm step 12.0 task 1: confined by Slurm to CPUs 2-5, memory node 0; booked inside them"
    assert case.line("2-3", "0").endswith("booked inside them (CPUs 2-3, memory node 0)")


def test_a_step_slurm_only_tracks_is_in_place_but_not_confined():
    case = confinement(SlurmTask("12", "0", "0"), TASK_CGROUP, online=ONLINE, cgroup_cpus=ONLINE,
                       cgroup_mems=CpuSet.parse("0-1"), affinity=ONLINE)
    assert case.in_place and not case.confined
    assert case.line() == ("Slurm step 12.0 task 0: Slurm did not confine the step (CPUs 0-7): "
                           "booked from the agent's pool, in its cgroup")


def test_task_none_without_a_step_cgroup_books_from_the_pool_as_before():
    case = confinement(SlurmTask("12", "0", "0"), "/user.slice/session-1.scope", online=ONLINE,
                       cgroup_cpus=ONLINE, cgroup_mems=None, affinity=ONLINE)
    assert not case.in_place and not case.confined
    assert "did not confine" in case.line() and "without a cgroup of the step" in case.line()


def test_task_affinity_narrows_what_the_task_may_use():
    case = confinement(SlurmTask("12", "0", "0"), TASK_CGROUP, online=ONLINE, cgroup_cpus=ONLINE,
                       cgroup_mems=None, affinity=CpuSet.parse("4-5"))
    assert case.in_place and case.confined and case.cpus.format() == "4-5"


@pytest.mark.parametrize("spec,node,expected", [("3", "0", 3), ("2(x3),1", "2", 2), ("2(x3),1", "3", 1),
                                                ("", "0", None), ("2(x3)", "5", None), ("x", "0", None)])
def test_tasks_on_this_node(spec, node, expected):
    assert tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": spec, "SLURM_NODEID": node}) == expected


SHARED = "/system.slice/numa1_slurmstepd.scope/job_5/step_0/user/task_special"


def test_tasks_sharing_slurms_one_cgroup_are_each_pinned_inside_it():
    assert shares_cgroup(SHARED, 3)
    assert shares_cgroup(SHARED, None)  # Slurm did not say how many: pinned, to be safe
    assert not shares_cgroup(SHARED, 1)  # alone in it: booked on the cgroup itself
    assert not shares_cgroup(SHARED.replace("task_special", "task_1"), 3)  # a cgroup per task


def test_a_task_sharing_slurms_cgroup_books_cpus_of_its_own_or_is_refused():
    task = SlurmTask("5", "0", "1")
    why = shared_cgroup_refusal(task, SHARED, 3, cpus=0)
    assert why is not None and "3 tasks" in why and "--cpus N" in why and "\n" not in why
    assert shared_cgroup_refusal(task, SHARED, 3, cpus=2) is None
    assert shared_cgroup_refusal(task, SHARED, 1, cpus=0) is None  # alone: the cgroup is its own
    case = confinement(task, SHARED, online=ONLINE, cgroup_cpus=CpuSet.parse("2-5"),
                       cgroup_mems=None, affinity=CpuSet.parse("2-3"))
    assert case.cgroup_confined and case.in_place  # task/cgroup: booked in place, pinned inside it
    bound = confinement(task, SHARED, online=ONLINE, cgroup_cpus=ONLINE,
                        cgroup_mems=None, affinity=CpuSet.parse("2-3"))
    assert not bound.cgroup_confined  # task/affinity alone: the cgroup holds every CPU


def test_a_reservation_of_part_of_a_core_is_noted_with_the_whole_core(topo):
    t = topo("intel-skx-2s-ht-2numa-pci-nec-ve")
    note = spec_note(t, CpuSet.parse("0"))
    assert note is not None and "kernel's CPUs 0,16" in note and 'reserved_cpus = "0,16"' in note
    assert spec_note(t, CpuSet.parse("0,16")) is None
    assert spec_note(topo("intel-snb-2s-2numa-pci-nvme-nic"), CpuSet.parse("0")) is None  # no SMT
