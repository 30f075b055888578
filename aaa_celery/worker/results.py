"""Celery's result of a guarded call whose success the store has just accepted.

Celery's key-value result backends (Redis among them) read a task's result before they write
it, and never overwrite a stored SUCCESS: a duplicate of a lost task must not replace the
result (``KeyValueStoreBackend._store_result``). That read is a backend round trip on every
task. For a guarded call the store has made that decision already, and more strictly: its
``finish`` accepts one result per call, and an attempt that lost the call never writes
Celery's result at all (its result is stale; the message is dropped). So once ``finish``
accepted this attempt's success, the worker writes Celery's result as Celery would, with
Celery's own methods, but without the read, and tells Celery's trace that the result is
stored (the request's ``ignore_result``, which only ``mark_as_done`` reads once the body has
returned; chord bookkeeping still runs).

Only where that write is the one Celery would make: a worker delivery (not eager), whose
result Celery would store (no ``ignore_result``), without link callbacks or a chain (Celery
sends those before it stores the result, so that the result names them as children) and
outside a chord, on a backend whose result writing is ``KeyValueStoreBackend``'s own. In every
other case, and whenever the write raises, Celery stores the result itself, as for any task.

**With the result.** Celery's result is made (Celery's own encoding, key and expiry) before
``finish`` and goes with it as a :class:`~aaa_celery.stores.base.ResultCopy`. A Redis store on
the server of Celery's plain Redis backend (the default: the store is on the broker's server,
and so is the backend, often) writes it in ``finish``'s own script, once it accepted the
success: one round trip for both, as many as plain Celery's worker makes for its result.
Otherwise the worker writes it after ``finish``, as above.

**In the same database.** With Celery's database backend (``db+postgresql://``) on the
database of a PostgreSQL store (the same host, port, database and user), Celery's result goes
with ``finish`` as a row (:class:`~aaa_celery.stores.base.ResultRow`: the backend's own table,
columns and encoding, made by its own ``_update_result``), and the store writes it in
``finish``'s transaction, as the backend would (a stored SUCCESS is kept): one commit for the
guard's record and Celery's result. So does django-celery-results' backend (``django-db``) on
Django's database, when it is the store's: the row of ``TaskResult`` with the fields its
``_store_result`` writes. Where the store does not write it, Celery writes it itself.
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime
from collections.abc import Callable
from typing import Any

from celery import states
from celery.backends.base import Backend, BaseKeyValueStoreBackend
from kombu.utils.encoding import bytes_to_str

from ..stores.base import ResultCopy, ResultRow

log = logging.getLogger("aaa_celery.worker")

_FAST: dict[type, bool] = {}
_REDIS: dict[type, bool] = {}
_DATABASE: dict[type, bool] = {}
_DJANGO_DB: dict[type, bool] = {}
#: The key-value backends' result write this module stands in for (None: a Celery without it).
_KV_STORE_RESULT = getattr(BaseKeyValueStoreBackend, "_store_result", None)


def _writes_as_key_value(backend: Any) -> bool:
    """Whether ``backend`` stores a result as ``KeyValueStoreBackend`` does (read, then
    ``_set_with_state``), so that the write without the read is the one it would make."""
    cls = type(backend)
    fast = _FAST.get(cls)
    if fast is None:
        fast = _FAST[cls] = (
            isinstance(backend, BaseKeyValueStoreBackend)
            and _KV_STORE_RESULT is not None
            and getattr(cls, "_store_result", None) is _KV_STORE_RESULT
            and cls.store_result is Backend.store_result
            and cls.mark_as_done is Backend.mark_as_done
            and callable(getattr(backend, "_get_result_meta", None))
            and callable(getattr(backend, "_set_with_state", None))
        )
    return fast


def _celery_would_store(task: Any, req: Any) -> bool:
    if req.is_eager or req.callbacks or req.chain or req.chord:
        return False
    # the request's own ignore_result, else the task's; either one set: Celery decides
    return not (req.__dict__.get("ignore_result") or task.ignore_result)


def _writes_as_redis(backend: Any) -> bool:
    """Whether ``backend`` is Celery's plain Redis backend, writing a result with ``SET``
    (with its ``expires``) and ``PUBLISH`` on one server: then a store on that server may
    write the copy for it (not Sentinel, whose server changes with a failover)."""
    cls = type(backend)
    fast = _REDIS.get(cls)
    if fast is None:
        # imported on first use, once per backend class: importing Celery's Redis backend (and
        # redis-py) doubles the time of `import aaa_celery.worker.task` for every other backend
        from celery.backends.redis import RedisBackend

        fast = _REDIS[cls] = isinstance(backend, RedisBackend) and all(
            getattr(cls, name, None) is getattr(RedisBackend, name, False)
            for name in ("_set_with_state", "set", "_set", "_get_pool", "_create_client", "get_key_for_task"))
    return fast


def result_copy(task: Any, req: Any) -> Callable[[Any], ResultCopy | None] | None:
    """How to make Celery's SUCCESS result of ``req`` from the body's value, for the store to
    write with the accepted success (:class:`~aaa_celery.stores.base.ResultCopy`), or None
    where Celery writes the result itself (see :mod:`this module <aaa_celery.worker.results>`)."""
    backend = task.backend
    if not _celery_would_store(task, req):
        return None
    if _writes_as_key_value(backend):
        return lambda value: _copy(backend, req, value)
    if _writes_as_database(backend):
        return lambda value: _row_copy(backend, req, value)
    if _writes_as_django_db(backend):
        return lambda value: _django_row_copy(backend, req, value)
    return None


def _writes_as_database(backend: Any) -> bool:
    """Whether ``backend`` is Celery's own database backend on PostgreSQL, writing a result
    with its ``_update_result`` (the row a store on its database may write for it)."""
    cls = type(backend)
    fast = _DATABASE.get(cls)
    if fast is None:
        try:
            from celery.backends.database import DatabaseBackend
        except ImportError:  # no SQLAlchemy: no database backend either
            fast = _DATABASE[cls] = False
            return fast
        fast = _DATABASE[cls] = isinstance(backend, DatabaseBackend) and all(
            getattr(cls, name, None) is getattr(owner, name, False)
            for owner, names in ((DatabaseBackend, ("_store_result", "_update_result")),
                                 (Backend, ("store_result", "mark_as_done")))
            for name in names)
    return fast


def _row_copy(backend: Any, req: Any, value: Any) -> ResultCopy | None:
    """Celery's result as its database backend would write it (its own ``_update_result`` on
    a row of its own table, not added to any session); None (Celery writes it) if the backend
    is not on PostgreSQL, or making the row raises."""
    try:
        import sqlalchemy as sa

        url = sa.engine.make_url(backend.url)
        if url.get_backend_name() != "postgresql":
            return None
        dialect = _dialect()
        row = backend.task_cls(req.id)
        backend._update_result(row, backend.encode_result(value, states.SUCCESS), states.SUCCESS,
                               traceback=None, request=req)
        table = row.__table__
        columns, key = [], None
        for column in table.columns:
            if column.primary_key:
                sequence = column.default if isinstance(column.default, sa.Sequence) else None
                if sequence is not None:
                    name = sequence.name if not sequence.schema else f"{sequence.schema}.{sequence.name}"
                    key = (column.name, name)
                continue
            got = getattr(row, column.key, None)
            process = column.type.bind_processor(dialect)
            kind = column.type.compile(dialect=dialect)
            if isinstance(got, datetime) and got.tzinfo is not None:
                kind = "TIMESTAMP WITH TIME ZONE"  # as psycopg sends it: the session's zone converts it
            columns.append((column.name, kind, process(got) if process is not None and got is not None else got))
        return ResultCopy(req.id, "", None, None,
                          row=ResultRow(ResultRow.database_of(url), (table.schema, table.name), tuple(columns), key))
    except Exception as e:  # noqa: BLE001 - Celery's own write (and its error handling) follows
        log.debug("aaa: Celery's result of %s left to Celery: %r", req.id, e)
        return None


def _writes_as_django_db(backend: Any) -> bool:
    """Whether ``backend`` is django-celery-results' database backend (``django-db``) writing
    a result with its own ``_store_result`` through ``TaskResult``'s manager (the row a store on
    Django's database may write for it)."""
    cls = type(backend)
    fast = _DJANGO_DB.get(cls)
    if fast is None:
        try:
            from django_celery_results.backends.database import (  # type: ignore[import-untyped]  # no py.typed
                DatabaseBackend as DjangoDatabaseBackend,
            )
            from django_celery_results.managers import TaskResultManager
            from django_celery_results.models import TaskResult
        except Exception:  # noqa: BLE001 - not installed, or Django not set up: not this backend
            fast = _DJANGO_DB[cls] = False
            return fast
        fast = _DJANGO_DB[cls] = (
            isinstance(backend, DjangoDatabaseBackend)
            and backend.TaskModel is TaskResult
            and getattr(type(TaskResult._default_manager), "store_result", None) is TaskResultManager.store_result
            and all(getattr(cls, name, None) is getattr(owner, name, False)
                    for owner, names in ((DjangoDatabaseBackend, ("_store_result", "encode_content",
                                                                  "_get_extended_properties",
                                                                  "_get_meta_from_request")),
                                         (Backend, ("store_result", "mark_as_done")))
                    for name in names))
    return fast


