"""The ``aaa`` click group and its subcommands."""

from __future__ import annotations

import json
from typing import Any

import click

from ..worker.stores import app_store


def _app(ctx: click.Context) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        raise click.UsageError("run it as `celery -A proj aaa ...` so the app (and its store) is known")
    return app


@click.group(name="aaa")
def aaa() -> None:
    """Inspect and settle guarded tool calls (aaa_celery)."""


@aaa.command()
@click.argument("call_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def show(ctx: click.Context, call_id: str, as_json: bool) -> None:
    """The audit trail of one call."""
    store = app_store(_app(ctx))
    trail = [e.__dict__ for e in store.events(call_id)]
    if as_json:
        click.echo(json.dumps({"call_id": call_id, "events": trail}, indent=2, default=str))
        return
    for e in trail:
        click.echo(f"{e['at']:.3f} {e['type']} attempt={e['attempt']}")
