"""Versioned stores (issue 20 item 4): every backend says which schema it holds; an older
one (0.1.0 kept no version) is refused until ``migrate`` upgrades it, a newer one is
refused outright, and ``aaa_store_auto_migrate`` upgrades at worker start under a lock.

A store 0.1.0 really wrote is in ``tests/stores/test_upgrade.py``; here an "0.1.0 store"
is one of this release with its version taken away (0.1.0's schema is this release's
first revision, so nothing else differs), and a "pre-0.1.0 store" one whose tables lack
what later builds added.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from aaa_celery.errors import StoreOutdated
from aaa_celery.lifecycle import Outcome
from aaa_celery.stores import Store, open_store
from aaa_celery.stores.base import check_version
from aaa_celery.stores.redis import format_version
from aaa_celery.stores.sql import versions

from .test_conformance import claim, config, new_call

SQL = [pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)]
VERSIONED = [*SQL, pytest.param("redis", id="redis", marks=pytest.mark.redis)]


def sql_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "postgresql":
        return request.getfixturevalue("postgres_url")
    if backend == "redis":
        return request.getfixturevalue("redis_url")
    return f"sqlite:///{tmp_path / 'aaa.sqlite3'}"


def forget_version(store: Store) -> None:
    """Make the store look as 0.1.0 left it: its tables or keys, and no version."""
    engine = getattr(store, "engine", None)
    if engine is not None:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE {versions.VERSION_TABLE}"))
    else:
        store._redis.delete(format_version.format_key(store.key_prefix))  # type: ignore[attr-defined]


def set_version(store: Store, version: str) -> None:
    engine = getattr(store, "engine", None)
    if engine is not None:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {versions.VERSION_TABLE} SET version_num = :v"), {"v": version})
    else:
        store._redis.set(format_version.format_key(store.key_prefix), version)  # type: ignore[attr-defined]


def as_0_1_0_left_it(url: str):
    """A store at ``url`` with a finished call and no version; returns the call."""
    with open_store(url) as old:
        call = finished_call(old)
        forget_version(old)
    return call


def finished_call(store: Store):
    call = new_call()
    lease = claim(store, call, "w1", config()).lease
    store.finish(lease, Outcome.success({"kept": True}), config())
    return call


def test_the_revisions_named_in_versions_py_are_the_shipped_ones():
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(versions.alembic_config())
    assert tuple(reversed([r.revision for r in script.walk_revisions()])) == versions.REVISIONS
    assert script.get_current_head() == versions.head()


def test_a_new_store_is_at_this_releases_version(store):
    version = store.schema_version()
    assert (version.outdated, version.newer) == (False, False)
    assert version.current == version.latest
    assert check_version(store, auto_migrate=False) == version
    after = store.migrate()  # nothing to do (Redis: the format key written), and it says so
    assert (after.current, after.outdated, after.newer) == (version.current, False, False)


@pytest.mark.parametrize("backend", SQL)
def test_a_store_0_1_0_left_is_refused_until_migrate_upgrades_it(request, backend, tmp_path):
    url = sql_url(request, backend, tmp_path)
    call = as_0_1_0_left_it(url)

    with open_store(url) as store:
        version = store.schema_version()
        assert (version.current, version.outdated, version.empty) == (None, True, False)
        with pytest.raises(StoreOutdated) as refused:
            check_version(store, auto_migrate=False, command="celery -A proj aaa migrate")
        assert "`celery -A proj aaa migrate`" in str(refused.value)
        assert "0.1.0 (unversioned)" in str(refused.value) and "aaa_store_auto_migrate=True" in str(refused.value)

        upgraded = store.migrate()
        assert (upgraded.current, upgraded.outdated) == (upgraded.latest, False)
        assert store.migrate() == upgraded  # again: nothing to do
        assert check_version(store, auto_migrate=False) == upgraded
        assert store.result(call.call_id) == Outcome.success({"kept": True}, 1)


@pytest.mark.postgres
def test_a_migrated_postgresql_store_runs_the_functions_a_new_one_is_made_with(postgres_url):
    """The revisions' own copies of the store's functions are the ones this release calls: a
    change to ``pg_functions.py`` without a revision that replaces them turns this red."""
    from aaa_celery.stores.sql import pg_functions

    def definitions(store: Store) -> dict[str, str]:
        with store.engine.connect() as conn:  # type: ignore[attr-defined]
            return {name: conn.execute(sa.text("SELECT pg_get_functiondef(CAST(:f AS regproc))"),
                                       {"f": name}).scalar_one() for name in pg_functions.NAMES}

    with open_store(postgres_url) as store:
        made = definitions(store)
        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            for name in pg_functions.NAMES:
                conn.execute(sa.text(f"DROP FUNCTION {name}"))
        set_version(store, versions.REVISIONS[versions.REVISIONS.index("0003") - 1])
        assert store.migrate().outdated is False
        assert definitions(store) == made


def hints(store: Store, *call_ids: str) -> list[float | None]:
    with store.engine.connect() as conn:  # type: ignore[attr-defined]
        return [conn.execute(sa.text("SELECT lease_expires_at FROM aaa_calls WHERE call_id = :c"),
                             {"c": c}).scalar_one() for c in call_ids]


@pytest.mark.parametrize("backend", SQL)
def test_revision_0004_marks_the_finished_rows_it_finds_and_its_downgrade_unmarks_them(request, backend, tmp_path):
    """0003 left a finished row without an expiry, which every sweep read; 0004 gives such
    rows ``FINISHED_HINT`` and leaves a released lease's row (no result) as it was. Its
    downgrade puts both the rows and (PostgreSQL) ``aaa_finish_planned`` back as 0003 had them."""
    from alembic import command

    from aaa_celery.lifecycle import FINISHED_HINT

    url = sql_url(request, backend, tmp_path)
    with open_store(url) as store:
        done = finished_call(store)
        lease = claim(store, new_call(), "w1", config()).lease
        store.release(lease)  # lost without a result: the sweep must find it at once
        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.execute(sa.text("UPDATE aaa_calls SET lease_expires_at = NULL WHERE call_id = :c"),
                         {"c": done.call_id})
        set_version(store, "0003")

        assert store.migrate().current == versions.head()
        assert hints(store, done.call_id, lease.call_id) == [FINISHED_HINT, None]
        assert [c.call_id for c in store.expired(unclaimed_grace_s=1e12)] == [lease.call_id]

        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            config_ = versions.alembic_config()
            config_.attributes["connection"] = conn
            command.downgrade(config_, "0003")
            if backend == "postgresql":
                body = conn.execute(sa.text("SELECT prosrc FROM pg_proc WHERE proname = 'aaa_finish_planned'")).scalar_one()
                assert "'Infinity'" not in body and "lease_expires_at = NULL" in body
                # 0004's begin takes two more arguments; 0003's comes back, and only it
                assert conn.execute(sa.text("SELECT array_agg(pronargs) FROM pg_proc"
                                            " WHERE proname = 'aaa_begin_planned'")).scalar_one() == [15]
        assert hints(store, done.call_id, lease.call_id) == [None, None]
        assert store.migrate().current == versions.head()
        assert hints(store, done.call_id, lease.call_id) == [FINISHED_HINT, None]
        if backend == "postgresql":
            with store.engine.connect() as conn:  # type: ignore[attr-defined]
                assert conn.execute(sa.text("SELECT array_agg(pronargs) FROM pg_proc"
                                            " WHERE proname = 'aaa_begin_planned'")).scalar_one() == [17]


@pytest.mark.parametrize("backend", SQL)
def test_revision_0005_adds_the_concurrency_slots_and_its_downgrade_drops_them(request, backend, tmp_path):
    """A store at 0004 has no ``aaa_slots``: 0005 adds it, keeping every call as it was, and
    slots work; its downgrade drops the table (and 0004's store runs on without it)."""
    from alembic import command

    url = sql_url(request, backend, tmp_path)
    with open_store(url) as store:
        done = finished_call(store)
        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.execute(sa.text("DROP TABLE aaa_slots"))
        set_version(store, "0004")
        with pytest.raises(StoreOutdated):
            check_version(store, auto_migrate=False)

        assert store.migrate().current == versions.head()
        assert store.take_slot("aaa:slot:k", "c1", 1, 30).reply == "taken"
        assert store.take_slot("aaa:slot:k", "c2", 1, 30).reply == "full"
        assert store.result(done.call_id) is not None

        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            config_ = versions.alembic_config()
            config_.attributes["connection"] = conn
            command.downgrade(config_, "0004")
            assert not sa.inspect(conn).has_table("aaa_slots")
        assert store.migrate().current == versions.head()
        assert store.slot_holders("aaa:slot:k") == []


@pytest.mark.postgres
def test_revision_0006_assembles_the_functions_from_the_statements_and_its_downgrade_puts_0004s_back(postgres_url):
    """0006 replaces the functions with the same ones, their writes the store's statements:
    after its downgrade a store runs 0004's, and calls begin and finish on either."""
    from alembic import command

    from aaa_celery.stores.sql import pg_functions, statements

    def definitions(store: Store) -> list[str]:
        with store.engine.connect() as conn:  # type: ignore[attr-defined]
            return [conn.execute(sa.text("SELECT prosrc FROM pg_proc WHERE proname = :f"), {"f": name}).scalar_one()
                    for name in pg_functions.NAMES]

    written = statements.CLAIM_ATTEMPT.plpgsql(attempt="p_attempt", token="p_token", worker="p_worker", hint="p_hint",
                                             call_id="p_call_id")
    with open_store(postgres_url) as store:
        assert written in definitions(store)[0]
        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            config_ = versions.alembic_config()
            config_.attributes["connection"] = conn
            command.downgrade(config_, "0005")
        assert not any(written in body for body in definitions(store))
        finished_call(store)  # on 0004's functions
        assert store.migrate().current == "0006"
        assert written in definitions(store)[0]
        finished_call(store)


@pytest.mark.parametrize("backend", VERSIONED)
def test_auto_migrate_upgrades_an_older_store_once_among_racing_workers(request, backend, tmp_path):
    url = sql_url(request, backend, tmp_path)
    call = as_0_1_0_left_it(url)
    stores = [open_store(url) for _ in range(4)]
    got, errors = [], []

    def start(store: Store) -> None:
        try:
            got.append(check_version(store, auto_migrate=True))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors, errors
        assert {(v.current, v.outdated) for v in got} == {(got[0].latest, False)}
        assert stores[0].result(call.call_id) == Outcome.success({"kept": True}, 1)
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("backend", VERSIONED)
def test_a_store_a_newer_release_upgraded_is_refused(request, backend, tmp_path):
    url = sql_url(request, backend, tmp_path)
    with open_store(url) as store:
        finished_call(store)
        set_version(store, "9999")
        version = store.schema_version()
        assert (version.newer, version.outdated) == (True, False)
        for auto in (False, True):
            with pytest.raises(StoreOutdated, match="newer release of aaa_celery"):
                check_version(store, auto_migrate=auto)
        assert store.migrate().current == "9999"  # never written over


def _revision_0001():
    path = Path(versions.__file__).parent / "migrations" / "versions" / "0001_v0_1_0.py"
    spec = importlib.util.spec_from_file_location("aaa_revision_0001", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("backend", SQL)
def test_migrate_brings_a_pre_0_1_0_database_to_the_0_1_0_schema(request, backend, tmp_path):
    """``create_all`` never altered a table: a database made before fc9a97d lacked the
    ``handed_on``/``handed`` columns for good (and one made earlier, whole tables)."""
    url = sql_url(request, backend, tmp_path)
    meta = _revision_0001().tables()
    calls = meta.tables["aaa_calls"]
    for name in ("handed_on", "handed"):
        calls._columns.remove(calls.c[name])
    meta.remove(meta.tables["aaa_checkpoints"])
    engine = sa.create_engine(sa.make_url(url).set(drivername="postgresql+psycopg") if backend == "postgresql"
                              else url)
    meta.create_all(engine)
    spec = {"call_id": "old-1", "name": "refund", "idempotency_key": "k", "request": {}}
    with engine.begin() as conn:
        conn.execute(calls.insert().values(call_id="old-1", spec=spec, attempts=0, registered_at=1.0,
                                           recovery_until=0.0))
    engine.dispose()

    with open_store(url) as store:
        assert store.schema_version().outdated
        store.migrate()
        found = sa.inspect(store.engine)  # type: ignore[attr-defined]
        assert {"handed_on", "handed"} <= {c["name"] for c in found.get_columns("aaa_calls")}
        assert found.has_table("aaa_checkpoints")
        # and to this release's: the recovery sweep's indexes (0002)
        assert {"ix_aaa_calls_lease_expires_at", "ix_aaa_calls_unclaimed"} <= {
            i["name"] for i in found.get_indexes("aaa_calls")}
        # the old row works: claimed, handed on, claimed again, checkpointed
        from aaa_celery.lifecycle import CallSpec

        call = CallSpec(**spec)
        lease = claim(store, call, "w1", config()).lease
        store.hand_on(lease)
        again = claim(store, call, "w2", config()).lease
        assert again.attempt == 2
        from aaa_celery.lifecycle import checkpoint_json

        assert store.save_checkpoint(again, checkpoint_json(2, {"page": 1}))


@pytest.mark.redis
def test_a_redis_prefix_without_its_format_key_is_0_1_0s_format_1_and_migrate_writes_the_key(redis_url):
    """0.1.0 kept no format key, and its layout is format 1: such a prefix (or one whose key
    was flushed or evicted, or one a producer wrote before any worker started) is current,
    never refused; ``migrate`` writes the key."""
    with open_store(redis_url, key_prefix="old") as store:
        assert store.schema_version().empty
        call = finished_call(store)
        assert store._redis.get("old:format") is None  # type: ignore[attr-defined]
        version = store.schema_version()
        assert (version.current, version.outdated, version.empty) == ("1", False, False)
        assert check_version(store, auto_migrate=False) == version
        assert store.migrate().current == "1"
        assert store._redis.get("old:format") == format_version.FORMAT  # type: ignore[attr-defined]
        assert store.result(call.call_id) == Outcome.success({"kept": True}, 1)


@pytest.mark.fleet
@pytest.mark.redis
@pytest.mark.parametrize("auto", [False, True])
def test_a_worker_refuses_an_older_store_naming_the_command_unless_auto_migrate(tmp_path, auto, redis_url):
    from ..worker.test_setting_checks import SETTINGS_APP, outcome, start

    url = f"sqlite:///{tmp_path / 'aaa.sqlite3'}"
    as_0_1_0_left_it(url)
    conf = {"aaa_store_url": url, **({"aaa_store_auto_migrate": True} if auto else {})}
    worker = start(tmp_path, SETTINGS_APP, {"AAA_SETTINGS_BROKER": redis_url, "AAA_SETTINGS_CONF": json.dumps(conf)},
                   pool="solo")
    assert outcome(worker) == ("ready" if auto else "refused"), worker.log[-3000:]
    with open_store(url) as store:
        assert store.schema_version().outdated is not auto
    if not auto:
        assert worker.proc.returncode != 0
        assert "celery -A settings_app aaa migrate" in worker.log, worker.log[-3000:]


@pytest.mark.redis
def test_a_redis_format_key_holding_bytes_that_are_not_utf_8_is_one_clear_line(redis_url):
    """Reproduces on 03c27cd: ``UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff``."""
    import redis

    from aaa_celery.stores.redis import RedisStore

    raw = redis.Redis.from_url(redis_url)
    try:
        raw.set("garbled:format", b"\xff\xfe\x00v2")
        with RedisStore(redis_url, key_prefix="garbled") as store:
            with pytest.raises(StoreOutdated) as refused:
                check_version(store, auto_migrate=False)
            message = str(refused.value)
            assert "\n" not in message and "'garbled:format'" in message and "not UTF-8" in message
            assert "aaa_store_url" in message
            with pytest.raises(StoreOutdated):
                store.migrate()  # never overwrites what another program wrote
        assert raw.get("garbled:format") == b"\xff\xfe\x00v2"
    finally:
        raw.delete("garbled:format")
        raw.close()
