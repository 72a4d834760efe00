"""The checkpoint journal as values: what changed between two states, how to
replay it, and how one entry is written and read back. No I/O here; the
store (state/checkpoint.py) appends and reads the file.

A delta is JSON-ready: `{"workloads": [<Workload JSON>...], "removed_workloads":
[name...], "pods": [...], "removed_pods": [...], "policy_fingerprint": "...",
"isolation": {"originals": {...}}, "revoked": [<Revocation JSON>...]}`,
each key present only when it changed (the ledger and the revocations whole:
both are small). Upserted entries are the values'
own `to_json()`, so replaying deltas onto a state's JSON gives exactly the
JSON of the new state (same checksum as a whole save of it).

One journal line is the canonical JSON of
`{"checksum": "sha256:<hex>", "entry": {"base": <snapshot checksum>, "seq": n, "delta": {...}}}`
and a newline. `base` names the snapshot the entry follows (its checksum) and
`seq` counts from 1 after it, so a journal left over from another snapshot is
never replayed onto this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar

import msgspec

from numa_agent.state.model import AgentState, Pod, Workload

Delta = dict[str, Any]

_Named = TypeVar("_Named", Workload, Pod)


# ---- the change ----------------------------------------------------------------------
def state_delta(old: AgentState, new: AgentState) -> Delta | None:
    """What turns `old` into `new`; None when nothing changed. A new state
    shares its unchanged Workload and Pod objects with the old one, so the
    values are compared by identity first (set operations on ids) and only
    the few that differ are looked at."""
    delta: Delta = {}
    names = new.changes_since(old)
    if names is not None:  # made from `old` by a few updates: look at those names only
        upserted, removed = _changed_names(names[0], old.workload, new.workload)
        upserted_pods, removed_pods = _changed_names(names[1], old.pod, new.pod)
    else:
        upserted, removed = _changed(old.workloads, new.workloads)
        upserted_pods, removed_pods = _changed(old.pods, new.pods)
    if upserted:
        delta["workloads"] = [w.to_json() for w in upserted]
    if removed:
        delta["removed_workloads"] = removed
    if upserted_pods:
        delta["pods"] = [p.to_json() for p in upserted_pods]
    if removed_pods:
        delta["removed_pods"] = removed_pods
    if old.policy_fingerprint != new.policy_fingerprint:
        delta["policy_fingerprint"] = new.policy_fingerprint
    if old.isolation != new.isolation:
        delta["isolation"] = new.isolation.to_json()  # small: the whole ledger
    if old.revoked is not new.revoked and old.revoked != new.revoked:
        delta["revoked"] = [r.to_json() for r in new.revoked]  # small: pruned at each release
    return delta or None


def _changed_names(names: Iterable[str], old: Callable[[str], _Named | None],
                   new: Callable[[str], _Named | None]) -> tuple[list[_Named], list[str]]:
    """As _changed, for the named values only (the others are known to be the same)."""
    upserted, removed = [], []
    for name in sorted(names):
        before, after = old(name), new(name)
        if after is None:
            if before is not None:
                removed.append(name)
        elif after is not before and after != before:
            upserted.append(after)
    return upserted, removed


def _changed(old: Sequence[_Named], new: Sequence[_Named]) -> tuple[list[_Named], list[str]]:
    """(values of `new` that are not in `old`, sorted by name; names of `old`
    that `new` lacks, sorted)."""
    if old is new:
        return [], []
    old_by_id = {id(v): v for v in old}
    new_by_id = {id(v): v for v in new}
    fresh = new_by_id.keys() - old_by_id.keys()
    gone = old_by_id.keys() - new_by_id.keys()
    before = {old_by_id[i].name: old_by_id[i] for i in gone}
    upserted = sorted((new_by_id[i] for i in fresh if before.get(new_by_id[i].name) != new_by_id[i]),
                      key=lambda v: v.name)
    kept = {new_by_id[i].name for i in fresh}
    removed = sorted(name for name in before if name not in kept)
    return upserted, removed


# ---- replay --------------------------------------------------------------------------
def replay(data: dict[str, Any], deltas: Iterable[Delta]) -> dict[str, Any]:
    """`data` (a state's JSON) with each delta applied in order; ValueError
    when a delta is not of the form `state_delta` makes."""
    workloads = _by_name(data.get("workloads", []), "workload")
    pods = _by_name(data.get("pods", []), "pod")
    fingerprint = data.get("policy_fingerprint", "")
    isolation = data.get("isolation")
    revoked = data.get("revoked")
    for delta in deltas:
        if not isinstance(delta, dict) or not delta.keys() <= _DELTA_KEYS:
            raise ValueError(f"not a state delta: {_short(delta)}")
        for name in _names(delta.get("removed_workloads", [])):
            workloads.pop(name, None)
        workloads.update(_by_name(delta.get("workloads", []), "workload"))
        for name in _names(delta.get("removed_pods", [])):
            pods.pop(name, None)
        pods.update(_by_name(delta.get("pods", []), "pod"))
        if "policy_fingerprint" in delta:
            fingerprint = delta["policy_fingerprint"]
            if not isinstance(fingerprint, str):
                raise ValueError(f"policy_fingerprint {fingerprint!r} is not a string")
        if "isolation" in delta:
            isolation = delta["isolation"]
            if not isinstance(isolation, dict):
                raise ValueError(f"isolation {_short(isolation)} is not an object")
        if "revoked" in delta:
            revoked = delta["revoked"]
            if not isinstance(revoked, list):
                raise ValueError(f"revoked {_short(revoked)} is not a list")
    out = dict(data)
    out["workloads"] = [workloads[name] for name in sorted(workloads)]
    out["pods"] = [pods[name] for name in sorted(pods)]
    out["policy_fingerprint"] = fingerprint
    out.pop("isolation", None)
    if isolation and isolation.get("originals"):  # as AgentState.to_json writes it
        out["isolation"] = isolation
    out.pop("revoked", None)
    if revoked:
        out["revoked"] = revoked
    return out


_DELTA_KEYS = frozenset({"workloads", "removed_workloads", "pods", "removed_pods", "policy_fingerprint",
                         "isolation", "revoked"})


def _by_name(values: Any, kind: str) -> dict[str, dict[str, Any]]:
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{kind}s is not a list")
    out: dict[str, dict[str, Any]] = {}
    for value in values:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise ValueError(f"a {kind} without a name: {_short(value)}")
        out[value["name"]] = value
    return out


def _names(values: Any) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"removed names are not a list of strings: {_short(values)}")
    return values


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---- one line of the file ---------------------------------------------------------------
def canonical(value: object) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def _digest(entry: object) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(canonical(entry)).hexdigest()


def encode_entry(base: str, seq: int, delta: Delta) -> bytes:
    entry = {"base": base, "seq": seq, "delta": delta}
    return canonical({"checksum": _digest(entry), "entry": entry}) + b"\n"


@dataclass(frozen=True)
class Entry:
    base: str  # checksum of the snapshot it follows
    seq: int  # 1 for the first entry after that snapshot
    delta: Delta


@dataclass(frozen=True)
class JournalRead:
    """What a journal file holds: the good entries before any damage, the
    length of that good prefix in bytes, the bytes of a torn last entry (an
    interrupted append: ignored), and what is wrong in the middle, if anything."""

    entries: tuple[Entry, ...]
    good_length: int
    torn_bytes: int = 0
    damage: str | None = None


def parse_journal(raw: bytes) -> JournalRead:
    """Read a journal file's bytes. A last line without its newline, or one
    holding NUL bytes (what a power cut leaves of an append), is torn and
    ignored; any other bad line is damage: the entries after it are not
    used (replaying past a lost change could double-book)."""
    entries: list[Entry] = []
    offset = 0
    lines = raw.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    for number, line in enumerate(complete, start=1):
        entry, problem = _parse_line(line)
        if problem is None:
            assert entry is not None
            entries.append(entry)
            offset += len(line) + 1
            continue
        last = number == len(complete) and not tail
        if last and b"\0" in line:
            return JournalRead(tuple(entries), offset, len(raw) - offset)
        return JournalRead(tuple(entries), offset, 0,
                           f"entry {number} (byte {offset}) {problem}; {len(entries)} entries before it are "
                           f"good, {len(complete) - number} after it are not used")
    return JournalRead(tuple(entries), offset, len(tail))


def _parse_line(line: bytes) -> tuple[Entry | None, str | None]:
    try:
        document = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return None, "is not valid JSON"
    if not isinstance(document, dict) or not isinstance(document.get("entry"), dict):
        return None, "has no 'entry' object"
    entry = document["entry"]
    if document.get("checksum") != _digest(entry):
        return None, "fails its checksum"
    base, seq, delta = entry.get("base"), entry.get("seq"), entry.get("delta")
    if not isinstance(base, str) or type(seq) is not int or not isinstance(delta, dict):
        return None, "lacks base, seq or delta"
    return Entry(base, seq, delta), None


def replayable(read: JournalRead, base: str) -> tuple[tuple[Entry, ...], str | None]:
    """The entries of `read` that follow the snapshot whose checksum is `base`,
    and what is inconsistent among them (a gap in seq, another base after the
    first) if anything; entries from after an inconsistency are not used. A
    journal whose first entry follows another snapshot is stale: ()."""
    if not read.entries or read.entries[0].base != base:
        return (), None
    for i, entry in enumerate(read.entries):
        if entry.base != base or entry.seq != i + 1:
            return read.entries[:i], (f"entry {i + 1} follows snapshot {entry.base[:19]}... seq "
                                      f"{entry.seq}, expected {base[:19]}... seq {i + 1}")
    return read.entries, None
