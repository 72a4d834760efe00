"""The scenarios of the guest booted by systemd (shape `systemd`), run INSIDE it by
scripts/vm-e2e:

    .venv/bin/python -m tests.vm_e2e.systemd_scenarios --shape systemd

Here the agent is what an operator gets: `scripts/install` (offline, from the wheelhouse
the host runner prepared), then `systemctl enable --now numa-agent`, the real unit under
systemd as PID 1. Each scenario checks from the kernel (/proc, the cgroup tree) and from
systemd itself (`systemctl show`, `journalctl`).
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from numa_agent.api.client import request
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.processes import capability_set
from tests.support.agent_process import wait_for
from tests.vm_e2e.scenarios import (
    AgentQueries,
    ScenarioFailed,
    check,
    guest_main,
    last_lines,
    proc_allowed,
    proc_cgroup,
    stop_all,
    undo_all,
)

REPO = Path(__file__).resolve().parents[2]
UNIT = "numa-agent.service"
# systemd nests slices by the dashes in their names: numa-agent.slice is below numa.slice.
SERVICE_CGROUP = "/numa.slice/numa-agent.slice/numa-agent.service"
# The workloads live in a delegated unit of their own beside the agent's.
WORKLOADS_UNIT = "numa-agent-workloads.service"
WORKLOADS_CGROUP = f"/numa.slice/numa-agent.slice/{WORKLOADS_UNIT}"
SOCKET = "/run/numa-agent/agent.sock"
CONFIG = Path("/etc/numa-agent/config.toml")
DROP_IN_DIR = Path("/etc/systemd/system/numa-agent.service.d")
INSTALLED_UNIT = Path("/etc/systemd/system") / UNIT
WHEELHOUSE_ENV = "NUMA_AGENT_VM_WHEELHOUSE"
NUMA_RUN = "/usr/local/bin/numa-run"
# Everything is ~30x slower under emulation.
SETTLE_TIMEOUT = 120.0
SLEEP = ("sleep", "600")
# The housekeeping CPUs: the agent's reserved ones, where docs/enforcement.md confines systemd's slices.
HOUSEKEEPING = "0-1"
HOUSEKEEPING_UNITS = ("system.slice", "user.slice", "init.scope", UNIT)
GUEST_CONFIG = f"""\
[agent]
log_level = "info"

