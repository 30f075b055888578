"""SQLiteStore: TTL leases like memory/redis, shared by the processes of one machine.

The race test runs real processes on one database file; the differential test drives
SQLiteStore and MemoryStore (the reference) through the same random history on one
injected clock and requires the same answers, step by step."""

from __future__ import annotations

import multiprocessing
import random
import sqlite3
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.errors import StoreUnavailable
from aaa_celery.lifecycle import (
    COMPLETED,
    STARTED,
    Accepted,
    Busy,
    CallSpec,
    Claimed,
    Event,
    Finished,
    Outcome,
    Refused,
)
from aaa_celery.stores import open_store
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.stores.sql.sqlite import SQLiteStore

N_CALLS = 50
N_PROCESSES = 4


def _race(url: str, worker: str, seed: int, start, failures) -> None:
    """One worker process: take calls at random until every call has a result; hold
    each claim a moment, and lose (release) about a third so that calls need several."""
    try:
        store = SQLiteStore(url)
        cfg = GuardConfig(max_attempts=1_000, lease_ttl_s=60)
        rng = random.Random(seed)
        pending = [f"call-{i}" for i in range(N_CALLS)]
        start.wait()
        while pending:
            call_id = rng.choice(pending)
            got = store.begin(CallSpec(call_id, request={"task": "t"}), worker, cfg)
            if isinstance(got, Claimed):
                time.sleep(rng.random() / 1000)
            if isinstance(got, Claimed) and rng.random() < 0.3:
                store.release(got.lease)
            elif isinstance(got, Claimed):
                finished = store.finish(got.lease, Outcome.success(worker), cfg)
                assert isinstance(finished, Accepted), finished
            elif isinstance(got, (Finished, Refused)):
                pending.remove(call_id)
        store.close()
    except BaseException as e:  # report to the parent, which asserts
        failures.put(f"{worker}: {e!r}")
        raise


def test_four_processes_racing_on_50_calls_record_one_result_each_with_contiguous_attempts(tmp_path):
    # Given one database file, created before the workers start
    url = f"sqlite:///{tmp_path / 'race.sqlite3'}"
    SQLiteStore(url).close()
    ctx = multiprocessing.get_context("fork")
    failures, start = ctx.Queue(), ctx.Barrier(N_PROCESSES)
    # When four processes race begin/finish/release on the same 50 calls
    procs = [ctx.Process(target=_race, args=(url, f"w{i}", i, start, failures)) for i in range(N_PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert failures.empty(), failures.get()
    assert [p.exitcode for p in procs] == [0] * N_PROCESSES
    # Then every call has exactly one result, from its last attempt, and attempts 1..n
    store = SQLiteStore(url)
    with store.engine.connect() as conn:
        per_call = Counter(conn.execute(sa.text("SELECT call_id FROM aaa_results")).scalars())
    assert per_call == Counter({f"call-{i}": 1 for i in range(N_CALLS)})
    for i in range(N_CALLS):
        trail = store.events(f"call-{i}")
        started = [e.attempt for e in trail if e.type == STARTED]
        assert started == list(range(1, len(started) + 1)), (i, started)
        assert [e.attempt for e in trail if e.type == COMPLETED] == [started[-1]]
        assert store.result(f"call-{i}").attempt == started[-1]
    store.close()


def test_every_connection_runs_in_wal_mode_with_a_busy_timeout(tmp_path):
    store = SQLiteStore(f"sqlite:///{tmp_path / 'wal.sqlite3'}", busy_timeout_s=7)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7000
    store.close()


def test_a_writer_that_cannot_get_the_lock_raises_store_unavailable(tmp_path):
    # Given another process's connection holds the write lock
    path = tmp_path / "locked.sqlite3"
    store = SQLiteStore(f"sqlite:///{path}", busy_timeout_s=0.1)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        # Then a write fails past busy_timeout as StoreUnavailable, with the driver's cause
        with pytest.raises(StoreUnavailable) as info:
            store.begin(CallSpec("c"), "w", GuardConfig())
        assert isinstance(info.value.__cause__, sa.exc.OperationalError)
        assert store.result("c") is None  # WAL: readers are not blocked by the writer
    finally:
        other.execute("ROLLBACK")
        other.close()
        store.close()


def test_lease_lapses_after_its_ttl_on_the_store_clock():
    now = [0.0]
    store = open_store("sqlite://", clock=lambda: now[0])
    call, cfg = CallSpec("c"), GuardConfig(lease_ttl_s=10)
    lease = store.begin(call, "A", cfg).lease
    now[0] = 9.0
    assert store.begin(call, "B", cfg) == Busy("A", 10.0)
    assert store.renew(lease)  # now expires at 19
    now[0] = 19.5
    assert not store.renew(lease)
    assert store.begin(call, "B", cfg).attempt == 2


def _shape(answer):
    """An answer with the parts a store may choose freely (tokens) left out."""
    if isinstance(answer, Claimed):
        lease = answer.lease
        return ("claimed", lease.call_id, lease.attempt, lease.worker, lease.ttl_s, lease.expires_at)
    if isinstance(answer, list):
        return [_shape(a) for a in answer]
    if isinstance(answer, Event):
        return (answer.id, answer.type, answer.call_id, answer.attempt, answer.data, answer.at)
    if isinstance(answer, CallSpec):
        return answer.call_id
    return answer


@pytest.mark.parametrize("url", ["sqlite://", "file"])
def test_random_histories_answer_exactly_like_the_memory_store(url, tmp_path):
    url = f"sqlite:///{tmp_path / 'diff.sqlite3'}" if url == "file" else url
    now = [1_000.0]
    stores = [MemoryStore(clock=lambda: now[0]), SQLiteStore(url, clock=lambda: now[0])]
    leases: list[list] = [[], []]
    rng = random.Random(7)
    ops = ["begin", "begin", "finish", "release", "fenced", "renew", "tick", "expired", "register", "claim"]
    for step in range(1_500):
        op, call_id, pick = rng.choice(ops), f"c{rng.randrange(6)}", rng.randrange(100)
        if op == "tick":
            now[0] += rng.choice([1, 5, 11])
            continue
        delivery, fence = rng.choice(list(Delivery)), rng.random() < 0.8
        cfg = GuardConfig(delivery=delivery, max_attempts=3, lease_ttl_s=10, fence_results=fence)
        spec = CallSpec(call_id, "tool", "key", {"task": "t"} if rng.random() < 0.5 else {})
        outcome = Outcome.success({"v": pick}) if pick % 2 else Outcome.failure("ToolError", "no")
        answers = []
        for store, held in zip(stores, leases):
            if op == "begin":
                answer = store.begin(spec, f"w{pick % 3}", cfg)
                if isinstance(answer, Claimed):
                    held.append(answer.lease)
            elif op == "expired":
                answer = store.expired(unclaimed_grace_s=3)
            elif op == "register":
                answer = store.register(spec)
            elif op == "claim":
                answer = store.claim_recovery(call_id, "w", 5)
            elif not held:
                answer = None
            else:
                lease = held[pick % len(held)]
                if op == "finish":
                    answer = store.finish(lease, outcome, cfg)
                elif op == "renew":
                    answer = store.renew(lease)
                else:
                    answer = getattr(store, op)(lease)
            answers.append(_shape(answer))
        assert answers[0] == answers[1], (step, op)
    for i in range(6):
        assert _shape(stores[0].events(f"c{i}")) == _shape(stores[1].events(f"c{i}"))
        assert stores[0].result(f"c{i}") == stores[1].result(f"c{i}")
    stores[1].close()
