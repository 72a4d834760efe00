"""`numa-run`: run a command on a NUMA-aligned allocation granted by the agent.

The agent identifies this process by the socket's peer credentials and, on
admission, has already moved it into the workload's cgroup; numa-run then
sets the environment and execs the command, so the PID, signals and exit
status are the command's own. Imports are kept to the minimum because this
runs in front of every latency-sensitive program: no third-party module, and of
the standard library no typing, dataclasses, pathlib, shutil, textwrap or socket
(the raw _socket); what only some launches need (ctypes for a memory policy,
Slurm's rules inside a Slurm task) is imported where it is used: ctypes only
where a memory policy is set (while the agent decides, for -i/-p/-l/-w; where
the affinity fallback binds), never for a launch its cgroup confines. Installed,
numa-run is bin/numa-run, a script file that imports nothing but this module.
scripts/bench-numa-run shows the cost and the slowest imports.
"""

from __future__ import annotations

import os
import sys

from numa_agent import __version__
from numa_agent.api.client import new_request_id
from numa_agent.cli import common, launch_args
from numa_agent.core import names
from numa_agent.core.mempolicy import (
    MemoryPolicy,
    PolicyRefused,
    binding_needed,
    chosen_policy,
    effective_policy,
    failure_message,
    name_policy_nodes,
    request_membind,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable, Mapping

    from numa_agent.core.slurm import Confinement

PROG = "numa-run"
EXIT_FAILURE = 125       # numa-run's own failure (unreachable, refused, bad option)
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
NVIDIA_VENDOR = "0x10de"

EXAMPLES = """\
examples:
  numa-run --cpus 4 --memory 8Gi -- ./server --port 8080
      4 exclusive CPUs (whole cores) and 8 GiB on one NUMA node
  numa-run --cpus 8 --device gpu=1 --policy single-numa-node python train.py
      8 CPUs and a GPU on the same node, or refuse
  numa-run --hugepages 1Gi=4 --cpus 2 ./dpdk-app
  numa-run -N 1 -m 1 --cpus 2 ./app          CPUs and memory from node 1 only
  numa-run --pod p1 --pod-cpus 6 --cpus 4 ./main   first member books the pod budget
  numa-run --pod p1 --cpus 2 ./sidecar             later members draw from it
  numa-run --dry-run --cpus 16                     show the decision, book nothing
  numa-run --cpus 4 --isolate irqs,idle -v ./app   interrupts off its CPUs, no deep idle
  numa-run -i all --cpus 8 ./db              memory booked on every allowed node, interleaved
  numa-run -m 0,250 --cpus 2 ./app           node 0's memory, then memory-only node 250's
  numa-run -m 0,1 -p 0 --cpus 2 ./app        memory on nodes 0-1, node 0 preferred
  numa-run -N 0 -l --cpus 2 ./app            CPUs of node 0, memory from the running CPU's node
  numa-run -C '!0' --dry-run                 every CPU but 0 (quoted for the shell)
  numa-run -s                                print the current policy, like numactl -s
  numa-run --tasks 8 --cpus 12 --device gpu=1 python train.py
      8 ranks, each with 12 CPUs and a GPU on the GPU's node (per rank, as srun -c)

Memory policies (-i, -p, -l, -w) are set with set_mempolicy(2) right before
exec, inside the booking: their nodes must lie within the booked memory nodes
(NUMA_AGENT_MEMS). Without -m, -i/-w/-p book memory on the nodes they name.
Memory-only nodes (GPU or CXL memory, no usable CPU) are booked only when named
by number: "all" leaves them out, and so does every booking that does not name them.

The command sees NUMA_AGENT_WORKLOAD, NUMA_AGENT_CPUS, NUMA_AGENT_MEMS,
NUMA_AGENT_DEVICES, NUMA_AGENT_MARK (and CUDA_VISIBLE_DEVICES for NVIDIA GPUs).
exit status: the command's own; 125 numa-run failed (agent unreachable,
admission refused, bad option); 126 command not executable; 127 not found.
"""


# numactl's options numa-run does not take, and what to use instead.
_SHM = ("a policy for a shared memory segment or file is numactl's alone (numa-run places a "
        "process): use numactl for the segment, and numa-run -m/-i/-p for the program")
UNSUPPORTED = (
    ("-a", "--all", "CPUs and nodes come from the agent's allowed set; name others with "
                    "-C/-N/-m (all, +LIST, !LIST)"),
    ("-b", "--balancing", "NUMA balancing is the kernel's (sysctl kernel.numa_balancing); "
                          "use -m to bind memory"),
    ("-P", "--preferred-many", "book the nodes with -m NODES and prefer one with -p NODE"),
    ("-H", "--hardware", "use numa-agent topology (its first block is numactl -H's)"),
    (None, "--cpu-compress", "use numa-agent topology"),  # long only: numactl's -c is --cpubind
    ("-S", "--shm", _SHM), ("-f", "--file", _SHM), ("-I", "--shmid", _SHM),
    ("-L", "--length", _SHM), ("-o", "--offset", _SHM), ("-M", "--shmmode", _SHM),
    ("-u", "--huge", _SHM + "; hugepages for the program: --hugepages SIZE=COUNT"),
    ("-t", "--strict", _SHM), ("-T", "--touch", _SHM), ("-d", "--dump", _SHM),
    ("-D", "--dump-nodes", _SHM),
)


def unsupported_message(argument: str) -> str | None:
    """numa-run's answer to one of numactl's options it does not take, else None."""
    option = argument.split("=", 1)[0]
    for short, long, remedy in UNSUPPORTED:
        if option in (short, long):
            names = f"{short}/{long}" if short else long
            return f"numactl's {names} is not supported: {remedy}"
    return None


def build_parser() -> argparse.ArgumentParser:
    """numa-run's argparse parser: the reference for its options, help and errors (and
    the man page's and completions' source); launch_args reads the common forms alone."""
    import argparse

    from numa_agent.cli.numa_run_argparse import Parser

    parser = Parser(
        exit_status=EXIT_FAILURE, explain=unsupported_message,
        prog=PROG,
        usage="%(prog)s [OPTIONS] [--] COMMAND [ARGS...]",
        description="Ask the numa-agent for NUMA-aligned exclusive CPUs, memory, hugepages "
                    "and devices, then run COMMAND inside that allocation.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common.add_allocation_options(parser)
    ranks = parser.add_argument_group(
        "ranks launched together (see docs/numa-run.md)",
        "--cpus, --memory, --hugepages and --device are then per rank, as srun's -c is\n"
        "per task; each rank is booked on one NUMA node with its devices.")
    ranks.add_argument("--tasks", type=common.task_count, metavar="N",
                       help="launch N ranks of COMMAND, booked all or nothing, each on its "
                            "devices' NUMA node, with NUMA_RUN_TASK, LOCAL_RANK and their counts")
    ranks.add_argument("--distribution", choices=("block", "cyclic"),
                       help="ranks to NUMA nodes: block fills one node first (default), cyclic "
                            "goes round the nodes, as srun's --distribution")
    pol = parser.add_argument_group(
        "memory policy (numactl's, set with set_mempolicy(2) before exec; one of them)",
        # Wrapped at 78 columns by hand: textwrap is not imported on the launch path.
        "The nodes must lie within the booked memory nodes (NUMA_AGENT_MEMS), else\n"
        "numa-run refuses (exit 125). Without -m, -i/-w/-p ask the agent for memory on\n"
        "the nodes they name; with -m, the nodes -m books.")
    pol.add_argument("-i", "--interleave", type=common.node_list, metavar="NODES",
                     help="interleave memory page by page over these nodes (MPOL_INTERLEAVE), "
                          "e.g. all or 0,1")
    pol.add_argument("-p", "--preferred", type=common.node_list, metavar="NODE",
                     help="allocate on this one node first, then on the booking's other nodes "
                          "(MPOL_PREFERRED)")
    pol.add_argument("-l", "--localalloc", action="store_true",
                     help="allocate on the node of the CPU the thread runs on (MPOL_LOCAL)")
    pol.add_argument("-w", "--weighted-interleave", type=common.node_list, metavar="NODES",
                     help="interleave by the kernel's per-node weights "
                          "(/sys/kernel/mm/mempolicy/weighted_interleave; "
                          "MPOL_WEIGHTED_INTERLEAVE, Linux 6.9 or later, else refused)")
    pol.add_argument("-s", "--show", action="store_true",
                     help="print this process's policy, CPUs and nodes as numactl --show does, "
                          "and exit; the agent is not asked")
    out = parser.add_argument_group("behaviour")
    out.add_argument("--dry-run", action="store_true",
                     help="print the agent's decision; launch nothing, book nothing")
    out.add_argument("--json", action="store_true",
                     help="print the decision as JSON (stdout for --dry-run and refusals, "
                          "stderr before exec)")
    out.add_argument("-v", "--verbose", action="store_true",
                     help="print the binding to stderr before running the command")
    out.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                        help=argparse.SUPPRESS)
    parser.built = True
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Options stop at the first non-option word or at `--`. The common forms are read
    without argparse (launch_args, which answers as argparse would); argparse reads,
    answers or refuses the rest."""
    args = launch_args.parse(argv)
    return args if args is not None else argparse_args(argv)


def argparse_args(argv: list[str]) -> argparse.Namespace:
    """`argv` read by the argparse parser alone."""
    args = build_parser().parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    return args


def check_command(command: list[str]) -> int | None:
    """Exit status if COMMAND cannot run (checked before anything is booked), looked
    up as execvp will: a name with "/" as it is, else along $PATH (shutil.which, without
    importing shutil)."""
    program = command[0]
    if "/" in program:
        return _runnable(program)
    found = EXIT_NOT_FOUND
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", program)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return None
            found = EXIT_NOT_EXECUTABLE  # a file without the execute bit, unless a later one runs
    return found


def _runnable(path: str) -> int | None:
    if not os.path.exists(path):
        return EXIT_NOT_FOUND
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return EXIT_NOT_EXECUTABLE
    return None


def workload_env(record: dict[str, Any]) -> dict[str, str]:
    """The variables the workload sees, from the admission record."""
    devices = record.get("devices") or []
    env = {
        names.ENV_WORKLOAD: str(record.get("name", "")),
        names.ENV_CPUS: str(record.get("cpus") or ""),
        names.ENV_MEMS: ",".join(str(n) for n in record.get("mems") or []),
        names.ENV_DEVICES: ",".join(d.get("address", "") for d in devices),
        # Whether the CPUs are the workload's own: a rebuild after a lost
        # checkpoint tells exclusive from shared by it.
        names.ENV_EXCLUSIVE: "1" if record.get("exclusive") else "0",
    }
    if record.get("mark"):  # the agent's token for this pid: what a rebuild trusts
        env[names.ENV_MARK] = str(record["mark"])
    gpus = [d for d in devices if str(d.get("vendor", "")).lower() == NVIDIA_VENDOR]
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(_cuda_id(d["address"]) for d in gpus)
    return env


def _cuda_id(address: str) -> str:
    """The GPU's UUID from the NVIDIA driver when it exposes one (CUDA documents
    indices and UUIDs for CUDA_VISIBLE_DEVICES), else its PCI bus id."""
    try:
        with open(f"/proc/driver/nvidia/gpus/{address}/information") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "GPU UUID" and value.strip().startswith("GPU-"):
                    return value.strip()
    except OSError:
        pass
    return address


def _apply_affinity(record: dict[str, Any], bind_memory: bool = True) -> str | None:
    """Fallback mode: pin ourselves too (the agent did, this makes it exact).
    Returns why memory could not be bound, or None. A memory policy option
    replaces the binding (`bind_memory` False): a thread has one policy."""
    cpus = record.get("cpus")
    if cpus:
        from numa_agent.core.cpuset import CpuSet
        os.sched_setaffinity(0, CpuSet.parse(cpus).ids())
    mems = record.get("mems")
    if mems and bind_memory and binding_needed((int(n) for n in mems), _read(HAS_MEMORY)):
        from numa_agent.enforcement.mempolicy import bind_self  # ctypes: only when it binds

        result = bind_self(int(n) for n in mems)
        if not result:
            return result.reason or "memory binding was not applied"
    return None


def _apply_policy(policy: MemoryPolicy) -> str | None:
    """set_mempolicy for this process (inherited through exec); why not, or None."""
    from numa_agent.enforcement.mempolicy import set_policy
    result = set_policy(policy.mode, policy.nodes, label=policy.describe())
    return None if result else failure_message(policy, result.errno_name, result.reason)


def _policy_options(args: argparse.Namespace,
                    context: common.ListContext | None) -> MemoryPolicy | None:
    return chosen_policy(interleave=common.resolve_nodes(args.interleave, context),
                         preferred=common.resolve_nodes(args.preferred, context),
                         localalloc=args.localalloc,
                         weighted_interleave=common.resolve_nodes(args.weighted_interleave,
                                                                  context))


def show() -> int:
    """numactl --show for this process, read without the agent."""
    from numa_agent.core.cpuset import CpuSet
    from numa_agent.core.mempolicy import MPOL_DEFAULT, show_lines
    from numa_agent.enforcement.mempolicy import get_policy, mems_allowed, node_cpus

    reading = get_policy()
    try:
        allowed = mems_allowed()
    except OSError as exc:
        common.print_error(PROG, f"cannot read /proc/self/status: {exc.strerror or exc}")
        return EXIT_FAILURE
    lines = show_lines(mode=reading.mode if reading else MPOL_DEFAULT,
                       nodes=reading.nodes if reading else (),
                       next_node=reading.next_node if reading else None,
                       affinity=CpuSet(os.sched_getaffinity(0)), node_cpus=node_cpus(),
                       mems_allowed=allowed)
    print("\n".join(lines))
    if reading is None:
        print(f"{PROG}: note: get_mempolicy is not available here; policy shown as default",
              file=sys.stderr)
    return 0


def _release(args: argparse.Namespace, name: str) -> None:
    try:
        common.call(args, "DELETE", f"/v1/workloads/{name}")
    except common.CliError as exc:
        common.print_error(PROG, f"could not release {name}: {exc}")


def _print_binding(record: dict[str, Any], env: dict[str, str], memory_note: str | None,
                   policy: MemoryPolicy | None = None) -> None:
    print(f"{PROG}: {record.get('name', '')} {common.binding_text(record, env)}", file=sys.stderr)
    if policy is not None:
        applied = "not applied: enforcement simulated" if record.get("enforcement") == "simulated" \
            else "set"
        print(f"{PROG}: memory policy {policy.describe()} ({applied})", file=sys.stderr)
    print(f"{PROG}: memory {common.memory_booked_text(record)}", file=sys.stderr)
    if memory_note:
        print(f"{PROG}: note: mems not enforced: {memory_note}", file=sys.stderr)
    for line in common.isolation_lines(record):
        print(f"{PROG}:{line[1:]}", file=sys.stderr)


CGROUP_MOUNT = "/sys/fs/cgroup"
HAS_MEMORY = "/sys/devices/system/node/has_memory"  # the nodes with memory, as a list


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _own_cgroup() -> str:
    """This process's cgroup v2 path (the `0::` line of /proc/self/cgroup), or ""."""
    from numa_agent.enforcement.processes import parse_cgroup

    return parse_cgroup(_read("/proc/self/cgroup") or "") or ""


