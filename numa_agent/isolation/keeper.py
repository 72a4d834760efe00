"""Holding the isolation knobs for the workloads that asked, and giving them back.

The service calls `prepare` before it checkpoints a state (the originals of
knobs about to be changed go into the state's ledger first: write-ahead)
and `enforce` after (every knob written to its planned value; the returned
state's ledger keeps only the knobs that still differ from their original).
A restore that fails stays in the ledger and in `failures`, and is tried
again (`retry`) until it works; status and metrics report it.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from numa_agent.isolation.irqbalance import IrqbalanceError
from numa_agent.isolation.knobs import KnobFiles
from numa_agent.isolation.plan import IRQBALANCE, KINDS, Holding, Plan, kind_of, plan, same_value
from numa_agent.state.model import AgentState, FollowsWorkloads, IsolationLedger, Workload

log = logging.getLogger("numa_agent.isolation")

ISOLATE = "isolate"  # Workload.request: the kinds asked for
STRICT = "isolate_strict"  # Workload.request: refuse rather than isolate in part

CHANGED = "changed by someone else"  # _write's answer for a knob holding what the agent never wrote


def isolation_asked(w: Workload) -> tuple[str, ...]:
    return tuple(w.request.get(ISOLATE) or ())


@dataclass(frozen=True)
class _Isolating(FollowsWorkloads):
    """The workloads that asked for isolation, and the holdings among them: kept in
    the state's memo and followed through every update, so that a commit among
    a thousand workloads asks the few that changed, not every one."""

    asked: frozenset[str] = frozenset()
    held: Mapping[str, Holding] = field(default_factory=dict)

    def after_workloads(self, removed: Sequence[Workload], added: Sequence[Workload]) -> "_Isolating":
        if not any(isolation_asked(w) for w in (*removed, *added)):
            return self
        asked, held = set(self.asked), dict(self.held)
        for w in removed:
            asked.discard(w.name)
            held.pop(w.name, None)
        for w in added:
            kinds = isolation_asked(w)
            if kinds:
                asked.add(w.name)
                # Exclusive CPUs only: a shared workload has none to isolate.
                if not w.shared and w.booking.cpus:
                    held[w.name] = Holding(w.booking.cpus, frozenset(kinds))
        return _Isolating(frozenset(asked), held)


def _isolating(state: AgentState) -> _Isolating:
    kept = state.memo.get("isolating")
    if not isinstance(kept, _Isolating):
        kept = state.memo["isolating"] = _Isolating().after_workloads((), state.workloads)
    return kept


def holdings(state: AgentState) -> dict[str, Holding]:
    """The workloads isolating, in name order: their exclusive CPUs and the kinds asked."""
    return dict(sorted(_isolating(state).held.items()))


@dataclass(frozen=True)
class Report:
    """What isolation did for one workload."""

    done: tuple[str, ...]  # kinds with at least one knob held
    not_done: tuple[str, ...]  # missing knobs, interrupts left, writes refused

    def failed(self) -> tuple[str, ...]:
        """What --isolate-strict refuses for: missing knobs and refused writes,
        not the interrupts the kernel manages."""
        return tuple(n for n in self.not_done if "not movable" not in n and "left as it is" not in n)


class _Reads(Mapping[str, str]):
    """The knobs' current values, read when the planner asks (it asks only for the knobs it may hold)."""

    def __init__(self, files: KnobFiles) -> None:
        self.files = files
        self.errors: dict[str, OSError] = {}  # key -> why it could not be read

    def __getitem__(self, key: str) -> str:
        try:
            return self.files.read(key)
        except OSError as exc:
            self.errors[key] = exc
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class IsolationKeeper:
    def __init__(self, files: KnobFiles, boot_id: str | None = None) -> None:
        self.files = files
        self.boot_id = boot_id or ""  # this boot's: the ledger says which boot its originals are of
        # Writes refused with EIO: kernel-managed interrupts. Replaced, never changed in
        # place: status reads it without the service's lock.
        self.unmovable: frozenset[str] = frozenset()
        self.failures: dict[str, str] = {}  # knob -> why its last write failed
        # knob -> what was found in it: changed by someone else while held, left as it is
        self.changed: dict[str, dict[str, str | None]] = {}
        self.plan: Plan | None = None  # the last one enforced
        self.unreachable: str | None = None  # why irqbalance, running, could not be asked
        # The holdings and ledger the last enforce left with nothing failing: a commit
        # that changes neither (an admission without --isolate) reads and writes nothing.
        self._settled: tuple[dict[str, Holding], IsolationLedger] | None = None

    def _plan(self, state: AgentState) -> Plan:
        reads = _Reads(self.files)
        p = plan(holdings(state), self.files.knobs(), state.isolation.originals, reads, self.unmovable)
        # irqbalance runs but its banned set cannot be read (no socket, not root): said, not dropped.
        error = reads.errors.get(IRQBALANCE)
        self.unreachable = None if error is None or error.errno == errno.ENOENT else _describe(error)
        return p

    @staticmethod
    def active(state: AgentState) -> bool:
        return bool(state.isolation) or bool(_isolating(state).asked)

    def missing(self, state: AgentState, name: str) -> tuple[str, ...]:
        """What the machine lacks for workload `name` of `state` (no knob is read)."""
        return plan(holdings(state), self.files.knobs(), state.isolation.originals, {}).missing.get(name, ())

    def prepare(self, state: AgentState) -> AgentState:
        """`state` with the originals of every knob it will hold in its ledger."""
        state = self._this_boot(state)
        if not self.active(state) or self._is_settled(state):
            return state
        p = self._plan(state)
        return state.with_isolation(self._ledger(p.originals, _about_to_write(p, state.isolation)))

    def recovered(self, state: AgentState, recorded: IsolationLedger | None) -> AgentState:
        """`state` (as loaded at start) with the originals that `recorded`, the
        copy of the ledger kept beside the cgroup records, has and its own ledger
        lacks: the checkpoint was lost, or an older generation of it loaded. The
        copy is written before each checkpoint, so where both know a knob it is
        the newer."""
        state = self._this_boot(state)
        if not recorded or (recorded.boot_id and self.boot_id and recorded.boot_id != self.boot_id):
            return state
        ledger = state.isolation
        originals = {**ledger.originals, **recorded.originals}
        written = {**{k: v for k, v in ledger.written.items() if k not in recorded.originals}, **recorded.written}
        missing = sorted(recorded.originals.keys() - ledger.originals.keys())
        if missing:
            log.warning("isolation: the checkpoint lacked the originals of %d knobs (%s); taken from the copy "
                        "beside the cgroup records", len(missing), ", ".join(missing[:8]))
        return state.with_isolation(IsolationLedger(originals, recorded.boot_id or ledger.boot_id, written))

    def _ledger(self, originals: Mapping[str, str], written: Mapping[str, tuple[str, ...]]) -> IsolationLedger:
        return IsolationLedger(originals, self.boot_id, written)

    def _this_boot(self, state: AgentState) -> AgentState:
        """`state` without a ledger read in another boot: the machine rebooted
        (a power cut with knobs held), every knob is at what this boot set, and
        the old originals (of interrupts that may now be other devices') must
        not be written over it."""
        ledger = state.isolation
        if not ledger or not ledger.boot_id or not self.boot_id or ledger.boot_id == self.boot_id:
            return state
        log.warning("isolation: the recorded originals of %d knobs (%s) are from boot %s, not this one; "
                    "the reboot reset them, nothing is restored", len(ledger.originals),
                    ", ".join(sorted(ledger.originals)[:8]), ledger.boot_id)
        return state.with_isolation(IsolationLedger())

    def _is_settled(self, state: AgentState) -> bool:
        return self._settled is not None and self._settled == (holdings(state), state.isolation) \
            and not self.lost(state)

    @staticmethod
    def watched(state: AgentState) -> bool:
        """A held setting lives in a daemon's memory (irqbalance's banned set)."""
        return IRQBALANCE in state.isolation.originals

    def lost(self, state: AgentState) -> bool:
        """A held setting was forgotten (irqbalance restarted): to be written again."""
        return self.watched(state) and self.files.lost()

    def enforce(self, state: AgentState) -> AgentState:
        """Write every knob to its planned value; `state` with the knobs that
        still differ from their original in its ledger."""
        state = self._this_boot(state)
        if not self.active(state):
            self.plan, self.failures, self._settled, self.unreachable = None, {}, None, None
            return state
        if self._is_settled(state):
            return state
        p = self._plan(state)
        originals, written = state.isolation.originals, state.isolation.written
        keep: dict[str, str] = {}
        keep_written: dict[str, tuple[str, ...]] = {}
        failures: dict[str, str] = {}
        unmovable = len(self.unmovable)
        for t in p.targets:
            if t.key not in originals:
                continue  # write-ahead: never changed before its original is checkpointed
            ours = written.get(t.key)
            value, error = self._write(t.key, t.value, bool(t.held_by),
                                       None if ours is None else (originals[t.key], *ours))
            if error is CHANGED:
                self._changed_by_others(t.key, originals[t.key], value, ours or ())
                continue  # theirs now: neither held nor restored by the agent
            if error is not None:
                failures[t.key] = error
            if value is None and error is None:
                continue  # gone (the device left): nothing to restore
            if value is None or not same_value(t.key, value, originals[t.key]):
                keep[t.key] = originals[t.key]
                if error is None and value is not None:
                    keep_written[t.key] = (value,)
                elif ours is not None:
                    keep_written[t.key] = ours
        held = {t.key for t in p.targets if t.held_by}
        for key, error in failures.items():
            if key not in self.failures:
                log.error("isolation: writing %s failed: %s%s", key, error, "" if key in held else
                          "; its original stays recorded and the restore is retried")
        for key in self.failures.keys() - failures.keys():
            log.warning("isolation: %s written again after failures", key)
        self.failures = failures
        self.plan = p if len(self.unmovable) == unmovable else self._plan(state)
        if self.changed.keys() & keep.keys():  # held again: a new dict, status reads the old one unlocked
            self.changed = {k: v for k, v in self.changed.items() if k not in keep}
        after = state.with_isolation(self._ledger(keep, keep_written) if keep else IsolationLedger())
        self._settled = None if failures or self.unreachable else (holdings(after), after.isolation)
        return after

    def _changed_by_others(self, key: str, original: str, found: str | None, ours: tuple[str, ...]) -> None:
        if key not in self.changed:
            log.warning("isolation: %s holds %s, which the agent did not write (it wrote %s; the original "
                        "was %s): someone else changed it, so it is left as it is and no longer restored",
                        key, found, " or ".join(ours) or "nothing", original)
        self.changed = {**self.changed, key: {"knob": key, "original": original, "found": found}}

    def _write(self, key: str, value: str, held: bool,
               ours: tuple[str, ...] | None = None) -> tuple[str | None, str | None]:
        """(the knob's value after, or None when unknown or gone; why the write failed, if it did,
        or CHANGED when it holds none of `ours`, the values the agent may have left there)."""
        try:
            before: str | None = self.files.read(key)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                log.info("isolation: %s is gone, nothing to restore", key)
                return None, None
            before = None
        if before is not None and same_value(key, before, value):
            return before, None
        if before is not None and ours is not None and not any(same_value(key, before, v) for v in ours):
            return before, CHANGED
        try:
            self.files.write(key, value)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None, None
            if exc.errno == errno.EIO and held and key.startswith("irq/"):
                self.unmovable = self.unmovable | {key}  # the kernel manages it: listed, not an error
                return before, None
            return before, _describe(exc)
        try:
            # What the kernel made of it (a frequency rounded, a mask with no online CPU
            # replaced): the value recorded as the agent's and compared with later.
            return self.files.read(key), None
        except OSError:
            return value, None

    # ---- reports ---------------------------------------------------------------
    def report(self, w: Workload) -> Report | None:
        asked = isolation_asked(w)
        if not asked:
            return None
        p = self.plan
        done: set[str] = set()
        not_done: list[str] = []
        if p is not None:
            for t in p.targets:
                if w.name in t.held_by:
                    if t.key in self.failures:
                        not_done.append(f"{t.key}: {self.failures[t.key]}")
                    else:
                        done.add(kind_of(t.key))
            not_done[:0] = [*p.missing.get(w.name, ()), *p.notes.get(w.name, ())]
            if self.unreachable and "irqs" in asked and not w.shared and w.booking.cpus:
                not_done.append(f"{IRQBALANCE}: irqbalance runs but was not told to keep off these CPUs: "
                                f"{self.unreachable}")
        return Report(tuple(k for k in KINDS if k in done), tuple(not_done))

    def restore_failures(self) -> dict[str, str]:
        held = {t.key for t in self.plan.targets if t.held_by} if self.plan else set()
        return {k: e for k, e in self.failures.items() if k not in held}

    def status(self, state: AgentState) -> dict[str, Any]:
        originals = state.isolation.originals
        failing = self.restore_failures()
        out: dict[str, Any] = {
            "knobs_held": len(originals),
            "restore_failures": [{"knob": k, "original": originals.get(k), "error": e}
                                 for k, e in sorted(failing.items())],
            "not_movable": sorted(self.unmovable),
            "changed_by_others": [self.changed[k] for k in sorted(self.changed)],
        }
        if self.unreachable:
            out["irqbalance"] = f"irqbalance runs but cannot be told to keep off isolated CPUs: {self.unreachable}"
        return out

    def knob_counts(self, state: AgentState) -> dict[tuple[str, str], int]:
        """(kind, state) -> how many knobs: held, restore_failed."""
        failing = self.restore_failures()
        out: dict[tuple[str, str], int] = {}
        for key in state.isolation.originals:
            label = (kind_of(key), "restore_failed" if key in failing else "held")
            out[label] = out.get(label, 0) + 1
        return out


def _about_to_write(p: Plan, ledger: IsolationLedger) -> dict[str, tuple[str, ...]]:
    """The ledger's `written` for plan `p`: each held knob's new value added to
    what it may hold now, so a crash between the checkpoint and the write
    leaves either one recognised as the agent's. A knob recorded by an older
    agent (no `written`) stays without: what it holds is not known."""
    out = {k: v for k, v in ledger.written.items() if k in p.originals}
    for t in p.targets:
        if not t.held_by or t.key not in p.originals:
            continue
        if t.key in ledger.originals and t.key not in ledger.written:
            continue
        prior = out.get(t.key, ())
        if not any(same_value(t.key, v, t.value) for v in prior):
            out[t.key] = (*prior, t.value)
    return out


def _describe(exc: OSError) -> str:
    if isinstance(exc, IrqbalanceError):
        return exc.strerror  # which socket, which answer
    return os.strerror(exc.errno) if exc.errno else str(exc)
