"""The ``aaa`` click group and its subcommands (``celery -A proj aaa --help``)."""

from __future__ import annotations

import getpass
import json
import re
import socket
import sys
from typing import Any

import click
from kombu.utils.url import maybe_sanitize_url

from ..errors import AAACeleryError, InvalidId, NotResolvable
from ..policy import concurrency_rule
from ..protocol import MAX_TENANT_BYTES, check_call_id, check_id, tenant_of
from ..stores import Store, backend_for, open_store
from ..stores.base import Slots
from ..stores.sql.store import SQLStore
from ..stores.ops import STATES, call_state, matches
from ..worker.stores import app_store, migrate_command, store_options, store_url
from ..worker.verdicts import resolve_call
from . import doctor as doctor_checks
from .timeline import holder_label, render, table, timeline, when

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration(text: str) -> float:
    """``90s``, ``30m``, ``1h``, ``7d``, ``2w`` (or plain seconds) as seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not found:
        raise click.BadParameter(f"{text!r}: use a number and a unit, e.g. 90s, 30m, 1h, 7d")
    return float(found[1]) * _UNITS[found[2] or "s"]


def _duration(ctx: click.Context, param: click.Parameter, text: str | None) -> str | None:
    """Check a duration option as it is parsed, so that a bad value names its option."""
    if text is not None:
        duration(text)
    return text


def _call_id(ctx: click.Context, param: click.Parameter, text: str) -> str:
    """A CALL_ID argument, checked as the guard checks task ids (no control characters, a
    size cap) before it reaches the store or the terminal."""
    try:
        return check_call_id(text)
    except InvalidId as e:
        raise click.BadParameter(one_line(e)) from None


def one_line(error: BaseException) -> str:
    """An error's text on one line (drivers' messages span several, SQLAlchemy adds a link)."""
    text = re.sub(r"\(Background on this error at: [^)]*\)", "", str(error))
    return " ".join(text.split()) or type(error).__name__


class _Commands(click.Group):
    """The ``aaa`` group: a command that fails prints one line naming what failed and
    exits 1, never a traceback (``--traceback`` shows it, for a bug report)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:
            if ctx.params.get("traceback"):
                raise
            what = ctx.invoked_subcommand or "aaa"
            kind = "" if isinstance(e, AAACeleryError) else f"{type(e).__name__}: "
            raise click.ClickException(f"aaa {what}: {kind}{one_line(e)}") from e


def _app(ctx: click.Context) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        raise click.UsageError("run it as `celery -A proj aaa ...` so the app (and its store) is known")
    return app


def _store(ctx: click.Context, *, read_only: bool = False) -> Store:
    """The app's store; ``read_only`` opens an SQL store without creating the tables of an
    empty database (a worker creates them at its first open)."""
    app = _app(ctx)
    try:
        if read_only and issubclass(backend_for(store_url(app)), SQLStore):
            return open_store(store_url(app), **store_options(app), create_schema=False)
        return app_store(app)
    except (AAACeleryError, ValueError) as e:  # a URL the driver cannot parse raises ValueError
        try:
            where = f" at {maybe_sanitize_url(store_url(app))}"
        except AAACeleryError:
            where = ""
        raise click.ClickException(f"cannot open the app's aaa store{where}: {one_line(e)}") from e


def _user() -> str:
    """Who runs the command (a container may have no passwd entry for its uid)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _dump(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group(name="aaa", cls=_Commands)
@click.option("--traceback", is_flag=True, help="Show the traceback of a command that fails.")
def aaa(traceback: bool) -> None:
    """Inspect and settle guarded tool calls (aaa_celery), in the app's own store."""


@aaa.command()
@click.argument("call_id", callback=_call_id)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def show(ctx: click.Context, call_id: str, as_json: bool) -> None:
    """One call's timeline: attempts (worker, pid, start, end, fence), lease events, the
    result, fenced and stale results, and resolutions."""
    store = _store(ctx)
    events, result = store.events(call_id), store.result(call_id)
    if not events and result is None:
        raise click.ClickException(f"no call {call_id!r} in the {store.kind} store")
    story = timeline(call_id, events, result)
    if as_json:
        _dump(story)
    else:
        click.echo(render(story))


