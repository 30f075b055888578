"""Run by 0.1.0 (tests/stores/old_release.py): write a store holding calls in every state.

``python old_writer.py URL`` writes, through 0.1.0's own store code, and prints one JSON
line of what it wrote (call ids by state, the budget key, the run key, the module it ran).
Then it keeps the lease of the running call live (its process holds the PostgreSQL
session, and renews the TTL on the others) until a line comes on stdin: ``finish`` (record
its result, as a 0.1.0 worker that outlives the upgrade would) or ``exit``.

The states: completed, failed, running (a live lease), lapsed (at_least_once, the holder
gone), OutcomeUnknown (at_most_once, lost then redelivered), checkpointed (lapsed with a
checkpoint saved), handed on (a retry asked for), a budget spent, and a run waiting for an
approval.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid

import aaa_celery
from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.lifecycle import CallSpec, Outcome, checkpoint_json
from aaa_celery.stores import open_store
from aaa_celery.stores.runs import RunRecord

SHORT = 0.3


def spec(call_id: str) -> CallSpec:
    request = {"task": "refund", "args": [], "kwargs": {"order": call_id}, "queue": "celery"}
    return CallSpec(call_id, "refund", f"key/{call_id}", request)


def main(url: str) -> None:
    run = uuid.uuid4().hex[:8]
    ids = {state: f"old-{run}-{state}" for state in (
        "completed", "failed", "running", "lapsed", "unknown", "checkpointed", "handed_on")}
    store = open_store(url)
    alo = GuardConfig(delivery=Delivery.AT_LEAST_ONCE, max_attempts=3, lease_ttl_s=SHORT)
    amo = GuardConfig(delivery=Delivery.AT_MOST_ONCE, lease_ttl_s=SHORT)
    long = GuardConfig(lease_ttl_s=600.0)

    lease = store.begin(spec(ids["completed"]), "old-w1", long).lease
    store.finish(lease, Outcome.success({"refunded": ids["completed"]}), long)
    lease = store.begin(spec(ids["failed"]), "old-w1", long).lease
    store.finish(lease, Outcome.failure("ValueError", "card declined"), long)
    lease = store.begin(spec(ids["handed_on"]), "old-w1", long).lease
    store.hand_on(lease)
    running = store.begin(spec(ids["running"]), "old-w1", long).lease

    # Calls whose holder dies: a store of their own, closed (PostgreSQL: its sessions end,
    # and the leases with them), and a wait past their TTL (the others).
    dying = open_store(url)
    dying.begin(spec(ids["lapsed"]), "old-w2", alo)
    dying.begin(spec(ids["unknown"]), "old-w2", amo)
    held = dying.begin(spec(ids["checkpointed"]), "old-w2", alo).lease
    assert dying.save_checkpoint(held, checkpoint_json(1, {"page": 7}))
    dying.close()
    time.sleep(SHORT * 2)
    refused = store.begin(spec(ids["unknown"]), "old-w3", amo)  # the redelivery: OutcomeUnknown
    assert refused.result.error == "OutcomeUnknown", refused

    budget = f"old-{run}-budget"
    assert store.spend(budget, "t1", 6.0, 10.0, 3600.0)
    record = RunRecord(f"run-{run}", "acme", "ToolLoop", {"task": "refund A-100"}, "waiting", time.time(),
                       time.time(), approvals={f"{run}-c1": {"state": "open", "digest": "d" * 64,
                                                             "arguments": {"amount": 30}}})
    store.put_run(record)
    store.append_run_events(record.key, [{"seq": 1, "type": "aaa.approval.requested", "data": {}}])

    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(5.0):
            store.renew(running)

    threading.Thread(target=heartbeat, daemon=True).start()
    print(json.dumps({"ids": ids, "budget": budget, "run": record.key, "approval": f"{run}-c1",
                      "module": aaa_celery.__file__}), flush=True)
    for line in sys.stdin:
        if line.strip() == "finish":
            got = store.finish(running, Outcome.success({"refunded": ids["running"]}), long)
            print(json.dumps({"finished": type(got).__name__}), flush=True)
        if line.strip() in ("finish", "exit"):
            break
    stop.set()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
