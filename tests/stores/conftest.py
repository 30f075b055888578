"""One store fixture over every backend, for the conformance suite.

- ``backend`` (session, parametrized): "memory", "redis", "redis-cluster" (a real
  three-node Redis Cluster, ``tests/redis_cluster.py``), "postgresql", "sqlite".
  Session scope makes pytest run all memory cases first, then all redis cases, and
  so on, and start a server only when its first case runs.
- ``store_factory``: a callable that opens a NEW store on this test's backend, as a
  separate worker would (memory: the same in-process store). Closed after the test.
- ``store``: the first store of ``store_factory``.
- ``redis_cluster_server`` (session) / ``redis_cluster_url`` (per test, every
  primary flushed): the cluster, skipped locally without redis-server, failed under CI=true.
- ``lose_lease(store, lease)``: make a held lease lapse the way it does in production
  on that backend (see :func:`lose_lease`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aaa_celery.lifecycle import Lease
from aaa_celery.stores import Store, open_store
from aaa_celery.stores.memory import MemoryStore

from ..conftest import _psycopg, _serve, unavailable
from ..redis_cluster import RedisClusterServer
from ..servers import libpq_url

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("sqlite", id="sqlite"),
]

StoreFactory = Callable[[], Store]


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path) -> str:
    """This test's store URL; asks for a server fixture only when the backend needs one."""
    if backend == "redis":
        return request.getfixturevalue("redis_url")
    if backend == "redis-cluster":
        return request.getfixturevalue("redis_cluster_url")
    if backend == "postgresql":
        return request.getfixturevalue("postgres_url")
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'aaa.sqlite3'}"
    return "memory://"


@pytest.fixture(scope="session")
def redis_cluster_server() -> Iterator[RedisClusterServer]:
    yield from _serve(RedisClusterServer)  # type: ignore[arg-type]


def cluster_client(url: str) -> Any:
    """A RedisCluster client of the test's own for a ``redis+cluster://`` URL."""
    try:
        import redis
    except ImportError:
        unavailable("the redis driver is not installed (pip install -e '.[dev]')")
    scheme, sep, rest = url.partition("://")
    return redis.RedisCluster.from_url(f"{scheme.split('+')[0]}{sep}{rest}",
                                       decode_responses=True)


@pytest.fixture
def redis_cluster_url(redis_cluster_server: RedisClusterServer) -> str:
    """The session cluster's URL, every primary flushed for this test."""
    client = cluster_client(redis_cluster_server.url)
    try:
        client.flushdb(target_nodes=client.PRIMARIES)
    finally:
        client.close()
    return redis_cluster_server.url


@pytest.fixture
def store_factory(store_url: str) -> Iterator[StoreFactory]:
    opened: list[Store] = []
    shared: list[MemoryStore] = []

    def make() -> Store:
        if store_url.startswith("memory:"):
            # A memory store is one process's state: every "worker" shares it.
            if not shared:
                shared.append(MemoryStore(store_url))
                opened.append(shared[0])
            return shared[0]
        store = open_store(store_url)
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        try:
            store.close()
        except Exception:  # noqa: BLE001 - a lease test may have killed its connection
            pass


@pytest.fixture
def store(store_factory: StoreFactory) -> Store:
    return store_factory()


# --- making a lease lapse, per backend -------------------------------------------------

#: Names a PostgresStore may give the backend pid that holds a lease's advisory lock:
#: a method taking the lease, or (one dedicated connection per store) a plain attribute.
_PID_PROBES = ("lease_backend_pid", "backend_pid", "holder_pid")


def _holder_pid(store: Store, lease: Lease) -> int | None:
    for name in _PID_PROBES:
        probe = getattr(store, name, None)
        if probe is None:
            continue
        pid = probe(lease) if callable(probe) else probe
        if pid is not None:
            return int(pid)
    # PostgresStore (today) writes the holder's backend pid into the token: "<pid>.<hex>".
    prefix, dot, _ = lease.token.partition(".")
    return int(prefix) if dot and prefix.isdigit() else None


def _terminate_holder(store: Store, lease: Lease) -> None:
    """Kill the Postgres session that holds ``lease``, as a dead worker's would die.

    If the store names the holder's backend pid (a probe method, or the token's
    ``<pid>.`` prefix), that one session is terminated. Otherwise every other session
    holding an advisory lock is, so call this while the lease to lose is the only one
    held (the store should then grow a ``lease_backend_pid(lease)``).
    """
    url = getattr(store, "url", None)
    if not url:
        raise AssertionError(f"{type(store).__name__} has no .url; cannot reach its server")
    psycopg = _psycopg()
    with psycopg.connect(libpq_url(url), autocommit=True) as con:
        pid = _holder_pid(store, lease)
        if pid is not None:
            pids = [pid]
        else:
            rows = con.execute(
                "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND pid <> pg_backend_pid()"
            ).fetchall()
            pids = [r[0] for r in rows]
        assert pids, f"no Postgres session holds an advisory lock for {lease.call_id}"
        for pid in pids:
            con.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while con.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
        ).fetchone()[0]:
            assert time.monotonic() < deadline, f"backends {pids} did not exit"
            time.sleep(0.01)


def lose_lease(store: Store, lease: Lease) -> None:
    """Make ``lease`` lapse without its holder giving it back.

    - TTL stores (memory, redis, sqlite): wait one TTL on the store's clock, past any
      expiry the holder may have renewed to (use a short ``lease_ttl_s``, e.g. 0.3 s).
    - Session stores (postgresql): terminate the holder's database session, as a
      worker's death would. ``store.release(lease)`` is NOT equivalent: it is the
      holder's own act, whereas here the holder still believes it holds the lease.
    """
    if store.ttl_leases:
        # A renewal may have pushed the expiry past lease.expires_at, but never past now + TTL.
        expires_at = store.now() + lease.ttl_s
        while store.now() <= expires_at + 0.01:
            time.sleep(max(0.005, min(0.05, expires_at - store.now() + 0.02)))
    else:
        _terminate_holder(store, lease)


@pytest.fixture(name="lose_lease")
def lose_lease_fixture() -> Callable[[Store, Lease], None]:
    return lose_lease
