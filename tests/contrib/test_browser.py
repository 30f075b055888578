"""A person in a real browser: the Flask example served over HTTP, driven in headless Chromium.

The example app (embedded engine: no server needed) is served by werkzeug on a free
127.0.0.1 port in a thread; Selenium drives Debian's ``chromium`` through ``chromedriver``
(``/usr/bin/chromium``, ``/usr/bin/chromedriver``; ``scripts/test`` installs both).
Missing, the test skips locally and fails under ``CI=true``.

Screenshots go to the test's tmp dir; ``AAA_UPDATE_SCREENSHOTS=1`` writes them to
``docs/approval.png`` and ``docs/run-finished.png`` instead (the pictures in the README and docs/agent-runs.md)::

    AAA_UPDATE_SCREENSHOTS=1 scripts/test tests/contrib/test_browser.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aaa_celery.llm import FakeLLMClient, LLMRequest, LLMResponse, ToolCall
from aaa_celery.llm.fake import text

from ..conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "flask_app"
CHROMIUM = os.environ.get("AAA_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AAA_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
TIMEOUT_S = 15

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the screenshots go: docs/ when asked to refresh them, else the tmp dir."""
    if os.environ.get("AAA_UPDATE_SCREENSHOTS") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        return ROOT / "docs"
    return tmp_path


@pytest.fixture
def app_config() -> dict[str, Any]:
    """Config overrides of the example app (a test may set its own model)."""
    return {}


@pytest.fixture
def base_url(app_config: dict[str, Any]) -> Iterator[str]:
    """The example app, embedded engine, behind a real WSGI server on a free loopback port."""
    pytest.importorskip("flask")
    from werkzeug.serving import make_server

    sys.path.insert(0, str(EXAMPLE))
    try:
        from app import aaa, create_app  # the example app

        app = create_app(TESTING=True, AAA_CELERY_APP=None, **app_config)
        try:
            server = make_server("127.0.0.1", 0, app, threaded=True)
            thread = threading.Thread(target=server.serve_forever, name="flask-example", daemon=True)
            thread.start()
            try:
                yield f"http://127.0.0.1:{server.server_port}"
            finally:
                server.shutdown()
                thread.join(10)
                server.server_close()
        finally:
            aaa.close(app)
    finally:
        sys.path.remove(str(EXAMPLE))


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium under chromedriver, with a new empty profile; quit at the end."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (shutil.which(path) or os.access(path, os.X_OK)):
            unavailable(f"{path} is missing (apt-get install {package}; scripts/test installs it)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed (pip install -e '.[dev]')")

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--no-proxy-server", "--window-size=1100,900",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    # a driver path given: Selenium Manager (which would download one) is never asked
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.set_page_load_timeout(TIMEOUT_S)
        yield driver
    finally:
        driver.quit()


