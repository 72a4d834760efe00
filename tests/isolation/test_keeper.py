"""Isolation knobs on written /proc and /sys trees: hold, restore, recover, share, fail."""

from __future__ import annotations

import errno
from pathlib import Path

from numa_agent.core.cpuset import CpuSet
from numa_agent.isolation.keeper import IsolationKeeper
from numa_agent.isolation.knobs import ProcSysKnobs, SimulatedKnobs
from numa_agent.state.model import AgentState, Booking, Workload
from tests.support.isolation_tree import CPU, Failing, machine, snapshot


def workload(name: str, cpus: str, *kinds: str, shared: bool = False) -> Workload:
    return Workload(name=name, owner_uid=0, booking=Booking(cpus=CpuSet.parse(cpus)), shared=shared,
                    request={"isolate": list(kinds or ("irqs", "idle"))})


def step(keeper: IsolationKeeper, state: AgentState) -> AgentState:
    """What the service does: record originals (checkpointed), then write."""
    return keeper.enforce(keeper.prepare(state))


def knobs(root: Path) -> ProcSysKnobs:
    return ProcSysKnobs(root / "proc", root / "sys")


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text().strip()


def test_irqs_and_idle_are_held_then_restored_exactly(tmp_path):
    root = machine(tmp_path)
    before = snapshot(root)
    keeper = IsolationKeeper(knobs(root))
    state = step(keeper, AgentState().with_workload(workload("a", "4-5")))
    assert read(root, "proc/irq/24/smp_affinity_list") == "0-3,6-7"
    assert CpuSet.parse_mask(read(root, "proc/irq/default_smp_affinity")) == CpuSet.parse("0-3,6-7")
    assert read(root, "proc/irq/26/smp_affinity_list") == "2-3"  # never on 4-5
    assert read(root, f"{CPU}/cpu4/power/pm_qos_resume_latency_us") == "n/a"
    assert read(root, f"{CPU}/cpu3/power/pm_qos_resume_latency_us") == "0"
    assert state.isolation.originals["irq/24"] == "0-7" and "irq/26" not in state.isolation.originals
    assert keeper.report(state.workload("a")).done == ("irqs", "idle")
    released = step(keeper, state.without_workload("a"))
    assert snapshot(root) == before and not released.isolation


def test_idle_falls_back_to_disabling_deep_cpuidle_states(tmp_path):
    root = machine(tmp_path, pm_qos=False, cpuidle=True)
    before = snapshot(root)
    keeper = IsolationKeeper(ProcSysKnobs(root / "proc", root / "sys", latency_us=10))
    state = step(keeper, AgentState().with_workload(workload("a", "4", "idle")))
    assert [read(root, f"{CPU}/cpu4/cpuidle/state{s}/disable") for s in range(3)] == ["0", "0", "1"]
    assert read(root, f"{CPU}/cpu5/cpuidle/state2/disable") == "0"
    step(keeper, state.without_workload("a"))
    assert snapshot(root) == before


def test_freq_sets_the_performance_governor_or_raises_the_minimum(tmp_path):
    for governors, rel, held in (("powersave performance", "scaling_governor", "performance"),
                                 ("powersave", "scaling_min_freq", "3000000")):
        root = machine(tmp_path / rel, governors=governors)
        before = snapshot(root)
        keeper = IsolationKeeper(knobs(root))
        state = step(keeper, AgentState().with_workload(workload("a", "5", "freq")))
        assert read(root, f"{CPU}/cpufreq/policy4/{rel}") == held
        assert read(root, f"{CPU}/cpufreq/policy0/{rel}") != held
        step(keeper, state.without_workload("a"))
        assert snapshot(root) == before


def test_a_missing_knob_is_said_not_failed(tmp_path):
    root = machine(tmp_path)  # no cpufreq/
    keeper = IsolationKeeper(knobs(root))
    state = step(keeper, AgentState().with_workload(workload("a", "4", "irqs", "freq")))
    report = keeper.report(state.workload("a"))
    assert report.done == ("irqs",) and report.not_done == ("freq: not available on this machine",)
    assert report.failed() == report.not_done  # what --isolate-strict refuses for


