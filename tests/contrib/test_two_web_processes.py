"""Two web processes share runs and approvals through one Redis store (issue 15's acceptance).

(The Django case: Django's test client, in this process, decides a run that Flask process A
drives: :func:`test_django_approves_a_run_that_another_process_drives`.)

Each web process is a real Flask app under werkzeug's WSGI server on its own port
(``tests/contrib/two_web_app.py``), both on one Redis (broker, result backend, store) and one
``celery worker``. A run started on A waits for a person; a person approves it on B, in headless
Chromium; the run completes on A. Then A is ``kill -9``ed in the middle of a long tool call; B
(``auto_resume``) resumes the run once A's run lease lapsed. The long call's body ran once, and
the model's recorded turns were not requested again: the model counts its requests.

Reproduces on 88103e7: B knew nothing of A's runs (``/approvals`` empty, the approval 404), and
A's death lost its run.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aaa_celery.testing.faults import stop_process

from ..runtime.fleet import ROOT, Worker
from .test_browser import TIMEOUT_S, browser  # noqa: F401 - the headless Chromium fixture

pytestmark = [pytest.mark.redis, pytest.mark.timeout(240)]


class Web:
    """One web process: ``python -m tests.contrib.two_web_app``, stopped by its PID."""

    def __init__(self, name: str, env: dict[str, str], tmp: Path) -> None:
        self.name, port_file = name, tmp / f"{name}.port"
        self.log = tmp / f"{name}.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.contrib.two_web_app", str(port_file)],
                                         cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert self.proc.poll() is None, f"{name} exited:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{name} did not start:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text()}/aaa"
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> Any:
        with self.opener.open(self.url + path, timeout=15) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        token = self.get("/csrf")["csrf_token"]
        request = urllib.request.Request(self.url + path, json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", "X-CSRFToken": token})
        with self.opener.open(request, timeout=15) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        stop_process(self.proc)


def wait(check: Any, what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, ValueError):
            value = check()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not true after {timeout_s} s")
        time.sleep(0.1)


@pytest.fixture
def env(redis_url: str, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("AAA_TWO_WEB_REDIS", redis_url)  # this process reads the ledger there too
    return {**os.environ, "AAA_TWO_WEB_REDIS": redis_url, "AAA_TWO_WEB_LONG_S": "6",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def fleet_app() -> Any:
    """``two_web_app`` with its Celery app on this test's Redis (made on first use)."""
    from . import two_web_app

    if two_web_app.app is None:
        two_web_app.app = two_web_app.make_app(os.environ[two_web_app.ENV])
    return two_web_app


@pytest.fixture
def fleet(env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, Any]]:
    started: list[Any] = []
    try:
        worker = Worker("two-web", ["aaa.default"], 4, env, tmp_path, app="tests.contrib.two_web_app")
        started.append(worker)
        worker.wait_ready()
        a, b = Web("web-a", env, tmp_path), Web("web-b", env, tmp_path)
        started += [a, b]
        yield {"a": a, "b": b, "worker": worker}
    except BaseException:
        for path in sorted(tmp_path.glob("*.log")):
            print(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}")
        raise
    finally:
        for proc in reversed(started):
            proc.stop()


