"""Chaos testing for guarded tools: a workload, a nemesis, and a checker over the history.

Jepsen's method on a real Celery fleet: :mod:`.workload` sends calls of random
length to real ``celery worker`` processes while a seeded schedule of faults
kills, freezes and duplicates; the tools write what they really did to an
effect ledger; :func:`check_history` then checks the guard's invariants I1..I7
over the store's audit trail plus that ledger. The ledger, the checker and the
worker fleet live in :mod:`aaa_celery.testing`, which this package builds on
(``Ledger`` and ``MemoryLedger`` here are its effect ledgers).

Run it: ``python -m aaa_celery.chaos --calls 100 --workers 3 --faults 20``
(``--baseline`` runs the same seeded workload on plain Celery, unguarded).
"""

from ..testing.checker import Call, RecordedStore, Violation, check_history, summarize
from ..testing.ledger import EffectLedger as Ledger
from ..testing.ledger import MemoryEffectLedger as MemoryLedger

__all__ = ["Call", "Ledger", "MemoryLedger", "RecordedStore", "Violation", "check_history", "summarize"]
