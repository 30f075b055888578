"""A call's concurrency slot (``policy.Concurrency``), held with its lease.

The slot is taken just before the attempt is claimed, again once it is claimed (before the
body runs: a late claim may find it gone), and freed once its outcome is recorded
(:class:`~aaa_celery.guard.runner.GuardRunner`); in between, every renewal of the lease
renews the slot too (:class:`SlotHeld`), so a live holder never loses it and a dead or frozen
one loses both within its TTL (the slot a second later: ``lifecycle.SLOT_GRACE_S``). A
renewal that finds the slot gone to other calls counts as a lost lease: the holder is fenced.
"""

from __future__ import annotations

import random
from typing import Any, cast

from ..lifecycle import Lease, Slot
from ..stores.base import GuardStore

#: The first wait of a call whose key's slots are all held (``on_busy="wait"``), in seconds;
#: each later one doubles, up to the lease TTL (a dead holder's slot frees within it).
FIRST_WAIT_S = 0.5


def wait_s(tries: int, lease_ttl_s: float, rand: random.Random | None = None) -> float:
    """How long a call waits before its ``tries``-th (0 first) new try for a slot: exponential
    backoff from :data:`FIRST_WAIT_S` up to ``lease_ttl_s`` (at most 60 s), with jitter (half
    to all of it), so waiting calls do not all come back at once."""
    longest = max(FIRST_WAIT_S, min(lease_ttl_s, 60.0))
    full = min(longest, FIRST_WAIT_S * 2.0 ** min(tries, 16))
    draw = rand.random() if rand is not None else random.random()
    return full * (0.5 + 0.5 * draw)


class SlotHeld:
    """The guard's store for an attempt that holds ``slot``: a renewal of the lease renews the
    slot too, and fails if the slot was lost. Everything else is the store's."""

    def __init__(self, store: GuardStore, slot: Slot) -> None:
        self._store, self._slot = store, slot

    def renew(self, lease: Lease) -> bool:
        if not self._store.renew(lease):
            return False
        return self._store.take_slot(self._slot.key, lease.call_id, self._slot.limit, lease.ttl_s).reply != "full"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @classmethod
    def wrap(cls, store: GuardStore, slot: Slot | None) -> GuardStore:
        """``store`` as an attempt holding ``slot`` uses it (``store`` itself without a slot)."""
        return store if slot is None else cast(GuardStore, cls(store, slot))
