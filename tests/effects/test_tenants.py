"""effects.once keeps each record to its tenant and its tool (issue 35, item 1), through SQLAlchemy
on real SQLite and PostgreSQL: an eager GuardedTask whose key function names no tenant
(``refund:<order id>``) runs for two tenants with one business key; two tools compute one key.
Then tables made by 0.2.0, holding rows, are upgraded (``EffectLog.upgrade``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from aaa_celery import GuardedTask, ToolContext
from aaa_celery.effects import EffectLog, once
from aaa_celery.errors import ConfigError
from aaa_celery.protocol import call_id
from aaa_celery.stores import open_store
from aaa_celery.worker.stores import use_store

ROOT = Path(__file__).resolve().parents[2]
SHOP = ("CREATE TABLE tenant_orders (tenant VARCHAR(40) NOT NULL, id VARCHAR(40) NOT NULL, email VARCHAR(80) NOT NULL,"
        " refunds INTEGER NOT NULL DEFAULT 0, shipped INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (tenant, id))")
ROWS = [("acme", "A-100", "pay@acme.example"), ("globex", "A-100", "ap@globex.example"),
        ("acme", "7", "pay@acme.example")]

#: The effect tables as 0.2.0 (03c27cd) made them, on SQLite and PostgreSQL alike.
TABLES_0_2_0 = [
    "CREATE TABLE aaa_effect_fences (key VARCHAR NOT NULL, fence BIGINT NOT NULL, PRIMARY KEY (key))",
    "CREATE TABLE aaa_effects (key VARCHAR NOT NULL, call_id VARCHAR NOT NULL, attempt INTEGER NOT NULL,"
    " result TEXT NOT NULL, PRIMARY KEY (key))",
]


def fresh(url: str, tables: list[str] | None = None) -> sa.Engine:
    """The shop's orders of two tenants, and the effect tables (this release's, or ``tables``)."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for name in ("tenant_orders", "aaa_effects", "aaa_effect_fences"):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {name}"))
        conn.execute(sa.text(SHOP))
        for tenant, order, email in ROWS:
            conn.execute(sa.text("INSERT INTO tenant_orders (tenant, id, email) VALUES (:t, :i, :e)"),
                         {"t": tenant, "i": order, "e": email})
        for statement in tables or []:
            conn.execute(sa.text(statement))
    if tables is None:
        EffectLog().create(engine)
    return engine