def slurm_case(env: Mapping[str, str] | None = None) -> Confinement | None:
    """Inside a Slurm task: which case applies (numa_agent.core.slurm.Confinement), read
    from the task's cgroup, its affinity and the online CPUs. None outside Slurm."""
    environ = os.environ if env is None else env
    if not environ.get("SLURM_JOB_ID"):  # outside Slurm: nothing more to import or read
        return None
    from numa_agent.core.cpuset import CpuSet
    from numa_agent.core.slurm import confinement, slurm_task

    cgroup = _own_cgroup()
    task = slurm_task(environ, cgroup)
    if task is None:
        return None

    def cpuset(path: str) -> CpuSet | None:
        text = _read(path)
        try:
            return CpuSet.parse(text) if text else None
        except ValueError:
            return None

    affinity = CpuSet(os.sched_getaffinity(0))
    own = f"{CGROUP_MOUNT}{cgroup}" if cgroup else None
    return confinement(task, cgroup, online=cpuset("/sys/devices/system/cpu/online") or affinity,
                       cgroup_cpus=cpuset(f"{own}/cpuset.cpus.effective") if own else None,
                       cgroup_mems=cpuset(f"{own}/cpuset.mems.effective") if own else None,
                       affinity=affinity)


def slurm_request(args: argparse.Namespace, body: dict[str, Any], case: Confinement) -> str | None:
    """Fit the admission to the Slurm case: the task's workload name (unless --name), in
    place on Slurm's cgroup, and, where Slurm confined the task (its cgroup, task/affinity's
    binding: the narrower), within those CPUs, -C and -N too. Returns why numa-run
    refuses, or None."""
    from numa_agent.core.cpuset import CpuSet
    from numa_agent.core.slurm import shared_cgroup_refusal, shares_cgroup, task_refusal, tasks_on_node

    body.setdefault("name", case.task.workload_name(os.geteuid()))
    physcpubind = body.get("physcpubind")
    too_few = task_refusal(case, int(body.get("cpus") or 0), CpuSet.parse(physcpubind) if physcpubind else None)
    if too_few:
        return too_few
    if case.in_place:
        tasks_here = tasks_on_node(os.environ)
        exclusive = int(body.get("cpus") or 0) or (1 if physcpubind else 0)
        shared = shared_cgroup_refusal(case.task, case.cgroup, tasks_here, exclusive)
        if shared:
            return shared
        body["in_place"] = True
        if shares_cgroup(case.cgroup, tasks_here):
            body["pinned"] = True  # the step's tasks share the cgroup: each is pinned inside it
    if case.confined:
        # Never outside what Slurm gave the task: its binding, or its cgroup's grant (which
        # the agent reads itself in place, and cannot in the affinity fallback). The agent
        # writes the booking on the task's cgroup, which the kernel applies to the task
        # whatever task/affinity bound it to: a booking outside the binding would widen it.
        body["within_cpus"] = case.cpus.format()
    return None


