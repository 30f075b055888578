"""Where the PostgreSQL store's server time goes, per statement, and what a commit costs.

The topology of issue 41's item 2: a durable PostgreSQL store (``fsync`` and
``synchronous_commit`` on), Celery's results in a Redis database of the broker's server,
one ``celery worker -P prefork -c 2``. The server loads ``pg_stat_statements`` (with
``track = all``, so the statements inside the store's PL/pgSQL functions count too) and
times its WAL writes and flushes (``track_wal_io_timing``).

Each round drains N guarded calls published beforehand (as ``overhead.py`` does), after a
reset of the statistics, and prints:

* per statement: calls per guarded call, mean execution time, and its share of the
  server's execution time (top-level statements and the function bodies they run);
* the WAL: records, bytes, writes and flushes (``fsync``) per call, and the time the flushes
  took; the updates of ``aaa_calls`` rows per call, and how many were HOT (no index entry
  written);
* the worker's CPU (main process and pool children), the server's CPU and transactions per
  call, and the calls drained per second.

``--commit off`` runs the same drain with ``synchronous_commit = off`` set on the server
(not a setting the store uses or recommends: a commit it acknowledged could be lost in a
crash): the difference is what waiting for the WAL flush costs here. ``pg_test_fsync``'s
figure for this disk is printed first.

    python benchmarks/pg_statements.py                 # 3000 calls, commits as in production
    python benchmarks/pg_statements.py --commit off    # the same, without waiting for the flush
    python benchmarks/pg_statements.py --variant plain --calls 3000   # plain Celery, for the ratio
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (DurablePostgres, Worker, cpu_seconds, libpq_url, redis_server,  # noqa: E402
                                wait_until, write_json)
from benchmarks.overhead import QUEUE, STAGING, publish  # noqa: E402
from tests.servers import postgres_bin  # noqa: E402


class StatementsPostgres(DurablePostgres):
    """The benchmarks' durable PostgreSQL, counting every statement and timing its WAL I/O."""

    settings = {**DurablePostgres.settings, "shared_preload_libraries": "pg_stat_statements",
                "pg_stat_statements.track": "all", "track_wal_io_timing": "on", "track_io_timing": "on"}


def fsync_latency_ms() -> float | None:
    """``pg_test_fsync``'s time per ``fdatasync`` of one 8 kB write on this disk, in ms."""
    with tempfile.TemporaryDirectory(prefix="aaa-fsync-") as tmp:
        done = subprocess.run([postgres_bin("pg_test_fsync"), "-s", "2", "-f", f"{tmp}/probe"],
                              capture_output=True, text=True, timeout=120, check=False)
    for line in done.stdout.splitlines():
        if line.strip().startswith("fdatasync") and "usecs/op" in line:
            return float(line.split()[-2]) / 1000
    return None


