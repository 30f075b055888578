"""Producers and engines check the store's schema version, as workers do (issue 35, 4b).

Reproduces on 03c27cd: ``apply_async`` and an engine wrote to a store at any schema; only a
worker checked it at start. Now the first write of a process checks it (once per process and
store; the hot path is unchanged): an older schema is refused with ``StoreOutdated`` naming
``celery -A proj aaa migrate`` before anything is published; a newer one (a later release
migrated it, and the documented rolling order upgrades producers last) is used, with one
warning to upgrade this process.
"""

from __future__ import annotations

import logging
import uuid

import pytest
import sqlalchemy as sa
from celery import Celery

from aaa_celery import GuardedTask
from aaa_celery.errors import StoreOutdated
from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.llm.fake import text
from aaa_celery.runtime import SyncEngine
from aaa_celery.tools import ToolRegistry
from aaa_celery.stores import open_store
from aaa_celery.stores.sql import versions


def at_revision(url: str, revision: str) -> None:
    store = open_store(url)
    try:
        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.execute(sa.text(f"UPDATE {versions.VERSION_TABLE} SET version_num = :v"), {"v": revision})
    finally:
        store.close()


def producer(url: str) -> Celery:
    app = Celery("shop", broker="memory://", set_as_current=False)
    app.conf.aaa_store_url = url
    # the memory broker is the process's: a queue of its own, untouched by other tests in it
    app.conf.task_default_queue = f"writer-version-{uuid.uuid4().hex[:8]}"

    @app.task(base=GuardedTask, name="shop.refund", shared=False)
    def refund(order_id: int) -> str:
        return "ok"

    return app


def test_a_producer_refuses_an_older_store_before_it_publishes(tmp_path):
    url = f"sqlite:///{tmp_path / 'aaa.sqlite3'}"
    at_revision(url, versions.REVISIONS[-2])
    app = producer(url)
    with pytest.raises(StoreOutdated, match=r"`celery -A shop aaa migrate`"):
        app.tasks["shop.refund"].delay(1)
    with app.connection_for_write() as conn:  # nothing was published
        assert conn.default_channel.queue_declare(app.conf.task_default_queue, passive=False).message_count == 0
    open_store(url).migrate()
    assert app.tasks["shop.refund"].delay(1).id  # once migrated: published


def test_a_producer_on_a_newer_store_warns_once_and_publishes(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'aaa.sqlite3'}"
    at_revision(url, "9999")
    app = producer(url)
    with caplog.at_level(logging.WARNING, logger="aaa_celery.worker.stores"):
        for order in range(3):
            app.tasks["shop.refund"].delay(order)
    warnings = [r.getMessage() for r in caplog.records if "later release" in r.getMessage()]
    assert len(warnings) == 1 and "upgrade aaa_celery in this process" in warnings[0], warnings


def test_an_engine_refuses_an_older_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'aaa.sqlite3'}"
    at_revision(url, versions.REVISIONS[-2])
    store = open_store(url)
    sync = SyncEngine(store=store)
    try:
        LLMHandler(FakeLLMClient(lambda request: text("done"))).attach(sync)
        with pytest.raises(StoreOutdated, match=r"aaa migrate`"):
            sync.start(ToolLoop(ToolRegistry([])), {"task": "go"})
    finally:
        sync.close()
        store.close()