def load_memory_tools() -> None:
    """Load what set_mempolicy needs (ctypes and the C library: a few ms) while the agent
    decides, for a launch that asked for a memory policy (-i, -p, -l, -w). The affinity
    fallback's binding, known only from the answer, loads them where it binds; a launch
    its cgroup confines never loads them. A failure here is met again, and reported,
    where the policy is set."""
    try:
        from numa_agent.enforcement.libc import libc
        from numa_agent.enforcement.mempolicy import set_policy  # noqa: F401  (loaded, not called)

        libc()
    except Exception:  # only a head start: _apply_* meets it again and says what is wrong
        pass


def _post(args: argparse.Namespace, path: str, body: dict[str, Any],
          while_waiting: Callable[[], object] | None = None) -> dict[str, Any]:
    """POST the admission. An agent that cannot enforce on the caller's own cgroup (the
    affinity fallback pins with sched_setaffinity and moves nobody anyway) refuses in_place;
    then ask again without it, still within what Slurm granted (within_cpus)."""
    try:
        return common.call(args, "POST", path, body, while_waiting)[1]
    except common.AgentError as exc:
        if not (body.get("in_place") and exc.status == 400 and "in_place" in str(exc)):
            raise
    return common.call(args, "POST", path, {k: v for k, v in body.items() if k not in ("in_place", "pinned")})[1]


