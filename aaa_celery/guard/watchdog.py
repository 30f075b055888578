"""The watchdog: heartbeat each call's lease, enforce its timeout, interrupt its body.

One thread per process (``aaa-watchdog``, started on first use, after fork) serves
every call running in that process: it renews each call's lease every
``heartbeat_s`` on the store, and bounds each body by ``timeout_s``. A call only
adds an entry to its schedule and removes it when the body ends, so the happy path
costs no thread start or join. When a lease is lost (and ``on_lost_lease=cancel``)
or time runs out, it interrupts that call's body:

* an ``async def`` body: its asyncio task is cancelled;
* a sync body on the main thread (prefork child, solo pool): a signal raises in
  it, which also breaks out of a blocking ``time.sleep``;
* a sync body on another thread (threads pool): an asynchronous exception is set
  on that thread; it fires at the next bytecode, so a body blocked inside one C
  call notices only when that call returns (a documented limit).
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ..config import GuardConfig, LostLease
from ..lifecycle import Lease
from ..stores.base import Store

log = logging.getLogger("aaa_celery.guard")

INTERRUPT_SIGNAL = signal.SIGUSR2
"""Interrupts a sync body on the main thread. Neither Celery nor billiard uses it in a
worker (Celery only with ``CELERY_RDBSIG`` set, in the main process, for its debugger)."""

#: The watchdog of the body running on this process's main thread, if any.
_main_watchdog: Watchdog | None = None
_handler_installed = False


def _on_interrupt_signal(signum: int, frame: Any) -> None:
    """The process-wide handler: raise in the main thread's body if its watchdog asked.

    Installed once and never removed, so a signal that arrives just after a body
    ended is ignored instead of meeting the default action (which ends the process).
    """
    watchdog = _main_watchdog
    if watchdog is not None and watchdog._running and watchdog.reason is not None and watchdog._loop is None:
        raise watchdog.reason()


def _install_handler() -> None:
    global _handler_installed
    current = signal.getsignal(INTERRUPT_SIGNAL)
    if not _handler_installed or current is not _on_interrupt_signal:
        signal.signal(INTERRUPT_SIGNAL, _on_interrupt_signal)
        _handler_installed = True


class Interrupted(BaseException):
    """Raised inside a tool body to stop it; BaseException so ``except Exception`` can't eat it."""


class LeaseCancelled(Interrupted):
    """The lease was lost and ``on_lost_lease=cancel``."""


class BodyTimedOut(Interrupted):
    """The body ran past ``timeout_s``."""


#: The longest the watchdog thread sleeps. Waking this often while idle lets a call
#: whose first heartbeat or deadline is further off than this skip waking the thread:
#: on a short call's happy path the thread is not disturbed at all.
IDLE_WAKE_S = 1.0


class _Scheduler:
    """The process's one watchdog thread: a heap of (when, watchdog) wake-ups."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Watchdog]] = []
        self._seq = itertools.count()
        self._active: set[Watchdog] = set()
        #: When the thread wakes next on its own (it never sleeps longer than IDLE_WAKE_S).
        #: An entry due later needs no notify, so a call's start and end never wake it.
        self._wakes_at = 0.0
        self._thread = threading.Thread(target=self._loop, name="aaa-watchdog", daemon=True)
        self._thread.start()

    def add(self, watchdog: Watchdog, when: float) -> None:
        with self._cond:
            self._active.add(watchdog)
            heapq.heappush(self._heap, (when, next(self._seq), watchdog))
            if when < self._wakes_at:
                self._cond.notify()

    def discard(self, watchdog: Watchdog) -> None:
        # Its heap entries stay until they come due and are skipped (cheaper than a
        # heap removal on every call's happy path).
        with self._cond:
            self._active.discard(watchdog)

    def active(self) -> int:
        with self._cond:
            return len(self._active)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    while self._heap and self._heap[0][2] not in self._active:
                        heapq.heappop(self._heap)
                    if self._heap and self._heap[0][0] <= now:
                        _, _, due = heapq.heappop(self._heap)
                        break
                    wait = min(self._heap[0][0] - now, IDLE_WAKE_S) if self._heap else IDLE_WAKE_S
                    self._wakes_at = now + wait
                    self._cond.wait(wait)
                    self._wakes_at = 0.0  # awake: an entry added now is seen before the next wait
            try:
                again = due._tick(time.monotonic())
            except Exception:  # noqa: BLE001 - one call's trouble must not stop the others' heartbeats
                again = None
            if again is not None:
                with self._cond:
                    if due in self._active:
                        heapq.heappush(self._heap, (again, next(self._seq), due))
                    # no notify: this thread is the only waiter


_scheduler: _Scheduler | None = None
_scheduler_lock = threading.Lock()


def scheduler() -> _Scheduler:
    """This process's watchdog scheduler (a forked child starts its own)."""
    global _scheduler
    current = _scheduler
    if current is not None and current.pid == os.getpid():
        return current
    with _scheduler_lock:
        if _scheduler is None or _scheduler.pid != os.getpid():
            _register_fork_hook()
            _scheduler = _Scheduler()
        return _scheduler