[cpu_manager]
policy = "static"
reserved_cpus = "{HOUSEKEEPING}"
"""


def run(*argv: str, timeout: float = SETTLE_TIMEOUT, check_rc: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check_rc and done.returncode != 0:
        raise ScenarioFailed(f"`{' '.join(argv)}` exited {done.returncode}: "
                             f"{last_lines(done.stderr or done.stdout, 4)}")
    return done


def show(prop: str, unit: str = UNIT) -> str:
    return run("systemctl", "show", "-p", prop, "--value", unit).stdout.strip()


def main_pid() -> int:
    return int(show("MainPID") or 0)


class ServiceAgent:
    """The agent as systemd runs it: what run_all needs of an agent (stop, log)."""

    def stop(self) -> None:
        run("systemctl", "stop", UNIT, check_rc=False)

    def log(self) -> str:
        return run("journalctl", "-u", UNIT, "--no-pager", "-o", "short-monotonic", check_rc=False).stdout

    def call(self, method: str, path: str, body=None):
        return request(SOCKET, method, path, body)


class SystemdGuest(AgentQueries):
    def __init__(self, shape: str, work: Path) -> None:
        self.shape = shape
        self.work = work
        self.agent = ServiceAgent()
        self.launched: list[subprocess.Popen] = []
        self.after_cleanup: list = []
        self.installed = False

    # -- the service
    def install(self) -> None:
        wheelhouse = os.environ.get(WHEELHOUSE_ENV, str(REPO / ".cache" / "vm" / "wheelhouse"))
        run("bash", str(REPO / "scripts" / "install"), "--wheelhouse", wheelhouse, timeout=600)
        CONFIG.write_text(GUEST_CONFIG)
        run("systemctl", "daemon-reload")
        self.installed = True

    def start_agent(self) -> None:
        """Installed and enabled (once), then started and ready."""
        if not self.installed:
            self.install()
        run("systemctl", "enable", "--now", UNIT, timeout=SETTLE_TIMEOUT)
        self.wait_ready()

    def ensure_agent(self) -> None:
        if show("ActiveState") != "active":
            run("systemctl", "reset-failed", UNIT, check_rc=False)
            self.start_agent()

    def wait_ready(self, other_than: int = 0) -> int:
        """Until the unit is active (Type=notify: after READY=1) with a main PID other than
        `other_than`, and the API answers. Returns the main PID."""
        def ready():
            pid = main_pid()
            if show("ActiveState") != "active" or pid in (0, other_than):
                return None
            try:
                return pid if self.agent.call("GET", "/v1/health")[0] == 200 else None
            except Exception:
                return None
        pid = wait_for(ready, timeout=SETTLE_TIMEOUT, interval=0.5)
        check(pid, f"{UNIT} not active and answering within {SETTLE_TIMEOUT:g} s: "
                   f"{show('ActiveState')}/{show('SubState')}, {last_lines(self.agent.log(), 6)}")
        return pid

    # -- numa-run from a login-like session: a transient scope of its own
    def numa_run_argv(self, name: str | None, *args: str, command=SLEEP,
                      as_user: tuple[str, str] | None = None) -> list[str]:
        named = ["--name", name] if name else []
        who = [f"--uid={as_user[0]}", f"--gid={as_user[1]}"] if as_user else []
        return ["systemd-run", "--scope", "--quiet", "--collect", *who, NUMA_RUN, *named, *args, "--", *command]

    def launch(self, name: str, *args: str, as_user: tuple[str, str] | None = None) -> subprocess.Popen:
        out = open(self.work / f"{name}.log", "w+")
        proc = subprocess.Popen(self.numa_run_argv(name, *args, as_user=as_user), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.launched.append(proc)
        record = wait_for(lambda: proc.poll() is not None or self.listed(name), timeout=SETTLE_TIMEOUT,
                          interval=0.2)
        if not isinstance(record, dict):
            out.seek(0)
            raise ScenarioFailed(f"numa-run {name} was not admitted (exit {proc.poll()}): "
                                 f"{last_lines(out.read(), 4)}")
        return proc

    def cleanup(self) -> str:
        stop_all(self.launched)
        if show("ActiveState") != "active":
            return ""
        if not wait_for(lambda: not self.workloads(), timeout=30, interval=0.2):
            names = [w["name"] for w in self.workloads()]
            for name in names:
                self.agent.call("DELETE", f"/v1/workloads/{name}")
            return f"workloads still listed after their programs were killed: {', '.join(names)}"
        return ""

    def undo_scenario_setup(self) -> str:
        return undo_all(self.after_cleanup)


def pinned_in_agent_subtree(g: SystemdGuest, name: str, proc: subprocess.Popen) -> dict:
    """The workload's process (numa-run exec'd into the command) sits in its cgroup below
    the agent's service and is allowed exactly its CPUs."""
    record = g.listed(name)
    check(record is not None, f"{name} is not listed")
    pid = record["pid"]
    want = f"{WORKLOADS_CGROUP}/wl-{name}" if record["exclusive"] else f"{WORKLOADS_CGROUP}/shared/{name}"
    check(wait_for(lambda: proc_cgroup(pid) == want, timeout=30, interval=0.2),
          f"{name}: /proc/{pid}/cgroup is {proc_cgroup(pid)!r}, expected {want}")
    cpus, _ = proc_allowed(pid)
    check(cpus == CpuSet.parse(record["cpus"]),
          f"{name}: Cpus_allowed_list {cpus.format()}, agent says {record['cpus']}")
    return record


