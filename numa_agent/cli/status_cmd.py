"""`numa-agent status`: per-node capacity and use, then the workloads."""

from __future__ import annotations

import argparse
import time
from typing import Any

from numa_agent.admission.request import describe_amounts
from numa_agent.cli import common
from numa_agent.core.printable import printable, printable_doc
from numa_agent.core.topology import MEMORY_ONLY
from numa_agent.core.units import format_bytes

PROG = "numa-agent status"
_COLUMNS = ("capacity", "reserved", "allocated", "free")
INTRUDERS_SHOWN = 3  # per workload, without --intruders: more are counted, not listed


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "status", help="per-node CPUs, memory, hugepages, devices and the workloads",
        description="Show, per NUMA node, CPUs, memory, each hugepage size and devices as "
                    "capacity / reserved / allocated / free, then each workload.")
    parser.add_argument("--json", action="store_true", help="print the agent's status as JSON")
    parser.add_argument("--memory", action="store_true",
                        help="also read the memory per NUMA node of workloads without a cgroup "
                             "(affinity mode: /proc/PID/numa_maps, costly); with a cgroup it is always shown")
    parser.add_argument("--intruders", action="store_true",
                        help="list every intruder and kernel thread on exclusive CPUs (by default: "
                             f"the first {INTRUDERS_SHOWN} intruders of each workload, and counts)")
    parser.add_argument("--kubelet", action="store_true",
                        help="print the kubelet-shaped cpu_manager_state and memory_manager_state instead")
    common.add_socket_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.kubelet:
        return _kubelet(args)
    try:
        _, status = common.call(args, "GET", "/v1/status?memory=1" if args.memory else "/v1/status")
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return 1
    if args.json:
        common.print_json(status)
    else:
        print("\n".join(format_status(status, now=time.time(), intruders=args.intruders)))
    return 0


def _kubelet(args: argparse.Namespace) -> int:
    """Both kubelet-shaped documents, each under the path of its file (or
    "not written" when the agent keeps no files); --json: one object."""
    try:
        _, docs = common.call(args, "GET", "/v1/kubelet")
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return 1
    if args.json:
        common.print_json(docs)
        return 0
    directory = docs.get("directory")
    for name in ("cpu_manager_state", "memory_manager_state"):
        where = f"{directory.rstrip('/')}/{name}" if directory else f"{name} (not written: files are off)"
        print(printable(f"# {where}"))
        common.print_json(docs.get(name))
    return 0


def _table(rows: list[list[str]], right_from: int) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.rjust(w) if i >= right_from else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=False))]
        out.append("  ".join(cells).rstrip())
    return out


def _amounts(values: dict[str, Any], fmt=str) -> list[str]:
    return [fmt(values[c]) if values.get(c) is not None else "-" for c in _COLUMNS]


def node_rows(nodes: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["NODE", "RESOURCE", *[c.upper() for c in _COLUMNS]]]
    for node in nodes:
        nid = str(node.get("id", "?"))
        if "cpus" in node:
            rows.append([nid, "cpus", *_amounts(node["cpus"])])
        if "memory_bytes" in node:
            rows.append([nid, "memory", *_amounts(node["memory_bytes"], format_bytes)])
        for size, values in sorted((node.get("hugepages") or {}).items()):
            rows.append([nid, f"hugepages-{size}", *_amounts(values)])
        for resource, values in sorted((node.get("devices") or {}).items()):
            rows.append([nid, f"device {resource}", *_amounts(values)])
    return rows


def memory_note_lines(nodes: list[dict[str, Any]]) -> list[str]:
    """Where status's memory differs from `numa-agent topology`'s, and the
    nodes short of their bookings."""
    lines = []
    for node in nodes:
        total, memory = node.get("memory_total_bytes"), node.get("memory_bytes") or {}
        capacity = memory.get("capacity")
        if total is not None and capacity is not None and total != capacity:
            lines.append(f"node {node.get('id')} memory capacity is its MemTotal {format_bytes(total)} "
                         f"(as `numa-agent topology` shows it) less its hugepage pools {format_bytes(total - capacity)}")
        for short in node.get("memory_short") or []:
            lines.append(f"NODE {node.get('id')} SHORT OF MEMORY: {short['resource']} "
                         f"{format_bytes(short['booked_bytes'])} booked, {format_bytes(short['allocatable_bytes'])} "
                         f"allocatable since it shrank; it takes no new admission")
    return lines


