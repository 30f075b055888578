"""What only the Redis store must prove: round trips, key layout (one slot per script),
TTL leases, outages, and the same on a real Redis Cluster.

The behaviour it shares with every store is in ``test_conformance.py``; these cases
look at Redis itself (``INFO commandstats``, ``MONITOR``, key TTLs) and inject
faults at the server (``CLIENT PAUSE``, a busy server).
"""

from __future__ import annotations

import contextlib
import gc
import os
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
from .conftest import cluster_client

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


def client_commands(redis_url: str | list[str], act: Callable[[], None]) -> list[str]:
    """The commands clients (not scripts) sent while ``act`` ran, seen by MONITOR on the
    server (or on each of the servers, e.g. a cluster's primaries)."""
    urls = [redis_url] if isinstance(redis_url, str) else redis_url
    marker, seen = f"end-{uuid.uuid4().hex}", []
    with contextlib.ExitStack() as stack:
        watched = []
        for url in urls:
            watcher = stack.enter_context(redis.Redis.from_url(url))
            end = stack.enter_context(redis.Redis.from_url(url))
            end.ping()  # connect (HELLO) before watching
            watched.append((stack.enter_context(watcher.monitor()), end))
        act()
        for monitor, end in watched:
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


def test_a_spend_on_a_budget_this_store_last_left_is_one_round_trip(open_redis, probe, redis_url) -> None:
    """spend.lua applies lifecycle.plan_spend's plan if the budget is as read: a store plans
    on the budget as its own last spend left it, so only a budget another store changed since
    (or a token counted already) costs a second round trip."""
    store, other = open_redis(), open_redis()
    assert store.spend("b", "t1", 1.0, 3.0, 3600.0)  # first sight of the budget: read, then write

    sent = client_commands(redis_url, lambda: store.spend("b", "t2", 1.0, 3.0, 3600.0))
    assert sent == ["evalsha"]
    assert other.spend("b", "t3", 1.0, 3.0, 3600.0)  # the budget changes behind store's back
    answers: list[bool] = []
    sent = client_commands(redis_url, lambda: answers.append(store.spend("b", "t4", 1.0, 3.0, 3600.0)))
    assert sent == ["evalsha", "evalsha"] and answers == [False]  # planned on a stale total: 3 of 3 spent
    assert store.spend("b", "t2", 1.0, 3.0, 3600.0)  # counted once per window, still


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


def script_keys(redis_url: str, act: Callable[[], None]) -> list[str]:
    """The keys the store's scripts (not clients) touched while ``act`` ran, seen by
    MONITOR: the first argument of every command but TIME (the scripts use no other
    keyless command, and no command with a second key)."""
    marker, keys = f"end-{uuid.uuid4().hex}", []
    watcher, end = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url)
    end.ping()
    with watcher, end, watcher.monitor() as monitor:
        act()
        end.echo(marker)
        while marker not in (cmd := monitor.next_command())["command"]:
            if cmd["client_type"] == "lua":
                name, *args = cmd["command"].split()
                if name.upper() != "TIME":
                    keys.append(args[0])
    return keys


def test_a_call_keys_share_its_shard_hash_tag_and_a_finished_call_keeps_them_for_retention(
    open_redis, probe
) -> None:
    store = open_redis(retention_s=3600)
    call = new_call()
    shard = store.shard(call.call_id)
    tag = f"{{aaa:{shard}}}"

    # Given a claimed call: all its keys carry its shard's tag, so they sit in one Cluster
    # slot, the slot of that shard's recovery indexes
    lease = claim(store, call, "w1").lease
    keys = set(probe.scan_iter(match=f"*{call.call_id}*"))
    assert {key.rsplit(":", 1)[1] for key in keys} == {"spec", "attempts", "lease", "events"}
    assert all(key.startswith(f"aaa:{tag}:{call.call_id}:") for key in keys)
    assert store.index_keys(shard) == [f"aaa:{tag}:running", f"aaa:{tag}:unclaimed"]
    slots = {key_slot(key.encode()) for key in [*keys, *store.index_keys(shard)]}
    assert slots == {key_slot(tag[1:-1].encode())}
    assert probe.zscore(store.index_keys(shard)[0], call.call_id) is not None
    assert probe.hgetall(store.key(call.call_id, "lease"))["token"] == lease.token
    assert 0 < probe.pttl(store.key(call.call_id, "lease")) <= 30_000

    # When it finishes
    store.finish(lease, Outcome.success(1), CFG)

    # Then its lease is gone at once, and the rest expires after retention_s
    assert not probe.exists(store.key(call.call_id, "lease"))
    for name in ("spec", "attempts", "result", "events"):
        assert 3590 <= probe.ttl(store.key(call.call_id, name)) <= 3600, name


