"""What a running attempt can ask of its lease: ``ctx.lease_remaining_s``, ``ctx.check_lease``,
``ctx.checkpoint`` and ``ctx.last_checkpoint`` (see :class:`~aaa_celery.context.ToolContext`)."""

from __future__ import annotations

import time
from typing import Any

from ..errors import LeaseLost
from ..lifecycle import Lease, checkpoint_json
from ..stores.base import GuardStore
from .watchdog import Watchdog


class AttemptLease:
    """The lease of one running attempt, as its ``ToolContext`` sees it."""

    def __init__(self, store: GuardStore, lease: Lease, watchdog: Watchdog) -> None:
        self.store, self.lease, self.watchdog = store, lease, watchdog

    def lease_remaining_s(self) -> float:
        return self.watchdog.lease_remaining_s()

    def check_lease(self, min_s: float) -> None:
        """Raise LeaseLost unless the lease is proved for ``min_s`` more seconds; renew it
        now, on this thread, if the last renewal does not prove that long."""
        if min_s > self.lease.ttl_s:
            raise ValueError(
                f"check_lease(min_s={min_s}): a lease is never proved for longer than its TTL "
                f"({self.lease.ttl_s} s): lower min_s or raise lease_ttl_s"
            )
        if self.watchdog.lease_remaining_s() >= min_s:
            return
        if not self.watchdog.lost:
            sent = time.monotonic()
            try:
                renewed = bool(self.store.renew(self.lease))
            except Exception as e:  # noqa: BLE001 - any store trouble leaves the lease unproved
                raise LeaseLost(f"{self.lease.call_id}: the lease cannot be proved for {min_s} s: {e!r}") from e
            if renewed:
                self.watchdog.proved(sent)
            else:
                self.watchdog.lose("lease_taken")
        if self.watchdog.lease_remaining_s() < min_s:
            raise LeaseLost(f"{self.lease.call_id}: the lease of attempt {self.lease.attempt} cannot be "
                            f"proved for {min_s} s")

    def checkpoint(self, data: Any) -> None:
        self.watchdog.save_with_next_renewal(checkpoint_json(self.lease.attempt, data))

    def last_checkpoint(self) -> Any:
        saved = self.store.last_checkpoint(self.lease.call_id)
        return saved.data if saved is not None else None
