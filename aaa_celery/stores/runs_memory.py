"""Run records in the memory store (see :mod:`.runs`): dicts under the store's lock.

The memory store lives in the process's memory, so it keeps at most
``run_retention`` finished runs (the oldest finished go first); runs still going
are always kept.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..lifecycle import lapsed
from .runs import FINISHED, RunJournal, RunRecord, RunRecords

#: How many finished runs a memory store keeps by default.
DEFAULT_RUN_RETENTION = 1000


@dataclass
class _Run:
    record: RunRecord
    events: list[dict[str, Any]] = field(default_factory=list)
    turns: dict[int, dict[str, Any]] = field(default_factory=dict)
    decisions: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    holder: str | None = None
    lease_until: float = 0.0


class MemoryRuns(RunRecords, RunJournal):
    """The run-record operations of :class:`~aaa_celery.stores.memory.MemoryStore`."""

    _lock: threading.RLock
    now: Callable[[], float]
    run_retention: int = DEFAULT_RUN_RETENTION

    @property
    def _runs(self) -> OrderedDict[str, _Run]:
        runs: OrderedDict[str, _Run] | None = self.__dict__.get("_run_table")
        if runs is None:
            runs = self.__dict__["_run_table"] = OrderedDict()
            self.__dict__["_finished_runs"] = OrderedDict()
        return runs

    @property
    def _finished(self) -> OrderedDict[str, None]:
        self._runs  # noqa: B018 - creates both tables
        return self.__dict__["_finished_runs"]  # type: ignore[no-any-return]

    def _view(self, run: _Run) -> RunRecord:
        live = run.holder if run.holder is not None and not lapsed(run.lease_until, self.now()) else None
        return RunRecord.from_json(run.record.to_json(), events=len(run.events), holder=live)

    def put_run(self, record: RunRecord) -> None:
        with self._lock:
            stored = RunRecord.from_json(record.to_json())
            key = record.key
            run = self._runs.get(key)
            if run is None:
                self._runs[key] = _Run(stored)
            else:
                run.record = stored
            if stored.status in FINISHED:
                self._finished[key] = None
                self._finished.move_to_end(key)
                while len(self._finished) > self.run_retention:
                    old, _ = self._finished.popitem(last=False)
                    self._runs.pop(old, None)
            else:
                self._finished.pop(key, None)

    def get_run(self, key: str) -> RunRecord | None:
        with self._lock:
            run = self._runs.get(key)
            return self._view(run) if run is not None else None

    def list_runs(self, *, tenant: str | None = None, all_tenants: bool = False, active: bool = False,
                  limit: int = 50, before: tuple[float, str] | None = None) -> list[RunRecord]:
        with self._lock:
            found = [
                r for r in self._runs.values()
                if (all_tenants or r.record.tenant == tenant) and (not active or r.record.active)
                and (before is None or r.record.cursor < tuple(before))
            ]
            found.sort(key=lambda r: r.record.cursor, reverse=True)
            return [self._view(r) for r in found[:limit]]

    def find_runs(self, run_id: str) -> list[RunRecord]:
        with self._lock:
            return [self._view(r) for r in self._runs.values() if r.record.run_id == run_id]

    def append_run_events(self, key: str, events: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return
            for event in events:
                if event["seq"] == len(run.events) + 1:
                    run.events.append(copy.deepcopy(event))

    def run_events(self, key: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return []
            end = None if limit is None else max(0, after) + limit
            return copy.deepcopy(run.events[max(0, after):end])

    def record_turn(self, key: str, turn: int, response: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return response
            return copy.deepcopy(run.turns.setdefault(turn, copy.deepcopy(response)))

    def recorded_turn(self, key: str, turn: int) -> dict[str, Any] | None:
        with self._lock:
            run = self._runs.get(key)
            found = run.turns.get(turn) if run is not None else None
            return copy.deepcopy(found)

    def decide_approval(self, key: str, call_id: str, digest: str, decision: dict[str, Any]) -> bool:
        with self._lock:
            run = self._runs.get(key)
            if run is None or (call_id, digest) in run.decisions:
                return False
            run.decisions[(call_id, digest)] = copy.deepcopy(decision)
            return True

    def approval_decision(self, key: str, call_id: str, digest: str) -> dict[str, Any] | None:
        with self._lock:
            run = self._runs.get(key)
            found = run.decisions.get((call_id, digest)) if run is not None else None
            return copy.deepcopy(found)

    def lease_run(self, key: str, holder: str, ttl_s: float) -> bool:
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return False
            now = self.now()
            if run.holder not in (None, holder) and not lapsed(run.lease_until, now):
                return False
            run.holder, run.lease_until = holder, now + ttl_s
            return True

    def release_run(self, key: str, holder: str) -> None:
        with self._lock:
            run = self._runs.get(key)
            if run is not None and run.holder == holder:
                run.holder, run.lease_until = None, 0.0

    def forget_run(self, key: str) -> None:
        with self._lock:
            self._runs.pop(key, None)
            self._finished.pop(key, None)

    def purge_runs(self, before: float) -> int:
        with self._lock:
            old = [k for k, r in self._runs.items() if r.record.status in FINISHED and r.record.updated_at < before]
            for k in old:
                self.forget_run(k)
            return len(old)