def test_every_script_touches_only_keys_of_its_call_slot(open_redis, redis_url) -> None:
    # Given calls in different shards, taken through every script
    store = open_redis()
    short = GuardConfig(lease_ttl_s=30)
    calls = [new_call() for _ in range(6)]
    assert len({store.shard(c.call_id) for c in calls}) > 1 or store.shards == 1

    for call in calls:
        def every_script(call: CallSpec = call) -> None:
            store.register(call)
            store.claim_recovery(call.call_id, "sweeper", 5)
            lease = claim(store, call, "w1", short).lease
            assert store.renew(lease)
            store.fenced(lease)  # drops the lease: the call is now lapsed
            lease = claim(store, call, "w2", short).lease
            store.release(lease)
            lease = claim(store, call, "w3", short).lease
            store.finish(lease, Outcome.success(1), short)
            store.finish(lease, Outcome.success(2), short)  # a losing finish

        # When they run, Then every key any script command used is in the call's slot
        touched = script_keys(redis_url, every_script)
        assert len(touched) > 20
        assert {key_slot(k.encode()) for k in touched} == {
            key_slot(store.key(call.call_id, "spec").encode())
        }, sorted(set(touched))


def test_shards_is_configurable_and_a_store_with_one_shard_works(open_redis) -> None:
    store = open_redis(shards=1)
    call = new_call()
    assert store.shard(call.call_id) == 0
    assert store.key(call.call_id, "lease") == f"aaa:{{aaa:0}}:{call.call_id}:lease"
    store.finish(claim(store, call, "w1").lease, Outcome.success(1), CFG)
    assert store.result(call.call_id) == Outcome.success(1, 1)
    with pytest.raises(ValueError, match="shards"):
        open_redis(shards=0)


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


# --- Each thread's own connection (RedisStore._evalsha) ----------------------------------


class Cut(BaseException):
    """Stands for an exception that lands between a command and its reply (the watchdog
    interrupting a body, KeyboardInterrupt)."""


def test_a_command_cut_off_before_its_reply_leaves_nothing_for_the_next(open_redis, monkeypatch) -> None:
    # Given a store whose connection sent a begin but was cut off before reading the reply
    store = open_redis()
    claim(store, new_call(), "w1")  # the thread's connection exists
    conn = store._held.lent.conn
    real_send = conn.send_packed_command

    def send_then_cut(*args, **kwargs):
        real_send(*args, **kwargs)
        raise Cut()

    monkeypatch.setattr(conn, "send_packed_command", send_then_cut)
    with pytest.raises(Cut):
        store.begin(new_call(), "w1", CFG)
    monkeypatch.undo()

    # Then the next command gets its own reply, not the one left unread
    call = new_call()
    lease = claim(store, call, "w2").lease
    assert (lease.call_id, lease.attempt) == (call.call_id, 1)
    assert store.finish(lease, Outcome.success(7), CFG) == Accepted(Outcome.success(7, 1))


def test_scripts_the_server_lost_are_loaded_again(open_redis, probe) -> None:
    store = open_redis()
    claim(store, new_call(), "w1")
    probe.script_flush()
    call = new_call()
    lease = claim(store, call, "w1").lease
    assert store.finish(lease, Outcome.success(1), CFG) == Accepted(Outcome.success(1, 1))


def test_a_thread_that_ends_gives_its_connection_back_to_the_pool(open_redis) -> None:
    # Given threads that each ran a script (as a gevent pool spawns one greenlet per task)
    store = open_redis()
    claim(store, new_call(), "w1")
    pool = store._client.connection_pool
    for n in range(20):
        thread = threading.Thread(target=claim, args=(store, new_call(), f"t{n}"))
        thread.start()
        thread.join()
        gc.collect()

    # Then each gave its connection back when it ended: the pool reuses one, never grows
    assert len(pool._in_use_connections) == 1  # this thread's
    assert len(pool._available_connections) == 1


