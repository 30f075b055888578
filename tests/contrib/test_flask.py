"""The Flask integration through Flask's test client, on the example app (embedded engine)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import wait

flask = pytest.importorskip("flask")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flask_app"


@pytest.fixture
def client() -> Iterator[Any]:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from app import aaa, create_app  # the example app

        app = create_app(TESTING=True, AAA_CELERY_APP=None)
        try:
            yield app.test_client()
        finally:
            aaa.close(app)
    finally:
        sys.path.remove(str(EXAMPLE))



def test_start_a_run_approve_through_the_endpoint_and_see_the_result(client: Any):
    # Given a run started through the endpoint
    r = client.post("/aaa/runs", json={"task": "refund order A-100", "tenant": "acme"})
    assert r.status_code == 201
    run_id = r.get_json()["run_id"]

    # When the refund waits for a person, it is listed with its tool, arguments, run and age
    [pending] = wait(lambda: client.get("/aaa/approvals").get_json()["approvals"])
    assert (pending["tool"], pending["arguments"], pending["run_id"]) == (
        "refund", {"order_id": "A-100", "amount": 30}, run_id)
    assert client.get(f"/aaa/runs/{run_id}/events").get_json()["status"] == "waiting"
    page = client.get(f"/aaa/runs/{run_id}").get_data(as_text=True)
    assert "Approve" in page and "Deny" in page and run_id in page
    # nothing of the refund was sent: its call has no attempt yet
    calls = {c["name"]: c for c in client.get(f"/aaa/runs/{run_id}/attempts").get_json()["calls"]}
    assert calls["refund"]["trail"] == [] and [e["type"] for e in calls["lookup_order"]["trail"]] == [
        "aaa.tool.started", "aaa.tool.completed"]

    # a decision about something else than was shown is refused
    bad = client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                      json={"decision": "approve", "digest": "0" * 32})
    assert bad.status_code == 409
    # and a person approves what was shown
    ok = client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                     json={"decision": "approve", "digest": pending["digest"]})
    assert ok.status_code == 200

    # Then the run completes with the refund's result
    run = wait(lambda: (x := client.get(f"/aaa/runs/{run_id}/events").get_json())["result"] and x)
    assert run["status"] == "completed" and run["tenant"] == "acme"
    assert run["result"]["value"]["text"].startswith("refunded 30 EUR on A-100 (key refund:A-100)")
    types = [e["type"] for e in run["events"]]
    assert types.index("aaa.approval.granted") < types.index("aaa.run.completed")
    calls = {c["name"]: c for c in client.get(f"/aaa/runs/{run_id}/attempts").get_json()["calls"]}
    assert [e["type"] for e in calls["refund"]["trail"]] == ["aaa.tool.started", "aaa.tool.completed"]
    assert calls["refund"]["trail"][0]["attempt"] == 1
    # events are pollable incrementally
    after = client.get(f"/aaa/runs/{run_id}/events?after={len(types) - 1}").get_json()["events"]
    assert [e["type"] for e in after] == ["aaa.run.completed"]


def test_deny_through_a_form_post_and_the_html_pages(client: Any):
    r = client.post("/aaa/runs", data={"task": "refund order A-200"})
    assert r.status_code == 303
    run_id = r.headers["Location"].rstrip("/").rsplit("/", 1)[1]
    assert "Start a run" in client.get("/aaa/").get_data(as_text=True)
    [pending] = wait(lambda: client.get(f"/aaa/runs/{run_id}/events").get_json()["pending"])
    r = client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}", data={"decision": "deny", "reason": "no",
                                                                           "digest": pending["digest"]})
    assert r.status_code == 303
    run = wait(lambda: (x := client.get(f"/aaa/runs/{run_id}/events").get_json())["result"] and x)
    assert run["result"]["value"]["text"] == "ApprovalDenied: denied by a person: no"
    # deciding again, or on an unknown run, is an error
    again = client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                        json={"decision": "approve", "digest": pending["digest"]})
    assert again.status_code == 404
    assert client.get("/aaa/runs/run_nope/events").status_code == 404
    assert client.post("/aaa/runs", json={}).status_code == 400
    assert [x["run_id"] for x in client.get("/aaa/runs").get_json()["runs"]] == [run_id]


@pytest.mark.redis
@pytest.mark.fleet
def test_the_example_against_a_redis_fleet_when_configured(redis_server: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    import redis

    from tests.runtime.fleet import Worker

    url = redis_server.url.rsplit("/", 1)[0] + "/8"
    redis.Redis.from_url(url).flushdb()
    monkeypatch.setenv("AAA_REDIS_URL", url)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    worker = Worker("flask-example", ["aaa.default"], 2, {"AAA_REDIS_URL": url}, tmp_path, app="worker", cwd=EXAMPLE)
    try:
        worker.wait_ready()
        from app import aaa, create_app

        app = create_app(TESTING=True)  # AAA_CELERY_APP = "worker:app", from the env var
        client = app.test_client()
        try:
            with app.app_context():
                assert not aaa.runs.engine.engine.embedded
            run_id = client.post("/aaa/runs", json={"task": "refund order A-200"}).get_json()["run_id"]
            [pending] = wait(lambda: client.get("/aaa/approvals").get_json()["approvals"], 30)
            assert pending["arguments"] == {"order_id": "A-200", "amount": 125}
            client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                        json={"decision": "approve", "digest": pending["digest"]})
            run = wait(lambda: (x := client.get(f"/aaa/runs/{run_id}/events").get_json())["result"] and x, 30)
            assert run["result"]["value"]["text"].startswith("refunded 125 EUR on A-200")
            calls = {c["name"]: c for c in client.get(f"/aaa/runs/{run_id}/attempts").get_json()["calls"]}
            started = calls["refund"]["trail"][0]
            assert started["type"] == "aaa.tool.started" and "flask-example@localhost" in started["data"]["worker"]
        finally:
            aaa.close(app)
    except BaseException:
        print(worker.log[-5000:])
        raise
    finally:
        worker.stop()


def test_the_authorize_hook_guards_each_action():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from app import aaa, create_app

        app = create_app(TESTING=True, AAA_CELERY_APP=None,
                         AAA_CELERY_AUTHORIZE=lambda request, action: action != "decide" or
                         request.headers.get("X-Staff") == "yes")
        client = app.test_client()
        try:
            run_id = client.post("/aaa/runs", json={"task": "refund order A-100"}).get_json()["run_id"]
            [pending] = wait(lambda: client.get("/aaa/approvals").get_json()["approvals"])
            url = f"/aaa/runs/{run_id}/approvals/{pending['call_id']}"
            decision = {"decision": "approve", "digest": pending["digest"]}
            assert client.post(url, json=decision).status_code == 403
            assert client.get("/aaa/approvals").get_json()["approvals"] == [pending]  # still waiting
            assert client.post(url, json=decision, headers={"X-Staff": "yes"}).status_code == 200
        finally:
            aaa.close(app)
    finally:
        sys.path.remove(str(EXAMPLE))
