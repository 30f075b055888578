"""django.tasks on a real fleet (issue 37): two prefork workers, a Redis broker, PostgreSQL for
the guard's store and Django's database. The web side runs in processes of its own
(``client.py``), through the public django.tasks API only; holders die by kill -9.

Each test runs twice: on Django 5.2 with the ``django-tasks`` backport (this interpreter), and
on Django 6.1's own ``django.tasks``, web and workers in a venv of a newer Python
(``django6.py``), wherever the machine has one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aaa_celery.testing import Fleet, Ledger, wait_for
from tests.fleet_apps import started

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.fleet]

ROOT = Path(__file__).resolve().parents[2]


class Web:
    """The web process's side: each call a fresh ``client.py`` process running its operations,
    in ``python`` (this interpreter, or the Django 6.1 venv's)."""

    def __init__(self, env: dict[str, str], python: str = sys.executable) -> None:
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        self.python = python

    def run(self, cmds: list[dict[str, Any]], check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.python, "-m", "tests.django_tasks.client", json.dumps(cmds)], cwd=ROOT,
                              env=self.env, capture_output=True, text=True, timeout=180)
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def __call__(self, *cmds: dict[str, Any]) -> list[dict[str, Any]]:
        return json.loads(self.run(list(cmds)).stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    def module(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.python, "-m", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=120)


def enqueue(task: str, *args: Any, **more: Any) -> dict[str, Any]:
    return {"op": "enqueue", "task": task, "args": list(args), **more}


def wait(task: str, call_id: str = "$0", timeout: float = 60) -> dict[str, Any]:
    return {"op": "wait", "task": task, "id": call_id, "timeout": timeout}


@pytest.fixture(scope="module", params=["django-5.2", "django-6.1"])
def web(request: pytest.FixtureRequest, postgres_server: Any, redis_server: Any) -> Web:
    """One Django project for each Django of the module: its tables made by ``manage.py migrate``."""
    from tests.conftest import _redis_client, clean_postgres

    python = sys.executable if request.param == "django-5.2" else str(request.getfixturevalue("django6_python"))

    clean_postgres(postgres_server.url)
    client = _redis_client(redis_server.url)
    client.flushdb()
    client.close()
    engine = sa.create_engine(postgres_server.url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS django_migrations"))
    engine.dispose()
    w = Web({"AAA_DT_PG": postgres_server.url.replace("+psycopg", ""), "AAA_DT_STORE": postgres_server.url,
             "AAA_DT_BROKER": redis_server.url, "DJANGO_SETTINGS_MODULE": "tests.django_tasks.settings"}, python)
    version = subprocess.run([python, "-c", "import django; print(django.get_version())"], capture_output=True,
                             text=True, env=w.env, cwd=ROOT)
    print(f"the django.tasks fleet on Django {version.stdout.strip()} with {python}")
    assert version.stdout.startswith(request.param.removeprefix("django-")), version
    done = w.module("django", "migrate", "-v", "0")
    assert done.returncode == 0, done.stderr
    return w


@pytest.fixture(scope="module")
def fleet(web: Web, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two prefork workers for the module; a test that kills one adds another."""
    env = {k: v for k, v in web.env.items() if k.startswith(("AAA_DT_", "DJANGO_"))}
    python = None if web.python == sys.executable else web.python  # the venv's workers: its own packages
    with started(Fleet("tests.django_tasks.celery_app", size=2, env=env, cwd=ROOT, python=python,
                       workdir=tmp_path_factory.mktemp("django-tasks-fleet"))) as f:
        f.ledger = Ledger(redis_server.url)  # type: ignore[attr-defined]
        yield f


def kill_holder(f: Any, call_id: str) -> None:
    """kill -9 the worker running attempt 1 of ``call_id``, and start another in its place."""
    first = wait_for(lambda: starts(f, call_id), 60, "attempt 1's start")[0]
    f.worker_of(first["pid"]).kill()
    f.add()


def starts(f: Any, call_id: str) -> list[dict[str, Any]]:
    return f.ledger.entries(call_id, "start")  # type: ignore[no-any-return]


def test_enqueue_then_get_result_is_successful_with_one_attempt(fleet, web):
    queued, done = web(enqueue("refund", "A-100"), wait("refund"))
    assert queued["status"] == "READY" and queued["attempts"] == 0
    assert done["status"] == "SUCCESSFUL", done
    assert done["return_value"] == {"order_id": "A-100", "refunded": True, "attempt": 1}
    assert done["attempts"] == 1 and len(done["worker_ids"]) == 1
    assert done["enqueued_at"] <= done["started_at"] <= done["finished_at"]
    assert done["last_attempted_at"] == done["started_at"]


def test_kill_9_of_the_holder_at_least_once_is_successful_with_two_attempts_and_one_effect(fleet, web):
    # Given a refund whose attempt 1 holds the call for a while
    [queued] = web(enqueue("refund", "A-100", 30.0))
    # When its worker dies by kill -9
    kill_holder(fleet, queued["id"])
    # Then attempt 2 runs elsewhere, and the result says so
    [done] = web(wait("refund", queued["id"], 90))
    assert done["status"] == "SUCCESSFUL", done
    assert done["attempts"] == 2 and len(set(done["worker_ids"])) == 2
    assert done["return_value"]["attempt"] == 2
    assert [e["attempt"] for e in fleet.ledger.entries(queued["id"], "effect")] == [2]


def test_kill_9_of_the_holder_at_most_once_fails_with_outcome_unknown_until_an_operator_resolves_it(fleet, web):
    [queued] = web(enqueue("refund_once", "A-100", 30.0))
    kill_holder(fleet, queued["id"])
    [done] = web(wait("refund_once", queued["id"], 90))
    assert done["status"] == "FAILED", done
    assert done["errors"][0][0] == "aaa_celery.errors.OutcomeUnknown"
    time.sleep(3)  # a few recovery sweeps more: still one start
    assert [e["attempt"] for e in starts(fleet, queued["id"])] == [1]
    assert fleet.ledger.entries(queued["id"], "effect") == []
    # an operator who checked the payment provider settles it: get_result follows the store
    web.module("celery", "-A", "tests.django_tasks.celery_app", "aaa", "resolve", queued["id"], "--as", "completed",
               "--note", "refund seen at the provider", "--value", '{"refunded": true}')
    [resolved] = web({"op": "get", "task": "refund_once", "id": queued["id"]})
    assert resolved["status"] == "SUCCESSFUL" and resolved["return_value"] == {"refunded": True}, resolved


def test_run_after_10_s_runs_no_earlier_and_an_async_task_runs(fleet, web):
    deferred, _, pinged, done = web(enqueue("stamp", run_after_s=10), enqueue("ping", "A"), wait("ping", "$1"),
                                    wait("stamp", "$0"))
    assert pinged["return_value"] == "pong A"
    assert done["status"] == "SUCCESSFUL", done
    # run_after is taken in the web process just before enqueue() stamps enqueued_at, so it is the bound
    assert deferred["enqueued_at"] + 9 <= deferred["run_after"] <= deferred["enqueued_at"] + 10
    assert done["return_value"] >= deferred["run_after"]
    assert done["started_at"] >= deferred["run_after"]


def test_a_failing_task_is_failed_with_its_exception_class_path_and_traceback(fleet, web):
    _, done = web(enqueue("fail", "no such order"), wait("fail"))
    assert done["status"] == "FAILED" and done["attempts"] == 1
    [(path, trace)] = done["errors"]
    assert path == "builtins.LookupError" and "no such order" in trace and "Traceback" in trace


def test_enqueue_in_atomic_rolled_back_never_runs_committed_runs_once_and_survives_a_kill_after_commit(fleet, web):
    # the web process killed right after its commit, before it could publish: the fleet sends it
    killed = web.run([enqueue("refund", "A-3", atomic="kill")], check=False)
    assert killed.returncode == -9, killed.stderr
    killed_id = json.loads(killed.stdout.splitlines()[0])["id"]
    rolled, committed, committed_done, done, missing = web(
        enqueue("refund", "A-1", atomic="rollback"), enqueue("refund", "A-2", atomic="commit"),
        wait("refund", "$1"), wait("refund", killed_id), {"op": "get", "task": "refund", "id": "$0"})
    assert committed_done["status"] == "SUCCESSFUL"
    assert done["status"] == "SUCCESSFUL", done
    assert missing == {"id": rolled["id"], "missing": True}
    assert starts(fleet, rolled["id"]) == []
    assert [e["attempt"] for e in starts(fleet, committed["id"])] == [1]
    assert [e["attempt"] for e in starts(fleet, killed_id)] == [1]
