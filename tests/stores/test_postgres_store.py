"""PostgresStore: a lease is a session-level advisory lock, so it lives exactly as long
as the holder's database session. These tests kill sessions and processes and check
that the next worker takes over at once, and that a live holder is never replaced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.errors import StoreUnavailable, UnsafeDeployment
from aaa_celery.lifecycle import (
    STALE_RESULT,
    STARTED,
    Accepted,
    Busy,
    CallSpec,
    Claimed,
    Finished,
    Outcome,
    Refused,
    Stale,
)
from aaa_celery.stores import open_store
from aaa_celery.stores.sql.lease_sessions import check_session_pinned, key_halves, lock_key
from aaa_celery.stores.sql.postgres import PostgresStore

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]


def new_call() -> CallSpec:
    call_id = f"call-{uuid.uuid4().hex[:12]}"
    return CallSpec(call_id, name="charge", idempotency_key=call_id, request={"task": "tools.charge"})


def claim(store: PostgresStore, call: CallSpec, worker: str, cfg: GuardConfig) -> Claimed:
    got = store.begin(call, worker, cfg)
    assert isinstance(got, Claimed), got
    return got


def terminate_backend(store: PostgresStore, pid: int) -> None:
    """End one server session, as a cut connection or a dead worker would."""
    with store.engine.begin() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
        deadline = time.monotonic() + 10
        alive = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
        # Within one transaction pg_stat_activity is a snapshot taken at its first read;
        # clear it on each poll, or a backend seen alive once stays alive forever here.
        while True:
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            if not conn.execute(alive, {"pid": pid}).scalar():
                break
            assert time.monotonic() < deadline, f"backend {pid} did not exit"
            time.sleep(0.01)


def advisory_locks_on(store: PostgresStore, call_id: str) -> int:
    hi, lo = key_halves(lock_key(call_id))
    query = sa.text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid::bigint = :hi AND objid::bigint = :lo"
    )
    with store.engine.begin() as conn:
        return conn.execute(query, {"hi": hi, "lo": lo}).scalar_one()


@pytest.fixture
def stores(postgres_url: str):
    opened: list[PostgresStore] = []

    def make(**kw) -> PostgresStore:
        store = PostgresStore(postgres_url, **kw)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def test_terminated_holder_session_lets_next_worker_claim_attempt_2_at_least_once(stores):
    # Given worker A holds attempt 1
    a, b = stores(), stores()
    call, cfg = new_call(), GuardConfig(delivery=Delivery.AT_LEAST_ONCE)
    lease = claim(a, call, "A", cfg).lease
    assert isinstance(b.begin(call, "B", cfg), Busy)
    # When A's database session is terminated
    terminate_backend(a, a.lease_backend_pid(lease))
    # Then B claims attempt 2 at once, A's heartbeat fails and A's late result is fenced
    second = claim(b, call, "B", cfg).lease
    assert second.attempt == 2
    assert a.renew(lease) is False
    assert isinstance(a.finish(lease, Outcome.success("late"), cfg), Stale)
    assert b.finish(second, Outcome.success("ok"), cfg) == Accepted(Outcome.success("ok", attempt=2))
    kinds = [(e.type, e.attempt) for e in b.events(call.call_id)]
    assert kinds[:2] == [(STARTED, 1), (STARTED, 2)]
    assert (STALE_RESULT, 1) in kinds


def test_terminated_holder_session_at_most_once_reports_outcome_unknown(stores):
    a, b = stores(), stores()
    call, cfg = new_call(), GuardConfig(delivery=Delivery.AT_MOST_ONCE)
    lease = claim(a, call, "A", cfg).lease
    terminate_backend(a, a.lease_backend_pid(lease))
    refused = b.begin(call, "B", cfg)
    assert isinstance(refused, Refused)
    assert refused.result.error == "OutcomeUnknown"
    assert b.result(call.call_id) == refused.result


def test_connected_holder_keeps_the_lease_past_any_ttl(stores):
    # Given a lease with a tiny TTL, and a clock that jumps a day ahead
    now = [1_000.0]
    a, b = stores(clock=lambda: now[0]), stores(clock=lambda: now[0])
    call, cfg = new_call(), GuardConfig(lease_ttl_s=0.2)
    lease = claim(a, call, "A", cfg).lease
    assert lease.expires_at is None and a.ttl_leases is False
    # When well over the TTL passes, on the wall clock and on the store's clock
    time.sleep(0.6)
    now[0] += 86_400
    # Then the holder still has the call: others are Busy and recovery does not list it
    assert b.begin(call, "B", cfg) == Busy("A", None)
    assert b.expired(unclaimed_grace_s=0) == []
    assert a.renew(lease) is True
    assert b.renew(lease) is True  # seen from another store instance too


def test_kill_9_holder_process_frees_the_lease_at_once(stores, postgres_url):
    # Given a worker process that claimed a call and then hangs
    store, call, cfg = stores(), new_call(), GuardConfig()
    script = textwrap.dedent(
        f"""
        import time
        from aaa_celery.config import GuardConfig
        from aaa_celery.lifecycle import CallSpec
        from aaa_celery.stores.sql.postgres import PostgresStore
        store = PostgresStore({postgres_url!r})
        got = store.begin(CallSpec({call.call_id!r}), "doomed", GuardConfig())
        print(got.lease.attempt, flush=True)
        time.sleep(600)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "1"
        assert store.begin(call, "B", cfg) == Busy("doomed", None)
        # When the process is killed with SIGKILL
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed_at = time.monotonic()
        # Then the next worker claims attempt 2 within moments, with no TTL to wait out
        while not isinstance(got := store.begin(call, "B", cfg), Claimed):
            assert time.monotonic() - killed_at < 5, f"lease not freed after the holder died: {got!r}"
            time.sleep(0.02)
        assert got.attempt == 2
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_recovery_lists_a_call_once_its_holder_session_dies(stores):
    """Within one lease TTL of the death: the sweep asks the lock of a call only once the
    sweep hint its holder's renewals kept moving has lapsed (``lifecycle.sweep_hint``)."""
    a, b = stores(), stores()
    call, cfg = new_call(), GuardConfig()
    lease = claim(a, call, "A", cfg).lease
    past_hint = b.now() + cfg.lease_ttl_s + 1.0
    assert b.expired(unclaimed_grace_s=0) == []
    assert b.expired(now=past_hint, unclaimed_grace_s=0) == []  # the lock is held: live
    terminate_backend(a, a.lease_backend_pid(lease))
    assert b.expired(unclaimed_grace_s=0) == []  # its hint has not lapsed yet
    assert [c.call_id for c in b.expired(now=past_hint, unclaimed_grace_s=0)] == [call.call_id]
    assert b.expired(now=past_hint)[0].request == {"task": "tools.charge"}


