"""Written /proc and /sys trees with isolation knobs, and a KnobFiles whose writes fail as the kernel's do."""

from __future__ import annotations

from pathlib import Path

from numa_agent.isolation.knobs import ProcSysKnobs

CPU = "sys/devices/system/cpu"


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def machine(root: Path, *, pm_qos: bool = True, cpuidle: bool = False, governors: str | None = None,
            cpus: int = 8) -> Path:
    """8 CPUs (or `cpus`); IRQs 24, 25 on every CPU, 26 on 2-3; default affinity all of them."""
    for irq, aff in (("24", f"0-{cpus - 1}"), ("25", f"0-{cpus - 1}"), ("26", "2-3")):
        write(root, f"proc/irq/{irq}/smp_affinity_list", aff)
    write(root, "proc/irq/default_smp_affinity", f"{(1 << cpus) - 1:x}")
    for cpu in range(cpus):
        if pm_qos:
            write(root, f"{CPU}/cpu{cpu}/power/pm_qos_resume_latency_us", "0")
        if cpuidle:
            for state, latency in ((0, 0), (1, 2), (2, 100)):
                write(root, f"{CPU}/cpu{cpu}/cpuidle/state{state}/latency", str(latency))
                write(root, f"{CPU}/cpu{cpu}/cpuidle/state{state}/disable", "0")
    if governors is not None:
        for policy, cpus in ((0, "0-3"), (4, "4-7")):
            base = f"{CPU}/cpufreq/policy{policy}"
            write(root, f"{base}/related_cpus", cpus)
            write(root, f"{base}/scaling_available_governors", governors)
            write(root, f"{base}/scaling_governor", "powersave")
            write(root, f"{base}/scaling_min_freq", "800000")
            write(root, f"{base}/scaling_max_freq", "3000000")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


class Failing(ProcSysKnobs):
    """Writes to the named knobs fail with the given errno, as the kernel's would."""

    def __init__(self, root: Path, fail: dict[str, int]) -> None:
        super().__init__(root / "proc", root / "sys")
        self.fail = fail

    def write(self, key: str, value: str) -> None:
        if key in self.fail:
            raise OSError(self.fail[key], "refused")
        super().write(key, value)
