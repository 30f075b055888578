"""Effect-side fencing on a real fleet (issue 13's acceptance): a worker frozen past its lease
(SIGSTOP) and woken after attempt 2 wrote has its stale write rejected by the database."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from aaa_celery.testing import freeze, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_a_frozen_stale_attempt_has_its_write_rejected_by_the_database(fleet, tmp_path):
    """Issue 13's acceptance: a tool writing through the SQL helper, frozen past its lease
    (SIGSTOP on a real worker) and woken after attempt 2 wrote, has its stale write rejected
    by the database. With ``on_lost_lease=finish`` nothing on the worker stops the write:
    the database does. (On 4a34578 there was no fencing helper: the stale write landed over
    attempt 2's.)"""
    db = f"sqlite:///{tmp_path / 'resource.sqlite3'}"
    f = fleet(TTL=2.0, FENCE_DB=db)
    result = f.client.tasks["fleet.fenced_write"].delay(4.0)
    first = wait_for(lambda: f.ledger.entries(result.id, "start"), 30, "attempt 1's start")[0]
    holder = f.worker_of(first["pid"])
    frozen = freeze(holder)
    try:
        wait_for(lambda: [a for a in f.ledger.entries(result.id, "after") if a["attempt"] == 2], 40,
                 "attempt 2's write")
    finally:
        frozen.thaw()
    assert result.get(timeout=30)["attempt"] == 2
    stale = wait_for(lambda: [a for a in f.ledger.entries(result.id, "after") if a["attempt"] == 1], 20,
                     "attempt 1's try to write")
    assert stale[0]["outcome"] == "rejected", stale
    engine = sa.create_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT attempt FROM effects")).scalars().all()
    engine.dispose()
    assert rows == [2]
    assert f.store.result(result.id).attempt == 2