def test_finish_and_release_give_the_advisory_lock_back(stores):
    store, cfg = stores(), GuardConfig()
    done, given_back = new_call(), new_call()
    lease = claim(store, done, "A", cfg).lease
    assert advisory_locks_on(store, done.call_id) == 1
    store.finish(lease, Outcome.success(1), cfg)
    other = claim(store, given_back, "A", cfg).lease
    store.release(other)
    assert advisory_locks_on(store, done.call_id) == 0
    assert advisory_locks_on(store, given_back.call_id) == 0
    assert claim(store, given_back, "B", cfg).attempt == 2


def test_refused_and_finished_deliveries_hold_no_lock(stores):
    store, call, cfg = stores(), new_call(), GuardConfig()
    store.finish(claim(store, call, "A", cfg).lease, Outcome.success(1), cfg)
    store.begin(call, "B", cfg)
    assert advisory_locks_on(store, call.call_id) == 0


def test_direct_connection_passes_the_session_pinning_check(stores):
    store = stores()
    with store.engine.connect() as conn:
        check_session_pinned(conn)


class _TransactionPooledConnection:
    """A connection whose every transaction lands on another server session."""

    def __init__(self) -> None:
        self.pid = 100

    def execute(self, _statement):
        self.pid += 1
        pid = self.pid

        class _Result:
            def scalar_one(self) -> int:
                return pid

        return _Result()

    def commit(self) -> None:
        pass


def test_transaction_pooling_proxy_is_refused_as_unsafe():
    with pytest.raises(UnsafeDeployment, match="transaction-pooling"):
        check_session_pinned(_TransactionPooledConnection())


def test_plain_postgresql_scheme_uses_the_psycopg_driver(postgres_url):
    plain = "postgresql://" + postgres_url.partition("://")[2]
    with open_store(plain) as store:
        assert isinstance(store, PostgresStore)
        assert store.engine.dialect.driver == "psycopg"


def test_unreachable_server_raises_store_unavailable_with_the_driver_error():
    with pytest.raises(StoreUnavailable) as info:
        PostgresStore(
            "postgresql+psycopg://postgres@127.0.0.1:1/postgres", connect_args={"connect_timeout": 2}
        )
    assert isinstance(info.value.__cause__, sa.exc.OperationalError)


def test_lock_keys_are_stable_signed_64_bit():
    assert lock_key("call-1") == lock_key("call-1") != lock_key("call-2")
    assert all(-(2**63) <= lock_key(f"c{i}") < 2**63 for i in range(100))


def test_idle_session_timeout_evicts_a_frozen_holder(stores):
    # Given a holder whose sessions the server ends after 0.5 s without a query
    frozen, other = stores(idle_session_timeout_s=0.5), stores()
    with frozen.engine.connect() as conn:
        if conn.dialect.server_version_info < (14,):
            pytest.skip("idle_session_timeout needs PostgreSQL 14+")
    call, cfg = new_call(), GuardConfig()
    lease = claim(frozen, call, "frozen", cfg).lease
    # When it stops heartbeating (frozen), the server disconnects it and frees the lease
    deadline = time.monotonic() + 10
    while not isinstance(got := other.begin(call, "B", cfg), Claimed):
        assert time.monotonic() < deadline, got
        time.sleep(0.1)
    assert got.attempt == 2
    assert frozen.renew(lease) is False


def test_a_call_whose_id_is_the_schema_lock_s_name_never_blocks_opening_the_store(stores):
    """Reproduces on 4156db8: the schema lock was the bigint advisory key of the string
    "aaa_celery:schema", the very key of a call (a plain task id) of that id; while that
    call was leased, every store that opened (a worker starting) waited for it to end."""
    first = stores()
    cfg = GuardConfig(delivery=Delivery.AT_LEAST_ONCE, lease_ttl_s=30)
    claim(first, CallSpec("aaa_celery:schema", name="charge", request={"task": "tools.charge"}), "w1", cfg)
    opened: list[PostgresStore] = []
    opener = threading.Thread(target=lambda: opened.append(stores()), daemon=True)
    opener.start()
    opener.join(20)  # opening needs milliseconds; the margin is for a loaded machine
    assert opened, "opening a store waited for the call's lease"


# -- Cost per operation (issue 23): statements, transactions, server sessions ------------


