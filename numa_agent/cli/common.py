"""Shared bits of the client-side commands (numa-run, status, explain, release).

The allocation options are defined once here and used by both `numa-run`
and `numa-agent explain`. Imports stay light (os, sys and the minimal API
client) because `numa-run` starts before every workload: argparse, json and
the policy enums are imported where they are used, which a launch in its common
forms is not (numa_agent.cli.launch_args reads its command line).
"""

from __future__ import annotations

import os
import sys

from numa_agent.api.client import ClientError, request
from numa_agent.core import request_syntax, units
from numa_agent.core.cpuset import EMPTY, CpuSet
from numa_agent.core.listforms import ListForm, ListFormError, parse_list_form, resolve
from numa_agent.core.names import DEFAULT_SOCKET, MEMORY_ONLY
from numa_agent.core.printable import printable, printable_doc
from numa_agent.core.record import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable


class CliError(Exception):
    """A failure to report as one line, without a traceback."""


class AgentError(CliError):
    """The agent answered with an error body; `body` is its "error" object."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(error.get("message") or f"agent answered HTTP {status}")
        self.status = status
        self.error = error


def stdout_closed() -> int:
    """The reader of stdout went away (`| head -1`): the exit status, 0, after pointing
    stdout at /dev/null so that the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


# ------------------------------------------------------------------ socket
def add_socket_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", metavar="PATH", default=None,
                        help=f"agent API socket (default: $NUMA_AGENT_SOCKET or {DEFAULT_SOCKET})")


def resolve_socket(args: argparse.Namespace) -> str:
    """--socket, else $NUMA_AGENT_SOCKET, else the default path."""
    return getattr(args, "socket", None) or os.environ.get("NUMA_AGENT_SOCKET") or DEFAULT_SOCKET


def call(args: argparse.Namespace, method: str, path: str,
         body: dict | None = None, while_waiting: Callable[[], object] | None = None) -> tuple[int, dict]:
    """One API call; raises CliError when the agent is unreachable or answers an error.
    `while_waiting` runs once while the agent works (api.client.request)."""
    try:
        status, answer = request(resolve_socket(args), method, path, body,
                                 while_waiting=while_waiting)
    except ClientError as exc:
        raise CliError(str(exc)) from None
    if status >= 400:
        raise AgentError(status, answer.get("error") or {"message": f"agent answered HTTP {status}"})
    return status, answer


def print_error(prog: str, message: str) -> None:
    """One line on stderr: whatever the message quotes (a process's, a user's or the
    agent's text) is escaped, so no control reaches the terminal and no line is forged."""
    print(printable(f"{prog}: error: {message}"), file=sys.stderr)


def report_agent_error(prog: str, exc: AgentError, *, as_json: bool = False,
                       heading: str | None = None, stream: Any = None) -> None:
    """An error the agent answered, as every command says it: the error object as JSON
    on stdout (--json); a refusal with its reasoning under `heading` (default "PROG:
    refused") on `stream` (default stderr); anything else as one error line."""
    from numa_agent.api.errors import REFUSAL_CODES  # only on an error: numa-run starts fast

    if as_json:
        print_json({"error": exc.error})
    elif exc.error.get("code") in REFUSAL_CODES:
        print("\n".join(refusal_lines(heading or f"{prog}: refused", exc.error)),
              file=stream or sys.stderr)
    else:
        print_error(prog, str(exc))


def print_json(data: Any, stream=None) -> None:
    import json

    json.dump(data, stream or sys.stdout, indent=2, sort_keys=True)
    (stream or sys.stdout).write("\n")


# ------------------------------------------------------------------ values
def _type_error(message: str) -> Exception:
    """argparse's error for a bad option value, which argparse words (argparse is
    imported only then: numa_agent.cli.launch_args leaves bad values to it)."""
    import argparse

    return argparse.ArgumentTypeError(message)


class GivenSize(int):
    """A size in bytes as a person gave it: `unit` says whether the text named a unit
    (`1Ki`, `1k`) or was a plain number, which small_size_warnings warns of."""

    unit: bool = False


