"""The repeated task behind the intruder scan and the memory sample."""

import threading

from numa_agent.observe.ticker import Ticker


def test_a_failed_tick_is_logged_and_the_next_one_runs(caplog):
    calls, twice = [], threading.Event()

    def tick():
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("gone for now")
        twice.set()

    ticker = Ticker("t", 0.01, tick, "the test's tick").start()
    assert twice.wait(30)
    ticker.stop()
    assert not ticker.thread.is_alive()
    assert "the test's tick failed" in caplog.text and "gone for now" in caplog.text


def test_at_start_ticks_at_once_and_otherwise_after_an_interval():
    ticked = threading.Event()
    at_once = Ticker("t", 3600, ticked.set, "tick", at_start=True).start()
    assert ticked.wait(30)  # long before the hour
    at_once.stop()
    early: list[int] = []
    later = Ticker("t", 3600, lambda: early.append(1), "tick").start()
    later.stop()  # stopped within its first interval: it never ticked
    assert not later.thread.is_alive() and early == []