class _Wire:
    """What the store sends the server from now on, read from libpq's protocol trace of
    every connection it uses (the store runs its hot path on the driver, below SQLAlchemy's
    events): statements, transactions, and round trips (a simple query, or each Sync or
    Flush of the extended protocol: a wait for the server's answers; a Flush right after a
    Sync is the same wait)."""

    def __init__(self, store: PostgresStore, tmp: Path) -> None:
        from psycopg.pq import Trace

        self.tmp, self.files = tmp, {}

        def trace(pgconn) -> None:
            if id(pgconn) not in self.files:
                self.files[id(pgconn)] = f = open(tmp / f"trace-{len(self.files)}.txt", "w")  # noqa: SIM115
                pgconn.trace(f.fileno())
                pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)

        sa.event.listen(store.engine, "checkout", lambda dbapi, record, proxy: trace(dbapi.pgconn))
        trace(store._sessions.sessions[0].conn.connection.driver_connection.pgconn)
        self.seen: dict[int, int] = {}

    def take(self) -> tuple[int, int, int]:
        """(statements, transactions, round trips) sent since the last take."""
        statements = transactions = trips = 0
        for key, f in self.files.items():
            f.flush()
            lines = [ln.split("\t") for ln in (self.tmp / Path(f.name).name).read_text().splitlines()]
            sent = [ln[2] + (ln[3] if len(ln) > 3 else "") for ln in lines if ln[0] == "F"]
            new, self.seen[key] = sent[self.seen.get(key, 0):], len(sent)
            for i, msg in enumerate(new):
                if msg.startswith("Query"):  # a simple query: its statements, one round trip
                    parts = [p.strip(' "') for p in msg.removeprefix("Query").split("; ")]
                    transactions += parts.count("BEGIN")
                    statements += sum(1 for p in parts if p not in ("BEGIN", "COMMIT"))
                    trips += 1
                elif msg.startswith("Execute"):
                    statements += 1
                elif msg.startswith("Sync") or (msg.startswith("Flush") and not (i and new[i - 1].startswith("Sync"))):
                    trips += 1
        return statements, transactions, trips


def test_register_begin_and_finish_each_take_one_transaction_and_few_round_trips(stores, tmp_path):
    # Reproduces the cost issue 23 measured: register 2 statements in a transaction, begin 6 in
    # two transactions, finish 8 in two, each transaction a BEGIN and a COMMIT round trip more;
    # then (4dfc08d) 4 round trips each for begin and finish, BEGIN a round trip of its own;
    # then 3 each, the lock (begin) and the unlock (finish) a round trip of their own; then
    # 2 each, a round trip to read the row before the writes were planned; then (13b074f) 1
    # each, one multi-statement query parsed and planned anew by the server at every call.
    store, call, cfg = stores(), new_call(), GuardConfig()
    # not counted: the database's clock, read once in a while, opening the lease session,
    # and preparing each statement on its connection (once)
    for _ in range(2):
        store.register(warm := new_call())
        warm_lease = claim(store, warm, "A", cfg).lease
        store.renew(warm_lease)
        store.finish(warm_lease, Outcome.success(0), cfg)
    wire = _Wire(store, tmp_path)
    store.register(call)
    assert wire.take() == (1, 0, 1)  # one autocommitted insert
    lease = claim(store, call, "A", cfg).lease
    # one prepared statement on the lease session, autocommitted: aaa_begin_planned takes the
    # lock and the row's, checks the state the claim was planned for, makes the claim and the
    # event if it matched
    assert wire.take() == (1, 0, 1)
    assert store.renew(lease) is True
    assert wire.take() == (1, 0, 1)
    assert isinstance(store.finish(lease, Outcome.success(1), cfg), Accepted)
    # one prepared statement on the lease session, autocommitted: aaa_finish_planned locks the
    # row, checks, writes the result, clears the lease, appends the event, gives the lock back
    assert wire.take() == (1, 0, 1)
    assert advisory_locks_on(store, call.call_id) == 0


def test_statements_deallocated_on_the_store_s_connections_are_prepared_again(stores):
    # The hot path keeps its own prepared statements (pg_driver.fetch_prepared); psycopg sends
    # DEALLOCATE ALL after a rollback once it prepared statements of its own, and a pooler's
    # reset does too. Red first with the names remembered and never prepared again:
    # "prepared statement ... does not exist" (tests/stores/test_differential.py found it).
    store, cfg = stores(), GuardConfig()
    for _ in range(2):
        store.register(warm := new_call())
        store.finish(claim(store, warm, "A", cfg).lease, Outcome.success(0), cfg)
    session = store._sessions.sessions[0].conn.connection.driver_connection
    session.execute("DEALLOCATE ALL")
    with store.engine.connect() as conn:  # the pooled connection register takes
        conn.connection.driver_connection.execute("DEALLOCATE ALL")
    call = new_call()
    store.register(call)
    lease = claim(store, call, "A", cfg).lease
    assert store.renew(lease) is True
    assert isinstance(store.finish(lease, Outcome.success(1), cfg), Accepted)
    assert store.result(call.call_id).value == 1
    assert advisory_locks_on(store, call.call_id) == 0


