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

import logging
import os
import socket
from typing import Any

from celery import Celery, bootsteps

from ..errors import StoreError
from ..stores.base import Store
from .stores import app_store

log = logging.getLogger("aaa_celery.recovery")

DEFAULT_INTERVAL_S = 2.0
DEFAULT_UNCLAIMED_GRACE_S = 300.0
#: How long one worker's republish of a call keeps the others from republishing it.
#: It also bounds how soon the same call can be recovered again (a second crash
#: right after a takeover), since the store keeps the hold after the call is claimed.
DEFAULT_HOLD_S = 10.0


def recover(app: Celery, store: Store, worker: str) -> list[str]:
    """Republish every lapsed call once; returns the call ids sent again."""
    conf = app.conf
    grace = float(conf.get("aaa_unclaimed_grace_s") or DEFAULT_UNCLAIMED_GRACE_S)
    hold = float(conf.get("aaa_recovery_hold_s") or DEFAULT_HOLD_S)
    sent = []
    for call in store.expired(unclaimed_grace_s=grace):
        request = call.request
        if not request.get("task") or not store.claim_recovery(call.call_id, worker, hold):
            continue
        options: dict[str, Any] = {"task_id": call.call_id, "headers": request.get("headers") or {}}
        if request.get("queue"):
            options["queue"] = request["queue"]
        app.send_task(request["task"], args=request.get("args") or [], kwargs=request.get("kwargs") or {}, **options)
        sent.append(call.call_id)
    if sent:
        log.info("aaa recovery republished %d call(s): %s", len(sent), ", ".join(sent[:10]))
    return sent


class RecoveryStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """A worker bootstep that runs :func:`recover` every ``aaa_recovery_interval_s``."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        from .install import check_settings

        # A worker with guarded tasks refuses to start without a store (or with pickle).
        check_settings(worker.app)
        self.tref: Any = None
        self.name_ = f"{getattr(worker, 'hostname', socket.gethostname())}/{os.getpid()}/recovery"

    def start(self, worker: Any) -> None:
        interval = float(worker.app.conf.get("aaa_recovery_interval_s") or DEFAULT_INTERVAL_S)
        if interval <= 0:
            return
        self.tref = worker.timer.call_repeatedly(interval, self.sweep, (worker,), priority=10)

    def sweep(self, worker: Any) -> None:
        try:
            recover(worker.app, app_store(worker.app), self.name_)
        except StoreError as e:
            log.warning("aaa recovery sweep skipped: %s", e)
        except Exception:  # noqa: BLE001 - a sweep must never kill the worker's timer
            log.exception("aaa recovery sweep failed")

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
