"""Session servers for the whole suite: Redis and PostgreSQL, started once, on demand.

Fixtures:
- ``redis_server`` / ``postgres_server`` (session): a running server (``.url``,
  ``.restart()``, ``.stop()``), started the first time a test asks for it.
- ``redis_url`` / ``postgres_url`` (per test): the server's URL, with the Redis db
  flushed and the ``aaa_*`` tables dropped before the test, so every test starts clean.

A test that needs a server SKIPS when the server is not installed here, and FAILS
when ``CI=true``: CI must never pass by skipping. ``AAA_TEST_REDIS_URL`` and
``AAA_TEST_POSTGRES_URL`` point the fixtures at a server you run yourself (its db is
flushed and its aaa_* tables dropped, so give the tests their own).

Run-wide rules (tests/project/test_run_rules.py checks them):
- under ``CI=true`` a test or a test module that skips for a missing Python module
  (``pytest.importorskip``) fails: a test dependency missing from pyproject's ``[dev]``
  must not hide behind a skip;
- at the end of the run, a process the tests started (a worker, a server, a web app) that
  is still alive fails the run, named, and is killed by its pid (tests/leftovers.py).

Under pytest-xdist (``.ci/run`` passes ``-n``) each xdist worker starts servers of its own
(the session fixtures run once per worker, on free ports) and marks what it starts with the
controller's pid: the controller looks for leftovers once every worker has exited.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from . import leftovers
from .servers import PostgresServer, RedisServer, ServerUnavailable, libpq_url

T = TypeVar("T")

Server = RedisServer | PostgresServer

#: Every process the tests start inherits AAA_TEST_RUN=<this pid> (tests/leftovers.py).
RUN_PID = leftovers.mark_run()
#: How long the processes still shutting down at the end of the run get before they count.
LEFTOVER_GRACE_S = 20.0

#: A skip for a missing module: pytest.importorskip's reason, or an ImportError's text.
MISSING_MODULE = re.compile(r"could not import|No module named")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip the test locally; fail it under ``CI=true``."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing server is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


def _fail_missing_module_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not (in_ci() and report.skipped and not hasattr(report, "wasxfail")):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if MISSING_MODULE.search(reason):
        report.outcome = "failed"
        report.longrepr = (f"{reason}\n(CI=true: a missing test dependency is a failure, not a skip;"
                           " declare it in pyproject's [dev])")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_missing_module_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    _fail_missing_module_skip(outcome.get_result())


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller hands each worker the run's mark (the controller's pid)."""
    node.workerinput["aaa_run_pid"] = RUN_PID


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker marks what it starts with the controller's pid, not its own: the
    controller checks the whole run's leftovers after the workers are gone."""
    global RUN_PID
    run_pid = getattr(config, "workerinput", {}).get("aaa_run_pid")
    if run_pid is not None:
        RUN_PID = leftovers.mark_run(int(run_pid))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run on a process the tests left alive, naming it; then kill it by its pid.

    An xdist worker leaves it to the controller, whose hook runs after xdist's own
    ``pytest_sessionfinish`` has stopped the workers (a plugin registered later runs first)."""
    if hasattr(session.config, "workerinput"):
        return
    left = leftovers.wait_for_leftovers(RUN_PID, LEFTOVER_GRACE_S)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    write = reporter.write_line if reporter is not None else lambda line: print(line, file=sys.stderr)
    write(f"tests/conftest.py: {len(left)} process(es) the tests started are still alive"
          f" {LEFTOVER_GRACE_S:.0f} s after the last test; killing them:")
    for proc in left:
        write(f"  left behind: {proc}")
    leftovers.kill(left)
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _serve(kind: type[Server]) -> Iterator[Server]:
    server = kind.from_env()
    if server is not None:
        yield server
        return
    try:
        server = kind.start()
    except ServerUnavailable as e:
        unavailable(str(e))
    atexit.register(server.stop)  # a safety net if the session dies before teardown
    try:
        yield server
    finally:
        server.stop()
        atexit.unregister(server.stop)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    yield from _serve(RedisServer)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    yield from _serve(PostgresServer)


def _redis_client(url: str):
    try:
        import redis
    except ImportError:
        unavailable("the redis driver is not installed (pip install -e '.[dev]')")
    return redis.Redis.from_url(url)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, its db flushed for this test."""
    client = _redis_client(redis_server.url)
    try:
        client.flushdb()
    finally:
        client.close()
    return redis_server.url


def _psycopg():
    try:
        import psycopg
    except ImportError:
        unavailable("psycopg is not installed (pip install -e '.[dev]' or '.[postgres]')")
    return psycopg


def clean_postgres(url: str) -> None:
    """End every other session on the database (freeing its advisory locks), then drop
    the ``aaa_*`` tables, views, sequences and functions and ``aaa*`` schemas: a clean start."""
    psycopg = _psycopg()
    with psycopg.connect(libpq_url(url), autocommit=True) as con:
        con.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        con.execute("SET lock_timeout = '10s'")
        rows = con.execute(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname LIKE 'aaa%' AND c.relkind IN ('r', 'p', 'v', 'S')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
        what = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "S": "SEQUENCE"}
        for schema, name, kind in rows:
            con.execute(f'DROP {what[kind]} IF EXISTS "{schema}"."{name}" CASCADE')
        functions = con.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE p.proname LIKE 'aaa%' AND n.nspname NOT IN ('pg_catalog', 'information_schema')")
        for (function,) in functions.fetchall():
            con.execute(f"DROP FUNCTION IF EXISTS {function} CASCADE")
        schemas = con.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'aaa%'")
        for (schema,) in schemas.fetchall():
            con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The session server's URL, with no aaa_* tables and no other sessions left."""
    clean_postgres(postgres_server.url)
    return postgres_server.url


def once_per_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, name: str,
                 build: Callable[[Path], T], built: Callable[[Path], T | None]) -> T:
    """What ``build`` makes in a directory ``name``, once per run: under xdist the first worker
    that asks builds it in the run's shared temp directory, under a lock, and the others use
    that one (``built`` finds it)."""
    if not hasattr(request.config, "workerinput"):
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / name  # pytest-N/, beside each popen-gwN/
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (made := built(shared)) is None:
            shutil.rmtree(shared, ignore_errors=True)  # a build that died half-way
            shared.mkdir()
            made = build(shared)
        return made


@pytest.fixture(scope="session")
def old_release(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The previous release (0.1.0), built from git history into a venv of its own
    (``tests/old_release.py``), once per run."""
    from .old_release import build, built

    return once_per_run(request, tmp_path_factory, "aaa-0.1.0", build, built)


@pytest.fixture(scope="session")
def django6_python(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a venv with Django 6.1 (``tests/django_tasks/django6.py``), once per
    run; skips where the machine has no Python of 3.12 or later."""
    from .django_tasks.django6 import build, built, newer_python

    python = newer_python()
    if python is None:
        pytest.skip("no Python >= 3.12 on this machine: Django 6 cannot be installed, its run is skipped")
    return once_per_run(request, tmp_path_factory, "django-6.1", lambda where: build(where, python), built)
