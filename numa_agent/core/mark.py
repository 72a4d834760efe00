"""The workload mark's token: proof that the agent admitted this process.

Anyone may put `NUMA_AGENT_WORKLOAD=<name>` in their own environment, so
the name alone cannot be trusted when workloads are rebuilt from /proc.
Admission answers with a token, an HMAC of (name, pid, start time) under a
per-boot key only the agent reads; numa-run exports it as
`NUMA_AGENT_MARK`. The token is no secret from the workload, but it proves
nothing for any other process: another pid or start time does not verify.
"""

from __future__ import annotations

import hashlib
import hmac

KEY_BYTES = 32


def issue_mark(key: bytes, name: str, pid: int, start_time: int) -> str:
    """The token for workload `name` run by the process (`pid`, `start_time`)."""
    message = f"{name}\0{pid}\0{start_time}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def mark_verifies(key: bytes | None, name: str, pid: int, start_time: int, mark: str | None) -> bool:
    """Whether `mark` is the token the agent issued for exactly this process.
    No key (none could be read or made): nothing verifies."""
    if key is None or not mark:
        return False
    return hmac.compare_digest(issue_mark(key, name, pid, start_time), mark)


def start_time_of(identity: str | None) -> int | None:
    """The start time in a process_identity ("<boot id>:<start time>")."""
    tail = (identity or "").rpartition(":")[2]
    return int(tail) if tail.isdigit() else None


__all__ = ["KEY_BYTES", "issue_mark", "mark_verifies", "start_time_of"]
