"""Effect-side fencing (issue 13, item 5): the called system rejects a superseded attempt's write.

The helpers run against real databases (SQLite, PostgreSQL) and a real Redis; the fleet test
freezes a real worker (SIGSTOP) past its lease and wakes it after attempt 2 wrote.
"""

from __future__ import annotations

import time

import pytest
import redis
import sqlalchemy as sa

from aaa_celery.config import GuardConfig
from aaa_celery.context import ToolContext
from aaa_celery.errors import LeaseLost
from aaa_celery.fencing import RedisFence, SQLFence, StaleFence
from aaa_celery.guard import Dropped, GuardRunner
from aaa_celery.lifecycle import FENCED, STARTED
from aaa_celery.stores.memory import MemoryStore

from ..stores.test_conformance import new_call


def effects_table(meta: sa.MetaData) -> sa.Table:
    return sa.Table("effects", meta, sa.Column("key", sa.String, primary_key=True), sa.Column("attempt", sa.Integer))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'resource.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_url").replace("postgresql://", "postgresql+psycopg://", 1)
    eng = sa.create_engine(url)
    yield eng
    eng.dispose()


def write(engine, fence: SQLFence, effects: sa.Table, key: str, attempt: int) -> None:
    with engine.begin() as conn:
        fence.check(conn, key, attempt)
        conn.execute(effects.delete().where(effects.c.key == key))
        conn.execute(effects.insert().values(key=key, attempt=attempt))


def test_sql_fence_takes_the_newer_attempt_and_rejects_the_stale_one_with_its_whole_transaction(engine):
    fence, meta = SQLFence(), sa.MetaData()
    effects = effects_table(meta)
    fence.create(engine)
    meta.create_all(engine)
    write(engine, fence, effects, "order-7", 1)
    write(engine, fence, effects, "order-7", 2)
    write(engine, fence, effects, "order-7", 2)  # the same attempt again is fine
    with pytest.raises(StaleFence) as stale:
        write(engine, fence, effects, "order-7", 1)
    assert (stale.value.fence, stale.value.highest) == (1, 2)
    with engine.connect() as conn:
        assert conn.execute(sa.select(effects.c.attempt)).scalars().all() == [2]
    write(engine, fence, effects, "order-8", 1)  # keys are fenced apart


def test_redis_fence_runs_the_command_only_for_a_fence_at_least_the_highest(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        fence = RedisFence(client)
        assert fence.execute("order-7", 2, "SET", "order:7", "attempt-2", keys=["order:7"]) == "OK"
        with pytest.raises(StaleFence) as stale:
            fence.execute("order-7", 1, "SET", "order:7", "attempt-1", keys=["order:7"])
        assert stale.value.highest == 2
        assert client.get("order:7") == "attempt-2"
        assert fence.execute("order-7", 3, "SET", "order:7", "attempt-3", keys=["order:7"]) == "OK"
    finally:
        client.close()


def test_check_lease_refuses_an_effect_the_lease_cannot_cover_and_the_attempt_ends_fenced():
    """``ctx.check_lease(min_s=...)`` raises before the effect once the lease cannot be
    proved; the attempt then ends as a lost lease does (no result, ``aaa.tool.fenced``)."""
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    cfg = GuardConfig(lease_ttl_s=2.0)
    call = new_call()
    effects: list[int] = []

    def body(attempt: int) -> None:
        ctx = ToolContext(engine=None, run_id="r", call_id=call.call_id, attempt=attempt, fence=attempt)
        assert 0 < ctx.lease_remaining_s <= 2.0
        ctx.check_lease(min_s=1.0)  # fine: just claimed
        with pytest.raises(ValueError, match="min_s"):
            ctx.check_lease(min_s=5.0)
        now[0] += 10  # the lease lapses on the store's clock
        ctx.check_lease(min_s=2.0)  # needs a renewal now, and the store says the lease is gone
        effects.append(attempt)  # never reached

    with pytest.raises(Dropped):
        GuardRunner(store, cfg).run(call, "w", body)
    assert effects == []
    assert [e.type for e in store.events(call.call_id)] == [STARTED, FENCED]
    with pytest.raises(LeaseLost):
        raise LeaseLost("the type is public in aaa_celery.errors")


def test_a_checkpoint_saved_with_a_renewal_is_read_by_the_next_attempt():
    store = MemoryStore()
    cfg = GuardConfig(lease_ttl_s=0.6)  # renewals every 0.2 s
    call = new_call()
    seen: list[object] = []

    def crashing(attempt: int) -> None:
        ctx = ToolContext(engine=None, run_id="r", call_id=call.call_id, attempt=attempt)
        seen.append(ctx.last_checkpoint)
        ctx.checkpoint({"done": 3})
        time.sleep(0.5)  # a renewal writes it
        with pytest.raises(ValueError, match="at most"):
            ctx.checkpoint("x" * 70_000)
        raise RuntimeError("crash")  # stands for a lost worker below: the lease is released

    claimed = store.begin(call, "w1", cfg)
    store.release(claimed.lease)  # attempt 1 lost; now run attempt 2 for real
    runner = GuardRunner(store, cfg.model_copy(update={"max_attempts": 5}))
    with pytest.raises(RuntimeError):
        runner.run(call, "w2", crashing)
    assert seen == [None]
    assert store.last_checkpoint(call.call_id).data == {"done": 3}
    assert store.last_checkpoint(call.call_id).attempt == 2
    assert ToolContext.direct().last_checkpoint is None
    assert ToolContext.direct().lease_remaining_s == float("inf")
    ToolContext.direct().check_lease(10)  # unguarded: nothing to check
