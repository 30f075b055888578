"""The Flask integration through Flask's test client, on the example app (embedded engine).

Every POST carries the session's CSRF token (``GET /aaa/csrf``), as the pages do.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .conftest import wait

flask = pytest.importorskip("flask")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flask_app"


@contextmanager
def example(**config: Any) -> Iterator[Any]:
    """The example app (embedded engine) with ``config`` on top; its engine stops at the end."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        from app import aaa, create_app  # the example app

        app = create_app(TESTING=True, **{"AAA_CELERY_APP": None, **config})
        try:
            yield app
        finally:
            aaa.close(app)
    finally:
        sys.path.remove(str(EXAMPLE))


def with_csrf(client: Any) -> Any:
    """The client, sending this session's CSRF token with every POST (as the pages' script does)."""
    token = client.get("/aaa/csrf").get_json()["csrf_token"]
    client.environ_base["HTTP_X_CSRFTOKEN"] = token
    return client


@pytest.fixture
def client() -> Iterator[Any]:
    with example() as app:
        yield with_csrf(app.test_client())



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
    assert 'data-page="run"' in page and f'content="{run_id}"' in page  # aaa.js draws Approve/Deny
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
    r = client.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                    data={"decision": "deny", "reason": "no", "digest": pending["digest"]})
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
        client = with_csrf(app.test_client())
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


def test_the_authorize_hook_sees_the_run_and_the_call_and_guards_each_route():
    def authorize(request: Any, run: Any, call: Any) -> bool:
        tenant = request.headers.get("X-Tenant")
        if run is not None and run.tenant != tenant:
            return False  # another tenant's run: not even seen
        return call is None or request.headers.get("X-Staff") == "yes"  # deciding: staff only

    with example(AAA_CELERY_AUTHORIZE=authorize) as app:
        client = with_csrf(app.test_client())
        acme = {"X-Tenant": "acme"}
        run_id = client.post("/aaa/runs", json={"task": "refund order A-100", "tenant": "acme"},
                             headers=acme).get_json()["run_id"]
        [pending] = wait(lambda: client.get("/aaa/approvals", headers=acme).get_json()["approvals"])
        assert pending["tenant"] == "acme"
        url = f"/aaa/runs/{run_id}/approvals/{pending['call_id']}"
        decision = {"decision": "approve", "digest": pending["digest"]}
        # another tenant sees nothing of acme's run, and cannot decide its call, staff or not
        umbrella = {"X-Tenant": "umbrella", "X-Staff": "yes"}
        assert client.get("/aaa/approvals", headers=umbrella).get_json()["approvals"] == []
        assert client.get("/aaa/runs", headers=umbrella).get_json()["runs"] == []
        for path in (f"/aaa/runs/{run_id}", f"/aaa/runs/{run_id}/events", f"/aaa/runs/{run_id}/attempts"):
            assert client.get(path, headers=umbrella).status_code == 403, path
        assert client.post(url, json=decision, headers=umbrella).status_code == 403
        # acme, not staff: sees the call, cannot decide it
        r = client.post(url, json=decision, headers=acme)
        assert r.status_code == 403 and "AUTHORIZE" in r.get_json()["error"]
        assert client.get("/aaa/approvals", headers=acme).get_json()["approvals"] == [pending]  # still waiting
        # acme's staff decides
        assert client.post(url, json=decision, headers={**acme, "X-Staff": "yes"}).status_code == 200
        run = wait(lambda: (x := client.get(f"/aaa/runs/{run_id}/events", headers=acme).get_json())["result"] and x)
        assert run["result"]["value"]["text"].startswith("refunded 30 EUR")


