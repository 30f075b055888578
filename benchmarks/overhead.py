"""Overhead: the guard's cost next to the same trivial task in plain Celery.

Variants, each N trivial calls (``return i``) through one real ``celery worker``:

  A  plain     ``@app.task(acks_late=True)``
  B  guarded   ``@app.task(base=GuardedTask)``  (acks_late + reject_on_worker_lost)
  C  tool      a ``@tool`` bound with ``ToolHandler.bind``

Method, per variant and round (interleaved, for each pool: every round runs each variant once,
in an order drawn from ``--seed``, so no variant always follows another; the seed is fresh
unless given, and printed and kept in the JSON to repeat a run):

1. publish N messages to a staging list the worker does not consume (timed: the
   publish rate, which for B and C includes the store ``register`` of each call);
2. ``RENAME`` the staging list onto the worker's queue, and time the drain: from the
   first message taken to the N-th result stored (results go to a Redis db of their
   own, counted with ``DBSIZE``);
3. over the drain, read the worker's CPU (``/proc/<pid>/stat`` utime+stime of the main
   process and its pool children), ``INFO commandstats`` of broker and store, and the
   store server's own CPU (``INFO cpu``): on a machine whose cores are all busy, the
   guard's cost is the worker's added CPU plus the store server's.

The store is a second ``redis-server``, so its commands are the guard's alone. With
``--store redis-shared`` it is the broker's server instead (the library's default when
``aaa_store_url`` is not set), which is also the result backend's (another database): the
store's ``finish`` then writes Celery's result in its own script. That server keeps an
append-only file, as a store needs, for plain and guarded alike. Its columns count that
server's scripts only, and its CPU is the whole server's (broker, backend and store). With
``--store postgresql`` it is a throwaway PostgreSQL with the server's default durability
(``fsync`` on); its columns then count server transactions (``pg_stat_database``: each
autocommitted statement is one) instead of Redis commands, and its CPU is that of the
server's processes.

Each run ends with one table of the added cost per call, per store and pool: the ratios to
plain end to end (a round's publish and drain one after the other: its N calls from the first
publish to the last result, the producer's ``register`` included), of the drain alone and of
the publish alone; the worker's added CPU, the store server's added CPU, and the store round
trips (worker + publish). ``--pooled`` pools saved runs: the median over them of each run's
median ratios.

    python benchmarks/overhead.py                    # Redis (both topologies) then PostgreSQL: 5000 calls, 3 rounds, both pools
    python benchmarks/overhead.py --quick            # < 60 s smoke run, both stores and pools
    python benchmarks/overhead.py --body-ms 100 --calls 400   # a 100 ms (sleeping) body, the same way
    python benchmarks/overhead.py --store memory://  # diagnostic: the guard without store round trips
    python benchmarks/overhead.py --stores redis --store-replicas 1   # each write of a call waits for a replica (WAIT)
    python benchmarks/overhead.py --store postgresql # one store only: a durable PostgreSQL
    python benchmarks/overhead.py --stores redis,redis-shared   # both Redis topologies
    python benchmarks/overhead.py --store postgresql --results postgresql   # Celery's results in the store's database
    python benchmarks/overhead.py --store postgresql --results django-db    # django-celery-results there
    python benchmarks/overhead.py --pooled benchmarks/results/overhead_ab*_03c27cd_run*_*.json
"""

from __future__ import annotations

import argparse
import inspect
import math
import re
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (  # noqa: E402
    parser,
    DurablePostgres,
    RedisServer,
    Worker,
    commandstats,
    cpu_seconds,
    libpq_url,
    delta,
    redis_server,
    server_cpu,
    spread,
    table,
    wait_until,
    write_json,
)
from aaa_celery.stores.redis import RedisStore  # noqa: E402

VARIANTS = {"plain": "bench.plain", "guarded": "bench.guarded", "tool": "aaa.tool.noop"}
POOLS = {"prefork": ("prefork", 2), "threads": ("threads", 8)}
QUEUE, STAGING = "bench", "bench.staging"

#: Commands the store's Lua scripts run: INFO commandstats counts them too, but they travel
#: inside one EVALSHA round trip. TIME is also the recovery sweep's clock read (1 per sweep).
LUA_DIR = Path(__file__).resolve().parent.parent / "aaa_celery" / "stores" / "redis" / "lua"
IN_SCRIPT = {m.lower() for f in LUA_DIR.glob("*.lua")
             for m in re.findall(r"redis\.call\(['\"]([A-Za-z]+)['\"]", f.read_text())}
