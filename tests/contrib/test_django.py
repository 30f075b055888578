"""The Django integration on the example project (embedded engine), through Django's test client.

Django's settings are the example's ``proj.settings``, set up in this module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .conftest import wait

django = pytest.importorskip("django")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django_project"


def setup_example() -> None:
    """Set Django up on the example project's ``proj.settings`` in this process."""
    sys.path.insert(0, str(EXAMPLE))
    before = os.environ.get("DJANGO_SETTINGS_MODULE")
    os.environ["DJANGO_SETTINGS_MODULE"] = "proj.settings"
    django.setup()
    # loaded now; celery worker subprocesses of other tests must not see a Django project
    if before is None:
        del os.environ["DJANGO_SETTINGS_MODULE"]
    else:
        os.environ["DJANGO_SETTINGS_MODULE"] = before


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    setup_example()
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
    page = client.get(f"/aaa/runs/{run_id}")
    assert 'data-page="run"' in page.content.decode() and "script-src 'self'" in page["Content-Security-Policy"]
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


# -- CSRF, the authorize hook, the digest ---------------------------------------------------------

@contextmanager
def aaa_settings(**changes: Any) -> Iterator[None]:
    """``settings.AAA_CELERY`` with ``changes`` (None removes a key), on a fresh engine."""
    from django.conf import settings
    from django.test import override_settings

    from aaa_celery.contrib.django import close_runs

    values = {**settings.AAA_CELERY, **changes}
    close_runs()
    try:
        with override_settings(AAA_CELERY={k: v for k, v in values.items() if v is not None}):
            yield
    finally:
        close_runs()


def token_of(client: Any) -> str:
    """The documented way: GET /aaa/csrf gives the token and sets the CSRF cookie."""
    r = client.get("/aaa/csrf")
    assert r.status_code == 200 and "csrftoken" in r.cookies
    return str(r.json()["csrf_token"])