# ---------------------------------------------------------------- scenarios
def s_service(g: SystemdGuest) -> str:
    """Installed and started by systemd: active (running) through READY=1, STATUS shown,
    the daemon alone in its service's cgroup, the workloads unit running beside it."""
    check(show("Type") == "notify", f"{UNIT} has Type={show('Type')}, expected notify")
    check((show("ActiveState"), show("SubState")) == ("active", "running"),
          f"{UNIT} is {show('ActiveState')}/{show('SubState')}, expected active/running")
    status_text = show("StatusText")
    check(status_text, f"{UNIT} shows no STATUS= line")
    check(show("ControlGroup") == SERVICE_CGROUP,
          f"{UNIT} runs in {show('ControlGroup')!r}, expected {SERVICE_CGROUP}")
    pid = main_pid()
    where = proc_cgroup(pid)
    check(where == SERVICE_CGROUP, f"the agent (pid {pid}) is in {where!r}, expected {SERVICE_CGROUP}")
    check(show("ActiveState", WORKLOADS_UNIT) == "active", f"{WORKLOADS_UNIT} is {show('ActiveState', WORKLOADS_UNIT)}")
    check(show("ControlGroup", WORKLOADS_UNIT) == WORKLOADS_CGROUP,
          f"{WORKLOADS_UNIT} runs in {show('ControlGroup', WORKLOADS_UNIT)!r}, expected {WORKLOADS_CGROUP}")
    shown = run("systemctl", "status", "--no-pager", UNIT, check_rc=False).stdout
    check(status_text in shown, f"`systemctl status` does not show the STATUS line {status_text!r}")
    # The kernel's bounding set of the running agent is what the installed unit declares:
    # the hardened unit started, and every scenario after this one runs within it.
    declared = declared_capabilities(INSTALLED_UNIT.read_text())
    bounding = capability_set(Path(f"/proc/{pid}/status").read_text(), "CapBnd")
    check(bounding == declared, f"the agent's CapBnd is {sorted(bounding or ())}, the unit declares {sorted(declared)}")
    # IPAddressDeny=any with IPAddressAllow=localhost leaves the loopback scrape open.
    check("numa_agent_info" in g.scrape(), "no numa_agent_info in the metrics from 127.0.0.1:9464")
    return f"status: {status_text}; CapBnd {','.join(sorted(bounding))}; metrics on loopback"


def declared_capabilities(unit_text: str) -> frozenset[str]:
    """The union of a unit's CapabilityBoundingSet= lines (allow-list form only)."""
    names: set[str] = set()
    for line in unit_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "CapabilityBoundingSet":
            check(not value.strip().startswith("~"), f"deny-list form not handled: {line}")
            names.update(value.split())
    return frozenset(names)


def s_session(g: SystemdGuest) -> None:
    """numa-run from a transient scope (as from a login session) is pinned in the agent's subtree."""
    proc = g.launch("sess", "--cpus", "1")
    pinned_in_agent_subtree(g, "sess", proc)


def s_restart(g: SystemdGuest) -> str:
    """`systemctl restart` and stop/start with a workload running: it keeps running and its
    cpuset, is listed again, and a numa-run issued during the restart succeeds."""
    proc = g.launch("keep", "--cpus", "1")
    before = pinned_in_agent_subtree(g, "keep", proc)
    old = main_pid()
    restart = subprocess.Popen(["systemctl", "restart", UNIT])
    during = subprocess.run(g.numa_run_argv(None, "--cpus", "1", command=("true",)), capture_output=True,
                            text=True, timeout=SETTLE_TIMEOUT)
    check(restart.wait(SETTLE_TIMEOUT) == 0, "systemctl restart failed")
    g.wait_ready(other_than=old)
    check(during.returncode == 0, f"numa-run during the restart exited {during.returncode}: "
                                  f"{last_lines(during.stderr, 4)}")
    check(proc.poll() is None, "the workload died with the agent's restart")
    after = pinned_in_agent_subtree(g, "keep", proc)
    check(after["cpus"] == before["cpus"], f"keep had CPUs {before['cpus']}, now {after['cpus']}")
    run("systemctl", "stop", UNIT)
    check(proc.poll() is None, "the workload died when the agent was stopped")
    run("systemctl", "start", UNIT)
    g.wait_ready()
    after = pinned_in_agent_subtree(g, "keep", proc)
    check(after["cpus"] == before["cpus"], f"keep had CPUs {before['cpus']}, after stop/start {after['cpus']}")
    return f"NRestarts={show('NRestarts')}"


def s_kill(g: SystemdGuest) -> None:
    """kill -9 of the agent: systemd restarts it (Restart=on-failure), nothing lost."""
    proc = g.launch("survivor", "--cpus", "1")
    before = pinned_in_agent_subtree(g, "survivor", proc)
    old = main_pid()
    os.kill(old, signal.SIGKILL)
    g.wait_ready(other_than=old)
    after = pinned_in_agent_subtree(g, "survivor", proc)
    check(after["cpus"] == before["cpus"], f"survivor had CPUs {before['cpus']}, now {after['cpus']}")


