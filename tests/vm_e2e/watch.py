"""A scenario that runs long says where it is.

When a guest runs out of time the host gets no agent log and no report of the scenario
that hung: only what the guest printed. So while a scenario runs, a watcher prints, every
`every` seconds, how long it has run, every thread's stack in the scenario process and the
last lines of the agent's log, on stdout, which the host streams as it comes.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
from typing import Callable

WATCH_EVERY = 240.0  # the longest scenario takes about 80 s in a quiet guest
LOG_LINES = 30


class ScenarioWatch:
    def __init__(self, scenario: str, shape: str, agent_log: Callable[[], str],
                 every: float = WATCH_EVERY, out=None) -> None:
        self.scenario, self.shape = scenario, shape
        self.agent_log = agent_log
        self.every = every
        self.out = out if out is not None else sys.stdout
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watch-{scenario}", daemon=True)
        self._started = 0.0

    def __enter__(self) -> "ScenarioWatch":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(self.every):
            self.report(time.monotonic() - self._started)

    def report(self, elapsed: float) -> None:
        out = self.out
        print(f"vm-e2e watch: {self.scenario} {self.shape} still running after {elapsed:.0f} s; "
              "the scenario's threads:", file=out, flush=True)
        faulthandler.dump_traceback(file=out, all_threads=True)
        print(f"vm-e2e watch: the agent log's last {LOG_LINES} lines:", file=out, flush=True)
        try:
            lines = self.agent_log().splitlines()[-LOG_LINES:]
        except Exception as exc:  # the watch must not end the scenario it watches
            lines = [f"(unreadable: {exc})"]
        for line in lines:
            print(f"  {line}", file=out)
        out.flush()
