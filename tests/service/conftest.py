import subprocess

import pytest

from numa_agent.core.caller import Caller


@pytest.fixture
def sleepers():
    """Callers that are real, separate processes (a workload's cgroup is
    populated by its own process)."""
    procs = []

    def spawn(uid=1000):
        p = subprocess.Popen(["sleep", "60"])
        procs.append(p)
        return Caller(pid=p.pid, uid=uid, gid=uid)

    yield spawn
    for p in procs:
        p.kill()
        p.wait()
