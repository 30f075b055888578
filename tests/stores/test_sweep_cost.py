"""The recovery sweep's reads grow with the lapsed calls, not with every leased call
(issue 23 item 4): ten times the live leases, with the same lapsed ones, must not make
``expired()`` read more. Counted on the server (commands and bytes sent; rows examined),
never timed. ``benchmarks/sweep.py`` measures the same at 100k leased."""

from __future__ import annotations

import time

import pytest

from aaa_celery.stores.redis import RedisStore

from .test_conformance import SHORT_TTL_S, claim, config, new_call

LAPSED = 10
FEW, MANY = 50, 500
NEVER = 1e12  # the sweep's grace for listing lapsed calls only (worker/recovery.py)


def redis_reads(url: str, store: RedisStore) -> tuple[set[str], int, int]:
    """The lapsed calls ``expired()`` lists, and the commands and reply bytes it cost the server."""
    import redis

    probe = redis.Redis.from_url(url)
    try:
        def counters() -> tuple[int, int]:
            stats = probe.info("commandstats")
            # not INFO itself, nor a connection's handshake: the store's pool may open one more
            # connection for either read (after another test used the server, it did for the first)
            calls = sum(int(v["calls"]) for k, v in stats.items()
                        if k not in ("cmdstat_info", "cmdstat_hello") and not k.startswith("cmdstat_client|"))
            return calls, int(probe.info("stats")["total_net_output_bytes"])

        before = counters()
        found = {c.call_id for c in store.expired(unclaimed_grace_s=NEVER)}
        after = counters()
    finally:
        probe.close()
    # INFO's own replies are in the byte count: two reads each side, the same size give or take digits
    return found, after[0] - before[0], after[1] - before[1]


@pytest.fixture
def own_redis_url():
    """A redis-server of this test's own: its command counters are server-wide, and a store
    an earlier test left open on the shared server (a renewal, a script load) adds commands."""
    from tests.servers import RedisServer

    server = RedisServer.start(appendonly=False)
    try:
        yield server.url
    finally:
        server.stop()


def test_redis_sweep_reads_the_same_with_ten_times_the_live_leases(own_redis_url):
    redis_url = own_redis_url
    # Given LAPSED calls whose leases lapsed, and FEW live leases
    store = RedisStore(redis_url)
    try:
        lapsed = [claim(store, new_call(), "worker-dead", config(lease_ttl_s=SHORT_TTL_S)).lease.call_id
                  for _ in range(LAPSED)]
        for _ in range(FEW):
            claim(store, new_call(), "worker-live", config())
        time.sleep(SHORT_TTL_S * 2)
        found_few, cmds_few, bytes_few = redis_reads(redis_url, store)

        # When ten times as many leases are live
        for _ in range(MANY - FEW):
            claim(store, new_call(), "worker-live", config())
        found_many, cmds_many, bytes_many = redis_reads(redis_url, store)
    finally:
        store.close()

    # Then the sweep lists the same lapsed calls, with the same commands and reply bytes
    assert found_few == found_many == set(lapsed)
    assert cmds_many == cmds_few
    assert bytes_many <= bytes_few + 200, (bytes_few, bytes_many)


def postgres_rows_examined(url: str, grace_s: float = NEVER) -> tuple[set[str], int]:
    """The lapsed calls a fresh store's ``expired()`` lists (with ``grace_s``), and the
    ``aaa_calls`` rows the server examined for it (sequential and index tuples; the store is
    closed first, which flushes its sessions' counters)."""
    import psycopg

    from aaa_celery.stores.sql.postgres import PostgresStore
    from tests.servers import libpq_url

    def examined() -> int:
        with psycopg.connect(libpq_url(url), autocommit=True) as con:
            row = con.execute("SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
                              " FROM pg_stat_user_tables WHERE relname = 'aaa_calls'").fetchone()
        return int(row[0])

    # At a test's few hundred rows a sequential scan is the planner's cheapest plan whatever the
    # query; with it off, the rows counted are those the query's own ranges reach, as the
    # planner takes them on a table of many leases (benchmarks/sweep.py, from 1k leased).
    sweeper = PostgresStore(url, connect_args={"options": "-c enable_seqscan=off"})
    before = examined()
    try:
        found = {c.call_id for c in sweeper.expired(unclaimed_grace_s=grace_s)}
    finally:
        sweeper.close()
    time.sleep(0.5)  # the closed sessions' counters reach the statistics
    return found, examined() - before


