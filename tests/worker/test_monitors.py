"""Monitors see correct tasks while guarded calls run: Celery's ``celery.events.state.State``
and a real Flower, through a guarded call's whole life, including a takeover.

Reproduced on 702d210: the audit events were ``task-aaa-tool-*`` events with a ``worker``
field; ``State`` took them for task state changes (state ``AAA-TOOL-STARTED``) and set
the task's ``worker`` to a string, so Flower's ``/api/tasks`` answered 500.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from celery.events.state import State

from aaa_celery.testing import wait_for
from aaa_celery.testing.faults import stop_process

from ..servers import free_port
from .test_fleet_events_timeout import EventLog
from .test_fleet_faults import TTL, started

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

ROOT = Path(__file__).resolve().parents[2]


class Flower:
    """A real ``celery flower`` process on a loopback port, stopped by its PID."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "flower.log"
        cmd = [sys.executable, "-m", "celery", "-A", "tests.worker.fleet_app", "flower",
               "--address=127.0.0.1", f"--port={self.port}"]
        with open(self.log, "wb") as log:
            # loopback only, so the API may answer without authentication
            env = {**os.environ, **env, "FLOWER_UNAUTHENTICATED_API": "true"}
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(lambda: self.get("/healthcheck")[0] == 200, 60, "flower answers")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def stop(self) -> None:
        stop_process(self.proc)


def test_state_and_flower_stay_correct_through_a_takeover(fleet, tmp_path):
    f = fleet(TTL=TTL, extra_args=("-E",))
    log = EventLog(f.client)
    flower = Flower(f.env, tmp_path)
    polls: list[tuple[int, str]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            polls.append(flower.get("/api/tasks"))
            time.sleep(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        # Given a guarded call whose holder is killed mid-call (attempt 2 runs elsewhere)
        result = f.client.tasks["fleet.long"].delay(3.0)
        first = started(f, result.id)[0]
        f.worker_of(first["pid"]).kill()
        started(f, result.id, 2, 30)
        assert result.get(timeout=30)["attempt"] == 2
        time.sleep(1.5)  # the last events reach Flower
    finally:
        stop.set()
        poller.join(10)
        log.stop()
    try:
        # Then Flower answered 200 throughout, and shows the task as Celery's state says
        assert polls and all(status == 200 for status, _ in polls), [p for p in polls if p[0] != 200][:3]
        status, body = flower.get("/api/tasks")
        assert status == 200 and json.loads(body)[result.id]["state"] == "SUCCESS"
        status, body = flower.get(f"/api/task/info/{result.id}")
        assert status == 200, body
        info = json.loads(body)
        assert info["state"] == "SUCCESS" and info["worker"] != first["pid"]
        # and celery.events.state.State, fed every event, never took an audit event for a state
        state = State()
        seen_states = []
        for event in log.events:
            state.event(dict(event))
            task = state.tasks.get(result.id)
            if task is not None:
                seen_states.append(task.state)
                assert task.worker is None or hasattr(task.worker, "hostname")
        assert seen_states and not any(s.startswith("AAA") for s in seen_states), seen_states
        assert state.tasks[result.id].state == "SUCCESS"
        # and the attempt number after the takeover is visible in the event stream
        attempts = [e["aaa_attempt"] for e in log.of(result.id) if e["type"] == "aaa-tool-started"]
        assert attempts == [1, 2]
    finally:
        flower.stop()
        if any(status != 200 for status, _ in polls):
            print(flower.log.read_text()[-5000:])
