"""The PostgreSQL recovery sweep's listing with many finished calls kept: does it grow with
the store's history?

Finished calls stay in ``aaa_calls`` until ``aaa purge``, and every worker lists the lapsed
calls every ``aaa_recovery_interval_s`` (2 s). For each N, the store alone and one client:

1. ``register``, ``begin`` and ``finish`` calls until N have finished (as a worker does:
   one ``aaa_begin_planned`` and one ``aaa_finish_planned`` each), then ``VACUUM ANALYZE``
   as autovacuum would;
2. time ``expired()`` (the sweep's listing of the lapsed calls), and read what the server
   spent on it: its CPU and the ``aaa_calls`` rows it examined.

Run it from a checkout to measure that checkout's store (the A/B in ``RESULTS.md`` copies
this file into the older checkout):

    python benchmarks/sweep_finished.py                      # 1k, 10k, 30k finished
    python benchmarks/sweep_finished.py --quick              # 500 and 2k
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import DurablePostgres, libpq_url, parser, table, write_json  # noqa: E402
from benchmarks.scale import SCALE_CONFIG, PostgresProbe, spec  # noqa: E402

from aaa_celery.lifecycle import Outcome  # noqa: E402

LISTINGS = 20


def examined(url: str) -> int:
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True) as con:
        row = con.execute("SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
                          " FROM pg_stat_user_tables WHERE relname = 'aaa_calls'").fetchone()
    return int(row[0]) if row else 0


def vacuum(url: str) -> None:
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True) as con:
        con.execute("VACUUM ANALYZE")


def run(sizes: list[int]) -> list[dict[str, Any]]:
    from aaa_celery.stores.sql.postgres import PostgresStore

    server = DurablePostgres.start()
    rows = []
    try:
        probe = PostgresProbe(server)
        store = PostgresStore(server.url)
        ok, done = Outcome.success(None), 0
        for n in sizes:
            print(f"  {n:,} finished ...", flush=True)
            while done < n:
                call = spec(done, "f")
                store.register(call)
                store.finish(store.begin(call, "bench/sweep", SCALE_CONFIG).lease, ok, SCALE_CONFIG)
                done += 1
            vacuum(server.url)
            sweeper = PostgresStore(server.url)
            sweeper.expired()  # warm: connection and plan
            rows0, cpu0, lat = examined(server.url), probe.cpu(), []
            for _ in range(LISTINGS):
                t0 = time.perf_counter()
                found = sweeper.expired()
                lat.append(time.perf_counter() - t0)
                assert not found, f"{len(found)} finished calls listed as lapsed"
            cpu = probe.cpu() - cpu0
            sweeper.close()  # flushes its session's counters
            time.sleep(0.7)
            rows.append({"finished": n, "expired_ms_p50": statistics.median(lat) * 1e3,
                         "server_cpu_ms_per_listing": cpu / LISTINGS * 1e3,
                         "rows_examined_per_listing": (examined(server.url) - rows0) / LISTINGS})
        store.close()
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "sweep_finished", "500 and 2,000 finished")
    ap.add_argument("--sizes", default="1000,10000,30000", help="finished calls (default %(default)s)")
    args = ap.parse_args(argv)
    sizes = [500, 2000] if args.quick else [int(s) for s in args.sizes.split(",") if s]
    rows = run(sizes)
    text = table(["finished calls kept", "expired() p50 ms", "server CPU ms / listing", "aaa_calls rows examined / listing"],
                 [[r["finished"], r["expired_ms_p50"], r["server_cpu_ms_per_listing"], r["rows_examined_per_listing"]]
                  for r in rows],
                 "The sweep's listing of lapsed calls with N finished calls kept (PostgreSQL, durable)")
    print()
    print(text)
    path = write_json(args.out, {"config": vars(args), "rows": rows, "table": text})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
