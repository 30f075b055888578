"""Client CPU per store operation on a durable PostgreSQL, in this process (no worker).

Runs N × (``register``, ``begin``, ``finish``) against ``PostgresStore`` on a throwaway
PostgreSQL with the server's default durability, and prints each operation's client CPU
(``time.process_time``: it holds under load, wall time does not), the server transactions
per call (``pg_stat_database``) and the server's CPU per call; ``--profile`` adds a cProfile
on CPU time.

    python benchmarks/store_ops_cpu.py 500
    python benchmarks/store_ops_cpu.py 300 --profile
"""
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import DurablePostgres  # noqa: E402
from benchmarks.overhead import PostgresStats  # noqa: E402
from aaa_celery.stores.sql.postgres import PostgresStore  # noqa: E402
from aaa_celery.lifecycle import CallSpec, Outcome  # noqa: E402
from aaa_celery.config import GuardConfig  # noqa: E402

def run(store, n, tag, cfg):
    specs = [CallSpec(f"{tag}-{i}", "bench.guarded", f"k{tag}{i}", {"task": "bench.guarded", "args": [i], "kwargs": {}, "queue": "bench"}) for i in range(n)]
    t = {"register": 0.0, "begin": 0.0, "finish": 0.0}
    for s in specs:
        c0 = time.process_time(); store.register(s); c1 = time.process_time()
        r = store.begin(s, "w@x", cfg); c2 = time.process_time()
        store.finish(r.lease, Outcome.success(1, r.lease.attempt), cfg); c3 = time.process_time()
        t["register"] += c1 - c0; t["begin"] += c2 - c1; t["finish"] += c3 - c2
    return {k: v / n * 1e6 for k, v in t.items()}

pg = DurablePostgres.start()
try:
    store = PostgresStore(pg.url)
    stats = PostgresStats(pg)
    cfg = GuardConfig()
    run(store, 100, "warm", cfg)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    x0 = stats.info("x")["cmdstat_xact"]["calls"]; s0 = stats.info("cpu")["used_cpu_user"]
    r = run(store, n, "m", cfg)
    x1 = stats.info("x")["cmdstat_xact"]["calls"]; s1 = stats.info("cpu")["used_cpu_user"]
    print("client CPU µs/op", {k: round(v) for k, v in r.items()}, f"xacts/call {(x1-x0)/n:.2f} server CPU µs/call {(s1-s0)/n*1e6:.0f}")
    if "--profile" in sys.argv:
        prof = cProfile.Profile(time.process_time); prof.enable(); run(store, n, "p", cfg); prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(40)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(60)
    store.close()
finally:
    pg.stop()
