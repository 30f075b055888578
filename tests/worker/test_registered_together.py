"""``registered_together``: calls sent in bulk registered a batch at a time, within its
bounds (issue 23 item 2). The fleet test of a lost message sent in a block is in
``test_recovery_fleet.py``."""

from __future__ import annotations

import time

import pytest

from aaa_celery.errors import StoreUnavailable
from aaa_celery.lifecycle import CallSpec
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


def test_a_store_that_fails_the_batch_is_logged_not_raised(caplog):
    class Down(Batches):
        def register_many(self, calls: list[CallSpec]) -> None:
            raise StoreUnavailable("down")

    with registered_together():
        registering.register(Down(), CallSpec("c-0", "t"))
    assert "1 calls were sent but not registered" in caplog.text


@pytest.mark.parametrize("bounds", [{"max_calls": 0}, {"max_delay_s": -1.0}, {"max_delay_s": float("nan")}])
def test_bad_bounds_fail_at_the_block(bounds):
    with pytest.raises(ValueError):
        with registered_together(**bounds):
            pass