def _django_row_copy(backend: Any, req: Any, value: Any) -> ResultCopy | None:
    """Celery's result as django-celery-results writes it (the fields of its ``_store_result``,
    through its own encoding, ``date_done`` now and ``date_created`` on insert only), on
    ``TaskResult``'s table in the database Django writes it to; None (Celery writes it) if that
    database is not PostgreSQL, or making the row raises."""
    try:
        from django.db import connections, router
        from django.utils import timezone

        model = backend.TaskModel
        conn = connections[router.db_for_write(model)]
        if conn.vendor != "postgresql":
            return None
        result = backend.encode_result(value, states.SUCCESS)
        content_type, content_encoding, encoded = backend.encode_content(result)
        _, _, meta = backend.encode_content({**backend._get_meta_from_request(req),
                                             "children": backend.current_task_children(req)})
        written = {"task_id": req.id, "status": states.SUCCESS, "result": encoded, "meta": meta,
                   "content_type": content_type, "content_encoding": content_encoding,
                   **backend._get_extended_properties(req, None), "traceback": None}
        now = timezone.now()
        columns, keep = [], []
        for field in model._meta.concrete_fields:
            if getattr(field, "auto_now_add", False):
                got = now
                keep.append(field.column)
            elif getattr(field, "auto_now", False):
                got = now
            elif field.attname in written:
                got = written[field.attname]
            else:
                continue  # the primary key (its default), and what the backend does not write
            columns.append((field.column, field.db_type(conn), field.get_db_prep_save(got, conn)))
        settings = conn.settings_dict
        database = (settings.get("HOST") or None, int(settings.get("PORT") or 5432), settings.get("NAME"),
                    settings.get("USER") or None)
        return ResultCopy(req.id, "", None, None, row=ResultRow(database, (None, model._meta.db_table),
                                                                tuple(columns), keep=tuple(keep)))
    except Exception as e:  # noqa: BLE001 - Celery's own write (and its error handling) follows
        log.debug("aaa: Celery's result of %s left to Celery: %r", req.id, e)
        return None