def test_the_documented_curl_works_and_a_post_without_the_csrf_token_is_refused(client: Any):
    """Reproduces on 4a34578: the README's ``curl -X POST /refunds/A-100`` got 403 from CSRF, with no
    documented way to get a token."""
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    # the README's steps: a token, then the POST with the token and the cookie
    token = token_of(browser)
    r = browser.post("/refunds/A-100", {"customer": "acme"}, HTTP_X_CSRFTOKEN=token)
    assert r.status_code == 201, r.content
    run_id = r.json()["run_id"]
    [pending] = wait(lambda: [p for p in browser.get("/aaa/approvals").json()["approvals"] if p["run_id"] == run_id])
    # a cross-site form post carries the cookie but not the token: refused, on both routes
    decision = {"decision": "approve", "digest": pending["digest"]}
    url = f"/aaa/runs/{run_id}/approvals/{pending['call_id']}"
    assert browser.post(url, decision).status_code == 403
    assert browser.post(url, {**decision, "csrfmiddlewaretoken": "forged" * 8}).status_code == 403
    assert browser.post(f"/refunds/{run_id}/approve/{pending['call_id']}", {"digest": pending["digest"]}
                        ).status_code == 403
    assert browser.post("/aaa/runs", {"task": "cancel order C-1"}).status_code == 403
    assert browser.get(f"/aaa/runs/{run_id}/events").json()["pending"] == [pending]
    # the page's way: JSON with the X-CSRFToken header
    r = browser.post(url, decision, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert r.status_code == 200, r.content
    run = wait(lambda: (x := browser.get(f"/aaa/runs/{run_id}/events").json())["result"] and x)
    assert run["result"]["value"]["text"] == "A-100 is not shipped yet; cancelled A-100 for acme"


def test_the_digest_is_mandatory_on_the_route_and_in_the_shops_view(client: Any):
    run_id = client.post("/refunds/A-300", {"customer": "acme"}).json()["run_id"]
    [pending] = wait(lambda: client.get(f"/aaa/runs/{run_id}/events").json()["pending"])
    url = f"/aaa/runs/{run_id}/approvals/{pending['call_id']}"
    for decision in ("approve", "deny"):
        r = client.post(url, {"decision": decision}, content_type="application/json")
        assert r.status_code == 409 and "digest" in r.json()["error"]
    assert client.post(f"/refunds/{run_id}/approve/{pending['call_id']}", {}).status_code == 409
    assert client.get(f"/aaa/runs/{run_id}/events").json()["pending"] == [pending]
    assert client.post(url, {"decision": "deny", "digest": pending["digest"]},
                       content_type="application/json").status_code == 200


def test_the_authorize_hook_sees_the_run_and_the_call(client: Any):
    def authorize(request: Any, run: Any, call: Any) -> bool:
        if run is not None and run.tenant != request.headers.get("X-Tenant"):
            return False
        return call is None or request.headers.get("X-Staff") == "yes"

    with aaa_settings(AUTHORIZE=authorize):
        acme = {"HTTP_X_TENANT": "acme"}
        run_id = client.post("/refunds/A-100", {"customer": "acme"}).json()["run_id"]
        [pending] = wait(lambda: client.get("/aaa/approvals", **acme).json()["approvals"])
        url = f"/aaa/runs/{run_id}/approvals/{pending['call_id']}"
        decision = {"decision": "approve", "digest": pending["digest"]}
        umbrella = {"HTTP_X_TENANT": "umbrella", "HTTP_X_STAFF": "yes"}
        assert client.get("/aaa/approvals", **umbrella).json()["approvals"] == []
        assert client.get(f"/aaa/runs/{run_id}", **umbrella).status_code == 403
        assert client.get(f"/aaa/runs/{run_id}/events", **umbrella).status_code == 403
        assert client.post(url, decision, content_type="application/json", **umbrella).status_code == 403
        assert client.post(url, decision, content_type="application/json", **acme).status_code == 403
        assert client.get(f"/aaa/runs/{run_id}/events", **acme).json()["pending"] == [pending]
        r = client.post(url, decision, content_type="application/json", **acme, HTTP_X_STAFF="yes")
        assert r.status_code == 200, r.content


def test_without_an_authorize_hook_the_routes_refuse_to_load_unless_anonymous_is_opted_in(
        client: Any, caplog: pytest.LogCaptureFixture):
    """Reproduces on 4a34578: with no hook, anyone who reached /aaa/ could approve, and nothing warned."""
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    from aaa_celery.contrib.django import urls

    try:
        with aaa_settings(AUTHORIZE=None), pytest.raises(ImproperlyConfigured, match="AUTHORIZE.*ALLOW_ANONYMOUS"):
            importlib.reload(urls)
        with aaa_settings(AUTHORIZE=lambda request, action: True), \
                pytest.raises(ImproperlyConfigured, match=r"\(request, run, call\)"):
            importlib.reload(urls)
        with aaa_settings(AUTHORIZE=None, ALLOW_ANONYMOUS=True), caplog.at_level("WARNING", "aaa_celery.contrib"):
            importlib.reload(urls)
            assert "ALLOW_ANONYMOUS" in caplog.text
    finally:
        importlib.reload(urls)


def test_a_bad_approval_ttl_fails_when_the_settings_are_read(client: Any):
    from django.core.exceptions import ImproperlyConfigured

    from aaa_celery.contrib.django.settings import load_settings

    with aaa_settings(APPROVAL_TTL_S=0), pytest.raises(ImproperlyConfigured, match="APPROVAL_TTL_S"):
        load_settings()
    with aaa_settings(APPROVAL_TTL_S=120):
        assert load_settings().approval_ttl_s == 120


def test_a_person_cannot_start_a_run_in_another_tenant(client: Any):
    """Reproduces on c79799f (issue 21, item 3): ``POST /aaa/runs`` took the tenant from the
    body and asked AUTHORIZE with ``run=None``, so a person of tenant a started a run in
    tenant b. Now the tenant is the app's (``TENANT(request)``), and a body that names
    another one is refused with 403."""
    def authorize(request: Any, run: Any, call: Any) -> bool:
        return run is None or run.tenant == request.headers.get("X-Tenant")

    with aaa_settings(AUTHORIZE=authorize, TENANT=lambda request: request.headers.get("X-Tenant")):
        from aaa_celery.contrib.django import get_runs

        a, b = {"HTTP_X_TENANT": "a"}, {"HTTP_X_TENANT": "b"}
        r = client.post("/aaa/runs", {"task": "cancel order B-7", "tenant": "b"}, content_type="application/json", **a)
        assert r.status_code == 403 and "TENANT" in r.json()["error"], r.content
        r = client.post("/aaa/runs", {"task": "cancel order B-7", "tenant": "b"}, **a)  # the page's form
        assert r.status_code == 403
        assert client.get("/aaa/runs", **b).json()["runs"] == [] and get_runs().engine.runs() == []
        r = client.post("/aaa/runs", {"task": "cancel order B-7"}, content_type="application/json", **a)
        assert r.status_code == 201, r.content
        assert [x["tenant"] for x in client.get("/aaa/runs", **a).json()["runs"]] == ["a"]
        # the shop's own view starts its runs in the app's tenant too, whatever the form says
        r = client.post("/refunds/A-100", {"customer": "b"}, **a)
        assert r.status_code == 403
    with aaa_settings(AUTHORIZE=authorize):  # no TENANT hook: a body that names a tenant is refused
        r = client.post("/aaa/runs", {"task": "cancel order B-7", "tenant": "b"}, content_type="application/json", **a)
        assert r.status_code == 403 and "TENANT" in r.json()["error"]


def test_request_limits_a_bounded_start_and_paginated_approvals_with_an_etag(client: Any):
    """Reproduces on c79799f (issue 21, item 9): a 20 MiB task was accepted (201) and stored;
    ``/approvals`` answered every pending call at once."""
    with aaa_settings(MAX_BODY_BYTES=4096):
        from aaa_celery.contrib.django import get_runs

        r = client.post("/aaa/runs", {"task": "x" * (20 * 1024 * 1024)}, content_type="application/json")
        assert r.status_code == 413 and "4096" in r.json()["error"]
        assert get_runs().engine.runs() == []
        for n in range(3):
            r = client.post("/aaa/runs", {"task": f"cancel order C-{n}"}, content_type="application/json")
            assert r.status_code == 201
        every = wait(lambda: (x := client.get("/aaa/approvals").json()["approvals"]) and len(x) == 3 and x)
        first = client.get("/aaa/approvals?limit=2").json()
        rest = client.get(f"/aaa/approvals?limit=2&after={first['next']}").json()
        assert [p["call_id"] for p in first["approvals"] + rest["approvals"]] == [p["call_id"] for p in every]
        assert rest["next"] is None
        r = client.get("/aaa/approvals")
        assert client.get("/aaa/approvals", HTTP_IF_NONE_MATCH=r.headers["ETag"]).status_code == 304