assert IN_SCRIPT, f"no redis.call in {LUA_DIR}/*.lua: round trips would count every command a script runs"
#: This benchmark's own reads; WAIT, which the store sends after a script in the script's own
#: round trip, and the replica's REPLCONF (``--store-replicas``).
NOT_COUNTED = {"info", "wait", "replconf"}
#: The recovery sweep reads each shard's two indexes with ZRANGEBYSCORE, all in one pipeline:
#: one round trip (and one sweep) per 2 x shards of them. The bench app keeps the default.
SWEEP_READS = 2 * inspect.signature(RedisStore).parameters["shards"].default


SCRIPT_CALLS = ("evalsha", "eval", "script|load")


def round_trips(stats: dict[str, int], scripts_only: bool = False) -> int:
    """Client round trips to the store: scripts, plus commands that never run in a script
    (not those on a server the store shares with the broker: they are the broker's)."""
    return sum(math.ceil(n / SWEEP_READS) if cmd == "zrangebyscore" else n for cmd, n in stats.items()
               if cmd in SCRIPT_CALLS or (not scripts_only and cmd not in IN_SCRIPT and cmd not in NOT_COUNTED))


class PostgresStats:
    """A PostgreSQL store server read like the Redis one (``info``): its processes' CPU, and
    its transactions so far as the one "command"."""

    def __init__(self, server: DurablePostgres) -> None:
        self.server = server

    def info(self, section: str) -> dict[str, Any]:
        import psycopg

        if section == "cpu":
            pid = self.server.pid()
            return {"used_cpu_user": cpu_seconds(pid) if pid else 0.0, "used_cpu_sys": 0.0}
        with psycopg.connect(libpq_url(self.server.url), autocommit=True) as con:
            con.execute("SELECT pg_stat_force_next_flush()")
            xacts = con.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database"
                                " WHERE datname = current_database()").fetchone()[0]
        return {"cmdstat_xact": {"calls": int(xacts) - 1}}  # less this read's own


class PostgresResults:
    """A SQL result backend's results, counted and cleared as the Redis results database is
    (``dbsize``, ``flushdb``): the rows of its table (Celery's database backend's
    ``celery_taskmeta``, or django-celery-results' ``django_celery_results_taskresult``)."""

    def __init__(self, url: str, table: str = "celery_taskmeta") -> None:
        import psycopg

        self.con = psycopg.connect(libpq_url(url), autocommit=True)
        self.table = table

    def _table(self) -> bool:
        return bool(self.con.execute("SELECT to_regclass(%s) IS NOT NULL", (self.table,)).fetchone()[0])

    def dbsize(self) -> int:
        return int(self.con.execute(f"SELECT count(*) FROM {self.table}").fetchone()[0]) if self._table() else 0

    def flushdb(self) -> None:
        if self._table():
            self.con.execute(f"TRUNCATE {self.table}")


def migrate_django_results(url: str) -> None:
    """Create django-celery-results' tables on the database ``url`` (``manage.py migrate``)."""
    env = {**os.environ, "BENCH_DJANGO_DB": url, "DJANGO_SETTINGS_MODULE": "benchmarks.django_settings"}
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], env=env, check=True, timeout=120)


def publish(app: Any, variant: str, n: int, tag: str) -> float:
    """Send N calls of ``variant`` to the staging list; returns seconds taken."""
    task = app.tasks[VARIANTS[variant]]
    t0 = time.perf_counter()
    for i in range(n):
        if variant == "tool":
            task.apply_async(kwargs={"arguments": {"i": i}}, queue=STAGING, task_id=f"{tag}-{i}")
        else:
            task.apply_async((i,), queue=STAGING, task_id=f"{tag}-{i}")
    return time.perf_counter() - t0


