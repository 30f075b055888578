"""``aaa.tool.*`` audit events as Celery events (``celery worker -E``), and
``timeout_s`` on real ``celery worker`` processes over Redis."""

from __future__ import annotations

import threading
import time

import pytest

from aaa_celery import ToolTimeout
from aaa_celery.lifecycle import COMPLETED, FAILED, STARTED

from .test_fleet_faults import TTL, started, types

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


class EventLog:
    """Every Celery event on the broker, received in a thread (``app.events.Receiver``)."""

    def __init__(self, app) -> None:
        self.app, self.events, self.ready = app, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.ready.wait(10), "the event receiver did not start"

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self.receiver = self.app.events.Receiver(conn, handlers={"*": self.events.append})
            # ready once its queue is bound: events sent before that would be missed
            self.receiver.on_consume_ready = lambda *a, **kw: self.ready.set()
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def of(self, task_id: str, prefix: str = "aaa-") -> list[dict]:
        return [e for e in list(self.events) if e.get("uuid") == task_id and e["type"].startswith(prefix)]

    def stop(self) -> None:
        self.receiver.should_stop = True
        self._thread.join(5)


def test_audit_events_reach_celery_event_receivers_on_workers_started_with_E(fleet):
    f = fleet(TTL=TTL, extra_args=("-E",))
    log = EventLog(f.client)
    try:
        ok = f.client.tasks["fleet.quick"].delay(1)
        echo = f.client.tasks["aaa.tool.echo"].delay(arguments={"text": "hi"})
        bad = f.client.tasks["fleet.fail"].delay("tool")
        assert ok.get(timeout=15) == 2 and echo.get(timeout=15) == "hi"
        bad.get(timeout=15, propagate=False)
        # Celery's task-succeeded leaves the worker's main process after the result is stored:
        # the caller can have the result before the event is even sent
        def succeeded() -> bool:
            return any(e["type"] == "task-succeeded" and e.get("uuid") == ok.id for e in list(log.events))

        def arrived() -> bool:
            return all(len(log.of(r.id)) >= 2 for r in (ok, echo, bad)) and succeeded()

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not arrived():
            time.sleep(0.1)
        for result, tool, last in ((ok, "fleet.quick", "aaa-tool-completed"),
                                   (echo, "echo", "aaa-tool-completed"),
                                   (bad, "fleet.fail", "aaa-tool-failed")):
            got = log.of(result.id)
            assert [e["type"] for e in got] == ["aaa-tool-started", last], got
            assert all(e["aaa_tool"] == tool and e["aaa_attempt"] == 1 and e["hostname"] for e in got)
            assert [e["aaa_type"] for e in got] == types(f.store, result.id)
            # nothing that Celery's event state owns for a task is in them
            assert not any({"worker", "state", "name", "result"} & set(e) for e in got), got
        assert log.of(bad.id)[-1]["aaa_error"] == "ToolError"
        # Celery's own task events still flow (the worker runs with -E)
        assert succeeded()
    finally:
        log.stop()


def test_workers_without_E_send_no_aaa_task_events(fleet):
    f = fleet(TTL=TTL)
    log = EventLog(f.client)
    try:
        ok = f.client.tasks["fleet.quick"].delay(1)
        assert ok.get(timeout=15) == 2
        time.sleep(1.0)
        assert log.of(ok.id, prefix="") == []  # neither Celery's task events nor ours
        assert types(f.store, ok.id) == [STARTED, COMPLETED]
    finally:
        log.stop()


def test_body_running_past_timeout_s_becomes_one_failed_tool_timeout_result(fleet):
    f = fleet(TTL=TTL)
    result = f.client.tasks["fleet.long_timeout"].delay(5.0)  # timeout_s=1.0
    first = started(f, result.id)[0]
    with pytest.raises(ToolTimeout) as err:
        result.get(timeout=15)
    assert "timed out after 1.0 s" in str(err.value)
    ended_at = time.time()
    assert ended_at - first["at"] < 4.0, "the body was not interrupted at its timeout"
    time.sleep(TTL + 3.0)  # no redelivery or recovery runs it again
    assert len(f.ledger.entries(result.id, "start")) == 1
    assert f.ledger.entries(result.id, "after") == []  # interrupted inside its sleep
    assert types(f.store, result.id) == [STARTED, FAILED]
    recorded = f.store.result(result.id)
    assert recorded.error == "ToolTimeout" and recorded.attempt == 1
    # a later delivery of the same call answers with the recorded timeout
    again = f.client.send_task("fleet.long_timeout", args=[5.0], task_id=result.id)
    with pytest.raises(ToolTimeout):
        again.get(timeout=15)
    assert len(f.ledger.entries(result.id, "start")) == 1
    assert types(f.store, result.id) == [STARTED, FAILED]
