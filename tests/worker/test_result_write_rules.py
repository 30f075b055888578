"""Which results the worker writes without Celery's read, and what it writes, on Celery's own
backends in this process (``aaa_celery/worker/results.py``; the real workers are in
``test_result_write.py``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context
from celery.backends.base import BaseKeyValueStoreBackend
from celery.backends.redis import RedisBackend, SentinelBackend
from celery.backends.rpc import RPCBackend

from aaa_celery.worker import results


@pytest.fixture
def app() -> Celery:
    app = Celery("rules", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.result_extended = True

    @app.task(name="rules.t")
    def t(x: int) -> int:
        return x

    return app


def request(**fields: Any) -> Context:
    """A worker's request; a new id each time (the in-memory cache backend is process-wide)."""
    return Context({"id": f"call-{uuid.uuid4()}", "args": [1], "kwargs": {}, "hostname": "w@h", **fields})


def write(task: Any, req: Context, value: Any) -> None:
    """What the worker does around ``finish`` for a body that returned ``value``, with a store
    that wrote no copy: make the copy, then write it if there is one."""
    make = results.result_copy(task, req)
    results.store_accepted(task, req, make(value) if make is not None else None)


def test_a_plain_worker_delivery_is_written_as_celery_writes_it_and_the_trace_skips_its_own(app):
    task, req = app.tasks["rules.t"], request()
    write(task, req, {"n": 1})
    assert req.ignore_result is True  # mark_as_done stores nothing more
    meta = task.backend.get_task_meta(req.id)
    assert meta["status"] == "SUCCESS" and meta["result"] == {"n": 1}
    # the fields Celery's own store_result writes for the same request (result_extended on)
    other = request()
    task.backend.store_result(other.id, {"n": 1}, "SUCCESS", request=other)
    celery_meta = task.backend.get_task_meta(other.id)
    assert sorted(meta) == sorted(celery_meta)
    assert {k: v for k, v in meta.items() if k not in ("task_id", "date_done")} == \
        {k: v for k, v in celery_meta.items() if k not in ("task_id", "date_done")}


@pytest.mark.parametrize("fields", [
    {"is_eager": True},
    {"ignore_result": True},
    {"callbacks": [{"task": "rules.t"}]},
    {"chain": [{"task": "rules.t"}]},
    {"chord": {"task": "rules.t"}},
], ids=["eager", "ignore_result", "callbacks", "chain", "chord"])
def test_every_other_delivery_is_left_to_celery(app, fields):
    task, req = app.tasks["rules.t"], request(**fields)
    before = req.__dict__.get("ignore_result")
    write(task, req, 1)
    assert req.__dict__.get("ignore_result") == before
    assert task.backend.get_task_meta(req.id)["status"] == "PENDING"


def test_a_task_that_ignores_its_results_is_left_to_celery(app):
    task = app.tasks["rules.t"]
    task.ignore_result = True
    req = request()
    write(task, req, 1)
    assert task.backend.get_task_meta(req.id)["status"] == "PENDING"


def test_a_write_that_fails_is_left_to_celery(app, monkeypatch):
    task, req = app.tasks["rules.t"], request()

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("backend down")

    monkeypatch.setattr(task.backend, "_set_with_state", refused)
    write(task, req, 1)
    assert "ignore_result" not in req.__dict__  # Celery's own write (with its retries) follows


class _OwnWrite(RedisBackend):
    def _store_result(self, *args: Any, **kwargs: Any) -> Any:
        return super()._store_result(*args, **kwargs)


@pytest.mark.parametrize(("cls", "fast"), [
    (RedisBackend, True),
    (_OwnWrite, False),  # a backend that writes results its own way
    (RPCBackend, False),  # results travel as messages
], ids=["redis", "own-store-result", "rpc"])
def test_only_backends_whose_result_write_is_key_value_stores_get_the_write(app, cls, fast):
    backend = cls(app=app, url="redis://127.0.0.1:1/0") if issubclass(cls, RedisBackend) else cls(app=app)
    assert results._writes_as_key_value(backend) is fast
    assert isinstance(backend, BaseKeyValueStoreBackend) or not fast


class _OwnSet(RedisBackend):
    def _set(self, *args: Any, **kwargs: Any) -> Any:
        return super()._set(*args, **kwargs)


@pytest.mark.parametrize(("cls", "url", "named"), [
    (RedisBackend, "redis://127.0.0.1:1/4", True),
    (_OwnSet, "redis://127.0.0.1:1/4", False),  # writes results its own way
    (SentinelBackend, "sentinel://127.0.0.1:1/4", False),  # its server changes with a failover
], ids=["redis", "own-set", "sentinel"])
def test_only_a_plain_redis_backend_names_its_server_for_the_store(app, cls, url, named):
    """The copy names the server (so that a store there may write it) only for Celery's plain
    Redis backend; for any other backend the worker writes it with the backend's own methods."""
    app.conf.result_backend = url
    app.conf.result_expires = 120
    task, req = app.tasks["rules.t"], request()
    task.backend = cls(app=app, url=url)
    make = results.result_copy(task, req)
    assert make is not None
    copy = make({"n": 1})
    assert copy is not None and copy.ttl_s == 120 and not copy.written
    assert copy.key == task.backend.get_key_for_task(req.id)
    if named:
        assert copy.server is not None and copy.server["port"] == 1 and copy.server["db"] == 4
    else:
        assert copy.server is None


def test_a_value_too_large_for_the_redis_backend_is_left_to_its_own_error(app, monkeypatch):
    task, req = app.tasks["rules.t"], request()
    task.backend = RedisBackend(app=app, url="redis://127.0.0.1:1/0")
    monkeypatch.setattr(RedisBackend, "_MAX_STR_VALUE_SIZE", 10)
    make = results.result_copy(task, req)
    assert make is not None
    copy = make("x" * 100)
    assert copy is not None and copy.server is None  # the worker's write raises as Celery's would


def test_a_copy_the_store_wrote_is_not_written_again(app, monkeypatch):
    task, req = app.tasks["rules.t"], request()
    make = results.result_copy(task, req)
    assert make is not None
    copy = make(1)
    assert copy is not None
    copy.written = True
    monkeypatch.setattr(task.backend, "_set_with_state", lambda *a, **k: pytest.fail("written twice"))
    results.store_accepted(task, req, copy)
    assert req.ignore_result is True
