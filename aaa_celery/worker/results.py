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
"""

from __future__ import annotations

import logging
from typing import Any

from celery import states
from celery.backends.base import Backend, BaseKeyValueStoreBackend
from kombu.utils.encoding import bytes_to_str

log = logging.getLogger("aaa_celery.worker")

_FAST: dict[type, bool] = {}
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


def store_accepted(task: Any, req: Any, value: Any) -> None:
    """Write Celery's SUCCESS result ``value`` of ``req`` (a guarded call whose result the store
    accepted) without reading it first, where :mod:`this module <aaa_celery.worker.results>`
    says that is Celery's own write; else leave it to Celery."""
    backend = task.backend
    if not (_celery_would_store(task, req) and _writes_as_key_value(backend)):
        return
    task_id = req.id
    try:
        result = backend.encode_result(value, states.SUCCESS)
        meta = backend._get_result_meta(result=result, state=states.SUCCESS, traceback=None, request=req)
        meta["task_id"] = bytes_to_str(task_id)
        backend._set_with_state(backend.get_key_for_task(task_id), backend.encode(meta), states.SUCCESS)
    except Exception as e:  # noqa: BLE001 - Celery's own write (and its error handling) follows
        log.debug("aaa: Celery's result of %s left to Celery: %r", task_id, e)
        return
    req.ignore_result = True
