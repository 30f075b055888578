"""A store round trip's latency after the caller sat idle: why a guarded call with a body
that sleeps costs more than the trivial-body figures predict.

Times one round trip (Redis ``PING``; PostgreSQL ``SELECT 1`` on an autocommit connection, and
a durable one-row ``INSERT``: a commit that waits for its WAL flush) right after sleeping 0, 1
and 10 ms, as a worker's pool child does around a tool body. On this project's 2-core VM a
round trip after 10 ms asleep took ~7× one made back to back: the guest's idle CPUs are
halted, and waking them (the caller's and the server's) is part of every round trip that
follows an idle spell. A guarded call adds two round trips on Redis (``begin``, ``finish``),
so with a 10 ms body each pays that wake-up; the count of round trips, not their CPU, is what
a realistic body's ratio depends on.

    python benchmarks/idle_latency.py
    python benchmarks/idle_latency.py --quick
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import DurablePostgres, libpq_url, parser, pct, redis_server, table, write_json  # noqa: E402

GAPS_MS = (0.0, 1.0, 10.0)


def latencies(trip: Callable[[], Any], gap_ms: float, n: int) -> list[float]:
    """Microseconds of ``n`` round trips, each after sleeping ``gap_ms``."""
    out = []
    for _ in range(n):
        if gap_ms:
            time.sleep(gap_ms / 1000)
        t0 = time.perf_counter()
        trip()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def main() -> int:
    ap = parser(__doc__, "idle_latency", "100 round trips per gap")
    ap.add_argument("--trips", type=int, default=400, help="round trips per gap (default %(default)s)")
    args = ap.parse_args()
    n = 100 if args.quick else args.trips
    import psycopg
    import redis

    rows: list[list[Any]] = []
    data: dict[str, Any] = {}
    with ExitStack() as stack:
        srv = stack.enter_context(redis_server(appendonly=False))
        pg = DurablePostgres.start()
        stack.callback(pg.stop)
        r = redis.Redis.from_url(srv.url)
        con = psycopg.connect(libpq_url(pg.url), autocommit=True)
        stack.callback(con.close)
        con.execute("CREATE TABLE t (n bigint)")
        trips: dict[str, Callable[[], Any]] = {
            "Redis PING": r.ping,
            "PostgreSQL SELECT 1": lambda: con.execute("SELECT 1", prepare=True).fetchone(),
            "PostgreSQL durable INSERT": lambda: con.execute("INSERT INTO t VALUES (1)", prepare=True),
        }
        for name, trip in trips.items():
            latencies(trip, 0, 50)  # warm
            for gap in GAPS_MS:
                lat = latencies(trip, gap, n)
                p50, p90 = pct(lat, 50), pct(lat, 90)
                data.setdefault(name, {})[f"{gap:g}ms"] = {"p50_us": p50, "p90_us": p90}
                rows.append([name, f"{gap:g} ms", f"{p50:.0f}", f"{p90:.0f}"])
    print(table(["round trip", "idle before", "p50 µs", "p90 µs"], rows,
                f"one round trip after sleeping, {n} each"))
    print(f"wrote {write_json(args.out, {'trips': n, 'latency': data})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
