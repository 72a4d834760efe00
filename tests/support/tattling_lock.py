"""A lock that tells when a thread has to wait for it: tests that drive an
interleaving let a thread run until it either finishes or waits for a lock the
code under test holds, without guessing with a sleep."""

from __future__ import annotations

import threading


class TattlingLock:
    """Used as a lock (`with`); sets `waited` when an acquirer finds it held."""

    def __init__(self, waited: threading.Event) -> None:
        self._lock = threading.Lock()
        self.waited = waited

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self.waited.set()
            self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
