"""Hotplug: kernel uevents about CPUs, memory, NUMA nodes and PCI devices."""

from numa_agent.hotplug.events import (
    EventsLost,
    FakeEventSource,
    HotplugEvent,
    HotplugUnavailable,
    UdevEventSource,
    classify,
)

__all__ = [
    "EventsLost",
    "FakeEventSource",
    "HotplugEvent",
    "HotplugUnavailable",
    "UdevEventSource",
    "classify",
]
