"""Celery's result in Django's database through django-celery-results (``django-db``), on a
real worker: when Django's database is the PostgreSQL store's, ``finish`` writes the
``TaskResult`` row in the transaction that records the guard's result, one commit for both
(``aaa_celery/worker/results.py``). The row is the one django-celery-results writes."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from aaa_celery import open_store
from aaa_celery.testing import Fleet, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.fleet]

ROOT = Path(__file__).resolve().parents[2]
TABLE = "django_celery_results_taskresult"


@pytest.fixture(scope="module")
def env(postgres_server: Any, redis_server: Any) -> dict[str, str]:
    from tests.conftest import clean_postgres

    clean_postgres(postgres_server.url)
    engine = sa.create_engine(postgres_server.url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {TABLE}, django_migrations CASCADE"))
    engine.dispose()
    env = {"AAA_DR_PG": postgres_server.url.replace("+psycopg", ""), "AAA_DR_STORE": postgres_server.url,
           "AAA_DR_BROKER": redis_server.url, "DJANGO_SETTINGS_MODULE": "tests.django_results.settings"}
    done = subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr
    return env


@pytest.fixture(scope="module")
def fleet(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet("tests.django_results.celery_app", size=1, env=env, cwd=ROOT,
               workdir=tmp_path_factory.mktemp("django-results-fleet")) as f:
        yield f


def row(db: sa.Engine, task_id: str) -> dict[str, Any] | None:
    with db.connect() as conn:
        got = conn.execute(sa.text(f"SELECT *, xmin::text AS tx FROM {TABLE} WHERE task_id = :id"),
                           {"id": task_id}).one_or_none()
    return None if got is None else dict(got._mapping)


def test_django_celery_results_row_is_written_in_finishs_own_transaction(fleet, env):
    client = Celery(broker=env["AAA_DR_BROKER"])
    store = open_store(env["AAA_DR_STORE"])
    db = sa.create_engine(env["AAA_DR_STORE"])
    try:
        plain = client.send_task("dr.plain", (1,), task_id=f"dr-plain-{uuid.uuid4().hex[:8]}")
        ids = [client.send_task("dr.add", (40 + i,), task_id=f"dr-add-{i}-{uuid.uuid4().hex[:8]}").id for i in range(3)]
        wait_for(lambda: all(store.result(i) is not None for i in ids), 60, "the guarded results")
        wait_for(lambda: (row(db, plain.id) or {}).get("status") == "SUCCESS", 60, "the plain task's row")
        for i in ids:
            stored = row(db, i)
            assert stored is not None and stored["status"] == "SUCCESS"
            with db.connect() as conn:
                guard = conn.execute(sa.text("SELECT xmin::text FROM aaa_results WHERE call_id = :id"),
                                     {"id": i}).scalar()
            assert guard is not None and stored["tx"] == guard  # one commit for both
        celery, stored = row(db, plain.id), row(db, ids[0])
        assert celery is not None and stored is not None
        # the row as django-celery-results writes it: the same columns filled, the same encoding
        assert stored["result"] == "41" and stored["content_type"] == celery["content_type"] == "application/json"
        assert (stored["task_args"], celery["task_args"]) == ('"(40,)"', '"(1,)"')  # encoded, as the backend does
        assert stored["task_name"] == "dr.add" and stored["worker"] == celery["worker"]
        assert {k for k, v in stored.items() if v is None} == {k for k, v in celery.items() if v is None}
        # the STARTED row Celery wrote before the body: its creation and start times are kept
        assert stored["date_started"] is not None and stored["date_created"] <= stored["date_started"]
        assert stored["date_started"] <= stored["date_done"]
    finally:
        db.dispose()