def active_calls() -> int:
    """How many calls this process's watchdog watches now (0 when idle: nothing leaks)."""
    current = _scheduler
    return current.active() if current is not None and current.pid == os.getpid() else 0


def _after_fork_in_child() -> None:
    global _scheduler, _scheduler_lock
    _scheduler, _scheduler_lock = None, threading.Lock()


_fork_hook_registered = False


def _register_fork_hook() -> None:
    """Reset the scheduler in a forked child (a lock held at the fork must not carry over).

    Registered on first use, not at import: importing the guard has no side effects."""
    global _fork_hook_registered
    if not _fork_hook_registered:
        _fork_hook_registered = True
        os.register_at_fork(after_in_child=_after_fork_in_child)


class Watchdog:
    """Heartbeat and timeout for one call, run around the tool body."""

    def __init__(
        self,
        store: Store | None,
        lease: Lease | None,
        config: GuardConfig,
        timeout_s: float | None,
    ) -> None:
        self.store, self.lease, self.config = store, lease, config
        self.timeout_s = timeout_s
        self.lost = False
        self.reason: type[Interrupted] | None = None
        self._armed = threading.Lock()
        self._running = False
        self._watched = False
        self._target = threading.get_ident()
        self._on_main = threading.current_thread() is threading.main_thread()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._deadline: float | None = None
        self._next_beat = float("inf")
        self._last_ok = 0.0

    # -- running a body ---------------------------------------------------
    def run(self, body: Callable[[], Any]) -> Any:
        """Run ``body`` (a sync callable, or one returning a coroutine) under the watchdog."""
        self._start()
        try:
            result = body()
            if asyncio.iscoroutine(result):
                result = asyncio.run(self._guarded(result))
            return result
        except asyncio.CancelledError:
            if self.reason is not None:
                raise self.reason() from None
            raise
        finally:
            self._finish()

    async def _guarded(self, coro: Any) -> Any:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        if self.reason is not None:  # interrupted before the loop existed
            coro.close()
            raise self.reason()
        return await coro

    def _start(self) -> None:
        global _main_watchdog
        if self._on_main:
            _install_handler()
            _main_watchdog = self
        self._running = True
        now = time.monotonic()
        self._last_ok = now
        if self.lease is not None:
            self._next_beat = now + self.config.heartbeat_period_s
        if self.timeout_s:
            self._deadline = now + self.timeout_s
        wake = self._wake()
        if wake is not None:
            self._watched = True
            scheduler().add(self, wake)

    def _finish(self) -> None:
        global _main_watchdog
        with self._armed:
            self._running = False
        if self._watched:
            scheduler().discard(self)
        if self._on_main and _main_watchdog is self:
            _main_watchdog = None

    def _wake(self) -> float | None:
        wake = self._next_beat
        if self._deadline is not None:
            wake = min(wake, self._deadline)
        return None if wake == float("inf") else wake

    # -- on the watchdog thread -----------------------------------------------
    def _tick(self, now: float) -> float | None:
        """Do what is due; return when to wake next, or None to stop watching this call."""
        if not self._running:
            return None
        if self._deadline is not None and now >= self._deadline:
            self._interrupt(BodyTimedOut)
            return None
        if self.lease is not None and now >= self._next_beat:
            self._next_beat = now + self.config.heartbeat_period_s
            try:
                ok = self.store.renew(self.lease)  # type: ignore[union-attr]
                if ok:
                    self._last_ok = now
            except Exception as e:  # noqa: BLE001 - any store trouble, not only a lost connection
                # A renewal that fails for any reason (an outage, a READONLY replica after a
                # failover, OOM, BUSY) is not a lost lease until the TTL has surely run out;
                # then it is, and the body is cancelled, never left running unrenewed.
                log.warning("aaa: renewing the lease of %s failed: %r", self.lease.call_id, e)
                ok = now - self._last_ok < self.lease.ttl_s
            if not ok:
                self.lost = True
                if self.config.on_lost_lease is LostLease.CANCEL:
                    self._interrupt(LeaseCancelled)
                return None
        return self._wake()

    def _interrupt(self, reason: type[Interrupted]) -> None:
        with self._armed:
            if not self._running or self.reason is not None:
                return
            self.reason = reason
            if self._loop is not None and self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)
            elif self._on_main:
                signal.pthread_kill(self._target, INTERRUPT_SIGNAL)
            else:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._target), ctypes.py_object(reason)
                )