def test_postgres_sweep_reads_the_same_with_ten_times_the_live_leases(postgres_url):
    from aaa_celery.stores.sql.postgres import PostgresStore

    # Given LAPSED calls whose lease session ended more than their lease TTL ago, and FEW live leases
    lost = PostgresStore(postgres_url)
    lapsed = {claim(lost, new_call(), "worker-dead", config(lease_ttl_s=SHORT_TTL_S)).lease.call_id
              for _ in range(LAPSED)}
    lost.close()
    live = PostgresStore(postgres_url)
    try:
        for _ in range(FEW):
            claim(live, new_call(), "worker-live", config())
        time.sleep(SHORT_TTL_S * 2)
        found_few, rows_few = postgres_rows_examined(postgres_url)

        # When ten times as many leases are live
        for _ in range(MANY - FEW):
            claim(live, new_call(), "worker-live", config())
        found_many, rows_many = postgres_rows_examined(postgres_url)
        # ... and a real sweep's grace, which lists the calls nobody claimed for a while
        found_grace, rows_grace = postgres_rows_examined(postgres_url, grace_s=0.0)
    finally:
        live.close()

    # Then the sweep lists the same lapsed calls, and examines no more rows
    assert found_few == found_many == found_grace == lapsed
    assert rows_many <= rows_few + 2 * LAPSED, (rows_few, rows_many)
    assert rows_grace <= rows_few + 2 * LAPSED, (rows_few, rows_grace)


def test_postgres_sweep_reads_the_same_with_ten_times_the_finished_calls(postgres_url):
    """Finished calls are kept until ``aaa purge``; every worker sweeps every few seconds, so a
    sweep that read each finished row cost more the longer the fleet ran (a finish used to
    leave the row without a sweep hint, which reads as lapsed: ``lifecycle.FINISHED_HINT``).
    Both finish paths count: the server-side function and the two-round-trip transaction
    (a call this process did not claim, as after a redelivery to another worker)."""
    from aaa_celery.lifecycle import Outcome
    from aaa_celery.stores.sql.postgres import PostgresStore

    def finish_calls(n: int) -> None:
        for i in range(n):
            lease = claim(worker, new_call(), "worker-live", config()).lease
            if i % 2:
                worker._recall(lease.call_id)  # noqa: SLF001 - its finish plans from the row
            assert worker.finish(lease, Outcome.success(i), config()).__class__.__name__ == "Accepted"

    # Given LAPSED calls whose lease session ended, and FEW finished calls
    lost = PostgresStore(postgres_url)
    lapsed = {claim(lost, new_call(), "worker-dead", config(lease_ttl_s=SHORT_TTL_S)).lease.call_id
              for _ in range(LAPSED)}
    lost.close()
    worker = PostgresStore(postgres_url)
    try:
        finish_calls(FEW)
        time.sleep(SHORT_TTL_S * 2)
        found_few, rows_few = postgres_rows_examined(postgres_url)

        # When ten times as many calls have finished
        finish_calls(MANY - FEW)
        found_many, rows_many = postgres_rows_examined(postgres_url)
    finally:
        worker.close()

    # Then the sweep lists the same lapsed calls, and examines no more rows
    assert found_few == found_many == lapsed
    assert rows_many <= rows_few + 2 * LAPSED, (rows_few, rows_many)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_every_sql_finish_path_marks_the_row_finished_and_a_release_does_not(request, backend, tmp_path):
    """``lifecycle.FINISHED_HINT`` on each path that records a result (PostgreSQL: its
    server-side function, its transaction, an operator's ``record``); a lease given up
    without a result keeps no expiry, so the sweep lists it at once."""
    import sqlalchemy as sa

    from aaa_celery.lifecycle import FINISHED_HINT, Outcome
    from aaa_celery.stores import open_store

    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as store:
        fast = claim(store, new_call(), "w1", config()).lease
        slow = claim(store, new_call(), "w1", config()).lease
        getattr(store, "_recall", lambda _: None)(slow.call_id)  # PostgreSQL: plans its finish from the row
        released = claim(store, new_call(), "w1", config()).lease
        recorded = new_call()
        store.register(recorded)
        for lease in (fast, slow):
            store.finish(lease, Outcome.success(1), config())
        store.release(released)
        assert store.record(recorded, Outcome.success(2))
        with store.engine.connect() as conn:  # type: ignore[attr-defined]
            hint = {c: conn.execute(sa.text("SELECT lease_expires_at FROM aaa_calls WHERE call_id = :c"),
                                    {"c": c}).scalar_one()
                    for c in (fast.call_id, slow.call_id, released.call_id, recorded.call_id)}
        assert hint == {fast.call_id: FINISHED_HINT, slow.call_id: FINISHED_HINT, released.call_id: None,
                        recorded.call_id: FINISHED_HINT}
        assert [c.call_id for c in store.expired(unclaimed_grace_s=NEVER)] == [released.call_id]