def test_restore_after_a_crash_by_a_new_keeper_from_the_checkpointed_ledger(tmp_path):
    root = machine(tmp_path)
    before = snapshot(root)
    held = step(IsolationKeeper(knobs(root)), AgentState().with_workload(workload("a", "4-5")))
    # The agent was killed; the workload exited meanwhile; a new agent loads the checkpoint.
    loaded = AgentState.from_json(held.to_json()).without_workload("a")
    restored = step(IsolationKeeper(knobs(root)), loaded)
    assert snapshot(root) == before and not restored.isolation


def test_write_ahead_nothing_is_written_before_its_original_is_recorded(tmp_path):
    root = machine(tmp_path)
    before = snapshot(root)
    keeper = IsolationKeeper(knobs(root))
    keeper.enforce(AgentState().with_workload(workload("a", "4-5")))  # prepare never ran
    assert snapshot(root) == before


def test_two_workloads_sharing_an_irq_never_fight(tmp_path):
    root = machine(tmp_path)
    before = snapshot(root)
    keeper = IsolationKeeper(knobs(root))
    state = step(keeper, AgentState().with_workload(workload("a", "4-5")))
    state = step(keeper, state.with_workload(workload("b", "6")))
    assert read(root, "proc/irq/24/smp_affinity_list") == "0-3,7"
    assert state.isolation.originals["irq/24"] == "0-7"  # the first holder's view, not a's result
    state = step(keeper, state.without_workload("a"))
    assert read(root, "proc/irq/24/smp_affinity_list") == "0-5,7"  # b still holds its CPU
    state = step(keeper, state.without_workload("b"))
    assert snapshot(root) == before and not state.isolation


def test_managed_interrupts_are_listed_as_not_movable_not_errors(tmp_path):
    root = machine(tmp_path)
    keeper = IsolationKeeper(Failing(root, {"irq/25": errno.EIO}))
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    report = keeper.report(state.workload("a"))
    assert "irq 25: kernel-managed, not movable" in report.not_done and report.failed() == ()
    assert "irq/25" not in state.isolation.originals and keeper.failures == {}
    assert keeper.status(state)["not_movable"] == ["irq/25"]
    assert read(root, "proc/irq/24/smp_affinity_list") == "0-3,6-7"


def test_without_root_the_writes_are_said_and_nothing_is_kept(tmp_path):
    root = machine(tmp_path)
    keeper = IsolationKeeper(Failing(root, {"irq/24": errno.EACCES, "cpu/4/pm_qos": errno.EACCES}))
    state = step(keeper, AgentState().with_workload(workload("a", "4")))
    report = keeper.report(state.workload("a"))
    assert "irq/24: Permission denied" in report.failed() and "cpu/4/pm_qos: Permission denied" in report.failed()
    assert "irq/24" not in state.isolation.originals  # never changed: nothing to restore
    assert "irq/25" in state.isolation.originals


def test_a_failed_restore_stays_recorded_and_reported_until_a_retry_works(tmp_path):
    root = machine(tmp_path)
    before = snapshot(root)
    files = Failing(root, {})
    keeper = IsolationKeeper(files)
    state = step(keeper, AgentState().with_workload(workload("a", "4")))
    files.fail = {"irq/24": errno.EBUSY}
    state = step(keeper, state.without_workload("a"))
    assert state.isolation.originals == {"irq/24": "0-7"}
    assert keeper.status(state)["restore_failures"] == [
        {"knob": "irq/24", "original": "0-7", "error": "Device or resource busy"}]
    assert keeper.knob_counts(state) == {("irqs", "restore_failed"): 1}
    files.fail = {}
    state = keeper.enforce(state)
    assert snapshot(root) == before and not state.isolation and keeper.status(state)["restore_failures"] == []


def test_a_shared_workload_isolates_nothing(tmp_path):
    root = machine(tmp_path)
    before = snapshot(root)
    step(IsolationKeeper(knobs(root)), AgentState().with_workload(workload("a", "", shared=True)))
    assert snapshot(root) == before


def test_the_simulated_knobs_never_write_the_tree(tmp_path):
    root = machine(tmp_path)
    before = snapshot(root)
    files = SimulatedKnobs(root / "proc", root / "sys")
    keeper = IsolationKeeper(files)
    state = step(keeper, AgentState().with_workload(workload("a", "4-5")))
    assert files.read("irq/24") == "0-3,6-7" and snapshot(root) == before
    step(keeper, state.without_workload("a"))
    assert files.read("irq/24") == "0-7"


