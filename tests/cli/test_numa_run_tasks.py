"""numa-run --tasks N against the real agent on a written 4-node machine (simulated
cgroups: nothing is pinned for real, but every booking, refusal and release is the
agent's): the ranks booked all or nothing, their environment, the exit status,
signals forwarded, and every booking released."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.agent_process import DEVICES_CONFIG, AgentProcess, machine_with_devices, wait_for

REPO = Path(__file__).resolve().parents[2]
CONFIG = '[topology_manager]\npolicy = "best-effort"\n' + DEVICES_CONFIG


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    work = tmp_path_factory.mktemp("tasks-agent")
    a = AgentProcess(work, "--sysfs-root", str(machine_with_devices(work / "machine")), config=CONFIG).start()
    yield a
    a.stop()


def workloads(agent) -> list[dict]:
    code, body = agent.call("GET", "/v1/workloads")
    assert code == 200
    return body["workloads"]


@pytest.fixture
def clean(agent):
    assert workloads(agent) == []
    yield
    for w in workloads(agent):
        agent.call("DELETE", f"/v1/workloads/{w['name']}")


def numa_run(agent, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket, *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, **kw)


def started(agent, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


REPORT = ('echo "$NUMA_RUN_TASK $NUMA_RUN_TASKS $LOCAL_RANK $LOCAL_WORLD_SIZE $NUMA_AGENT_WORKLOAD '
          '$NUMA_AGENT_CPUS $NUMA_AGENT_MEMS" > "$0/$NUMA_RUN_TASK"')


def reports(where: Path) -> dict[int, list[str]]:
    return {int(p.name): p.read_text().split() for p in where.iterdir()}


def test_ranks_are_booked_each_on_its_node_with_their_environment_and_released(agent, clean, tmp_path):
    out = numa_run(agent, "--tasks", "4", "--cpus", "2", "--distribution", "cyclic", "--name", "job", "-v",
                   "--", "sh", "-c", REPORT + '; [ "$NUMA_RUN_TASK" != 2 ] || exit 3', str(tmp_path))
    assert out.returncode == 3, out.stderr  # the failing rank's status
    seen = reports(tmp_path)
    assert sorted(seen) == [0, 1, 2, 3]
    cpus: set[str] = set()
    for rank, (task, tasks, local, world, name, rank_cpus, mems) in seen.items():
        assert (task, tasks, local, world, name) == (str(rank), "4", str(rank), "4", f"job-{rank}")
        assert mems == str(rank)  # cyclic: one rank on each of the four nodes
        assert len(rank_cpus.split(",")) == 2 and not cpus & set(rank_cpus.split(","))
        cpus |= set(rank_cpus.split(","))
    assert sum(line.startswith("numa-run: rank ") for line in out.stderr.splitlines()) == 4
    assert workloads(agent) == []  # every booking released before numa-run returned


def test_block_puts_consecutive_ranks_on_one_node(agent, clean, tmp_path):
    out = numa_run(agent, "--tasks", "3", "--cpus", "3", "--", "sh", "-c", REPORT, str(tmp_path))
    assert out.returncode == 0, out.stderr
    # node 0 has 7 free CPUs (CPU 0 reserved): two ranks of 3, then node 1
    assert [seen[-1] for _, seen in sorted(reports(tmp_path).items())] == ["0", "0", "1"]


def test_a_rank_with_an_nvidia_gpu_sees_its_cuda_index_in_pci_bus_order(agent, clean, tmp_path):
    out = numa_run(agent, "--tasks", "1", "--device", "gpu=1", "--", "sh", "-c",
                   'echo "$CUDA_DEVICE_ORDER $CUDA_VISIBLE_DEVICES $NUMA_AGENT_DEVICES $NUMA_AGENT_MEMS"')
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["PCI_BUS_ID", "0", "0000:01:00.0", "1"]  # the GPU is on node 1


def test_a_rank_killed_by_a_signal_is_reported_as_the_shell_does(agent, clean):
    out = numa_run(agent, "--tasks", "2", "--", "sh", "-c", '[ "$NUMA_RUN_TASK" = 0 ] || kill -9 $$')
    assert out.returncode == 128 + signal.SIGKILL, out.stderr
    assert workloads(agent) == []


def test_a_refused_rank_leaves_nothing_booked(agent, clean, tmp_path):
    # the plan fits (CPUs), but node 0 has 128 hugepages of 2 MiB: the agent refuses rank 1
    out = numa_run(agent, "--tasks", "2", "--hugepages", "2Mi=100", "--", "touch", str(tmp_path / "ran"))
    assert out.returncode == 125
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("numa-run: error: rank 1 of 2 (node 0): refused:")
    assert workloads(agent) == [] and not (tmp_path / "ran").exists()


def test_signals_are_forwarded_to_every_rank(agent, clean, tmp_path):
    script = ('trap \'echo usr1 > "$0/got.$NUMA_RUN_TASK"; exit 5\' USR1; touch "$0/ready.$NUMA_RUN_TASK"; '
              'while :; do sleep 0.05; done')
    proc = started(agent, "--tasks", "2", "--", "sh", "-c", script, str(tmp_path))
    try:
        assert wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, timeout=30), proc.stderr
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=30) == 5
    finally:
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in tmp_path.glob("got.*")) == ["got.0", "got.1"]
    assert workloads(agent) == []


def test_numa_run_killed_with_9_leaves_the_agent_to_release_the_ranks(agent, clean):
    proc = started(agent, "--tasks", "2", "--", "sleep", "60")
    try:
        assert wait_for(lambda: len(workloads(agent)) == 2, timeout=30), proc.stderr
        pids = [w["pid"] for w in workloads(agent)]
        proc.kill()  # the ranks' PR_SET_PDEATHSIG ends them; the agent sees their processes gone
        assert wait_for(lambda: workloads(agent) == [], timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert not any(_running_sleep(pid) for pid in pids)  # ended, not left running


def _running_sleep(pid: int) -> bool:
    """`pid` is a sleep that has not ended (a zombie no one reaped yet has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return "(sleep)" in stat and stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("args, message", [
    (["--tasks", "0"], "argument --tasks: 0 tasks launch nothing"),
    (["--tasks", "2", "--device", "gpu=1"],
     "refused: rank 1 of 2 fits on no NUMA node (1 CPU, 1 gpu per rank, all on one node): more tasks "
     "than gpu devices (2 needed, 1 free on known nodes)"),
    (["--tasks", "40"], "refused: rank 31 of 40 fits on no NUMA node (1 CPU per rank, all on one node): "
                        "more tasks than CPUs (40 needed, 31 free)"),
    (["--tasks", "2", "--cpus", "9"], "refused: rank 0 of 2 fits on no NUMA node (9 CPUs per rank, all on one "
                                      "node): a rank's 9 CPUs fit on no node"),
    (["--tasks", "2", "--pod", "p"], "--tasks cannot be combined with --pod"),
    (["--tasks", "2", "--shared"], "--tasks cannot be combined with --shared"),
    (["--tasks", "2", "-C", "1-2"], "--tasks cannot be combined with -C/--physcpubind"),
    (["--tasks", "2", "-N", "0"], "--tasks cannot be combined with -N/--cpunodebind"),
    (["--distribution", "cyclic"], "--distribution needs --tasks N"),
])
def test_bad_input_is_one_line_and_125(agent, clean, args, message):
    out = numa_run(agent, *args, "--", "true")
    assert out.returncode == 125
    errors = [line for line in out.stderr.splitlines() if not line.startswith("usage:")]
    assert len(errors) == 1 and errors[0].startswith(f"numa-run: error: {message}"), out.stderr
    assert workloads(agent) == []


def test_dry_run_prints_the_plan_and_books_nothing(agent, clean):
    out = numa_run(agent, "--tasks", "3", "--cpus", "4", "--distribution", "cyclic", "--dry-run", "--", "true")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("would launch 3 ranks (cyclic): rank 0 on node 0, rank 1 on node 1, "
                                  "rank 2 on node 2")
    assert workloads(agent) == []


def test_a_signal_the_terminal_sent_the_group_is_not_sent_twice(agent, clean, tmp_path):
    """Ctrl-C reaches every rank from the terminal (they share numa-run's process group):
    numa-run forwards it no more, but forwards a signal sent to it alone (here SIGUSR1).
    A second SIGINT that reaches a rank while the first is still pending merges with it
    (standard signals do not queue), so forwarding it anyway is caught most times, not every
    time; the correct launcher always passes."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def controlling_terminal() -> None:  # numa-run leads a session whose terminal is the pty
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    # Each rank takes its signals one by one (sigwaitinfo) and writes down each.
    rank = ("import os, signal, sys\n"
            "wanted = {signal.SIGINT, signal.SIGUSR1}\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, wanted)\n"
            "where, me = sys.argv[1], os.environ['NUMA_RUN_TASK']\n"
            "open(f'{where}/ready.{me}', 'w').close()\n"
            "while True:\n"
            "    got = signal.sigwaitinfo(wanted).si_signo\n"
            "    with open(f'{where}/{me}', 'a') as f:\n"
            "        f.write(signal.Signals(got).name + '\\n')\n"
            "    if got == signal.SIGUSR1:\n"
            "        break\n")
    proc = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                             "--tasks", "2", "--", sys.executable, "-c", rank, str(tmp_path)],
                            stdin=slave, stdout=slave, stderr=slave, cwd=REPO, preexec_fn=controlling_terminal)
    os.close(slave)
    try:
        assert wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, timeout=30)
        os.write(master, b"\x03")  # the terminal's SIGINT to its foreground process group
        assert wait_for(lambda: all((tmp_path / str(k)).exists() for k in range(2)), timeout=30)
        proc.send_signal(signal.SIGUSR1)  # to numa-run alone: forwarded, after any SIGINT it forwards
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    assert [(tmp_path / str(k)).read_text().split() for k in range(2)] == [["SIGINT", "SIGUSR1"]] * 2
