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

**A registration that meets store trouble** (the store restarting, failing over) is tried
again by the publishing process, in a background thread, for up to :data:`RETRY_FOR_S`
from the publish (half the store's ``retention_s`` if that is shorter), so a call whose
message the broker then loses is still recovered. One that a worker has begun meanwhile
is known to the store and is not written again, and a late registration never replaces a
message the call was sent with since (``lifecycle.registered_late``). A call still
unregistered when the window ends, or when the process exits, is logged with its id.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ..errors import StoreError
from ..lifecycle import CallSpec, registered_late
from ..stores.base import CallStore

log = logging.getLogger("aaa_celery.worker")

_local = threading.local()


def _by_store(pairs: Iterable[tuple[CallStore, CallSpec]]) -> list[tuple[CallStore, list[CallSpec]]]:
    """The calls grouped by the store they go to, in the order first seen."""
    groups: dict[int, tuple[CallStore, list[CallSpec]]] = {}
    for store, call in pairs:
        groups.setdefault(id(store), (store, []))[1].append(call)
    return list(groups.values())


#: Seconds from the publish during which a registration that met store trouble is tried again.
RETRY_FOR_S = 60.0
#: Registrations waiting to be tried again, at most; past that the oldest are given up.
RETRY_AT_MOST = 10_000


class _Retries:
    """The registrations this process tries again in the background, one thread for all."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[tuple[int, str], tuple[CallStore, CallSpec, float]] = {}
        self.thread: threading.Thread | None = None

    def add(self, store: CallStore, calls: list[CallSpec], error: StoreError) -> None:
        retention_s = getattr(store, "retention_s", math.inf)
        until = time.monotonic() + min(RETRY_FOR_S, retention_s / 2)
        with self.lock:
            for call in calls:
                self.waiting[(id(store), call.call_id)] = (store, registered_late(call), until)
            while len(self.waiting) > RETRY_AT_MOST:
                oldest = next(iter(self.waiting))
                del self.waiting[oldest]
                log.error("aaa: call %s was sent but never registered: too many waiting", oldest[1])
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="aaa-register-retry", daemon=True)
                self.thread.start()
        ids = ", ".join(c.call_id for c in calls[:5]) + (", ..." if len(calls) > 5 else "")
        log.warning("aaa: %d call(s) sent but not registered (%s): %s; trying again for up to %.0f s",
                    len(calls), error, ids, until - time.monotonic())

    def _run(self) -> None:
        delay = 0.25
        while True:
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            with self.lock:
                if not self.waiting:
                    self.thread = None
                    return
                by_store = _by_store((store, call) for store, call, _ in self.waiting.values())
            for store, calls in by_store:
                self._register(store, calls)
            self._give_up(time.monotonic())

    def _register(self, store: CallStore, calls: list[CallSpec]) -> None:
        try:
            # one a worker began meanwhile is known: its stored spec stays the one in force
            fresh = [call for call in calls if not store.events(call.call_id)]
            store.register_many(fresh)
        except Exception as e:  # noqa: BLE001 - any trouble: tried again until the window ends
            log.debug("aaa: registering %d call(s) again failed: %r", len(calls), e)
            return
        with self.lock:
            for call in calls:
                self.waiting.pop((id(store), call.call_id), None)
        log.info("aaa: %d call(s) sent while the store was unavailable are registered", len(fresh))

    def _give_up(self, now: float) -> None:
        with self.lock:
            late = [k for k, (_, _, until) in self.waiting.items() if until <= now]
            for k in late:
                del self.waiting[k]
        for _, call_id in late:
            log.error("aaa: call %s was sent but never registered: the store stayed unavailable", call_id)

    def left(self) -> None:
        with self.lock:
            for _, call_id in self.waiting:
                log.error("aaa: call %s was sent but never registered: the process exited first", call_id)
            self.waiting.clear()


_retries = _Retries()


def _forked() -> None:
    global _retries
    _retries = _Retries()  # the parent's thread is not in the child, nor are its calls the child's


os.register_at_fork(after_in_child=_forked)
atexit.register(lambda: _retries.left())


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
        for store, calls in _by_store(waiting):
            try:
                store.register_many(calls)
            except StoreError as e:  # the messages are out: registered once the store is back
                _retries.add(store, calls, e)


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
        _retries.add(store, [call], e)