def rows_fetched(store, fn):
    """``fn()``'s value, and how many rows the store's statements returned to it meanwhile."""
    from sqlalchemy import event

    fetched = [0]

    def count(conn, cursor, statement, parameters, context, executemany):
        if cursor.description is not None:  # a statement that returns rows
            fetched[0] += max(cursor.rowcount, 0)

    event.listen(store.engine, "after_cursor_execute", count)
    try:
        return fn(), fetched[0]
    finally:
        event.remove(store.engine, "after_cursor_execute", count)


def test_postgres_claim_recovery_reads_no_more_with_ten_times_the_live_leases(postgres_url):
    """A sweep claims each lapsed call (claim_recovery) every time it sees it: that check of the
    one call's lease must not read every lease the server holds."""
    from aaa_celery.stores.sql.postgres import PostgresStore

    # Given lapsed calls (their lease session ended), live leases, and a sweeper's store
    lost = PostgresStore(postgres_url)
    lapsed = [claim(lost, new_call(), "worker-dead", config()).lease.call_id for _ in range(2)]
    lost.close()
    live, sweeper = PostgresStore(postgres_url), PostgresStore(postgres_url)
    try:
        held = [claim(live, new_call(), "worker-live", config()).lease.call_id for _ in range(FEW)]
        tries_few, rows_few = rows_fetched(sweeper, lambda: sweeper.claim_recovery(lapsed[0], "sweeper", 30.0))

        # When ten times as many leases are live
        for _ in range(MANY - FEW):
            claim(live, new_call(), "worker-live", config())
        tries_many, rows_many = rows_fetched(sweeper, lambda: sweeper.claim_recovery(lapsed[1], "sweeper", 30.0))

        # Then each lapsed call is claimed, a live one is not, and the claim reads as many rows
        assert (tries_few, tries_many) == (1, 1)
        assert sweeper.claim_recovery(held[0], "sweeper", 30.0) == 0
        assert rows_many <= rows_few, (rows_few, rows_many)
    finally:
        sweeper.close()
        live.close()


def hint_of(url: str, call_id: str) -> float | None:
    """The sweep hint (``lease_expires_at``) of a call's row."""
    import psycopg

    from tests.servers import libpq_url

    with psycopg.connect(libpq_url(url), autocommit=True) as con:
        row = con.execute("SELECT lease_expires_at FROM aaa_calls WHERE call_id = %s", (call_id,)).fetchone()
    return None if row is None else row[0]