def one_round(app: Any, worker: Worker, variant: str, n: int, tag: str, broker: Any, results: Any,
              store: Any, timeout_s: float, shared: bool = False) -> dict[str, Any]:
    results.flushdb()
    store_before_publish = commandstats(store)
    publish_s = publish(app, variant, n, tag)
    assert wait_until(lambda: broker.llen(STAGING) == n, 10), "staging list incomplete"
    store_after_publish = commandstats(store)
    broker_before, store_before, cpu_before = commandstats(broker), commandstats(store), worker.cpu()
    store_cpu_before = server_cpu(store)
    broker.rename(STAGING, QUEUE)
    wait_until(lambda: broker.llen(QUEUE) < n, 10, 0.001)
    t0 = time.perf_counter()
    done = wait_until(lambda: results.dbsize() >= n, timeout_s, 0.005)
    drain_s = time.perf_counter() - t0
    if not done:
        raise RuntimeError(f"{variant}: only {results.dbsize()} of {n} results after {timeout_s} s; "
                           f"see the worker log {worker.log}")
    cpu = worker.cpu() - cpu_before
    store_cpu = server_cpu(store) - store_cpu_before
    store_drain = delta(commandstats(store), store_before)
    broker_drain = delta(commandstats(broker), broker_before)
    store_publish = delta(store_after_publish, store_before_publish)
    return {
        "variant": variant,
        "per_s": n / drain_s,
        "drain_s": drain_s,
        "publish_per_s": n / publish_s,
        "worker_cpu_ms_per_call": cpu / n * 1e3,
        "store_server_cpu_ms_per_call": store_cpu / n * 1e3,
        "store_cmds_per_call_drain": round_trips(store_drain, shared) / n,
        "store_cmds_per_call_publish": round_trips(store_publish, shared) / n,
        "store_redis_commands_per_call_drain": sum(v for k, v in store_drain.items() if k not in NOT_COUNTED) / n,
        "recovery_sweeps_during_drain": store_drain.get("zrangebyscore", 0) / SWEEP_READS,
        "store_drain": store_drain,
        "store_publish": store_publish,
        "broker_cmds_per_call": sum(broker_drain.values()) / n,
    }


def run_pool(pool: str, args: argparse.Namespace, env: dict[str, str], logdir: Path,
             store_stats: PostgresStats | None = None) -> list[dict[str, Any]]:
    import redis

    from benchmarks import bench_app

    kind, conc = POOLS[pool]
    app = bench_app.app
    broker = redis.Redis.from_url(env["BENCH_BROKER"])
    backend = env["BENCH_BACKEND"]
    if backend == "django-db":
        results: Any = PostgresResults(env["BENCH_STORE"], "django_celery_results_taskresult")
    else:
        results = PostgresResults(backend[3:]) if backend.startswith("db+") else redis.Redis.from_url(backend)
    store = store_stats or redis.Redis.from_url(env["BENCH_STORE_SERVER"])
    shared = env["BENCH_STORE_SERVER"] == env["BENCH_BROKER"]
    with ExitStack() as stack:
        worker = Worker(env, kind, conc, queues=QUEUE, name=pool, log=logdir / f"worker-{pool}.log")
        stack.callback(worker.stop)
        # Warm up: the worker is consuming once a call round-trips; fills import caches.
        for variant in VARIANTS:
            one_round(app, worker, variant, min(200, args.calls), f"warm-{pool}-{variant}",
                      broker, results, store, 60, shared)
        rows = []
        order = random.Random(f"{args.seed}-{pool}")
        for r in range(args.rounds):
            for variant in order.sample(args.variants, len(args.variants)):
                row = one_round(app, worker, variant, args.calls, f"{pool}-{r}-{variant}", broker, results,
                                store, args.timeout, shared)
                row.update(pool=pool, round=r)
                print(f"  {pool:8} round {r} {variant:8} {row['per_s']:7.0f} calls/s  "
                      f"worker CPU {row['worker_cpu_ms_per_call']:.3f} ms/call  "
                      f"store server CPU {row['store_server_cpu_ms_per_call']:.3f} ms/call  "
                      f"store cmds/call {row['store_cmds_per_call_drain']:.2f} (+{row['store_cmds_per_call_publish']:.2f} at publish)",
                      flush=True)
                rows.append(row)
        return rows


def end_to_end_s(row: dict[str, Any]) -> float:
    """A round's publish and drain, one after the other: the seconds its N calls took from the
    first publish to the last result (from ``per_s``, ``drain_s`` and ``publish_per_s``, which
    every row has, so older JSON gives it too)."""
    return row["per_s"] * row["drain_s"] / row["publish_per_s"] + row["drain_s"]


