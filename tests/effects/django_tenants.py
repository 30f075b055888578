"""The Django ``once`` for two tenants and two tools, and the upgrade of 0.2.0's effect table by
the app's migration; run by ``test_tenants.py`` in a process of its own (Django is set up once
per process), on the PostgreSQL of ``AAA_EFFECTS_PG`` (``tests.effects.django_settings``).

``python -m tests.effects.django_tenants tenants|upgrade`` prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.effects.django_settings")
import django  # noqa: E402

django.setup()

from celery import Celery  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from aaa_celery import GuardedTask, ToolContext  # noqa: E402
from aaa_celery.contrib.django.effects import once  # noqa: E402
from aaa_celery.protocol import call_id  # noqa: E402
from aaa_celery.stores import open_store  # noqa: E402
from aaa_celery.worker.stores import use_store  # noqa: E402


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def fresh_shop() -> None:
    sql("DROP TABLE IF EXISTS tenant_orders, aaa_effects, aaa_effect_fences, django_migrations")
    sql("CREATE TABLE tenant_orders (tenant TEXT, id TEXT, email TEXT, refunds INTEGER DEFAULT 0,"
        " shipped INTEGER DEFAULT 0, PRIMARY KEY (tenant, id))")
    for tenant, order, email in [("acme", "A-100", "pay@acme.example"), ("globex", "A-100", "ap@globex.example"),
                                 ("acme", "7", "pay@acme.example")]:
        sql("INSERT INTO tenant_orders (tenant, id, email) VALUES (%s, %s, %s)", [tenant, order, email])


def counts() -> dict[str, list[int]]:
    return {f"{t}/{i}": [r, s] for t, i, r, s in sql("SELECT tenant, id, refunds, shipped FROM tenant_orders")}


def refund_row(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    sql("UPDATE tenant_orders SET refunds = refunds + 1 WHERE tenant = %s AND id = %s", [ctx.tenant, order_id])
    [(email,)] = sql("SELECT email FROM tenant_orders WHERE tenant = %s AND id = %s", [ctx.tenant, order_id])
    return {"refunded": order_id, "email": email}


def tenants() -> dict[str, Any]:
    """acme and globex refund their own A-100 (key refund:A-100); refund_order and ship both key order:7."""
    fresh_shop()
    call_command("migrate", "aaa_celery", verbosity=0)
    app = Celery("django_tenants", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, aaa_store_url="memory://", task_serializer="json",
                    result_serializer="json", accept_content=["json"])

    @app.task(base=GuardedTask, name="shop.refund", shared=False, idempotency_key=lambda a: f"refund:{a['order_id']}")
    def refund(order_id: str, ctx: ToolContext) -> Any:
        return once(ctx, lambda: refund_row(ctx, order_id))

    @app.task(base=GuardedTask, name="shop.refund_order", shared=False,
              idempotency_key=lambda a: f"order:{a['order_id']}")
    def refund_order(order_id: str, ctx: ToolContext) -> Any:
        return once(ctx, lambda: refund_row(ctx, order_id))

    @app.task(base=GuardedTask, name="shop.ship", shared=False, idempotency_key=lambda a: f"order:{a['order_id']}")
    def ship(order_id: str, ctx: ToolContext, shared: str | None = None) -> Any:
        def apply() -> dict[str, Any]:
            sql("UPDATE tenant_orders SET shipped = shipped + 1 WHERE tenant = %s AND id = %s", [ctx.tenant, order_id])
            return {"shipped": order_id}

        return once(ctx, apply, shared=shared)

    store = open_store("memory://")
    use_store(app, store)

    def send(task: Any, tenant: str, **kwargs: Any) -> Any:
        return task.apply_async(kwargs=kwargs, task_id=call_id(tenant, "run-1")).get(timeout=30)

    out = {"acme": send(refund, "acme", order_id="A-100"), "globex": send(refund, "globex", order_id="A-100"),
           "globex_again": send(refund, "globex", order_id="A-100"),
           "refund_order": send(refund_order, "acme", order_id="7"), "ship": send(ship, "acme", order_id="7"),
           "ship_shared": send(ship, "acme", order_id="7", shared="shop.refund_order")}
    store.close()
    return {**out, "counts": counts()}


def upgrade() -> dict[str, Any]:
    """0.2.0's table (the app's first migration) holding rows, then ``migrate``."""
    fresh_shop()
    call_command("migrate", "aaa_celery", "0001", verbosity=0)
    rows = [("refund:A-100", call_id("acme", "run-1", "c1"), '{"email":"pay@acme.example"}'),
            ("order:7", "0f3c-plain-task-id", '"plain"')]
    for key, call, result in rows:
        sql("INSERT INTO aaa_effects (key, call_id, attempt, result) VALUES (%s, %s, 1, %s)", [key, call, result])
    call_command("migrate", "aaa_celery", verbosity=0)
    ran: list[str] = []

    def ctx(tenant: str | None, key: str) -> ToolContext:
        return ToolContext(engine=None, run_id="r", call_id=call_id(tenant, "run-new"), idempotency_key=key,
                           tenant=tenant, tool="shop.refund")

    out = {"acme": once(ctx("acme", "refund:A-100"), lambda: ran.append("a") or "a"),
           "globex": once(ctx("globex", "refund:A-100"), lambda: ran.append("g") or "g"),
           "plain": once(ctx(None, "order:7"), lambda: ran.append("p") or "p")}
    return {**out, "ran": ran,
            "rows": sorted(sql("SELECT key, tenant, tool FROM aaa_effects"), key=lambda r: r[0])}


if __name__ == "__main__":
    print(json.dumps({"tenants": tenants, "upgrade": upgrade}[sys.argv[1]]()))