def test_each_thread_and_a_forked_child_use_their_own_connection(open_redis) -> None:
    store = open_redis()
    claim(store, new_call(), "w1")
    main = store._held.lent.conn
    seen: list[object] = []

    def in_thread() -> None:
        claim(store, new_call(), "w2")
        seen.append(store._held.lent.conn)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen and seen[0] is not main

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own connection, and the parent's left alone
        ok = False
        try:
            call = new_call()
            lease = claim(store, call, "child").lease
            ok = store._held.lent.conn is not main and store.finish(lease, Outcome.success(2), CFG) == Accepted(
                Outcome.success(2, 1))
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    call = new_call()
    lease = claim(store, call, "w1").lease  # the parent's connection still works
    assert store._held.lent.conn is main
    assert store.finish(lease, Outcome.success(3), CFG) == Accepted(Outcome.success(3, 1))


# --- Redis Cluster ------------------------------------------------------------------------


@pytest.fixture
def open_cluster(redis_cluster_url: str) -> Iterator[Callable[..., RedisStore]]:
    opened: list[RedisStore] = []

    def make(**options) -> RedisStore:
        store = open_store(redis_cluster_url, **options)
        assert isinstance(store, RedisStore) and store.cluster
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def cluster_probe(redis_cluster_url: str) -> Iterator[redis.RedisCluster]:
    client = cluster_client(redis_cluster_url)
    yield client
    client.close()


def primaries_commandstats(probe: redis.RedisCluster) -> dict[str, int]:
    """Calls per command, summed over every primary of the cluster."""
    total: dict[str, int] = {}
    for stats in probe.info("commandstats", target_nodes=probe.PRIMARIES).values():
        for name, row in stats.items():
            total[name] = total.get(name, 0) + row["calls"]
    return total


def test_cluster_happy_path_is_two_evalsha_and_each_call_lives_on_its_shard_node(
    open_cluster, cluster_probe
) -> None:
    # Given a cluster store whose scripts every primary already caches
    store = open_cluster()
    warm = [new_call() for _ in range(32)]
    for call in warm:
        store.finish(claim(store, call, "w1").lease, Outcome.success(0), CFG)
    call = new_call()
    nodes = [f"redis://{n.host}:{n.port}/0" for n in cluster_probe.get_primaries()]
    before = primaries_commandstats(cluster_probe)

    # When a call is claimed and finished
    def happy_path() -> None:
        lease = claim(store, call, "w1").lease
        assert store.finish(lease, Outcome.success(42), CFG) == Accepted(Outcome.success(42, 1))

    sent = client_commands(nodes, happy_path)

    # Then the cluster got exactly two commands, both EVALSHA (no CROSSSLOT, no redirect)
    assert sent == ["evalsha", "evalsha"]
    after = primaries_commandstats(cluster_probe)
    assert after["cmdstat_evalsha"] - before["cmdstat_evalsha"] == 2
    assert after.get("cmdstat_script|load", 0) == before.get("cmdstat_script|load", 0)
    errors = cluster_probe.info("errorstats", target_nodes=cluster_probe.PRIMARIES)
    assert "CROSSSLOT" not in str(errors)

    # And every key of a call is on the node that owns its shard's slot (one slot), and
    # the default 16 shards put calls on all three primaries
    nodes = set()
    for c in [*warm, call]:
        slots = {cluster_probe.keyslot(store.key(c.call_id, n)) for n in ("spec", "result")}
        slots.add(cluster_probe.keyslot(store.index_keys(store.shard(c.call_id))[0]))
        assert len(slots) == 1
        assert cluster_probe.execute_command(
            "CLUSTER", "KEYSLOT", store.key(c.call_id, "events"), target_nodes=cluster_probe.RANDOM
        ) == slots.pop()
        node = cluster_probe.get_node_from_key(store.key(c.call_id, "result"))
        with redis.Redis(host=node.host, port=node.port) as direct:  # MOVED if elsewhere
            assert direct.get(store.key(c.call_id, "result"))
            assert direct.zscore(store.index_keys(store.shard(c.call_id))[0], c.call_id) is None
        nodes.add(node.name)
    assert len(nodes) == 3


def test_cluster_expired_reads_every_shard_on_every_node(open_cluster) -> None:
    # Given lapsed calls spread over the shards (so over the nodes)
    cfg = GuardConfig(lease_ttl_s=0.2)
    store = open_cluster()
    calls = [new_call() for _ in range(24)]
    for call in calls:
        claim(store, call, "w1", cfg)
    assert store.expired() == []
    time.sleep(0.3)

    # Then recovery finds every one of them, from any store of the fleet
    found = {c.call_id for c in open_cluster().expired()}
    assert found == {c.call_id for c in calls}
    assert len({store.shard(c.call_id) for c in calls}) > 3


