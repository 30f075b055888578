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
import contextvars
import ctypes
import heapq
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..config import GuardConfig, LostLease
from ..lifecycle import Lease, lapsed, lease_left
from ..stores.base import GuardStore

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


try:  # signal.getsignal without its conversion to an enum, which raises for a function handler
    from _signal import getsignal as _getsignal  # type: ignore[import-not-found]  # CPython's, no stub
except ImportError:  # pragma: no cover - another interpreter
    _getsignal = signal.getsignal


def _install_handler() -> None:
    global _handler_installed
    current = _getsignal(INTERRUPT_SIGNAL)
    if not _handler_installed or current is not _on_interrupt_signal:
        signal.signal(INTERRUPT_SIGNAL, _on_interrupt_signal)
        _handler_installed = True


class Interrupted(BaseException):
    """Raised inside a tool body to stop it; BaseException so ``except Exception`` can't eat it."""


def _raised_while_interrupted(error: BaseException) -> bool:
    """Whether ``error`` was raised while an :class:`Interrupted` was being handled."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, Interrupted):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False


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
        #: Renewals run here, never on the watchdog thread: a slow store call must not
        #: delay another call's deadline or timeout.
        self.renewals = ThreadPoolExecutor(RENEWAL_THREADS, thread_name_prefix="aaa-renew")
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


#: How many renewals of different calls may be in flight at once in one process.
RENEWAL_THREADS = 8

_scheduler: _Scheduler | None = None
_scheduler_lock = threading.Lock()


def renewer() -> ThreadPoolExecutor:
    """This process's renewal threads (``aaa-renew``), started on demand."""
    return scheduler().renewals


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