def test_a_person_sees_the_pending_approval_clicks_approve_and_sees_the_run_finish(
        base_url: str, browser: Any, shots: Path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    until = WebDriverWait(browser, TIMEOUT_S, poll_frequency=0.1,
                          ignored_exceptions=[StaleElementReferenceException]).until

    # Given a person on the runs page who starts a refund
    browser.get(f"{base_url}/aaa/")
    assert browser.title == "Agent runs"
    browser.find_element(By.NAME, "task").send_keys("refund order A-100")
    browser.find_element(By.NAME, "tenant").send_keys("acme")
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()

    # the form lands on the run's page, which shows the refund waiting for a person
    until(ec.url_contains("/aaa/runs/run"))
    run_id = browser.current_url.rstrip("/").rsplit("/", 1)[1]
    approval = until(ec.visibility_of_element_located((By.CSS_SELECTOR, "#pending .approval")))
    until(ec.text_to_be_present_in_element((By.ID, "status"), "waiting"))
    assert "refund" in approval.text and '"order_id":"A-100"' in approval.text.replace(" ", "")
    assert '"amount":30' in approval.text.replace(" ", "")
    assert browser.find_element(By.CSS_SELECTOR, "#pending .deny").is_displayed()
    # the lookup already ran, the refund was not sent to any worker
    until(ec.text_to_be_present_in_element((By.ID, "attempts"), "not sent"))
    assert browser.find_elements(By.ID, "answer") == []
    browser.save_screenshot(str(shots / "approval.png"))

    # When the person clicks Approve (the page re-renders the pending list while it polls:
    # a stale button is looked up again, a click that went through is never repeated)
    def click_approve(driver: Any) -> bool:
        driver.find_element(By.CSS_SELECTOR, "#pending .approve").click()
        return True

    until(click_approve)

    # Then the page shows the run finished, with the refund's result as the final text
    answer = until(ec.visibility_of_element_located((By.ID, "answer")))
    assert answer.text.startswith("refunded 30 EUR on A-100 (key refund:A-100)")
    until(ec.text_to_be_present_in_element((By.ID, "status"), "completed"))
    assert browser.find_element(By.ID, "pending").text == "none"
    events = browser.find_element(By.ID, "events").text
    assert "aaa.approval.granted" in events and "aaa.run.completed" in events
    until(ec.text_to_be_present_in_element((By.ID, "attempts"), "aaa.tool.completed (attempt 1)"))
    browser.save_screenshot(str(shots / "run-finished.png"))

    # and at 1280 px the events and attempts tables stay inside the page (long call ids and
    # JSON wrap instead of widening the table past the body)
    width = browser.get_window_size()["width"]
    browser.set_window_size(1280, 900)
    overflow = browser.execute_script(
        "const body = document.body.getBoundingClientRect();"
        "return ['events', 'attempts'].map(id => document.getElementById(id).getBoundingClientRect().right - body.right)"
        ".concat([document.documentElement.scrollWidth - document.documentElement.clientWidth]);")
    browser.set_window_size(width, 900)
    assert max(overflow) <= 1, overflow

    # and the runs page lists the run as completed, with nothing left waiting
    browser.get(f"{base_url}/aaa/")
    until(ec.text_to_be_present_in_element((By.ID, "runs"), run_id))
    until(ec.text_to_be_present_in_element((By.ID, "runs"), "completed"))
    assert browser.find_element(By.ID, "approvals").text == "none"


# -- a model that tries to approve its own payment through the page ------------------------------

#: Breaks out of an HTML attribute, focuses itself and clicks every Approve button on the page.
ATTRIBUTE_PAYLOAD = ('x" tabindex="0" autofocus onfocus="window.__pwned=1;document.querySelectorAll(\'button\')'
                     '.forEach(function(b){if(/approve/i.test(b.textContent))b.click()})" data-x="')
#: Ends a script element and starts one of its own.
SCRIPT_PAYLOAD = '</script><script>window.__pwned=2</script><img src=x onerror="window.__pwned=3">'


def crafted_model(request: LLMRequest) -> LLMResponse:
    """First turn: a legitimate refund plus one whose call id and arguments carry the payloads."""
    if any(m.role == "tool" for m in request.messages):
        return text("done")
    return LLMResponse(tool_calls=(
        ToolCall("refund", {"order_id": "A-100", "amount": 30}, id="call_ok"),
        ToolCall("refund", {"order_id": SCRIPT_PAYLOAD, "amount": 1}, id=ATTRIBUTE_PAYLOAD + SCRIPT_PAYLOAD),
    ))


@pytest.mark.parametrize("app_config", [{"AAA_CELERY_LLM": FakeLLMClient(crafted_model)}], ids=["crafted"])
def test_a_crafted_call_id_and_arguments_approve_nothing_and_run_no_script(base_url: str, browser: Any):
    """The model approves its own payment through the approval page (reproduces on 4a34578):
    a call id carrying ``" autofocus onfocus="…`` broke out of the page's HTML attribute and
    clicked Approve on every pending call as soon as a person opened the page."""
    import urllib.request

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    until = WebDriverWait(browser, TIMEOUT_S, poll_frequency=0.1).until

    def api(path: str) -> Any:
        with urllib.request.urlopen(f"{base_url}{path}", timeout=TIMEOUT_S) as r:
            return json.load(r)

    # Given a person who starts a run of a model whose two refunds wait, one of them crafted
    browser.get(f"{base_url}/aaa/")
    browser.find_element(By.NAME, "task").send_keys("refund order A-100")
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    until(ec.url_contains("/aaa/runs/run"))
    run_id = browser.current_url.rstrip("/").rsplit("/", 1)[1]

    # When the person looks at the run's page, then at the runs page, for several polls each
    for path in (f"/aaa/runs/{run_id}", "/aaa/"):
        if path != f"/aaa/runs/{run_id}":
            browser.get(f"{base_url}{path}")
        until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".approval")) == 2)
        time.sleep(1.5)  # every redraw had its chance to run something
        # Then no script of the model's ran, and its strings are shown as text
        assert browser.execute_script("return window.__pwned === undefined"), path
        assert "</script><script>window.__pwned=2</script>" in browser.find_element(By.TAG_NAME, "body").text, path

    # and nothing was approved: both calls still wait, no grant was recorded
    run = api(f"/aaa/runs/{run_id}/events")
    assert len(run["pending"]) == 2
    assert [e for e in run["events"] if e["type"] == "aaa.approval.granted"] == []