@functools.cache
def _dialect() -> Any:
    """SQLAlchemy's PostgreSQL dialect on psycopg: the column types' SQL and bind processors."""
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    return PGDialect_psycopg()  # type: ignore[no-untyped-call]


def _copy(backend: Any, req: Any, value: Any) -> ResultCopy | None:
    """Celery's result as its backend would write it; None (Celery writes it) if that raises.
    The copy names the backend's server only for a plain Redis backend and a value it takes."""
    try:
        result = backend.encode_result(value, states.SUCCESS)
        meta = backend._get_result_meta(result=result, state=states.SUCCESS, traceback=None, request=req)
        meta["task_id"] = bytes_to_str(req.id)
        encoded = backend.encode(meta)
        key = backend.get_key_for_task(req.id)
    except Exception as e:  # noqa: BLE001 - Celery's own write (and its error handling) follows
        log.debug("aaa: Celery's result of %s left to Celery: %r", req.id, e)
        return None
    server = None
    if _writes_as_redis(backend) and not (isinstance(encoded, str) and len(encoded) > backend._MAX_STR_VALUE_SIZE):
        server = backend.connparams
    return ResultCopy(key, encoded, backend.expires or None, server)


def store_accepted(task: Any, req: Any, copy: ResultCopy | None) -> None:
    """Celery's result of ``req``, a guarded call whose success the store accepted with
    ``copy``: written already by the store, else now by its backend without the read; either
    way Celery's trace then leaves it be. Nothing if there is no copy: Celery writes it."""
    if copy is None or (copy.row is not None and not copy.written):
        return  # a row the store did not write: Celery writes it, reading it first
    if not copy.written:
        try:
            task.backend._set_with_state(copy.key, copy.value, states.SUCCESS)
        except Exception as e:  # noqa: BLE001 - Celery's own write (and its error handling) follows
            log.debug("aaa: Celery's result of %s left to Celery: %r", req.id, e)
            return
    req.ignore_result = True
