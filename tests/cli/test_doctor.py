"""``celery aaa doctor``: one failing case per check, and a deployment where all pass
(a real worker answering pings, the Redis test server with AOF, a JSON-only app)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from aaa_celery import GuardedTask
from aaa_celery.cli.doctor import check_clock
from aaa_celery.stores import open_store
from aaa_celery.testing.fleet import WorkerProcess

from ..conftest import _redis_client
from . import cli_app
from .test_cli import APP, cli

ROOT = Path(__file__).resolve().parents[2]
app = cli_app.app
pytestmark = pytest.mark.redis


def point_at(broker: str, store: str) -> None:
    app.conf.broker_url = broker
    app.conf.aaa_store_url = store
    app._pool = None  # noqa: SLF001 - a new broker: drop the connection pool made for the old one
    if hasattr(app, "_aaa_store"):
        del app._aaa_store


@contextmanager
def setting(**changes: Any) -> Iterator[None]:
    old = {k: app.conf.get(k) for k in changes}
    app.conf.update(changes)
    try:
        yield
    finally:
        app.conf.update(old)


def doctor() -> tuple[int, dict[str, str], str]:
    result = cli("doctor", "--ping-timeout", "1.5")
    statuses = {}
    for line in result.output.splitlines():
        status, _, rest = line.partition(" ")
        statuses[rest.strip().partition(":")[0]] = status.lower()
    return result.exit_code, statuses, result.output


@pytest.fixture(scope="module")
def fleet(redis_server, tmp_path_factory) -> Iterator[str]:
    """One real worker, ``d1@doctor``, on the session Redis (broker and store)."""
    worker = WorkerProcess(APP, hostname="d1@doctor", pool="solo", env={"AAA_CLI_BROKER": redis_server.url},
                           workdir=tmp_path_factory.mktemp("doctor"), cwd=ROOT)
    worker.start()
    try:
        worker.wait_ready(60)
        yield redis_server.url
    finally:
        worker.stop()


@pytest.fixture
def healthy(fleet: str) -> str:
    point_at(fleet, fleet)
    return fleet


def test_all_checks_pass_on_a_sound_deployment(healthy):
    code, statuses, output = doctor()
    assert code == 0, output
    assert set(statuses.values()) == {"pass"}, output
    assert {"acks_late", "reject_on_worker_lost", "serializers", "prefetch", "visibility_timeout",
            "store reachable", "redis persistence", "clock skew", "worker node names"} <= set(statuses), output


@contextmanager
def extra_task(**options: Any) -> Iterator[None]:
    def doctor_bad() -> None:
        return None

    app.task(base=GuardedTask, name="doctor_bad", shared=False, **options)(doctor_bad)
    try:
        yield
    finally:
        app.tasks.pop("doctor_bad", None)


def test_a_task_that_acks_early_fails(healthy):
    with extra_task(acks_late=False):
        code, statuses, output = doctor()
    assert code == 1 and statuses["acks_late"] == "fail" and "doctor_bad" in output


def test_a_task_without_reject_on_worker_lost_fails(healthy):
    with extra_task(reject_on_worker_lost=False):
        code, statuses, _ = doctor()
    assert code == 1 and statuses["reject_on_worker_lost"] == "fail"


def test_accepting_pickle_fails(healthy):
    with setting(accept_content=["json", "pickle"]):
        code, statuses, _ = doctor()
    assert code == 1 and statuses["serializers"] == "fail"


def test_a_prefetch_multiplier_above_one_warns(healthy):
    with setting(worker_prefetch_multiplier=4):
        code, statuses, _ = doctor()
    assert code == 0 and statuses["prefetch"] == "warn"


def test_a_visibility_timeout_below_the_lease_ttl_fails(healthy):
    with setting(broker_transport_options={"visibility_timeout": 5}):
        code, statuses, _ = doctor()
    assert code == 1 and statuses["visibility_timeout"] == "fail"
    with setting(broker_transport_options={"visibility_timeout": 30}):
        assert doctor()[1]["visibility_timeout"] == "warn"  # below report's timeout_s=60


def test_an_unreachable_store_fails(healthy):
    point_at(healthy, "redis://127.0.0.1:1/0")
    code, statuses, output = doctor()
    assert code == 1 and statuses["store reachable"] == "fail" and "unavailable" in output


def test_redis_without_aof_fails(healthy):
    client = _redis_client(healthy)
    client.config_set("appendonly", "no")
    try:
        code, statuses, _ = doctor()
    finally:
        client.config_set("appendonly", "yes")
        client.close()
    assert code == 1 and statuses["redis persistence"] == "fail"


def test_clock_skew_between_this_host_and_the_store_fails(healthy):
    store = open_store(healthy)
    try:
        assert check_clock(store).status == "pass"
        assert check_clock(store, local=lambda: time.time() + 10).status == "fail"
        assert check_clock(store, local=lambda: time.time() - 1).status == "warn"
    finally:
        store.close()


@pytest.mark.postgres
def test_clock_skew_is_read_from_the_postgres_server(healthy, postgres_url):
    point_at(healthy, postgres_url)
    code, statuses, output = doctor()
    assert code == 0, output
    assert statuses["store reachable"] == "pass" and statuses["clock skew"] == "pass"
    assert statuses["postgres pooler mode"] == "pass"
    assert "postgresql store" in output
    assert check_clock(open_store(postgres_url), local=lambda: time.time() + 10).status == "fail"


def test_two_workers_with_one_node_name_fail(healthy, tmp_path):
    twin = WorkerProcess(APP, hostname="d1@doctor", pool="solo", env={"AAA_CLI_BROKER": healthy},
                         workdir=tmp_path, cwd=ROOT)
    twin.start()
    try:
        twin.wait_ready(60)
        code, statuses, output = doctor()
    finally:
        twin.stop()
    assert code == 1 and statuses["worker node names"] == "fail" and "d1@doctor" in output


def test_rabbitmq_consumer_timeout_below_a_task_timeout_fails(healthy):
    from aaa_celery.cli.doctor import check_consumer_timeout, guarded_tasks

    with setting(broker_url="amqp://guest@127.0.0.1:1//"):
        tasks = guarded_tasks(app)
        bounded = [t for t in tasks if t.timeout_s]
        assert check_consumer_timeout(app, bounded).status == "pass"  # report: 60 s < 30 min
        unbounded = check_consumer_timeout(app, tasks)  # refund has no timeout_s
        assert unbounded.status == "warn" and "refund" in unbounded.detail
        with setting(aaa_rabbitmq_consumer_timeout_s=30):
            check = check_consumer_timeout(app, tasks)
        assert check.status == "fail" and "report" in check.detail
    assert check_consumer_timeout(app, tasks) is None  # a Redis broker has none


@pytest.mark.parametrize(("web_app", "status"), [("guarded", "pass"), ("anonymous", "fail"), ("unset", "fail")])
def test_web_routes_without_an_authorize_hook_fail(healthy, web_app, status):
    result = cli("doctor", "--ping-timeout", "1.5", "--flask-app", f"tests.cli.web_apps:{web_app}")
    line = next(line for line in result.output.splitlines() if "web authorize" in line)
    assert line.lower().startswith(status), result.output
    assert result.exit_code == (0 if status == "pass" else 1), result.output


@pytest.fixture
def pgbouncer(postgres_url, tmp_path_factory) -> Iterator[str]:
    """A real PgBouncer in transaction pooling mode in front of the test PostgreSQL."""
    import os
    import shutil
    import signal
    import subprocess
    import tempfile

    import sqlalchemy as sa

    from ..conftest import unavailable
    from ..servers import free_port

    binary = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK)
                                          else None)
    if binary is None:
        unavailable("pgbouncer is not installed (apt-get install pgbouncer)")
    pg = sa.make_url(postgres_url)
    workdir = Path(tempfile.mkdtemp(prefix="aaa-pgbouncer-"))
    port = free_port()
    (workdir / "users.txt").write_text('"postgres" ""\n')
    (workdir / "pgbouncer.ini").write_text(f"""[databases]
