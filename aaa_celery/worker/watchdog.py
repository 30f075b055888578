"""The per-call watchdog: heartbeat the lease, enforce the timeout, interrupt the body.

One thread per running call renews the lease every ``heartbeat_s`` on the
store, and bounds the body by ``timeout_s``. When the lease is lost (and
``on_lost_lease=cancel``) or time runs out, it interrupts the body:

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
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ..config import GuardConfig, LostLease
from ..errors import StoreError
from ..lifecycle import Lease
from ..stores.base import Store

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
        self._stop = threading.Event()
        self._armed = threading.Lock()
        self._running = False
        self._thread: threading.Thread | None = None
        self._target = threading.get_ident()
        self._on_main = threading.current_thread() is threading.main_thread()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

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
        self._thread = threading.Thread(target=self._watch, name="aaa-heartbeat", daemon=True)
        self._thread.start()

    def _finish(self) -> None:
        global _main_watchdog
        with self._armed:
            self._running = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._on_main and _main_watchdog is self:
            _main_watchdog = None

    # -- the watchdog thread ----------------------------------------------
    def _watch(self) -> None:
        period = self.config.heartbeat_period_s
        started = time.monotonic()
        deadline = started + self.timeout_s if self.timeout_s else None
        last_ok = started
        next_beat = started + period
        while True:
            now = time.monotonic()
            wake = next_beat if self.lease is not None else float("inf")
            if deadline is not None:
                wake = min(wake, deadline)
            if self._stop.wait(max(0.0, min(wake - now, 3600.0))):
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._interrupt(BodyTimedOut)
                return
            if self.lease is None or now < next_beat:
                continue
            next_beat = now + period
            try:
                ok = self.store.renew(self.lease)  # type: ignore[union-attr]
                if ok:
                    last_ok = now
            except StoreError:
                # A store outage is not a lost lease until the TTL has surely run out.
                ok = now - last_ok < self.lease.ttl_s
            if not ok:
                self.lost = True
                if self.config.on_lost_lease is LostLease.CANCEL:
                    self._interrupt(LeaseCancelled)
                return

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