def test_two_flask_processes_share_runs_approvals_and_resume(fleet: dict[str, Any], browser: Any, env):  # noqa: F811
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    app = fleet_app()
    a, b = fleet["a"], fleet["b"]
    until = WebDriverWait(browser, TIMEOUT_S, poll_frequency=0.1,
                          ignored_exceptions=[StaleElementReferenceException]).until

    # Given a run started on A that waits for a person
    run_id = a.post("/runs", {"task": "refund A-100", "tenant": "acme"})["run_id"]
    # B lists the approval (from the store), and a person approves it there, in a browser
    [pending] = wait(lambda: b.get("/approvals")["approvals"], "B lists the approval")
    assert (pending["run_id"], pending["tool"], pending["arguments"]) == (run_id, "refund",
                                                                          {"order": "A-100", "amount": 30})
    browser.get(f"{b.url}/runs/{run_id}")
    until(ec.text_to_be_present_in_element((By.ID, "status"), "waiting"))

    def click_approve(driver: Any) -> bool:
        driver.find_element(By.CSS_SELECTOR, "#pending .approve").click()
        return True

    until(click_approve)
    # Then the run completes on A (A drove it throughout: not resumed), and B shows it completed
    done = wait(lambda: (r := a.get(f"/runs/{run_id}/events"))["status"] == "completed" and r, "A ends the run")
    assert done["result"]["value"]["text"] == "order A-100: paid 30 EUR | refunded 30 EUR on A-100"
    assert done["resumed"] == 0 and "aaa.approval.granted" in [e["type"] for e in done["events"]]
    until(ec.text_to_be_present_in_element((By.ID, "status"), "completed"))
    assert [e["tool"] for e in app.read(app.LEDGER)].count("refund") == 1

    # Given a second run on A, in the middle of its long call, when A is kill -9ed
    run_id = a.post("/runs", {"task": "report A-200", "tenant": "acme"})["run_id"]
    wait(lambda: [e for e in app.read(app.LEDGER) if e.get("event") == "start"], "the long call runs", 60)
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait(10)
    # Then B resumes it (its run lease lapsed: 2 s) and ends it
    done = wait(lambda: (r := b.get(f"/runs/{run_id}/events"))["status"] == "completed" and r,
                "B resumes and ends the run", 90)
    assert done["result"]["value"]["text"] == "order A-200: paid 30 EUR | report on A-200"
    assert done["resumed"] == 1
    types = [e["type"] for e in done["events"]]
    assert types.count("aaa.run.resumed") == 1 and types.count("aaa.llm.replayed") == 2
    # the long call's body ran once
    report = [e for e in app.read(app.LEDGER) if e["tool"] == "long_report"]
    assert [e["event"] for e in report] == ["start", "end"]
    # and the model's recorded turns were not requested again: turns 0 and 1 from A, turn 2 from B
    asked = [(m["turn"], m["pid"]) for m in app.read(app.MODEL) if m["task"] == "report A-200"]
    assert asked == [(0, a.proc.pid), (1, a.proc.pid), (2, b.proc.pid)]
    # B's page shows the run resumed
    browser.get(f"{b.url}/runs/{run_id}")
    until(ec.text_to_be_present_in_element((By.ID, "status"), "completed (resumed 1x)"))


@pytest.fixture
def django_client() -> Iterator[Any]:
    """Django's test client on the example project (this process), its AAA_CELERY set to drive
    the same fleet and store as the Flask processes."""
    pytest.importorskip("django")
    from .test_django import EXAMPLE, setup_example

    setup_example()
    from django.test import Client, override_settings

    from aaa_celery.contrib.django import close_runs

    app = fleet_app()
    close_runs()
    settings = {"APP": app.app, "TOOLS": app.new_handler(), "LLM": app.llm, "ALLOW_ANONYMOUS": True}
    try:
        with override_settings(AAA_CELERY=settings):
            yield Client()
            close_runs()
    finally:
        close_runs()
        sys.path.remove(str(EXAMPLE))


def test_django_approves_a_run_that_another_process_drives(env, fleet: dict[str, Any], request):
    """Django (its test client, in this process) lists and approves a run that web process A drives."""
    client = request.getfixturevalue("django_client")
    a = fleet["a"]
    run_id = a.post("/runs", {"task": "refund A-300", "tenant": "acme"})["run_id"]
    [pending] = wait(lambda: client.get("/aaa/approvals").json()["approvals"], "Django lists A's approval")
    assert (pending["run_id"], pending["arguments"]) == (run_id, {"order": "A-300", "amount": 30})
    seen = client.get(f"/aaa/runs/{run_id}/events").json()
    assert seen["status"] == "waiting" and seen["resumed"] == 0
    r = client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                    {"decision": "approve", "digest": pending["digest"]}, content_type="application/json")
    assert r.status_code == 200, r.content
    done = wait(lambda: (x := a.get(f"/runs/{run_id}/events"))["status"] == "completed" and x, "A ends the run")
    assert done["result"]["value"]["text"] == "order A-300: paid 30 EUR | refunded 30 EUR on A-300"
    assert client.get(f"/aaa/runs/{run_id}/events").json()["status"] == "completed"
    r = client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                    {"decision": "approve", "digest": pending["digest"]}, content_type="application/json")
    assert r.status_code in (404, 409), r.content  # decided once