def parse_size(text: str) -> int:
    """core.units.parse_size for argparse (its rule: Kubernetes quantities)."""
    try:
        size = GivenSize(units.parse_size(text))
    except ValueError as exc:
        raise _type_error(str(exc)) from None
    size.unit = not text.strip().isdigit()
    return size


def small_size_warnings(sizes: list[tuple[str, int | None]], page: int | None = None) -> list[str]:
    """One line for each size a person gave as a plain number below a memory page: it is
    bytes (`--memory 1024` books 1 KiB), which is almost never what was meant. Warnings,
    not errors: the request goes on. `page` defaults to this machine's page size."""
    if not any(value for _, value in sizes):
        return []
    page = page or os.sysconf("SC_PAGE_SIZE")
    return [f"warning: {option} {value} is {value:,} bytes, less than a {units.format_bytes(page)} "
            f"page (a size without a unit is bytes): did you mean {value}Mi or {value}M? "
            "(units Ki, Mi, Gi, Ti: 1024s; k, M, G, T: 1000s)"
            for option, value in sizes if value and value < page and not getattr(value, "unit", False)]


def warn_small_sizes(prog: str, sizes: list[tuple[str, int | None]]) -> None:
    """small_size_warnings on stderr, each line under `prog`."""
    for line in small_size_warnings(sizes):
        print(f"{prog}: {line}", file=sys.stderr)


def binding_text(record: dict[str, Any], env: dict[str, str]) -> str:
    """`cpus 2-3 mems 0 devices - (cgroup)`: what a launch was given, as -v says it."""
    return (f"cpus {env['NUMA_AGENT_CPUS'] or '-'} mems {env['NUMA_AGENT_MEMS'] or '-'} devices "
            f"{env['NUMA_AGENT_DEVICES'] or '-'} ({record.get('enforcement', '-')})")


def memory_booked_text(record: dict[str, Any]) -> str:
    """The memory a workload holds, for people: "1 GiB on node 0", "8 GiB on nodes 0,1
    (4 GiB, 4 GiB)", or "none booked" (the agent's memory_bytes: bytes per node)."""
    per_node = {str(n): int(v) for n, v in (record.get("memory_bytes") or {}).items() if v}
    if not per_node:
        return "none booked"
    nodes = sorted(per_node, key=lambda n: int(n) if n.isdigit() else 0)
    text = f"{units.format_bytes(sum(per_node.values()))} on node{'s' if len(nodes) > 1 else ''} {','.join(nodes)}"
    if len(nodes) > 1:
        text += f" ({', '.join(units.format_bytes(per_node[n]) for n in nodes)})"
    return text


def _argument(parse, *args):
    """A request_syntax parser for argparse: its ValueError as argparse's error."""
    try:
        return parse(*args)
    except ValueError as exc:
        raise _type_error(str(exc)) from None


def parse_count(text: str, what: str, low: int = 0) -> int:
    return _argument(request_syntax.parse_count, text, what, low)


def cpu_count(text: str) -> int:
    return parse_count(text, "CPU count")


def exclusive_cpu_count(text: str) -> int:
    """--cpus: one or more. Zero exclusive CPUs is the shared pool, which --shared (or no
    --cpus) asks for by name: a 0 from a script's empty arithmetic is refused, not guessed."""
    count = cpu_count(text)
    if count == 0:
        raise _type_error(
            "0 exclusive CPUs is the shared pool: say --shared, or leave --cpus out (a booking "
            "of memory or devices alone runs on the shared pool)")
    return count


def task_count(text: str) -> int:
    """numa-run --tasks: one rank or more."""
    count = parse_count(text, "task count")
    if count == 0:
        raise _type_error("0 tasks launch nothing: give 1 or more (or leave --tasks out)")
    return count


def hugepages_item(text: str) -> tuple[str, int]:
    """"2Mi=512" -> ("2048", 512): page size in kB as the API wants it."""
    return _argument(request_syntax.parse_hugepages_item, text)


def device_item(text: str) -> tuple[str, int]:
    """"gpu=1" -> ("gpu", 1); a bare "gpu" means one."""
    return _argument(request_syntax.parse_device_item, text)


def node_list(text: str) -> ListForm:
    """A NUMA node list in numactl's forms: "0,2-3", "all", "+0", "!1"."""
    try:
        return parse_list_form(text, what="NUMA node", highest=1023)
    except ListFormError as exc:
        raise _type_error(str(exc)) from None


