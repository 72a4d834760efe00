"""What the isolation knobs should hold, as values (no I/O).

A knob is one setting of the machine the agent may change for workloads
that asked for `--isolate`: an interrupt's affinity (`irq/N`, a CPU list),
the default affinity of new interrupts (`irq/default`, a hex mask), a CPU's
PM QoS resume latency or one of its cpuidle states, a cpufreq policy's
governor or minimum frequency, the CPUs a running irqbalance is told to
leave out (`irqbalance/banned`). Its key names it; the edge (knobs.py) maps
keys to files.

One rule for every knob, so that two workloads never fight over one: its
desired value is a function of its original value (recorded once, before
the agent first changed it) and of *all* the workloads isolating now, never
of the order they came and went in. A knob no workload needs any more
returns to its original.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from numa_agent.core.cpuset import CpuSet, CpuSetParseError

KINDS = ("irqs", "idle", "freq")
IRQ_DEFAULT = "irq/default"  # /proc/irq/default_smp_affinity
IRQBALANCE = "irqbalance/banned"  # the CPUs a running irqbalance keeps interrupts off (a CPU list)


class IsolateSyntaxError(ValueError):
    pass


def parse_kinds(items: Iterable[str]) -> tuple[str, ...]:
    """`irqs,idle` or `all` (also as several items) -> the kinds, in KINDS order."""
    wanted: set[str] = set()
    for item in items:
        for word in (w.strip() for w in item.split(",")):
            if word == "all":
                wanted.update(KINDS)
            elif word in KINDS:
                wanted.add(word)
            else:
                raise IsolateSyntaxError(f"unknown isolation {word!r}: expected a comma list of "
                                         f"{', '.join(KINDS)} or all")
    return tuple(k for k in KINDS if k in wanted)


@dataclass(frozen=True)
class Knob:
    """One setting the machine offers. `cpus`: the CPUs a per-CPU knob acts
    on (empty for the interrupt affinities, which concern every CPU);
    `held`: the value written while a workload needs it (per-CPU knobs)."""

    key: str
    kind: str
    cpus: CpuSet = CpuSet()
    held: str = ""


@dataclass(frozen=True)
class Holding:
    """A workload isolating: its exclusive CPUs and the kinds it asked for."""

    cpus: CpuSet
    kinds: frozenset[str]


@dataclass(frozen=True)
class Target:
    """The value a knob should hold; `held_by` empty: its original, restored."""

    key: str
    value: str
    held_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    targets: tuple[Target, ...]
    originals: Mapping[str, str]  # the ledger with the originals of newly held knobs added
    # workload -> what is left as it is (managed interrupts, affinities only on isolated CPUs)
    notes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # workload -> what the machine lacks for it ("freq: not available on this machine")
    missing: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def target(self, key: str) -> Target | None:
        return next((t for t in self.targets if t.key == key), None)


def is_mask_knob(key: str) -> bool:
    return key.startswith("irq/")


def kind_of(key: str) -> str:
    return "irqs" if key.startswith(("irq/", "irqbalance/")) else "freq" if key.startswith("cpufreq/") else "idle"


def parse_value(key: str, text: str) -> CpuSet | str:
    """A knob's value for comparison: a CPU set for the affinities, else the text."""
    if key == IRQ_DEFAULT:
        return CpuSet.parse_mask(text)
    if is_mask_knob(key) or key == IRQBALANCE:
        return CpuSet.parse(text)
    return text.strip()


def same_value(key: str, a: str, b: str) -> bool:
    try:
        return parse_value(key, a) == parse_value(key, b)
    except CpuSetParseError:
        return a.strip() == b.strip()


def _format(key: str, cpus: CpuSet) -> str:
    return cpus.format_mask() if key == IRQ_DEFAULT else cpus.format()