def ratios(rows: list[dict[str, Any]], plain: dict[int, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per round, this variant ÷ plain's round: end to end (publish then drain), drain and
    publish; each as its spread over the rounds."""
    paired = [(r, plain[r["round"]]) for r in rows if r["round"] in plain]
    return {
        "end_to_end": spread([end_to_end_s(p) / end_to_end_s(r) for r, p in paired]),
        "drain": spread([r["per_s"] / p["per_s"] for r, p in paired]),
        "publish": spread([r["publish_per_s"] / p["publish_per_s"] for r, p in paired]),
    }


def summarize(rows: list[dict[str, Any]], pools: list[str], variants: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pool in pools:
        by = {v: [r for r in rows if r["pool"] == pool and r["variant"] == v] for v in variants}
        plain = {r["round"]: r for r in by.get("plain", [])}
        s: dict[str, Any] = {}
        for v in variants:
            rs = by[v]
            s[v] = {
                "per_s": spread([r["per_s"] for r in rs]),
                "publish_per_s": statistics.median(r["publish_per_s"] for r in rs),
                "worker_cpu_ms_per_call": statistics.median(r["worker_cpu_ms_per_call"] for r in rs),
                "store_server_cpu_ms_per_call": statistics.median(r["store_server_cpu_ms_per_call"] for r in rs),
                "store_cmds_per_call_drain": statistics.median(r["store_cmds_per_call_drain"] for r in rs),
                "store_cmds_per_call_publish": statistics.median(r["store_cmds_per_call_publish"] for r in rs),
                "broker_cmds_per_call": statistics.median(r["broker_cmds_per_call"] for r in rs),
                "store_commands_last_round": rs[-1]["store_drain"],
            }
            if v != "plain" and plain:
                paired = ratios(rs, plain)
                s[v]["ratio_to_plain"] = paired["drain"]
                s[v]["end_to_end_ratio_to_plain"] = paired["end_to_end"]
                s[v]["publish_ratio_to_plain"] = paired["publish"]
                s[v]["added_cpu_ms_per_call"] = (s[v]["worker_cpu_ms_per_call"]
                                                 - s["plain"]["worker_cpu_ms_per_call"])
        out[pool] = s
    return out


def report(summary: dict[str, Any]) -> str:
    rows = []
    for pool, s in summary.items():
        for v, x in s.items():
            ratio = x.get("ratio_to_plain")
            rows.append([
                pool, v, x["per_s"]["median"], f"{x['per_s']['min']:.0f}–{x['per_s']['max']:.0f}",
                f"{ratio['min']:.2f} / {ratio['median']:.2f} / {ratio['max']:.2f}" if ratio else "1",
                x["store_cmds_per_call_drain"], x["store_cmds_per_call_publish"],
                x["worker_cpu_ms_per_call"], x.get("added_cpu_ms_per_call", 0.0),
                x["store_server_cpu_ms_per_call"], x["publish_per_s"],
            ])
    return table(["pool", "variant", "calls/s (median)", "calls/s min–max", "÷ plain min / median / max",
                  "store round trips / call (worker)", "store round trips / call (publish)",
                  "worker CPU ms / call", "added CPU ms / call", "store server CPU ms / call",
                  "publish calls/s"], rows,
                 "Guard overhead: trivial calls drained by one worker")


def added_cost(store: str, summary: dict[str, Any]) -> list[list[Any]]:
    """Rows of the added-cost table: per pool and guarded variant, what a call costs more
    than the same plain call (the plain round's worker CPU and store server CPU subtracted)."""
    rows = []
    for pool, s in summary.items():
        plain = s.get("plain")
        for v, x in s.items():
            if v == "plain" or plain is None:
                continue
            rows.append([
                store, pool, v, _spread_text(x.get("end_to_end_ratio_to_plain")),
                _spread_text(x.get("ratio_to_plain")), _spread_text(x.get("publish_ratio_to_plain")),
                x["worker_cpu_ms_per_call"] - plain["worker_cpu_ms_per_call"],
                x["store_server_cpu_ms_per_call"] - plain["store_server_cpu_ms_per_call"],
                x["store_cmds_per_call_drain"], x["store_cmds_per_call_publish"],
                x["store_cmds_per_call_drain"] + x["store_cmds_per_call_publish"],
            ])
    return rows


def _spread_text(ratio: dict[str, float] | None) -> str:
    if not ratio:
        return "–"
    return f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})"


def pooled(paths: list[str]) -> str:
    """The runs of ``paths`` (the JSON of one store each, ``overhead_..._<store>.json``) pooled:
    per store, pool and variant, the median over the runs of each run's median ratio to plain,
    end to end, drain and publish, with the runs' min–max."""
    import json

    by: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for path in paths:
        found = re.search(r"_(redis-shared|redis|postgresql)\.json$", path)
        if found is None:
            raise SystemExit(f"--pooled: {path} is not one store's JSON (overhead_..._<store>.json)")
        rows = json.loads(Path(path).read_text())["rows"]
        variants = sorted({r["variant"] for r in rows}, key=lambda v: v != "plain")  # plain first, as summarize needs
        summary = summarize(rows, sorted({r["pool"] for r in rows}), variants)
        for pool, s in summary.items():
            for v, x in s.items():
                if v != "plain":
                    by.setdefault((found.group(1), pool, v), []).append(x)
    out = []
    for (store, pool, v), runs in sorted(by.items()):
        cells = [spread([run[k]["median"] for run in runs])
                 for k in ("end_to_end_ratio_to_plain", "ratio_to_plain", "publish_ratio_to_plain")]
        out.append([store, pool, v, len(runs), *(_spread_text(c) for c in cells)])
    return table(["store", "pool", "variant", "runs", "end to end ÷ plain, median of runs (min–max)",
                  "drain ÷ plain", "publish ÷ plain"], out,
                 "Pooled runs: each run's median ratio per round, then the median over runs")


def cost_table(rows: list[list[Any]], body_ms: float) -> str:
    body = f"a {body_ms:g} ms sleeping body" if body_ms else "a trivial body"
    return table(["store", "pool", "variant", "end to end ÷ plain, median (min–max)", "drain ÷ plain",
                  "publish ÷ plain", "added worker CPU ms / call",
                  "added store server CPU ms / call", "store round trips / call: worker",
                  "… at publish", "… total"], rows,
                 f"Added cost per call, {body} (round trips: Redis scripts and commands; "
                 "PostgreSQL: server transactions)")


QUICK = "200 calls (40 with --body-ms 100), 1 round, both pools, Redis (both topologies) and PostgreSQL"
#: --stores names: the store URL each passes to a run of its own.
STORES = {"redis": "", "redis-shared": "redis-shared", "postgresql": "postgresql"}


def replica_of(replica: RedisServer, primary: RedisServer) -> None:
    """Make ``replica`` replicate ``primary``, and wait until it has synced."""
    import redis

    client = redis.Redis.from_url(replica.url)
    port = int(primary.url.rsplit(":", 1)[1].split("/")[0])
    client.replicaof("127.0.0.1", port)
    if not wait_until(lambda: client.info("replication").get("master_link_status") == "up", 30, 0.1):
        raise SystemExit(f"the store's replica {replica.url} did not sync with {primary.url}")
    client.close()


def run_stores(args: argparse.Namespace) -> int:
    """One run per store, each in a process of its own (the publisher's app reads its store
    from the environment once), then one table of them all."""
    import json

    from benchmarks._common import RESULTS

    kinds = [k for k in args.stores.split(",") if k]
    unknown = [k for k in kinds if k not in STORES]
    if unknown:
        raise SystemExit(f"--stores: unknown {unknown}; choose from {sorted(STORES)} (or pass --store URL)")
    parts, costs = {}, []
    for kind in kinds:
        out = f"{args.out}_{kind}"
        child = [sys.executable, str(Path(__file__).resolve()), "--store", STORES[kind] or "redis",
                 "--calls", str(args.calls), "--rounds", str(args.rounds), "--pools", args.pools,
                 "--variants", ",".join(args.variants), "--timeout", str(args.timeout),
                 "--body-ms", str(args.body_ms), "--seed", str(args.seed), "--out", out,
                 "--results", args.results, "--store-replicas", str(args.store_replicas)]
        print(f"== {kind}: {' '.join(child[1:])}", flush=True)
        subprocess.run(child, check=True)
        parts[kind] = json.loads((RESULTS / f"{out}.json").read_text())
        costs += added_cost(kind, parts[kind]["summary"])
    text = cost_table(costs, args.body_ms)
    print()
    for kind, part in parts.items():
        print(f"-- {kind}\n{part['table']}\n")
    print(text)
    path = write_json(args.out, {"config": vars(args), "table": text,
                                 "stores": {k: {"file": f"{args.out}_{k}.json", "summary": p["summary"]}
                                            for k, p in parts.items()}})
    print(f"\nwrote {path} (and one file per store beside it)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "overhead", QUICK)
    ap.add_argument("--calls", type=int, default=5000, help="calls per variant per round (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--pools", default="prefork,threads", help="prefork (-c 2), threads (-c 8)")
    ap.add_argument("--variants", default="plain,guarded,tool", help="default %(default)s")
    ap.add_argument("--timeout", type=float, default=300, help="max seconds per drain (default %(default)s)")
    ap.add_argument("--stores", default="redis,redis-shared,postgresql",
                    help="stores measured one after the other, then one added-cost table "
                         "(default %(default)s): redis is a second redis-server, redis-shared the broker's "
                         "and result backend's server, postgresql a durable PostgreSQL")
    ap.add_argument("--store", default="", help="one store only: redis, redis-shared (on the broker's "
                    "and result backend's server, the default topology), postgresql, or a store URL; "
                    "memory:// (one store per process, no fleet-wide guarantee) shows what the guard costs "
                    "without its store round trips")
    ap.add_argument("--body-ms", type=float, default=0.0,
                    help="every variant's body sleeps this long (a tool waiting on I/O: try 10 and 100); "
                         "default 0, a trivial body")
    ap.add_argument("--results", default="redis", choices=("redis", "postgresql", "django-db"),
                    help="Celery's result backend: redis (a database of the broker's server, the default), "
                         "django-db (django-celery-results on the store's database) or, "
                         "with --store postgresql, postgresql: Celery's database backend on the store's database")
    ap.add_argument("--store-replicas", type=int, default=0,
                    help="the Redis store's replicas option: a replica of the store's server is started, and "
                         "each write of a call waits until that many replicas have it (default 0)")
    ap.add_argument("--seed", type=int, default=None,
                    help="the rounds' variant order (default: a fresh one, printed and kept in the JSON)")
    ap.add_argument("--pooled", nargs="+", metavar="JSON",
                    help="run nothing: pool saved runs (one store's JSON each, overhead_..._<store>.json) and "
                         "print the median over them of each run's ratios to plain, end to end, drain and publish")
    args = ap.parse_args(argv)
    if args.pooled:
        print(pooled(args.pooled))
        return 0
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
        print(f"seed {args.seed} (--seed {args.seed} repeats this order)", flush=True)
    if args.quick:
        args.calls, args.rounds = (40 if args.body_ms >= 50 else 200), 1
    args.variants = args.variants.split(",")
    if not args.store:
        return run_stores(args)
    if args.store == "redis":
        args.store = ""
    pools = args.pools.split(",")
    logdir = Path(tempfile.mkdtemp(prefix="aaa-bench-overhead-"))
    rows = []
    shared = args.store == "redis-shared"
    kind = args.store if args.store in ("postgresql", "redis-shared") else (args.store.partition(":")[0] or "redis")
    with ExitStack() as stack:
        # shared: one server with the store's durability (an append-only file), as a store needs
        broker_srv = stack.enter_context(redis_server() if shared else redis_server(appendonly=False))
        store_srv = stack.enter_context(redis_server())
        store_stats = None
        if args.store == "postgresql":
            pg = DurablePostgres.start()
            stack.callback(pg.stop)
            store_stats, args.store = PostgresStats(pg), pg.url
        if shared:
            args.store, store_srv = broker_srv.url, broker_srv
        if args.store_replicas:
            if store_stats is not None:
                raise SystemExit("--store-replicas: for a Redis store")
            for _ in range(args.store_replicas):
                replica_of(stack.enter_context(redis_server()), store_srv)
        if args.results != "redis" and store_stats is None:
            raise SystemExit(f"--results {args.results}: with --store postgresql (results on its database)")
        backend = {"postgresql": f"db+{args.store}", "django-db": "django-db"}.get(args.results,
                                                                                  broker_srv.url[:-1] + "1")
        if args.results == "django-db":
            migrate_django_results(libpq_url(args.store))
        django_db = {"BENCH_DJANGO_DB": libpq_url(args.store)} if args.results == "django-db" else {}
        env = {**django_db, "BENCH_BROKER": broker_srv.url, "BENCH_BACKEND": backend,
               "BENCH_STORE": args.store or store_srv.url, "BENCH_STORE_SERVER": store_srv.url,
               "BENCH_QUEUE": QUEUE, "BENCH_BODY_MS": str(args.body_ms),
               "BENCH_STORE_REPLICAS": str(args.store_replicas)}
        os.environ.update(env)  # before bench_app is imported: it reads them
        for pool in pools:
            rows += run_pool(pool, args, env, logdir, store_stats)
    summary = summarize(rows, pools, args.variants)
    text = report(summary) + "\n\n" + cost_table(added_cost(kind, summary), args.body_ms)
    print()
    print(text)
    path = write_json(args.out, {"config": {**vars(args), "pools": {p: POOLS[p] for p in pools}},
                                 "rows": rows, "summary": summary, "table": text, "worker_logs": str(logdir)})
    print(f"\nwrote {path}; worker logs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
