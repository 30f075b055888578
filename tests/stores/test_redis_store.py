"""What only the Redis store must prove: round trips, key layout, TTL leases, outages.

The behaviour it shares with every store is in ``test_conformance.py``; these cases
look at Redis itself (``INFO commandstats``, ``MONITOR``, key TTLs) and inject
faults at the server (``CLIENT PAUSE``, a busy server).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.crc import key_slot

from aaa_celery.config import GuardConfig
from aaa_celery.errors import StoreUnavailable
from aaa_celery.lifecycle import COMPLETED, STARTED, Accepted, CallSpec, Claimed, Outcome, Stale
from aaa_celery.stores import open_store
from aaa_celery.stores.redis import RedisStore

from ..servers import free_port

pytestmark = pytest.mark.redis

CFG = GuardConfig(lease_ttl_s=30)


def new_call() -> CallSpec:
    call_id = f"call-{uuid.uuid4().hex[:12]}"
    return CallSpec(call_id, name="refund", request={"task": "tools.refund", "args": [1]})


def claim(store: RedisStore, call: CallSpec, worker: str, cfg: GuardConfig = CFG) -> Claimed:
    got = store.begin(call, worker, cfg)
    assert isinstance(got, Claimed), got
    return got


@pytest.fixture
def probe(redis_url: str) -> Iterator[redis.Redis]:
    """A connection of the test's own, to look at and disturb the server."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def open_redis(redis_url: str) -> Iterator[Callable[..., RedisStore]]:
    opened: list[RedisStore] = []

    def make(**options) -> RedisStore:
        store = open_store(redis_url, **options)
        assert isinstance(store, RedisStore)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def client_commands(redis_url: str, act: Callable[[], None]) -> list[str]:
    """The commands clients (not scripts) sent while ``act`` ran, seen by MONITOR."""
    marker, seen = f"end-{uuid.uuid4().hex}", []
    watcher, end = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url)
    end.ping()  # connect (HELLO) before watching
    with watcher, end, watcher.monitor() as monitor:
        act()
        end.echo(marker)
        while marker not in (cmd := monitor.next_command())["command"]:
            if cmd["client_type"] != "lua":
                seen.append(cmd["command"].split()[0].lower())
    return seen


def test_happy_path_begin_then_finish_costs_two_round_trips(open_redis, probe, redis_url) -> None:
    # Given a store whose scripts the server already caches (a first use adds one SCRIPT LOAD)
    store = open_redis()
    warm = claim(store, new_call(), "w1")
    store.finish(warm.lease, Outcome.success(0), CFG)
    call = new_call()
    before = probe.info("commandstats")

    # When a call is claimed and finished
    def happy_path() -> None:
        lease = claim(store, call, "w1").lease
        assert store.finish(lease, Outcome.success(42), CFG) == Accepted(Outcome.success(42, 1))

    sent = client_commands(redis_url, happy_path)

    # Then the store sent exactly two commands, both EVALSHA
    assert sent == ["evalsha", "evalsha"]
    after = probe.info("commandstats")
    calls = {name: after[name]["calls"] - before.get(name, {"calls": 0})["calls"] for name in after}
    assert calls["cmdstat_evalsha"] == 2
    assert calls.get("cmdstat_eval", 0) == 0 and calls.get("cmdstat_script|load", 0) == 0


def pause_server(probe: redis.Redis, redis_url: str) -> Callable[[], None]:
    """Clients hang for 1 s; a command that timed out meanwhile is dropped with its socket."""
    probe.execute_command("CLIENT", "PAUSE", 1000, "ALL")
    return lambda: time.sleep(1.1)


def busy_server(probe: redis.Redis, redis_url: str) -> Callable[[], None]:
    """A slow script blocks the server for 0.6 s; a command that timed out meanwhile still
    runs afterwards (its write lands, its reply is lost)."""
    spin = (
        "local s = redis.call('TIME') repeat local t = redis.call('TIME') "
        "until (t[1] - s[1]) * 1000000 + (t[2] - s[2]) > tonumber(ARGV[1])"
    )
    blocker = redis.Redis.from_url(redis_url)
    thread = threading.Thread(target=blocker.eval, args=(spin, 0, 600_000))
    thread.start()
    time.sleep(0.1)

    def recovered() -> None:
        thread.join()
        blocker.close()

    return recovered