def test_the_first_begin_of_a_call_nobody_registered_is_one_statement_too(stores, tmp_path):
    # A message sent by name (app.send_task, or aaa_register_on_publish=False) reaches its
    # worker unregistered: its first begin found no row for aaa_begin_planned to check, then
    # ran the transaction of two round trips that inserts it (3 round trips, 2 transactions).
    store, cfg = stores(), GuardConfig()
    for _ in range(2):  # warm, as above: the clock, the lease session, the prepared statements
        warm = claim(store, new_call(), "A", cfg).lease
        store.finish(warm, Outcome.success(0), cfg)
    wire = _Wire(store, tmp_path)
    call = new_call()
    lease = claim(store, call, "A", cfg).lease
    assert wire.take() == (1, 0, 1)
    with store.engine.connect() as conn:  # registered as the transaction would have
        row = conn.execute(sa.text("SELECT spec, attempts FROM aaa_calls WHERE call_id = :c"),
                           {"c": call.call_id}).one()
    assert (CallSpec(**row.spec), row.attempts) == (call, 1)
    assert [e.type for e in store.events(call.call_id)] == ["aaa.tool.started"]
    wire.take()  # these two reads
    assert isinstance(store.finish(lease, Outcome.success(1), cfg), Accepted)
    assert wire.take() == (1, 0, 1)


def test_the_leases_of_a_process_share_one_server_session(stores, postgres_url):
    # Reproduces the scale limit of issue 23: one backend (and a connection opened) per lease.
    store, cfg = stores(), GuardConfig()
    leases = [claim(store, new_call(), "A", cfg).lease for _ in range(20)]
    pids = {store.lease_backend_pid(lease) for lease in leases}
    assert len(pids) == 1, pids
    with store.engine.connect() as conn:
        sessions = conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'aaa_celery'")).scalar_one()
    assert sessions <= 1 + 5, sessions  # the lease session and the pool (pool_size 5), not 20
    for lease in leases:
        assert store.renew(lease) is True
        store.finish(lease, Outcome.success(None), cfg)
        assert advisory_locks_on(store, lease.call_id) == 0


def test_a_second_delivery_of_a_running_call_in_the_same_process_is_busy(stores):
    # Advisory locks are re-entrant within a session: the lease session must not grant a
    # running call's lock again to a second delivery in the same process.
    store, call, cfg = stores(), new_call(), GuardConfig(delivery=Delivery.AT_LEAST_ONCE)
    lease = claim(store, call, "A", cfg).lease
    assert store.begin(call, "A2", cfg) == Busy("A", None)
    assert store.begin(call, "A3", cfg, token="other") == Busy("A", None)
    assert store.renew(lease) is True
    assert store.finish(lease, Outcome.success(1), cfg) == Accepted(Outcome.success(1, attempt=1))
    assert advisory_locks_on(store, call.call_id) == 0


def test_leases_on_a_terminated_lease_session_all_lapse_and_the_next_claim_opens_a_new_one(stores):
    a, b, cfg = stores(), stores(), GuardConfig(delivery=Delivery.AT_LEAST_ONCE)
    first, second = new_call(), new_call()
    leases = [claim(a, c, "A", cfg).lease for c in (first, second)]
    terminate_backend(a, a.lease_backend_pid(leases[0]))
    assert [a.renew(lease) for lease in leases] == [False, False]
    assert claim(b, first, "B", cfg).attempt == 2
    third = claim(a, new_call(), "A", cfg).lease  # a's next claim works, on a new session
    assert a.lease_backend_pid(third) != a.lease_backend_pid(leases[0])
    assert a.renew(third) is True
    assert claim(a, second, "A", cfg).attempt == 2