* = host={pg.host} port={pg.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/users.txt
pool_mode = transaction
default_pool_size = 4
min_pool_size = 4
server_round_robin = 1
ignore_startup_parameters = extra_float_digits,options,application_name,keepalives,tcp_user_timeout
pidfile = {workdir}/pgbouncer.pid
logfile = {workdir}/pgbouncer.log
""")
    command = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        shutil.chown(workdir, "postgres")
        for f in workdir.iterdir():
            shutil.chown(f, "postgres")
        command = ["runuser", "-u", "postgres", "--", *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    pidfile = workdir / "pgbouncer.pid"
    try:
        from aaa_celery.testing import wait_for

        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 20, "pgbouncer's pid file")
        # Open several server connections at once, so the pool has more than one to hand out.
        import psycopg

        held = [psycopg.connect(f"host=127.0.0.1 port={port} dbname={pg.database} user=postgres") for _ in range(4)]
        for conn in held:
            conn.execute("SELECT pg_backend_pid()")  # each in its own open transaction
        for conn in held:
            conn.commit()  # their server connections go back to the pool, idle
            conn.close()
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{pg.database}"
    finally:
        if pidfile.exists() and pidfile.read_text().strip():
            os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.postgres
def test_postgres_behind_a_transaction_pooling_pgbouncer_fails(healthy, pgbouncer):
    point_at(healthy, pgbouncer)
    code, statuses, output = doctor()
    assert code == 1, output
    assert statuses["postgres pooler mode"] == "fail" and "transaction-pooling" in output
    assert statuses["store reachable"] == "fail"


def test_a_mistyped_setting_fails_instead_of_passing_the_brokers_store(healthy):
    """Red on c79799f: with aaa_store_ulr set (and aaa_store_url unset) doctor said 'PASS store
    reachable' about the broker's Redis, not the store the user meant."""
    with setting(aaa_store_ulr="redis://127.0.0.1:1/5"):
        code, statuses, output = doctor()
        app.conf.changes.pop("aaa_store_ulr", None)
    assert code == 1 and statuses["setting names"] == "fail", output
    assert "aaa_store_ulr: not a setting of aaa_celery; did you mean 'aaa_store_url'" in output


def test_a_memory_store_fails_as_a_store_no_fleet_shares(healthy):
    """Red on c79799f: doctor passed a memory:// store, which no two processes share."""
    point_at(healthy, "memory://")
    code, statuses, output = doctor()
    assert code == 1 and statuses["store shared"] == "fail", output
    with setting(aaa_allow_process_local_store=True):
        code, statuses, output = doctor()
        app.conf.changes.pop("aaa_allow_process_local_store", None)
    assert statuses["store shared"] == "warn" and "tests only" in output, output


def test_a_check_that_raises_is_a_failed_line_and_the_others_still_run(healthy, monkeypatch):
    from aaa_celery.cli import doctor as checks

    def broken(store, *more):
        raise RuntimeError("INFO refused")

    monkeypatch.setattr(checks, "check_clock", broken)
    code, statuses, output = doctor()
    assert code == 1 and statuses["clock skew"] == "fail", output
    assert "RuntimeError: INFO refused" in output and "Traceback" not in output
    assert statuses["worker node names"] == "pass", output


def test_a_store_of_an_older_schema_fails_naming_aaa_migrate(healthy, tmp_path):
    """Issue 20: doctor reports the store's schema; one 0.1.0 left (no version) fails until
    `aaa migrate`, then passes."""
    from aaa_celery.stores.sql import versions

    url = f"sqlite:///{tmp_path / 'aaa.sqlite3'}"
    with open_store(url) as store, store.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.exec_driver_sql(f"DROP TABLE {versions.VERSION_TABLE}")
    point_at(healthy, url)
    code, statuses, output = doctor()
    assert code == 1 and statuses["store schema"] == "fail", output
    assert f"0.1.0 (unversioned), this release needs {versions.head()}" in output and "aaa migrate" in output
    assert cli("migrate").exit_code == 0
    point_at(healthy, url)
    code, statuses, output = doctor()
    assert statuses["store schema"] == "pass" and versions.head() in output, output
