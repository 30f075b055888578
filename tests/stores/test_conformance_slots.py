"""The store conformance suite, concurrency slots: ``Store.take_slot`` / ``free_slot`` /
``slot_holders`` (lifecycle.plan_slot) on every backend (issue 40).

A concurrency key has ``limit`` slots; a call holds one from the claim of its attempt to its
result, renewing it with its lease, and a holder that stops renewing loses it once its slot
lapses (its lease TTL and ``lifecycle.SLOT_GRACE_S``)."""

from __future__ import annotations

import threading
import time
import uuid

from aaa_celery.lifecycle import SLOT_GRACE_S, plan_slot


def slot() -> str:
    return f"aaa:slot:{uuid.uuid4().hex}"


def test_a_key_admits_limit_holders_and_a_holder_keeps_its_slot(store_factory):
    a, b = store_factory(), store_factory()
    key = slot()
    # Given limit 2, When three calls take a slot, Then the third finds them full and who holds them
    assert a.take_slot(key, "c1", 2, 30).reply == "taken"
    assert b.take_slot(key, "c2", 2, 30).reply == "taken"
    full = a.take_slot(key, "c3", 2, 30)
    assert full.reply == "full" and full.holders == ("c1", "c2") and full.put is None
    # a holder taking again (another delivery of it, or its renewal) keeps its slot
    assert b.take_slot(key, "c1", 2, 30).reply == "held"
    assert sorted(a.slot_holders(key)) == ["c1", "c2"]
    # freed: another call takes it; freeing what one does not hold changes nothing
    b.free_slot(key, "c1")
    a.free_slot(key, "nobody")
    assert a.take_slot(key, "c3", 2, 30).reply == "taken"
    assert b.slot_holders(key) == ["c2", "c3"]
    # other keys are independent
    assert a.take_slot(slot(), "c4", 1, 30).reply == "taken"


def test_a_slot_lapses_when_its_holder_stops_renewing(store_factory):
    a, b = store_factory(), store_factory()
    key, ttl = slot(), 0.5
    assert a.take_slot(key, "dead", 1, ttl).reply == "taken"
    assert b.take_slot(key, "next", 1, ttl).reply == "full"
    # the holder renews within its TTL: it keeps the slot past one TTL
    time.sleep(ttl)
    assert a.take_slot(key, "dead", 1, ttl).reply == "held"
    # it stops renewing: the slot lapses after the TTL and the grace, and the next call gets it
    time.sleep(ttl + SLOT_GRACE_S + 0.3)
    assert b.slot_holders(key) == []
    taken = b.take_slot(key, "next", 1, ttl)
    assert taken.reply == "taken" and taken.drop == ("dead",)
    assert a.slot_holders(key) == ["next"]


def test_concurrent_takes_never_exceed_the_limit(store_factory):
    key, limit = slot(), 3
    stores = [store_factory() for _ in range(4)]
    got: list[str] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        for i in range(5):
            call = f"call-{n}-{i}"
            if stores[n].take_slot(key, call, limit, 30).reply == "taken":
                with lock:
                    got.append(call)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == limit and sorted(stores[0].slot_holders(key)) == sorted(got)


def test_plan_slot_is_the_rule():
    # the pure rule every store applies: lapsed holders drop, a holder stays over any limit
    now = 1000.0
    plan = plan_slot({"old": now, "live": now + 5}, "me", 1, 10, now)
    assert plan.reply == "full" and plan.drop == ("old",) and plan.holders == ("live",)
    assert plan_slot({"me": now + 1, "live": now + 5}, "me", 1, 10, now).reply == "held"
    taken = plan_slot({}, "me", 1, 10, now)
    assert taken.reply == "taken" and taken.put == now + 10 + SLOT_GRACE_S
