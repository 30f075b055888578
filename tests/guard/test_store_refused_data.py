"""A value a store cannot hold is that call's bad input, never store trouble (issue 35, item 2).

Reproduces on 03c27cd: PostgreSQL refuses a NUL character in text and JSON
(``UntranslatableCharacter``, SQLSTATE 22P05); ``begin`` took it for store trouble, retried it
for a lease TTL and handed the message back to the broker, forever; a result holding a NUL was
retried by ``finish`` the same way. The classification lives in :mod:`aaa_celery.stores.blame`;
below, one test per class of error, each raised for real by its driver where one can be.
"""

from __future__ import annotations

import sqlite3
import time

import pytest
import sqlalchemy as sa

from aaa_celery.config import GuardConfig
from aaa_celery.errors import StoreOutdated, StoreUnavailable
from aaa_celery.guard import GuardRunner
from aaa_celery.lifecycle import FAILED, CallSpec
from aaa_celery.stores import open_store
from aaa_celery.stores.blame import data_error, describe

NUL = "a\x00b"


@pytest.fixture(params=["memory", "sqlite", "postgresql", "redis"])
def store(request, tmp_path):
    urls = {"memory": lambda: "memory://", "sqlite": lambda: f"sqlite:///{tmp_path}/store.db",
            "postgresql": lambda: request.getfixturevalue("postgres_url"),
            "redis": lambda: request.getfixturevalue("redis_url")}
    store = open_store(urls[request.param]())
    yield store
    store.close()


def _runner(store):
    return GuardRunner(store, GuardConfig(lease_ttl_s=5, wait_poll_s=0.25))


def test_an_argument_the_store_cannot_hold_fails_its_call_at_once(store):
    call = CallSpec("call-nul", "echo", request={"task": "echo", "args": [NUL]})
    started = time.monotonic()
    try:
        value = _runner(store).run(call, "w1", lambda attempt: NUL)
    except ValueError as e:  # PostgreSQL: the call fails, once, and nothing ran
        assert store.kind == "postgresql"
        assert "could not record this call" in str(e) and "UntranslatableCharacter" in str(e)
        recorded = store.result("call-nul")
        assert recorded is not None and recorded.error == "ValueError" and recorded.attempt == 0
        assert [e.type for e in store.events("call-nul")] == [FAILED]
    else:  # every other store holds it, unchanged
        assert store.kind != "postgresql" and value == NUL
        assert store.result("call-nul").ok
    assert time.monotonic() - started < 4.0  # never retried as store trouble for the lease TTL
    assert _runner(store).run(CallSpec("call-ok", "echo"), "w1", lambda attempt: "fine") == "fine"


@pytest.mark.parametrize("value", ["a\ud800b", 2**70, -(2**70), 1e308, [[[[[["deep"]]]]]]],
                         ids=["lone-surrogate", "huge-int", "huge-negative-int", "big-float", "nested"])
def test_other_values_a_plain_task_may_carry_run_or_fail_once(store, value):
    """What the tool check refuses may still reach a plain ``GuardedTask``: each either runs
    and comes back unchanged, or fails once with its error recorded; none is retried."""
    call = CallSpec("call-v", "echo", request={"task": "echo", "args": [value]})
    started = time.monotonic()
    try:
        assert _runner(store).run(call, "w1", lambda attempt: value) == value
    except (ValueError, TypeError):
        recorded = store.result("call-v")
        assert recorded is not None and not recorded.ok and recorded.attempt == 0
    assert time.monotonic() - started < 4.0  # never retried as store trouble for the lease TTL
    assert _runner(store).run(CallSpec("call-ok", "echo"), "w1", lambda attempt: "fine") == "fine"


def test_a_result_holding_a_nul_round_trips_on_every_store(store):
    started = time.monotonic()
    assert _runner(store).run(CallSpec("call-r", "echo"), "w1", lambda attempt: {"text": NUL}) == {"text": NUL}
    assert store.result("call-r").ok
    assert time.monotonic() - started < 4.0


def test_a_result_the_store_refuses_fails_its_call_once(postgres_url):
    """A store that refuses an outcome as data (here PostgreSQL's own ``DataError``, raised by
    the server for a ``finish`` whose outcome carries a marker) records a failure instead."""
    import psycopg

    from aaa_celery.stores.sql.postgres import PostgresStore

    class Refusing(PostgresStore):
        def finish(self, lease, outcome, config, copy=None):
            if outcome.ok and "refuse-me" in (outcome.value or ""):
                with psycopg.connect(postgres_url.replace("postgresql+psycopg", "postgresql")) as conn:
                    conn.execute("SELECT %s::jsonb", ('"a\\u0000b"',))
            return super().finish(lease, outcome, config, copy)

    store = Refusing(postgres_url)
    try:
        started = time.monotonic()
        with pytest.raises(ValueError, match="cannot hold this call's outcome: UntranslatableCharacter"):
            _runner(store).run(CallSpec("call-r", "echo"), "w1", lambda attempt: "refuse-me")
        assert time.monotonic() - started < 4.0
        recorded = store.result("call-r")
        assert recorded is not None and recorded.error == "ValueError" and recorded.attempt == 1
        assert [e.type for e in store.events("call-r")][-1] == FAILED
        assert _runner(store).run(CallSpec("call-ok", "echo"), "w1", lambda attempt: "fine") == "fine"
    finally:
        store.close()