def cpu_list(text: str) -> ListForm:
    """A CPU list in numactl's forms: "2-5,8", "all", "+0-1", "!0"."""
    try:
        return parse_list_form(text, what="CPU", highest=8191)
    except ListFormError as exc:
        raise _type_error(str(exc)) from None


class ListContext(Record):
    """What numactl's "all", "+" and "!" are relative to: the machine's CPUs and
    nodes and the allowed ones (the agent's view: what its cpuset allows, less
    the memory-only nodes a request must name by number). Four CpuSets; a Record
    rather than a dataclass, whose import costs numa-run ~15 ms."""

    __slots__ = ("cpus", "allowed_cpus", "nodes", "allowed_nodes")
    cpus: CpuSet
    allowed_cpus: CpuSet
    nodes: CpuSet
    allowed_nodes: CpuSet

    @classmethod
    def from_topology(cls, doc: dict[str, Any]) -> "ListContext":
        """From the agent's `topology --json` document (allowed_*: null means all)."""
        nodes = CpuSet(int(n["id"]) for n in doc.get("numa_nodes") or [])
        cpus = (CpuSet.parse(doc["online_cpus"]) if doc.get("online_cpus") is not None
                else CpuSet.union_of(CpuSet.parse(n.get("cpus") or "")
                                     for n in doc.get("numa_nodes") or []))
        allowed_cpus, allowed_mems = doc.get("allowed_cpus"), doc.get("allowed_mems")
        allowed_nodes = nodes if allowed_mems is None else CpuSet.parse(allowed_mems)
        if doc.get("memory_only_nodes") != "ordinary":  # "all" does not name them
            allowed_nodes -= CpuSet(int(n["id"]) for n in doc.get("numa_nodes") or []
                                    if n.get("kind") == MEMORY_ONLY)
        return cls(cpus=cpus,
                   allowed_cpus=cpus if allowed_cpus is None else CpuSet.parse(allowed_cpus),
                   nodes=nodes, allowed_nodes=allowed_nodes)


def needs_list_context(*values: Any) -> bool:
    return any(isinstance(v, ListForm) and v.needs_context for v in values)


def list_context(args: argparse.Namespace, *values: Any) -> ListContext | None:
    """The agent's topology, asked only when one of `values` needs it."""
    if not needs_list_context(*values):
        return None
    _, doc = call(args, "GET", "/v1/topology")
    return ListContext.from_topology(doc)


def resolve_nodes(form: ListForm | None, context: ListContext | None) -> list[int] | None:
    if form is None:
        return None
    try:
        return list(resolve(form, machine=context.nodes if context else EMPTY,
                            allowed=context.allowed_nodes if context else EMPTY,
                            what="NUMA node").ids())
    except ListFormError as exc:
        raise CliError(str(exc)) from None


def resolve_cpus(form: ListForm | None, context: ListContext | None) -> str | None:
    if form is None:
        return None
    try:
        return resolve(form, machine=context.cpus if context else EMPTY,
                       allowed=context.allowed_cpus if context else EMPTY).format()
    except ListFormError as exc:
        raise CliError(str(exc)) from None


def placement_context(args: argparse.Namespace) -> ListContext | None:
    """The context -C/-N/-m need, fetched from the agent only for "all", "+" or "!"."""
    return list_context(args, args.physcpubind, args.cpunodebind, args.membind)


def _merge(pairs: list[tuple[str, int]] | None, option: str) -> dict[str, int]:
    merged: dict[str, int] = {}
    for key, count in pairs or []:
        if key in merged:
            # hugepage keys are the API's kB: name the size as people write it too
            named = units.page_size_text(int(key)) if option.endswith("hugepages") else key
            raise CliError(f"{option} {named} given twice")
        merged[key] = count
    return merged