def test_a_commit_that_changes_no_holding_reads_and_writes_nothing(tmp_path):
    root = machine(tmp_path)

    class Counting(ProcSysKnobs):
        calls = 0

        def read(self, key):
            Counting.calls += 1
            return super().read(key)

    keeper = IsolationKeeper(Counting(root / "proc", root / "sys"))
    state = step(keeper, AgentState().with_workload(workload("a", "4-5")))
    Counting.calls = 0
    plain = Workload(name="b", owner_uid=0, booking=Booking(cpus=CpuSet.parse("6")))
    assert step(keeper, state.with_workload(plain)).isolation == state.isolation
    assert Counting.calls == 0
    step(keeper, state.with_workload(workload("c", "6")))  # a new holder: planned and written
    assert Counting.calls > 0 and read(root, "proc/irq/24/smp_affinity_list") == "0-3,7"


def test_after_a_reboot_the_previous_boots_originals_are_never_written_back(tmp_path):
    root = machine(tmp_path)
    held = step(IsolationKeeper(knobs(root), boot_id="boot-1"), AgentState().with_workload(workload("a", "4-5")))
    assert held.isolation.boot_id == "boot-1"
    # Power cut. The new boot's kernel (and whatever the admin runs at boot) set the knobs;
    # the workload did not survive; the agent loads the checkpoint it wrote before the cut.
    for irq in ("24", "25"):
        (root / f"proc/irq/{irq}/smp_affinity_list").write_text("0-1\n")
    (root / f"{CPU}/cpu4/power/pm_qos_resume_latency_us").write_text("20\n")
    after_boot = snapshot(root)
    loaded = AgentState.from_json(held.to_json()).without_workload("a")
    restored = step(IsolationKeeper(knobs(root), boot_id="boot-2"), loaded)
    assert snapshot(root) == after_boot and not restored.isolation


def test_the_same_boot_restores_and_an_unknown_boot_is_trusted(tmp_path):
    for first, second in (("boot-1", "boot-1"), ("", "boot-2"), ("boot-1", None)):
        root = machine(tmp_path / f"{first}-{second}")
        before = snapshot(root)
        held = step(IsolationKeeper(knobs(root), boot_id=first), AgentState().with_workload(workload("a", "4-5")))
        loaded = AgentState.from_json(held.to_json()).without_workload("a")
        step(IsolationKeeper(knobs(root), boot_id=second), loaded)
        assert snapshot(root) == before, (first, second)


def test_a_knob_an_admin_changed_while_held_is_left_as_they_set_it(tmp_path):
    root = machine(tmp_path)
    before = snapshot(root)
    keeper = IsolationKeeper(knobs(root))
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    (root / "proc/irq/24/smp_affinity_list").write_text("0-1\n")  # the admin's, meanwhile
    state = step(keeper, state.without_workload("a"))
    assert read(root, "proc/irq/24/smp_affinity_list") == "0-1"  # not the stale original 0-7
    assert {k: v for k, v in snapshot(root).items() if "irq/24/" not in k} == \
        {k: v for k, v in before.items() if "irq/24/" not in k}  # the rest restored
    assert not state.isolation
    assert keeper.status(state)["changed_by_others"] == [{"knob": "irq/24", "original": "0-7", "found": "0-1"}]


def test_a_knob_an_admin_changed_is_not_overwritten_for_the_next_workload_either(tmp_path):
    root = machine(tmp_path)
    keeper = IsolationKeeper(knobs(root))
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    (root / "proc/irq/24/smp_affinity_list").write_text("0-3\n")
    state = step(keeper, state.with_workload(workload("b", "6", "irqs")))
    assert read(root, "proc/irq/24/smp_affinity_list") == "0-3" and "irq/24" not in state.isolation.originals
    assert read(root, "proc/irq/25/smp_affinity_list") == "0-3,7"
    # From now on the admin's value is the original: a later change holds and restores it.
    (root / "proc/irq/24/smp_affinity_list").write_text("0-7\n")
    state = step(keeper, state.with_workload(workload("c", "7", "irqs")))
    assert read(root, "proc/irq/24/smp_affinity_list") == "0-3" and state.isolation.originals["irq/24"] == "0-7"
    assert keeper.status(state)["changed_by_others"] == []
    state = step(keeper, state.without_workload("a").without_workload("b").without_workload("c"))
    assert read(root, "proc/irq/24/smp_affinity_list") == "0-7" and not state.isolation


