"""Errors and caller identity shared by the agent service and its API edge.

The service raises these; the API server turns each into an HTTP response
with the error's `status` and a body `{"error": {"code", "message", "details"}}`.
Kept free of imports beyond the standard library so that the CLI and the
server can use them without loading the service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Caller:
    """Who is asking, as the kernel reports it for the Unix socket peer.

    `pidfd` is opened by the API server right after accept, so the process
    cannot be swapped for another one with a recycled PID. The server closes
    it after the request; a service that wants to keep it must `os.dup` it.
    """

    pid: int
    uid: int
    gid: int
    pidfd: int | None = None

    @property
    def is_root(self) -> bool:
        return self.uid == 0


class ServiceError(Exception):
    """Base of every error the service reports to a caller."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, code: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details: dict[str, Any] = dict(details) if details else {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body the API returns."""
        return {"error": {"code": self.code, "message": self.message,
                          "details": self.details}}


class BadRequest(ServiceError):
    """The request is malformed or asks for something that can never be valid."""

    status = 400
    code = "bad_request"


class Forbidden(ServiceError):
    """The caller may not do this (e.g. release another user's workload)."""

    status = 403
    code = "forbidden"


class NotFound(ServiceError):
    """No workload (or pod) by that name."""

    status = 404
    code = "not_found"


class Conflict(ServiceError):
    """The workload name is already taken."""

    status = 409
    code = "name_in_use"


class AdmissionRefused(ServiceError):
    """The request is valid but cannot be admitted now.

    `code` is "topology_affinity_error" when the topology manager's policy
    refused the merged hint, "admission_refused" otherwise (not enough
    resources at all). `details` is the explanation dict.
    """

    status = 409
    code = "admission_refused"


# Status codes the API layer itself produces for malformed HTTP, outside the
# service. Kept here so every error body has one shape.
class PayloadTooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class LengthRequired(ServiceError):
    status = 411
    code = "length_required"


class HeadersTooLarge(ServiceError):
    status = 431
    code = "headers_too_large"


class MethodNotAllowed(ServiceError):
    status = 405
    code = "method_not_allowed"


class RequestTimeout(ServiceError):
    status = 408
    code = "request_timeout"
