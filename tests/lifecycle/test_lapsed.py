"""lifecycle.lapsed, "has the lease lapsed", and every form a store evaluates it in.

One table of cases (a lease's expiry against the clock) runs against the lifecycle function,
the memory and SQLite stores on an injected clock, the SQL clauses on SQLite and PostgreSQL,
and the Redis lease key and recovery index on a real server, so the forms cannot drift.
A PostgreSQL lease is bound to a session and has no expiry: it lapses with its session (its
row's sweep hint is judged by the rule, only to pick the locks a sweep asks), and
a table of how a lease ends runs against that store's three forms of the question.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from aaa_celery.config import GuardConfig
from aaa_celery.lifecycle import CallSpec, Claimed, Lease, lapsed, lease_left, sweep_hint
from aaa_celery.stores import open_store
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.stores.redis.client import lua
from aaa_celery.stores.sql.queries import lapsed_at, live_at

from ..stores.test_property import Clock

#: (seconds from the lease's expiry to now, lapsed?): a lease lapses at its expiry, not after.
CASES = [(-1000.0, False), (-1.0, False), (-0.001, False), (0.0, True), (0.001, True), (1.0, True)]
TTL = 10.0


def test_the_rule():
    for after, want in CASES:
        assert lapsed(100.0, 100.0 + after) is want, after
        assert lease_left(100.0, 100.0 + after) == pytest.approx(0.0 if want else -after)
    assert lapsed(None, 0.0) and lease_left(None, 0.0) == 0.0  # no expiry recorded: no TTL lease


def test_the_sweep_hint():
    """A TTL lease's row keeps its expiry; a session lease's (no expiry) the hint ``now + ttl_s``,
    judged by the same rule (and SQL image, ``lapsed_at``) to pick the locks a sweep asks."""
    assert sweep_hint(Lease("c", 1, "w", "t", TTL, 123.0), 100.0) == 123.0
    hint = sweep_hint(Lease("c", 1, "w", "t", TTL), 100.0)
    assert hint == 100.0 + TTL
    for after, want in CASES:
        assert lapsed(hint, hint + after) is want, after


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_memory_and_sqlite_judge_a_lease_by_the_rule(url: str, tmp_path: Any) -> None:
    for after, want in CASES:
        clock = Clock()
        store = (MemoryStore(clock=clock) if url == "memory://"
                 else open_store(f"sqlite:///{tmp_path / f'{after}.sqlite3'}", clock=clock))
        try:
            got = store.begin(CallSpec("c"), "w", GuardConfig(lease_ttl_s=TTL))
            assert isinstance(got, Claimed) and got.lease.expires_at == clock.t + TTL
            clock.t = got.lease.expires_at + after
            (row,) = list(store.calls())
            assert (row.holder is None) is want, (url, after)  # the store's own reading
            assert (store.renew(got.lease) is False) is want, (url, after)  # SQLite: the WHERE clause
        finally:
            store.close()


def _sql_forms(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        for after, want in [*CASES, (None, True)]:
            expires = sa.literal(None if after is None else 100.0, sa.Double)
            now = 100.0 + (after or 0.0)
            live, gone = conn.execute(sa.select(live_at(expires, now), lapsed_at(expires, now))).one()
            assert (not live) is want and bool(gone) is want, (engine.dialect.name, after, live, gone)


def test_the_sql_clauses_on_sqlite() -> None:
    _sql_forms(sa.create_engine("sqlite://"))


@pytest.mark.postgres
def test_the_sql_clauses_on_postgresql(postgres_url: str) -> None:
    engine = sa.create_engine(sa.make_url(postgres_url).set(drivername="postgresql+psycopg"))
    try:
        _sql_forms(engine)
    finally:
        engine.dispose()


#: In one script on a real server: a lease set to lapse ``ARGV[2]`` ms from the server's now
#: (``lease_until``), then whether its key lives, and whether the recovery index lists it.
_PROBE = """
local now = clock()
redis.call('DEL', LEASE, RUNNING)
redis.call('HSET', LEASE, 'token', 't')
local expires = now + tonumber(ARGV[2])
lease_until(expires)
redis.call('ZADD', RUNNING, expires, CALL)
local listed = #redis.call('ZRANGEBYSCORE', RUNNING, '-inf', now)
return {redis.call('EXISTS', LEASE), listed}
"""


@pytest.mark.redis
def test_the_redis_lease_key_and_recovery_index(redis_url: str) -> None:
    store = open_store(redis_url)
    try:
        script = store._redis.register_script(lua("_lib") + _PROBE)  # type: ignore[attr-defined]
        keys = [store.key("c", k) for k in ("spec", "attempts", "result", "lease", "events")]  # type: ignore[attr-defined]
        keys += store.index_keys(store.shard("c"))  # type: ignore[attr-defined]
        # The server's clock moves on within the script: only cases whose answer it cannot
        # change are run (the lease 1 ms ahead of now may be reached before it is read).
        for after, want in [(-1000.0, False), (0.0, True), (0.001, True), (1.0, True)]:
            exists, listed = script(keys=keys, args=["c", round(-after * 1000)])
            assert (exists == 0) is want and (listed == 1) is want, (after, exists, listed)
    finally:
        store.close()


#: How a PostgreSQL lease (a session's advisory lock, no expiry) ends, and whether it lapsed.
SESSION_CASES = [("held", False), ("released", True), ("session terminated", True)]


@pytest.mark.postgres
@pytest.mark.parametrize("how, want", SESSION_CASES)
def test_the_postgresql_session_forms(postgres_url: str, how: str, want: bool) -> None:
    """Its three forms: the lock scan of ``_live`` (another store's ``calls()``), the holding
    store's own check (``RENEW_OWN_LEASE``) and another store's look-up by the holder's pid
    (``LEASE_STILL_HELD``), each read through ``renew``."""
    from ..stores.conftest import lose_lease

    holder, other = open_store(postgres_url), open_store(postgres_url)
    try:
        call = CallSpec(f"pg-lapsed-{how.replace(' ', '-')}")
        got = holder.begin(call, "w", GuardConfig(lease_ttl_s=TTL))
        assert isinstance(got, Claimed)
        if how == "released":
            holder.release(got.lease)
        elif how == "session terminated":
            lose_lease(holder, got.lease)
        (row,) = [r for r in other.calls() if r.call_id == call.call_id]
        assert (row.holder is None) is want
        assert (not other.renew(got.lease)) is want
        assert (not holder.renew(got.lease)) is want
    finally:
        holder.close()
        other.close()