def run_coroutine(coro: Any) -> Any:
    """Run ``coro`` to its end on a private event loop and return its value (or raise).

    ``asyncio.run`` here when this thread runs no loop (a worker's pool); else (an eager
    call from a running loop: an async view, pytest-asyncio) on a helper thread, in a copy
    of this context, while this thread waits: a loop cannot be re-entered, and a sync
    caller of an eager task expects its result when the call returns."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    context = contextvars.copy_context()
    ended: dict[str, Any] = {}

    def main() -> None:
        try:
            ended["value"] = context.run(asyncio.run, coro)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller as is
            ended["error"] = e

    helper = threading.Thread(target=main, name="aaa-coroutine", daemon=True)
    helper.start()
    helper.join()
    if "error" in ended:
        raise ended["error"]
    return ended["value"]


class Watchdog:
    """Heartbeat and timeout for one call, run around the tool body.

    The body's phase ends with :meth:`run`; with ``keep_renewing=True`` the heartbeat goes
    on after it, until :meth:`close`, so the lease lives while the result is recorded
    (``finish`` and its retries). Each renewal runs on the process's renewal threads, never
    on the watchdog thread: a slow store call delays no other call's heartbeat, deadline or
    timeout. A renewal that fails for any reason is retried within the lease; the lease
    counts as lost when a renewal says another attempt holds the call, or when no renewal
    has proved it for ``lease_ttl_s`` (the call's deadline, enforced here whatever the store
    does). ``timeout_s`` bounds the body under every ``on_lost_lease``.
    """

    def __init__(
        self,
        store: GuardStore | None,
        lease: Lease | None,
        config: GuardConfig,
        timeout_s: float | None,
    ) -> None:
        self.store, self.lease, self.config = store, lease, config
        self.timeout_s = timeout_s
        self.lost = False
        #: Why the lease was lost: "lease_taken" (a renewal found another attempt holding
        #: the call) or "store_unreachable" (``errors.STORE_UNREACHABLE``: no renewal could
        #: prove it within its TTL).
        self.lost_cause: str | None = None
        self.reason: type[Interrupted] | None = None
        self._armed = threading.Lock()
        self._running = False
        self._watched = False
        self._closed = False
        self._renewing = False
        self._warned = False
        self._target = threading.get_ident()
        self._on_main = threading.current_thread() is threading.main_thread()
        #: The main thread's watchdog when this body started: an outer call whose body made
        #: this (eager, nested) call; it is the main thread's again when this body ends.
        self._outer: Watchdog | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._deadline: float | None = None
        self._next_beat = float("inf")
        self._last_ok = 0.0
        self._tried_at = 0.0
        #: When a renewal tried after a freeze is judged (None: no such try pending).
        self._judge_at: float | None = None
        #: A checkpoint to write with the next renewal (ctx.checkpoint), if any.
        self._checkpoint: str | None = None

    # -- running a body ---------------------------------------------------
    def run(self, body: Callable[[], Any], *, keep_renewing: bool = False) -> Any:
        """Run ``body`` (a sync callable, or one returning a coroutine) under the watchdog.

        With ``keep_renewing`` the heartbeat goes on once the body ended, until :meth:`close`."""
        self._start()
        try:
            result = body()
            if asyncio.iscoroutine(result):
                result = run_coroutine(self._guarded(result))
            return result
        except asyncio.CancelledError:
            if self.reason is not None:
                raise self.reason() from None
            raise
        except Exception as e:
            # The interrupt lands wherever the body is: code that was running there (a
            # Condition's lock, a cleanup) may raise its own error while the interrupt is
            # being handled. The body was still stopped by the guard, for this reason.
            if self.reason is not None and _raised_while_interrupted(e):
                raise self.reason() from e
            raise
        finally:
            self._body_ended()
            if not keep_renewing:
                self.close()

    def lease_remaining_s(self) -> float:
        """Seconds the lease is proved for: until its TTL runs out since the last renewal
        the store confirmed (0 once lost; infinite without a lease)."""
        if self.lease is None:
            return float("inf")
        if self.lost:
            return 0.0
        return lease_left(self._last_ok + self.lease.ttl_s, time.monotonic())

    def proved(self, sent: float) -> None:
        """A renewal sent at ``sent`` (monotonic) succeeded: the lease holds for a TTL from then."""
        with self._armed:
            self._last_ok = max(self._last_ok, sent)
            self._judge_at = None

    def lose(self, cause: str) -> None:
        """The lease is lost (``cause``: see :attr:`lost_cause`)."""
        self._lose(cause)

    def save_with_next_renewal(self, checkpoint: str) -> None:
        """Write ``checkpoint`` with the lease's next renewal (a newer one replaces it)."""
        with self._armed:
            self._checkpoint = checkpoint

    def close(self) -> None:
        """Stop the heartbeat (the attempt's result is recorded, or given up)."""
        with self._armed:
            self._closed = True
        if self._watched:
            self._watched = False
            scheduler().discard(self)

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
            self._outer, _main_watchdog = _main_watchdog, self
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

    def _body_ended(self) -> None:
        global _main_watchdog
        with self._armed:
            self._running = False
            self._deadline = None
        if self._on_main and _main_watchdog is self:
            outer = _main_watchdog = self._outer
            if outer is not None and outer._running and outer.reason is not None and outer._loop is None:
                # The outer call was interrupted while this one ran (the signal found this
                # body, not the outer one): deliver it to the outer body now.
                signal.pthread_kill(outer._target, INTERRUPT_SIGNAL)

    def _wake(self) -> float | None:
        wake = float("inf")
        if self.lease is not None and not self.lost:
            deadline = self._judge_at if self._judge_at is not None else self._last_ok + self.lease.ttl_s
            wake = min(self._next_beat, deadline)
        if self._deadline is not None:
            wake = min(wake, self._deadline)
        return None if wake == float("inf") else wake

    # -- on the watchdog thread -----------------------------------------------
    def _tick(self, now: float) -> float | None:
        """Do what is due; return when to wake next, or None to stop watching this call."""
        if self._closed:
            return None
        if self._deadline is not None and now >= self._deadline:
            self._deadline = None
            self._interrupt(BodyTimedOut)  # the heartbeat goes on while the timeout is recorded
        if self.lease is not None and not self.lost:
            period = self.config.heartbeat_period_s
            if lapsed(self._last_ok + self.lease.ttl_s, now):
                if self._judge_at is None and self._tried_at < now - period:
                    # No renewal was even tried lately: this process was frozen (or starved).
                    # A session-bound lease may still hold: one try decides, within a period.
                    self._judge_at = self._next_beat = now + period
                    self._renew_now(now)
                elif self._judge_at is not None and now < self._judge_at:
                    self._next_beat = max(self._next_beat, self._judge_at)  # wait for that try
                else:
                    # Renewals were tried and none proved the lease within its TTL: whatever
                    # the store says later, another worker may hold the call now.
                    self._lose("store_unreachable")
            elif now >= self._next_beat:
                self._next_beat = now + period
                self._renew_now(now)
        return self._wake()

    def _renew_now(self, now: float) -> None:
        if not self._renewing:  # one renewal in flight per call at most
            self._renewing = True
            self._tried_at = now
            renewer().submit(self._renew, now)

    # -- on a renewal thread --------------------------------------------------
    def _renew(self, sent: float) -> None:
        """Renew the lease once; a success proves it for a TTL from ``sent``."""
        assert self.store is not None and self.lease is not None
        with self._armed:
            checkpoint, self._checkpoint = self._checkpoint, None
        try:
            ok: bool | None = bool(self.store.renew(self.lease))
            if ok and checkpoint is not None:
                self.store.save_checkpoint(self.lease, checkpoint)
                checkpoint = None
        except Exception as e:  # noqa: BLE001 - any store trouble, not only a lost connection
            # An outage, a READONLY replica after a failover, OOM, BUSY, a timeout: the lease
            # is not lost, only unproved, until its TTL runs out (then _tick gives it up).
            ok = None
            if not self._warned:
                self._warned = True
                log.warning("aaa: renewing the lease of %s failed (retrying within the lease): %r",
                            self.lease.call_id, e)
            else:
                log.debug("aaa: renewing the lease of %s failed again: %r", self.lease.call_id, e)
        with self._armed:
            if checkpoint is not None and self._checkpoint is None:
                self._checkpoint = checkpoint  # not written: try again with the next renewal
            self._renewing = False
            if ok:
                self._last_ok = max(self._last_ok, sent)
                self._judge_at = None
            elif ok is None:
                # Retry soon within the lease, not a whole heartbeat later.
                self._next_beat = min(self._next_beat, time.monotonic() + self._retry_s())
        if ok is False:
            self._lose("lease_taken")
        elif ok is None and self._watched and not self._closed:
            scheduler().add(self, self._next_beat)

    def _retry_s(self) -> float:
        assert self.lease is not None
        return max(0.05, min(self.config.heartbeat_period_s, self.lease.ttl_s / 10))

    def _lose(self, cause: str) -> None:
        with self._armed:
            if self.lost or self._closed:
                return
            self.lost, self.lost_cause = True, cause
        if self._running and self.config.on_lost_lease is LostLease.CANCEL:
            self._interrupt(LeaseCancelled)

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
