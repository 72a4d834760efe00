import errno
import selectors
import threading
from types import SimpleNamespace

import pytest

from numa_agent.hotplug.events import (
    EventsLost,
    FakeEventSource,
    HotplugEvent,
    HotplugUnavailable,
    UdevEventSource,
    classify,
)

# Properties as `udevadm monitor --kernel --property` prints them on real machines.
PCI_ADD = {
    "ACTION": "add",
    "DEVPATH": "/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
    "SUBSYSTEM": "pci",
    "PCI_CLASS": "30200",
    "PCI_ID": "10DE:20B0",
    "PCI_SUBSYS_ID": "10DE:134F",
    "PCI_SLOT_NAME": "0000:3b:00.0",
    "MODALIAS": "pci:v000010DEd000020B0sv000010DEsd0000134Fbc03sc02i00",
    "SEQNUM": "4711",
}


def test_cpu_offline_and_online():
    off = classify("offline", "cpu", "/devices/system/cpu/cpu3", {"SEQNUM": "12"})
    assert off == HotplugEvent("cpu", "offline", "/sys/devices/system/cpu/cpu3", 3, "offline")
    on = classify("online", "cpu", "/devices/system/cpu/cpu3", {})
    assert (on.kind, on.action, on.id) == ("cpu", "online", 3)


def test_cpu_add_remove_use_large_ids():
    ev = classify("add", "cpu", "/devices/system/cpu/cpu255", {})
    assert (ev.action, ev.id) == ("add", 255)
    assert classify("remove", "cpu", "/devices/system/cpu/cpu255", {}).action == "remove"


def test_cpu_subsystem_entries_that_are_not_cpus_are_ignored():
    assert classify("change", "cpu", "/devices/system/cpu/cpu3", {}) is None  # unknown action
    assert classify("add", "cpu", "/devices/system/cpu/cpufreq", {}) is None
    assert classify("add", "cpu", "/devices/system/cpu/cpu3/cache", {}) is None


def test_memory_block_events():
    ev = classify("offline", "memory", "/devices/system/memory/memory42", {})
    assert ev == HotplugEvent("memory", "offline", "/sys/devices/system/memory/memory42", 42, "offline")
    assert classify("add", "memory", "/devices/system/memory/memory7", {}).action == "add"
    assert classify("online", "memory", "/devices/system/memory/auto_online_blocks", {}) is None


def test_node_events():
    ev = classify("add", "node", "/devices/system/node/node2", {})
    assert (ev.kind, ev.action, ev.id, ev.path) == ("node", "add", 2, "/sys/devices/system/node/node2")
    assert classify("remove", "node", "/devices/system/node/node2", {}).action == "remove"


def test_pci_add_uses_slot_name():
    ev = classify(PCI_ADD["ACTION"], PCI_ADD["SUBSYSTEM"], PCI_ADD["DEVPATH"], PCI_ADD)
    assert ev == HotplugEvent(
        "pci", "add", "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", "0000:3b:00.0", "add"
    )


def test_pci_bind_unbind_are_changes_and_keep_the_kernel_word():
    bind = classify("bind", "pci", PCI_ADD["DEVPATH"], {**PCI_ADD, "DRIVER": "vfio-pci"})
    unbind = classify("unbind", "pci", PCI_ADD["DEVPATH"], PCI_ADD)
    assert (bind.action, bind.uevent_action) == ("change", "bind")
    assert (unbind.action, unbind.uevent_action) == ("change", "unbind")


def test_pci_without_slot_name_falls_back_to_devpath_and_vmd_domains():
    ev = classify("remove", "pci", "/devices/pci0000:00/0000:00:0e.0/pci10000:00/10000:01:00.0", {})
    assert (ev.action, ev.id) == ("remove", "10000:01:00.0")
    assert classify("add", "pci", "/devices/pci0000:00/not-a-device", {}) is None


def test_other_subsystems_and_missing_fields_are_ignored():
    assert classify("add", "block", "/devices/virtual/block/loop0", {}) is None
    assert classify("add", "usb", "/devices/pci0000:00/0000:00:14.0/usb1", {}) is None
    assert classify(None, "cpu", "/devices/system/cpu/cpu1", {}) is None
    assert classify("add", None, "/devices/system/cpu/cpu1", {}) is None
    assert classify("add", "cpu", None, {}) is None