def test_a_failure_whose_message_the_store_cannot_hold_is_recorded_without_it(store):
    def body(attempt):
        raise KeyError(NUL)

    with pytest.raises((KeyError, ValueError)):
        _runner(store).run(CallSpec("call-f", "echo"), "w1", body)
    assert store.result("call-f") is not None and not store.result("call-f").ok


# -- The classification: one test per class of error ------------------------------------------


def _pg_error(postgres_url, sql, *params):
    import psycopg

    with psycopg.connect(postgres_url.replace("postgresql+psycopg", "postgresql")) as conn:
        try:
            conn.execute(sql, params)
        except psycopg.Error as e:
            return e
    pytest.fail(f"{sql} did not fail")


def test_postgresql_data_exceptions_are_the_calls(postgres_url):
    untranslatable = _pg_error(postgres_url, "SELECT %s::jsonb", '"a\\u0000b"')  # SQLSTATE 22P05
    assert untranslatable.sqlstate == "22P05" and data_error(untranslatable) is untranslatable
    out_of_range = _pg_error(postgres_url, "SELECT %s::int", "99999999999")  # 22003
    assert data_error(out_of_range) is out_of_range
    nul_text = _pg_error(postgres_url, "SELECT %s::text", NUL)  # refused by psycopg itself
    assert data_error(nul_text) is nul_text
    engine = sa.create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with pytest.raises(sa.exc.DataError) as wrapped, engine.connect() as conn:
            conn.execute(sa.text("SELECT CAST(:v AS jsonb)"), {"v": '"a\\u0000b"'})
    finally:
        engine.dispose()
    assert data_error(wrapped.value) is wrapped.value


def test_postgresql_server_trouble_is_the_stores(postgres_url):
    import psycopg

    shutdown = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    read_only = _pg_error(postgres_url, "SET TRANSACTION READ ONLY; CREATE TEMP TABLE t (x int)")
    for error in (shutdown, read_only, psycopg.OperationalError("connection refused"),
                  psycopg.InterfaceError("the connection is closed"),
                  psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
                  psycopg.errors.UndefinedTable("relation aaa_calls does not exist")):
        assert data_error(error) is None, error


def test_encoding_errors_are_the_calls():
    try:
        "a\ud800".encode("utf-8")
    except UnicodeEncodeError as e:
        assert data_error(e) is e
    for error in (TypeError("Object of type object is not JSON serializable"),
                  ValueError("Out of range float values are not JSON compliant"),
                  OverflowError("Python int too large to convert to SQLite INTEGER")):
        assert data_error(error) is error
    wrapped = sa.exc.StatementError("bind", "INSERT", {}, TypeError("not serializable"))
    assert isinstance(data_error(wrapped), TypeError)  # SQLAlchemy's wrapper: its orig decides


def test_sqlite_errors(tmp_path):
    conn = sqlite3.connect(tmp_path / "x.db")
    try:
        conn.execute("SELECT ?", (2**70,))
    except OverflowError as e:
        assert data_error(e) is e
    assert data_error(sqlite3.DataError("string or blob too big")) is not None
    locked = sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    assert data_error(locked) is None
    assert data_error(sqlite3.OperationalError("disk I/O error")) is None
    conn.close()


def test_redis_errors(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        with pytest.raises(redis.DataError) as refused:
            client.set("k", object())  # a value redis-py cannot send
        assert data_error(refused.value) is refused.value
    finally:
        client.close()
    for error in (redis.ConnectionError("Connection refused"), redis.TimeoutError("Timeout reading"),
                  redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
                  redis.exceptions.BusyLoadingError("LOADING"), redis.ResponseError("OOM command not allowed")):
        assert data_error(error) is None, error


def test_the_guards_own_verdicts_are_the_stores():
    for error in (StoreUnavailable("postgresql store unavailable"), StoreOutdated("schema 3, this release runs 4")):
        try:
            raise error from ValueError("a cause")
        except Exception as e:
            assert data_error(e) is None


def test_describe_is_one_printable_line():
    assert describe(ValueError("bad\x00value\nDETAIL: more")) == "ValueError: bad?value"