# ------------------------------------------------------------------ options
def add_allocation_options(parser: argparse.ArgumentParser) -> None:
    """The request options shared by numa-run and `numa-agent explain`."""
    from numa_agent.core.policy import POLICY_NAMES, STRATEGY_NAMES

    res = parser.add_argument_group("what to allocate")
    res.add_argument("--cpus", type=exclusive_cpu_count, default=0, metavar="N",
                     help="exclusive CPUs (whole physical cores first)")
    res.add_argument("--shared", action="store_true",
                     help="no exclusive CPUs: run in the shared pool")
    res.add_argument("--memory", type=parse_size, default=0, metavar="SIZE",
                     help="memory, e.g. 16Gi or 512Mi (binary: 1024s), 1G or 512M (decimal: "
                          "1000s, as Kubernetes quantities), or plain bytes")
    res.add_argument("--hugepages", type=hugepages_item, action="append", metavar="SIZE=COUNT",
                     help="hugepages of one size, e.g. 2Mi=512, 1Gi=4, or the kernel's 2048kB=1 "
                          "(repeatable)")
    res.add_argument("--device", type=device_item, action="append", metavar="RESOURCE=COUNT",
                     help="devices of one resource, e.g. gpu=1 (repeatable)")
    res.add_argument("--policy", choices=POLICY_NAMES,
                     help="topology manager policy for this request")
    res.add_argument("--numa-allocation-strategy", choices=STRATEGY_NAMES, metavar="STRATEGY",
                     help="how to choose among equally good NUMA nodes for this request: least-allocated "
                          "(the emptiest: spread), most-allocated (the busiest: pack), none (the lowest); "
                          "default: the agent's [topology_manager] option")
    res.add_argument("--name", help="workload name (default: chosen by the agent)")
    numactl = parser.add_argument_group(
        "explicit placement (numactl forms)",
        # Wrapped at 78 columns by hand: textwrap is not imported on numa-run's launch path.
        "Lists as numactl takes them: 0-3,8; all (every allowed CPU or node, the\n"
        "agent's cpuset); +LIST (positions in the allowed set: +0 is its first); !LIST\n"
        "(every CPU or node of the machine but these; quote it for the shell, '!0'). No\n"
        "taskset hex mask: numactl takes none either.")
    numactl.add_argument("-C", "--physcpubind", type=cpu_list, metavar="CPUS",
                         help="exactly these CPUs, booked exclusively, e.g. 2-5 or '!0'")
    # numactl's older names first: a synopsis shows the last long name
    numactl.add_argument("-c", "--cpubind", "-N", "--cpunodebind", dest="cpunodebind", type=node_list,
                         metavar="NODES",
                         help="CPUs from these NUMA nodes, e.g. 0 or 0,1 or all (-c/--cpubind: "
                              "numactl's older names)")
    numactl.add_argument("-m", "--membind", type=node_list, metavar="NODES",
                         help="memory from these NUMA nodes (booked, and the cgroup's "
                              "cpuset.mems; MPOL_BIND in the affinity fallback)")
    pod = parser.add_argument_group("pods (several workloads sharing one aligned budget)")
    pod.add_argument("--pod", metavar="NAME", help="join (or create) this pod")
    pod.add_argument("--pod-cpus", type=cpu_count, metavar="N",
                     help="pod budget: CPUs (first member only)")
    pod.add_argument("--pod-memory", type=parse_size, metavar="SIZE", help="pod budget: memory")
    pod.add_argument("--pod-hugepages", type=hugepages_item, action="append", metavar="SIZE=COUNT",
                     help="pod budget: hugepages (repeatable)")
    pod.add_argument("--pod-device", type=device_item, action="append", metavar="RESOURCE=COUNT",
                     help="pod budget: devices (repeatable)")
    iso = parser.add_argument_group("isolation of exclusive CPUs (see docs/isolation.md)")
    iso.add_argument("--isolate", type=isolate_kinds, metavar="LIST",
                     help="irqs (interrupts moved off), idle (wake-up latency bounded), freq "
                          "(performance governor), or all; comma-separated; root or the agent's "
                          "[isolation] group only. Default: the agent's [isolation] default")
    iso.add_argument("--isolate-strict", action="store_true",
                     help="refuse rather than isolate in part (a knob missing or not writable)")
    add_socket_option(parser)


def isolate_kinds(text: str) -> list[str]:
    from numa_agent.isolation.plan import IsolateSyntaxError, parse_kinds

    try:
        return list(parse_kinds([text]))
    except IsolateSyntaxError as exc:
        raise _type_error(str(exc)) from None