def test_postgres_sweep_asks_the_lock_of_every_call_whose_hint_lapsed(postgres_url):
    """The hint only says when to look: a holder past its hint that still holds the lock (frozen,
    or a 0.1.0 worker, whose rows have no hint) is live; a dead session's call is listed once
    its hint lapsed, and a row without a hint (0.1.0's) at once; a renewal moves the hint on."""
    import psycopg

    from aaa_celery.stores.sql.postgres import PostgresStore
    from tests.servers import libpq_url

    holder, lost, sweeper = PostgresStore(postgres_url), PostgresStore(postgres_url), PostgresStore(postgres_url)
    try:
        short = config(lease_ttl_s=SHORT_TTL_S)
        frozen = claim(holder, new_call(), "worker-frozen", short).lease  # never renewed
        renewed = claim(holder, new_call(), "worker-live", short).lease
        old_live = claim(holder, new_call(), "worker-0.1.0", config()).lease
        dead = claim(lost, new_call(), "worker-dead", config()).lease  # hint a lease TTL ahead
        old_dead = claim(lost, new_call(), "worker-0.1.0-dead", config()).lease
        with psycopg.connect(libpq_url(postgres_url), autocommit=True) as con:  # as 0.1.0 claims: no hint
            con.execute("UPDATE aaa_calls SET lease_expires_at = NULL WHERE call_id = ANY(%s)",
                        ([old_live.call_id, old_dead.call_id],))
        lost.close()
        time.sleep(SHORT_TTL_S * 2)
        before = hint_of(postgres_url, renewed.call_id)
        assert holder.renew(renewed)
        assert before is not None and hint_of(postgres_url, renewed.call_id) > before + SHORT_TTL_S

        listed = {c.call_id for c in sweeper.expired(unclaimed_grace_s=NEVER)}
        assert listed == {old_dead.call_id}, listed  # the dead session's hint is a lease TTL ahead

        # the dead session's call is listed once its hint lapsed
        later = sweeper.now() + config().lease_ttl_s + 1.0
        listed = {c.call_id for c in sweeper.expired(now=later, unclaimed_grace_s=NEVER)}
        assert listed == {old_dead.call_id, dead.call_id}, listed
        assert frozen.call_id not in listed and old_live.call_id not in listed
    finally:
        for store in (sweeper, holder, lost):
            store.close()


def test_postgres_renewal_never_waits_on_a_locked_row_and_leaves_the_session_durable(postgres_url):
    """The renewal runs on the lease session, which holds every lease of the process: a row
    another transaction has locked keeps its hint this time, and the answer comes at once; the
    hint's commit does not wait for the WAL flush, and the session's own setting stays on."""
    import psycopg

    from aaa_celery.stores.sql.postgres import PostgresStore
    from tests.servers import libpq_url

    holder = PostgresStore(postgres_url)
    try:
        lease = claim(holder, new_call(), "worker-live", config()).lease
        first = hint_of(postgres_url, lease.call_id)
        with psycopg.connect(libpq_url(postgres_url)) as other:  # a transaction holding the row
            other.execute("SELECT 1 FROM aaa_calls WHERE call_id = %s FOR UPDATE", (lease.call_id,))
            t0 = time.monotonic()
            assert holder.renew(lease)
            assert time.monotonic() - t0 < 5.0  # not blocked until the other transaction ends
            assert hint_of(postgres_url, lease.call_id) == first
        session = holder._sessions.sessions[0].conn  # type: ignore[attr-defined]
        session.exec_driver_sql("SET synchronous_commit = on")  # the tests' server runs with it off
        time.sleep(0.01)
        assert holder.renew(lease)
        assert hint_of(postgres_url, lease.call_id) > first
        assert session.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "on"
    finally:
        holder.close()
