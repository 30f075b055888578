"""Applying lifecycle's writes: the one step the memory and SQL stores share.

A store reads a call's state under its lock, asks :mod:`aaa_celery.lifecycle` for
the :class:`~aaa_celery.lifecycle.Writes` of the operation (``plan_begin``,
``plan_finish``, ``plan_fenced``, ``plan_release``, ``plan_hand_on``, ``plan_record``,
``plan_checkpoint``, ``plan_renew``, ``plan_settle``), and hands them to :func:`apply`
with a :class:`CallWriter`: the writes a backend knows how to make, on that
one locked call. The Redis store applies the same writes in Lua (``lua/_lib.lua``).
"""

from __future__ import annotations

import abc
from typing import Any

from ..lifecycle import Draft, Lease, Outcome, Writes


class CallWriter(abc.ABC):
    """One call, locked for a read-decide-write: the writes of :class:`~aaa_celery.lifecycle.Writes`."""

    @abc.abstractmethod
    def claim(self, lease: Lease) -> None:
        """Count ``lease.attempt`` as the call's last attempt, make ``lease`` its lease,
        and end any recovery hold."""

    @abc.abstractmethod
    def record(self, outcome: Outcome) -> None:
        """Record the call's one result and free its lease, whoever holds it."""

    @abc.abstractmethod
    def append(self, event: Draft) -> None:
        """Append ``event``, stamped with the store's clock, unless its id is in the trail."""

    @abc.abstractmethod
    def let_go(self, token: str) -> None:
        """Free the call's lease if the lease with ``token`` holds it."""

    @abc.abstractmethod
    def hand_on(self, lease: Lease) -> None:
        """Mark ``lease``'s attempt (live, holding the call) as the one that handed the call
        on, and free the lease."""

    @abc.abstractmethod
    def settle(self, outcome: Outcome) -> None:
        """Replace the call's recorded result with ``outcome``."""

    @abc.abstractmethod
    def checkpoint(self, checkpoint: str) -> None:
        """Keep ``checkpoint`` (a checkpoint's JSON) as the call's last one."""

    @abc.abstractmethod
    def renew(self, lease: Lease) -> None:
        """``lease`` (live, holding the call) lapses ``lease.ttl_s`` from now."""


def apply(writes: Writes, call: CallWriter) -> Any:
    """Make ``writes`` on ``call``, in :class:`~aaa_celery.lifecycle.Writes`' order, and
    return the reply."""
    if writes.claim is not None:
        call.claim(writes.claim)
    if writes.record is not None:
        call.record(writes.record)
    if writes.settle is not None:
        call.settle(writes.settle)
    if writes.event is not None:
        call.append(writes.event)
    if writes.let_go is not None:
        call.let_go(writes.let_go)
    if writes.hand_on is not None:
        call.hand_on(writes.hand_on)
    if writes.checkpoint is not None:
        call.checkpoint(writes.checkpoint)
    if writes.renew is not None:
        call.renew(writes.renew)
    return writes.reply