@aaa.command(name="calls")
@click.option("--state", type=click.Choice(STATES), help="Only calls in this state.")
@click.option("--tool", help="Only calls of this tool (its name, or the task name).")
@click.option("--tenant", help="Only calls sent for this tenant.")
@click.option("--since", "since", callback=_duration, help="Only calls first seen this long ago or later: 90s, 30m, 1h, 7d.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1), help="At most this many.")
@click.option("--holding", "holding", multiple=True, metavar="ARG=VALUE",
              help="Only the calls that hold a concurrency slot of --tool's key with these arguments "
                   "(repeat for each argument of the key; a value is read as JSON, else as text).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def list_calls(ctx: click.Context, state: str | None, tool: str | None, tenant: str | None, since: str | None,
               limit: int, holding: tuple[str, ...], as_json: bool) -> None:
    """List calls, newest first, through the store's index of calls by time; with --holding,
    the calls that hold a concurrency key's slots (docs/concurrency.md)."""
    store = _store(ctx)
    start = None if since is None else store.now() - duration(since)
    holders = _holders(ctx, store, tool, tenant, holding) if holding else None
    found = []
    for record in store.calls(since=start):
        if holders is not None and record.call_id not in holders:
            continue
        if matches(record, state, None if holders is not None else tool, tenant):
            found.append(record)
            if len(found) >= limit:
                break
    rows: list[dict[str, Any]] = [
        {"call_id": r.call_id, "tool": r.spec.name, "state": call_state(r), "attempts": r.attempts,
         "seen_at": r.seen_at, "holder": r.holder, "tenant": tenant_of(r.call_id),
         "error": r.result.error if r.result is not None and not r.result.ok else None} for r in found]
    if as_json:
        _dump(rows)
        return
    if not rows:
        asked = [f"--{k} {v}" for k, v in (("state", state), ("tool", tool), ("tenant", tenant), ("since", since)) if v]
        click.echo(f"no calls{' match ' + ' '.join(asked) if asked else ''} in the {store.kind} store")
        return
    cells = [[r["call_id"], r["tool"] or "-", r["state"], r["attempts"], when(r["seen_at"]),
              holder_label(r["holder"]) or r["error"] or ""] for r in rows]
    for line in table(cells, ["call_id", "tool", "state", "attempts", "seen", "holder/error"]):
        click.echo(line)


def _holders(ctx: click.Context, store: Slots, tool: str | None, tenant: str | None,
             holding: tuple[str, ...]) -> set[str]:
    """The calls that hold a slot of ``tool``'s concurrency key for ``tenant`` and the
    arguments ``holding`` names (``ARG=VALUE``), as the worker keys them."""
    if not tool:
        raise click.UsageError("--holding needs --tool: the tool (or task) whose concurrency rule makes the key")
    arguments: dict[str, Any] = {}
    for item in holding:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r}: use ARG=VALUE, e.g. shop_id=7", param_hint="--holding")
        try:
            arguments[name] = json.loads(raw)
        except ValueError:
            arguments[name] = raw
    task, name = _task_of(_app(ctx), tool)
    rule = concurrency_rule(getattr(type(task), "policy", None) or _NO_POLICY, name, tenant) \
        or type(task)._options.concurrency
    if rule is None:
        raise click.ClickException(f"{tool!r} has no concurrency rule (concurrency=, unique= or a Concurrency "
                                   "rule of its policy)")
    return set(store.slot_holders(rule.slot_key(name, tenant, arguments)))


class _NoPolicy:
    rules: tuple[Any, ...] = ()


_NO_POLICY = _NoPolicy()


def _task_of(app: Any, tool: str) -> tuple[Any, str]:
    """The app's guarded task named ``tool`` (its task name, or its tool name), and the name
    its calls are keyed by."""
    for task in app.tasks.values():
        audit = getattr(task, "audit_name", None)
        if hasattr(task, "guard_config") and tool in (task.name, audit):
            return task, audit or task.name
    raise click.ClickException(f"the app has no guarded task or tool {tool!r}")


@aaa.command()
@click.argument("call_id", callback=_call_id)
@click.option("--as", "verdict", type=click.Choice(["completed", "failed"]), required=True,
              help="What the operator found: the effect happened (completed) or not (failed).")
@click.option("--note", required=True, help="Why: what was checked, where (kept in the audit trail).")
@click.option("--value", help="The call's value as JSON, for --as completed.")
@click.option("--operator", help="Who resolves, as recorded (<operator>@<host>). Default: the login name, "
              "which $LOGNAME or $USER decide: a label, not a proof of identity.")