def test_without_an_authorize_hook_the_routes_refuse_to_serve_unless_anonymous_is_opted_in(
        caplog: pytest.LogCaptureFixture):
    """Reproduces on 4a34578: with no hook, anyone who reached /aaa/ could approve, and nothing warned."""
    from aaa_celery.errors import ConfigError

    with pytest.raises(ConfigError, match="AUTHORIZE.*ALLOW_ANONYMOUS"), example(AAA_CELERY_AUTHORIZE=None):
        pass
    # the hook of older releases, (request, action), is refused by name
    with pytest.raises(ConfigError, match=r"\(request, run, call\)"), \
            example(AAA_CELERY_AUTHORIZE=lambda request, action: True):
        pass
    with pytest.raises(ConfigError, match="SECRET_KEY"), example(SECRET_KEY=None):
        pass
    with pytest.raises(ConfigError, match="APPROVAL_TTL_S"), example(AAA_CELERY_APPROVAL_TTL_S=-1):
        pass
    # development: an explicit opt-in serves everyone, with a warning in the log
    with caplog.at_level("WARNING", logger="aaa_celery.contrib"), \
            example(AAA_CELERY_AUTHORIZE=None, AAA_CELERY_ALLOW_ANONYMOUS=True) as app:
        assert app.test_client().get("/aaa/approvals").status_code == 200
    assert "ALLOW_ANONYMOUS" in caplog.text and "anyone" in caplog.text


def test_approve_and_deny_refuse_a_post_without_this_sessions_csrf_token(client: Any):
    """Reproduces on 4a34578: a cross-site form POST (no token) approved the call."""
    run_id = client.post("/aaa/runs", json={"task": "refund order A-100"}).get_json()["run_id"]
    [pending] = wait(lambda: client.get("/aaa/approvals").get_json()["approvals"])
    url = f"/aaa/runs/{run_id}/approvals/{pending['call_id']}"
    form = {"decision": "approve", "digest": pending["digest"]}
    # a form on another site posts with the person's cookie but cannot read the token
    del client.environ_base["HTTP_X_CSRFTOKEN"]
    for attempt in ({}, {"csrf_token": "forged"}, {"csrf_token": ""}):
        r = client.post(url, data={**form, **attempt}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and "CSRF" in r.get_json()["error"], attempt
    assert client.post("/aaa/runs", data={"task": "refund order A-200"}).status_code == 403
    # another session's token is not this session's
    other = with_csrf(client.application.test_client())
    r = client.post(url, json=form, headers={"X-CSRFToken": other.environ_base["HTTP_X_CSRFTOKEN"]})
    assert r.status_code == 403
    assert client.get("/aaa/approvals").get_json()["approvals"] == [pending]  # still waiting
    # the page's own form field works
    token = client.get("/aaa/csrf").get_json()["csrf_token"]
    assert client.post(url, data={**form, "csrf_token": token}).status_code == 303


def test_the_digest_is_mandatory_on_the_route(client: Any):
    run_id = client.post("/aaa/runs", json={"task": "refund order A-100"}).get_json()["run_id"]
    [pending] = wait(lambda: client.get("/aaa/approvals").get_json()["approvals"])
    url = f"/aaa/runs/{run_id}/approvals/{pending['call_id']}"
    for decision in ("approve", "deny"):
        r = client.post(url, json={"decision": decision})
        assert r.status_code == 409 and "digest" in r.get_json()["error"]
    assert client.get("/aaa/approvals").get_json()["approvals"] == [pending]


def test_the_pages_have_no_inline_script_and_a_policy_that_forbids_it(client: Any):
    import re

    run_id = client.post("/aaa/runs", json={"task": "refund order A-100"}).get_json()["run_id"]
    for path in ("/aaa/", f"/aaa/runs/{run_id}", "/aaa/approvals", "/aaa/static/aaa.js"):
        r = client.get(path)
        assert r.status_code == 200, path
        policy = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy, path
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    for path in ("/aaa/", f"/aaa/runs/{run_id}"):
        html = client.get(path).get_data(as_text=True)
        scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.DOTALL | re.IGNORECASE)
        assert scripts and all(body.strip() == "" for body in scripts), path  # src only
        assert not re.search(r"\son\w+\s*=", html, re.IGNORECASE), path  # no inline handlers
    js = client.get("/aaa/static/aaa.js")
    assert js.content_type.startswith("text/javascript")
    source = js.get_data(as_text=True)
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "onclick"):
        assert sink not in source.replace("no innerHTML", ""), sink
    assert client.get("/aaa/static/other.js").status_code == 404


