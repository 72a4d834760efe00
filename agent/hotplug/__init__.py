"""Hotplug: kernel uevents about CPUs, memory, NUMA nodes and PCI devices."""

from agent.hotplug.events import (
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
