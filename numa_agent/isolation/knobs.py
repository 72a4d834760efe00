"""The isolation knobs' files: the one edge that reads and writes them.

`KnobFiles` is the seam: list the knobs the machine offers, read one, write
one (OSError as the kernel gives it: EIO for a kernel-managed interrupt,
EACCES/EPERM without root, ENOENT for a knob that is gone). `ProcSysKnobs`
is the machine's (under configurable /proc and /sys roots, so tests use
written trees; `irqbalance/banned` through a running irqbalance's socket,
irqbalance.py); `SimulatedKnobs` reads a captured tree and keeps its writes
in memory, so an agent running on a snapshot never touches this machine's
interrupts or CPUs (nor its irqbalance: the snapshot's processes are not
this machine's).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Protocol

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.isolation.irqbalance import RUN_DIR, IrqbalanceSocket
from numa_agent.isolation.plan import IRQ_DEFAULT, IRQBALANCE, Knob

_CPU = "devices/system/cpu"
# key -> path below a root; anything else is not a knob (keys come back from the checkpoint).
_KEYS = (
    (re.compile(r"irq/default"), "proc", "irq/default_smp_affinity"),
    (re.compile(r"irq/([0-9]+)"), "proc", "irq/{0}/smp_affinity_list"),
    (re.compile(r"cpu/([0-9]+)/pm_qos"), "sys", _CPU + "/cpu{0}/power/pm_qos_resume_latency_us"),
    (re.compile(r"cpu/([0-9]+)/cpuidle/state([0-9]+)"), "sys", _CPU + "/cpu{0}/cpuidle/state{1}/disable"),
    (re.compile(r"cpufreq/policy([0-9]+)/governor"), "sys", _CPU + "/cpufreq/policy{0}/scaling_governor"),
    (re.compile(r"cpufreq/policy([0-9]+)/min_freq"), "sys", _CPU + "/cpufreq/policy{0}/scaling_min_freq"),
)


class KnobFiles(Protocol):
    daemons: bool  # it may hold a setting in a daemon that can restart and forget it (irqbalance)

    def knobs(self) -> tuple[Knob, ...]:
        """Every knob the machine offers now (interrupts come and go)."""
        ...

    def read(self, key: str) -> str: ...

    def write(self, key: str, value: str) -> None: ...

    def lost(self) -> bool:
        """A daemon told a value has exited since (a restarted irqbalance
        forgot its banned set): the knobs are to be written again."""
        ...


def latency_value(latency_us: int) -> str:
    """What pm_qos_resume_latency_us takes: a limit in microseconds, or "n/a"
    for none at all (0 written there would mean "no constraint")."""
    return str(latency_us) if latency_us > 0 else "n/a"


class ProcSysKnobs:
    daemons = True
    def __init__(self, proc: str | os.PathLike = "/proc", sys: str | os.PathLike = "/sys",
                 latency_us: int = 0, irqbalance_run: str | os.PathLike = RUN_DIR) -> None:
        self.roots = {"proc": Path(proc), "sys": Path(sys)}
        self.latency_us = latency_us
        self.irqbalance = IrqbalanceSocket(proc, irqbalance_run)

    def path(self, key: str) -> Path:
        for pattern, root, template in _KEYS:
            m = pattern.fullmatch(key)
            if m:
                return self.roots[root] / template.format(*m.groups())
        raise OSError(errno.EINVAL, f"not an isolation knob: {key!r}")

    def read(self, key: str) -> str:
        if key == IRQBALANCE:
            return self.irqbalance.read()
        return self.path(key).read_text().strip()

    def write(self, key: str, value: str) -> None:
        if key == IRQBALANCE:
            return self.irqbalance.write(value)
        # One write(2) of the whole value, as the kernel's store functions expect.
        # As a shell's `>`, but never through a link (procfs and sysfs knobs are none).
        fd = os.open(self.path(key), os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode() + b"\n")
        finally:
            os.close(fd)

    def knobs(self) -> tuple[Knob, ...]:
        return (*self._irqs(), *self._idle(), *self._freq())

    def _irqs(self) -> list[Knob]:
        irq = self.roots["proc"] / "irq"
        out = [Knob(IRQ_DEFAULT, "irqs")] if (irq / "default_smp_affinity").exists() else []
        numbers = sorted(int(p.name) for p in _listdir(irq) if p.name.isdigit())
        out += [Knob(f"irq/{n}", "irqs") for n in numbers if (irq / str(n) / "smp_affinity_list").exists()]
        if self._irqbalance_runs():
            out.append(Knob(IRQBALANCE, "irqs"))
        return out

    def _irqbalance_runs(self) -> bool:
        return self.irqbalance.pid() is not None

    def lost(self) -> bool:
        return self.irqbalance.lost()

    def _idle(self) -> list[Knob]:
        """The PM QoS limit where a CPU has it, else its cpuidle states deeper than the limit, disabled."""
        out = []
        held = latency_value(self.latency_us)
        for cpu, path in _cpus(self.roots["sys"] / _CPU):
            if (path / "power/pm_qos_resume_latency_us").exists():
                out.append(Knob(f"cpu/{cpu}/pm_qos", "idle", CpuSet([cpu]), held))
                continue
            for state in _listdir(path / "cpuidle"):
                m = re.fullmatch(r"state([0-9]+)", state.name)
                latency = _int(state / "latency")
                if m and latency is not None and latency > self.latency_us and (state / "disable").exists():
                    out.append(Knob(f"cpu/{cpu}/cpuidle/state{m.group(1)}", "idle", CpuSet([cpu]), "1"))
        return out

    def _freq(self) -> list[Knob]:
        """A policy's governor `performance` where offered, else its minimum frequency raised to its maximum."""
        out = []
        for policy in _listdir(self.roots["sys"] / _CPU / "cpufreq"):
            m = re.fullmatch(r"policy([0-9]+)", policy.name)
            cpus = _cpu_list(policy / "related_cpus") or _cpu_list(policy / "affected_cpus")
            if not m or not cpus:
                continue
            governors = _text(policy / "scaling_available_governors") or ""
            if "performance" in governors.split() and (policy / "scaling_governor").exists():
                out.append(Knob(f"cpufreq/policy{m.group(1)}/governor", "freq", cpus, "performance"))
            elif (top := _text(policy / "scaling_max_freq")) and (policy / "scaling_min_freq").exists():
                out.append(Knob(f"cpufreq/policy{m.group(1)}/min_freq", "freq", cpus, top))
        return out


class SimulatedKnobs(ProcSysKnobs):
    """A captured tree's knobs; writes are kept in memory, never made."""

    daemons = False

    def __init__(self, proc: str | os.PathLike, sys: str | os.PathLike, latency_us: int = 0) -> None:
        super().__init__(proc, sys, latency_us)
        self.written: dict[str, str] = {}

    def read(self, key: str) -> str:
        return self.written[key] if key in self.written else super().read(key)

    def write(self, key: str, value: str) -> None:
        if not self.path(key).exists():
            raise OSError(errno.ENOENT, f"{key}: no such knob in the snapshot")
        self.written[key] = value

    def _irqbalance_runs(self) -> bool:
        return False  # the snapshot's processes are not this machine's

    def lost(self) -> bool:
        return False


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _cpus(path: Path) -> list[tuple[int, Path]]:
    return sorted((int(p.name[3:]), p) for p in _listdir(path) if re.fullmatch(r"cpu[0-9]+", p.name))


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    return int(text) if text is not None and text.isdigit() else None


def _cpu_list(path: Path) -> CpuSet:
    text = _text(path)
    try:
        return CpuSet.parse(text) if text else CpuSet()
    except CpuSetParseError:
        return CpuSet()