def _terminate_store_sessions(postgres_url: str) -> None:
    """End every session the stores opened (a database restart or failover, as a store sees it)."""
    psycopg = pytest.importorskip("psycopg")
    url = "postgresql://" + postgres_url.partition("://")[2]
    with psycopg.connect(url, autocommit=True, application_name="killer") as con:
        pids = [r[0] for r in con.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'aaa_celery'").fetchall()]
        assert pids
        for pid in pids:
            con.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while con.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone()[0]:
            time.sleep(0.01)


def test_register_right_after_its_pooled_connection_was_terminated_still_registers(stores, postgres_url):
    # A pooled connection is pinged only after PING_IDLE_S unused; one that died since its
    # last use fails the insert, which register retries on a new connection: a call sent
    # unregistered could not be recovered if its message were lost.
    store, first, second = stores(), new_call(), new_call()
    store.register(first)
    _terminate_store_sessions(postgres_url)
    store.register(second)
    assert {c.call_id for c in store.expired(unclaimed_grace_s=0)} >= {first.call_id, second.call_id}


def test_a_fresh_store_whose_pooled_connections_were_ended_begins_and_finishes(stores, postgres_url):
    # A store opened just before its server ended every session (benchmarks/scale.py's reset,
    # a failover): its first operation reads the database clock on a dead pooled connection,
    # which must be retried on a new one (SQLAlchemy drops the older connections of a pool on
    # a disconnect), as register and the lease session do, not fail the claim.
    store, call = stores(), new_call()
    store.register(call)
    _terminate_store_sessions(postgres_url)
    store._clock_base = None  # a store that has not read the database clock yet
    cfg = GuardConfig()
    begun = store.begin(call, "w1", cfg)
    assert isinstance(begun, Claimed)
    assert isinstance(store.finish(begun.lease, Outcome.success(1), cfg), Accepted)


# -- begin and finish on the lease session (issue 23 item 1) ------------------------------


def _checkouts(store: PostgresStore) -> list[int]:
    """A counter of the store's pool checkouts from now on."""
    seen = [0]

    def count(dbapi, record, proxy) -> None:
        seen[0] += 1

    sa.event.listen(store.engine, "checkout", count)
    return seen


class _WatchedLock:
    """A lock that counts the non-blocking acquires it refused, and the acquires waiting for it."""

    def __init__(self) -> None:
        self.inner, self.refused, self.waiting = threading.Lock(), 0, 0

    def acquire(self, blocking: bool = True) -> bool:
        self.waiting += blocking
        got = self.inner.acquire(blocking)
        self.waiting -= blocking
        self.refused += not got
        return got

    def release(self) -> None:
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def test_begin_and_finish_on_a_free_lease_session_take_no_pooled_connection(stores):
    store, call, cfg = stores(), new_call(), GuardConfig()
    store.register(call)
    claim(store, new_call(), "A", cfg)  # the session is open (its connection, checked out once)
    seen = _checkouts(store)
    lease = claim(store, call, "A", cfg).lease
    assert store.renew(lease) is True
    assert isinstance(store.finish(lease, Outcome.success(1), cfg), Accepted)
    assert seen == [0]
    assert advisory_locks_on(store, call.call_id) == 0


def test_a_begin_while_another_thread_uses_the_lease_session_goes_through_the_pool_a_finish_waits(stores):
    # With one lease session (lease_sessions=1), a begin that finds it busy does not queue on
    # it for its whole transaction, it takes a pooled connection (and the session for the lock).
    # A finish waits for the session that holds its lease (session 12: it took the pooled
    # path, two round trips more, then waited for the session all the same to unlock).
    store, call, cfg = stores(lease_sessions=1), new_call(), GuardConfig()
    store.register(call)
    claim(store, new_call(), "A", cfg)  # the session is open
    seen, done = _checkouts(store), []
    lock = store._sessions.sessions[0].lock = _WatchedLock()

    def busy_session(work, until) -> None:
        with lock:  # as another thread's transaction on the session would
            worker = threading.Thread(target=lambda: done.append(work()), daemon=True)
            worker.start()
            deadline = time.monotonic() + 20
            while not until() and time.monotonic() < deadline:
                time.sleep(0.005)
        worker.join(20)

    refused = lock.refused
    busy_session(lambda: store.begin(call, "A", cfg), lambda: lock.refused > refused)
    assert isinstance(done[-1], Claimed), done
    assert seen[0] >= 1
    assert advisory_locks_on(store, call.call_id) == 1
    assert store.renew(done[-1].lease) is True
    before, fallbacks, lease = seen[0], store._sessions.fallbacks, done[-1].lease
    busy_session(lambda: store.finish(lease, Outcome.success(1), cfg), lambda: lock.waiting)
    assert isinstance(done[-1], Accepted), done
    assert (seen[0], store._sessions.fallbacks) == (before, fallbacks)
    assert advisory_locks_on(store, call.call_id) == 0


def test_a_begin_that_fails_after_taking_the_lock_gives_it_back_and_keeps_the_session(stores):
    # The lock is taken in the transaction's first query; a failure after it (here a row whose
    # spec this release cannot read) rolls back and gives back that lock only: the other leases
    # on the session live on.
    store, cfg = stores(), GuardConfig()
    held = claim(store, new_call(), "A", cfg).lease
    bad = new_call()
    store.register(bad)
    _unreadable_spec(store, bad)
    with pytest.raises(TypeError):
        store.begin(bad, "A", cfg)
    assert advisory_locks_on(store, bad.call_id) == 0
    assert store.renew(held) is True
    assert store.lease_backend_pid(claim(store, new_call(), "A", cfg).lease) == store.lease_backend_pid(held)
    assert isinstance(store.finish(held, Outcome.success(1), cfg), Accepted)


def _unreadable_spec(store: PostgresStore, call: CallSpec) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE aaa_calls SET spec = CAST(:spec AS json) WHERE call_id = :id"),
                     {"spec": f'{{"call_id": "{call.call_id}", "no_such_field": 1}}', "id": call.call_id})


def test_a_finish_that_fails_otherwise_than_unreachable_gives_the_lease_back(stores):
    # SQLStore.finish's rule: only a store that cannot be reached keeps the lease.
    store, cfg = stores(), GuardConfig()
    held = claim(store, new_call(), "A", cfg).lease
    lease = claim(store, call := new_call(), "A", cfg).lease
    _unreadable_spec(store, call)
    with pytest.raises(TypeError):
        store.finish(lease, Outcome.success(1), cfg)
    assert advisory_locks_on(store, call.call_id) == 0
    assert store.renew(held) is True


def test_a_finish_that_cannot_lock_the_row_keeps_the_lease_for_its_retry(stores, postgres_url):
    # SQLStore.finish's rule: a finish the store refused as unavailable keeps the lease, so that
    # the caller's retry still holds the call. Here the row is locked elsewhere past lock_timeout.
    store, call, cfg = stores(connect_args={"options": "-c lock_timeout=300"}), new_call(), GuardConfig()
    lease = claim(store, call, "A", cfg).lease
    other = sa.create_engine(sa.make_url(postgres_url).set(drivername="postgresql+psycopg"))
    try:
        with other.begin() as conn:
            conn.execute(sa.text("SELECT 1 FROM aaa_calls WHERE call_id = :id FOR UPDATE"), {"id": call.call_id})
            with pytest.raises(StoreUnavailable):
                store.finish(lease, Outcome.success(1), cfg)
            assert advisory_locks_on(store, call.call_id) == 1
            assert store.renew(lease) is True
    finally:
        other.dispose()
    assert store.finish(lease, Outcome.success(1), cfg) == Accepted(Outcome.success(1, attempt=1))
    assert advisory_locks_on(store, call.call_id) == 0
    assert store.renew(lease) is False


