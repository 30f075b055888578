"""What an operator sees in Flower while guarded calls are taken over and lost, in a real
browser: a real fleet (``-E``), a real ``celery flower``, headless Chromium.

The screenshot goes to the test's tmp dir; ``AAA_UPDATE_SCREENSHOTS=1`` writes it to
``docs/flower-tasks.png`` (docs/operations.md shows it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from aaa_celery.errors import OutcomeUnknown

from ..contrib.test_browser import browser  # noqa: F401 - the headless Chromium fixture
from .test_fleet_faults import TTL, started
from .test_monitors import Flower

pytestmark = [pytest.mark.redis, pytest.mark.fleet]
ROOT = Path(__file__).resolve().parents[2]


def test_flower_shows_the_taken_over_call_succeed_and_the_lost_one_as_outcome_unknown(
        fleet, browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    f = fleet(3, TTL=TTL, extra_args=("-E",))
    flower = Flower(f.env, tmp_path)
    try:
        # a call whose holder is killed mid-call (attempt 2 elsewhere), and an at_most_once one
        # whose holder is killed (OutcomeUnknown)
        taken_over = f.client.tasks["fleet.long"].delay(3.0)
        first = started(f, taken_over.id)[0]
        f.worker_of(first["pid"]).kill()
        assert taken_over.get(timeout=30)["attempt"] == 2
        lost = f.client.tasks["fleet.long_amo"].delay(3.0)
        holder = f.worker_of(started(f, lost.id)[0]["pid"])
        holder.kill()
        with pytest.raises(OutcomeUnknown):
            lost.get(timeout=30)
        time.sleep(1.5)  # the last events reach Flower

        browser.get(f"http://127.0.0.1:{flower.port}/tasks")
        WebDriverWait(browser, 20, poll_frequency=0.2).until(
            lambda b: taken_over.id in b.page_source and lost.id in b.page_source)
        page = browser.find_element(By.TAG_NAME, "body").text
        assert "SUCCESS" in page and "FAILURE" in page
        shots = ROOT / "docs" if os.environ.get("AAA_UPDATE_SCREENSHOTS") == "1" else tmp_path
        browser.save_screenshot(str(shots / "flower-tasks.png"))

        browser.get(f"http://127.0.0.1:{flower.port}/task/{lost.id}")
        WebDriverWait(browser, 20, poll_frequency=0.2).until(lambda b: "OutcomeUnknown" in b.page_source)
        browser.get(f"http://127.0.0.1:{flower.port}/task/{taken_over.id}")
        WebDriverWait(browser, 20, poll_frequency=0.2).until(lambda b: "'attempt': 2" in b.page_source
                                                             or "&#39;attempt&#39;: 2" in b.page_source)
    finally:
        flower.stop()
