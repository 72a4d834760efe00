"""The event loop's side of hotplug: a burst of uevents (a DIMM is an add and
an online event per memory block) is handed on once it settles, and memory
changes that send no uevent (a balloon, a hugepage pool resized) are found by
reading the nodes' memory figures. A fake clock the test moves; the loop is
stepped without waiting."""

from types import SimpleNamespace

import pytest

from numa_agent.daemon.runtime import HOTPLUG_SETTLE, HOTPLUG_SETTLE_MAX, MEMORY_POLL_INTERVAL, EventLoop
from numa_agent.discovery.sysfs import read_memory_figures
from numa_agent.hotplug.events import EventsLost, FakeEventSource, HotplugEvent
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology, with_node_memory
from tests.support.sysfs_writer import write_sysfs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def block(n, action):
    return HotplugEvent("memory", action, f"/sys/devices/system/memory/memory{n}", n, action)


@pytest.fixture
def loop():
    """(loop, event source, clock, what on_hotplug was handed, the probe's figures)."""
    clock, handed, figures = Clock(), [], {"now": ((0, 100, ()), (1, 100, ()))}
    source = FakeEventSource()
    service = SimpleNamespace(enforcer=SimpleNamespace(fds=lambda: []), state=AgentState())
    loop = EventLoop(service, hotplug_source=source, on_hotplug=handed.append,
                     memory_probe=lambda: figures["now"], clock=clock)
    loop.open()
    yield loop, source, clock, handed, figures
    loop.close()
    source.close()


def test_a_burst_of_memory_block_events_is_handed_on_once_it_settles(loop):
    loop, source, clock, handed, _ = loop
    burst = [block(32, "add"), block(32, "online"), block(33, "add")]
    for event in burst:
        source.push(event)
    loop.step(0)
    assert handed == []  # more may follow
    clock.now += HOTPLUG_SETTLE / 2
    source.push(block(33, "online"))
    loop.step(0)
    clock.now += HOTPLUG_SETTLE * 0.9  # quiet, but not for HOTPLUG_SETTLE since the last one
    loop.step(0)
    assert handed == []
    clock.now += HOTPLUG_SETTLE
    loop.step(0)
    assert handed == [[*burst, block(33, "online")]]
    loop.step(0)
    assert len(handed) == 1


def test_a_stream_that_never_pauses_is_handed_on_after_the_longest_wait(loop):
    loop, source, clock, handed, _ = loop
    start = clock.now
    n = 0
    while clock.now - start < HOTPLUG_SETTLE_MAX:
        source.push(block(n, "online"))
        loop.step(0)
        assert handed == []
        n += 1
        clock.now += HOTPLUG_SETTLE / 2
    source.push(block(n, "online"))
    loop.step(0)
    assert len(handed) == 1 and len(handed[0]) == n + 1


def test_lost_events_are_handed_on_as_none_so_the_machine_is_read_again(loop):
    loop, source, clock, handed, _ = loop

    drain = source.read_events

    def lost():  # as the netlink socket says ENOBUFS once, then reads on
        drain()
        raise EventsLost("dropped")

    source.push(block(1, "online"))
    source.read_events = lost
    loop.step(0)
    clock.now += HOTPLUG_SETTLE
    loop.step(0)
    assert handed == [None]


def test_memory_that_changed_without_a_uevent_is_found_by_its_figures(loop):
    loop, source, clock, handed, figures = loop
    clock.now += MEMORY_POLL_INTERVAL
    loop.step(0)
    clock.now += HOTPLUG_SETTLE
    loop.step(0)
    assert handed == []  # nothing changed
    figures["now"] = ((0, 100, ()), (1, 60, ()))  # a balloon took some of node 1
    loop.step(0)
    assert handed == []  # not looked at before the interval
    clock.now += MEMORY_POLL_INTERVAL
    loop.step(0)
    clock.now += HOTPLUG_SETTLE
    loop.step(0)
    assert handed == [[HotplugEvent("node", "change", "/sys/devices/system/node/node1", 1)]]


def test_a_change_its_uevents_brought_is_not_found_again_by_the_figures(loop):
    loop, source, clock, handed, figures = loop
    figures["now"] = ((0, 100, ()), (1, 228, ()))  # a DIMM onlined on node 1
    source.push(block(40, "online"))
    loop.step(0)
    clock.now += HOTPLUG_SETTLE
    loop.step(0)
    assert handed == [[block(40, "online")]]
    clock.now += MEMORY_POLL_INTERVAL
    loop.step(0)
    clock.now += HOTPLUG_SETTLE
    loop.step(0)
    assert len(handed) == 1


def test_memory_figures_are_read_per_node_from_meminfo_and_the_hugepage_pools(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=2, threads_per_core=1, memory_per_node_bytes=4 << 30,
                         hugepages_2m_per_node=16)
    root = write_sysfs(with_node_memory(topo, 1, 6 << 30), tmp_path / "machine")
    assert read_memory_figures(root) == ((0, 4 << 20, ((2048, 16), (1 << 20, 0))),
                                         (1, 6 << 20, ((2048, 16), (1 << 20, 0))))
    assert read_memory_figures(tmp_path / "nothing") == ()
