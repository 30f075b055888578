"""Helpers for testing guarded tasks on real ``celery worker`` processes.

Start a fleet of workers, break them the way production breaks them, and check
what the tools really did::

    from aaa_celery.testing import Fleet, Ledger, freeze, kill9, kill_child

    with Fleet("proj.celery", size=2, env={"BROKER_URL": url}) as fleet:
        result = refund.delay("A-100")
        ...                                   # wait until the ledger shows the body started
        kill9(fleet[0].pid)                   # the whole worker dies mid-call
        result.get(timeout=30)                # at_least_once: attempt 2 on fleet[1]

Every process these helpers start is stopped by its PID (never by name) when the
fleet stops, also after a test failure.

* :mod:`.fleet`: :class:`WorkerProcess` is one ``celery -A <module> worker``
  subprocess, :class:`Fleet` a group of them with distinct hostnames, and
  :func:`wait_for` polls a condition.
* :mod:`.faults`: :func:`kill9` (a crash), :func:`kill_child` (one prefork pool
  child), :func:`freeze` (``SIGSTOP`` … ``SIGCONT``: a GC pause, a VM freeze), and
  :func:`duplicate_delivery` (the same task id sent again).
* :mod:`.ledger`: :class:`Ledger` is an external effect log in Redis that a tool
  appends to, so a test sees every body run, including runs the guard cut short;
  :class:`EffectLedger` is the chaos harness's ledger, with a uniqueness
  constraint on idempotency keys.
* :mod:`.checker`: :func:`check_history` checks the guard's invariants I1..I7 over
  a store's audit trail and an :class:`EffectLedger`; it returns the list of
  :class:`Violation`.

A worker is ready when its ``worker_ready`` signal fires: each worker runs through
the launcher :mod:`aaa_celery.testing.worker`, which writes the worker's PID to
the file named by ``AAA_READY_FILE`` (:mod:`.ready`). Log lines containing
``ready.`` count too. Importing this package connects no signal.

:mod:`aaa_celery.chaos` is built on these helpers; nothing here imports it.
"""

from .checker import Call, Violation, check_history
from .faults import Frozen, duplicate_delivery, freeze, kill9, kill_child, pid_alive, pool_children
from .fleet import Fleet, WorkerProcess, wait_for
from .ledger import EffectLedger, Ledger

__all__ = [
    "Call",
    "EffectLedger",
    "Violation",
    "check_history",
    "Fleet",
    "Frozen",
    "Ledger",
    "WorkerProcess",
    "duplicate_delivery",
    "freeze",
    "kill9",
    "kill_child",
    "pid_alive",
    "pool_children",
    "wait_for",
]


def __dir__() -> list[str]:
    # The public names, not the submodules that importing leaves behind as attributes.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