def test_unreachable_cluster_raises_store_unavailable_at_first_use_not_at_open() -> None:
    store = open_store(f"redis+cluster://127.0.0.1:{free_port()}", socket_connect_timeout=0.2)
    assert isinstance(store, RedisStore)
    with pytest.raises(StoreUnavailable) as raised:
        store.begin(new_call(), "w1", CFG)
    assert isinstance(raised.value.__cause__, (redis.RedisError, redis.exceptions.RedisClusterException))
    store.close()


def server_work(probe: redis.Redis, act: Callable[[], object]) -> tuple[int, int]:
    """(round trips, commands its scripts ran) on the server while ``act`` ran."""
    before = probe.info("commandstats")
    act()
    after = probe.info("commandstats")
    delta = {name.removeprefix("cmdstat_"): after[name]["calls"] - before.get(name, {"calls": 0})["calls"]
             for name in after}
    delta = {name: n for name, n in delta.items() if n and name not in ("info", "hello", "client|setinfo")}
    return delta.pop("evalsha", 0), sum(delta.values())


def test_each_path_takes_the_round_trips_its_plan_needs_and_few_commands(open_redis, probe) -> None:
    # Given a warm store (scripts cached) and a registered call, as the publisher leaves it
    store = open_redis()
    warm = claim(store, new_call(), "w1")
    store.finish(warm.lease, Outcome.success(0), CFG)
    store.claim_recovery(warm.lease.call_id, "w1", 1.0)
    call = new_call()
    store.register(call)

    # Then the common paths are one round trip each, with the commands counted in the CHANGELOG
    # (begin 18 -> 12, finish 16 -> 11 when the scripts stopped deciding)
    leases: list[Claimed] = []
    assert server_work(probe, lambda: leases.append(claim(store, call, "w1"))) == (1, 12)
    assert server_work(probe, lambda: store.finish(leases[0].lease, Outcome.success(1), CFG)) == (1, 11)
    # a redelivery of a finished call, and of a running one, write nothing: no second trip
    assert server_work(probe, lambda: store.begin(call, "w2", CFG))[0] == 1
    running = claim(store, new_call(), "w1")
    assert server_work(probe, lambda: store.begin(CallSpec(running.lease.call_id), "w2", CFG))[0] == 1
    # a retried finish whose first write landed: no second trip either
    assert server_work(probe, lambda: store.finish(leases[0].lease, Outcome.success(1), CFG))[0] == 1

    # And a call in another state than the one planned for costs one more round trip, no more
    lost = claim(store, new_call(), "w1")
    store.release(lost.lease)
    again: list[object] = []
    assert server_work(probe, lambda: again.append(store.begin(CallSpec(lost.lease.call_id), "w2", CFG)))[0] == 2
    assert isinstance(again[0], Claimed) and again[0].attempt == 2
    late = server_work(probe, lambda: again.append(store.finish(lost.lease, Outcome.success(2), CFG)))
    assert late[0] == 2 and isinstance(again[1], Stale)
    assert server_work(probe, lambda: store.claim_recovery(running.lease.call_id, "w3", 1.0))[0] == 1


def test_a_begin_retried_with_its_token_after_its_reply_was_lost_claims_in_one_round_trip(
        open_redis, probe, redis_url) -> None:
    # Given a begin whose write landed while its reply was lost (a busy server, a 0.2 s timeout)
    store = open_redis(socket_timeout=0.2)
    warm = claim(store, new_call(), "w1")
    store.finish(warm.lease, Outcome.success(0), CFG)
    call, token = new_call(), "token-1"
    recovered = busy_server(probe, redis_url)
    with pytest.raises(StoreUnavailable):
        store.begin(call, "w1", CFG, token)
    recovered()

    # When the runner retries it with the same token
    got: list[object] = []
    trips, _ = server_work(probe, lambda: got.append(store.begin(call, "w1", CFG, token)))

    # Then the same attempt is claimed again, planned as landed: one round trip, one started event
    assert isinstance(got[0], Claimed) and got[0].attempt == 1 and got[0].lease.token == token
    assert trips == 1
    assert [e.type for e in store.events(call.call_id)] == [STARTED]
