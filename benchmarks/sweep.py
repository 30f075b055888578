"""The recovery sweep with many calls leased and a few lapsed: does its cost grow with the
lapsed only?

For each (store, N leased, L lapsed), the store alone and one client process:

1. ``begin`` N calls and keep their leases (live for the whole run);
2. ``begin`` L more and lose their leases (Redis: a 1 s lease TTL, then wait; PostgreSQL:
   a second store's lease session, closed, and a wait past the 1 s sweep hint it left);
3. run :class:`aaa_celery.worker.recovery.Recovery` sweeps, as a worker's sweeper does,
   with a Celery app on kombu's in-memory broker (the republishes go nowhere): the first
   sweep claims and republishes the L, the next ones find them held and republish none;
4. run the sweep's two listings alone (``expired()`` for the lapsed, then with a 60 s grace;
   row ``expired() x2``, whose "republished" column is the calls listed, and which adds the
   sweeping process's CPU), without the per-lapsed claims that dominate a whole sweep.

Reported per sweep: wall time, the store server's CPU, and what it read: Redis commands
and bytes sent to the client (``INFO commandstats``, ``INFO stats``); PostgreSQL
transactions and the ``aaa_calls`` rows examined (``pg_stat_user_tables``: sequential
plus index tuples, read after the sweeping store closed, which flushes its counters).
CPU and counts hold on a loaded machine; the wall time does not.

    python benchmarks/sweep.py                  # Redis 1k/10k/100k leased, PostgreSQL 1k/10k; 1k lapsed
    python benchmarks/sweep.py --quick          # ~1 min: Redis 1k and 5k leased, PostgreSQL 500 and 2k; 100 lapsed
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import libpq_url, parser, redis_server, table, write_json  # noqa: E402
from benchmarks.scale import SCALE_CONFIG, BigPostgres, PostgresProbe, RedisProbe, spec  # noqa: E402

from aaa_celery.config import GuardConfig  # noqa: E402
from aaa_celery.stores.base import Store  # noqa: E402

SWEEPS = 3


def recovery_app(store: Store) -> Any:
    from celery import Celery

    from aaa_celery.worker.stores import use_store

    app = Celery("sweep", broker="memory://", set_as_current=False)
    use_store(app, store)
    return app


class RedisCounts:
    """What a Redis store server did so far: commands, bytes sent to clients, CPU."""

    def __init__(self, url: str) -> None:
        self.probe = RedisProbe(url)

    def read(self) -> dict[str, float]:
        stats = self.probe.client.info("stats")
        calls = sum(n for cmd, (n, _) in self.probe.commands().items() if cmd != "info")
        return {"cpu_s": self.probe.cpu(), "commands": calls, "bytes_out": stats["total_net_output_bytes"]}


class PostgresCounts:
    """What a PostgreSQL store server did so far: transactions, aaa_calls rows examined, CPU."""

    def __init__(self, server: Any) -> None:
        self.server, self.probe = server, PostgresProbe(server)

    def read(self) -> dict[str, float]:
        import psycopg

        with psycopg.connect(libpq_url(self.server.url), autocommit=True) as con:
            xacts, rows = con.execute(
                "SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()),"
                " (SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables"
                "   WHERE relname = 'aaa_calls')").fetchone()
        return {"cpu_s": self.probe.cpu(), "transactions": int(xacts), "calls_rows_examined": int(rows or 0)}


def sweep_rows(kind: str, open_store: Any, counts: Any, reset: Any, lose: Any, n: int, lapsed: int,
               analyze: Any = lambda: None) -> dict[str, Any]:
    from aaa_celery.worker.recovery import Recovery

    reset()
    store = open_store()
    for i in range(n):
        store.begin(spec(i, f"live{n}"), "bench/live", SCALE_CONFIG)
    lose([spec(i, f"lapsed{n}") for i in range(lapsed)])
    analyze()
    sweeps = []
    for k in range(SWEEPS):
        sweeper = open_store()  # its own store, closed after the sweep: PostgreSQL then flushes its counters
        recovery = Recovery(recovery_app(sweeper), sweeper, "bench/sweeper")
        before = counts.read()
        t0 = time.perf_counter()
        sent = recovery.sweep()
        wall = time.perf_counter() - t0
        sweeper.close()
        time.sleep(0.3)
        after = counts.read()
        got = {key: after[key] - before[key] for key in after}
        sweeps.append({"sweep": k + 1, "republished": len(sent), "wall_ms": wall * 1e3,
                       "server_cpu_ms": got.pop("cpu_s") * 1e3, **got})
        print(f"  {kind} {n:,} leased, {lapsed:,} lapsed, sweep {k + 1}: {sweeps[-1]}", flush=True)
    # the sweep's two listings alone (what grows with the leased, if anything does), without the
    # claim of each lapsed call that follows them in a sweep
    sweeper = open_store()
    before = counts.read()
    t0, c0 = time.perf_counter(), time.process_time()
    listed = len(sweeper.expired(unclaimed_grace_s=1e12)) + len(sweeper.expired(unclaimed_grace_s=60.0))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    sweeper.close()
    time.sleep(0.3)
    after = counts.read()
    got = {key: after[key] - before[key] for key in after}
    sweeps.append({"sweep": "expired() x2", "republished": listed, "wall_ms": wall * 1e3,
                   "client_cpu_ms": cpu * 1e3, "server_cpu_ms": got.pop("cpu_s") * 1e3, **got})
    print(f"  {kind} {n:,} leased, {lapsed:,} lapsed, listings alone: {sweeps[-1]}", flush=True)
    store.close()
    return {"store": kind, "leased": n, "lapsed": lapsed, "sweeps": sweeps}


def run_redis(sizes: list[int], lapsed: int) -> list[dict[str, Any]]:
    from aaa_celery.stores.redis import RedisStore

    short = GuardConfig(lease_ttl_s=1)
    rows = []
    with redis_server() as server:
        counts = RedisCounts(server.url)

        def lose(specs: list[Any]) -> None:
            store = RedisStore(server.url)
            for s in specs:
                store.begin(s, "bench/lost", short)
            store.close()
            time.sleep(1.2)  # the leases lapse

        for n in sizes:
            rows.append(sweep_rows("redis", lambda: RedisStore(server.url), counts, counts.probe.reset, lose, n,
                                   lapsed))
    return rows


def run_postgres(sizes: list[int], lapsed: int) -> list[dict[str, Any]]:
    from aaa_celery.stores.sql.postgres import PostgresStore

    short = GuardConfig(lease_ttl_s=1)
    server = BigPostgres.start()
    try:
        counts = PostgresCounts(server)

        def lose(specs: list[Any]) -> None:
            store = PostgresStore(server.url)
            for s in specs:
                store.begin(s, "bench/lost", short)
            store.close()  # its lease session ends: every lease on it lapses
            time.sleep(1.2)  # ... and the sweep hint it left (lifecycle.sweep_hint) with them

        def analyze() -> None:
            # as autovacuum would: reset() analyzed the tables empty, and with those statistics
            # the planner reads a call by a sequential scan
            import psycopg

            with psycopg.connect(libpq_url(server.url), autocommit=True) as con:
                con.execute("ANALYZE")

        rows = []
        for n in sizes:
            PostgresStore(server.url).close()  # the tables, before reset() truncates them
            rows.append(sweep_rows("postgresql", lambda: PostgresStore(server.url), counts, counts.probe.reset,
                                   lose, n, lapsed, analyze))
        return rows
    finally:
        server.stop()


def report(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        for s in r["sweeps"]:
            read = (f"{s['commands']:,} commands, {s['bytes_out'] / 1024:,.0f} KiB sent" if r["store"] == "redis"
                    else f"{s['transactions']:,} transactions, {s['calls_rows_examined']:,} aaa_calls rows examined")
            if "client_cpu_ms" in s:
                read += f"; sweeping process CPU {s['client_cpu_ms']:,.0f} ms"
            lines.append([r["store"], r["leased"], r["lapsed"], s["sweep"], s["republished"], s["wall_ms"],
                          s["server_cpu_ms"], read])
    return table(["store", "leased (live)", "lapsed", "sweep", "republished", "wall ms", "store server CPU ms",
                  "what the store read"], lines,
                 "Recovery sweeps with N calls leased and L lapsed (sweep 1 republishes the L; later ones find them held)")


QUICK = "Redis 1k and 5k leased, PostgreSQL 500 and 2k, 100 lapsed"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "sweep", QUICK)
    ap.add_argument("--sizes", default="1000,10000,100000", help="Redis leased sizes (default %(default)s)")
    ap.add_argument("--pg-sizes", default="1000,10000", help="PostgreSQL leased sizes (default %(default)s; "
                    "100000 fits the benchmark server's lock table, and takes a few minutes to fill)")
    ap.add_argument("--lapsed", type=int, default=1000, help="lapsed calls (default %(default)s)")
    ap.add_argument("--stores", default="redis,postgresql", help="default %(default)s")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.pg_sizes, args.lapsed = "1000,5000", "500,2000", 100
    stores = args.stores.split(",")
    rows: list[dict[str, Any]] = []
    if "redis" in stores:
        rows += run_redis([int(s) for s in args.sizes.split(",") if s], args.lapsed)
    if "postgresql" in stores:
        rows += run_postgres([int(s) for s in args.pg_sizes.split(",") if s], args.lapsed)
    text = report(rows)
    print()
    print(text)
    path = write_json(args.out, {"config": vars(args), "rows": rows, "table": text})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
