"""The guard holds a call's concurrency slot with its lease (issue 40): taken before the
attempt is claimed, renewed with the lease, freed once the outcome is recorded; a call
that finds every slot held waits (``SlotBusy``), is skipped or rejected, as its rule says."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from aaa_celery.config import GuardConfig
from aaa_celery.errors import CallSkipped, PolicyDenied
from aaa_celery.guard import GuardRunner, SlotBusy, wait_s
from aaa_celery.lifecycle import FAILED, CallSpec, Slot
from aaa_celery.stores.memory import MemoryStore


def call() -> CallSpec:
    return CallSpec(f"c-{uuid.uuid4().hex}", "sync_inventory")


def hold(store: MemoryStore, slot: Slot, config: GuardConfig) -> tuple[CallSpec, threading.Event, threading.Thread]:
    """A call that holds a slot of ``slot`` until its event is set."""
    held, release, running = call(), threading.Event(), threading.Event()

    def body(attempt: int) -> str:
        running.set()
        release.wait(30)
        return "done"

    runner = GuardRunner(store, config, slot=slot)
    thread = threading.Thread(target=runner.run, args=(held, "holder", body))
    thread.start()
    assert running.wait(10), "the holder never ran"
    assert store.slot_holders(slot.key) == [held.call_id]
    return held, release, thread


@pytest.mark.parametrize("on_busy", ["wait", "skip", "reject"])
def test_a_call_finding_every_slot_held_does_what_its_rule_says(on_busy):
    store, config = MemoryStore(), GuardConfig(lease_ttl_s=5)
    slot = Slot("aaa:slot:k", 1, on_busy, "one sync a shop")
    held, release, thread = hold(store, slot, config)
    try:
        other = call()
        ran: list[int] = []
        expected = {"wait": SlotBusy, "skip": CallSkipped, "reject": PolicyDenied}[on_busy]
        with pytest.raises(expected) as ended:
            GuardRunner(store, config, slot=slot).run(other, "w2", ran.append)
        assert ran == [] and store.slot_holders(slot.key) == [held.call_id]
        if on_busy == "wait":  # nothing recorded: the message comes back later
            assert store.result(other.call_id) is None and ended.value.holders == (held.call_id,)
        else:  # the call's one outcome, with its event, naming the rule and the holder
            outcome = store.result(other.call_id)
            assert outcome is not None and outcome.error == expected.__name__
            assert "'one sync a shop'" in outcome.message and held.call_id in outcome.message
            assert [e.type for e in store.events(other.call_id)] == [FAILED]
            assert type(ended.value) is expected
    finally:
        release.set()
        thread.join()
    # the holder's outcome freed the slot: the next call runs
    assert store.slot_holders(slot.key) == []
    assert GuardRunner(store, config, slot=slot).run(call(), "w3", lambda attempt: "ran") == "ran"


def test_a_failed_body_frees_its_slot_and_a_duplicate_delivery_keeps_the_holders():
    store, config = MemoryStore(), GuardConfig(lease_ttl_s=5)
    slot = Slot("aaa:slot:k", 1, "reject", "r")
    held, release, thread = hold(store, slot, config)
    try:
        # a second delivery of the holder's own call: dropped (its lease is live), slot kept
        from aaa_celery.guard import Dropped

        with pytest.raises(Dropped):
            GuardRunner(store, config, slot=slot).run(held, "copy", lambda attempt: "again")
        assert store.slot_holders(slot.key) == [held.call_id]
    finally:
        release.set()
        thread.join()

    def boom(attempt: int) -> None:
        raise ValueError("no")

    with pytest.raises(ValueError):
        GuardRunner(store, config, slot=slot).run(call(), "w", boom)
    assert store.slot_holders(slot.key) == []


def test_a_holder_that_loses_its_slot_is_fenced():
    # Given a holder whose slot is taken by another call (as after a freeze past its TTL)
    store, config = MemoryStore(), GuardConfig(lease_ttl_s=1.0, heartbeat_s=0.2)
    slot = Slot("aaa:slot:k", 1, "reject", "r")
    mine, started = call(), threading.Event()

    def body(attempt: int) -> str:
        started.set()
        time.sleep(3)
        return "late"

    from aaa_celery.guard import Dropped

    def run() -> None:
        with pytest.raises(Dropped):
            GuardRunner(store, config, slot=slot).run(mine, "frozen", body)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(10)
    store.free_slot(slot.key, mine.call_id)
    assert store.take_slot(slot.key, "thief", 1, 30).reply == "taken"
    thread.join()
    # Then its next renewal finds the slot gone: the attempt is fenced, its result never recorded
    assert store.result(mine.call_id) is None
    assert [e.type for e in store.events(mine.call_id)][-1] == "aaa.tool.fenced"


def test_waits_back_off_up_to_the_lease_ttl():
    waits = [wait_s(n, 15.0) for n in range(10)]
    assert all(0.25 <= w <= 15.0 for w in waits) and max(waits[6:]) > 7.5
    assert wait_s(3, 2.0) <= 2.0


@pytest.mark.parametrize("on_busy", ["skip", "reject"])
def test_a_copy_of_a_running_call_that_finds_the_slots_full_never_ends_it(on_busy):
    """A chaos run (seed 40, 2026-12-04) showed a copy of a running call, sent with other
    arguments, recording its refusal over the call's running attempt: a refusal for want of a
    slot is recorded only for a call that no attempt has claimed."""
    from aaa_celery.guard import Dropped
    from aaa_celery.lifecycle import Claimed

    store, config = MemoryStore(), GuardConfig(lease_ttl_s=30)
    slot = Slot("aaa:slot:k", 1, on_busy, "r")
    running = call()
    assert isinstance(store.begin(running, "holder", config), Claimed)  # its attempt runs ...
    assert store.take_slot(slot.key, "other", 1, 30).reply == "taken"  # ... and its slot went to another
    with pytest.raises(Dropped):
        GuardRunner(store, config, slot=slot).run(running, "copy", lambda attempt: "again")
    assert store.result(running.call_id) is None


def test_a_store_that_cannot_take_the_slot_is_tried_for_a_lease_ttl_then_the_message_goes_back():
    """As ``begin``: a take is tried again while the store is unreachable (chaos seed 41,
    2026-12-04: a call handed back at the first failed take twice, during a store failover,
    was never registered and its message was then lost with a killed worker)."""
    from aaa_celery.errors import StoreUnavailable
    from aaa_celery.guard import HandBack

    class Flaky(MemoryStore):
        def __init__(self, failures: float) -> None:
            super().__init__()
            self.failures = failures

        def take_slot(self, *args, **kwargs):
            if self.failures > 0:
                self.failures -= 1
                raise StoreUnavailable("redis store unavailable: Connection closed by server.")
            return super().take_slot(*args, **kwargs)

    config = GuardConfig(lease_ttl_s=1.0, wait_poll_s=0.1)
    slot = Slot("aaa:slot:k", 1, "wait", "r")
    assert GuardRunner(Flaky(2), config, slot=slot).run(call(), "w", lambda attempt: "ran") == "ran"
    began = time.monotonic()
    with pytest.raises(HandBack):
        GuardRunner(Flaky(float("inf")), config, slot=slot).run(call(), "w", lambda attempt: "ran")
    assert 1.0 <= time.monotonic() - began < 5.0


@pytest.mark.parametrize("on_busy", ["wait", "skip", "reject"])
def test_a_slot_that_lapsed_before_the_claim_is_taken_again_before_the_body_runs(on_busy):
    """A slot is taken before the claim; a claim that came late (``begin`` tried again while
    the store was away, past the slot's TTL) may find the slot gone to another call. The
    attempt takes its slot again before its body runs: a lost one hands the call on
    (``wait``: the message comes back later, as attempt 2) or ends it as its rule says. No
    body ever runs beside the key's holders."""
    from aaa_celery.lifecycle import RETRIED, STARTED

    slot = Slot("aaa:slot:k", 1, on_busy, "r")

    class LateClaim(MemoryStore):
        stolen = False

        def begin(self, call, worker, config, token=None):
            if not self.stolen:  # the slot lapsed while the claim was on its way
                self.stolen = True
                self.free_slot(slot.key, call.call_id)
                assert self.take_slot(slot.key, "thief", 1, 30).reply == "taken"
            return super().begin(call, worker, config, token)

    store, config = LateClaim(), GuardConfig(lease_ttl_s=5)
    mine, ran = call(), []
    expected = {"wait": SlotBusy, "skip": CallSkipped, "reject": PolicyDenied}[on_busy]
    with pytest.raises(expected):
        GuardRunner(store, config, slot=slot).run(mine, "late", ran.append)
    assert ran == [] and store.slot_holders(slot.key) == ["thief"]
    if on_busy == "wait":
        assert store.result(mine.call_id) is None
        assert [e.type for e in store.events(mine.call_id)] == [STARTED, RETRIED]
        store.free_slot(slot.key, "thief")
        assert GuardRunner(store, config, slot=slot).run(mine, "again", lambda attempt: attempt) == 2
        assert ran == [] and store.slot_holders(slot.key) == []
    else:
        outcome = store.result(mine.call_id)
        assert outcome is not None and outcome.error == expected.__name__ and outcome.attempt == 1
        assert "thief" in outcome.message
