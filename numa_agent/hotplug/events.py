"""Hotplug event source: kernel uevents for CPUs, memory blocks, NUMA nodes and PCI devices.

`classify()` is pure: it turns one uevent (action, subsystem, devpath, properties) into a
`HotplugEvent` or None when the agent does not care about it. The sources only do I/O:
`UdevEventSource` listens on the kernel's netlink uevent socket through pyudev
(``source="kernel"`` needs no udevd), `FakeEventSource` is fed by tests. Both expose a real
file descriptor (`fileno()`) so the agent can wait on them with `selectors`, and a
non-blocking `read_events()`.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from numa_agent.core.names import is_pci_address

KINDS = ("cpu", "memory", "node", "pci")
ACTIONS = ("add", "remove", "online", "offline", "change")

# Subsystems the kernel source is filtered on (the same names as the event kinds).
SUBSYSTEMS = KINDS

_CPU_DEVPATH = re.compile(r"^/devices/system/cpu/cpu(\d+)$")
_MEMORY_DEVPATH = re.compile(r"^/devices/system/memory/memory(\d+)$")
_NODE_DEVPATH = re.compile(r"^/devices/system/node/node(\d+)$")
# Domain is 4 hex digits usually, longer behind VMD bridges (e.g. 10000:00:00.0).
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

# uevent action -> event action, per kind. A driver bind/unbind leaves the device present
# but changes what it is usable for, so it is reported as a "change" of that device.
_ACTION_MAP: dict[str, dict[str, str]] = {
    "cpu": {"add": "add", "remove": "remove", "online": "online", "offline": "offline"},
    "memory": {"add": "add", "remove": "remove", "online": "online", "offline": "offline"},
    "node": {"add": "add", "remove": "remove", "online": "online", "offline": "offline"},
    "pci": {"add": "add", "remove": "remove", "bind": "change", "unbind": "change",
            "change": "change"},
}


@dataclass(frozen=True)
class HotplugEvent:
    kind: str          # cpu | memory | node | pci
    action: str        # add | remove | online | offline | change
    path: str          # sysfs path of the device, e.g. /sys/devices/system/cpu/cpu3
    id: int | str      # cpu number, memory block number, node id, or PCI address
    uevent_action: str = ""  # the kernel's own action word (bind/unbind kept for logs)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"hotplug event kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.action not in ACTIONS:
            raise ValueError(
                f"hotplug event action must be one of {', '.join(ACTIONS)}; got {self.action!r}"
            )


def classify(
    action: str | None,
    subsystem: str | None,
    devpath: str | None,
    properties: Mapping[str, str] | None = None,
) -> HotplugEvent | None:
    """The agent's view of one kernel uevent, or None if it is irrelevant.

    `devpath` is the kernel's DEVPATH (relative to /sys). Irrelevant means: another
    subsystem, an action the agent does not react to, or a devpath that is not a device
    of the expected shape (e.g. cpu subsystem entries that are not cpuN).
    """
    if not action or not subsystem or not devpath:
        return None
    actions = _ACTION_MAP.get(subsystem)
    if actions is None or action not in actions:
        return None
    mapped = actions[action]
    path = "/sys" + devpath
    ident: int | str
    if subsystem == "pci":
        props = properties or {}
        address = props.get("PCI_SLOT_NAME") or devpath.rsplit("/", 1)[-1]
        address = address.lower()
        if not is_pci_address(address):
            return None
        ident = address
    else:
        pattern = {"cpu": _CPU_DEVPATH, "memory": _MEMORY_DEVPATH, "node": _NODE_DEVPATH}[subsystem]
        m = pattern.match(devpath)
        if m is None:
            return None
        ident = int(m.group(1))
    return HotplugEvent(kind=subsystem, action=mapped, path=path, id=ident, uevent_action=action)


class HotplugUnavailable(Exception):
    """The kernel uevent socket cannot be used here; the message says why."""


class EventsLost(Exception):
    """Some uevents were dropped by the kernel; the topology must be re-read from sysfs."""


class EventSource(Protocol):
    def fileno(self) -> int: ...
    def read_events(self) -> list[HotplugEvent]: ...
    def close(self) -> None: ...


def _default_monitor():
    import pyudev  # imported lazily: only the daemon needs it

    context = pyudev.Context()
    return pyudev.Monitor.from_netlink(context, source="kernel")


class UdevEventSource:
    """Kernel uevents via pyudev's netlink monitor. Create with `UdevEventSource.open()`."""

    def __init__(self, monitor) -> None:
        self._monitor = monitor

    @classmethod
    def open(cls, monitor_factory: Callable[[], Any] | None = None) -> "UdevEventSource":
        """Open and start the monitor; raise HotplugUnavailable (with the reason) if the
        netlink socket or libudev cannot be used, e.g. in an unprivileged container."""
        factory = monitor_factory or _default_monitor
        try:
            monitor = factory()
            for subsystem in SUBSYSTEMS:
                monitor.filter_by(subsystem)
            monitor.start()
        except ImportError as exc:
            raise HotplugUnavailable(f"hotplug events unavailable: pyudev/libudev not usable ({exc})") from exc
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise HotplugUnavailable(
                f"hotplug events unavailable: cannot open the kernel uevent netlink socket ({reason})"
            ) from exc
        return cls(monitor)

    def fileno(self) -> int:
        return self._monitor.fileno()

    def read_events(self) -> list[HotplugEvent]:
        """Every uevent already queued, classified; never blocks."""
        out: list[HotplugEvent] = []
        while True:
            try:
                device = self._monitor.poll(timeout=0)
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    raise EventsLost(
                        "kernel uevents were dropped (netlink receive buffer overflowed); "
                        "rescan sysfs to resynchronise"
                    ) from exc
                raise
            if device is None:
                return out
            event = classify(
                device.action, device.subsystem, device.device_path, dict(device.properties)
            )
            if event is not None:
                out.append(event)

    def close(self) -> None:
        # pyudev has no explicit close: the netlink socket goes when the monitor is freed.
        self._monitor = None


class FakeEventSource:
    """Events pushed by tests, with a real pipe fd so selectors wake up like on netlink."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._queue: list[HotplugEvent] = []
        self._lock = threading.Lock()

    def push(self, event: HotplugEvent) -> None:
        with self._lock:
            self._queue.append(event)
        os.write(self._write_fd, b"\x01")

    def fileno(self) -> int:
        return self._read_fd

    def read_events(self) -> list[HotplugEvent]:
        with self._lock:
            try:
                while os.read(self._read_fd, 4096):
                    pass
            except BlockingIOError:
                pass
            events, self._queue = self._queue, []
        return events

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
