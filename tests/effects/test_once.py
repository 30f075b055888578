"""aaa_celery.effects.once through SQLAlchemy on real SQLite and PostgreSQL (issue 24): the
effect and its record commit in the caller's transaction; a later attempt or call with the
key gets the record without the effect; a stale attempt's transaction is rolled back."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from aaa_celery.context import ToolContext
from aaa_celery.effects import EffectLog, StaleFence, once
from aaa_celery.errors import ConfigError

from .conftest import make_shop, orders


def ctx(attempt: int = 1, call_id: str = "call-1", key: str = "refund:A-100") -> ToolContext:
    return ToolContext(engine=None, run_id="r", call_id=call_id, attempt=attempt, fence=attempt, idempotency_key=key,
                       tool="refund")


def refund(ran: list[int], attempt: int, cents: int = 500) -> Any:
    def apply(conn: Any) -> dict[str, Any]:
        ran.append(attempt)
        conn.execute(sa.text("UPDATE orders SET refunded_cents = refunded_cents + :c, refunds = refunds + 1"
                             " WHERE id = 'A-100'"), {"c": cents})
        return {"attempt": attempt, "total": conn.execute(sa.text("SELECT refunded_cents FROM orders")).scalar()}
    return apply


@pytest.fixture
def engine(shop_db: str) -> Any:
    e = sa.create_engine(shop_db)
    yield e
    e.dispose()


def test_a_later_attempt_gets_the_committed_value_and_the_effect_is_applied_once(engine, shop_db):
    ran: list[int] = []
    with engine.begin() as conn:
        first = once(conn, ctx(1), refund(ran, 1))
    # attempt 2 (the worker died after attempt 1's commit) and a new call with the same key
    with engine.begin() as conn:
        again = once(conn, ctx(2), refund(ran, 2))
    with engine.begin() as conn:
        other = once(conn, ctx(1, call_id="call-2"), refund(ran, 1))
    assert first == again == other == {"attempt": 1, "total": 500}
    assert ran == [1]
    assert orders(shop_db) == [("A-100", 500, 1)]


def test_a_stale_attempt_is_refused_before_its_effect_and_its_transaction_rolls_back(engine, shop_db):
    ran: list[int] = []
    with engine.begin() as conn:
        assert once(conn, ctx(2), refund(ran, 2)) == {"attempt": 2, "total": 500}
    with pytest.raises(StaleFence) as raised, engine.begin() as conn:
        conn.execute(sa.text("UPDATE orders SET refunded_cents = -1"))  # the caller's own write, same transaction
        once(conn, ctx(1), refund(ran, 1))
    assert (raised.value.key, raised.value.fence, raised.value.highest) == ("call-1", 1, 2)
    assert ran == [2]
    assert orders(shop_db) == [("A-100", 500, 1)]


def test_an_effect_that_fails_records_nothing_and_a_later_attempt_applies_it(engine, shop_db):
    def broken(conn: Any) -> None:
        conn.execute(sa.text("UPDATE orders SET refunds = refunds + 1"))
        raise RuntimeError("the effect failed")

    with pytest.raises(RuntimeError), engine.begin() as conn:
        once(conn, ctx(1), broken)
    ran: list[int] = []
    with engine.begin() as conn:
        assert once(conn, ctx(2), refund(ran, 2)) == {"attempt": 2, "total": 500}
    assert orders(shop_db) == [("A-100", 500, 1)]


def test_a_session_works_as_a_connection_does(engine, shop_db):
    ran: list[int] = []
    with Session(engine) as session, session.begin():
        assert once(session, ctx(1), refund(ran, 1))["total"] == 500
    with Session(engine) as session, session.begin():
        assert once(session, ctx(2), refund(ran, 2))["attempt"] == 1
    assert ran == [1]
    assert orders(shop_db) == [("A-100", 500, 1)]


def test_the_tables_go_on_the_apps_metadata(shop_db):
    metadata = sa.MetaData()
    sa.Table("orders", metadata, sa.Column("id", sa.String(40), primary_key=True))
    log = EffectLog(metadata)
    assert set(metadata.tables) == {"orders", "aaa_effects", "aaa_effect_fences"}
    assert log.table.name == "aaa_effects" and log.fences.table.name == "aaa_effect_fences"


def test_a_context_without_an_idempotency_key_is_refused(engine):
    with pytest.raises(ConfigError, match="idempotency_key"), engine.begin() as conn:
        once(conn, ToolContext.direct(), lambda conn: 1)


def test_a_value_that_is_no_json_is_refused_and_rolled_back(engine, shop_db):
    with pytest.raises(TypeError, match="JSON"), engine.begin() as conn:
        once(conn, ctx(1), lambda conn: (conn.execute(sa.text("UPDATE orders SET refunds = 9")), object())[1])
    assert orders(shop_db) == [("A-100", 0, 0)]


def test_two_calls_with_one_key_at_once_commit_one_effect_and_return_one_value(postgres_url):
    # Given two calls (not attempts of one call) with the same key, in two transactions at once
    # (PostgreSQL: SQLite has one writer at a time, so the second waits for the first's commit)
    import threading

    shop_db = postgres_url
    make_shop(shop_db)
    engine = sa.create_engine(shop_db)
    first_in, go = threading.Event(), threading.Event()
    ran: list[str] = []
    values: dict[str, Any] = {}

    def call(call_id: str, wait: bool) -> None:
        def apply(conn: Any) -> dict[str, Any]:
            ran.append(call_id)
            conn.execute(sa.text("UPDATE orders SET refunds = refunds + 1"))
            if wait:
                first_in.set()
                go.wait(30)
            return {"by": call_id}
        with engine.begin() as conn:
            values[call_id] = once(conn, ctx(1, call_id=call_id), apply)

    a = threading.Thread(target=call, args=("call-a", True))
    a.start()
    assert first_in.wait(30)
    b = threading.Thread(target=call, args=("call-b", False))
    b.start()
    b.join(0.5)  # b waits on a's row lock (or has not started yet): either way a commits first
    go.set()
    a.join(30)
    b.join(30)
    engine.dispose()
    # Then one effect committed, and both calls return its value
    assert values == {"call-a": {"by": "call-a"}, "call-b": {"by": "call-a"}}
    assert orders(shop_db) == [("A-100", 0, 1)]
