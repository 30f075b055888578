"""A refund tool that writes to the app's own orders table, applied once per refund.

``python examples/effects_refund.py`` runs it on a SQLite file in a temporary directory,
in eager mode (no worker or broker needed): ``aaa_celery.effects.once`` commits the refund
and its result in one transaction, so the same refund asked again returns the recorded
result without refunding twice, and an attempt the database knows is stale is refused.
On a fleet it is the same code; see docs/effects.md.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from celery import Celery

from aaa_celery import GuardedTask, ToolContext
from aaa_celery.effects import EffectLog, StaleFence, once

metadata = sa.MetaData()  # the app's own metadata: its tables and the effect records
orders = sa.Table(
    "orders", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("refunded_cents", sa.Integer, nullable=False, default=0),
    sa.Column("refunds", sa.Integer, nullable=False, default=0),
)
EffectLog(metadata)  # aaa_effects and aaa_effect_fences, created with the app's tables

engine = sa.create_engine(f"sqlite:///{Path(tempfile.mkdtemp()) / 'shop.sqlite3'}")

app = Celery("shop", broker="memory://", backend="cache+memory://")
app.conf.update(task_always_eager=True, aaa_store_url="memory://", task_serializer="json",
                result_serializer="json", accept_content=["json"])


def mark_refunded(conn: Any, order_id: str, cents: int) -> dict[str, Any]:
    """The effect: it writes only through ``conn``, the transaction ``once`` records in."""
    conn.execute(orders.update().where(orders.c.id == order_id).values(
        refunded_cents=orders.c.refunded_cents + cents, refunds=orders.c.refunds + 1))
    total = conn.execute(sa.select(orders.c.refunded_cents).where(orders.c.id == order_id)).scalar_one()
    return {"order_id": order_id, "refunded_cents": total}


@app.task(base=GuardedTask, name="shop.refund",
          idempotency_key=lambda args: f"refund:{args['order_id']}")  # one refund per order
def refund(order_id: str, cents: int, ctx: ToolContext) -> dict[str, Any]:
    with engine.begin() as conn:
        return once(conn, ctx, lambda conn: mark_refunded(conn, order_id, cents))


def main() -> None:
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(orders.insert().values(id="A-100", refunded_cents=0, refunds=0))

    print("refund:", refund.delay("A-100", 500).get())
    print("asked again:", refund.delay("A-100", 500).get())  # a new call, the same key: recorded value

    # A worker frozen past its lease wakes after attempt 2 of its call committed:
    late = ToolContext(engine=None, run_id="r", call_id="c-7", attempt=1, fence=1, idempotency_key="refund:B-7",
                       tool="shop.refund")
    newer = ToolContext(engine=None, run_id="r", call_id="c-7", attempt=2, fence=2, idempotency_key="refund:B-7",
                        tool="shop.refund")
    with engine.begin() as conn:
        conn.execute(orders.insert().values(id="B-7", refunded_cents=0, refunds=0))
    with engine.begin() as conn:
        once(conn, newer, lambda conn: mark_refunded(conn, "B-7", 300))
    try:
        with engine.begin() as conn:
            once(conn, late, lambda conn: mark_refunded(conn, "B-7", 300))
    except StaleFence as e:
        print("stale attempt refused:", e)

    with engine.connect() as conn:
        for row in conn.execute(sa.select(orders).order_by(orders.c.id)):
            print(f"order {row.id}: refunded {row.refunded_cents} cents in {row.refunds} refund(s)")


if __name__ == "__main__":
    main()
