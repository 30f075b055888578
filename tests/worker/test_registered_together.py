"""``registered_together``: calls sent in bulk registered a batch at a time, within its
bounds (issue 23 item 2). The fleet test of a lost message sent in a block is in
``test_recovery_fleet.py``."""

from __future__ import annotations

import math
import os
import time

import pytest

from aaa_celery.config import GuardConfig
from aaa_celery.errors import StoreUnavailable
from aaa_celery.lifecycle import CallSpec
from aaa_celery.testing import wait_for
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.worker import registering, registered_together


class Batches(MemoryStore):
    """A memory store that keeps each batch it was asked to register."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    def register_many(self, calls: list[CallSpec]) -> None:
        self.batches.append([c.call_id for c in calls])
        super().register_many(calls)


def registered(store: MemoryStore) -> set[str]:
    return {c.call_id for c in store.expired(unclaimed_grace_s=-3600)}


def test_outside_a_block_each_call_is_registered_at_once():
    store = Batches()
    registering.register(store, CallSpec("c-1", "t"))
    assert registered(store) == {"c-1"} and store.batches == []


def test_a_block_registers_every_max_calls_and_the_rest_at_its_end():
    store = Batches()
    with registered_together(max_calls=2, max_delay_s=60):
        for n in range(5):
            registering.register(store, CallSpec(f"c-{n}", "t"))
        assert store.batches == [["c-0", "c-1"], ["c-2", "c-3"]]
        assert registered(store) == {"c-0", "c-1", "c-2", "c-3"}
    assert store.batches[-1] == ["c-4"]
    assert registered(store) == {f"c-{n}" for n in range(5)}


def test_a_send_after_max_delay_registers_the_waiting_calls_with_it():
    store = Batches()
    with registered_together(max_calls=100, max_delay_s=0.05):
        registering.register(store, CallSpec("c-0", "t"))
        time.sleep(0.1)
        registering.register(store, CallSpec("c-1", "t"))
        assert store.batches == [["c-0", "c-1"]]


def test_an_exception_in_the_block_still_registers_what_was_sent_and_an_inner_block_joins():
    store = Batches()
    with pytest.raises(RuntimeError):
        with registered_together(max_calls=100):
            registering.register(store, CallSpec("c-0", "t"))
            with registered_together(max_calls=1):  # joins the outer block: no batch of 1 here
                registering.register(store, CallSpec("c-1", "t"))
            assert store.batches == []
            raise RuntimeError("the publishing loop failed")
    assert store.batches == [["c-0", "c-1"]]


class DownFor(Batches):
    """A memory store whose registrations fail ``times`` times (the store restarting)."""

    def __init__(self, times: float) -> None:
        super().__init__()
        self.times = times

    def _down(self) -> None:
        if self.times > 0:
            self.times -= 1
            raise StoreUnavailable("down")

    def register_many(self, calls: list[CallSpec]) -> None:
        self._down()
        super().register_many(calls)

    def register(self, call: CallSpec) -> None:
        self._down()
        super().register(call)


def test_a_store_that_fails_the_batch_is_logged_not_raised_and_registered_once_it_is_back(caplog):
    store = DownFor(2)
    with registered_together():
        registering.register(store, CallSpec("c-0", "t"))
    assert "1 call(s) sent but not registered (down): c-0; trying again" in caplog.text
    wait_for(lambda: registered(store) == {"c-0"}, 10, "c-0 registered once the store is back")
    assert store.batches == [["c-0"]]


def test_a_call_sent_alone_is_registered_once_the_store_is_back_unless_a_worker_began_it():
    store = DownFor(1)
    registering.register(store, CallSpec("c-1", "t", request={"message": {"sent": 1}}))
    registering.register(store, CallSpec("c-2", "t", request={"message": {"sent": 2}}))
    store.begin(CallSpec("c-2", "t", request={"rebuilt": True}), "w", GuardConfig())
    wait_for(lambda: registered(store) == {"c-1"}, 10, "c-1 registered once the store is back")
    wait_for(lambda: not registering._retries.waiting, 10, "nothing left to register")
    assert store.batches[-1] == ["c-1"]  # c-2's spec in force stays the one its worker wrote


def test_a_late_registration_never_replaces_a_message_the_call_was_sent_with_since():
    store = DownFor(1)
    registering.register(store, CallSpec("c-9", "t", request={"message": {"retries": 0}}))
    # the store is back and the call is sent anew (a retry, a wait for a slot), registered at once
    newer = CallSpec("c-9", "t", request={"message": {"retries": 1}})
    store.register(newer)
    wait_for(lambda: not registering._retries.waiting, 10, "nothing left to register")
    assert store.batches[-1] == ["c-9"]  # the late registration was sent, and changed nothing
    assert {c.call_id: c for c in store.expired(unclaimed_grace_s=-3600)}["c-9"] == newer


def test_registering_again_gives_up_when_the_window_ends(caplog, monkeypatch):
    monkeypatch.setattr(registering, "RETRY_FOR_S", 0.5)
    registering.register(DownFor(math.inf), CallSpec("c-3", "t"))
    wait_for(lambda: "c-3 was sent but never registered: the store stayed unavailable" in caplog.text, 10,
             "the retries given up")
    assert not registering._retries.waiting


def test_a_forked_child_does_not_inherit_the_parents_registrations():
    store = DownFor(math.inf)
    registering.register(store, CallSpec("c-4", "t"))
    assert registering._retries.waiting
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not registering._retries.waiting else 1)
    assert os.waitpid(pid, 0)[1] == 0
    registering._retries.left()


@pytest.mark.parametrize("bounds", [{"max_calls": 0}, {"max_delay_s": -1.0}, {"max_delay_s": float("nan")}])
def test_bad_bounds_fail_at_the_block(bounds):
    with pytest.raises(ValueError):
        with registered_together(**bounds):
            pass


def test_past_retry_at_most_the_oldest_waiting_registrations_are_given_up(caplog, monkeypatch):
    monkeypatch.setattr(registering, "RETRY_AT_MOST", 2)
    store = DownFor(math.inf)
    for i in range(3):
        registering.register(store, CallSpec(f"c-{5 + i}", "t"))
    assert "c-5 was sent but never registered: too many waiting" in caplog.text
    assert sorted(call_id for _, call_id in registering._retries.waiting) == ["c-6", "c-7"]
    registering._retries.left()