class Crash(BaseException):
    """The agent dies (power cut, SIGKILL) at this point."""


class Crashing(ProcSysKnobs):
    """Dies before its `at`-th write (counting from 0), or at none."""

    def __init__(self, root: Path, at: int | None) -> None:
        super().__init__(root / "proc", root / "sys")
        self.at, self.count = at, 0

    def write(self, key: str, value: str) -> None:
        if self.count == self.at:
            raise Crash()
        self.count += 1
        super().write(key, value)


def test_killed_before_any_write_of_admissions_releases_and_recovery_every_knob_ends_at_its_original(tmp_path):
    """Two workloads sharing interrupts come and go; the agent is killed before
    each write in turn (and again before each write of the recovery after it).
    What the service checkpoints is what `prepare` returns, then what `enforce`
    returns; a new agent starts from the last checkpoint with the same workloads."""
    changes = (lambda s: s.with_workload(workload("a", "4-5")), lambda s: s.with_workload(workload("b", "5-6")),
               lambda s: s.without_workload("a"), lambda s: s.with_workload(workload("c", "2-3", "irqs", "idle")),
               lambda s: s.without_workload("b").without_workload("c"))
    count = Crashing(machine(tmp_path / "count"), None)
    state, keeper = AgentState(), IsolationKeeper(count)
    for change in changes:
        state = step(keeper, change(state))
    runs = 0
    for at in range(count.count):
        for recovery_at in (None, 0, 1):
            root = machine(tmp_path / f"crash-{at}-{recovery_at}")
            before = snapshot(root)
            keeper, checkpoint, crashes = IsolationKeeper(Crashing(root, at)), AgentState(), [recovery_at]
            for change in changes:
                checkpoint = keeper.prepare(change(checkpoint))
                while True:
                    try:
                        checkpoint = keeper.enforce(checkpoint)
                        break
                    except Crash:  # a new agent loads the checkpoint and enforces it (perhaps dying too)
                        keeper = IsolationKeeper(Crashing(root, crashes.pop() if crashes else None))
                        checkpoint = keeper.prepare(AgentState.from_json(checkpoint.to_json()))
                        runs += 1
            assert snapshot(root) == before, (at, recovery_at)
            assert not checkpoint.isolation and keeper.changed == {}, (at, recovery_at)
    assert runs >= count.count * 3


class Rounding(ProcSysKnobs):
    """Stores the top frequency asked for as a minimum 1 MHz lower, as a driver may clamp it."""

    def write(self, key: str, value: str) -> None:
        super().write(key, "2999000" if key.endswith("min_freq") and value == "3000000" else value)


def test_a_value_the_kernel_stored_otherwise_than_written_is_still_the_agents_and_restored(tmp_path):
    root = machine(tmp_path, governors="powersave")
    before = snapshot(root)
    keeper = IsolationKeeper(Rounding(root / "proc", root / "sys"))
    state = step(keeper, AgentState().with_workload(workload("a", "5", "freq")))
    assert read(root, f"{CPU}/cpufreq/policy4/scaling_min_freq") == "2999000"
    state = step(keeper, state.without_workload("a"))
    assert snapshot(root) == before and not state.isolation and keeper.changed == {}


def test_a_commit_reads_the_changed_workloads_not_every_one(monkeypatch):
    """Whether isolation is in use, and what it holds, follow each update: a commit
    among a thousand workloads (one isolating) asks only the workloads that changed."""
    import numa_agent.isolation.keeper as keeper_module

    keeper = IsolationKeeper
    plain = [Workload(name=f"s{i:04}", owner_uid=0, booking=Booking(), shared=True) for i in range(1000)]
    state = AgentState(workloads=tuple(plain)).with_workload(workload("a", "4-5"))
    assert keeper.active(state)
    assert set(keeper_module.holdings(state)) == {"a"}
    asked = []
    real = keeper_module.isolation_asked

    def spy(w):
        asked.append(w.name)
        return real(w)

    monkeypatch.setattr(keeper_module, "isolation_asked", spy)
    added = state.with_workload(workload("b", "6"))
    gone = added.without_workload("a")
    assert keeper.active(added) and keeper.active(gone)
    assert set(keeper_module.holdings(added)) == {"a", "b"} and set(keeper_module.holdings(gone)) == {"b"}
    assert not keeper.active(gone.without_workload("b"))
    assert len(asked) <= 10, len(asked)
