"""A ``Busy`` copy of a call whose holder's lease is fresh is dropped at once (issue 13).

Reproduces on 4a34578: every Busy copy polled for ``BUSY_POLLS * wait_poll_s`` (2 s on
defaults), holding a worker slot, even when the holder had just renewed its lease.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from aaa_celery.config import GuardConfig
from aaa_celery.guard.runner import Dropped, GuardRunner
from aaa_celery.lifecycle import CallSpec, Claimed
from aaa_celery.stores.memory import MemoryStore


def test_a_copy_of_a_call_with_a_fresh_lease_is_dropped_at_once():
    # Given a call held by a live worker (a fresh 15 s lease)
    store, config = MemoryStore(), GuardConfig(wait_poll_s=0.5)
    call = CallSpec(f"c-{uuid.uuid4().hex}", "t")
    assert isinstance(store.begin(call, "holder", config), Claimed)

    # When a second copy is delivered
    began = time.monotonic()
    with pytest.raises(Dropped):
        GuardRunner(store, config).run(call, "copy", lambda attempt: "ran")

    # Then it is dropped without polling (old: 4 polls of 0.5 s)
    assert time.monotonic() - began < 0.5


def test_a_copy_of_a_call_whose_lease_is_about_to_lapse_waits_and_takes_it_over():
    # Given a call whose holder died: its 0.6 s lease lapses within the copy's short wait
    store, config = MemoryStore(), GuardConfig(wait_poll_s=0.25)
    call = CallSpec(f"c-{uuid.uuid4().hex}", "t")
    assert isinstance(store.begin(call, "dead", config.model_copy(update={"lease_ttl_s": 0.6})), Claimed)
    time.sleep(0.1)

    # When a copy is delivered, it waits, then runs the call as attempt 2
    ran = threading.Event()
    assert GuardRunner(store, config).run(call, "copy", lambda attempt: ran.set() or attempt) == 2
