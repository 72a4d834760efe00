"""The errors a caller of the local API sees, each with its HTTP status and
reason code as class attributes.

The API server turns each into a response with the error's `status` and a
body `{"error": {"code", "message", "details"}}`. The service's refusals
(`service/refusals.py`) become the ones `api/refusals.py` maps them to; the
server raises the rest, about the HTTP exchange itself. Kept free of imports
beyond the standard library so that the CLI can read the codes cheaply.
"""

from __future__ import annotations

from numa_agent.core.printable import printable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    from typing import Any


class ApiError(Exception):
    """Base of every error reported to an API caller."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        # The message is for a person (a client may print it raw: `jq -r .error.message`),
        # and quotes names anyone chose: escaped. `details` keeps exact values for programs.
        message = printable(message)
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details) if details else {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body the API returns."""
        return {"error": {"code": self.code, "message": self.message,
                          "details": self.details}}


class BadRequest(ApiError):
    """The request is malformed or asks for something that can never be valid."""

    status = 400
    code = "bad_request"


class Forbidden(ApiError):
    """The caller may not do this (e.g. release another user's workload)."""

    status = 403
    code = "forbidden"


class NotFound(ApiError):
    """No workload (or pod, or route) by that name."""

    status = 404
    code = "not_found"


class Conflict(ApiError):
    """The workload name is already taken."""

    status = 409
    code = "name_in_use"


class AdmissionRefused(ApiError):
    """The request is valid but cannot be admitted now (not enough resources
    at all). `details` is the explanation dict."""

    status = 409
    code = "admission_refused"


class TopologyAffinityError(AdmissionRefused):
    """The topology manager's policy refused the merged hint."""

    code = "topology_affinity_error"


class QuotaExceeded(ApiError):
    """The request would take its owner over a [quotas] limit. `details` is the
    explanation, with the quota (entry, resource, limit, held, asked)."""

    status = 403
    code = "quota_exceeded"


# The codes of an admission the agent could decide and refused: their details
# are the explanation, with its reason (the CLI prints them as such).
REFUSAL_CODES = (AdmissionRefused.code, TopologyAffinityError.code, QuotaExceeded.code)


class ServiceUnavailable(ApiError):
    """The service could not checkpoint or enforce; nothing was booked."""

    status = 503
    code = "unavailable"


class ServerBusy(ApiError):
    """The server is at its connection limit."""

    status = 503
    code = "busy"


# Status codes the API server itself produces for malformed HTTP, outside the
# service.
class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class LengthRequired(ApiError):
    status = 411
    code = "length_required"


class HeadersTooLarge(ApiError):
    status = 431
    code = "headers_too_large"


class MethodNotAllowed(ApiError):
    status = 405
    code = "method_not_allowed"


class RequestTimeout(ApiError):
    status = 408
    code = "request_timeout"


class NotResizable(ApiError):
    """The workload cannot be resized as asked (shared, or its CPUs were named)."""

    status = 409
    code = "not_resizable"


class RequestIdInUse(ApiError):
    """The admission's request id was already used by another user or process."""

    status = 409
    code = "request_id_in_use"