def s_watchdog(g: SystemdGuest) -> str:
    """A stopped agent (SIGSTOP) is killed and restarted by systemd after WatchdogSec."""
    DROP_IN_DIR.mkdir(parents=True, exist_ok=True)
    drop_in = DROP_IN_DIR / "watchdog.conf"
    drop_in.write_text("[Service]\nWatchdogSec=10s\n")

    def undo():
        drop_in.unlink(missing_ok=True)
        run("systemctl", "daemon-reload")
        run("systemctl", "restart", UNIT)
    g.after_cleanup.append(undo)
    run("systemctl", "daemon-reload")
    run("systemctl", "restart", UNIT)
    g.wait_ready()
    proc = g.launch("watched", "--cpus", "1")
    before = pinned_in_agent_subtree(g, "watched", proc)
    old = main_pid()
    t0 = time.monotonic()
    os.kill(old, signal.SIGSTOP)
    g.wait_ready(other_than=old)
    took = time.monotonic() - t0
    journal = g.agent.log()
    check("Watchdog timeout" in journal or "watchdog" in journal.lower(),
          f"no watchdog kill in the journal: {last_lines(journal, 6)}")
    after = pinned_in_agent_subtree(g, "watched", proc)
    check(after["cpus"] == before["cpus"], f"watched had CPUs {before['cpus']}, now {after['cpus']}")
    return f"restarted {took:.0f} s after SIGSTOP (WatchdogSec=10s)"


def s_journal(g: SystemdGuest) -> None:
    """A refusal reaches the journal with its hints and the merged hint."""
    done = subprocess.run(g.numa_run_argv(None, "--cpus", "999", command=("true",)), capture_output=True,
                          text=True, timeout=SETTLE_TIMEOUT)
    check(done.returncode != 0, "numa-run --cpus 999 was admitted")
    def logged():
        lines = [line for line in g.agent.log().splitlines() if "refused" in line]
        return next((line for line in reversed(lines) if "hints:" in line and "merged:" in line), None)
    line = wait_for(logged, timeout=30, interval=0.5)
    check(line, f"no refusal with hints in `journalctl -u {UNIT}`: {last_lines(g.agent.log(), 6)}")


def s_allowed_cpus(g: SystemdGuest) -> str:
    """docs/enforcement.md's advice applied: system.slice, user.slice, init.scope and the agent's
    own unit on the housekeeping CPUs; then no process outside the agent's workloads may
    run on an exclusive CPU."""
    for unit in HOUSEKEEPING_UNITS:
        run("systemctl", "set-property", "--runtime", unit, f"AllowedCPUs={HOUSEKEEPING}")
    g.after_cleanup.append(lambda: [run("systemctl", "set-property", "--runtime", u, "AllowedCPUs=")
                                    for u in HOUSEKEEPING_UNITS])
    proc = g.launch("alone", "--cpus", "2")
    record = pinned_in_agent_subtree(g, "alone", proc)
    exclusive = CpuSet.parse(record["cpus"])
    check(not exclusive & CpuSet.parse(HOUSEKEEPING),
          f"the exclusive CPUs {exclusive.format()} include housekeeping CPUs {HOUSEKEEPING}")
    intruders = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if _is_kernel_thread(pid):
                continue
            where = proc_cgroup(pid)
            cpus, _ = proc_allowed(pid)
            comm = (entry / "comm").read_text().strip()
        except (OSError, ScenarioFailed):
            continue  # exited meanwhile
        if where.startswith(f"{WORKLOADS_CGROUP}/wl-alone"):
            continue
        if cpus & exclusive:
            intruders.append(f"{pid} ({comm}, {where}, CPUs {cpus.format()})")
    check(not intruders, f"processes allowed on the exclusive CPUs {exclusive.format()}: "
                         + "; ".join(intruders[:8]))
    return f"exclusive CPUs {exclusive.format()} held by the workload alone"


def _is_kernel_thread(pid: int) -> bool:
    # PF_KTHREAD in the flags field of /proc/PID/stat (the 9th field, after the comm).
    stat = Path(f"/proc/{pid}/stat").read_text()
    flags = int(stat[stat.rindex(")") + 2:].split()[6])
    return bool(flags & 0x00200000)


