"""The booking record a workload's or pod's cgroup carries with it.

When the agent creates (or changes) a workload or pod cgroup it stores the
`Workload` / `Pod` value, as the checkpoint writes it, in the extended
attribute `user.numa_agent.record` of the cgroup directory. The record lives
and dies with the cgroup, so when the checkpoint is lost or corrupt, start-up
recovery can rebuild the full booking (memory per node, hugepages, devices,
owner, pod, request) instead of guessing it from `cpuset.cpus`.

Format: compact JSON, one object with the schema number and one key naming
the kind of value:

    {"schema":1,"workload":{"name":"web","owner_uid":1000,"booking":{...},...}}
    {"schema":1,"pod":{"name":"db","owner_uid":1000,"booking":{...},...}}

The command line is left out: a cgroup directory's `user.*` attributes can be
read by anyone who can read the directory, and a command line can carry a
secret (status shows it to root and the owner only). One attribute value is
at most XATTR_SIZE_MAX (64 KiB); a record that does not fit is not written
(recovery then reads the cgroup's limits instead).
"""

from __future__ import annotations

from typing import Any

import msgspec

from numa_agent.enforcement.plan import SHARED_CGROUP
from numa_agent.state.model import IsolationLedger, Pod, Workload

RECORD_XATTR = "user.numa_agent.record"
RECORD_SCHEMA = 1
# The shared pool's cgroup (never adopted as a workload) carries the isolation
# ledger (numa_agent/isolation) beside the workloads' records, so that it
# outlives the checkpoint too, and dies with the boot, as the knobs' values do.
LEDGER_RECORD = SHARED_CGROUP


def encode_record(value: Workload | Pod) -> bytes:
    if isinstance(value, Workload):
        body = value.to_json()
        body.pop("command", None)
        return msgspec.json.encode({"schema": RECORD_SCHEMA, "workload": body})
    return msgspec.json.encode({"schema": RECORD_SCHEMA, "pod": value.to_json()})


def decode_record(data: bytes) -> Workload | Pod:
    """The value `encode_record` wrote; ValueError for anything else."""
    try:
        doc: Any = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    except RecursionError:  # one damaged attribute must not stop the agent's recovery
        raise ValueError("not JSON: nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("schema") != RECORD_SCHEMA:
        schema = doc.get("schema") if isinstance(doc, dict) else None
        raise ValueError(f"unknown record schema {schema!r} (this agent reads {RECORD_SCHEMA})")
    kinds = [k for k in ("workload", "pod") if k in doc]
    if len(kinds) != 1 or not isinstance(doc[kinds[0]], dict):
        raise ValueError("a record holds exactly one workload or one pod")
    try:
        if kinds[0] == "workload":
            return Workload.from_json(doc["workload"])
        return Pod.from_json(doc["pod"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed {kinds[0]}: {exc}") from None


__all__ = ["RECORD_SCHEMA", "RECORD_XATTR", "decode_record", "encode_record"]


def encode_ledger(ledger: IsolationLedger) -> bytes:
    return msgspec.json.encode({"schema": RECORD_SCHEMA, "isolation": ledger.to_json()})


def decode_ledger(data: bytes | None) -> IsolationLedger | None:
    """The ledger `encode_ledger` wrote; None for nothing or anything else."""
    try:
        doc: Any = msgspec.json.decode(data) if data else None
        if isinstance(doc, dict) and doc.get("schema") == RECORD_SCHEMA and isinstance(doc.get("isolation"), dict):
            return IsolationLedger.from_json(doc["isolation"])
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError):
        pass
    return None