def plan(holdings: Mapping[str, Holding], knobs: Iterable[Knob], ledger: Mapping[str, str],
         current: Mapping[str, str], unmovable: frozenset[str] = frozenset()) -> Plan:
    """The target of every knob that is held now or was held before (in
    `ledger`, the originals recorded), for the workloads `holdings`.
    `current`: the knobs' values as read (a newly held knob's original);
    `unmovable`: keys whose writes the kernel refuses (managed interrupts)."""
    knobs = tuple(knobs)
    notes: dict[str, list[str]] = {name: [] for name in holdings}
    originals = dict(ledger)
    targets: dict[str, Target] = {}
    irq_holders = {n: h.cpus for n, h in holdings.items() if "irqs" in h.kinds and h.cpus}
    isolated = CpuSet.union_of(irq_holders.values())
    for knob in knobs:
        if knob.key == IRQBALANCE:
            # Banned: its own set and every CPU isolating irqs, so it never moves them back.
            original = ledger.get(knob.key, current.get(knob.key)) if isolated else None
            target = None if original is None else _banned_target(original, irq_holders, isolated)
        elif knob.kind == "irqs":
            original = ledger.get(knob.key, current.get(knob.key)) if isolated else None
            target = None if original is None else \
                _irq_target(knob.key, original, irq_holders, isolated, unmovable, notes)
        else:
            # Per-CPU knobs are read only when held: a large machine has many.
            held_by = tuple(sorted(n for n, h in holdings.items()
                                   if knob.kind in h.kinds and h.cpus & knob.cpus))
            original = ledger.get(knob.key, current.get(knob.key)) if held_by else None
            target = Target(knob.key, knob.held, held_by) if original is not None else None
        if target is not None and original is not None:
            targets[knob.key] = target
            originals.setdefault(knob.key, original)
    for key, original in ledger.items():
        targets.setdefault(key, Target(key, original))  # no holder left (or the knob is gone): restore
    return Plan(tuple(targets[k] for k in sorted(targets)), originals,
                {n: tuple(v) for n, v in notes.items() if v}, _missing(holdings, knobs))


def _banned_target(original: str, holders: Mapping[str, CpuSet], isolated: CpuSet) -> Target | None:
    try:
        banned = CpuSet.parse(original)
    except CpuSetParseError:
        return None
    return Target(IRQBALANCE, (banned | isolated).format(), tuple(sorted(holders)))


def _irq_target(key: str, original: str, holders: Mapping[str, CpuSet], isolated: CpuSet,
                unmovable: frozenset[str], notes: dict[str, list[str]]) -> Target | None:
    try:
        cpus = parse_value(key, original)
    except CpuSetParseError:
        return None
    assert isinstance(cpus, CpuSet)
    touched = tuple(sorted(n for n, c in holders.items() if c & cpus))
    if not touched:
        return None
    what = "default_smp_affinity" if key == IRQ_DEFAULT else f"irq {key.split('/', 1)[1]}"
    if key in unmovable:
        for n in touched:
            notes[n].append(f"{what}: kernel-managed, not movable")
        return None
    rest = cpus - isolated
    if not rest:
        # An empty mask is refused by the kernel: it stays where it is.
        for n in touched:
            notes[n].append(f"{what}: affinity {cpus.format()} lies within isolated CPUs, left as it is")
        return None
    return Target(key, _format(key, rest), touched)


def _missing(holdings: Mapping[str, Holding], knobs: tuple[Knob, ...]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    covered: dict[str, CpuSet] = {}
    for knob in knobs:
        covered[knob.kind] = covered.get(knob.kind, CpuSet()) | knob.cpus
    has_irqs = any(k.kind == "irqs" for k in knobs)
    for name, h in holdings.items():
        lines = []
        for kind in (k for k in KINDS if k in h.kinds):
            if kind == "irqs":
                lacking = CpuSet() if has_irqs else h.cpus
            else:
                lacking = h.cpus - covered.get(kind, CpuSet())
            if lacking == h.cpus:
                lines.append(f"{kind}: not available on this machine")
            elif lacking:
                lines.append(f"{kind}: not available on CPUs {lacking.format()}")
        if lines:
            out[name] = tuple(lines)
    return out
