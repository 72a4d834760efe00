"""`numa-run --tasks N`: N ranks of one command, launched together without Slurm.

Imported only when --tasks is given. The plan (which node each rank takes,
numa_agent.core.rank_plan) is made from what the agent says is free; then one child
process per rank, in rank order, asks the agent for its own booking (the agent moves
the calling process, so each rank must ask for itself): its CPUs and memory on its
planned node (`cpunodebind` and `membind` that node, policy single-numa-node, so its
devices are that node's too; the agent gives one admission's devices close together in
the PCI tree, so a rank's NIC sits under its GPU's switch or root where one is free) and
waits. Once every rank is booked, all are told to
exec at once; if one is refused, every rank booked so far releases its booking and
ends, and numa-run exits 125 with one line naming the rank and why: all or nothing.

Then numa-run waits for every rank, forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
and SIGUSR2 to each (but not one the terminal sent to the whole process group, which
the ranks have had already), releases each rank's booking when it ends, and exits with
the first failing rank's status (128+N for a rank killed by signal N). Each rank has
PR_SET_PDEATHSIG SIGTERM: if numa-run itself is killed (-9), the ranks are told to
end, and the agent releases each booking once its process is gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from numa_agent.api.client import new_request_id
from numa_agent.cli import common
from numa_agent.core.printable import printable
from numa_agent.core.rank_plan import NodeRoom, PlanError, RankAsk, cuda_indices, plan_ranks

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable

PROG = "numa-run"
EXIT_FAILURE = 125
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel sent, e.g. the terminal to its group
PR_SET_PDEATHSIG = 1
RANK_POLICY = "single-numa-node"

# What --tasks cannot be combined with, and why (the ranks' placement is numa-run's plan).
_EXCLUDED = (
    ("pod", "--pod", "the ranks are booked together by --tasks; each rank is its own workload"),
    ("shared", "--shared", "each rank takes exclusive CPUs on its node"),
    ("physcpubind", "-C/--physcpubind", "each rank's CPUs come from its planned node"),
    ("cpunodebind", "-N/--cpunodebind", "numa-run plans each rank's node (--distribution)"),
    ("membind", "-m/--membind", "each rank's memory is its own node's"),
    ("interleave", "-i/--interleave", "each rank's memory is its own node's"),
    ("preferred", "-p/--preferred", "each rank's memory is its own node's"),
    ("weighted_interleave", "-w/--weighted-interleave", "each rank's memory is its own node's"),
    ("localalloc", "-l/--localalloc", "each rank's memory is bound to its own node already"),
    ("policy", "--policy", f"each rank is booked under {RANK_POLICY} on its planned node"),
    ("json", "--json", "the ranks' bookings are printed with -v"),
)


def combination_refusal(args: argparse.Namespace) -> str | None:
    """Why these options cannot go with --tasks, or None."""
    if args.tasks is None:
        return "--distribution needs --tasks N"
    for dest, option, why in _EXCLUDED:
        if getattr(args, dest, None) not in (None, False):
            return f"--tasks cannot be combined with {option}: {why}"
    if args.pod_cpus is not None or args.pod_memory is not None or args.pod_hugepages or args.pod_device:
        return "--tasks cannot be combined with --pod-*: the ranks are booked together by --tasks"
    if os.environ.get("SLURM_JOB_ID"):
        return "--tasks inside a Slurm job: let srun launch the ranks (srun -n N numa-run ...)"
    return None


def rank_ask(args: argparse.Namespace) -> RankAsk:
    """One rank's share: --cpus (1 if not given, as srun's -c), --memory and --device each
    per rank."""
    devices: dict[str, int] = {}
    for resource, count in args.device or []:
        if resource in devices:
            raise common.CliError(f"--device {resource} given twice")
        devices[resource] = count
    return RankAsk(tasks=args.tasks, cpus=args.cpus or 1, memory_bytes=args.memory or 0,
                   devices=devices, distribution=args.distribution or "block")


def rooms(allocatable: dict[str, Any]) -> list[NodeRoom]:
    """What each node has free, from the agent's GET /v1/allocatable."""
    out = []
    for node in allocatable.get("nodes") or []:
        out.append(NodeRoom(
            node=int(node["id"]), cpus=int((node.get("cpus") or {}).get("free") or 0),
            memory_bytes=int((node.get("memory_bytes") or {}).get("free") or 0),
            devices={r: int(v.get("free") or 0) for r, v in (node.get("devices") or {}).items()}))
    return out


def rank_env(index: int, tasks: int, record: dict[str, Any],
             pci_devices: list[dict[str, Any]] | None) -> dict[str, str]:
    """The variables a rank sees besides numa-run's own: its rank and the count, under
    numa-run's names and those torchrun and MPI programs read, and for NVIDIA GPUs
    CUDA_VISIBLE_DEVICES as their indices in PCI bus order."""
    env = {"NUMA_RUN_TASK": str(index), "NUMA_RUN_TASKS": str(tasks),
           "LOCAL_RANK": str(index), "LOCAL_WORLD_SIZE": str(tasks)}
    gpus = [str(d.get("address", "")) for d in record.get("devices") or []
            if str(d.get("vendor", "")).lower() == "0x10de"]
    if gpus and pci_devices is not None:
        indices = cuda_indices(gpus, pci_devices)
        if len(indices) == len(gpus):
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in indices)
    return env


