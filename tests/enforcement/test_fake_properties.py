"""The simulated tree's effective cpusets against a from-scratch computation:
after any sequence of writes (requests, partitions, controllers, cgroups
made and removed), every `cpuset.*.effective` read, through the backend or
as a plain file, is what the kernel's rules give for the tree as it stands."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root

MACHINE_CPUS, MACHINE_MEMS = CpuSet.parse("0-11"), CpuSet.parse("0-2")


def _text(file: Path) -> str:
    return file.read_text().strip()


def expected(root: Path) -> dict[Path, tuple[CpuSet, CpuSet]]:
    """Effective (CPUs, nodes) of every cgroup with cpuset files, from the
    requests alone: a request narrowed to what the parent hands down (all of
    it when empty or disjoint), less the CPUs of valid partition children; a
    partition is handed its own CPUs within its parent's."""
    out = {}

    def visit(cgroup: Path, handed: tuple[CpuSet, CpuSet]) -> None:
        cpus, mems = (CpuSet.parse(_text(cgroup / name)) for name in ("cpuset.cpus", "cpuset.mems"))
        available = ((cpus & handed[0]) or handed[0], (mems & handed[1]) or handed[1])
        enabled = "cpuset" in _text(cgroup / "cgroup.subtree_control").split()
        kids = sorted(k for k in cgroup.iterdir() if enabled and k.is_dir())
        parts = {k: CpuSet.parse(_text(k / "cpuset.cpus.exclusive") or _text(k / "cpuset.cpus")) for k in kids
                 if _text(k / "cpuset.cpus.partition") in ("root", "isolated")}
        carved = CpuSet.union_of(p & available[0] for p in parts.values())
        out[cgroup] = (available[0] - carved, available[1])
        for kid in kids:
            visit(kid, (parts[kid] & available[0], available[1]) if kid in parts
                  else (available[0] - carved, available[1]))

    visit(root, (MACHINE_CPUS, MACHINE_MEMS))
    return out


cpu_lists = st.sets(st.integers(0, 11), max_size=4).map(lambda s: CpuSet(s).format())
operations = st.one_of(
    st.tuples(st.just("mkdir"), st.integers(0, 99)),
    st.tuples(st.just("rmdir"), st.integers(0, 99)),
    st.tuples(st.just("cpuset.cpus"), st.integers(0, 99), cpu_lists),
    st.tuples(st.just("cpuset.mems"), st.integers(0, 99), st.sampled_from(["", "0", "1", "0-1", "2"])),
    st.tuples(st.just("cpuset.cpus.exclusive"), st.integers(0, 99), cpu_lists),
    st.tuples(st.just("cpuset.cpus.partition"), st.integers(0, 99),
              st.sampled_from(["root", "isolated", "member"])),
    st.tuples(st.just("cgroup.subtree_control"), st.integers(0, 99), st.sampled_from(["+cpuset", "-cpuset"])),
)


def _apply(fake: SimulatedCgroupfs, made: list[Path], op: tuple) -> None:
    kind, index, *value = op
    cgroup = made[index % len(made)]
    if kind == "mkdir":
        if len(cgroup.relative_to(made[0]).parts) < 3:
            fake.write(cgroup / "cgroup.subtree_control", "+cpuset")  # mostly children with cpusets
            child = cgroup / f"c{len(made)}"
            fake.mkdir(child)
            made.append(child)
    elif kind == "rmdir":
        if cgroup != made[0]:
            fake.rmdir(cgroup)
            made.remove(cgroup)
    else:
        fake.write(cgroup / kind, value[0])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operations, max_size=30))
def test_every_effective_value_read_is_the_kernels(ops):
    with tempfile.TemporaryDirectory() as tmp:
        root = make_simulated_cgroup_root(Path(tmp) / "cg", MACHINE_CPUS, MACHINE_MEMS.ids(),
                                     controllers=("cpuset",))
        fake = SimulatedCgroupfs(root)
        fake.write(root / "cgroup.subtree_control", "+cpuset")
        fake.write(root / "cpuset.cpus.partition", "root")
        made = [root]
        try:
            for op in ops:
                try:
                    _apply(fake, made, op)
                except OSError:
                    pass  # refused (EBUSY, EINVAL, ENOENT...): changes nothing
                for cgroup, (cpus, mems) in expected(root).items():
                    for name, value in (("cpuset.cpus.effective", cpus), ("cpuset.mems.effective", mems)):
                        file = cgroup / name
                        assert fake.read(file).decode().strip() == value.format(), (op, str(file))
                        assert _text(file) == value.format()
        finally:
            fake.close()