# -- One round trip on the happy path; any other state planned again (issue 23 item 1) ----


def _warm(store: PostgresStore, cfg: GuardConfig) -> None:
    """Open the lease session and prepare its statements (not counted)."""
    for _ in range(2):
        store.register(warm := new_call())
        warm_lease = claim(store, warm, "A", cfg).lease
        store.renew(warm_lease)
        store.finish(warm_lease, Outcome.success(0), cfg)


def test_a_first_begin_whose_row_is_not_as_planned_writes_nothing_and_keeps_the_lock_it_took(stores, tmp_path):
    store, cfg = stores(), GuardConfig()
    _warm(store, cfg)
    call = new_call()
    # registered as sent with another key (a key function changed between publish and run):
    # the function's check fails after it took the lock
    store.register(CallSpec(call.call_id, call.name, "another-key", call.request))
    wire = _Wire(store, tmp_path)
    got = claim(store, call, "A", cfg)
    assert got.attempt == 1
    # the function's call (its check fails), then the transaction that decides from the row
    # (the lock kept from the function's call: not taken twice)
    statements, transactions, trips = wire.take()
    assert (transactions, trips) == (1, 3), (statements, transactions, trips)
    assert advisory_locks_on(store, call.call_id) == 1
    # one unlock frees it: a lock taken twice (re-entrant) would still be held
    assert store.finish(got.lease, Outcome.success(1), cfg) == Accepted(Outcome.success(1, attempt=1))
    assert advisory_locks_on(store, call.call_id) == 0
    assert [e.type for e in store.events(call.call_id)] == [STARTED, "aaa.tool.completed"]


def test_a_redelivery_is_planned_again_from_its_row(stores, tmp_path):
    # The function's call is planned for a first delivery; a call claimed before (its holder's
    # session gone) fails the check, writes nothing, and is decided from its row.
    a, b, cfg = stores(), stores(), GuardConfig(delivery=Delivery.AT_LEAST_ONCE)
    call = new_call()
    a.register(call)
    first = claim(a, call, "A", cfg).lease
    terminate_backend(a, a.lease_backend_pid(first))
    _warm(b, cfg)
    wire = _Wire(b, tmp_path)
    second = claim(b, call, "B", cfg)
    assert second.attempt == 2
    assert wire.take()[2] >= 3  # the function's call, then the transaction
    assert [(e.type, e.attempt) for e in b.events(call.call_id)] == [(STARTED, 1), (STARTED, 2)]
    assert isinstance(a.finish(first, Outcome.success("late"), cfg), Stale)
    assert b.finish(second.lease, Outcome.success(2), cfg) == Accepted(Outcome.success(2, attempt=2))
    assert b.result(call.call_id) == Outcome.success(2, attempt=2)
    assert advisory_locks_on(b, call.call_id) == 0


def test_a_delivery_with_another_spec_than_registered_keeps_what_merge_spec_keeps(stores):
    store, cfg = stores(), GuardConfig()
    registered = new_call()
    store.register(registered)
    sent = CallSpec(registered.call_id, name="charge", idempotency_key=registered.idempotency_key,
                    request={"task": "tools.charge", "args": [1]})
    got = claim(store, sent, "A", cfg)
    assert got.attempt == 1
    from aaa_celery.lifecycle import merge_spec

    with store.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT spec FROM aaa_calls WHERE call_id = :id"),
                              {"id": registered.call_id}).scalar_one()
    assert CallSpec(**stored) == merge_spec(registered, sent)
    assert isinstance(store.finish(got.lease, Outcome.success(1), cfg), Accepted)


def test_a_finish_of_a_superseded_attempt_is_planned_again_and_gives_its_lock_back(stores, tmp_path):
    store, cfg = stores(), GuardConfig(delivery=Delivery.AT_LEAST_ONCE)
    _warm(store, cfg)
    call = new_call()
    store.register(call)
    lease = claim(store, call, "A", cfg).lease
    with store.engine.begin() as conn:  # as a recovery's claim by another worker would leave it
        conn.execute(sa.text("UPDATE aaa_calls SET attempts = 2 WHERE call_id = :id"), {"id": call.call_id})
    wire = _Wire(store, tmp_path)
    assert isinstance(store.finish(lease, Outcome.success("old"), cfg), Stale)
    assert wire.take()[1:] == (1, 3)  # the function's call (check failed), then the transaction
    assert advisory_locks_on(store, call.call_id) == 0
    assert store.result(call.call_id) is None
    assert [e.type for e in store.events(call.call_id)] == [STARTED, STALE_RESULT]


def _stored_spec(store: PostgresStore, call_id: str) -> CallSpec:
    with store.engine.connect() as conn:
        return CallSpec(**conn.execute(sa.text("SELECT spec FROM aaa_calls WHERE call_id = :id"),
                                       {"id": call_id}).scalar_one())


def test_a_worker_s_delivery_of_a_call_registered_as_sent_takes_one_round_trip(stores, tmp_path):
    # The app registers the message as sent; the worker's begin has the request it rebuilt
    # (merge_spec keeps the stored one): the plan's writes are the same, so one statement.
    store, cfg = stores(), GuardConfig()
    _warm(store, cfg)
    call_id = f"call-{uuid.uuid4().hex[:12]}"
    sent = CallSpec(call_id, "charge", "key-1", {"task": "tools.charge", "message": {"body": "..."}})
    store.register(sent)
    wire = _Wire(store, tmp_path)
    got = claim(store, CallSpec(call_id, "charge", "key-1", {"task": "tools.charge", "args": [1]}), "A", cfg)
    assert wire.take() == (1, 0, 1)
    assert _stored_spec(store, call_id) == sent
    [started] = store.events(call_id)
    assert (started.type, started.data["name"], started.data["idempotency_key"]) == (STARTED, "charge", "key-1")
    wire.take()  # (the reads above)
    assert isinstance(store.finish(got.lease, Outcome.success(1), cfg), Accepted)
    assert wire.take() == (1, 0, 1)


