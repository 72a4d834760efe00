"""The service's refusals as the HTTP API answers them: one table, status and code."""

from __future__ import annotations

from numa_agent.api import errors
from numa_agent.service import refusals

HTTP_ERROR: dict[type[refusals.ServiceRefusal], type[errors.ApiError]] = {
    refusals.InvalidInput: errors.BadRequest,              # 400 bad_request
    refusals.NotPermitted: errors.Forbidden,               # 403 forbidden
    refusals.OverQuota: errors.QuotaExceeded,              # 403 quota_exceeded
    refusals.UnknownWorkload: errors.NotFound,             # 404 not_found
    refusals.InConflict: errors.Conflict,                  # 409 name_in_use
    refusals.NotResizable: errors.NotResizable,            # 409 not_resizable
    refusals.NoCapacity: errors.AdmissionRefused,          # 409 admission_refused
    refusals.TopologyRefused: errors.TopologyAffinityError,  # 409 topology_affinity_error
    refusals.HugepagesTaken: errors.AdmissionRefused,      # 409 admission_refused
    refusals.RequestIdTaken: errors.RequestIdInUse,        # 409 request_id_in_use
    refusals.Unavailable: errors.ServiceUnavailable,       # 503 unavailable
}


def api_error(refusal: refusals.ServiceRefusal) -> errors.ApiError:
    """The HTTP error `refusal` is answered with (its own class's row, not a base's)."""
    return HTTP_ERROR[type(refusal)](refusal.message, details=refusal.details)