def _age(created: float | None, now: float) -> str:
    if not created:  # None, or 0 from an agent that did not know it
        return "-"
    seconds = max(0, int(now - created))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def workload_rows(workloads: list[dict[str, Any]], now: float) -> list[list[str]]:
    rows = [["NAME", "OWNER", "POD", "CPUS", "NODES", "DEVICES", "AGE"]]
    for wl in workloads:
        cpus = wl.get("cpus") or "-"
        if cpus != "-" and not wl.get("exclusive", True):
            cpus += " (shared)"
        devices = ",".join(d.get("address", "?") for d in wl.get("devices") or []) or "-"
        rows.append([str(wl.get("name", "?")), str(wl.get("owner") or wl.get("owner_uid", "-")),
                     _pod_cell(wl), cpus,
                     ",".join(str(n) for n in wl.get("numa_nodes") or []) or "-",
                     devices, _age(wl.get("created_unix"), now)])
    return rows


def _pod_cell(wl: dict[str, Any]) -> str:
    """The agent's pod, or for a container its runtime enforces (NRI) its
    Kubernetes namespace/pod/container."""
    ref = wl.get("runtime") or {}
    if ref.get("pod"):
        return "/".join(str(ref.get(key) or "-") for key in ("namespace", "pod", "container"))
    return wl.get("pod") or "-"


def owner_lines(owners: list[dict[str, Any]]) -> list[str]:
    """What each owner holds, and of what limit ([quotas]: which entry)."""
    if not owners:
        return []

    def cell(part: dict[str, Any], fmt=str) -> str:
        if part.get("limit") is None:
            return fmt(part.get("used", 0))
        return f"{fmt(part.get('used', 0))} of {fmt(part['limit'])} ({part.get('entry')})"

    rows = [["OWNER", "CPUS", "MEMORY", "DEVICES"]]
    for owner in owners:
        devices = ", ".join(f"{resource} {cell(part)}" for resource, part in (owner.get("devices") or {}).items())
        rows.append([str(owner.get("owner") or owner.get("owner_uid", "-")), cell(owner.get("cpus") or {}),
                     cell(owner.get("memory_bytes") or {}, format_bytes), devices or "-"])
    return ["", "use per owner:"] + _table(rows, right_from=4)


def observation_lines(workloads: list[dict[str, Any]], intruders: bool = False) -> list[str]:
    """Memory per node (and how much lies outside the booked nodes), then intruders:
    every one with `intruders`, else the first few of each workload and a count, and
    the kernel's threads as a count, so the workload table stays in sight."""
    lines = []
    for wl in workloads:
        numa = wl.get("memory_numa")
        if not numa:
            continue
        per_node = ", ".join(f"node {n} {format_bytes(v)}" for n, v in (numa.get("bytes") or {}).items())
        outside = numa.get("outside_bytes")
        lines.append(f"memory {wl.get('name')}: {per_node or 'none'}" + (
            f"; outside booked nodes {format_bytes(outside)} ({numa['outside_ratio']:.1%})"
            if outside is not None else ""))
    held_back = 0
    for wl in workloads:
        found = wl.get("intruders") or []
        shown = found if intruders else found[:INTRUDERS_SHOWN]
        for i in shown:
            lines.append(f"INTRUDER on {wl.get('name')}'s CPU {i.get('cpu')}: pid {i.get('pid')} tid "
                         f"{i.get('tid')} ({i.get('command')})")
        if len(found) > len(shown):
            lines.append(f"INTRUDERS on {wl.get('name')}'s CPUs: {len(found) - len(shown)} more")
        kernel = wl.get("kernel_threads") or []
        if kernel and intruders:
            lines.append(f"kernel threads on {wl.get('name')}'s CPUs: " + ", ".join(
                f"{k.get('command')} (pid {k.get('pid')}, CPU {k.get('cpu')})" for k in kernel))
        elif kernel:
            lines.append(f"kernel threads on {wl.get('name')}'s CPUs: {len(kernel)}")
        held_back += len(found) - len(shown) + (0 if intruders else len(kernel))
    if held_back:
        lines.append("(numa-agent status --intruders lists every intruder and kernel thread)")
    return [""] + lines if lines else []


def memory_only_lines(nodes: list[dict[str, Any]], policy: dict[str, Any]) -> list[str]:
    """Which nodes are memory-only, and whether a booking must name them."""
    memory_only = [str(n.get("id")) for n in nodes if n.get("kind") == MEMORY_ONLY]
    if not memory_only:
        return []
    listed = ",".join(memory_only)
    if policy.get("memory_only_nodes") == "ordinary":
        return [f"node(s) {listed} memory-only (no usable CPU), booked like any node (memory_only_nodes = \"ordinary\")"]
    return [f"node(s) {listed} memory-only (no usable CPU): booked only for a request naming them (-m)"]


