"""The isolation planner: one rule per knob, independent of the order of events."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.core.cpuset import CpuSet
from numa_agent.isolation.plan import (
    IRQ_DEFAULT,
    Holding,
    IsolateSyntaxError,
    Knob,
    parse_kinds,
    plan,
    same_value,
)

C = CpuSet.parse
KNOBS = (
    Knob("irq/24", "irqs"), Knob("irq/25", "irqs"), Knob(IRQ_DEFAULT, "irqs"),
    *(Knob(f"cpu/{c}/pm_qos", "idle", C(str(c)), "n/a") for c in range(8)),
)
MACHINE = {"irq/24": "0-7", "irq/25": "2-3", IRQ_DEFAULT: "ff",
           **{f"cpu/{c}/pm_qos": "0" for c in range(8)}}


def holding(cpus: str, *kinds: str) -> Holding:
    return Holding(C(cpus), frozenset(kinds or ("irqs", "idle")))


def apply(values: dict[str, str], p) -> dict[str, str]:
    out = dict(values)
    for t in p.targets:
        if t.key in out:
            out[t.key] = t.value
    return out


def test_parse_kinds():
    assert parse_kinds(["irqs,idle"]) == ("irqs", "idle")
    assert parse_kinds(["all"]) == ("irqs", "idle", "freq")
    assert parse_kinds(["freq", "irqs"]) == ("irqs", "freq")
    try:
        parse_kinds(["irq"])
    except IsolateSyntaxError as exc:
        assert "irq" in str(exc) and "all" in str(exc)
    else:
        raise AssertionError("irq accepted")


def test_irq_affinity_and_default_lose_the_isolated_cpus():
    p = plan({"a": holding("4-5")}, KNOBS, {}, MACHINE)
    assert p.target("irq/24").value == "0-3,6-7" and p.target("irq/24").held_by == ("a",)
    assert same_value(IRQ_DEFAULT, p.target(IRQ_DEFAULT).value, "cf")
    assert p.target("irq/25") is None  # 2-3 never ran on 4-5: untouched, no original kept
    assert p.target("cpu/4/pm_qos").value == "n/a" and p.target("cpu/3/pm_qos") is None
    assert p.originals == {"irq/24": "0-7", IRQ_DEFAULT: "ff", "cpu/4/pm_qos": "0", "cpu/5/pm_qos": "0"}


def test_an_irq_only_on_isolated_cpus_is_left_and_said():
    p = plan({"a": holding("2-3")}, KNOBS, {}, MACHINE)
    assert p.target("irq/25") is None
    assert any("irq 25" in n and "left" in n for n in p.notes["a"])


def test_managed_irq_is_listed_not_moved():
    p = plan({"a": holding("4-5")}, KNOBS, {}, MACHINE, unmovable=frozenset({"irq/24"}))
    assert p.target("irq/24") is None
    assert "irq 24: kernel-managed, not movable" in p.notes["a"]


def test_the_original_is_the_first_holders_view():
    first = plan({"a": holding("4-5")}, KNOBS, {}, MACHINE)
    machine = apply(MACHINE, first)
    second = plan({"a": holding("4-5"), "b": holding("6")}, KNOBS, first.originals, machine)
    assert second.originals["irq/24"] == "0-7"  # not a's modified 0-3,6-7
    assert second.target("irq/24").value == "0-3,7" and second.target("irq/24").held_by == ("a", "b")


def test_two_workloads_sharing_an_irq_release_in_either_order():
    both = {"a": holding("4-5"), "b": holding("6")}
    p = plan(both, KNOBS, {}, MACHINE)
    machine = apply(MACHINE, p)
    for staying in ("a", "b"):  # the other one left
        after = plan({staying: both[staying]}, KNOBS, p.originals, machine)
        alone = plan({staying: both[staying]}, KNOBS, {}, MACHINE)
        assert after.target("irq/24").value == alone.target("irq/24").value
    released = plan({}, KNOBS, p.originals, machine)
    assert apply(machine, released) == MACHINE
    assert all(not t.held_by for t in released.targets)


def test_a_missing_knob_is_said_per_kind():
    p = plan({"a": Holding(C("4-5"), frozenset({"irqs", "idle", "freq"}))}, KNOBS[:1], {}, MACHINE)
    assert p.missing["a"] == ("idle: not available on this machine", "freq: not available on this machine")
    part = plan({"a": holding("4,9", "idle")}, KNOBS, {}, MACHINE)
    assert part.missing["a"] == ("idle: not available on CPUs 9",)


def test_a_ledger_knob_that_is_gone_is_still_restored_by_key():
    p = plan({}, KNOBS, {"irq/99": "0-7"}, MACHINE)
    assert p.target("irq/99").value == "0-7" and p.target("irq/99").held_by == ()


_names = st.sampled_from("abcd")
_events = st.lists(st.tuples(_names, st.sets(st.integers(0, 7), min_size=1, max_size=3),
                             st.sets(st.sampled_from(("irqs", "idle")), min_size=1)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(_events, st.randoms())
def test_any_sequence_of_isolations_and_releases_ends_at_the_originals(events, rnd):
    machine, ledger, live = dict(MACHINE), {}, {}
    for name, cpus, kinds in events:
        if name in live:
            del live[name]
        else:
            taken = CpuSet.union_of(h.cpus for h in live.values())
            free = CpuSet(cpus) - taken  # exclusive CPUs: never two holders of one
            if free:
                live[name] = Holding(free, frozenset(kinds))
        p = plan(live, KNOBS, ledger, machine)
        ledger = dict(p.originals)
        machine = apply(machine, p)
        # Restored knobs leave the ledger (the edge does so once the write succeeded).
        ledger = {k: v for k, v in ledger.items() if any(t.key == k and t.held_by for t in p.targets)}
        # The value depends on who holds, not on the order: as planned from scratch.
        fresh = apply(MACHINE, plan(live, KNOBS, {}, MACHINE))
        assert machine == fresh
    for name in rnd.sample(sorted(live), len(live)):
        del live[name]
        p = plan(live, KNOBS, ledger, machine)
        ledger = {k: v for k, v in p.originals.items() if any(t.key == k and t.held_by for t in p.targets)}
        machine = apply(machine, p)
    assert machine == MACHINE and ledger == {}