def _admit(args: argparse.Namespace,
           command: list[str]) -> tuple[dict[str, Any], MemoryPolicy | None] | int:
    """Ask the agent: (its answer, the memory policy asked for), or an exit status."""
    asked: MemoryPolicy | None = None  # an error may come before the policy is read
    try:
        context = common.list_context(args, args.physcpubind, args.cpunodebind, args.membind,
                                      args.interleave, args.preferred, args.weighted_interleave)
        asked = _policy_options(args, context)
        membind = request_membind(asked, common.resolve_nodes(args.membind, context))
        if args.membind is not None:
            effective_policy(asked, membind or [])  # an explicit -m that leaves the nodes out: refuse now
        body = common.build_request(args, command, context, membind)
        if args.slurm_case is not None:
            refused = slurm_request(args, body, args.slurm_case)
            if refused:  # said in Slurm's terms, as the line of the case that applied
                from numa_agent.core.printable import printable

                print(printable(f"{PROG}: {refused}"), file=sys.stderr)
                return EXIT_FAILURE
        if not args.dry_run:
            # Makes the admission safe to retry across an agent restart: the
            # agent answers a repeated id with the booking it already made.
            body["request_id"] = new_request_id()
        path = "/v1/workloads?dry_run=1" if args.dry_run else "/v1/workloads"
        # The launch's own set-up overlaps the agent's work on the admission.
        prepare = load_memory_tools if asked is not None and not args.dry_run else None
        record = _post(args, path, body, prepare)
    except common.AgentError as exc:
        message = name_policy_nodes(asked, args.membind is not None, exc.error.get("message", ""))
        if message != exc.error.get("message"):
            exc = common.AgentError(exc.status, {**exc.error, "message": message})
        common.report_agent_error(PROG, exc, as_json=args.json)
        return EXIT_FAILURE
    except (common.CliError, PolicyRefused) as exc:
        common.print_error(PROG, str(exc))
        return EXIT_FAILURE
    return record, asked


