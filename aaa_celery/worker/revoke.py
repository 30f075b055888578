"""Revoked and expired calls are recorded in the store, so nothing ever runs them again.

Celery's ``task_revoked`` signal fires in the worker that discards a revoked or expired
message, or terminates a running call (``revoke(terminate=True)``). For a guarded task
the call's one outcome becomes ``TaskRevokedError`` (first writer wins: a call that
already has a result keeps it). Recovery then never republishes it, and any later copy,
on any worker, before or after a restart (a worker's revoked set lives in its memory),
answers ``TaskRevokedError`` without running.
"""

from __future__ import annotations

from typing import Any

from ..config import GuardConfig
from ..lifecycle import CallSpec, Outcome
from .settle import settle_or_log

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
    settle_or_log(sender.app, CallSpec(call_id), revoked_outcome(terminated, signum, expired), "revocation")
