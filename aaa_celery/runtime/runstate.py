"""A run's state in the store: how the engine records a run as it goes, and reads it back.

The driving process writes the run's record and events through a :class:`RunWriter`
(off the event loop, in order, coalesced); the model's answers are recorded turn by
turn, so a resumed run replays them instead of asking the model again
(``docs/durable-runs.md``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..llm.types import LLMResponse, ToolCall, Usage
from ..stores.runs import RunRecord, RunRecords, run_key

if TYPE_CHECKING:
    from ..stores.base import RunStore

log = logging.getLogger("aaa_celery.runtime")
T = TypeVar("T")

#: How long a run's lease lasts without a heartbeat, by default (seconds).
DEFAULT_RUN_LEASE_S = 30.0
#: How long finished runs are kept in the store, by default (seconds): 7 days.
DEFAULT_RUN_RETENTION_S = 7 * 24 * 3600.0
#: How many finished runs' handles an engine keeps in memory, by default.
DEFAULT_KEEP_FINISHED = 64


def keeps_runs(store: RunRecords) -> bool:
    """Whether ``store`` keeps run records (every built-in backend does)."""
    return type(store).put_run is not RunRecords.put_run


def holder_name(engine_id: str) -> str:
    """Who drives a run: host, process and engine."""
    return f"{socket.gethostname()}/{os.getpid()}/{engine_id}"


def algo_name(algo: Any) -> str:
    """The name a run's algorithm is recorded under (``algo.name``, else its class's name)."""
    name = getattr(algo, "name", None)
    return name if isinstance(name, str) and name else type(algo).__qualname__


def response_to_dict(response: LLMResponse) -> dict[str, Any]:
    """A model answer as JSON data (to record a turn)."""
    return {
        "text": response.text,
        "tool_calls": [{"name": c.name, "arguments": c.arguments, "id": c.id, "error": c.error}
                       for c in response.tool_calls],
        "usage": None if response.usage is None else response.usage.as_dict(),
    }


def response_from_dict(data: dict[str, Any]) -> LLMResponse:
    """A recorded model answer."""
    usage = data.get("usage")
    return LLMResponse(
        data.get("text", ""),
        tuple(ToolCall(c["name"], c["arguments"], c["id"], c.get("error")) for c in data.get("tool_calls", ())),
        Usage(**usage) if usage else None,
    )


async def off_loop(inline: bool, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: at once for an in-process store, else in a thread (never block the loop
    on I/O). At interpreter exit (an engine closed by ``atexit``), when no new thread may be
    started, it runs here."""
    if inline:
        return fn(*args)
    try:
        future = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(contextvars.copy_context().run, fn, *args))
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        return fn(*args)
    return await future


class RunWriter:
    """Writes one run's record and events to the store, in order, off the event loop.

    ``event()`` and ``record()`` queue a write; a flush task (one at a time) writes
    what is queued: the record first, then the events. A store error keeps the
    writes queued for the next flush (the run goes on); :meth:`drain` waits for them.

    A record is queued as a function that builds it, built when it is written: the
    record holds every request for approval of the run, so building it on every change
    (a turn of 1,000 approval calls makes 1,000 changes) was quadratic. On an in-process
    store the writes of one pass of the event loop are made once, at its end.
    """

    def __init__(self, store: RunStore, key: str) -> None:
        self.store, self.key = store, key
        self.inline = store.kind == "memory"
        self._events: list[dict[str, Any]] = []
        self._record: Callable[[], RunRecord] | None = None
        self._task: asyncio.Task[None] | None = None
        self._soon = False  # an in-process store's flush is scheduled on the loop
        self.failures = 0

    def event(self, event: dict[str, Any]) -> None:
        self._events.append(event)
        self._kick()

    def record(self, build: Callable[[], RunRecord]) -> None:
        """Queue the run's record, as ``build()`` will make it when it is written."""
        self._record = build
        self._kick()

    def _write(self, record: RunRecord | None, events: list[dict[str, Any]]) -> None:
        if record is not None:
            self.store.put_run(record)
        if events:
            self.store.append_run_events(self.key, events)

    def _take(self) -> tuple[RunRecord | None, list[dict[str, Any]]]:
        """What is queued, the record built (on the loop's thread: it reads the run's state)."""
        build, events = self._record, self._events
        self._record, self._events = None, []
        return (None if build is None else build()), events

    def _put_back(self, record: RunRecord | None, events: list[dict[str, Any]]) -> None:
        if self._record is None and record is not None:
            self._record = lambda: record
        self._events = events + self._events

    def _kick(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self._flush_now()
        elif self.inline:
            if not self._soon:
                self._soon = True
                loop.call_soon(self._flush_soon)
        elif self._task is None or self._task.done():
            self._task = loop.create_task(self._flush())

    def _flush_soon(self) -> None:
        self._soon = False
        self._flush_now()

    def _flush_now(self) -> bool:
        record, events = self._take()
        try:
            self._write(record, events)
            return True
        except Exception as e:  # noqa: BLE001 - the store is down: keep the writes for later
            self._put_back(record, events)
            self.failures += 1
            log.warning("run %s: could not write its state to the store (%s); will retry", self.key, e)
            return False

    async def _flush(self) -> None:
        while self._record is not None or self._events:
            record, events = self._take()
            try:
                await off_loop(False, self._write, record, events)
            except Exception as e:  # noqa: BLE001
                self._put_back(record, events)
                self.failures += 1
                log.warning("run %s: could not write its state to the store (%s); will retry", self.key, e)
                return

    async def drain(self, timeout_s: float = 30.0) -> bool:
        """Write everything queued; True once written, False if the store stayed down."""
        deadline = time.monotonic() + timeout_s
        if self.inline:
            await asyncio.sleep(0)  # let the changes of this pass of the loop queue up: one write
        while True:
            task = self._task
            if task is not None and not task.done():
                await asyncio.shield(task)
            if self._record is None and not self._events:
                return True
            record, events = self._take()  # on the loop's thread, as every other take
            try:
                await off_loop(self.inline, self._write, record, events)
            except Exception as e:  # noqa: BLE001
                self._put_back(record, events)
                self.failures += 1
                log.warning("run %s: could not write its state to the store (%s); will retry", self.key, e)
            if time.monotonic() > deadline:
                return self._record is None and not self._events
            if self._record is not None or self._events:
                await asyncio.sleep(0.2)


__all__ = ["RunRecord", "RunWriter", "algo_name", "holder_name", "keeps_runs", "off_loop",
           "response_from_dict", "response_to_dict", "run_key"]