def snapshot(con: Any) -> dict[str, Any]:
    con.execute("SELECT pg_stat_force_next_flush()")
    wal = con.execute("SELECT wal_records, wal_bytes, wal_write, wal_sync, wal_write_time, wal_sync_time"
                      " FROM pg_stat_wal").fetchone()
    xacts = con.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database"
                        " WHERE datname = current_database()").fetchone()[0]
    updates = con.execute("SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)"
                          " FROM pg_stat_user_tables WHERE relname = 'aaa_calls'").fetchone()
    return {"wal": [float(v) for v in wal], "xacts": int(xacts), "updates": [int(v) for v in updates]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--variant", default="guarded", choices=("guarded", "plain", "tool"))
    ap.add_argument("--commit", default="on", choices=("on", "off"),
                    help="the server's synchronous_commit for this run (default on, as in production)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default="", help="also write the figures as JSON (benchmarks/results/...)")
    args = ap.parse_args(argv)
    import psycopg
    import redis

    fsync_ms = fsync_latency_ms()
    print(f"pg_test_fsync: fdatasync of an 8 kB write takes {fsync_ms} ms on this disk")
    with redis_server(appendonly=False) as broker_srv:
        pg = StatementsPostgres.start()
        worker = None
        try:
            env = {"BENCH_BROKER": broker_srv.url, "BENCH_BACKEND": broker_srv.url[:-1] + "1",
                   "BENCH_STORE": pg.url, "BENCH_QUEUE": QUEUE}
            os.environ.update(env)
            from benchmarks import bench_app

            con = psycopg.connect(libpq_url(pg.url), autocommit=True)
            con.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            con.execute(f"ALTER SYSTEM SET synchronous_commit = {args.commit}")
            con.execute("SELECT pg_reload_conf()")
            app = bench_app.app
            broker, results = redis.Redis.from_url(env["BENCH_BROKER"]), redis.Redis.from_url(env["BENCH_BACKEND"])
            worker = Worker(env, "prefork", 2, queues=QUEUE, name="pgstat")
            for tag, n in (("warm", 300), ("run", args.calls)):
                results.flushdb()
                publish(app, args.variant, n, tag)
                assert wait_until(lambda: broker.llen(STAGING) == n, 60), "staging list incomplete"
                con.execute("SELECT pg_stat_statements_reset()")
                con.execute("SELECT pg_stat_reset_shared('wal')")
                before, cpu0, wcpu0 = snapshot(con), cpu_seconds(pg.pid() or 0), worker.cpu()
                broker.rename(STAGING, QUEUE)
                t0 = time.perf_counter()
                assert wait_until(lambda: results.dbsize() >= n, 600, 0.005), "drain incomplete"
                drain_s = time.perf_counter() - t0
            after, cpu, wcpu = snapshot(con), cpu_seconds(pg.pid() or 0) - cpu0, worker.cpu() - wcpu0
            rows = con.execute("SELECT toplevel, calls, total_exec_time, mean_exec_time, query"
                               " FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%'"
                               " ORDER BY total_exec_time DESC").fetchall()
            con.close()
        finally:
            if worker is not None:
                worker.stop()
            pg.stop()
    n = args.calls
    wal = [(a - b) for a, b in zip(after["wal"], before["wal"])]
    top_total = sum(r[2] for r in rows if r[0])
    figures: dict[str, Any] = {
        "variant": args.variant, "synchronous_commit": args.commit, "calls": n, "per_s": n / drain_s,
        "fdatasync_ms": fsync_ms, "server_cpu_ms_per_call": cpu / n * 1e3, "worker_cpu_ms_per_call": wcpu / n * 1e3,
        "xacts_per_call": (after["xacts"] - before["xacts"]) / n,
        "wal_per_call": {"records": wal[0] / n, "bytes": wal[1] / n, "writes": wal[2] / n, "flushes": wal[3] / n,
                         "write_ms": wal[4] / n, "flush_ms": wal[5] / n},
        "statement_ms_per_call": top_total / n,
        "calls_row_updates_per_call": {"all": (after["updates"][0] - before["updates"][0]) / n,
                                       "hot": (after["updates"][1] - before["updates"][1]) / n},
        "statements": [{"toplevel": r[0], "per_call": r[1] / n, "mean_ms": r[3],
                        "share": (r[2] / top_total if top_total else 0.0), "query": " ".join(r[4].split())}
                       for r in rows[:args.top]],
    }
    print(f"{args.variant}, synchronous_commit {args.commit}: {figures['per_s']:.0f} calls/s; worker CPU "
          f"{figures['worker_cpu_ms_per_call']:.3f} ms/call; server CPU {figures['server_cpu_ms_per_call']:.3f} "
          f"ms/call; transactions/call {figures['xacts_per_call']:.2f}; "
          f"top-level statements' execution {figures['statement_ms_per_call']:.3f} ms/call")
    w = figures["wal_per_call"]
    print(f"WAL per call: {w['records']:.1f} records, {w['bytes']:.0f} bytes, {w['writes']:.2f} writes, "
          f"{w['flushes']:.2f} flushes taking {w['flush_ms']:.3f} ms (writes {w['write_ms']:.3f} ms)")
    u = figures["calls_row_updates_per_call"]
    print(f"aaa_calls row updates per call: {u['all']:.2f}, of which HOT (no index entries written) {u['hot']:.2f}")
    print("\nper call | mean ms | share of top-level time | statement (nested: inside a function)")
    for s in figures["statements"]:
        where = "" if s["toplevel"] else "  (nested)"
        share = f"{s['share']:6.1%}" if s["toplevel"] else "     -"
        print(f"{s['per_call']:8.2f} | {s['mean_ms']:7.3f} | {share} | {s['query'][:150]}{where}")
    if args.out:
        print(f"\nwrote {write_json(args.out, figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