def build_request(args: argparse.Namespace, command: list[str] | None = None,
                  context: ListContext | None = None,
                  membind: list[int] | None = None) -> dict[str, Any]:
    """The admit request body for the parsed allocation options; `context`
    resolves numactl's relative list forms, `membind` stands in for -m."""
    if args.shared and args.cpus:
        raise CliError("--shared and --cpus exclude each other: shared means no exclusive CPUs")
    req: dict[str, Any] = {"cpus": args.cpus, "shared": args.shared, "memory_bytes": args.memory,
                           "hugepages": _merge(args.hugepages, "--hugepages"),
                           "devices": _merge(args.device, "--device")}
    placement = {"physcpubind": resolve_cpus(args.physcpubind, context),
                 "cpunodebind": resolve_nodes(args.cpunodebind, context),
                 "membind": membind if membind is not None else resolve_nodes(args.membind, context)}
    for key in ("name", "pod", "policy", "numa_allocation_strategy"):
        value = getattr(args, key)
        if value is not None:
            req[key] = value
    req.update({key: value for key, value in placement.items() if value is not None})
    budget_given = (args.pod_cpus is not None or args.pod_memory is not None
                    or args.pod_hugepages or args.pod_device)
    if budget_given:
        if args.pod is None:
            raise CliError("--pod-cpus/--pod-memory/--pod-hugepages/--pod-device need --pod NAME")
        req["pod_budget"] = {"cpus": args.pod_cpus or 0, "memory_bytes": args.pod_memory or 0,
                             "hugepages": _merge(args.pod_hugepages, "--pod-hugepages"),
                             "devices": _merge(args.pod_device, "--pod-device")}
    isolate = getattr(args, "isolate", None)
    if isolate is not None:
        if args.shared or (not args.cpus and args.physcpubind is None):
            raise CliError("--isolate needs exclusive CPUs (--cpus N or --physcpubind): the shared "
                           "pool's CPUs are everyone's")
        req["isolate"] = isolate
    if getattr(args, "isolate_strict", False):
        if isolate is None:
            raise CliError("--isolate-strict needs --isolate LIST")
        req["isolate_strict"] = True
    if command:
        req["command"] = list(command)
    return req


# ------------------------------------------------------------------ output
def _mask(mask: Any) -> str:
    if mask is None:
        return "any"
    return "{" + ",".join(str(n) for n in mask) + "}"


# The topology manager's verdict, which is not the outcome (best-effort admits
# what is not aligned; an aligned request can still be refused).
_VERDICTS = {"aligned": "aligned", "not-aligned": "not aligned", "not-checked": "not checked"}


def explanation_lines(explanation: dict[str, Any]) -> list[str]:
    """The reasoning of one decision, a few lines a person can act on."""
    lines = []
    topology = explanation.get("topology") or {}
    if topology:
        lines.append(f"  topology manager: {_VERDICTS.get(str(topology.get('verdict')), '-')} "
                     f"(policy {topology.get('policy', '-')}, scope {topology.get('scope', '-')})")
    free = explanation.get("free") or {}
    if free:
        parts = []
        for node in sorted(free, key=lambda k: int(k) if str(k).lstrip("-").isdigit() else 0):
            item = free[node]
            cpus = item.get("cpus", "-")
            text = f"node {node}: {cpus} CPU{'' if cpus == 1 else 's'}"
            if "memory_bytes" in item:
                text += f", {units.format_bytes(item['memory_bytes'])}"
            parts.append(text)
        lines.append("  free: " + "; ".join(parts))
    for provider in explanation.get("providers") or []:
        hints = ", ".join(provider.get("hints") or []) or "no preference"
        more = provider.get("more") or 0
        if more > 0:
            hints += f" (+{more} more)"
        elif more < 0:  # the agent did not count them: too many to enumerate
            hints += " (+ wider masks, not counted)"
        name = provider.get("provider", "?")
        resource = provider.get("resource")
        label = name if not resource or resource == name else f"{name}/{resource}"
        lines.append(f"  hints {label}: {hints}")
    merged = explanation.get("merged")
    if merged:
        pref = "preferred" if merged.get("preferred") else "not preferred"
        lines.append(f"  merged hint: {_mask(merged.get('mask'))} {pref}")
    tie = explanation.get("tie_break")
    if tie:
        text = f"  numa-allocation-strategy {tie.get('strategy')}: {_mask(tie.get('nodes'))} (allocated score {tie.get('score')})"
        if tie.get("instead_of") is not None:
            text += f", chosen over the lowest {_mask(tie['instead_of'])} (score {tie.get('instead_of_score')})"
        lines.append(text)
    return lines


