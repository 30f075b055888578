"""Recovery: bring back calls whose holder died, without waiting for the broker.

Over Redis, kombu redelivers an unacked message only after ``visibility_timeout``
(one hour by default), and a message popped by a worker that then dies frozen
can be lost outright. The store knows every call that was published or
started, so a sweep in every worker republishes, under the same task id, each
call whose lease lapsed without a result (and each call registered long ago but
never claimed). ``claim_recovery`` lets exactly one worker republish a call per
hold period. The new delivery then goes through ``begin`` like any other: it
becomes attempt *n+1*, or ``OutcomeUnknown`` / ``ExecutionAbandoned``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from celery import Celery

from ..errors import StoreError
from ..stores import open_store
from ..stores.base import Store
from .publish import expires_at, not_before, republish
from .stores import store_url

log = logging.getLogger("aaa_celery.recovery")

DEFAULT_INTERVAL_S = 2.0
DEFAULT_UNCLAIMED_GRACE_S = 300.0
#: How long one worker's republish of a call keeps the others from republishing it.
#: A claim of the republished call ends the hold, so a second crash right after a
#: takeover is recovered at the next sweep; the hold only matters when the copy is lost.
DEFAULT_HOLD_S = 10.0


def due(message: dict[str, Any], grace_s: float, now: float | None = None) -> bool:
    """Whether Celery itself would run this message now: never before its ``eta`` (plus the
    grace that a healthy worker has to take it), never once it ``expires``."""
    now = time.time() if now is None else now
    eta = not_before(message)
    if eta is not None and now < eta + grace_s:
        return False
    expires = expires_at(message)
    return expires is None or now < expires


def recover(app: Celery, store: Store, worker: str, producer: Any = None) -> list[str]:
    """Republish every lapsed call once; returns the call ids sent again.

    ``producer`` (a kombu producer on a connection of the caller's own) publishes the
    calls; without it, one is taken from the app's producer pool.
    """
    conf = app.conf
    grace = float(conf.get("aaa_unclaimed_grace_s") or DEFAULT_UNCLAIMED_GRACE_S)
    hold = float(conf.get("aaa_recovery_hold_s") or DEFAULT_HOLD_S)
    sent = []
    for call in store.expired(unclaimed_grace_s=grace):
        request = call.request
        message = request.get("message")
        if not request.get("task") or (message is not None and not due(message, grace)):
            continue
        if not store.claim_recovery(call.call_id, worker, hold):
            continue
        if message is not None:
            with app.producer_or_acquire(producer) as p:
                republish(app, p, message)
        else:  # registered by a worker from its request (the message was sent without the guard)
            options: dict[str, Any] = {"task_id": call.call_id, "headers": request.get("headers") or {}}
            if request.get("queue"):
                options["queue"] = request["queue"]
            app.send_task(request["task"], args=request.get("args") or [], kwargs=request.get("kwargs") or {},
                          producer=producer, **options)
        sent.append(call.call_id)
    if sent:
        log.info("aaa recovery republished %d call(s): %s", len(sent), ", ".join(sent[:10]))
    return sent


class Sweeper:
    """Runs :func:`recover` every ``interval_s`` in a daemon thread of its own.

    The thread has its own store client and its own broker connection, so a sweep
    never blocks the worker's event loop, and nothing the event loop does (a
    consumer restart, a timer entry dropped) can stop the sweeps. An error in one
    sweep is logged and the connections are opened again for the next one.
    """

    def __init__(self, app: Celery, name: str, interval_s: float) -> None:
        self.app, self.name, self.interval_s = app, name, interval_s
        self.sweeps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Store | None = None
        self._conn: Any = None
        self._producer: Any = None

    def start(self) -> Sweeper:
        self._thread = threading.Thread(target=self._loop, name="aaa-recovery", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.sweep_once()
        finally:
            self._close()

    def sweep_once(self) -> list[str]:
        """One sweep; never raises (a failed sweep is logged and retried next period)."""
        try:
            if self._store is None:
                self._store = open_store(store_url(self.app))
            if self._producer is None:
                self._conn = self.app.connection_for_write()
                self._producer = self.app.amqp.Producer(self._conn)
            sent = recover(self.app, self._store, self.name, self._producer)
            self.sweeps += 1
            return sent
        except StoreError as e:
            log.warning("aaa recovery sweep skipped: %s", e)
        except Exception:  # noqa: BLE001 - a sweep must never end the sweeper
            log.exception("aaa recovery sweep failed")
            self._close_broker()
        return []

    def _close_broker(self) -> None:
        conn, self._conn, self._producer = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.release()

    def _close(self) -> None:
        self._close_broker()
        store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
