"""Revoked and expired calls are recorded in the store, so nothing ever runs them again.

Celery's ``task_revoked`` signal fires in the worker that discards a revoked or expired
message, or terminates a running call (``revoke(terminate=True)``). For a guarded task
the call's one outcome becomes ``TaskRevokedError`` (first writer wins: a call that
already has a result keeps it). Recovery then never republishes it, and any later copy,
on any worker, before or after a restart (a worker's revoked set lives in its memory),
answers ``TaskRevokedError`` without running.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import GuardConfig
from ..errors import StoreError
from ..lifecycle import Accepted, Lease, Outcome
from .stores import app_store

log = logging.getLogger("aaa_celery.worker")

#: A settling "attempt": no lease holds the call through it, and its result is never fenced.
_SETTLE = GuardConfig(fence_results=False)


def revoked_outcome(terminated: bool, signum: Any, expired: bool) -> Outcome:
    """The outcome recorded for a call Celery revoked."""
    if expired:
        return Outcome.failure("TaskRevokedError", "expired")
    if terminated:
        return Outcome.failure("TaskRevokedError", f"terminated (signal {signum})")
    return Outcome.failure("TaskRevokedError", "revoked")


def on_task_revoked(sender: Any = None, request: Any = None, terminated: bool = False, signum: Any = None,
                    expired: bool = False, **_: Any) -> None:
    """``task_revoked`` receiver: record a guarded call's revocation as its outcome."""
    config = getattr(sender, "guard_config", None)
    call_id = getattr(request, "id", None)
    if not isinstance(config, GuardConfig) or not config.enabled or not call_id:
        return
    settle(sender.app, Lease(call_id, 0, "revoked", "", 0.0), revoked_outcome(terminated, signum, expired),
           _SETTLE, "revocation")


def settle(app: Any, lease: Lease, outcome: Outcome, config: GuardConfig, what: str) -> bool:
    """Record ``outcome`` as the call's one result by a lease-less finish, from outside the
    attempt that ran it (first writer wins; ``config.fence_results``: only while no later
    attempt than ``lease.attempt`` has started). The broker's ack is Celery's: a store that
    fails here is logged, and recovery may bring the call back once. True if recorded."""
    try:
        return isinstance(app_store(app).finish(lease, outcome, config), Accepted)
    except StoreError as e:
        log.warning("aaa: could not record the %s of %s: %s", what, lease.call_id, e)
        return False