def format_status(status: dict[str, Any], now: float, intruders: bool = False) -> list[str]:
    """The status as lines for a person. Every text in it is escaped first (process names,
    owners, cgroup paths, reasons: anyone's text), so that the columns are measured on
    what is printed and no control character reaches the terminal; --json keeps them exact."""
    status = printable_doc(status)
    policy = status.get("policy") or {}
    lines = [f"enforcement: {status.get('enforcement', '-')}   topology policy: "
             f"{policy.get('topology', '-')} (scope {policy.get('scope', '-')})   "
             f"shared pool: {status.get('shared_pool') or '-'}", *nri_lines(status.get("nri")), ""]
    lines += _table(node_rows(status.get("nodes") or []), right_from=2)
    lines += memory_note_lines(status.get("nodes") or [])
    lines += memory_only_lines(status.get("nodes") or [], policy)
    workloads = status.get("workloads") or []
    lines.append("")
    if workloads:
        lines += _table(workload_rows(workloads, now), right_from=7)
    else:
        lines.append("no workloads")
    for pod in status.get("pods") or []:
        budget = f" (budget {describe_amounts(pod['budget'])})" if pod.get("budget") else ""
        lines.append(f"pod {pod.get('name')}: cpus {pod.get('cpus') or '-'} nodes "
                     f"{','.join(str(n) for n in pod.get('numa_nodes') or []) or '-'} members "
                     f"{','.join(pod.get('members') or []) or '-'}{budget}")
    lines += owner_lines(status.get("quotas") or [])
    lines += observation_lines(workloads, intruders)
    rebuilt = [wl for wl in workloads if wl.get("rebuilt")]
    if rebuilt:
        lines.append("")
        lines += [f"rebuilt from its process after the checkpoint was lost: {wl.get('name')} "
                  f"(not known: {', '.join(wl.get('unknown') or []) or '-'})" for wl in rebuilt]
    lines += isolation_status_lines(status, workloads)
    for r in status.get("released") or []:
        lines.append(f"UNMANAGED pid {r.get('pid')}: was workload {r.get('name')}, {r.get('reason')} "
                     f"{_age(r.get('released_unix'), now)} ago while it ran; it runs on the shared pool")
    for q in status.get("quarantined") or []:
        lines.append(f"HELD {q.get('name')}: CPUs {q.get('cpus') or 'none'} not handed out: pid "
                     f"{q.get('pid')} ({q.get('marked')}, affinity {q.get('affinity')}): "
                     f"{q.get('reason')}; {q.get('remedy')}")
    return lines


def nri_lines(nri: dict[str, Any] | None) -> list[str]:
    """Whether the NRI plugin is connected to the runtime (only when [nri] is enabled)."""
    if not nri:
        return []
    if nri.get("connected"):
        return [f"NRI plugin {nri.get('plugin')}: connected to {nri.get('runtime') or 'the runtime'} on "
                f"{nri.get('socket')}"]
    return [f"NRI plugin {nri.get('plugin')}: NOT CONNECTED to {nri.get('socket')}: "
            f"{nri.get('error') or 'connecting'}"]


def isolation_status_lines(status: dict[str, Any], workloads: list[dict[str, Any]]) -> list[str]:
    lines = []
    for wl in workloads:
        if wl.get("isolation"):
            lines.append(f"{wl.get('name')}:")
            lines += common.isolation_lines(wl)
    iso = status.get("isolation") or {}
    if iso.get("knobs_held"):
        lines.append(f"isolation: {iso['knobs_held']} setting(s) changed from their original")
    if iso.get("not_movable"):
        lines.append(f"isolation: interrupts the kernel manages (not movable): "
                     f"{', '.join(k.split('/', 1)[1] for k in iso['not_movable'])}")
    for f in iso.get("restore_failures") or []:
        lines.append(f"ISOLATION RESTORE FAILED {f.get('knob')}: original {f.get('original')!r} not "
                     f"written back: {f.get('error')} (retried)")
    for c in iso.get("changed_by_others") or []:
        lines.append(f"isolation: {c.get('knob')} changed by someone else to {c.get('found')!r} while held: "
                     f"left so, its original {c.get('original')!r} not restored")
    if iso.get("irqbalance"):
        lines.append(f"isolation: {iso['irqbalance']}")
    return [""] + lines if lines else []
