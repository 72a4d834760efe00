"""Topology discovery: read `root/sys` and `root/proc` into a `Topology`.

`root` is "/" on the live machine, or a directory holding a captured
snapshot (`sys/`, `proc/`, cgroup mounts), so the agent runs unchanged on
another machine's tree. Kernels from 2.6 to 6.x differ in which files exist;
each fact has an ordered list of sources (see the README of the sysfs
fixtures for the variants):

- online CPUs: `cpu/online`, else each `cpuN/online` ("1", empty or missing
  = online);
- SMT siblings: `core_cpus_list`, `thread_siblings_list`, then the hex masks;
- a CPU's NUMA node: the node cpulists/cpumaps, else the `cpuN/nodeM` link
  (only when node M exists: hand-offlined nodes leave dangling links);
- node distance rows: indexed by the node directories, else by
  `node/online`, else by `node/possible`;
- the agent's allowed CPUs/mems: `proc/self/status`, else the cpuset of
  `proc/self/cpuset` (or `proc/self/cgroup`) under the cpuset / cgroup2 mount.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.topology import UNKNOWN_NODE, Cache, Cpu, HugePages, NumaNode, Topology
from numa_agent.discovery.files import (
    DiscoveryError,
    numbered_entries,
    parse_cpulist,
    read_cpulist,
    read_cpus,
    read_int,
    read_text,
)
from numa_agent.discovery.pci import read_pci_devices

__all__ = ["read_topology", "read_memory_figures", "read_free_hugepages", "DiscoveryError"]

_SIBLING_LISTS = ("core_cpus_list", "thread_siblings_list")
_SIBLING_MASKS = ("core_cpus", "thread_siblings")
_HUGEPAGE_DIR = re.compile(r"^hugepages-(\d+)kB$")
_MEMINFO_LINE = re.compile(r"^Node\s+\d+\s+([^:\s]+):(.*)$")


def read_topology(root: str | os.PathLike = "/") -> Topology:
    """Discover the machine under `root`. Raises DiscoveryError, naming the
    file, when the tree is missing what discovery needs or holds garbage."""
    root = os.fspath(root)
    sys_dir = os.path.join(root, "sys")
    proc_dir = os.path.join(root, "proc")
    cpu_dir = os.path.join(sys_dir, "devices", "system", "cpu")
    node_dir = os.path.join(sys_dir, "devices", "system", "node")
    if not os.path.isdir(cpu_dir):
        raise DiscoveryError(
            f"{cpu_dir}: not found; {root!r} does not look like a sysfs root (expected sys/devices/system/cpu)"
        )

    cpu_dirs = dict((n, os.path.join(cpu_dir, name)) for n, name in numbered_entries(cpu_dir, "cpu"))
    node_dirs = dict((n, os.path.join(node_dir, name)) for n, name in numbered_entries(node_dir, "node"))
    if not node_dirs:
        # A kernel without NUMA support: the whole machine is node 0.
        nodes: tuple[NumaNode, ...] = (_single_node(proc_dir, CpuSet(cpu_dirs)),)
    else:
        nodes = tuple(_read_node(n, path) for n, path in sorted(node_dirs.items()))
        nodes = _with_distances(nodes, node_dirs, node_dir)

    node_of_cpu: dict[int, int] = {}
    for node in nodes:
        for cpu in node.cpus:
            node_of_cpu.setdefault(cpu, node.id)

    all_cpu_ids = CpuSet(cpu_dirs)
    for node in nodes:
        all_cpu_ids = all_cpu_ids | node.cpus
    online = _online_cpus(cpu_dir, cpu_dirs, all_cpu_ids)
    isolated = read_cpulist(os.path.join(cpu_dir, "isolated")) or CpuSet()
    known_nodes = frozenset(node_dirs) if node_dirs else frozenset({0})

    cpus = []
    cpu_caches = {}
    for cpu_id in all_cpu_ids:
        path = cpu_dirs.get(cpu_id)
        node_id = node_of_cpu.get(cpu_id)
        if node_id is None and path is not None:
            node_id = _node_from_links(path, known_nodes)
        caches = () if path is None else _read_caches(cpu_id, os.path.join(path, "cache"))
        cpu_caches[cpu_id] = caches
        cpus.append(_read_cpu(cpu_id, path, cpu_id in online, cpu_id in isolated,
                              UNKNOWN_NODE if node_id is None else node_id, caches))

    online_node_of_cpu = {c.id: c.numa_node for c in cpus if c.online}
    allowed_cpus, allowed_mems = _read_allowed(root, proc_dir)
    architecture, kernel = _read_platform(proc_dir)
    return Topology(
        numa_nodes=nodes,
        cpus=tuple(cpus),
        pci_devices=read_pci_devices(sys_dir, online, online_node_of_cpu, proc_dir),
        allowed_cpus=allowed_cpus,
        allowed_mems=allowed_mems,
        architecture=architecture,
        kernel=kernel,
        caches=_machine_caches(cpu_caches, online),
    )


# ---- CPUs -------------------------------------------------------------------

def _online_cpus(cpu_dir: str, cpu_dirs: dict[int, str], all_cpu_ids: CpuSet) -> CpuSet:
    listed = read_cpulist(os.path.join(cpu_dir, "online"))
    if listed is not None:
        return listed
    # No global list (old kernels): ask each CPU. cpu0 usually cannot be
    # hot-unplugged and has no `online` file at all; that means online.
    online = []
    for cpu_id, path in cpu_dirs.items():
        state_path = os.path.join(path, "online")
        state = read_text(state_path)
        if state is None or state == "" or state == "1":
            online.append(cpu_id)
        elif state != "0":
            raise DiscoveryError(f"{state_path}: expected 0 or 1, got {state!r}")
    return CpuSet(online)


def _read_cpu(cpu_id: int, path: str | None, online: bool, isolated: bool, node: int,
              caches: tuple[Cache, ...]) -> Cpu:
    package = die = cluster = core_id = None
    siblings = None
    if path is not None:
        topo = os.path.join(path, "topology")
        if os.path.isdir(topo):
            package = read_int(os.path.join(topo, "physical_package_id"))
            die = read_int(os.path.join(topo, "die_id"))
            cluster = read_int(os.path.join(topo, "cluster_id"))
            core_id = read_int(os.path.join(topo, "core_id"))
            siblings = read_cpus(topo, _SIBLING_LISTS, _SIBLING_MASKS)
    own = CpuSet((cpu_id,))
    siblings = own if siblings is None else siblings | own
    return Cpu(
        id=cpu_id,
        online=online,
        numa_node=node,
        package=package,
        die=die,
        cluster=cluster,
        core_id=core_id,
        core=siblings.min(),
        siblings=siblings,
        l3=_l3_group(caches),
        isolated=isolated,
    )


def _read_caches(cpu_id: int, cache_dir: str) -> tuple[Cache, ...]:
    """The caches `cpuN/cache/index*` describes; () where there is no such
    directory (ia64, many VMs) or no `level` file."""
    own = CpuSet((cpu_id,))
    caches = []
    for _, name in numbered_entries(cache_dir, "index"):
        index = os.path.join(cache_dir, name)
        level = read_int(os.path.join(index, "level"))
        if level is None:
            continue
        shared = read_cpus(index, ("shared_cpu_list",), ("shared_cpu_map",))
        shared = own if shared is None else shared | own
        caches.append(Cache(
            level=level,
            type=read_text(os.path.join(index, "type")) or "",
            id=shared.min(),
            cpus=shared,
            size_bytes=_cache_size(os.path.join(index, "size")),
        ))
    return tuple(caches)


_CACHE_SIZE = re.compile(r"^(\d+)([KMG]?)$")


def _cache_size(path: str) -> int | None:
    """Bytes from the kernel's "32K" (binary, as it writes `size >> 10`);
    None where there is no size (or "0K", as some hypervisors leave it)."""
    text = read_text(path)
    if not text:
        return None
    m = _CACHE_SIZE.match(text)
    if m is None:
        raise DiscoveryError(f"{path}: expected a size like 32K, got {text!r}")
    return (int(m.group(1)) << (10 * " KMG".index(m.group(2) or " "))) or None


def _l3_group(caches: tuple[Cache, ...]) -> int | None:
    """The first level-3 cache's id (lowest CPU sharing it): a machine-unique
    group index even where the kernel has no cache `id` file."""
    return next((c.id for c in caches if c.level == 3), None)


def _machine_caches(per_cpu: dict[int, tuple[Cache, ...]], online: CpuSet) -> tuple[Cache, ...]:
    """One Cache per instance used by an online CPU, shared by online CPUs
    only (as the L3 groups are): the online CPUs' reports merged by level,
    type and id, sorted L1 first."""
    merged: dict[tuple[int, str, int], Cache] = {}
    online = online & CpuSet(per_cpu)  # a CPU named only by `online` has no Cpu to show it by
    for cpu_id, caches in per_cpu.items():
        if cpu_id not in online:
            continue
        for cache in caches:
            key = (cache.level, cache.type, cache.id)
            seen = merged.get(key)
            cpus = cache.cpus & online
            if seen is not None:
                cpus = cpus | seen.cpus
            size = cache.size_bytes if seen is None or seen.size_bytes is None else seen.size_bytes
            merged[key] = Cache(level=cache.level, type=cache.type, id=cache.id, cpus=cpus, size_bytes=size)
    return tuple(merged[k] for k in sorted(merged))


def _node_from_links(cpu_path: str, known_nodes: frozenset[int]) -> int | None:
    for node, _ in numbered_entries(cpu_path, "node"):
        if node in known_nodes:
            return node
    return None


# ---- NUMA nodes ---------------------------------------------------------------

def _read_node(node_id: int, path: str) -> NumaNode:
    cpus = read_cpus(path, ("cpulist",), ("cpumap",))
    if cpus is None:
        cpus = CpuSet(n for n, _ in numbered_entries(path, "cpu"))
    meminfo = _read_node_meminfo(os.path.join(path, "meminfo"))
    return NumaNode(
        id=node_id,
        cpus=cpus,
        memory_total_bytes=meminfo.get("MemTotal", 0) * 1024,
        memory_free_bytes=meminfo.get("MemFree", 0) * 1024,
        hugepages=_read_hugepages(os.path.join(path, "hugepages")),
    )


MemoryFigures = tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]


def read_memory_figures(root: str | os.PathLike = "/") -> MemoryFigures:
    """What the memory capacity is made of, per node: (node, MemTotal kB,
    ((hugepage size kB, pages), ...)). A few small files, so the agent can
    look often for changes that send no uevent (a balloon driver, a hugepage
    pool resized) and re-read the whole machine only when this differs."""
    node_dir = os.path.join(os.fspath(root), "sys", "devices", "system", "node")
    out = []
    for node_id, name in numbered_entries(node_dir, "node"):
        path = os.path.join(node_dir, name)
        total = _read_node_meminfo(os.path.join(path, "meminfo")).get("MemTotal", 0)
        pools = tuple((h.size_kb, h.total) for h in _read_hugepages(os.path.join(path, "hugepages")))
        out.append((node_id, total, pools))
    return tuple(out)


FreeHugepages = tuple[tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...]]


def read_free_hugepages(root: str | os.PathLike, pools: tuple[tuple[int, int], ...]) -> FreeHugepages:
    """The kernel's hugepage counters an admission checks, for just `pools`
    ((node, page size kB), what the request asks for): ((node, size, free
    pages), ...) from each node's ``free_hugepages``, and ((size, reserved
    pages), ...) from ``/sys/kernel/mm/hugepages``'s ``resv_hugepages``
    (the kernel keeps reservations for the whole machine only). A counter
    that is missing (an older snapshot, a pool gone since discovery) is
    left out: the bookings alone then say what is free there."""
    sys_dir = os.path.join(os.fspath(root), "sys")
    free = []
    for node, size_kb in pools:
        pages = read_int(os.path.join(sys_dir, "devices", "system", "node", f"node{node}", "hugepages",
                                      f"hugepages-{size_kb}kB", "free_hugepages"))
        if pages is not None:
            free.append((node, size_kb, max(0, pages)))
    reserved = []
    for size_kb in sorted({size for _, size in pools}):
        pages = read_int(os.path.join(sys_dir, "kernel", "mm", "hugepages", f"hugepages-{size_kb}kB",
                                      "resv_hugepages"))
        if pages:
            reserved.append((size_kb, max(0, pages)))
    return tuple(free), tuple(reserved)


def _read_node_meminfo(path: str) -> dict[str, int]:
    """MemTotal/MemFree in kB from "Node 0 MemTotal:  16747124 kB" lines;
    other lines vary between kernels and are ignored."""
    text = read_text(path)
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        m = _MEMINFO_LINE.match(line.strip())
        if m is None or m.group(1) not in ("MemTotal", "MemFree"):
            continue
        value = m.group(2).split()
        try:
            out[m.group(1)] = int(value[0])
        except (ValueError, IndexError):
            raise DiscoveryError(f"{path}: bad {m.group(1)} line {line.strip()!r}") from None
    return out


def _read_hugepages(path: str) -> tuple[HugePages, ...]:
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return ()
    pools = []
    for name in names:
        m = _HUGEPAGE_DIR.match(name)
        if m is None:
            continue
        pool = os.path.join(path, name)
        pools.append(HugePages(
            size_kb=int(m.group(1)),
            total=read_int(os.path.join(pool, "nr_hugepages")) or 0,
            free=read_int(os.path.join(pool, "free_hugepages")) or 0,
            surplus=read_int(os.path.join(pool, "surplus_hugepages")) or 0,
        ))
    return tuple(sorted(pools, key=lambda h: h.size_kb))


def _with_distances(nodes: tuple[NumaNode, ...], node_dirs: dict[int, str], node_dir: str) -> tuple[NumaNode, ...]:
    """Map each node's `distance` row to node ids.

    The kernel prints one entry per online node in id order, which normally
    matches the node directories; hand-offlined snapshots keep a row per
    possible node, so fall back to `node/online`, then `node/possible`."""
    orders = [tuple(sorted(node_dirs))]
    for name in ("online", "possible"):
        ids = read_cpulist(os.path.join(node_dir, name))
        if ids is not None:
            orders.append(ids.ids())
    out = []
    for node in nodes:
        path = os.path.join(node_dirs[node.id], "distance")
        text = read_text(path)
        if text is None:
            out.append(node)
            continue
        try:
            row = [int(v) for v in text.split()]
        except ValueError:
            raise DiscoveryError(f"{path}: expected integers, got {text!r}") from None
        for order in orders:
            if len(order) == len(row):
                break
        else:
            raise DiscoveryError(
                f"{path}: {len(row)} distances, but the machine has {len(node_dirs)} node directories"
            )
        out.append(NumaNode(
            id=node.id, cpus=node.cpus,
            memory_total_bytes=node.memory_total_bytes, memory_free_bytes=node.memory_free_bytes,
            hugepages=node.hugepages, distances=dict(zip(order, row, strict=False)),
        ))
    return tuple(out)


def _single_node(proc_dir: str, cpus: CpuSet) -> NumaNode:
    path = os.path.join(proc_dir, "meminfo")
    values = {}
    text = read_text(path)
    for line in (text or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemTotal", "MemFree") and parts:
            try:
                values[key] = int(parts[0]) * 1024
            except ValueError:
                raise DiscoveryError(f"{path}: bad {key} line {line!r}") from None
    return NumaNode(id=0, cpus=cpus, memory_total_bytes=values.get("MemTotal", 0),
                    memory_free_bytes=values.get("MemFree", 0), distances={0: 10})


# ---- the agent's own cpuset -------------------------------------------------------

@dataclass(frozen=True)
class _Mount:
    point: str
    fstype: str
    options: frozenset[str]


def _read_allowed(root: str, proc_dir: str) -> tuple[CpuSet | None, frozenset[int] | None]:
    cpus = mems = None
    status_path = os.path.join(proc_dir, "self", "status")
    status = read_text(status_path)
    if status is not None:
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key == "Cpus_allowed_list":
                cpus = parse_cpulist(status_path, value)
            elif key == "Mems_allowed_list":
                mems = frozenset(parse_cpulist(status_path, value).ids())
    if cpus is not None and mems is not None:
        return cpus, mems
    cg_cpus, cg_mems = _read_cpuset_cgroup(root, proc_dir)
    return (cpus if cpus is not None else cg_cpus,
            mems if mems is not None else cg_mems)


def _read_mounts(proc_dir: str) -> list[_Mount]:
    text = read_text(os.path.join(proc_dir, "mounts"))
    mounts = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = _unescape_mount(fields[1])
        mounts.append(_Mount(point, fields[2], frozenset(fields[3].split(","))))
    return mounts


def _unescape_mount(text: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _own_cgroup_path(proc_dir: str, v1: bool) -> str | None:
    path = read_text(os.path.join(proc_dir, "self", "cpuset"))
    if path:
        return path
    text = read_text(os.path.join(proc_dir, "self", "cgroup"))
    for line in (text or "").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, cg_path = rest.partition(":")
        if v1 and "cpuset" in controllers.split(","):
            return cg_path
        if not v1 and hier == "0" and controllers == "":
            return cg_path
    return None


def _read_cpuset_cgroup(root: str, proc_dir: str) -> tuple[CpuSet | None, frozenset[int] | None]:
    mounts = _read_mounts(proc_dir)
    # cgroup v1 (or the legacy cpuset fs) first: when both exist, the cpuset
    # controller lives on the v1 hierarchy.
    v1 = [m for m in mounts if m.fstype == "cpuset" or (m.fstype == "cgroup" and "cpuset" in m.options)]
    if not mounts and os.path.isdir(os.path.join(root, "dev", "cpuset")):
        v1 = [_Mount("/dev/cpuset", "cpuset", frozenset())]
    for mount in v1:
        cg_path = _own_cgroup_path(proc_dir, v1=True) or "/"
        directory = _under(root, mount.point, cg_path)
        prefix = "" if mount.fstype == "cpuset" or "noprefix" in mount.options else "cpuset."
        found = _read_cpuset_files(directory, (prefix + "cpus",), (prefix + "mems",))
        if found is not None:
            return found
    for mount in (m for m in mounts if m.fstype == "cgroup2"):
        cg_path = _own_cgroup_path(proc_dir, v1=False) or "/"
        mount_dir = _under(root, mount.point, "/")
        directory = _under(root, mount.point, cg_path)
        found = _read_cpuset_files(directory, ("cpuset.cpus.effective",), ("cpuset.mems.effective",))
        if found is not None:
            return found
        # Without the effective files, an empty or missing cpuset.cpus means
        # "inherit": walk up to the first ancestor that sets one.
        while True:
            found = _read_cpuset_files(directory, ("cpuset.cpus",), ("cpuset.mems",))
            if found is not None and found[0]:
                return found
            if os.path.normpath(directory) == os.path.normpath(mount_dir):
                break
            directory = os.path.dirname(directory)
    return None, None


def _under(root: str, mount_point: str, cg_path: str) -> str:
    return os.path.join(root, mount_point.lstrip("/"), cg_path.lstrip("/"))


def _read_cpuset_files(directory: str, cpu_names: tuple[str, ...], mem_names: tuple[str, ...]):
    for cpu_name, mem_name in zip(cpu_names, mem_names, strict=True):
        cpus = read_cpulist(os.path.join(directory, cpu_name))
        if cpus is None:
            continue
        mems = read_cpulist(os.path.join(directory, mem_name))
        return cpus, None if mems is None else frozenset(mems.ids())
    return None


# ---- platform -----------------------------------------------------------------------

_ARCH_IN_VERSION = re.compile(r"\.(x86_64|aarch64|ppc64le|ppc64|s390x|i686|ia64)\b")


def _read_platform(proc_dir: str) -> tuple[str | None, str | None]:
    kernel = architecture = None
    version = read_text(os.path.join(proc_dir, "version"))
    if version:
        fields = version.split()
        if len(fields) >= 3 and fields[:2] == ["Linux", "version"]:
            kernel = fields[2]
            m = _ARCH_IN_VERSION.search(kernel)
            if m:
                architecture = m.group(1)
    if architecture is None:
        architecture = _arch_from_cpuinfo(read_text(os.path.join(proc_dir, "cpuinfo")) or "")
    return architecture, kernel


def _arch_from_cpuinfo(cpuinfo: str) -> str | None:
    keys: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            keys.setdefault(key.strip(), value.strip())
    if keys.get("arch") == "IA-64":
        return "ia64"
    if "CPU implementer" in keys:
        return "aarch64" if keys.get("CPU architecture") in ("8", "AArch64", "9") else "arm"
    if keys.get("cpu", "").startswith("POWER"):
        return "ppc64"
    if "vendor_id" in keys:
        return "x86_64" if "lm" in keys.get("flags", "").split() else "i686"
    return None