def s_memory(g: SystemdGuest) -> str:
    """memory.max enforced on systemd 252: a workload that touches more than it booked is
    OOM-killed inside its own cgroup, and the agent keeps running."""
    limit = 64 * 1024 * 1024
    old = main_pid()
    hog = ("python3", "-c", "import time; b = bytearray(256 << 20); time.sleep(600)")
    done = subprocess.run(g.numa_run_argv("hog", "--memory", "64Mi", command=hog), capture_output=True,
                          text=True, timeout=SETTLE_TIMEOUT)
    check(done.returncode != 0, "a workload touching 256 MiB with a 64 MiB booking was not killed")
    # The cgroup is gone once the workload is released; the kernel's own count of the kill
    # is in the parent's memory.events (hierarchical).
    events = dict(line.split() for line in
                  Path(f"/sys/fs/cgroup{WORKLOADS_CGROUP}/memory.events").read_text().splitlines())
    check(int(events.get("oom_kill", 0)) >= 1, f"no oom_kill in {WORKLOADS_CGROUP}/memory.events: {events}")
    check(main_pid() == old and show("ActiveState") == "active",
          f"the agent did not survive the workload's OOM kill: {show('ActiveState')}, pid {main_pid()}")
    proc = g.launch("limited", "--memory", "64Mi")
    pinned_in_agent_subtree(g, "limited", proc)
    written = Path(f"/sys/fs/cgroup{WORKLOADS_CGROUP}/shared/limited/memory.max").read_text().strip()
    check(written == str(limit), f"shared/limited/memory.max reads {written}, expected {limit}")
    return f"oom_kill counted {events['oom_kill']}; memory.max {written}"


def s_other_user(g: SystemdGuest) -> str:
    """Another user's numa-run under the hardened unit (bounding set CAP_CHOWN alone): the
    socket chowned to `socket_group`, the caller's pidfd probed without CAP_KILL, its
    process moved into the workloads unit's tree without CAP_DAC_OVERRIDE, pinned."""
    user, group = "nobody", "nogroup"
    uid, gid = pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid
    CONFIG.write_text(GUEST_CONFIG.replace("[agent]\n", f'[agent]\nsocket_group = "{group}"\n'))

    def undo():
        CONFIG.write_text(GUEST_CONFIG)
        run("systemctl", "restart", UNIT)
    g.after_cleanup.append(undo)
    old = main_pid()
    run("systemctl", "restart", UNIT)
    g.wait_ready(other_than=old)
    st = os.stat(SOCKET)
    check((st.st_gid, stat.S_IMODE(st.st_mode)) == (gid, 0o660),
          f"{SOCKET} has gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):o}; expected {gid} ({group}), 660")
    proc = g.launch("other", "--cpus", "1", as_user=(user, group))
    record = pinned_in_agent_subtree(g, "other", proc)
    owner = Path(f"/proc/{record['pid']}/status").read_text().split("\nUid:")[1].split()[1]
    check(int(owner) == uid, f"the workload's process runs as uid {owner}, expected {uid} ({user})")
    return f"{user}'s workload pinned to CPUs {record['cpus']}; socket {group} 0660"


def s_config_error(g: SystemdGuest) -> str:
    """A configuration error exits 78 (EX_CONFIG) and systemd leaves the unit failed instead
    of restarting it (RestartPreventExitStatus=78); a good configuration starts it again."""
    restarts = int(show("NRestarts") or 0)
    CONFIG.write_text(GUEST_CONFIG.replace("[agent]\n", '[agent]\nsocket_mod = "0660"\n'))

    def undo():
        CONFIG.write_text(GUEST_CONFIG)
        run("systemctl", "reset-failed", UNIT, check_rc=False)
        g.ensure_agent()
    g.after_cleanup.append(undo)
    check(run("systemctl", "restart", UNIT, check_rc=False).returncode != 0,
          "systemctl restart succeeded with an unknown key in the config")
    time.sleep(3 * 2)  # three RestartSec=2s: a restart would have come by now
    state = (show("ActiveState"), show("Result"), show("ExecMainStatus"), int(show("NRestarts") or 0))
    check(state == ("failed", "exit-code", "78", restarts),
          f"(ActiveState, Result, ExecMainStatus, NRestarts) is {state}; expected "
          f"('failed', 'exit-code', '78', {restarts})")
    undo()
    return f"exit 78, not restarted (NRestarts={state[3]})"


RUNNERS = {
    "systemd-service": s_service,
    "systemd-session": s_session,
    "systemd-restart": s_restart,
    "systemd-kill": s_kill,
    "systemd-watchdog": s_watchdog,
    "systemd-journal": s_journal,
    "systemd-allowedcpus": s_allowed_cpus,
    "systemd-memory": s_memory,
    "systemd-otheruser": s_other_user,
    "systemd-configerror": s_config_error,
}


def main(argv: list[str] | None = None) -> int:
    return guest_main(argv, RUNNERS, lambda shape, work: SystemdGuest(shape, work),
                      prog="python -m tests.vm_e2e.systemd_scenarios")


if __name__ == "__main__":
    sys.exit(main())
