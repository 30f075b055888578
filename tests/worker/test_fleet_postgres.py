"""The main-process kill and the frozen holder with the PostgreSQL store (Redis broker).

The lease is a session advisory lock: a killed holder's session ends and frees it
at once; a frozen but connected holder keeps it, so nobody takes over (the spec's
backend table), and the call finishes as attempt 1 when the holder resumes.
"""

from __future__ import annotations

import time

import pytest

from aaa_celery.lifecycle import COMPLETED, STARTED
from aaa_celery.testing import freeze

from .test_fleet_faults import (
    TTL,
    holder_of,
    kill_main_mid_call_and_see_attempt_2_elsewhere,
    started,
    types,
)

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.fleet]


def test_postgres_store_kill_9_main_mid_call_at_least_once_runs_attempt_2_on_other_worker(fleet, postgres_url):
    f = fleet(TTL=TTL, STORE=postgres_url)
    result, _, _ = kill_main_mid_call_and_see_attempt_2_elsewhere(f)
    assert result.get(timeout=30)["attempt"] == 2
    assert len(f.ledger.entries(result.id, "start")) == 2
    assert types(f.store, result.id) == [STARTED, STARTED, COMPLETED]


def test_postgres_store_frozen_but_connected_holder_keeps_its_lease(fleet, postgres_url):
    f = fleet(TTL=TTL, STORE=postgres_url)
    result = f.client.tasks["fleet.long"].delay(3.0)
    first = started(f, result.id)[0]
    with freeze(holder_of(f, first)):
        time.sleep(3 * TTL + 3)  # well past any TTL and several recovery sweeps
        assert len(f.ledger.entries(result.id, "start")) == 1, "another worker took over a live session's lease"
        assert types(f.store, result.id) == [STARTED]
    assert result.get(timeout=20)["attempt"] == 1
    assert len(f.ledger.entries(result.id, "start")) == 1
    assert [a["attempt"] for a in f.ledger.entries(result.id, "after")] == [1]
    assert types(f.store, result.id) == [STARTED, COMPLETED]