def _print_dry_run(args: argparse.Namespace, record: dict[str, Any],
                   policy: MemoryPolicy | None) -> int:
    if args.json:
        common.print_json(record)
        return 0
    lines = common.decision_lines(record)
    if policy is not None:
        lines.insert(1, f"  memory policy: {policy.describe()}")
    print("\n".join(lines))
    return 0


def _launch(args: argparse.Namespace, command: list[str], record: dict[str, Any],
            policy: MemoryPolicy | None) -> int:
    """Bind this process as booked, set the memory policy, exec the command."""
    name = str(record.get("name", ""))
    memory_note = None
    try:
        if record.get("enforcement") == "affinity":
            memory_note = _apply_affinity(record, bind_memory=policy is None)
        env = workload_env(record)
    except (OSError, ValueError) as exc:
        common.print_error(PROG, f"cannot apply the binding of {name}: {exc}")
        _release(args, name)
        return EXIT_FAILURE
    # A simulated agent books another machine's nodes: nothing of it is real here.
    if policy is not None and record.get("enforcement") != "simulated":
        why = _apply_policy(policy)
        if why is not None:
            common.print_error(PROG, f"refused: {why}")
            _release(args, name)
            return EXIT_FAILURE
    os.environ.update(env)
    if args.json:
        common.print_json(record, sys.stderr)
    if args.verbose:
        _print_binding(record, env, memory_note, policy)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        status = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        common.print_error(PROG, f"{command[0]}: {exc.strerror or exc}")
        _release(args, name)
        return status
    return EXIT_FAILURE  # not reached: execvp returns only by raising