EXITS_WITHOUT_CLOSING = """
import sys
sys.path.insert(0, sys.argv[1])
from app import create_app
create_app(TESTING=True, AAA_CELERY_APP=None)
print("created")
"""


def test_an_app_created_and_never_closed_stops_its_engine_quietly_at_exit():
    """Reproduces on 4156db8: the engine stopped by ``atexit`` asked ``asyncio.to_thread``
    for a thread after the interpreter's shutdown had begun, and the exit printed
    ``RuntimeError: cannot schedule new futures after interpreter shutdown``."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", EXITS_WITHOUT_CLOSING, str(EXAMPLE)], cwd=root,
                          capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0 and "created" in done.stdout, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr


def tenant_hooks() -> tuple[Any, Any]:
    """An AUTHORIZE that keeps tenants apart and a TENANT that says whose the person is
    (both read the X-Tenant header, standing in for the app's authentication)."""
    def authorize(request: Any, run: Any, call: Any) -> bool:
        return run is None or run.tenant == request.headers.get("X-Tenant")

    def tenant(request: Any) -> str | None:
        return request.headers.get("X-Tenant")

    return authorize, tenant


def test_a_person_cannot_start_a_run_in_another_tenant():
    """Reproduces on c79799f (issue 21, item 3): ``POST /aaa/runs`` took the tenant from the
    body and asked AUTHORIZE with ``run=None``, so a person of tenant a started a run in
    tenant b (b's approver saw it, its tools spent b's budgets). Now the tenant is the app's
    (``TENANT(request)``) and a body that names another one is refused with 403."""
    authorize, tenant = tenant_hooks()
    with example(AAA_CELERY_AUTHORIZE=authorize, AAA_CELERY_TENANT=tenant) as app:
        client = with_csrf(app.test_client())
        a, b = {"X-Tenant": "a"}, {"X-Tenant": "b"}
        # a person of tenant a names tenant b: refused, as JSON and as the page's form
        r = client.post("/aaa/runs", json={"task": "refund order A-100", "tenant": "b"}, headers=a)
        assert r.status_code == 403 and "TENANT" in r.get_json()["error"], r.get_json()
        r = client.post("/aaa/runs", data={"task": "refund order A-100", "tenant": "b",
                                           "csrf_token": client.environ_base["HTTP_X_CSRFTOKEN"]}, headers=a)
        assert r.status_code == 403
        assert client.get("/aaa/runs", headers=b).get_json()["runs"] == []
        assert app.extensions["aaa_celery"].engine.runs() == []
        # naming none, or their own, starts the run in their tenant
        for body in ({"task": "refund order A-100"}, {"task": "refund order A-101", "tenant": "a"}):
            r = client.post("/aaa/runs", json=body, headers=a)
            assert r.status_code == 201, r.get_json()
        assert {x["tenant"] for x in client.get("/aaa/runs", headers=a).get_json()["runs"]} == {"a"}
    # without a TENANT hook, a run has no tenant, and a body that names one is refused
    with example(AAA_CELERY_AUTHORIZE=authorize) as app:
        client = with_csrf(app.test_client())
        r = client.post("/aaa/runs", json={"task": "refund order A-100", "tenant": "b"}, headers=a)
        assert r.status_code == 403 and "TENANT" in r.get_json()["error"]
    # a TENANT of the wrong shape fails at init_app, naming the setting
    from aaa_celery.errors import ConfigError

    with pytest.raises(ConfigError, match=r"TENANT .* must take \(request\)"), \
            example(AAA_CELERY_AUTHORIZE=authorize, AAA_CELERY_TENANT=lambda: "a"):
        pass


def test_request_limits_a_bounded_start_and_paginated_approvals_with_an_etag():
    """Reproduces on c79799f (issue 21, item 9): a 20 MiB task was accepted (201) and stored;
    ``/approvals`` answered every pending call at once, and the page polled all of it every
    second."""
    with example(AAA_CELERY_MAX_BODY_BYTES=4096) as app:
        client = with_csrf(app.test_client())
        # Given a start whose body is beyond the bound: 413, nothing started
        r = client.post("/aaa/runs", json={"task": "x" * (20 * 1024 * 1024)})
        assert r.status_code == 413, r.status_code
        assert "4096" in r.get_json()["error"]
        assert app.extensions["aaa_celery"].engine.runs() == []
        # Given five refunds waiting for a person
        for n in range(5):
            assert client.post("/aaa/runs", json={"task": "refund order A-100"}).status_code == 201
        every = wait(lambda: (x := client.get("/aaa/approvals").get_json()["approvals"]) and len(x) == 5 and x)
        # When they are read two at a time, following the cursor, Then each comes once, in order
        seen, url = [], "/aaa/approvals?limit=2"
        while url:
            page = client.get(url).get_json()
            assert len(page["approvals"]) <= 2
            seen += page["approvals"]
            url = f"/aaa/approvals?limit=2&after={page['next']}" if page["next"] else ""
        assert [p["call_id"] for p in seen] == [p["call_id"] for p in every]
        assert client.get("/aaa/approvals?limit=0").status_code == 400
        assert client.get("/aaa/approvals?after=not-a-cursor").status_code == 400
        # and a poll that finds nothing new costs a 304, no body
        r = client.get("/aaa/approvals")
        assert r.headers["ETag"] and "no-cache" in r.headers["Cache-Control"]
        again = client.get("/aaa/approvals", headers={"If-None-Match": r.headers["ETag"]})
        assert again.status_code == 304 and again.get_data() == b""


def test_the_approvals_poll_reads_only_the_requesting_tenants_runs():
    """Reproduces on 03c27cd (issue 35, suspicion 4a): ``GET /approvals`` read every active run
    of every tenant on each poll (and one run record per pending call to ask AUTHORIZE), then
    kept the request's. With 10,000 waiting runs over 100 tenants, a person of one tenant must
    cost the store reads of that tenant's 100 runs, not 10,000."""
    import time as clock

    from aaa_celery.protocol import call_id as make_call_id
    from aaa_celery.stores.runs import RunRecord

    authorize, tenant = tenant_hooks()
    with example(AAA_CELERY_AUTHORIZE=authorize, AAA_CELERY_TENANT=tenant) as app:
        client = app.test_client()
        store = app.extensions["aaa_celery"].engine.engine.store
        # Given 10,000 runs waiting for a person, 100 in each of 100 tenants
        now = clock.time()
        for n in range(10_000):
            t, run_id = f"t-{n % 100}", f"run-{n}"
            call = make_call_id(t, run_id, "0.0.0123456789abcdef")
            store.put_run(RunRecord(run_id, t, algo="loop", status="waiting", started_at=now - n, updated_at=now,
                                    approvals={call: {"run_id": run_id, "call_id": call, "tool": "refund",
                                                      "arguments": {"n": n}, "since": now - n, "digest": f"d{n}",
                                                      "tenant": t, "expires_at": now + 3600, "state": "open"}}))
        # When a person of tenant t-7 polls the approvals, counting the run records the store hands back
        read = {"rows": 0}
        for verb in ("list_runs", "find_runs", "get_run"):
            real = getattr(store, verb)

            def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                found = _real(*args, **kwargs)
                read["rows"] += len(found) if isinstance(found, list) else int(found is not None)
                return found

            setattr(store, verb, counted)
        page = client.get("/aaa/approvals?limit=500", headers={"X-Tenant": "t-7"}).get_json()
        # Then they see their tenant's 100 calls, and the store handed back their 100 runs (and
        # at most one more read of each), not the other tenants' 9,900
        assert len(page["approvals"]) == 100 and {p["tenant"] for p in page["approvals"]} == {"t-7"}
        assert read["rows"] <= 2 * 100, read