def refusal_lines(prefix: str, error: dict[str, Any]) -> list[str]:
    """A refusal: "<prefix>: <reason>", then the reasoning (every text escaped)."""
    prefix, error = printable(prefix), printable_doc(error)
    details = error.get("details") or {}
    reason = details.get("reason") or error.get("message") or "admission refused"
    message = error.get("message") or reason
    lines = [f"{prefix}: {reason}"]
    if message != reason:
        lines.append(f"  {message}")
    return lines + explanation_lines(details)


def decision_lines(record: dict[str, Any]) -> list[str]:
    """A one-line summary of an admission (or dry run), then its reasoning (every text escaped)."""
    record = printable_doc(record)
    devices = ",".join(d.get("address", "?") for d in record.get("devices") or []) or "-"
    nodes = ",".join(str(n) for n in record.get("numa_nodes") or []) or "-"
    mems = ",".join(str(n) for n in record.get("mems") or []) or "-"
    verb = "would admit" if record.get("dry_run") else "admitted"
    lines = [f"{verb} {record.get('name', '?')}: cpus {record.get('cpus') or '-'}"
             f"{' (exclusive)' if record.get('exclusive') else ' (shared)'} "
             f"numa nodes {nodes} mems {mems} devices {devices} "
             f"enforcement {record.get('enforcement', '-')}"]
    return lines + isolation_lines(record) + explanation_lines(record.get("explanation") or {})


def isolation_lines(record: dict[str, Any]) -> list[str]:
    """What --isolate did for a workload and what it could not do (escaped: the
    reasons not done quote what the kernel and irqbalance answered)."""
    iso = printable_doc(record.get("isolation"))
    if not iso:
        return []
    done = ", ".join(iso.get("done") or []) or "nothing"
    lines = [f"  isolation ({', '.join(iso.get('asked') or [])}{', strict' if iso.get('strict') else ''}): "
             f"{done} done"]
    return lines + [f"  isolation not done: {item}" for item in iso.get("not_done") or []]


def discover_at(source: str):
    """The Topology under `source`: a sys/ and proc/ tree, or a snapshot archive of one
    (extracted for discovery and removed again once read)."""
    from numa_agent.discovery.sysfs import read_topology
    from numa_agent.service.snapshot import extract_snapshot, is_archive, remove_snapshot

    if not is_archive(source):
        return read_topology(source)
    scratch, root = extract_snapshot(source)
    try:
        return read_topology(root)
    finally:
        remove_snapshot(scratch)  # discovery has read everything it needs


def offline_machine(config: str | None, sysfs_root: str | None):
    """(config, topology, machine) without an agent, as `serve` would build them: the config
    file (the default one only if it is there), and the machine under `sysfs_root` or the
    config's own (`discover_at`). A failure is a CliError with its one line."""
    from dataclasses import replace

    from numa_agent.admission.machine import MachineConfigError, build_machine
    from numa_agent.daemon.config import ConfigError, load_config
    from numa_agent.discovery.sysfs import DiscoveryError
    from numa_agent.service.snapshot import SnapshotError

    try:
        cfg = load_config(config, required=config is not None)
        if sysfs_root is not None:
            cfg = replace(cfg, sysfs_root=sysfs_root)
        topology = discover_at(cfg.sysfs_root)
        return cfg, topology, build_machine(topology, cfg.policy)
    except (ConfigError, DiscoveryError, SnapshotError) as exc:
        raise CliError(str(exc)) from None
    except MachineConfigError as exc:
        raise CliError(f"configuration does not fit this machine: {exc}") from None
    except OSError as exc:
        raise CliError(f"{exc.filename or sysfs_root}: {exc.strerror or exc}") from None
