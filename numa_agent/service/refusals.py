"""What a use-case refuses, in the application's own words.

The service raises these and speaks no protocol; each adapter says them in its
own: the HTTP API maps them to a status and a code in one table
(`api/refusals.py`). `message` is for a person; `details` for a program (for a
refused admission, the explanation with its reason). Standard library only.
"""

from __future__ import annotations

from typing import Any


class ServiceRefusal(Exception):
    """Base of every refusal a use-case answers with; nothing was changed."""

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details) if details else {}


class InvalidInput(ServiceRefusal):
    """The request can never be valid as it is (a bad name, an impossible combination)."""


class NotPermitted(ServiceRefusal):
    """This caller may not do this (another user's workload, a root-only option)."""


class UnknownWorkload(ServiceRefusal):
    """No workload by that name (or not one admitted under that request id)."""


class InConflict(ServiceRefusal):
    """The name or the engine cgroup is taken, or the workload is held for an operator."""


class NotResizable(ServiceRefusal):
    """The workload's request cannot say the resize asked (a shared workload's CPUs,
    CPUs it named growing beyond them): start it again instead."""


class NoCapacity(ServiceRefusal):
    """Valid, but it cannot be admitted now; `details` is the explanation."""


class TopologyRefused(NoCapacity):
    """The topology manager's policy refused the merged hint."""


class HugepagesTaken(NoCapacity):
    """Hugepages the bookings leave free that the kernel says are taken (by
    processes the agent never admitted); `details` name the node and shortfall."""


class OverQuota(ServiceRefusal):
    """It would take its owner over a [quotas] limit; `details` names the quota."""


class Unavailable(ServiceRefusal):
    """The checkpoint or the enforcement failed; nothing was booked."""


class RequestIdTaken(ServiceRefusal):
    """The request id belongs to another user's or process's admission."""
