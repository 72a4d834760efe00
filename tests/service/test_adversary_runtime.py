"""Runtime (NRI) admissions from a runtime that lies. Replayed by its request id,
one gets only the booking that same container made: never a workload the agent
enforces (a podman container's, a numa-run's) nor another container's, whose
CPUs it would then be told to share. A container or sandbox without an id is
refused: the in-process caller (the NRI handler) does not pass the HTTP API's
checks. On the simulated cgroup tree of an agent started as the daemon starts it."""

from __future__ import annotations

import pytest

from numa_agent.service.refusals import InvalidInput, RequestIdTaken
from numa_agent.service.requests import AdmitRequest, RuntimeRef
from tests.service.test_engine_cgroup import (
    CONTAINER,
    machine,  # noqa: F401 (a fixture)
    root_caller,
)
from tests.service.test_runtime_workloads import ref

CONTAINER_ID = "0123456789ab" + "cd" * 26


def test_a_runtime_admission_never_replays_a_podman_containers_booking(machine):  # noqa: F811
    # The OCI hook's booking of a podman container: on its engine cgroup, by root,
    # under the container's id as its request id (any hook process may replay it).
    machine.container()
    plain = machine.service.admit(AdmitRequest(name="ctr-0123456789ab", cpus=2, cgroup=CONTAINER,
                                               request_id=CONTAINER_ID), root_caller())
    with pytest.raises(RequestIdTaken):
        machine.service.admit(AdmitRequest(name="ctr-0123456789ab", cpus=2, request_id=CONTAINER_ID,
                                           runtime=ref(CONTAINER_ID)), root_caller())
    w = machine.service.state.workload("ctr-0123456789ab")
    assert w is not None and w.runtime is None and w.booking.cpus.format() == plain["cpus"]
    assert len(machine.service.state.workloads) == 1


def test_a_runtime_admission_never_replays_another_containers_booking(machine):  # noqa: F811
    machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, request_id=CONTAINER_ID,
                                       runtime=ref("first")), root_caller())
    with pytest.raises(RequestIdTaken):
        machine.service.admit(AdmitRequest(name="ctr-b", cpus=2, request_id=CONTAINER_ID,
                                           runtime=ref("second")), root_caller())
    # The same container asking again is the retry a replay is for.
    again = machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, request_id=CONTAINER_ID,
                                               runtime=ref("first")), root_caller())
    assert again["replayed"] is True


@pytest.mark.parametrize("empty", ["container_id", "sandbox_id"])
def test_a_runtime_container_without_an_id_is_refused(machine, empty):  # noqa: F811
    ids = {"container_id": "c0ffee01", "sandbox_id": "5andb0x", empty: ""}
    with pytest.raises(InvalidInput, match=f"runtime.{empty} is empty"):
        machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=RuntimeRef(runtime="nri", **ids)),
                              root_caller())
    assert machine.service.state.workloads == ()