def rank_request(args: argparse.Namespace, command: list[str], index: int, node: int) -> dict[str, Any]:
    """The admission of rank `index` on `node`."""
    body = common.build_request(args, command)
    body.update(cpus=args.cpus or 1, cpunodebind=[node], membind=[node], policy=RANK_POLICY,
                request_id=new_request_id())
    if args.name:
        body["name"] = f"{args.name}-{index}"
    return body


def run_tasks(args: argparse.Namespace, command: list[str], *,
              env_of: Callable[[dict[str, Any]], dict[str, str]],
              pin: Callable[[dict[str, Any]], str | None]) -> int:
    """numa-run --tasks: plan, book every rank or none, run them, wait, release."""
    refusal = combination_refusal(args)
    if refusal:
        common.print_error(PROG, refusal)
        return EXIT_FAILURE
    try:
        ask = rank_ask(args)
        free = common.call(args, "GET", "/v1/allocatable")[1]
        plan = plan_ranks(ask, rooms(free))
        pci = common.call(args, "GET", "/v1/topology")[1].get("pci_devices") if ask.devices else None
    except PlanError as exc:
        common.print_error(PROG, f"refused: {exc}")
        return EXIT_FAILURE
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return EXIT_FAILURE
    if args.dry_run:
        print(f"would launch {len(plan)} ranks ({ask.distribution}): " +
              ", ".join(f"rank {k} on node {n}" for k, n in enumerate(plan)))
        return 0
    return Launch(args, command, plan, pci, env_of, pin).run()


class _Rank:
    __slots__ = ("index", "node", "pid", "report", "go", "name", "status")

    def __init__(self, index: int, node: int) -> None:
        self.index, self.node = index, node
        self.pid = 0
        self.report = self.go = -1  # the parent's ends of the two pipes
        self.name = ""
        self.status: int | None = None