def shop(engine: sa.Engine) -> dict[tuple[str, str], tuple[int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT tenant, id, refunds, shipped FROM tenant_orders"))
        return {(t, i): (r, s) for t, i, r, s in rows}


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def tasks(db_url: str) -> Iterator[tuple[Any, Any, Any, Any, sa.Engine]]:
    """An eager app whose tools write the shop through ``once``: ``refund`` (key
    ``refund:<order id>``), and ``refund_order`` and ``ship`` (both ``order:<order id>``)."""
    engine = fresh(db_url)
    app = Celery("tenants", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, aaa_store_url="memory://", task_serializer="json",
                    result_serializer="json", accept_content=["json"])

    def refund_row(conn: Any, ctx: ToolContext, order_id: str) -> str:
        conn.execute(sa.text("UPDATE tenant_orders SET refunds = refunds + 1 WHERE tenant = :t AND id = :i"),
                     {"t": ctx.tenant, "i": order_id})
        email: str = conn.execute(sa.text("SELECT email FROM tenant_orders WHERE tenant = :t AND id = :i"),
                                  {"t": ctx.tenant, "i": order_id}).scalar_one()
        return email

    @app.task(base=GuardedTask, name="shop.refund", shared=False,
              idempotency_key=lambda a: f"refund:{a['order_id']}")
    def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        with engine.begin() as conn:
            return once(conn, ctx, lambda conn: {"refunded": order_id, "email": refund_row(conn, ctx, order_id)})

    @app.task(base=GuardedTask, name="shop.refund_order", shared=False,
              idempotency_key=lambda a: f"order:{a['order_id']}")
    def refund_order(order_id: str, ctx: ToolContext, shared: str | None = None) -> dict[str, Any]:
        with engine.begin() as conn:
            return once(conn, ctx, lambda conn: {"refunded": order_id, "email": refund_row(conn, ctx, order_id)},
                        shared=shared)

    @app.task(base=GuardedTask, name="shop.ship", shared=False, idempotency_key=lambda a: f"order:{a['order_id']}")
    def ship(order_id: str, ctx: ToolContext, shared: str | None = None) -> dict[str, Any]:
        def apply(conn: Any) -> dict[str, Any]:
            conn.execute(sa.text("UPDATE tenant_orders SET shipped = shipped + 1 WHERE tenant = :t AND id = :i"),
                         {"t": ctx.tenant, "i": order_id})
            return {"shipped": order_id}

        with engine.begin() as conn:
            return once(conn, ctx, apply, shared=shared)

    store = open_store("memory://")
    use_store(app, store)
    try:
        yield refund, refund_order, ship, app, engine
    finally:
        store.close()
        engine.dispose()


def test_two_tenants_with_one_business_key_each_get_their_own_effect_and_value(tasks):
    refund, _, _, _, engine = tasks
    # Given acme refunded its order A-100 (key refund:A-100, which names no tenant)
    acme = refund.apply_async(kwargs={"order_id": "A-100"}, task_id=call_id("acme", "run-1")).get(timeout=10)
    # When globex refunds its own order A-100, with the same business key
    globex = refund.apply_async(kwargs={"order_id": "A-100"}, task_id=call_id("globex", "run-1")).get(timeout=10)
    # Then each tenant's refund is applied once, and each gets its own value (never the other's e-mail)
    assert acme == {"refunded": "A-100", "email": "pay@acme.example"}
    assert globex == {"refunded": "A-100", "email": "ap@globex.example"}
    assert shop(engine)[("acme", "A-100")] == (1, 0)
    assert shop(engine)[("globex", "A-100")] == (1, 0)
    # and a second call of globex with the key gets globex's record, without a second refund
    again = refund.apply_async(kwargs={"order_id": "A-100"}, task_id=call_id("globex", "run-2")).get(timeout=10)
    assert again == globex and shop(engine)[("globex", "A-100")] == (1, 0)


def test_two_tools_that_compute_one_key_each_apply_their_own_effect(tasks):
    _, refund_order, ship, _, engine = tasks
    # Given refund_order recorded its effect under order:7
    refunded = refund_order.apply_async(kwargs={"order_id": "7"}, task_id=call_id("acme", "run-1")).get(timeout=10)
    # When ship computes the same key for the same tenant
    shipped = ship.apply_async(kwargs={"order_id": "7"}, task_id=call_id("acme", "run-2")).get(timeout=10)
    # Then ship ships (it does not get refund's value)
    assert refunded == {"refunded": "7", "email": "pay@acme.example"}
    assert shipped == {"shipped": "7"}
    assert shop(engine)[("acme", "7")] == (1, 1)


def test_tools_that_ask_to_share_records_share_them_within_their_tenant(tasks):
    _, refund_order, ship, _, engine = tasks
    # Given two tools that name one shared record, shared="orders" (the user's explicit choice)
    first = refund_order.apply_async(kwargs={"order_id": "7", "shared": "orders"},
                                     task_id=call_id("acme", "run-1")).get(timeout=10)
    second = ship.apply_async(kwargs={"order_id": "7", "shared": "orders"},
                              task_id=call_id("acme", "run-2")).get(timeout=10)
    # Then the second gets the first one's record, and applies nothing
    assert first == second == {"refunded": "7", "email": "pay@acme.example"}
    assert shop(engine)[("acme", "7")] == (1, 0)


def test_the_records_show_their_tenant_and_tool(tasks):
    refund, _, ship, _, engine = tasks
    refund.apply_async(kwargs={"order_id": "A-100"}, task_id=call_id("acme", "run-1")).get(timeout=10)
    ship.apply(kwargs={"order_id": "7"}, task_id="plain-1").get()  # a plain task id: no tenant
    with engine.connect() as conn:
        rows = {tuple(r) for r in conn.execute(sa.text("SELECT key, tenant, tool FROM aaa_effects"))}
    assert rows == {("acme:shop.refund:refund:A-100", "acme", "shop.refund"),
                    ("~:shop.ship:order:7", None, "shop.ship")}


def test_a_context_without_a_tool_is_refused_naming_the_fix(tmp_path):
    engine = fresh(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
    ctx = ToolContext(engine=None, run_id="r", call_id="c", idempotency_key="k")
    with pytest.raises(ConfigError, match=r"tool='refund'"), engine.begin() as conn:
        once(conn, ctx, lambda conn: 1)
    # a test's context names its tool (or the record it shares)
    with engine.begin() as conn:
        assert once(conn, ToolContext(engine=None, run_id="r", call_id="c", idempotency_key="k", tool="t"),
                    lambda conn: 1) == 1
        assert once(conn, ctx, lambda conn: 2, shared="s") == 2
    engine.dispose()


# -- the upgrade of tables made by 0.2.0 -------------------------------------------------------


def rows_0_2_0(engine: sa.Engine) -> None:
    """Rows as 0.2.0's once() wrote them: the key alone, of calls of acme, globex and no tenant."""
    with engine.begin() as conn:
        for key, call, result in [("refund:A-100", call_id("acme", "run-1", "c1"), '{"email":"pay@acme.example"}'),
                                  ("run-9/x", call_id("globex", "run-9", "c2"), '"globex"'),
                                  ("order:7", "0f3c-plain-task-id", '"plain"')]:
            conn.execute(sa.text("INSERT INTO aaa_effects (key, call_id, attempt, result) VALUES (:k, :c, 1, :r)"),
                         {"k": key, "c": call, "r": result})
            conn.execute(sa.text("INSERT INTO aaa_effect_fences (key, fence) VALUES (:c, 1)"), {"c": call})


def context(tenant: str | None, key: str, tool: str = "shop.refund", attempt: int = 1, call: str = "") -> ToolContext:
    return ToolContext(engine=None, run_id="r", call_id=call or call_id(tenant, "run-new"), attempt=attempt,
                       fence=attempt, idempotency_key=key, tenant=tenant, tool=tool)


def test_a_0_2_0_table_not_upgraded_is_refused_before_the_effect_naming_the_fix(db_url):
    engine = fresh(db_url, TABLES_0_2_0)
    ran: list[int] = []
    with pytest.raises(ConfigError, match=r"made by aaa_celery 0\.2\.0; upgrade it with EffectLog\(\)\.upgrade"), \
            engine.begin() as conn:
        once(conn, context("acme", "refund:A-100"), lambda conn: ran.append(1))
    assert ran == []
    engine.dispose()


def test_upgrading_0_2_0_tables_keeps_old_records_to_their_tenant(db_url):
    # Given the tables of 0.2.0, holding rows of two tenants and of a plain task
    engine = fresh(db_url, TABLES_0_2_0)
    rows_0_2_0(engine)
    log = EffectLog()
    # When they are upgraded (twice: the second moves nothing)
    assert log.upgrade(engine) == 3
    assert log.upgrade(engine) == 0
    # (a 0.2.0 worker still running records a key again, moved already: the row stays where it is)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO aaa_effects (key, call_id, attempt, result) VALUES ('order:7', 'p2', 1, '1')"))
    assert log.upgrade(engine) == 0
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM aaa_effects WHERE call_id = 'p2'"))
    ran: list[str] = []

    def effect(name: str) -> Any:
        return lambda conn: ran.append(name) or name

    with engine.begin() as conn:
        # Then an old record answers its own tenant's calls with its key, from any tool (it names none)
        assert once(conn, context("acme", "refund:A-100"), effect("a")) == {"email": "pay@acme.example"}
        assert once(conn, context("acme", "refund:A-100", tool="shop.other"), effect("b")) == {
            "email": "pay@acme.example"}
        # the retry of the very call that wrote it still finds it, and its fence still holds
        old = call_id("globex", "run-9", "c2")
        assert once(conn, context("globex", "run-9/x", attempt=2, call=old), effect("c")) == "globex"
        assert once(conn, context(None, "order:7"), effect("d")) == "plain"
        # and never another tenant's: globex's refund:A-100 and acme's order:7 are applied
        assert once(conn, context("globex", "refund:A-100"), effect("e")) == "e"
        assert once(conn, context("acme", "order:7"), effect("f")) == "f"
    assert ran == ["e", "f"]
    # new rows are scoped by tenant and tool
    with engine.connect() as conn:
        found = {tuple(r) for r in conn.execute(sa.text("SELECT key, tenant, tool FROM aaa_effects"))}
    assert found == {("acme:*:refund:A-100", "acme", "*"), ("globex:*:run-9/x", "globex", "*"),
                     ("~:*:order:7", None, "*"), ("globex:shop.refund:refund:A-100", "globex", "shop.refund"),
                     ("acme:shop.refund:order:7", "acme", "shop.refund")}
    engine.dispose()


# -- Django: the same rules through the ORM, and the app's migration of 0.2.0's rows ------------


def django_run(postgres_url: str, mode: str) -> Any:
    """``tests/effects/django_tenants.py`` in a process of its own, on the test PostgreSQL."""
    url = sa.engine.make_url(postgres_url)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.effects.django_settings",
           "AAA_EFFECTS_PG": f"{url.host} {url.port} {url.database} {url.username}"}
    done = subprocess.run([sys.executable, "-m", "tests.effects.django_tenants", mode], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_django_two_tenants_and_two_tools_each_get_their_own_effect(postgres_url):
    out = django_run(postgres_url, "tenants")
    assert out["acme"] == {"refunded": "A-100", "email": "pay@acme.example"}
    assert out["globex"] == out["globex_again"] == {"refunded": "A-100", "email": "ap@globex.example"}
    assert out["refund_order"] == {"refunded": "7", "email": "pay@acme.example"}
    assert out["ship"] == {"shipped": "7"}
    assert out["ship_shared"] == out["refund_order"]  # shared= names refund_order's records: nothing shipped
    assert out["counts"] == {"acme/A-100": [1, 0], "globex/A-100": [1, 0], "acme/7": [1, 1]}


def test_django_migration_moves_0_2_0_rows_to_their_tenant(postgres_url):
    out = django_run(postgres_url, "upgrade")
    assert (out["acme"], out["globex"], out["plain"], out["ran"]) == ({"email": "pay@acme.example"}, "g", "plain",
                                                                      ["g"])
    assert out["rows"] == [["acme:*:refund:A-100", "acme", "*"],
                           ["globex:shop.refund:refund:A-100", "globex", "shop.refund"],
                           ["~:*:order:7", None, "*"]]


def test_fences_keyed_by_call_id_as_documented_keep_two_tenants_calls_apart(tmp_path):
    """Issue 35's audit: docs/fault-paths-and-fencing.md keyed SQLFence by ctx.idempotency_key, which
    names no tenant (``pay:A-100``): acme's attempt 2 made globex's attempt 1 stale. Keyed by the
    call id, as documented now, each call's attempts are compared only with each other."""
    from aaa_celery.fencing import SQLFence, StaleFence

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'fences.sqlite3'}")
    fence = SQLFence()
    fence.create(engine)
    acme = context("acme", "pay:A-100", attempt=2)
    globex = context("globex", "pay:A-100", attempt=1)
    with engine.begin() as conn:
        fence.check(conn, acme.call_id, acme.fence)
    with engine.begin() as conn:
        fence.check(conn, globex.call_id, globex.fence)  # not stale: another call
    with pytest.raises(StaleFence), engine.begin() as conn:
        fence.check(conn, acme.call_id, 1)  # acme's own attempt 1 is
    engine.dispose()
