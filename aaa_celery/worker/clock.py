"""A worker's wall clock against the store's: measured at start, and on ``celery aaa doctor``'s ask.

Leases, recovery and budgets are judged on the store's clock (docs/recovery.md lists each
decision and its clock), so a worker whose own clock is off does not take a live call nor
lose a healthy one. A few things still read a worker's wall clock: Celery's ``eta`` and
``expires``, and kombu's Redis ``visibility_timeout`` and ``unacked`` scores. A worker whose
clock differs from the store's by more than :data:`SKEW_LEASE_FRACTION` of the shortest
lease of its guarded tasks is reported, with the measured offset: in its log at start
(:func:`report_worker_clock`), and by ``celery aaa doctor``, which asks every worker
through the ``aaa_clock`` remote-control command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..config import GuardConfig
from ..stores.base import Clock

log = logging.getLogger("aaa_celery.clock")

#: A clock off the store's by more than this fraction of the shortest lease is reported.
SKEW_LEASE_FRACTION = 0.25
#: Whatever the leases, an offset of this many seconds or more is reported.
SKEW_REPORT_S = 5.0


def clock_offset(store: Clock, local: Callable[[], float] = time.time) -> tuple[float, float]:
    """The store's clock minus this process's wall clock (seconds), measured at the middle
    of one read of the store's clock, and the read's round trip (the error bound is half)."""
    sent_wall, sent = local(), time.monotonic()
    server = store.now()
    trip = time.monotonic() - sent
    return server - (sent_wall + trip / 2), trip


def _leases_s(tasks: Iterable[Any]) -> list[float]:
    return [t.guard_config.lease_ttl_s for t in tasks if getattr(t, "guard_config", None) is not None]


def shortest_lease_s(tasks: Iterable[Any]) -> float:
    """The shortest ``lease_ttl_s`` of these guarded tasks (the default's when none)."""
    return min(_leases_s(tasks), default=GuardConfig().lease_ttl_s)


def longest_lease_s(tasks: Iterable[Any]) -> float:
    """The longest ``lease_ttl_s`` of these guarded tasks (the default's when none)."""
    return max(_leases_s(tasks), default=GuardConfig().lease_ttl_s)


def skew_limit_s(tasks: Iterable[Any]) -> float:
    """The offset from which a worker's clock is reported."""
    return min(SKEW_REPORT_S, SKEW_LEASE_FRACTION * shortest_lease_s(tasks))


def guarded_tasks(app: Any) -> list[Any]:
    """The app's tasks with the guard on."""
    return [t for t in app.tasks.values() if getattr(getattr(t, "guard_config", None), "enabled", False)]


def worker_clock(app: Any, store: Clock) -> dict[str, float]:
    """This worker's clock against the store's: ``offset_s`` (store minus worker), ``trip_s``
    (the read's round trip) and ``limit_s`` (the offset from which it is reported)."""
    offset, trip = clock_offset(store)
    return {"offset_s": round(offset, 3), "trip_s": round(trip, 3), "limit_s": skew_limit_s(guarded_tasks(app))}


def report_worker_clock(app: Any, store: Clock, name: str) -> dict[str, float]:
    """Measure this worker's clock against the store's, and log a warning naming the offset
    when it is past the limit (at worker start)."""
    seen = worker_clock(app, store)
    if abs(seen["offset_s"]) > seen["limit_s"]:
        log.warning("aaa_celery: the clock of worker %s is %+.3f s off the store's (more than %.3f s, a quarter "
                    "of the shortest lease): leases and recovery are judged on the store's clock, but Celery's "
                    "eta/expires and kombu's visibility_timeout read this worker's; run NTP on this host",
                    name, -seen["offset_s"], seen["limit_s"])
    return seen


def _control_clock(state: Any, **_: Any) -> dict[str, Any]:
    """The ``aaa_clock`` remote-control command: :func:`worker_clock`, or the error."""
    from .stores import app_store

    app = state.consumer.app
    try:
        return {"ok": worker_clock(app, app_store(app))}
    except Exception as e:  # noqa: BLE001 - the answer names what failed
        return {"error": f"{type(e).__name__}: {e}"}


def register_control_command() -> None:
    """Register ``aaa_clock`` with Celery's remote control (its public ``control_command``)."""
    from celery.worker.control import Panel, control_command

    if "aaa_clock" not in Panel.data:
        control_command(name="aaa_clock")(_control_clock)