# -- the Django example, through its page's script and Django's CSRF protection -------------------

@pytest.fixture
def django_url() -> Iterator[str]:
    """The Django example project (embedded engine) behind a real WSGI server on a free loopback port."""
    django = pytest.importorskip("django")
    from werkzeug.serving import make_server

    project = ROOT / "examples" / "django_project"
    sys.path.insert(0, str(project))
    before = os.environ.get("DJANGO_SETTINGS_MODULE")
    os.environ["DJANGO_SETTINGS_MODULE"] = "proj.settings"
    try:
        django.setup()
        from django.core.wsgi import get_wsgi_application

        from aaa_celery.contrib.django import close_runs

        server = make_server("127.0.0.1", 0, get_wsgi_application(), threaded=True)
        thread = threading.Thread(target=server.serve_forever, name="django-example", daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()
            thread.join(10)
            server.server_close()
            close_runs()
    finally:
        if before is None:
            os.environ.pop("DJANGO_SETTINGS_MODULE", None)
        else:
            os.environ["DJANGO_SETTINGS_MODULE"] = before
        sys.path.remove(str(project))


def test_django_a_person_starts_a_run_and_approves_through_the_page_under_csrf(django_url: str, browser: Any):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    until = WebDriverWait(browser, TIMEOUT_S, poll_frequency=0.1,
                          ignored_exceptions=[StaleElementReferenceException]).until
    # Given a person who starts a cancellation through the page's form (Django's CSRF token in it)
    browser.get(f"{django_url}/aaa/")
    browser.find_element(By.NAME, "task").send_keys("cancel order A-100")
    browser.find_element(By.NAME, "tenant").send_keys("acme")
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    until(ec.url_contains("/aaa/runs/run"))
    until(ec.visibility_of_element_located((By.CSS_SELECTOR, "#pending .approval")))

    # When the person clicks Approve (the script posts JSON with the X-CSRFToken header)
    def click_approve(driver: Any) -> bool:
        driver.find_element(By.CSS_SELECTOR, "#pending .approve").click()
        return True

    until(click_approve)

    # Then Django's CSRF protection let it through and the run completes
    answer = until(ec.visibility_of_element_located((By.ID, "answer")))
    assert answer.text == "A-100 is not shipped yet; cancelled A-100 for acme"
    assert browser.find_element(By.ID, "error").text == ""
