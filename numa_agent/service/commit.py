"""The commit unit: how a decided state becomes the state that stands.

A change is *staged* under the service's lock: its layout derived, the
isolation originals recorded, the checkpoint written, the state and layout
installed as the ones the next decision starts from. Its kernel writes are
then *applied* without the lock: a cgroup write the kernel delays (seen in a
guest) holds up only the changes that depend on it, never every admission and
release.

Order is kept where it matters:
- a change waits for every earlier change still being applied that shares a
  cgroup other than the pool, or an exclusive CPU one of them takes or frees
  (a release after an admission of the same workload is applied after it; CPUs
  a release frees reach a later workload only once they are out of its cgroup);
  a change that lays out the whole tree (`keys` None) waits for all of them;
- the shared pool is one value, written by whichever change needs it, under a
  lock of its own: the pool of the latest state, less the CPUs that changes
  still being applied free (those are still in their cgroups). So the latest
  pool wins and the pool never holds a CPU a cgroup still holds exclusively.
  What released workloads left running is handed to the pool under the same
  lock, with the pool as written (an eviction never writes a pool of its own).

A change whose writes fail is undone by a new change, staged and applied the
same way: the changed workloads and pods put back as they were before it, in
the state that stands now (never a restore of an older whole state: other
changes may have been committed since). A workload another change has touched
since is left as that change made it, as is one whose CPUs or devices were
booked by another meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Protocol

from numa_agent.admission.machine import Machine
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.errors import EnforcementError
from numa_agent.enforcement.plan import (
    AGENT_CGROUP,
    RELEASED_CGROUP,
    SHARED_CGROUP,
    CgroupLayout,
    CgroupSpec,
    desired_layout,
    update_layout,
)
from numa_agent.enforcement.processes import pidfd_alive
from numa_agent.enforcement.protocol import Enforcer, Layout, kept_records
from numa_agent.enforcement.record import LEDGER_RECORD, decode_ledger, encode_ledger
from numa_agent.hotplug.rebase import shortfall_warnings
from numa_agent.isolation.keeper import IsolationKeeper
from numa_agent.service.counters import Counters
from numa_agent.service.refusals import Unavailable
from numa_agent.service.revocation_copy import RevocationCopy
from numa_agent.service.revocations import hand_to_pool, pruned
from numa_agent.state.checkpoint import CheckpointError
from numa_agent.state.model import AgentState, IsolationLedger, Workload

log = logging.getLogger("numa_agent.service")

_ENFORCEMENT_FAILURES = (EnforcementError, OSError, ProcessLookupError)


class StatePublisher(Protocol):
    """Told each state the service installs, under its lock, before the change is
    acknowledged (the kubelet's state files: kubelet/files.py's StateFiles)."""

    def publish(self, machine: Machine, state: AgentState) -> None: ...


@dataclass(eq=False)
class Pending:
    """A staged change whose kernel writes are not done yet."""

    old_state: AgentState  # the state it was decided on
    decided: AgentState  # the decision's state (before isolation's ledger)
    old_layout: Layout
    new_layout: Layout
    keys: frozenset[str] | None  # the cgroups it writes, the pool aside; None: the whole tree
    cpus: CpuSet  # the exclusive CPUs it takes or frees
    freed: CpuSet  # the exclusive CPUs it frees: kept out of the pool until written
    move: tuple[str, int] | None
    caller: Caller | None
    undo: bool  # itself the undo of a failed change: never undone again
    after: list["Pending"] = field(default_factory=list)
    written: threading.Event = field(default_factory=threading.Event)  # its cgroups written (or given up)
    finished: threading.Event = field(default_factory=threading.Event)  # and the pool after them


def _exclusive_cpus(spec: CgroupSpec | None) -> CpuSet:
    if spec is None or spec.inherit or (isinstance(spec.record, Workload) and spec.record.shared):
        return CpuSet()
    return spec.cpus


def _conflict(earlier: Pending, later: Pending) -> bool:
    if earlier.keys is None or later.keys is None:
        return True
    return bool(earlier.keys & later.keys) or bool(earlier.cpus & later.cpus)


# The cgroups that hold the pool's CPUs: the pool, the agent's own, the one
# released workloads' processes are left in; and the shared workloads bound to
# part of the pool (`CgroupLayout.bound`), once made.
_POOL_CGROUPS = frozenset({SHARED_CGROUP, AGENT_CGROUP, RELEASED_CGROUP})


def _pool_cgroups(layout: Layout) -> frozenset[str]:
    return _POOL_CGROUPS | getattr(layout, "_bound", frozenset())


def _with_specs(layout: Layout, specs: dict[str, CgroupSpec]) -> Layout:
    """`layout` with the entries `specs` names replaced (the others untouched)."""
    specs = {rel: spec for rel, spec in specs.items() if rel in layout}
    if not specs:
        return layout
    if isinstance(layout, CgroupLayout):
        return layout.updated(specs)
    return {**layout, **specs}


def _clipped(spec: CgroupSpec, freed: CpuSet) -> CgroupSpec:
    """`spec` without the CPUs changes being applied still hold in their cgroups."""
    return dataclasses.replace(spec, cpus=spec.cpus - freed) if spec.cpus & freed else spec


def check_alive(caller: Caller) -> None:
    """The pidfd, opened when the caller connected, still names a live
    process: so caller.pid was not recycled for somebody else."""
    if caller.pidfd is not None and not pidfd_alive(caller.pidfd):
        raise ProcessLookupError(f"pid {caller.pid} exited")


def undone(current: AgentState, before: AgentState, after: AgentState) -> AgentState:
    """`current` with the change from `before` to `after` taken back: each
    workload and pod it changed put back as it was in `before`, unless another
    change touched it since, or what it held was booked by another meanwhile."""
    changes = after.changes_since(before)
    if changes is None:
        log.error("cannot tell what the failed change touched; the state stays as it stands")
        return current
    workloads, pods = changes
    mine = [n for n in sorted(workloads) if current.workload(n) == after.workload(n)]
    my_pods = [n for n in sorted(pods) if current.pod(n) == after.pod(n)]
    state = current
    for name in mine:
        if state.workload(name) is not None:
            state = state.without_workload(name)
    for name in my_pods:
        if state.pod(name) is not None and not state.members_of(name):
            state = state.without_pod(name)
    for name in my_pods:
        p = before.pod(name)
        if p is not None and state.pod(name) is None:
            if p.booking.cpus & state.exclusive_cpus():
                log.warning("pod %s is not put back: its CPUs were booked meanwhile", name)
                continue
            state = state.with_pod(p)
    for name in mine:
        w = before.workload(name)
        if w is None or state.workload(name) is not None:
            continue
        if w.pod is not None and state.pod(w.pod) is None:
            log.warning("workload %s is not put back: its pod is gone", name)
            continue
        taken = state.devices_in_use()
        if (w.pod is None and not w.shared and w.booking.cpus & state.exclusive_cpus()) or \
                any(addr in taken.get(resource, ()) for resource, addr in w.booking.devices):
            log.warning("workload %s is not put back: what it held was booked meanwhile", name)
            continue
        state = state.with_workload(w)
    return state


class CommitUnit:
    """Owns the state that stands, its layout and the checkpoint; see the module's text.
    `lock`: the service's, held by the caller of `stage` and `commit_whole`."""

    # Set by save while the checkpoint cannot be written: (what failed, since
    # when, on the service clock); health and metrics report it.
    checkpoint_trouble: tuple[str, float] | None = None

    def __init__(self, machine: Machine, store: Any, enforcer: Enforcer, lock: threading.RLock, *,
                 counters: Counters, clock: Callable[[], float],
                 isolation: IsolationKeeper | None = None,
                 state_publisher: StatePublisher | None = None,
                 revocation_copy: RevocationCopy | None = None) -> None:
        self.machine = machine
        self.store = store
        self.enforcer = enforcer
        self.lock = lock
        self.counters = counters
        self.clock = clock
        self.isolation = isolation
        self.state_publisher = state_publisher
        self.revocation_copy = revocation_copy
        self.state = AgentState(policy_fingerprint=machine.policy.fingerprint())
        self.layout: Layout = {}
        self._layout_machine: Machine | None = None
        self._pending: list[Pending] = []
        self._pool_lock = threading.Lock()
        # The pool's cgroups (_pool_cgroups) as last written into the kernel.
        self._pool_written: dict[str, CgroupSpec] = {}
        self._view: tuple[Machine, AgentState] | None = None
        self._published: AgentState | None = None
        self._ledger_recorded: IsolationLedger | None = None

    # ---- staging (under the lock) ---------------------------------------------------
    def stage(self, new_state: AgentState, move: tuple[str, int] | None = None,
              caller: Caller | None = None, *, undo: bool = False) -> Pending:
        """Checkpoint `new_state` and install it (the lock held); `apply` then
        writes the kernel side, without the lock. Unavailable when the
        checkpoint cannot be written: nothing was installed then."""
        old_state, old_layout = self.state, self.layout
        changes = new_state.changes_since(old_state) if self._layout_machine is self.machine else None
        touched: frozenset[str] | None = None
        new_layout: Layout
        if changes is None:
            new_layout = desired_layout(self.machine, new_state)
        else:
            new_layout, touched = update_layout(self.machine, old_layout, old_state, new_state, *changes)
        decided = new_state
        if self.isolation is not None:
            new_state = self.isolation.prepare(new_state)  # originals checkpointed before any write
        try:
            self.save(new_state, undo=old_state)
        except Unavailable:
            if not undo:
                raise
            # An undo stands in memory whatever the checkpoint says: the kernel is
            # made to match it, and the store's next commit that succeeds is whole.
            log.error("the checkpoint still holds the change refused until a commit succeeds")
        if new_state.revoked != old_state.revoked:
            self.copy_revocations(new_state)
        keys = None if touched is None else frozenset(
            rel for rel in touched
            if rel not in _POOL_CGROUPS and not (rel in _pool_cgroups(old_layout) and rel in _pool_cgroups(new_layout)))
        taken, freed = CpuSet(), CpuSet()
        for rel in keys or ():
            before, after = _exclusive_cpus(old_layout.get(rel)), _exclusive_cpus(new_layout.get(rel))
            freed, taken = freed | (before - after), taken | (after - before)
        pending = Pending(old_state, decided, old_layout, new_layout, keys, taken | freed, freed,
                          move, caller, undo)
        pending.after = [p for p in self._pending if _conflict(p, pending)]
        self._pending.append(pending)
        # The layout is the full layout of this state on this machine: the
        # next change may start from it.
        self.state, self.layout, self._layout_machine = new_state, new_layout, self.machine
        return pending

    # ---- applying (without the lock) ------------------------------------------------
    def apply(self, pending: Pending) -> None:
        """The kernel writes of a staged change, after those it waits for;
        then the publication and isolation. A failure is undone by a new
        change (see the module's text) and raised as Unavailable."""
        for earlier in pending.after:
            earlier.written.wait()
        try:
            try:
                if pending.move is not None and pending.caller is not None:
                    check_alive(pending.caller)
                self._write_cgroups(pending)
            except _ENFORCEMENT_FAILURES as exc:
                self._failed(pending, exc)
            with self.lock:
                self._pending.remove(pending)
            pending.written.set()
            try:
                self._write_pool()
            except _ENFORCEMENT_FAILURES as exc:  # the change stands; the next write of the pool retries
                log.error("the shared pool could not be written after %s: %s", "a change", exc)
            old_pool, new_pool = pending.old_layout.get(SHARED_CGROUP), pending.new_layout.get(SHARED_CGROUP)
            if pending.decided.revoked and new_pool != old_pool:
                self._hand_to_pool(pending.decided)  # released processes follow the pool
            with self.lock:
                self.publish()
                self.isolate()
        finally:
            pending.written.set()
            pending.finished.set()

    def _write_cgroups(self, p: Pending) -> None:
        """The change's own cgroups, against the pool as it is in the kernel
        (written first when this change takes CPUs from it)."""
        if p.keys is None:  # the whole tree, after every earlier change and before any later one
            with self._pool_lock:
                try:
                    self.enforcer.apply(self._as_written(p.old_layout), p.new_layout, p.move)
                except BaseException:
                    self._pool_written = {}  # not known: written whole next time
                    raise
                self._pool_written = self._pool_specs(p.new_layout, CpuSet())
            return
        if p.freed != p.cpus:  # it takes CPUs: the pool lets go of them first
            self._write_pool()
        if not p.keys and p.move is None:
            return
        with self._pool_lock:
            old = self._as_written(p.old_layout)
            written = dict(self._pool_written)
            # A shared workload bound to part of the pool is made here, within the pool as written.
            made = {rel: _clipped(spec, self._freed()) for rel in p.keys & _pool_cgroups(p.new_layout)
                    if (spec := p.new_layout.get(rel)) is not None}
            self._pool_written.update(made)
            for rel in p.keys - _pool_cgroups(p.new_layout):
                self._pool_written.pop(rel, None)
        self.enforcer.apply(old, _with_specs(p.new_layout, {**written, **made}), p.move, changed=p.keys)

    def _as_written(self, layout: Layout) -> Layout:
        """`layout` with the pool's cgroups as last written (the pool lock held);
        one not known is left out, so that it is written whole."""
        unknown = [rel for rel in _POOL_CGROUPS if rel not in self._pool_written and rel in layout]
        out = _with_specs(layout, self._pool_written)
        if not unknown:
            return out
        if isinstance(out, CgroupLayout):
            return out.updated({}, unknown)
        return {rel: spec for rel, spec in out.items() if rel not in unknown}

    def _freed(self) -> CpuSet:
        with self.lock:
            freed = CpuSet()
            for p in self._pending:
                freed = freed | p.freed
            return freed

    def _pool_specs(self, layout: Layout, freed: CpuSet) -> dict[str, CgroupSpec]:
        return {rel: _clipped(spec, freed) for rel in _pool_cgroups(layout)
                if (spec := layout.get(rel)) is not None}

    def _write_pool(self) -> None:
        """The pool's cgroups as the latest layout has them, less the CPUs that
        changes still being applied free, where the kernel holds anything else."""
        with self._pool_lock:
            with self.lock:
                layout, freed = self.layout, self._freed()
            targets = {rel: spec for rel, spec in self._pool_specs(layout, freed).items()
                       if rel in _POOL_CGROUPS or rel in self._pool_written}  # (bound ones once made)
            changed = frozenset(rel for rel, spec in targets.items() if self._pool_written.get(rel) != spec)
            if not changed:
                return
            try:
                self.enforcer.apply(self._as_written(layout), _with_specs(layout, targets), None, changed=changed)
            except BaseException:
                for rel in changed:
                    self._pool_written.pop(rel, None)  # not known: written whole next time
                raise
            self._pool_written.update(targets)

    def _hand_to_pool(self, state: AgentState) -> None:
        """What `state`'s revoked workloads left running goes to the pool, as the
        pool's cgroups are written: under the pool lock, with the latest layout's
        pool as written, so that a change applied meanwhile cannot have its newer
        pool overwritten by this one's older (an eviction may make
        `shared/_released`; the affinity fallback pins the pool's CPUs). A pool
        cgroup whose written value is not known is taken as the layout has it."""
        with self._pool_lock:
            with self.lock:
                layout = self.layout
            hand_to_pool(state, self.enforcer, _with_specs(layout, self._pool_written))

    def _failed(self, p: Pending, exc: BaseException) -> NoReturn:
        msg = str(exc) if not isinstance(exc, ProcessLookupError) else \
            "the requesting process exited before it could be moved into its workload"
        if p.undo:
            log.error("rollback of the cgroup tree failed too: %s", exc)
            with self.lock:
                self._pending.remove(p)
            p.written.set()
            raise Unavailable(f"enforcement failed, nothing was booked: {msg}") from None
        log.error("enforcement failed, rolling back: %s", exc)
        with self.lock:
            self._pending.remove(p)
            state = undone(self.state, p.old_state, p.decided)
            undo = self.stage(state, undo=True) if state is not self.state else None
        p.written.set()
        if undo is not None:
            try:
                self.apply(undo)
            except Unavailable:
                pass  # logged: the next whole layout (a restart, hotplug) corrects the tree
        raise Unavailable(f"enforcement failed, nothing was booked: {msg}") from None

    def wait_written(self, relpath: str) -> bool:
        """Wait (the lock not held) for the changes staged so far that write
        `relpath`; False when there was none."""
        with self.lock:
            pending = [p for p in self._pending if p.keys is None or relpath in p.keys]
        for p in pending:
            p.written.wait()
        return bool(pending)

    def applying(self) -> bool:
        """Some change is staged and its writes not done (the lock held)."""
        return bool(self._pending)

    def drain(self) -> None:
        """Wait (the lock not held) until no change is being applied."""
        while True:
            with self.lock:
                pending = list(self._pending)
            if not pending:
                return
            for p in pending:
                p.finished.wait()

    # ---- the whole state at once (the lock held, nothing being applied) -------------
    def commit_whole(self, new_state: AgentState) -> None:
        """Checkpoint, then enforce, all under the lock; undo both if
        enforcement fails. For a new machine (hotplug), laid out in full:
        the caller drained the changes being applied first."""
        old_state, old_layout = self.state, self.layout
        new_layout = desired_layout(self.machine, new_state)
        if self.isolation is not None:
            new_state = self.isolation.prepare(new_state)
        self.save(new_state, undo=old_state)
        if new_state.revoked != old_state.revoked:
            self.copy_revocations(new_state)
        try:
            self.enforcer.apply(self._as_written(old_layout), new_layout, None)
        except _ENFORCEMENT_FAILURES as exc:
            log.error("enforcement failed, rolling back: %s", exc)
            try:
                self.enforcer.apply(new_layout, old_layout, None)
            except (EnforcementError, OSError) as undo_exc:
                log.error("rollback of the cgroup tree failed too: %s", undo_exc)
            self._pool_written = self._pool_specs(old_layout, CpuSet())
            try:
                self.save(old_state)
            except Unavailable:
                log.error("the checkpoint still holds the change refused (%s) until a commit succeeds", exc)
            if new_state.revoked != old_state.revoked:
                self.copy_revocations(old_state)
            raise Unavailable(f"enforcement failed, nothing was booked: {exc}") from None
        self._pool_written = self._pool_specs(new_layout, CpuSet())
        if new_state.revoked and new_layout.get(SHARED_CGROUP) != old_layout.get(SHARED_CGROUP):
            hand_to_pool(new_state, self.enforcer, new_layout)
        self.state, self.layout, self._layout_machine = new_state, new_layout, self.machine
        self.publish()
        self.isolate()

    def install(self, state: AgentState) -> None:
        """Adopt a restored state (the lock held): checkpoint it as a whole
        snapshot (which also empties the journal it was restored from), then
        make the kernel match (cgroups re-written, leftovers of released
        workloads removed)."""
        layout = desired_layout(self.machine, state)
        if self.isolation is not None:
            kept = kept_records(self.enforcer)
            recorded = decode_ledger(kept.read_record(LEDGER_RECORD)) \
                if kept is not None and self.enforcer.exists(LEDGER_RECORD) else None  # a first start: nothing kept yet
            state = self.isolation.prepare(self.isolation.recovered(state, recorded))
        state = pruned(state, self.enforcer)
        try:
            self.store.commit(state, snapshot=True)
        except CheckpointError as exc:
            self.counters.checkpoint_failures_total += 1
            raise Unavailable(f"cannot write the checkpoint: {exc}") from None
        self.counters.checkpoint_writes_total += 1
        self.counters.checkpoint_snapshots_total += 1
        self.copy_revocations(state)  # the copy as pruned, or made from the checkpoint's
        # Before the layout: a released workload's cgroup left by a crash
        # still holds its CPUs (a partition would keep them from the pool).
        hand_to_pool(state, self.enforcer, layout)
        # So are the empty cgroups no booking names (a workload released at this
        # start, what a crash left half made): one made a partition holds CPUs
        # that the pool, written next, is checked to have.
        if (kept := kept_records(self.enforcer)) is not None:
            kept.prune(layout)
        self.enforcer.apply({}, layout, None)
        self._pool_written = self._pool_specs(layout, CpuSet())
        self.record_isolation(state)  # its cgroup exists now; before any knob is written
        self.state, self.layout, self._layout_machine = state, layout, None
        for text in shortfall_warnings(self.machine, state):  # memory gone while the agent was down
            log.warning("%s", text)
        self.publish()
        self.isolate()  # restores what workloads gone while the agent was down held

    # ---- after a change (the lock held) ---------------------------------------------
    def publish(self) -> None:
        """The kubelet state files and the readers' view for the state that
        stands, once each (the bookings only: what isolation records changes
        nothing in them)."""
        if self._published is self.state and self._view is not None and self._view[0] is self.machine:
            return
        self._view, self._published = (self.machine, self.state), self.state
        if self.state_publisher is not None:
            self.state_publisher.publish(self.machine, self.state)

    def view(self) -> tuple[Machine, AgentState] | None:
        return self._view

    def isolate(self) -> None:
        """Write the isolation knobs for the current state; checkpoint the
        ledger without the knobs that hold their original again. If that
        checkpoint fails they stay recorded, and restoring them again later
        writes what they already hold."""
        if self.isolation is None:
            return
        after = self.isolation.enforce(self.state)
        if after is not self.state:
            try:
                self.save(after)
            except Unavailable:
                return
            self.state = after
            self.publish()  # what isolation holds is shown (status) with the state that holds it

    def copy_revocations(self, state: AgentState) -> None:
        """After the checkpoint: the revocations' copy beside the mark key, which
        a lost checkpoint does not take along (service/revocation_copy.py)."""
        if self.revocation_copy is not None:
            self.revocation_copy.save(state.revoked)

    # ---- the checkpoint --------------------------------------------------------------
    def save(self, state: AgentState, undo: AgentState | None = None) -> None:
        """Make `state` durable: only its change from the last one checkpointed
        (the store's journal), or a whole snapshot when the store says so.
        Any OSError on the way is a checkpoint failure: Unavailable, with the
        health degraded until a later commit succeeds. `undo`: the state that
        stands when this one is refused, put back should the refused one have
        landed (renamed into place, not known durable), so that a start never
        reads a change that was refused."""
        self.record_isolation(state)
        try:
            kind = self.store.commit(state)
        except (CheckpointError, OSError) as exc:
            if getattr(exc, "landed", False) and undo is not None:
                self._put_back(undo, exc)
            self.counters.checkpoint_failures_total += 1
            self.counters.checkpoint_healthy = False
            if self.checkpoint_trouble is None:
                # Once per outage: a release retried every few seconds must not fill the log.
                log.error("checkpoint write failed: %s; admissions and releases are refused "
                          "until it can be written", exc)
                self.checkpoint_trouble = (str(exc), self.clock())
            else:
                log.debug("checkpoint write still failing: %s", exc)
                self.checkpoint_trouble = (str(exc), self.checkpoint_trouble[1])
            raise Unavailable(f"cannot write the checkpoint, nothing was booked: {exc}") from None
        self.counters.checkpoint_healthy = True
        if kind is not None:
            self.counters.checkpoint_writes_total += 1
        if kind == "snapshot":
            self.counters.checkpoint_snapshots_total += 1
        if self.checkpoint_trouble is not None:
            log.warning("checkpoint in %s written again after %.1f s of failures",
                        self.store.directory, self.clock() - self.checkpoint_trouble[1])
            self.checkpoint_trouble = None

    def _put_back(self, state: AgentState, failure: Exception) -> None:
        """The checkpoint holds `state` again, as a whole snapshot, after a
        refused change may have landed; best effort (the store's next commit
        is a whole snapshot anyway)."""
        try:
            self.store.commit(state, snapshot=True)
        except (CheckpointError, OSError) as exc:
            log.error("the checkpoint may hold a change that was refused (%s) and cannot be put back: %s; "
                      "the next commit that succeeds writes the state whole", failure, exc)

    def record_isolation(self, state: AgentState) -> None:
        """The isolation ledger also on the cgroup root (best effort, before the
        checkpoint): the originals outlive the checkpoint's loss, as the
        workloads' own records do. The affinity fallback has no such place."""
        if self.isolation is None or state.isolation == self._ledger_recorded:
            return
        if (kept := kept_records(self.enforcer)) is not None:
            kept.write_record(LEDGER_RECORD, encode_ledger(state.isolation))
        self._ledger_recorded = state.isolation