@click.pass_context
def resolve(ctx: click.Context, call_id: str, verdict: str, note: str, value: str | None,
            operator: str | None) -> None:
    """Settle a call in doubt (OutcomeUnknown, ExecutionAbandoned) after checking the called
    system. Recorded as an aaa.tool.resolved event with who and why, and written to Celery's
    result backend, so a caller's AsyncResult.get() gets it; a real result is never
    overwritten."""
    if operator is not None:
        try:
            check_id(operator, "--operator", MAX_TENANT_BYTES)
        except InvalidId as e:
            raise click.BadParameter(str(e), param_hint="--operator") from None
    parsed = None
    if value is not None:
        if verdict != "completed":
            raise click.BadParameter("--value goes with --as completed", param_hint="--value")
        try:
            parsed = json.loads(value)
        except ValueError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="--value") from e
    by = f"{operator or _user()}@{socket.gethostname()}"
    app = _app(ctx)
    _store(ctx)  # opened here, so that a store that cannot be opened says so
    try:
        outcome = resolve_call(app, call_id, verdict, note, by, parsed)  # type: ignore[arg-type]
    except NotResolvable as e:
        click.echo(f"refused: {one_line(e)}", err=True)
        sys.exit(1)
    click.echo(f"resolved {call_id} as {verdict} by {by}: {outcome.value if outcome.ok else outcome.message}")


@aaa.command()
@click.option("--ping-timeout", default=1.0, show_default=True, help="Seconds to wait for workers' pings.")
@click.option("--flask-app", help="module:app (or module:create_app) of the Flask app serving the agent-run "
              "routes, to check its AUTHORIZE hook (Django: read from DJANGO_SETTINGS_MODULE).")
@click.pass_context
def doctor(ctx: click.Context, ping_timeout: float, flask_app: str | None) -> None:
    """Check the app's settings and deployment against what the guard's guarantees need.
    Exits 1 if a check fails."""
    checks = doctor_checks.diagnose(_app(ctx), ping_timeout_s=ping_timeout, flask_app=flask_app)
    for check in checks:
        click.echo(check.line())
    if any(c.status == "fail" for c in checks):
        sys.exit(1)


@aaa.command()
@click.option("--older-than", "older_than", required=True, callback=_duration,
              help="Age of the calls to delete: 7d, 12h, ...")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def purge(ctx: click.Context, older_than: str, yes: bool) -> None:
    """Delete finished calls (result and audit trail) first seen longer ago than
    --older-than. Calls without a result are kept."""
    store = _store(ctx)
    if not yes:
        click.confirm(f"Delete every finished call first seen more than {older_than} ago from the "
                      f"{store.kind} store?", abort=True)
    purged = store.purge(store.now() - duration(older_than))
    click.echo(f"purged {purged} finished calls first seen more than {older_than} ago")


@aaa.command()
@click.option("--check", is_flag=True, help="Only say whether the store needs an upgrade or its tables (exit 1 if it "
              "does); writes nothing.")
@click.pass_context
def migrate(ctx: click.Context, check: bool) -> None:
    """Upgrade the app's store to this release's schema (SQL: the Alembic revisions shipped
    in the package; Redis: its format key), under the store's schema lock. Safe to run
    again, and while workers of this release or the one before run (docs/upgrading.md)."""
    if check:
        store = _store(ctx, read_only=True)
        try:
            found = store.schema_version()
        finally:
            if isinstance(store, SQLStore):  # opened for this check alone
                store.close()
        if found.empty or found.outdated:
            click.echo(f"{store.kind} store schema: {found.describe()}: run `{migrate_command(_app(ctx))}`")
        else:
            click.echo(f"{store.kind} store schema: {found.describe()}")
        if found.empty or found.outdated or found.newer:
            sys.exit(1)
        return
    store = _store(ctx)
    before = store.schema_version()
    if before.newer:
        raise click.ClickException(f"the {store.kind} store is at {before.describe()}: upgrade aaa_celery instead")
    after = store.migrate()
    if after.current == before.current:
        click.echo(f"{store.kind} store schema: {after.current} (already current)")
    else:
        click.echo(f"{store.kind} store schema: {before.current or '0.1.0 (unversioned)'} -> {after.current}")
