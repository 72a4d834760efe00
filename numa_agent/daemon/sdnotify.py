"""systemd's sd_notify protocol: one datagram of KEY=VALUE lines to $NOTIFY_SOCKET.

Without NOTIFY_SOCKET (not started by systemd, or Type= is not notify) every call is a
no-op returning False, so the agent runs the same in a terminal. A send failure is logged
and returns False: a broken notification channel must not stop the node agent.

Watchdog: when the unit sets WatchdogSec=, systemd passes WATCHDOG_USEC (and
WATCHDOG_PID); the agent should call `watchdog_ping()` every `watchdog_interval() / 2`
seconds from its main loop, so a hung loop gets the service restarted.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Mapping

log = logging.getLogger("numa_agent.sdnotify")


def _socket_address(value: str) -> str | bytes | None:
    if value.startswith("@"):
        # Abstract namespace: the name begins with a NUL byte instead of '@'.
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send `state` (e.g. "READY=1", several lines allowed); True if it was sent."""
    environ = os.environ if env is None else env
    target = environ.get("NOTIFY_SOCKET")
    if not target:
        return False
    address = _socket_address(target)
    if address is None:
        log.warning("sd_notify: NOTIFY_SOCKET=%r is neither an absolute path nor an @abstract name; not notifying", target)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.warning("sd_notify: cannot send %r to %s: %s", state.split("\n", 1)[0], target, exc.strerror or exc)
        return False
    return True


def ready(env: Mapping[str, str] | None = None) -> bool:
    """Tell systemd start-up is complete (the socket listens, state is restored)."""
    return notify("READY=1", env)


def status(text: str, env: Mapping[str, str] | None = None) -> bool:
    """One-line status shown by `systemctl status`."""
    one_line = " ".join(text.splitlines())
    return notify(f"STATUS={one_line}", env)


def reloading(env: Mapping[str, str] | None = None) -> bool:
    """Tell systemd a reload began (sd_notify(3): RELOADING=1 with the CLOCK_MONOTONIC
    time in microseconds); `ready()` when it is over, whether it applied or not."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}", env)


def stopping(env: Mapping[str, str] | None = None) -> bool:
    return notify("STOPPING=1", env)


def watchdog_ping(env: Mapping[str, str] | None = None) -> bool:
    return notify("WATCHDOG=1", env)


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout in seconds, or None if the watchdog is off or meant for
    another process (WATCHDOG_PID names a different pid)."""
    environ = os.environ if env is None else env
    usec = environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = environ.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            log.warning("sd_notify: ignoring malformed WATCHDOG_PID=%r", pid)
            return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("sd_notify: ignoring malformed WATCHDOG_USEC=%r", usec)
        return None
    if value <= 0:
        return None
    return value / 1_000_000