def run(args: argparse.Namespace) -> int:
    if args.show:
        return show()
    command = list(args.command)
    if not command and not args.dry_run:
        common.print_error(PROG, "no command given (see numa-run --help)")
        return EXIT_FAILURE
    if command:
        unusable = check_command(command)
        if unusable is not None:
            what = "not found" if unusable == EXIT_NOT_FOUND else "not executable"
            common.print_error(PROG, f"{command[0]}: command {what}")
            return unusable
    common.warn_small_sizes(PROG, [("--memory", args.memory), ("--pod-memory", args.pod_memory)])
    if args.tasks is not None or args.distribution is not None:
        from numa_agent.cli.ranks import run_tasks  # only for --tasks: a launch does not pay for it
        return run_tasks(args, command, env_of=workload_env, pin=_apply_affinity)
    args.slurm_case = slurm_case()
    admitted = _admit(args, command)
    if isinstance(admitted, int):
        return admitted
    record, asked = admitted
    if args.slurm_case is not None:  # which case applied, in one line
        mems = ",".join(str(n) for n in record.get("mems") or [])
        print(f"{PROG}: {args.slurm_case.line(str(record.get('cpus') or ''), mems)}", file=sys.stderr)
    try:
        policy = effective_policy(asked, record.get("mems") or [])
    except PolicyRefused as exc:
        common.print_error(PROG, f"refused: {exc}")
        if not args.dry_run:
            _release(args, str(record.get("name", "")))
        return EXIT_FAILURE
    if policy is not None:
        record["memory_policy"] = policy.to_json()
    if args.dry_run:
        return _print_dry_run(args, record, policy)
    return _launch(args, command, record, policy)


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        return run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        common.stdout_closed()
        # -s and --dry-run lost only their output; a launch that failed saying its binding
        # did not run the command, which no 0 may hide
        printing_only = args is not None and (args.show or args.dry_run)
        return 0 if printing_only else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
