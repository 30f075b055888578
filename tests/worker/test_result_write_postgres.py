"""Celery's result in the PostgreSQL store's own database (Celery's database backend,
``db+postgresql://``), on real workers: ``finish`` writes Celery's result row in the
transaction that records the guard's result, so the two are one commit and never disagree
(``aaa_celery/worker/results.py``, ``ResultRow``). A backend on another database is written
by Celery, after ``finish``, as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from aaa_celery.testing import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.fleet]


@pytest.fixture
def db(postgres_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(postgres_url)
    yield engine
    engine.dispose()


def xmin(db: sa.Engine, table: str, column: str, key: str) -> str | None:
    """The id of the transaction that wrote the row of ``key`` (None: no row, or no table yet)."""
    with db.connect() as conn:
        if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
            return None
        got = conn.execute(sa.text(f"SELECT xmin::text FROM {table} WHERE {column} = :key"), {"key": key}).scalar()
    return got  # type: ignore[no-any-return]


def row(db: sa.Engine, task_id: str) -> dict[str, Any]:
    with db.connect() as conn:
        got = conn.execute(sa.text("SELECT * FROM celery_taskmeta WHERE task_id = :id"), {"id": task_id}).one()
    return dict(got._mapping)


@pytest.mark.parametrize("pool, concurrency", [("prefork", 1), ("threads", 4)])
def test_celerys_result_in_the_stores_database_is_written_in_finishs_own_transaction(fleet, postgres_url, db,
                                                                                     pool, concurrency):
    f = fleet(TTL=5, STORE=postgres_url, BACKEND=f"db+{postgres_url}", pool=pool, concurrency=concurrency)
    plain = f.client.tasks["fleet.threads"].delay()  # Celery's own write (and its tables)
    assert plain.get(timeout=30)["pid"] > 0
    quick = f.client.tasks["fleet.quick"]
    calls = [quick.apply_async((40 + i,), task_id=f"pg-result-{pool}-{i}-{uuid.uuid4().hex[:8]}") for i in range(3)]
    assert [c.get(timeout=30) for c in calls] == [41, 42, 43]
    for c in calls:
        assert f.store.result(c.id).ok
        # one transaction wrote the guard's result and Celery's: one commit, no window between
        guard = xmin(db, "aaa_results", "call_id", c.id)
        assert guard is not None and xmin(db, "celery_taskmeta", "task_id", c.id) == guard
    # the row as Celery's backend writes it: the same columns filled, the same encoding
    stored, celery = row(db, calls[0].id), row(db, plain.id)
    assert stored["status"] == "SUCCESS" and stored["traceback"] is None and stored["date_done"] is not None
    assert f.client.backend.decode(stored["result"]) == 41
    assert {k for k, v in stored.items() if v is None} == {k for k, v in celery.items() if v is None}
    assert isinstance(celery["result"], bytes) and isinstance(stored["result"], bytes)
    assert abs(stored["date_done"] - celery["date_done"]).total_seconds() < 120  # the same time zone


def test_a_backend_on_another_database_is_written_by_celery_after_finish(fleet, postgres_url, db):
    other = postgres_url.rsplit("/", 1)[0] + "/aaa_other_results"
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = 'aaa_other_results'")).scalar():
            conn.execute(sa.text("CREATE DATABASE aaa_other_results"))
    f = fleet(TTL=5, STORE=postgres_url, BACKEND=f"db+{other}")
    call = f.client.tasks["fleet.quick"].apply_async((1,), task_id=f"pg-result-elsewhere-{uuid.uuid4().hex[:8]}")
    assert call.get(timeout=30) == 2
    assert f.store.result(call.id).ok
    assert xmin(db, "celery_taskmeta", "task_id", call.id) is None  # not in the store's database


def test_a_stored_success_is_kept_as_celerys_backend_keeps_it(fleet, postgres_url, db):
    """A result row holding a SUCCESS already is left as it is (Celery's ``_store_result``)."""
    f = fleet(TTL=5, STORE=postgres_url, BACKEND=f"db+{postgres_url}")
    assert f.client.tasks["fleet.threads"].delay().get(timeout=30)["pid"] > 0  # the tables
    kept = f"pg-result-kept-{uuid.uuid4().hex[:8]}"  # celery_taskmeta outlives a test
    f.client.backend.store_result(kept, 7, "SUCCESS")
    call = f.client.tasks["fleet.quick"].apply_async((1,), task_id=kept)
    wait_for(lambda: f.store.result(call.id) is not None, timeout_s=30)
    assert f.store.result(call.id).ok
    assert call.get(timeout=30) == 7