def test_event_rejects_unknown_kind_and_action():
    with pytest.raises(ValueError, match="kind must be one of cpu, memory, node, pci; got 'gpu'"):
        HotplugEvent("gpu", "add", "/sys/x", 1)
    with pytest.raises(ValueError, match="action must be one of .*; got 'bind'"):
        HotplugEvent("pci", "bind", "/sys/x", "0000:00:00.0")


def test_fake_source_wakes_a_selector_and_drains():
    source = FakeEventSource()
    sel = selectors.DefaultSelector()
    sel.register(source.fileno(), selectors.EVENT_READ)
    try:
        assert sel.select(timeout=0) == []
        assert source.read_events() == []
        first = HotplugEvent("cpu", "offline", "/sys/devices/system/cpu/cpu1", 1)
        second = HotplugEvent("pci", "remove", "/sys/devices/x/0000:3b:00.0", "0000:3b:00.0")
        pusher = threading.Thread(target=lambda: (source.push(first), source.push(second)))
        pusher.start()
        pusher.join()
        assert len(sel.select(timeout=5)) == 1
        assert source.read_events() == [first, second]
        # drained: the fd is no longer readable and nothing is returned twice
        assert sel.select(timeout=0) == []
        assert source.read_events() == []
    finally:
        sel.close()
        source.close()


class _FakeMonitor:
    def __init__(self, devices=(), error=None):
        self.devices = list(devices)
        self.filters = []
        self.started = False
        self.error = error

    def filter_by(self, subsystem):
        self.filters.append(subsystem)

    def start(self):
        self.started = True

    def fileno(self):
        return 99

    def poll(self, timeout=None):
        assert timeout == 0  # never blocks
        if self.error is not None:
            raise self.error
        return self.devices.pop(0) if self.devices else None


def _device(action, subsystem, devpath, props=None):
    return SimpleNamespace(action=action, subsystem=subsystem, device_path=devpath, properties=props or {})


def test_udev_source_filters_subsystems_and_classifies():
    monitor = _FakeMonitor(
        [
            _device("offline", "cpu", "/devices/system/cpu/cpu5"),
            _device("add", "block", "/devices/virtual/block/loop1"),
            _device("add", "pci", PCI_ADD["DEVPATH"], PCI_ADD),
        ]
    )
    source = UdevEventSource.open(lambda: monitor)
    assert monitor.started and sorted(monitor.filters) == ["cpu", "memory", "node", "pci"]
    assert source.fileno() == 99
    events = source.read_events()
    assert [(e.kind, e.action, e.id) for e in events] == [("cpu", "offline", 5), ("pci", "add", "0000:3b:00.0")]
    assert source.read_events() == []


def test_udev_source_netlink_refused_gives_reason():
    def refuse():
        raise PermissionError(errno.EPERM, "Operation not permitted")

    with pytest.raises(HotplugUnavailable, match="cannot open the kernel uevent netlink socket \\(Operation not permitted\\)"):
        UdevEventSource.open(refuse)


def test_udev_source_without_libudev_gives_reason():
    def missing():
        raise ImportError("libudev.so.1: cannot open shared object file")

    with pytest.raises(HotplugUnavailable, match="pyudev/libudev not usable \\(libudev.so.1"):
        UdevEventSource.open(missing)


def test_udev_source_overflow_reports_lost_events():
    source = UdevEventSource.open(lambda: _FakeMonitor(error=OSError(errno.ENOBUFS, "No buffer space")))
    with pytest.raises(EventsLost, match="rescan sysfs"):
        source.read_events()


def test_real_kernel_source_opens_or_says_why():
    try:
        source = UdevEventSource.open()
    except HotplugUnavailable as exc:
        pytest.skip(f"netlink not permitted here: {exc}")
    try:
        assert isinstance(source.fileno(), int) and source.fileno() >= 0
        assert isinstance(source.read_events(), list)  # non-blocking even when idle
    finally:
        source.close()
