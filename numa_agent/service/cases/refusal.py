"""The admission core's refusals in the service's words (service/refusals.py)."""

from __future__ import annotations

from numa_agent.admission.admit import Refusal
from numa_agent.admission.errors import HugepagesNotFreeError
from numa_agent.admission.quota import REASON_CODE as QUOTA_EXCEEDED
from numa_agent.service.refusals import HugepagesTaken, NoCapacity, OverQuota, ServiceRefusal, TopologyRefused

HUGEPAGES_NOT_FREE = HugepagesNotFreeError.reason


def refused(refusal: Refusal) -> ServiceRefusal:
    """The admission core's refusal of a valid request, with its explanation and reason."""
    kind = {"topology_affinity_error": TopologyRefused, QUOTA_EXCEEDED: OverQuota,
            HUGEPAGES_NOT_FREE: HugepagesTaken}.get(refusal.code, NoCapacity)
    return kind(refusal.message, details={**refusal.explanation, "reason": refusal.message,
                                          "reason_code": refusal.code})
