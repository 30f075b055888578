"""Calls sent in bulk, registered together: one store round trip per batch, not per call.

``GuardedTask.apply_async`` registers every call it sent, one store round trip each, so
recovery finds a call whose message the broker loses. Inside :func:`registered_together`
the calls a thread sends are registered a batch at a time (``Store.register_many``: one
pipelined round trip on Redis), when ``max_calls`` are waiting, when the oldest has waited
``max_delay_s`` (checked at the next send), and when the block ends, also by an exception.

**What this trades.** Outside a block a call is unregistered only for its register round
trip after the broker accepted it. Inside, for up to ``max_calls`` sends or ``max_delay_s``
(or until the block ends, if no send follows): if the publishing process dies in that
window *and* the broker loses that message, the call is lost with no trace in the store.
Either fault alone loses nothing: a call the broker still holds is registered by the
worker's ``begin``. So it is opt-in, per block; keep the block to the publishing loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import StoreError
from ..lifecycle import CallSpec
from ..stores.base import CallStore

log = logging.getLogger("aaa_celery.worker")

_local = threading.local()


class _Batch:
    """The registrations a thread's open block holds, oldest first."""

    def __init__(self, max_calls: int, max_delay_s: float) -> None:
        self.max_calls, self.max_delay_s = max_calls, max_delay_s
        self.waiting: list[tuple[CallStore, CallSpec]] = []
        self.since = 0.0

    def add(self, store: CallStore, call: CallSpec) -> None:
        if not self.waiting:
            self.since = time.monotonic()
        self.waiting.append((store, call))
        if len(self.waiting) >= self.max_calls or time.monotonic() - self.since >= self.max_delay_s:
            self.flush()

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        by_store: dict[int, tuple[CallStore, list[CallSpec]]] = {}
        for store, call in waiting:
            by_store.setdefault(id(store), (store, []))[1].append(call)
        for store, calls in by_store.values():
            try:
                store.register_many(calls)
            except StoreError as e:  # the messages are out: the calls run, their workers register them
                log.warning("aaa: %d calls were sent but not registered (%s)", len(calls), e)


@contextmanager
def registered_together(max_calls: int = 100, max_delay_s: float = 0.1) -> Iterator[None]:
    """Register the guarded calls this thread sends in the block a batch at a time.

    ``max_calls`` (default 100) and ``max_delay_s`` (default 0.1 s) bound how long a sent
    call may wait unregistered (see the module's docstring for what that trades). A block
    inside another joins it."""
    if max_calls < 1:
        raise ValueError(f"max_calls must be at least 1, not {max_calls}")
    if not max_delay_s >= 0:
        raise ValueError(f"max_delay_s must be 0 or more, not {max_delay_s}")
    if getattr(_local, "batch", None) is not None:
        yield
        return
    batch = _local.batch = _Batch(max_calls, max_delay_s)
    try:
        yield
    finally:
        _local.batch = None
        batch.flush()


def register(store: CallStore, call: CallSpec) -> None:
    """Register a sent call now, or with this thread's open batch."""
    batch: _Batch | None = getattr(_local, "batch", None)
    if batch is not None:
        batch.add(store, call)
        return
    try:
        store.register(call)
    except StoreError as e:
        log.warning("aaa: call %s was sent but not registered (%s)", call.call_id, e)
