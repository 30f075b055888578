"""The guard core: run one delivery of a call under a lease, a heartbeat and a fence.

Plain Python over a :class:`~aaa_celery.stores.Store`, with no Celery import, so the
rules of an attempt are read in one place; ``aaa_celery.worker.GuardedTask`` adapts
them to Celery's request, retry and ack semantics.
"""

from .runner import (
    BUSY_POLLS,
    DeliveryEnded,
    Dropped,
    GuardRunner,
    HandBack,
    SlotBusy,
    error_for,
    run_unguarded,
)
from .reconcile import Happened, NotHappened
from .slots import SlotHeld, wait_s
from .watchdog import BodyTimedOut, Interrupted, LeaseCancelled, Watchdog, active_calls

__all__ = [
    "BUSY_POLLS",
    "BodyTimedOut",
    "DeliveryEnded",
    "Dropped",
    "GuardRunner",
    "HandBack",
    "Happened",
    "NotHappened",
    "SlotBusy",
    "Interrupted",
    "LeaseCancelled",
    "SlotHeld",
    "Watchdog",
    "active_calls",
    "error_for",
    "run_unguarded",
    "wait_s",
]