@pytest.mark.parametrize(
    ("outage", "write_landed"), [(pause_server, False), (busy_server, True)], ids=["paused", "busy"]
)
def test_finish_timing_out_then_retried_records_the_result_exactly_once(
    open_redis, probe, redis_url, outage, write_landed
) -> None:
    # Given a claimed call, and a store that gives up on Redis after 0.2 s
    store = open_redis(socket_timeout=0.2)
    call = new_call()
    lease = claim(store, call, "w1").lease
    outcome = Outcome.success({"refund": "r-1"})

    # When Redis stops answering between begin and finish
    recovered = outage(probe, redis_url)
    with pytest.raises(StoreUnavailable) as raised:
        store.finish(lease, outcome, CFG)
    assert isinstance(raised.value.__cause__, redis.TimeoutError)
    recovered()
    assert (store.result(call.call_id) is not None) is write_landed

    # Then retrying the finish once Redis is back records the result, once
    assert store.finish(lease, outcome, CFG) == Accepted(Outcome.success({"refund": "r-1"}, 1))
    assert store.result(call.call_id) == Outcome.success({"refund": "r-1"}, 1)
    assert [e.type for e in store.events(call.call_id)] == [STARTED, COMPLETED]


def test_unreachable_server_raises_store_unavailable() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    with pytest.raises(StoreUnavailable) as raised:
        store.begin(new_call(), "w1", CFG)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)


def test_a_call_keys_share_one_hash_tag_and_a_finished_call_keeps_them_for_retention(
    open_redis, probe
) -> None:
    store = open_redis(retention_s=3600)
    call = new_call()

    # Given a claimed call: all its keys carry {call_id}, so they sit in one Cluster slot
    lease = claim(store, call, "w1").lease
    keys = set(probe.scan_iter(match=f"*{call.call_id}*"))
    assert {key.rsplit(":", 1)[1] for key in keys} == {"spec", "attempts", "lease", "events"}
    assert all(f"{{{call.call_id}}}" in key for key in keys)
    assert len({key_slot(key.encode()) for key in keys}) == 1
    assert probe.hgetall(store.key(call.call_id, "lease"))["token"] == lease.token
    assert 0 < probe.pttl(store.key(call.call_id, "lease")) <= 30_000

    # When it finishes
    store.finish(lease, Outcome.success(1), CFG)

    # Then its lease is gone at once, and the rest expires after retention_s
    assert not probe.exists(store.key(call.call_id, "lease"))
    for name in ("spec", "attempts", "result", "events"):
        assert 3590 <= probe.ttl(store.key(call.call_id, name)) <= 3600, name


def test_default_retention_is_seven_days(open_redis, probe) -> None:
    store = open_redis()
    call = new_call()
    store.finish(claim(store, call, "w1").lease, Outcome.success(1), CFG)
    assert 7 * 24 * 3600 - 10 <= probe.ttl(store.key(call.call_id, "result")) <= 7 * 24 * 3600


def test_lapsed_lease_goes_to_a_new_worker_and_the_old_one_cannot_renew(open_redis) -> None:
    # Given worker 1 holding a 0.3 s lease, which it renews once in time
    cfg = GuardConfig(lease_ttl_s=0.3)
    first, second = open_redis(), open_redis()
    call = new_call()
    old = claim(first, call, "w1", cfg).lease
    time.sleep(0.2)
    assert first.renew(old)
    assert second.begin(call, "w2", cfg).holder == "w1"  # still busy after the first TTL

    # When worker 1 goes silent past its TTL
    time.sleep(0.35)

    # Then the lease key is gone, recovery sees the call, and worker 2 takes over as attempt 2
    assert [c.call_id for c in second.expired()] == [call.call_id]
    new = claim(second, call, "w2", cfg).lease
    assert (new.attempt, new.fence) == (2, 2)
    assert second.expired() == []

    # And worker 1 can neither renew nor record its result
    assert not first.renew(old)
    assert isinstance(first.finish(old, Outcome.success("late"), cfg), Stale)
    assert second.renew(new)
    assert second.finish(new, Outcome.success("ok"), cfg) == Accepted(Outcome.success("ok", 2))


def test_now_is_the_server_clock(open_redis, probe) -> None:
    seconds, micros = probe.time()
    assert abs(open_redis().now() - (seconds + micros / 1e6)) < 1.0
