"""The Django integration on the example project (embedded engine), through Django's test client.

Django's settings are the example's ``proj.settings``, set up in this module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import wait

django = pytest.importorskip("django")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django_project"


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    sys.path.insert(0, str(EXAMPLE))
    before = os.environ.get("DJANGO_SETTINGS_MODULE")
    os.environ["DJANGO_SETTINGS_MODULE"] = "proj.settings"
    django.setup()
    # loaded now; celery worker subprocesses of other tests must not see a Django project
    if before is None:
        del os.environ["DJANGO_SETTINGS_MODULE"]
    else:
        os.environ["DJANGO_SETTINGS_MODULE"] = before
    from django.test import Client

    from aaa_celery.contrib.django import close_runs

    try:
        yield Client()
    finally:
        close_runs()
        sys.path.remove(str(EXAMPLE))



def test_the_shop_view_starts_a_run_and_approving_it_completes_the_run(client: Any):
    # Given a customer's request, which the shop's view turns into a run
    r = client.post("/refunds/A-100", {"customer": "acme"})
    assert r.status_code == 201, r.content
    run_id = r.json()["run_id"]

    # When the cancellation waits for a person, the approvals endpoint lists it
    [pending] = wait(lambda: client.get("/aaa/approvals").json()["approvals"])
    assert (pending["tool"], pending["arguments"], pending["run_id"]) == (
        "cancel_order", {"order_id": "A-100"}, run_id)
    assert "Approve" in client.get(f"/aaa/runs/{run_id}").content.decode()
    # and a person approves it through the shop's view
    r = client.post(f"/refunds/{run_id}/approve/{pending['call_id']}", {"digest": pending["digest"]})
    assert r.status_code == 200, r.content

    # Then the run completes with both facts
    run = wait(lambda: (x := client.get(f"/aaa/runs/{run_id}/events").json())["result"] and x)
    assert run["status"] == "completed"
    assert run["result"]["value"]["text"] == "A-100 is not shipped yet; cancelled A-100 for acme"
    calls = {c["name"]: c for c in client.get(f"/aaa/runs/{run_id}/attempts").json()["calls"]}
    assert [e["type"] for e in calls["cancel_order"]["trail"]] == ["aaa.tool.started", "aaa.tool.completed"]


def test_the_contrib_endpoints_start_a_run_and_deny_it(client: Any):
    r = client.post("/aaa/runs", {"task": "cancel order B-7"}, content_type="application/json")
    assert r.status_code == 201
    run_id = r.json()["run_id"]
    [pending] = wait(lambda: client.get(f"/aaa/runs/{run_id}/events").json()["pending"])
    r = client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}", {"decision": "deny", "reason": "shipped",
                                                                             "digest": pending["digest"]},
                    content_type="application/json")
    assert r.status_code == 200
    run = wait(lambda: (x := client.get(f"/aaa/runs/{run_id}/events").json())["result"] and x)
    assert run["result"]["value"]["text"].endswith("ApprovalDenied: denied by a person: shipped")
    assert client.get("/aaa/runs/run_nope/events").status_code == 404
    assert client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                       {"decision": "approve", "digest": pending["digest"]},
                       content_type="application/json").status_code == 404
    assert "Start a run" in client.get("/aaa/").content.decode()


def test_the_project_celery_app_reads_celery_settings_and_binds_the_tools(client: Any):
    from proj.celery import app

    assert app.conf.aaa_store_url == app.conf.broker_url
    assert "aaa.tool.cancel_order" in app.tasks
    assert app.amqp.router.route({}, "aaa.tool.cancel_order")["queue"].name == "aaa.default"
