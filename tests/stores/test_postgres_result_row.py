"""The PostgreSQL store writes Celery's result row (``ResultRow``: Celery's database backend on
the store's own database) in ``finish``'s transaction, with the accepted success only.

The row is made by the worker's :func:`aaa_celery.worker.results.result_copy` from Celery's own
backend, and read back by that backend: a row the store does not write leaves ``written`` False
(Celery writes it then) and the guard's result is recorded all the same.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery
from celery.app.task import Context

from aaa_celery.config import GuardConfig
from aaa_celery.lifecycle import Accepted, CallSpec, Claimed, Outcome, Stale
from aaa_celery.stores import open_store
from aaa_celery.stores.base import ResultCopy
from aaa_celery.stores.sql.postgres import PostgresStore
from aaa_celery.worker import results

pytestmark = pytest.mark.postgres

CFG = GuardConfig(lease_ttl_s=30)


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    s = open_store(postgres_url)
    assert isinstance(s, PostgresStore)
    yield s
    s.close()


@pytest.fixture
def app(postgres_url: str) -> Iterator[Celery]:
    app = Celery("rows", broker="memory://", backend=f"db+{postgres_url}", set_as_current=False)
    app.conf.update(result_serializer="json", accept_content=["json"])

    @app.task(name="rows.t")
    def t(x: int) -> int:
        return x

    app.backend.store_result(f"warm-{uuid.uuid4().hex}", 0, "SUCCESS")  # Celery's tables
    yield app
    app.backend.ResultSession().get_bind().dispose()


@pytest.fixture
def db(postgres_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(postgres_url)
    yield engine
    engine.dispose()


def claimed(store: PostgresStore, call_id: str | None = None, attempt: int = 1) -> Any:
    got = store.begin(CallSpec(call_id or f"row-{uuid.uuid4().hex[:10]}", name="rows.t"), "w1", CFG)
    assert isinstance(got, Claimed) and got.lease.attempt == attempt, got
    return got.lease


def copy_of(app: Celery, call_id: str, value: Any) -> ResultCopy:
    task = app.tasks["rows.t"]
    req = Context({"id": call_id, "args": [value], "kwargs": {}, "hostname": "w@h"})
    make = results.result_copy(task, req)
    assert make is not None
    copy = make(value)
    assert copy is not None and copy.row is not None
    return copy


def xmin(db: sa.Engine, table: str, column: str, key: str) -> str | None:
    with db.connect() as conn:
        got = conn.execute(sa.text(f"SELECT xmin::text FROM {table} WHERE {column} = :key"), {"key": key}).scalar()
    return got  # type: ignore[no-any-return]


def test_an_accepted_success_writes_celerys_row_in_the_same_transaction(store, app, db):
    lease = claimed(store)
    copy = copy_of(app, lease.call_id, {"n": 42})
    assert isinstance(store.finish(lease, Outcome.success({"n": 42}, lease.attempt), CFG, copy), Accepted)
    assert copy.written
    meta = app.backend.get_task_meta(lease.call_id)
    assert meta["status"] == "SUCCESS" and meta["result"] == {"n": 42}
    assert xmin(db, "celery_taskmeta", "task_id", lease.call_id) == xmin(db, "aaa_results", "call_id", lease.call_id)


def test_a_failure_or_a_stale_result_writes_no_row(store, app):
    failed = claimed(store)
    copy = copy_of(app, failed.call_id, 1)
    store.finish(failed, Outcome.failure("ValueError", "no", failed.attempt), CFG, copy)
    assert not copy.written and app.backend.get_task_meta(failed.call_id)["status"] == "PENDING"

    old = claimed(store)
    store.release(old)  # attempt 1 lost the call; attempt 2 claims it
    new = claimed(store, old.call_id, attempt=2)
    stale = copy_of(app, old.call_id, 1)
    assert isinstance(store.finish(old, Outcome.success(1, old.attempt), CFG, stale), Stale)
    assert not stale.written and app.backend.get_task_meta(old.call_id)["status"] == "PENDING"
    fresh = copy_of(app, new.call_id, 2)
    assert isinstance(store.finish(new, Outcome.success(2, new.attempt), CFG, fresh), Accepted)
    assert fresh.written and app.backend.get_task_meta(new.call_id)["result"] == 2


def test_a_finish_retried_after_it_landed_leaves_the_row_to_celery(store, app):
    lease = claimed(store)
    outcome = Outcome.success(5, lease.attempt)
    store.finish(lease, outcome, CFG)  # landed; its reply lost, say
    copy = copy_of(app, lease.call_id, 5)
    assert isinstance(store.finish(lease, outcome, CFG, copy), Accepted)
    assert not copy.written


@pytest.mark.parametrize("elsewhere", [
    {"database": ("127.0.0.1", 1, "postgres", "postgres")},  # another server
    {"database": ("127.0.0.1", None, "another", "postgres")},  # another database (port: the store's)
    {"database": ("127.0.0.1", None, "postgres", "someone_else")},  # as another user
    {"table": (None, "no_such_table")},
    {"columns": (("no_such_column", "TEXT", "x"),)},  # a table another Celery version created
], ids=["server", "database", "user", "table", "column"])
def test_a_row_for_another_database_or_a_missing_table_is_left_to_celery(store, app, elsewhere, postgres_url):
    lease = claimed(store)
    copy = copy_of(app, lease.call_id, 3)
    assert copy.row is not None
    if "database" in elsewhere and elsewhere["database"][1] is None:
        port = sa.engine.make_url(postgres_url).port
        elsewhere = {"database": (elsewhere["database"][0], port, *elsewhere["database"][2:])}
    copy.row = dataclasses.replace(copy.row, **elsewhere)
    assert isinstance(store.finish(lease, Outcome.success(3, lease.attempt), CFG, copy), Accepted)
    assert not copy.written and app.backend.get_task_meta(lease.call_id)["status"] == "PENDING"
    assert store.result(lease.call_id) == Outcome.success(3, lease.attempt)


def test_a_stored_success_is_kept(store, app):
    lease = claimed(store)
    app.backend.store_result(lease.call_id, "first", "SUCCESS")
    copy = copy_of(app, lease.call_id, "second")
    assert isinstance(store.finish(lease, Outcome.success("second", lease.attempt), CFG, copy), Accepted)
    assert app.backend.get_task_meta(lease.call_id)["result"] == "first"  # as Celery's backend keeps it


def test_a_backend_not_on_postgresql_makes_no_row(tmp_path):
    app = Celery("rows", broker="memory://", backend=f"db+sqlite:///{tmp_path}/r.db", set_as_current=False)

    @app.task(name="rows.t")
    def t(x: int) -> int:
        return x

    make = results.result_copy(app.tasks["rows.t"], Context({"id": "x", "args": [1], "kwargs": {}}))
    assert make is not None and make(1) is None  # Celery writes it


@pytest.mark.parametrize("fields", [
    {"is_eager": True}, {"ignore_result": True}, {"callbacks": [{"task": "rows.t"}]}, {"chord": {"task": "rows.t"}},
], ids=["eager", "ignore_result", "callbacks", "chord"])
def test_a_delivery_celery_stores_its_own_way_makes_no_row(app, fields):
    req = Context({"id": f"row-{uuid.uuid4().hex[:10]}", "args": [1], "kwargs": {}, **fields})
    assert results.result_copy(app.tasks["rows.t"], req) is None


def test_a_row_the_store_did_not_write_is_left_to_celery(app):
    """``store_accepted`` leaves Celery's trace to write a row the store did not write."""
    copy = copy_of(app, f"row-{uuid.uuid4().hex[:10]}", 1)
    req = Context({"id": copy.key, "args": [1], "kwargs": {}})
    results.store_accepted(app.tasks["rows.t"], req, copy)
    assert not req.__dict__.get("ignore_result")
    copy.written = True
    results.store_accepted(app.tasks["rows.t"], req, copy)
    assert req.ignore_result is True


@pytest.mark.parametrize("a, b, same", [
    ("postgresql://u@h:5432/d", "postgresql+psycopg://u:secret@h/d", True),  # the default port; any password
    ("postgresql://u@h/d", "postgresql://u@h2/d", False),
    ("postgresql://u@/d?host=/run/a", "postgresql://u@/d?host=/run/b", False),  # two socket directories
    ("postgresql://u@h/d", "postgresql://v@h/d", False),
])
def test_the_same_database_is_the_same_host_port_name_and_user(a, b, same):
    from aaa_celery.stores.base import ResultRow

    assert (ResultRow.database_of(sa.engine.make_url(a)) == ResultRow.database_of(sa.engine.make_url(b))) is same
