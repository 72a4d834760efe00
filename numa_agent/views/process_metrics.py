"""The standard `process_*` series for the agent's own process, read from
/proc/self at a cost that does not grow with its open descriptors.

The agent holds descriptors per workload (a pidfd for each process it follows,
in the affinity fallback its /proc files too), so a count made by listing
/proc/self/fd would make every scrape cost the number of workloads. Linux 6.2
and later report the count as the size of that directory (one stat); older
kernels report 0 there, and only they pay the listing.

Series (names, types and units as Prometheus' client libraries define them):
process_cpu_seconds_total, process_virtual_memory_bytes,
process_resident_memory_bytes, process_start_time_seconds, process_open_fds,
process_max_fds."""

from __future__ import annotations

import os
import resource
from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def open_descriptors(proc_self: str = "/proc/self", stat: Callable[[str], os.stat_result] = os.stat) -> int:
    """How many descriptors this process has open: the fd directory's size where
    the kernel reports it (>= 6.2; never 0 for a process with any open), else a listing."""
    fd_dir = f"{proc_self}/fd"
    counted = stat(fd_dir).st_size
    if counted > 0:
        return counted
    return len(os.listdir(fd_dir)) - 1  # less the listing's own descriptor


class ProcessMetrics:
    """A collector of the `process_*` series (see the module's docstring)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc_self = f"{proc}/self"
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._boot = _boot_time(f"{proc}/stat")

    def collect(self) -> Iterator[Metric]:
        try:
            with open(f"{self.proc_self}/stat", "rb") as f:
                # After the command name (which may hold spaces and parentheses):
                # state is field 3, utime 14, stime 15, starttime 22, vsize 23, rss 24.
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            fields = []
        if len(fields) > 21:
            utime, stime = int(fields[11]), int(fields[12])
            yield CounterMetricFamily("process_cpu_seconds", "User and system CPU time spent, in seconds.",
                                      value=(utime + stime) / self._ticks)
            yield GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size, in bytes.",
                                    value=float(fields[20]))
            yield GaugeMetricFamily("process_resident_memory_bytes", "Resident memory size, in bytes.",
                                    value=float(int(fields[21]) * self._page))
            if self._boot is not None:
                yield GaugeMetricFamily("process_start_time_seconds",
                                        "Start time of the process since the Unix epoch, in seconds.",
                                        value=self._boot + int(fields[19]) / self._ticks)
        try:
            yield GaugeMetricFamily("process_open_fds", "Number of open file descriptors.",
                                    value=float(open_descriptors(self.proc_self)))
        except OSError:
            pass
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            yield GaugeMetricFamily("process_max_fds", "Maximum number of open file descriptors.", value=float(soft))


def _boot_time(path: str) -> float | None:
    """The machine's boot time, seconds since the epoch (`btime` of /proc/stat)."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None
