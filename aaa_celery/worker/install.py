"""Wire the guard into a Celery app, explicitly: nothing here runs at import.

:func:`attach` adds the recovery bootstep to the app's workers and connects the
guard's signal receivers, each with a ``dispatch_uid`` so it is connected once
however often it runs: ``worker_process_init`` (a forked pool child opens its own
store connections), ``before_task_publish`` (captures a guarded task's message as
sent, for recovery; it ignores every other publish) and ``task_revoked`` (records a
revoked or expired guarded call, so nothing runs it again); it also has Celery's settings
table mask the ``aaa_*`` settings' passwords (:mod:`.masking`). ``GuardedTask`` calls it when a task is bound to an app;
:func:`install` also checks the app's settings first.
"""

from __future__ import annotations

from typing import Any

from celery.signals import before_task_publish, task_postrun, task_revoked, worker_process_init

from . import masking
from .bootstep import RecoveryStep
from .metrics import MetricsStep
from .messages import MessageCheck
from .publish import on_before_publish
from .revoke import on_task_revoked
from .settings import check_settings
from .stores import forget_inherited
from .tracing import close_open_span


def _reopen_after_fork(**_: object) -> None:
    forget_inherited()


def attach(app: Any) -> Any:
    """Add the recovery bootstep to ``app``'s workers and connect the guard's signal (idempotent)."""
    if RecoveryStep not in app.steps["worker"]:
        app.steps["worker"].add(RecoveryStep)
    if MetricsStep not in app.steps["worker"]:
        app.steps["worker"].add(MetricsStep)  # serves metrics only on a worker with a metrics port
    if MessageCheck not in app.steps["consumer"]:
        app.steps["consumer"].add(MessageCheck)  # malformed messages never stop the worker
    worker_process_init.connect(_reopen_after_fork, weak=False, dispatch_uid="aaa_celery.reopen_after_fork")
    before_task_publish.connect(on_before_publish, weak=False, dispatch_uid="aaa_celery.capture_message")
    task_revoked.connect(on_task_revoked, weak=False, dispatch_uid="aaa_celery.record_revoked")
    task_postrun.connect(close_open_span, weak=False, dispatch_uid="aaa_celery.tracing.close_open_span")
    masking.install()  # inspect conf and report mask the aaa_* settings' passwords
    return app


def install(app: Any) -> Any:
    """Check ``app``'s settings, then :func:`attach` the guard to it."""
    check_settings(app)
    return attach(app)
