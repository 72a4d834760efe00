"""The service's refusals as the HTTP API answers them: one row each, nothing lost."""

from numa_agent.api import errors
from numa_agent.api.refusals import HTTP_ERROR, api_error
from numa_agent.service import refusals
from numa_agent.service.refusals import ServiceRefusal


def _kinds(base: type) -> set[type]:
    found = set()
    for sub in base.__subclasses__():
        found |= {sub} | _kinds(sub)
    return found


def test_every_refusal_the_service_can_raise_has_its_own_row():
    # Exact types: a subclass must not fall back to its base's status unnoticed.
    assert set(HTTP_ERROR) == _kinds(ServiceRefusal)


def test_the_statuses_and_codes_callers_rely_on():
    answered = {kind.__name__: (api_error(kind("m")).status, api_error(kind("m")).code) for kind in HTTP_ERROR}
    assert answered == {
        "InvalidInput": (400, "bad_request"), "NotPermitted": (403, "forbidden"),
        "OverQuota": (403, "quota_exceeded"), "UnknownWorkload": (404, "not_found"),
        "InConflict": (409, "name_in_use"), "NoCapacity": (409, "admission_refused"),
        "NotResizable": (409, "not_resizable"),
        "TopologyRefused": (409, "topology_affinity_error"), "RequestIdTaken": (409, "request_id_in_use"),
        "Unavailable": (503, "unavailable"), "HugepagesTaken": (409, "admission_refused"),
    }
    # numa-run prints a refusal's explanation for exactly these codes
    assert {api_error(k("m")).code for k in (refusals.NoCapacity, refusals.TopologyRefused,
                                            refusals.OverQuota)} == set(errors.REFUSAL_CODES)


def test_message_and_details_pass_through():
    err = api_error(refusals.TopologyRefused("no room", details={"reason": "no room", "admit": False}))
    assert isinstance(err, errors.TopologyAffinityError)
    assert err.to_dict() == {"error": {"code": "topology_affinity_error", "message": "no room",
                                       "details": {"reason": "no room", "admit": False}}}
