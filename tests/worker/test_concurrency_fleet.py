"""Issue 40's acceptance on a real fleet: 3 ``celery worker`` processes, each ``-c 2``, over
Redis (broker, store and effect ledger), with ``Concurrency(key="shop", limit=2)`` tasks
(``fleet.limited_wait``, ``fleet.limited_skip``: tests/worker/fleet_app.py).

What ran is read from the effect ledger (``start`` and ``after`` around each body, stamped
with the Redis server's clock), never from the guard's own store. One fleet serves every test
of the module (each test has keys of its own; a worker killed or frozen lives on): the
module's CI cost is about one fleet's start and stop, and its scenarios."""

from __future__ import annotations

import time
import uuid

import pytest

from aaa_celery.errors import CallSkipped
from aaa_celery.lifecycle import FENCED, SLOT_GRACE_S
from aaa_celery.testing import freeze, kill_child, wait_for

from .conftest import Fleets

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

TTL = 2.0


def most_at_once(fleet, call_ids, *, completed_only=False, killed=None):
    """The most bodies of these calls that the ledger shows running at one moment: each body
    runs from its ``start`` to its ``after`` (a body with no ``after`` counts until ``killed``
    (wall clock) if given, else until now; none at all with ``completed_only``)."""
    spans = []
    for call_id in call_ids:
        entries = fleet.ledger.entries(call_id)
        for start in (e for e in entries if e["event"] == "start"):
            end = next((e["at"] for e in entries if e["event"] == "after" and e["attempt"] == start["attempt"]
                        and e["pid"] == start["pid"]), None)
            if end is None and completed_only:
                continue
            spans.append((start["at"], end if end is not None else killed or time.time() + 3600))
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # an end before a start at one time
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most, len(spans)


@pytest.fixture(scope="module")
def shared(redis_server, tmp_path_factory):
    """The module's fleet: 3 workers, each ``-c 2``, over a Redis database of its own."""
    fleets = Fleets(redis_server.url.rsplit("/", 1)[0] + "/9", tmp_path_factory.mktemp("concurrency"))
    failed = True
    try:
        f = fleets(size=3, concurrency=2, TTL=TTL)
        yield f
        failed = False
    finally:
        fleets.stop(show_logs=failed)


def slot_key(fleet, task, shop):
    rule = fleet.client.tasks[task]._options.concurrency
    return rule.slot_key(task, None, {"shop": shop})


def test_thirty_calls_of_one_key_with_limit_2_wait_run_two_at_once_and_all_complete(shared):
    f = shared
    shop = uuid.uuid4().int % 10**6
    results = [f.client.tasks["fleet.limited_wait"].delay(shop, 0.3) for _ in range(30)]
    done = [r.get(timeout=120) for r in results]
    assert len(done) == 30 and all(d["attempt"] == 1 for d in done)
    most, bodies = most_at_once(f, [r.id for r in results])
    assert (most, bodies) == (2, 30)
    assert f.store.slot_holders(slot_key(f, "fleet.limited_wait", shop)) == []


def test_with_skip_every_call_either_runs_or_has_its_skipped_outcome(shared):
    f = shared
    shop = uuid.uuid4().int % 10**6
    results = [f.client.tasks["fleet.limited_skip"].delay(shop, 1.5) for _ in range(12)]
    ran = skipped = 0
    for r in results:
        try:
            r.get(timeout=60)
            ran += 1
        except CallSkipped as e:
            skipped += 1
            assert "fleet.limited_skip" in str(e)
            outcome = wait_for(lambda r=r: f.store.result(r.id), 10, "the skipped call's outcome")
            assert outcome.error == "CallSkipped" and "Concurrency(*: 2 at once by shop, skip)" in outcome.message
            assert f.ledger.entries(r.id, "start") == []
    assert ran >= 2 and skipped >= 1 and ran + skipped == 12
    assert most_at_once(f, [r.id for r in results])[0] <= 2


