"""A task repeated on its own thread: the intruder scan and the memory sample."""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("numa_agent.observe")


class Ticker:
    """Calls `tick` every `interval` seconds on a daemon thread named `name`
    (the first time at once when `at_start`, else after one interval); a failed
    tick is logged as `what` and the next one tries again."""

    def __init__(self, name: str, interval: float, tick: Callable[[], object], what: str,
                 at_start: bool = False) -> None:
        self.interval, self.tick, self.what, self.at_start = interval, tick, what, at_start
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Ticker":
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)

    def _run(self) -> None:
        if not self.at_start and self._stop.wait(self.interval):
            return
        while True:
            try:
                self.tick()
            except Exception:  # the next tick tries again
                log.exception("%s failed", self.what)
            if self._stop.wait(self.interval):
                return
