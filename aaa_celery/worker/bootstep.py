"""The recovery bootstep: every worker of a guarded app runs the recovery sweep."""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import bootsteps

from ..errors import StoreError
from .clock import register_control_command, report_worker_clock
from .events import TASK_EVENTS_SETTING
from .recovery import RecoverySettings, Sweeper
from .settings import check_settings, check_worker_processes
from .stores import app_store, check_store_version


class RecoveryStep(bootsteps.StartStopStep):
    """A worker bootstep that runs :func:`recover` every ``aaa_recovery_interval_s``.

    The sweeps run in a :class:`Sweeper` thread of the worker's main process, not on
    the worker's event-loop timer: a timer entry depends on the event loop staying
    healthy, and a publish from it would block the loop.
    """

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        # A worker with guarded tasks refuses to start without a store (or with pickle, a
        # mistyped aaa_* setting, a store its processes cannot share).
        check_settings(worker.app)
        check_worker_processes(worker.app, getattr(worker, "pool_cls", None), getattr(worker, "concurrency", 1),
                               kwargs.get("autoscale"))
        self.interval_s = RecoverySettings.of(worker.app).interval_s  # a value that is no number fails here
        # ... nor on a store of another schema version (an older one: `celery aaa migrate`).
        check_store_version(worker.app)
        # Before the pool starts, so prefork children inherit it.
        worker.app.conf[TASK_EVENTS_SETTING] = bool(getattr(worker, "task_events", False))
        self.sweeper: Sweeper | None = None
        self.name_ = f"{getattr(worker, 'hostname', socket.gethostname())}/{os.getpid()}/recovery"
        # A clock far off the store's is named in the log (leases never read it, Celery's eta does).
        register_control_command()
        try:
            report_worker_clock(worker.app, app_store(worker.app), getattr(worker, "hostname", socket.gethostname()))
        except StoreError:
            pass  # an unreachable store was logged by the version check above

    def start(self, worker: Any) -> None:
        if self.interval_s <= 0 or self.sweeper is not None:
            return
        self.sweeper = Sweeper(worker.app, self.name_, self.interval_s).start()

    def stop(self, worker: Any) -> None:
        sweeper, self.sweeper = self.sweeper, None
        if sweeper is not None:
            sweeper.stop()

    def terminate(self, worker: Any) -> None:
        self.stop(worker)
