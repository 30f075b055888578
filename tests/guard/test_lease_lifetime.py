"""The lease lives until the result is durable (issue 13, item 1), on the guard core.

These tests run :class:`~aaa_celery.guard.GuardRunner` over real stores. Faults are injected
at the store's edge (a ``finish`` or ``renew`` that fails, or a renewal that stalls), the
way a store outage reaches the guard; the guard itself is never replaced.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from aaa_celery.config import GuardConfig
from aaa_celery.errors import StoreUnavailable, ToolTimeout
from aaa_celery.guard import GuardRunner, Watchdog
from aaa_celery.guard.runner import Dropped
from aaa_celery.lifecycle import Busy, CallSpec, Claimed, Lease
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.stores.redis import RedisStore

from ..stores.test_conformance import new_call


class FlakyFinish(MemoryStore):
    """A memory store whose ``finish`` is unreachable until ``down_until`` (monotonic)."""

    down_until = 0.0
    renewals_while_down = 0

    def finish(self, lease, outcome, config):  # type: ignore[no-untyped-def]
        if time.monotonic() < self.down_until:
            raise StoreUnavailable("memory store unavailable (injected)")
        return super().finish(lease, outcome, config)

    def renew(self, lease):  # type: ignore[no-untyped-def]
        if time.monotonic() < self.down_until:
            self.renewals_while_down += 1
        return super().renew(lease)


def test_renewals_go_on_while_finish_is_retried_so_no_other_worker_claims_meanwhile() -> None:
    """Reproduces on 4a34578: the heartbeat stopped with the body, so a ``finish`` retried for
    longer than the TTL let the lease lapse, and another delivery claimed attempt 2."""
    store = FlakyFinish()
    cfg = GuardConfig(lease_ttl_s=0.6)  # heartbeat every 0.2 s
    runner = GuardRunner(store, cfg)
    call = new_call()
    seen: list[object] = []

    def body(attempt: int) -> dict[str, int]:
        store.down_until = time.monotonic() + 3 * cfg.lease_ttl_s  # finish fails for 3 TTLs
        return {"attempt": attempt}

    def other_worker() -> None:
        time.sleep(2 * cfg.lease_ttl_s)  # the TTL has run out twice since the body ended
        seen.append(store.begin(call, "worker-b", cfg))

    t = threading.Thread(target=other_worker)
    t.start()
    assert runner.run(call, "worker-a", body) == {"attempt": 1}
    t.join(10)
    assert isinstance(seen[0], Busy), seen  # worker-a still held the call while it recorded
    assert store.renewals_while_down >= 3
    assert store.result(call.call_id).attempt == 1


def test_timeout_holds_under_on_lost_lease_finish() -> None:
    """Reproduces on 4a34578: with ``on_lost_lease=finish`` a lost lease stopped the watchdog,
    timeout included, so a body with ``timeout_s=1`` ran on for as long as it liked."""
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    cfg = GuardConfig(lease_ttl_s=0.3, on_lost_lease="finish")
    runner = GuardRunner(store, cfg, timeout_s=1.0)
    call = new_call()

    def body(attempt: int) -> None:
        now[0] += 10  # the store's clock jumps: the lease has lapsed, the next renewal fails
        for _ in range(400):
            time.sleep(0.01)

    t0 = time.monotonic()
    with pytest.raises(ToolTimeout):
        runner.run(call, "worker-a", body)
    assert time.monotonic() - t0 < 3.0  # not the body's 4 s


class StallingRenew(MemoryStore):
    """A memory store whose renewals of one call hang for ``stall_s`` (a stalled shard)."""

    def __init__(self, stalled: str, stall_s: float) -> None:
        super().__init__()
        self.stalled, self.stall_s = stalled, stall_s
        self.renewed: dict[str, list[float]] = {}

    def renew(self, lease):  # type: ignore[no-untyped-def]
        self.renewed.setdefault(lease.call_id, []).append(time.monotonic())
        if lease.call_id == self.stalled:
            time.sleep(self.stall_s)
        return super().renew(lease)


def test_a_stalled_renewal_starves_no_other_call_and_its_own_call_is_cancelled_at_its_deadline() -> None:
    """Reproduces on 4a34578: one watchdog thread renewed every call in turn, so one renewal
    that hung delayed every other call's heartbeat (and its own call was never cancelled)."""
    slow, fast = new_call(), new_call()
    store = StallingRenew(slow.call_id, stall_s=3.0)
    cfg = GuardConfig(lease_ttl_s=0.6)
    out: dict[str, object] = {}

    def run(call: CallSpec) -> None:
        lease = store.begin(call, f"w-{call.call_id}", cfg)
        assert isinstance(lease, Claimed)
        dog = Watchdog(store, lease.lease, cfg, None)
        t0 = time.monotonic()
        try:
            dog.run(lambda: [time.sleep(0.01) for _ in range(200)])
            out[call.call_id] = ("done", time.monotonic() - t0)
        except BaseException as e:  # noqa: BLE001 - the cancel is what we look for
            out[call.call_id] = (type(e).__name__, time.monotonic() - t0)

    threads = [threading.Thread(target=run, args=(c,)) for c in (slow, fast)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    # the fast call kept its heartbeat every ~0.2 s while the other's renewal hung
    beats = store.renewed[fast.call_id]
    assert len(beats) >= 5 and max(b - a for a, b in zip(beats, beats[1:])) < 1.0, beats
    assert out[fast.call_id][0] == "done"
    # the stalled call could not prove its lease: cancelled near its deadline, not after the stall
    kind, took = out[slow.call_id]
    assert kind == "LeaseCancelled" and took < 2.0, out


@pytest.mark.redis
def test_a_read_only_blip_shorter_than_the_lease_keeps_the_call(redis_url: str) -> None:
    """A ``READONLY`` error in renewals (a failover in progress) is store trouble: retried
    within the lease, it never cancels a call whose store answers again in time."""
    store = RedisStore(redis_url)
    cfg = GuardConfig(lease_ttl_s=3.0)  # heartbeat every 1 s
    admin = redis.Redis.from_url(redis_url)
    call = new_call()

    def body(attempt: int) -> int:
        admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # every write is READONLY now
        try:
            time.sleep(1.5)  # a renewal or two fail
        finally:
            admin.execute_command("REPLICAOF", "NO", "ONE")
        time.sleep(1.5)
        return attempt

    try:
        assert GuardRunner(store, cfg).run(call, "worker-a", body) == 1
        assert store.result(call.call_id).attempt == 1
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
        admin.close()
        store.close()


def test_lease_remaining_tracks_the_last_proved_renewal() -> None:
    store = MemoryStore()
    cfg = GuardConfig(lease_ttl_s=0.6)
    claimed = store.begin(new_call(), "w", cfg)
    assert isinstance(claimed, Claimed)
    dog = Watchdog(store, claimed.lease, cfg, None)
    seen: list[float] = []
    dog.run(lambda: [seen.append(dog.lease_remaining_s()) or time.sleep(0.1) for _ in range(10)])
    assert all(0 < s <= 0.6 for s in seen) and min(seen) > 0.2, seen  # renewed all along
    assert Watchdog(None, None, cfg, None).lease_remaining_s() == float("inf")
    assert isinstance(claimed.lease, Lease)


class LostBeginReply(MemoryStore):
    """A memory store whose first ``begin`` lands but whose reply is lost (a connection that
    drops after the write), as a store outage reaches the guard."""

    lost = 0

    def begin(self, call, worker, config, token=None):  # type: ignore[no-untyped-def]
        got = super().begin(call, worker, config, token)
        if not self.lost:
            self.lost += 1
            raise StoreUnavailable("memory store unavailable: the reply was lost (injected)")
        return got


def test_an_at_most_once_call_whose_begin_reply_was_lost_runs_once_as_attempt_1() -> None:
    """On 4a34578 (begin took no token; this test fails there) the guard handed the message back, the requeued copy found its
    own orphaned claim busy, and once it lapsed the call ended OutcomeUnknown, though its
    body never ran. Now the begin is retried with the same token and claims attempt 1."""
    store = LostBeginReply()
    cfg = GuardConfig(lease_ttl_s=2.0, delivery="at_most_once")
    call = new_call()
    ran: list[int] = []
    assert GuardRunner(store, cfg).run(call, "worker-a", lambda attempt: ran.append(attempt) or attempt) == 1
    assert ran == [1] and store.lost == 1
    assert store.result(call.call_id).ok
    assert [e.attempt for e in store.events(call.call_id) if e.type == "aaa.tool.started"] == [1]


def test_a_cancel_that_library_code_turns_into_another_error_is_still_the_cancel() -> None:
    """Seen in a chaos run on 2026-12-04 (b073b91): the cancel, raised by the interrupt signal
    inside ``threading.Event.wait``, left the Condition's lock unlocked, and its ``with`` exit
    raised ``RuntimeError('release unlocked lock')`` in its place. The runner recorded that
    RuntimeError as the call's result, though the guard had stopped the body for a lost lease."""
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    cfg = GuardConfig(lease_ttl_s=0.6)
    runner = GuardRunner(store, cfg)
    call = new_call()

    def body(attempt: int) -> None:
        now[0] += 10  # the store's clock jumps: the lease has lapsed, the next renewal fails
        try:
            for _ in range(500):
                time.sleep(0.01)
        except BaseException:  # what threading.Condition did with the cancel, in short
            raise RuntimeError("release unlocked lock") from None

    with pytest.raises(Dropped):
        runner.run(call, "worker-a", body)
    assert store.result(call.call_id) is None  # fenced, not "failed with RuntimeError"
