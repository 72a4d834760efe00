"""Tasks pinned inside a cgroup they share, attacked: a caller gone or replaced
by a reused PID before its pin, resizes and hotplug of a pinned booking, whole
bookings around it, and restarts from a damaged or lost checkpoint. On the
simulated hierarchy, where a pin is recorded, not made (`simulated_pins`)."""

import json
import os
import subprocess

import pytest

from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.processes import process_identity
from numa_agent.service.refusals import InConflict, Unavailable
from numa_agent.service.requests import AdmitRequest
from tests.service.test_engine_cgroup import Machine

STEP = "/system.slice/slurmstepd.scope/job_7/step_0/user/task_special"


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    yield m
    m.close()


def _caller(proc, identity=None):
    return Caller(pid=proc.pid, uid=os.getuid(), gid=os.getgid(),
                  identity=identity if identity is not None else process_identity(proc.pid))


def _task(machine, name="slurm-7-0-0", cpus=2):
    proc = machine.container(STEP)
    me = _caller(proc)
    view = machine.service.admit(AdmitRequest(name=name, cpus=cpus, in_place=True, pinned=True), me)
    return proc, me, view


def _pinned_to(machine, pid):
    return machine.service.enforcer.simulated_pins.get(pid)


def _exit_before_apply(machine, proc):
    """The caller exits between the decision (under the lock) and its pin."""
    unit = machine.service._unit
    real = unit.apply

    def apply(pending):
        if pending.move is not None:
            proc.kill()
            proc.wait()
        return real(pending)

    unit.apply = apply


def test_a_caller_gone_before_its_pin_is_refused_and_books_nothing(machine):
    proc = machine.container(STEP)
    me = _caller(proc)
    _exit_before_apply(machine, proc)
    with pytest.raises(Unavailable, match="exited"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, pinned=True), me)
    assert machine.service.state.workloads == ()
    assert not machine.service.enforcer.exists("pinned/slurm-7-0-0")


def test_a_pid_another_process_took_since_the_caller_asked_is_never_pinned(machine):
    stranger = machine.container(STEP)
    # What the API read off the socket when the caller connected: its identity, not the stranger's.
    me = _caller(stranger, identity="1:1")
    with pytest.raises(Unavailable, match="exited"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, pinned=True), me)
    assert _pinned_to(machine, stranger.pid) is None
    assert machine.service.state.workloads == ()