def test_kill_9_of_a_holder_frees_its_slot_within_the_ttl_and_3_s(shared):
    f = shared
    shop = uuid.uuid4().int % 10**6
    key = slot_key(f, "fleet.limited_wait", shop)
    holders = [f.client.tasks["fleet.limited_wait"].delay(shop, 8) for _ in range(2)]
    starts = [wait_for(lambda h=h: f.ledger.entries(h.id, "start"), 30, "a holder's start")[0] for h in holders]
    assert sorted(f.store.slot_holders(key)) == sorted(h.id for h in holders)
    # a third call waits (its message comes back with backoff), holding no worker process
    waiting = f.client.tasks["fleet.limited_wait"].delay(shop, 0.2)
    time.sleep(1.0)
    assert f.ledger.entries(waiting.id, "start") == []

    victim = holders[0]
    killed_at, killed_wall = time.monotonic(), time.time()
    kill_child(f.worker_of(starts[0]["pid"]), starts[0]["pid"])
    # the dead holder's slot frees within its TTL (and the slot's grace): the store stops
    # counting it, and another call (the waiting one, or the victim's next attempt) gets it
    wait_for(lambda: victim.id not in f.store.slot_holders(key) or len(f.ledger.entries(victim.id, "start")) > 1
             or f.ledger.entries(waiting.id, "start"), TTL + 3, "the dead holder's slot to free")
    freed_s = time.monotonic() - killed_at
    assert freed_s < TTL + 3, freed_s
    # every call completes (the victim in its next attempt), never more than 2 bodies at once
    assert [r.get(timeout=60)["attempt"] for r in [*holders, waiting]] == [2, 1, 1]
    assert most_at_once(f, [h.id for h in holders] + [waiting.id], killed=killed_wall)[0] <= 2
    print(f"kill -9 of a holder: its slot free {freed_s:.2f} s later (TTL {TTL} s, grace {SLOT_GRACE_S} s)")


def test_a_holder_frozen_past_its_ttl_loses_its_slot_and_is_fenced_when_thawed(shared):
    f = shared
    shop = uuid.uuid4().int % 10**6
    first = [f.client.tasks["fleet.limited_wait"].delay(shop, seconds) for seconds in (20, 3)]
    starts = [wait_for(lambda h=h: f.ledger.entries(h.id, "start"), 30, "a holder's start")[0] for h in first]
    frozen_call, frozen_start = first[0], starts[0]
    with freeze(f.worker_of(frozen_start["pid"])):
        # sent once the holder's worker is frozen: a worker about to freeze could take both (a
        # waiting call's message, sent back with a countdown, waits in the worker that receives
        # it), while a frozen one takes at most one, with the BRPOP it was frozen in
        later = [f.client.tasks["fleet.limited_wait"].delay(shop, 0.5) for _ in range(2)]
        # the slot moves on: a later call runs while the holder is frozen past its TTL
        wait_for(lambda: any(f.ledger.entries(c.id, "after") for c in later), TTL * 3 + 15,
                 "a later call to run while the holder is frozen")
        time.sleep(TTL)
    # thawed: the frozen attempt finds its lease (and slot) gone, and is fenced: it never ends
    wait_for(lambda: FENCED in [e.type for e in f.store.events(frozen_call.id)], 30, "the thawed holder's fence")
    for r in [*first, *later]:
        r.get(timeout=60)
    assert f.store.result(frozen_call.id).attempt == 2  # the call itself ran again, once
    assert not [a for a in f.ledger.entries(frozen_call.id, "after") if a["attempt"] == frozen_start["attempt"]]
    # two bodies never ran under valid leases: the completed bodies never exceed the limit
    assert most_at_once(f, [r.id for r in [*first, *later]], completed_only=True)[0] <= 2


def test_a_unique_task_on_a_beat_like_schedule_never_overlaps_and_runs_again_after_a_kill(shared):
    """``unique=True``: a tick every 2 s of a 5 s task. A tick that finds the last one running
    is skipped with its outcome; the holder killed (-9) mid-run, a later tick runs."""
    f = shared
    task = f.client.tasks["fleet.unique"]
    ticks = []

    def tick() -> None:
        ticks.append((time.time(), task.delay(0, 5)))

    for _ in range(5):  # 10 s of schedule
        tick()
        time.sleep(2)
    ran = [r for _, r in ticks if f.ledger.entries(r.id, "start")]
    assert ran, "no tick ran"
    holder = wait_for(lambda: [e for _, r in ticks for e in f.ledger.entries(r.id, "start")
                               if not f.ledger.entries(r.id, "after")], 10, "a running tick")[0]
    killed_at = time.time()
    kill_child(f.worker_of(holder["pid"]), holder["pid"])
    later = None
    deadline = time.monotonic() + 30
    while later is None and time.monotonic() < deadline:
        tick()
        time.sleep(2)
        later = next((f.ledger.entries(r.id, "start")[0] for at, r in ticks
                      if at > killed_at and f.ledger.entries(r.id, "start")), None)
    assert later is not None, "no tick ran after the holder was killed"
    print(f"unique: the first tick after kill -9 started {later['at'] - killed_at:.1f} s after it")
    # never two at once; every tick either ran or was skipped with its outcome
    ids = [r.id for _, r in ticks]
    assert most_at_once(f, ids, killed=killed_at)[0] == 1
    for _, r in ticks[:-2]:  # the last ticks may still be queued
        if not f.ledger.entries(r.id, "start"):
            outcome = wait_for(lambda r=r: f.store.result(r.id), 20, "a skipped tick's outcome")
            assert outcome.error == "CallSkipped" and "'unique'" in outcome.message
