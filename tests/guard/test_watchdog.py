"""The watchdog's one thread per process: short calls never wake it; due work still runs on time."""

from __future__ import annotations

import threading
import time

import pytest

from aaa_celery.config import GuardConfig
from aaa_celery.guard import watchdog as wd
from aaa_celery.lifecycle import Lease


class CountingStore:
    """Just enough of a Store for the watchdog: counts renewals."""

    def __init__(self) -> None:
        self.renewals = 0
        self.times: list[float] = []

    def renew(self, lease: Lease) -> bool:
        self.renewals += 1
        self.times.append(time.monotonic())
        return True


def lease(ttl_s: float) -> Lease:
    return Lease("call-1", 1, "w", "token", ttl_s)


@pytest.fixture
def notifies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often a call wakes the watchdog thread (``notify`` on its condition)."""
    sched = wd.scheduler()
    count = [0]
    real = sched._cond.notify

    def counting(n: int = 1) -> None:
        count[0] += 1
        real(n)

    monkeypatch.setattr(sched._cond, "notify", counting)
    return count


def settle(sched: wd._Scheduler) -> None:
    """Wait until the watchdog thread sleeps (it has seen every entry added so far)."""
    deadline = time.monotonic() + 2
    while sched._wakes_at == 0.0 and time.monotonic() < deadline:
        time.sleep(0.01)


def test_short_calls_never_wake_the_watchdog_thread(notifies: list[int]) -> None:
    store, config = CountingStore(), GuardConfig(lease_ttl_s=15)
    settle(wd.scheduler())
    for _ in range(200):
        assert wd.Watchdog(store, lease(15), config, None).run(lambda: 7) == 7
    assert notifies[0] == 0
    assert wd.active_calls() == 0


def test_a_heartbeat_sooner_than_the_idle_wake_still_renews_on_time() -> None:
    """A heartbeat due before the thread's idle wake is not left waiting for it.

    Whether the call notifies depends on whether the thread happens to be awake at that moment
    (it sees the entry then anyway), so the test checks what matters: when the renewals happen.
    """
    store, config = CountingStore(), GuardConfig(lease_ttl_s=0.3)  # heartbeat every 0.1 s
    settle(wd.scheduler())
    t0 = time.monotonic()
    wd.Watchdog(store, lease(0.3), config, None).run(lambda: time.sleep(0.6))
    assert store.times, "no renewal during the call"
    assert store.times[0] - t0 < wd.IDLE_WAKE_S * 0.8  # long before the idle wake, even loaded
    assert len(store.times) <= 7


def test_a_short_timeout_interrupts_on_time_in_a_thread() -> None:
    """On another thread (as in a threads pool) the deadline fires well before IDLE_WAKE_S."""
    settle(wd.scheduler())
    out: dict[str, object] = {}

    def body() -> None:
        t0 = time.monotonic()
        try:
            wd.Watchdog(None, None, GuardConfig(), 0.2).run(lambda: [time.sleep(0.01) for _ in range(300)])
        except wd.BodyTimedOut:
            out["after"] = time.monotonic() - t0

    t = threading.Thread(target=body)
    t.start()
    t.join(5)
    assert 0.15 <= out["after"] < 0.2 + wd.IDLE_WAKE_S / 2  # type: ignore[operator]
