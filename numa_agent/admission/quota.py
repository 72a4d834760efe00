"""Per-user and per-group quotas (the configuration's [quotas]). Pure.

What an owner holds is derived from the state: the top-level bookings it owns
(a pod's budget counts against the pod's owner, the uid of its first member;
its members take from that budget and count nothing more). `cpus` are
exclusive CPUs, `memory_bytes` every byte booked on NUMA nodes, regular memory
and hugepages alike (under the memory manager's `none` policy nothing is
booked, so a memory quota limits nothing), and devices count per resource.

Which limit applies, resource by resource: the owner's `users.<name>` entry if
it names the resource, else the most generous of its groups' entries that name
it (equal limits: the group first by name), else `default`. Root (uid 0) has
only `users.root`: neither its groups nor `default` limit it. A uid with no
user name has only `default`. Who an owner is (its name, its groups) is looked
up at the edge and handed in as an `Owner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from numa_agent.admission.admit import Refusal
from numa_agent.admission.explanation import Explanation
from numa_agent.core.units import format_bytes
from numa_agent.state.model import AgentState, Booking, FollowsChanges, Holder

CPUS = "cpus"
MEMORY = "memory_bytes"
REASON_CODE = "quota_exceeded"
ROOT_UID = 0


@dataclass(frozen=True)
class Limits:
    """One entry of [quotas]: the resources it limits (None: not limited by it)."""

    cpus: int | None = None
    memory_bytes: int | None = None
    devices: Mapping[str, int] = field(default_factory=dict)

    def amounts(self) -> dict[str, int]:
        """resource -> limit: `cpus`, `memory_bytes` and device resources by name."""
        out = {key: value for key, value in ((CPUS, self.cpus), (MEMORY, self.memory_bytes)) if value is not None}
        return {**out, **self.devices}


@dataclass(frozen=True)
class Quotas:
    default: Limits | None = None
    users: Mapping[str, Limits] = field(default_factory=dict)
    groups: Mapping[str, Limits] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.default is not None or bool(self.users) or bool(self.groups)


NO_QUOTAS = Quotas()


@dataclass(frozen=True)
class Owner:
    """Who holds bookings, as the user database says: `name` None when it has none."""

    uid: int
    name: str | None = None
    groups: tuple[str, ...] = ()

    def label(self) -> str:
        return self.name if self.name is not None else str(self.uid)


@dataclass(frozen=True)
class Limit:
    amount: int
    entry: str  # the [quotas] key it comes from: "users.alice", "groups.hpc", "default"


def limits_for(quotas: Quotas, owner: Owner) -> dict[str, Limit]:
    """resource -> the limit that applies to `owner` (see the module's rule);
    a resource absent is not limited."""
    out: dict[str, Limit] = {}
    if owner.uid != ROOT_UID:
        if quotas.default is not None:
            out.update({r: Limit(v, "default") for r, v in quotas.default.amounts().items()})
        by_group: dict[str, Limit] = {}
        for group in sorted(set(owner.groups)):
            entry = quotas.groups.get(group)
            for r, v in (entry.amounts() if entry is not None else {}).items():
                if r not in by_group or v > by_group[r].amount:
                    by_group[r] = Limit(v, f"groups.{group}")
        out.update(by_group)
    user = quotas.users.get(owner.name) if owner.name is not None else None
    if user is not None:
        out.update({r: Limit(v, f"users.{owner.name}") for r, v in user.amounts().items()})
    return out


# ---- what each owner holds -------------------------------------------------------
Usage = Mapping[str, int]  # resource (as Limits.amounts names it) -> amount; no zeros


def booking_usage(b: Booking) -> dict[str, int]:
    out: dict[str, int] = {}
    if b.cpus:
        out[CPUS] = len(b.cpus)
    memory = sum(amount for per in b.memory.values() for amount in per.values())
    if memory:
        out[MEMORY] = memory
    for resource, _ in b.devices:
        out[resource] = out.get(resource, 0) + 1
    return out


def owner_usage(state: AgentState) -> Mapping[int, Usage]:
    """uid -> what it holds, for every uid holding anything. Kept in the
    state's memo and followed through admissions and releases (FollowsChanges),
    so an admission costs its change, not the number of workloads."""
    kept = state.memo.get("owner_usage")
    if kept is None:
        kept = state.memo["owner_usage"] = _KeptOwnerUsage({}).after((), list(state.top_level_holders()))
    return kept.usage


def usage_of(state: AgentState, uid: int) -> Usage:
    return owner_usage(state).get(uid, {})


@dataclass(frozen=True)
class _KeptOwnerUsage(FollowsChanges):
    usage: Mapping[int, Usage]

    def after(self, removed: Sequence[Holder], added: Sequence[Holder]) -> "_KeptOwnerUsage":
        usage = dict(self.usage)
        for holders, sign in ((removed, -1), (added, 1)):
            for holder in holders:
                held = dict(usage.get(holder.owner_uid, {}))
                for resource, amount in booking_usage(holder.booking).items():
                    held[resource] = held.get(resource, 0) + sign * amount
                    if not held[resource]:
                        del held[resource]
                if held:
                    usage[holder.owner_uid] = held
                else:
                    usage.pop(holder.owner_uid, None)
        return _KeptOwnerUsage(usage)


# ---- the rule ------------------------------------------------------------------------
def check_quota(quotas: Quotas, owner: Owner, before: AgentState, after: AgentState,
                explanation: Explanation) -> None:
    """Refusal (`quota_exceeded`) when going from `before` to `after` (an
    admission's decision) adds to a resource the owner is limited in and leaves
    it holding more than its limit. A resource the admission does not add to
    is not checked: a limit lowered below what an owner holds evicts nothing,
    and refuses only what would add to it."""
    limits = limits_for(quotas, owner)
    if not limits:
        return
    held, total = usage_of(before, owner.uid), usage_of(after, owner.uid)
    for resource in sorted(limits):
        limit, now, then = limits[resource], held.get(resource, 0), total.get(resource, 0)
        if then > now and then > limit.amount:
            quota = {"entry": limit.entry, "resource": resource, "limit": limit.amount,
                     "held": now, "asked": then - now}
            raise Refusal(REASON_CODE, _reason(owner, quota), explanation.but(quota=quota))


def _reason(owner: Owner, quota: Mapping[str, Any]) -> str:
    amount = format_bytes if quota["resource"] == MEMORY else str
    what = "memory" if quota["resource"] == MEMORY else quota["resource"]
    return (f"quota {quota['entry']}: {what} limit {amount(quota['limit'])}; {owner.label()} holds "
            f"{amount(quota['held'])} and the request asks {amount(quota['asked'])} more")


def quota_view(quotas: Quotas, owner: Owner, usage: Usage) -> dict[str, Any]:
    """One owner's use and limits, as status and metrics give them (base units):
    `cpus` and `memory_bytes` always, `devices` by resource where held or limited;
    each `{"used", "limit", "entry"}`, `limit` and `entry` null when unlimited."""
    limits = limits_for(quotas, owner)

    def one(resource: str) -> dict[str, Any]:
        limit = limits.get(resource)
        return {"used": usage.get(resource, 0), "limit": limit.amount if limit else None,
                "entry": limit.entry if limit else None}

    devices = sorted((set(usage) | set(limits)) - {CPUS, MEMORY})
    return {"owner_uid": owner.uid, "owner": owner.name, CPUS: one(CPUS), MEMORY: one(MEMORY),
            "devices": {r: one(r) for r in devices}}


def limited(view: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(resource, {"used", "limit", "entry"}) of a quota_view's limited resources."""
    parts: Iterable[tuple[str, Mapping[str, Any]]] = (
        (CPUS, view[CPUS]), (MEMORY, view[MEMORY]), *sorted(view["devices"].items()))
    return ((r, part) for r, part in parts if part["limit"] is not None)