def test_a_delivery_that_says_better_how_to_send_the_call_is_planned_again_and_kept(stores):
    store, cfg = stores(), GuardConfig()
    call_id = f"call-{uuid.uuid4().hex[:12]}"
    store.register(CallSpec(call_id, "charge", "key-1"))  # no request: recovery could not send it
    rebuilt = CallSpec(call_id, "charge", "key-1", {"task": "tools.charge", "args": [1]})
    got = claim(store, rebuilt, "A", cfg)
    assert _stored_spec(store, call_id) == rebuilt
    other = CallSpec(call_id, "refund", "key-2", {"task": "tools.refund"})  # a name the stored spec lacks
    store.register(c2 := CallSpec(f"call-{uuid.uuid4().hex[:12]}", "charge", "key-3", {"task": "t"}))
    second = claim(store, CallSpec(c2.call_id, other.name, other.idempotency_key, other.request), "A", cfg)
    assert _stored_spec(store, c2.call_id) == c2  # kept (rank 1, not better), and planned with it:
    assert store.events(c2.call_id)[0].data["name"] == "charge"
    for lease in (got.lease, second.lease):
        assert isinstance(store.finish(lease, Outcome.success(1), cfg), Accepted)


def _in_threads(work, calls: list[CallSpec], n: int) -> None:
    """Run ``work`` on ``n`` threads at once, each with every n-th of ``calls``."""
    threads = [threading.Thread(target=work, args=(calls[i::n],), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def test_threads_sharing_one_store_each_get_their_own_call_and_leave_no_lock(stores):
    # A threads pool: begin and finish race for the one lease session; those that find it
    # busy take the pool. Every call is claimed once, finished once, and its lock freed.
    store, cfg = stores(), GuardConfig()
    calls = [new_call() for _ in range(60)]
    for c in calls:
        store.register(c)
    results, errors = {}, []

    def work(mine: list[CallSpec]) -> None:
        try:
            for c in mine:
                lease = claim(store, c, "T", cfg).lease
                assert store.renew(lease) is True
                results[c.call_id] = store.finish(lease, Outcome.success(c.call_id), cfg)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    _in_threads(work, calls, 6)
    assert errors == []
    assert all(results[c.call_id] == Accepted(Outcome.success(c.call_id, attempt=1)) for c in calls)
    assert all(s.keys == {} for s in store._sessions.sessions)
    assert sum(advisory_locks_on(store, c.call_id) for c in calls) == 0


def test_two_threads_delivering_one_call_claim_it_once(stores):
    store, cfg = stores(), GuardConfig(delivery=Delivery.AT_LEAST_ONCE)
    for _ in range(10):
        call = new_call()
        store.register(call)
        barrier, got = threading.Barrier(2), []

        def deliver(worker: str) -> None:
            barrier.wait(10)
            got.append(store.begin(call, worker, cfg))

        threads = [threading.Thread(target=deliver, args=(w,), daemon=True) for w in ("A", "B")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        claimed = [g for g in got if isinstance(g, Claimed)]
        assert len(claimed) == 1 and len(got) == 2, got
        assert isinstance([g for g in got if g is not claimed[0]][0], Busy), got
        assert isinstance(store.finish(claimed[0].lease, Outcome.success(1), cfg), Accepted)
        assert advisory_locks_on(store, call.call_id) == 0


# -- The server-side functions (issue 23 item 1, step 3) ----------------------------------


def test_a_finish_keeps_the_lease_s_key_held_until_its_result_commits(stores):
    # aaa_finish_planned gives the session lock back inside its transaction: the key must stay
    # held until the commit, or a begin elsewhere takes it and reads the row beside a result it
    # cannot see yet. A deferred trigger holds the commit open for the test.
    a, b, cfg = stores(), stores(), GuardConfig(delivery=Delivery.AT_LEAST_ONCE)
    _warm(a, cfg)
    call = new_call()
    a.register(call)
    lease = claim(a, call, "A", cfg).lease
    with a.engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE FUNCTION aaa_test_slow_commit() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$"))
        conn.execute(sa.text(
            "CREATE CONSTRAINT TRIGGER aaa_test_slow_commit AFTER INSERT ON aaa_results"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION aaa_test_slow_commit()"))
    finished: list[object] = []
    finisher = threading.Thread(target=lambda: finished.append(a.finish(lease, Outcome.success(1), cfg)))
    finisher.start()
    try:
        key = lock_key(call.call_id)
        with b.engine.connect() as conn:
            deadline = time.monotonic() + 30
            while not conn.execute(sa.text(  # the finish is committing: the result row written
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep')")).scalar_one():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar_one() is False
            conn.rollback()
        begun = b.begin(call, "B", cfg)
        assert not isinstance(begun, Claimed), begun
    finally:
        finisher.join(30)
        with a.engine.begin() as conn:
            conn.execute(sa.text("DROP TRIGGER aaa_test_slow_commit ON aaa_results"))
            conn.execute(sa.text("DROP FUNCTION aaa_test_slow_commit()"))
    assert finished == [Accepted(Outcome.success(1, attempt=1))]
    assert isinstance(b.begin(call, "B", cfg), Finished)
    assert advisory_locks_on(a, call.call_id) == 0


def test_a_database_without_the_functions_runs_begin_and_finish_in_two_round_trips(stores, tmp_path):
    # A schema not migrated to 0003 (as 0.1.0 or 0002 left it): the functions are missing; the
    # store still serves every call, in its transactions of two round trips.
    store, cfg = stores(), GuardConfig()
    with store.engine.begin() as conn:
        for name in ("aaa_begin_planned", "aaa_finish_planned"):
            conn.execute(sa.text(f"DROP FUNCTION {name}"))
    _warm(store, cfg)
    wire, call = _Wire(store, tmp_path), new_call()
    store.register(call)
    wire.take()
    lease = claim(store, call, "A", cfg).lease
    assert wire.take()[1:] == (1, 2)
    assert store.finish(lease, Outcome.success(1), cfg) == Accepted(Outcome.success(1, attempt=1))
    assert wire.take()[1:] == (1, 2)
    assert advisory_locks_on(store, call.call_id) == 0
    assert [e.type for e in store.events(call.call_id)] == [STARTED, "aaa.tool.completed"]


def _lease_pids(store: PostgresStore) -> dict[int, int]:
    """How many advisory locks each server session of ``store`` holds (``pg_locks``)."""
    with store.engine.connect() as conn:
        return dict(conn.execute(sa.text(
            "SELECT l.pid, count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'aaa_celery'"
            " GROUP BY l.pid")).all())


def test_leases_spread_over_a_few_sessions_each_holding_at_most_the_cap(stores):
    # Issue 23: every lease on one session made each statement there cost O(leases held).
    from tests.stores.conftest import lose_lease

    store, cfg = stores(), GuardConfig(delivery=Delivery.AT_LEAST_ONCE)
    store._sessions.CAP = 50
    calls = [new_call() for _ in range(120)]
    leases = [claim(store, c, "A", cfg).lease for c in calls]
    pids = [store.lease_backend_pid(lease) for lease in leases]
    assert sorted({p: pids.count(p) for p in pids}.values()) == [20, 50, 50]
    assert sorted(_lease_pids(store).values()) == [20, 50, 50]
    # a second delivery of a held call is busy whichever session holds it
    for i in (0, 60, 110):
        assert store.begin(calls[i], "A2", cfg) == Busy("A", None)
        assert store.begin(calls[i], "A3", cfg, token="other") == Busy("A", None)
    assert sorted(_lease_pids(store).values()) == [20, 50, 50]
    # terminating one session loses only its leases
    lose_lease(store, leases[60])
    lost = {i for i, p in enumerate(pids) if p == pids[60]}
    assert len(lost) == 50
    for i, lease in enumerate(leases):
        assert store.renew(lease) is (i not in lost), i
    again = claim(store, calls[60], "B", cfg)
    assert again.lease.attempt == 2
    for i, lease in enumerate(leases):
        if i not in lost:
            assert isinstance(store.finish(lease, Outcome.success(i), cfg), Accepted), i
    assert isinstance(store.finish(again.lease, Outcome.success(60), cfg), Accepted)
    assert sum(advisory_locks_on(store, c.call_id) for c in calls) == 0
    assert all(s.keys == {} for s in store._sessions.sessions)


def test_past_the_cap_on_every_session_new_leases_go_to_the_least_loaded(stores):
    store, cfg = stores(lease_sessions=3), GuardConfig()
    store._sessions.CAP = 20
    leases = [claim(store, new_call(), "A", cfg).lease for _ in range(90)]
    assert sorted(_lease_pids(store).values()) == [30, 30, 30]
    for lease in leases:
        assert isinstance(store.finish(lease, Outcome.success(None), cfg), Accepted)
    assert _lease_pids(store) == {}


def test_threads_each_get_a_lease_session_of_their_own_most_of_the_time(stores):
    # Issue 23: 8 threads shared one lease session; one that found it busy took the pooled
    # path (3 round trips instead of 1). Now they spread over up to 8 sessions.
    store, cfg = stores(), GuardConfig()
    calls = [new_call() for _ in range(240)]
    for c in calls:
        store.register(c)
    claimed: dict[str, int] = {}
    results, errors = {}, []
    seen_lock = threading.Lock()

    def work(mine: list[CallSpec]) -> None:
        try:
            for c in mine:
                lease = claim(store, c, "T", cfg).lease
                with seen_lock:
                    claimed[c.call_id] = claimed.get(c.call_id, 0) + 1
                results[c.call_id] = store.finish(lease, Outcome.success(c.call_id), cfg)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    before = store._sessions.fallbacks
    _in_threads(work, calls, 8)
    assert errors == []
    assert claimed == {c.call_id: 1 for c in calls}
    assert all(results[c.call_id] == Accepted(Outcome.success(c.call_id, attempt=1)) for c in calls)
    fallbacks = store._sessions.fallbacks - before
    assert fallbacks <= len(calls) * 2 // 10, fallbacks  # of 480 begins and finishes
    assert 1 <= len(store._sessions.sessions) <= 8
    assert all(s.keys == {} for s in store._sessions.sessions)
    assert sum(advisory_locks_on(store, c.call_id) for c in calls) == 0


def test_lease_sessions_must_be_a_positive_int(postgres_url):
    from aaa_celery.errors import ConfigError

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="lease_sessions"):
            PostgresStore(postgres_url, lease_sessions=bad)
