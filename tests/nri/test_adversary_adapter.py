"""The adapter against a machine that fails under it: the kernel refusing a
descriptor or a thread must cost one attempt, never the adapter's thread
(which nobody would start again: the plugin would stay away for good)."""

from __future__ import annotations

import errno

from numa_agent.nri import plugin
from tests.nri.test_adapter import clock, handler, make, waits  # noqa: F401 (fixtures)


def test_a_connection_the_kernel_refuses_a_descriptor_for_is_one_failed_attempt(tmp_path, make, waits):  # noqa: F811
    tried: list[int] = []

    def connect(path, owners=None):
        tried.append(1)
        if len(tried) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        raise plugin.NriError(f"NRI socket {path} does not exist")

    adapter = make(connect=connect)
    waits.until(1)
    assert "Too many open files" in (adapter.error or "") and "\n" not in adapter.error
    waits.allow()
    waits.until(2)  # it went on: a second attempt, and its wait
    assert len(tried) == 2 and not adapter.stopped