class Launch:
    """The parent's side: fork and book each rank in turn, then run them all."""

    def __init__(self, args: argparse.Namespace, command: list[str], plan: tuple[int, ...],
                 pci: list[dict[str, Any]] | None,
                 env_of: Callable[[dict[str, Any]], dict[str, str]],
                 pin: Callable[[dict[str, Any]], str | None]) -> None:
        self.args, self.command, self.pci = args, command, pci
        self.env_of, self.pin = env_of, pin
        self.ranks = [_Rank(k, node) for k, node in enumerate(plan)]
        self.caught: list[int] = []
        self.parent = os.getpid()

    # ---------------------------------------------------------------- parent
    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        previous = {sig: signal.signal(sig, self._note) for sig in FORWARDED}
        old_wakeup = signal.set_wakeup_fd(wake_w)
        try:
            failure = self._book_all(wake_r)
            if failure is not None:
                self._abort()
                common.print_error(PROG, failure)
                # interrupted: as the shell reports a command a signal ended
                return 128 + self.caught[0] if self.caught else EXIT_FAILURE
            return self._run_all()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_r)
            os.close(wake_w)

    def _note(self, signum: int, frame: object) -> None:
        self.caught.append(signum)

    def _book_all(self, wake: int) -> str | None:
        """Fork and book each rank in turn; why not all are booked, or None."""
        import select

        for rank in self.ranks:
            if self.caught:
                break
            self._fork(rank)
            answer = b""
            while True:
                ready = select.select([rank.report, wake], [], [])[0]
                if wake in ready and self.caught:
                    return f"interrupted by signal {self.caught[0]} while booking rank {rank.index}"
                if rank.report in ready:
                    chunk = os.read(rank.report, 65536)
                    if not chunk:
                        break
                    answer += chunk
            why = self._booked(rank, answer)
            if why is not None:
                return why
        if self.caught:
            return f"interrupted by signal {self.caught[0]} while booking the ranks"
        return None

    def _booked(self, rank: _Rank, answer: bytes) -> str | None:
        try:
            report = json.loads(answer)
        except ValueError:
            return f"rank {rank.index} (node {rank.node}) ended before it was booked"
        if "error" in report:
            return f"rank {rank.index} of {len(self.ranks)} (node {rank.node}): {report['error']}"
        rank.name = str(report.get("name", ""))
        return None

    def _fork(self, rank: _Rank) -> None:
        report_r, report_w = os.pipe()
        go_r, go_w = os.pipe()
        rank.report, rank.go = report_r, go_w
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                self._child(rank, report_w, go_r)
            finally:
                os._exit(EXIT_FAILURE)
        rank.pid = pid
        os.close(report_w)
        os.close(go_r)

    def _abort(self) -> None:
        """Every rank forked ends without running the command; what was booked is released."""
        for rank in self.ranks:
            self._close(rank)
        for rank in self.ranks:
            if rank.pid:
                self._reap(rank, 0)
                self._release(rank)

    def _close(self, rank: _Rank) -> None:
        for fd in (rank.report, rank.go):
            if fd >= 0:
                os.close(fd)
        rank.report = rank.go = -1

    def _run_all(self) -> int:
        """Tell every rank to exec, then wait for all, forwarding signals."""
        watched = {*FORWARDED, signal.SIGCHLD}
        signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        try:
            for rank in self.ranks:
                os.write(rank.go, b"g")
                self._close(rank)
            first: int | None = None
            for signum in self.caught:  # caught between the last booking and the block
                self._forward(signum)
            while True:
                for rank in self._reap_ended():
                    self._release(rank)
                    if rank.status and first is None:
                        first = rank.status
                if all(rank.status is not None for rank in self.ranks):
                    return first or 0
                info = signal.sigwaitinfo(watched)
                if info.si_signo != signal.SIGCHLD and info.si_code != SI_KERNEL:
                    self._forward(info.si_signo)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)

    def _forward(self, signum: int) -> None:
        for rank in self.ranks:
            if rank.status is None:
                try:
                    os.kill(rank.pid, signum)
                except ProcessLookupError:
                    pass

    def _reap_ended(self) -> list[_Rank]:
        return [rank for rank in self.ranks if rank.status is None and self._reap(rank, os.WNOHANG)]

    @staticmethod
    def _reap(rank: _Rank, flags: int) -> bool:
        try:
            pid, status = os.waitpid(rank.pid, flags)
        except ChildProcessError:
            rank.status = rank.status if rank.status is not None else EXIT_FAILURE
            return True
        if pid == 0:
            return False
        code = os.waitstatus_to_exitcode(status)
        rank.status = 128 - code if code < 0 else code  # a signal as the shell says it
        return True

    def _release(self, rank: _Rank) -> None:
        """Release a rank's booking once it ended (the agent may have done so already)."""
        if not rank.name:
            return
        try:
            common.call(self.args, "DELETE", f"/v1/workloads/{rank.name}")
        except common.AgentError as exc:
            if exc.status != 404:
                common.print_error(PROG, f"could not release rank {rank.index} ({rank.name}): {exc}")
        except common.CliError as exc:
            common.print_error(PROG, f"could not release rank {rank.index} ({rank.name}): {exc}")

    # ---------------------------------------------------------------- child
    def _child(self, rank: _Rank, report: int, go: int) -> None:
        """In rank `rank`'s process: book, report, wait for the word, exec (never returns)."""
        signal.set_wakeup_fd(-1)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        for other in self.ranks:  # the other ranks' pipes are none of this one's
            if other is not rank:
                self._close(other)
        os.close(rank.report)
        os.close(rank.go)
        _die_with_parent(self.parent)
        try:
            record = common.call(self.args, "POST", "/v1/workloads",
                                 rank_request(self.args, self.command, rank.index, rank.node))[1]
        except common.AgentError as exc:
            details = exc.error.get("details") or {}
            _write(report, {"error": f"refused: {details.get('reason') or exc}"})
            os._exit(EXIT_FAILURE)
        except common.CliError as exc:
            _write(report, {"error": str(exc)})
            os._exit(EXIT_FAILURE)
        name = str(record.get("name", ""))
        _write(report, {"name": name})
        if os.read(go, 1) != b"g":  # the parent gave up (another rank was refused) or died
            rank.name = name
            self._release(rank)
            os._exit(EXIT_FAILURE)
        os.close(go)
        os._exit(self._exec(rank, record))

    def _exec(self, rank: _Rank, record: dict[str, Any]) -> int:
        try:
            note = self.pin(record) if record.get("enforcement") == "affinity" else None
        except (OSError, ValueError) as exc:
            common.print_error(PROG, f"rank {rank.index}: cannot apply the binding of "
                                     f"{record.get('name')}: {exc}")
            return EXIT_FAILURE
        env = {**self.env_of(record), **rank_env(rank.index, len(self.ranks), record, self.pci)}
        os.environ.update(env)
        if self.args.verbose:  # one write: the ranks print at once
            sys.stderr.flush()
            line = (f"{PROG}: rank {rank.index}: {record.get('name', '')} node {rank.node} "
                    f"{common.binding_text(record, env)}" + (f"; note: mems not enforced: {note}" if note else ""))
            os.write(2, (printable(line) + "\n").encode())
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvp(self.command[0], self.command)
        except OSError as exc:
            common.print_error(PROG, f"rank {rank.index}: {self.command[0]}: {exc.strerror or exc}")
            return 127 if isinstance(exc, FileNotFoundError) else 126
        return EXIT_FAILURE  # not reached


def _write(fd: int, message: dict[str, Any]) -> None:
    os.write(fd, json.dumps(message).encode())
    os.close(fd)


def _die_with_parent(parent: int) -> None:
    """PR_SET_PDEATHSIG SIGTERM: numa-run killed (even -9), its ranks are told to end."""
    try:
        from numa_agent.enforcement.libc import libc

        libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except Exception:  # no prctl: the ranks outlive a killed numa-run, as plain children do
        pass
    if os.getppid() != parent:  # the parent died before the request took
        os._exit(EXIT_FAILURE)
