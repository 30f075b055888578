"""Scale: hold N concurrently leased calls in a store; does a call's cost stay flat?

For each size N (no Celery, the store alone, one client process):

1. fill: ``begin`` N calls and keep every lease (the calls are "running");
2. with the N held: ``begin`` a probe of K new calls, ``renew`` K held leases,
   time the recovery sweep's ``expired()``, then ``finish`` the K probe calls;
3. drain: ``finish`` the N held calls.

Reported: p50/p99 latency of ``begin`` / ``renew`` / ``finish`` at N held, memory
per leased call (Redis ``used_memory`` delta; PostgreSQL: PSS of the server's
processes), and the heartbeat cost per running call per second (one ``renew``
every ``heartbeat_s``; the server CPU is measured over the renewals).

PostgreSQL holds each lease as a session advisory lock on the store's one lease
session, so N leases need one server backend but N slots of the server's lock table
(``max_locks_per_transaction`` × ``max_connections``): sizes above that are reported
as not feasible, with the reason, instead of being run. The PostgreSQL server keeps
its default durability (``fsync`` on: each commit waits for its WAL flush).

    python benchmarks/scale.py                 # Redis 1k/10k/100k, PostgreSQL 100 to 100k
    python benchmarks/scale.py --quick         # < 30 s: Redis 1k, PostgreSQL 100
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (  # noqa: E402
    parser,
    DurablePostgres,
    PostgresServer,
    children,
    libpq_url,
    pct,
    table,
    write_json,
)

from aaa_celery.config import GuardConfig  # noqa: E402
from aaa_celery.lifecycle import CallSpec, Outcome  # noqa: E402
from aaa_celery.stores.base import Store  # noqa: E402

#: Leases must outlive the whole measurement; heartbeats are costed at the default period.
SCALE_CONFIG = GuardConfig(lease_ttl_s=3600)
DEFAULT_HEARTBEAT_S = GuardConfig().heartbeat_period_s


def spec(i: int, run: str) -> CallSpec:
    """A call like ``GuardedTask.call_spec`` makes for a small task."""
    call_id = f"{run}-{i:07d}"
    request = {"task": "bench.noop", "args": [i], "kwargs": {}, "queue": "celery", "headers": {}}
    return CallSpec(call_id, "bench.noop", f"{call_id}/{call_id}", request)


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def lat(samples: list[float]) -> dict[str, float]:
    """p50 / p99 in milliseconds."""
    return {"p50_ms": pct(samples, 50) * 1e3, "p99_ms": pct(samples, 99) * 1e3, "n": len(samples)}


class RedisProbe:
    """Server-side memory and CPU of a Redis store."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)

    def memory(self) -> float:
        return float(self.client.info("memory")["used_memory"])

    def cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def script_us(self) -> float:
        """Microseconds Redis spent inside scripts (``INFO commandstats``), excluding network I/O."""
        stats = self.client.info("commandstats")
        return float(sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "eval")))

    def commands(self) -> dict[str, tuple[int, int]]:
        """``INFO commandstats``: (calls, usec) per command so far. A script's own commands are
        counted inside its ``evalsha`` time too."""
        return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
                for k, v in self.client.info("commandstats").items()}

    def reset(self) -> None:
        self.client.flushdb()

    def analyze(self) -> None:
        """Nothing to do: Redis keeps no planner statistics."""

    def seq_scans(self) -> float:
        return float("nan")


class PostgresProbe:
    """Server-side memory (PSS of every server process) and CPU of a PostgreSQL store."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server

    def _pids(self) -> list[int]:
        root = self.server.pid()
        return [root, *children(root)] if root else []

    def memory(self) -> float:
        total = 0
        for pid in self._pids():
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                pass
        return float(total)

    def cpu(self) -> float:
        from benchmarks._common import cpu_seconds

        root = self.server.pid()
        return cpu_seconds(root) if root else 0.0

    def script_us(self) -> float:
        return float("nan")

    def commands(self) -> dict[str, tuple[int, int]]:
        return {}

    def reset(self) -> None:
        import psycopg

        with psycopg.connect(libpq_url(self.server.url), autocommit=True) as con:
            con.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            con.execute("TRUNCATE aaa_calls, aaa_results, aaa_events")
            con.execute("VACUUM ANALYZE")

    def analyze(self) -> None:
        """``ANALYZE``, as autovacuum would after a fill: statistics taken of the empty tables
        would have the planner read calls by sequential scans."""
        import psycopg

        with psycopg.connect(libpq_url(self.server.url), autocommit=True) as con:
            con.execute("ANALYZE")

    def seq_scans(self) -> float:
        """Sequential scans of ``aaa_calls`` so far (flushed by backends at most once a second)."""
        import psycopg

        with psycopg.connect(libpq_url(self.server.url), autocommit=True) as con:
            return float(con.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'aaa_calls'")
                         .fetchone()[0])


def server_cost(probe: Any, ops: int, cpu0: float, cmds0: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """What the store server spent on ``ops`` operations since ``cpu0`` / ``cmds0``: its CPU
    (µs per op, from ``INFO cpu`` or /proc), and per command the calls and the µs per call
    (``INFO commandstats``): figures that hold on a loaded machine, unlike wall-clock latency."""
    cpu = probe.cpu() - cpu0
    per_cmd = {}
    for cmd, (calls, usec) in probe.commands().items():
        c0, u0 = cmds0.get(cmd, (0, 0))
        if calls > c0 and cmd != "info":
            per_cmd[cmd] = {"calls_per_op": (calls - c0) / ops, "usec_per_call": (usec - u0) / (calls - c0)}
    return {"cpu_us_per_op": cpu / ops * 1e6, "commands": per_cmd}


def measure(store: Store, probe: Any, n: int, k: int, label: str) -> dict[str, Any]:
    """One size: fill N leases, probe K operations with N held, drain."""
    probe.reset()
    worker = f"bench/{label}"
    run = f"{label}{n}"
    ok = Outcome.success(None)
    mem0 = probe.memory()

    t0 = time.perf_counter()
    fill_lat, leases = [], []
    for i in range(n):
        result, dt = timed(store.begin, spec(i, run), worker, SCALE_CONFIG)
        fill_lat.append(dt)
        leases.append(result.lease)
    fill_s = time.perf_counter() - t0
    probe.analyze()
    time.sleep(0.2)
    mem1 = probe.memory()

    # With N held: K new begins, K renewals of held leases, the recovery query, K finishes.
    begin_lat, probe_leases = [], []
    cpu0, cmds0 = probe.cpu(), probe.commands()
    for i in range(k):
        result, dt = timed(store.begin, spec(i, f"{run}p"), worker, SCALE_CONFIG)
        begin_lat.append(dt)
        probe_leases.append(result.lease)
    begin_server = server_cost(probe, k, cpu0, cmds0)
    # The worker's path: a call sent with apply_async was registered at publish, so its
    # first begin finds the row as planned (on PostgreSQL, one call of aaa_begin_planned).
    registered = [spec(i, f"{run}r") for i in range(k)]
    for call in registered:
        store.register(call)
    registered_lat = []
    cpu0, cmds0 = probe.cpu(), probe.commands()
    for call in registered:
        result, dt = timed(store.begin, call, worker, SCALE_CONFIG)
        registered_lat.append(dt)
        probe_leases.append(result.lease)
    registered_server = server_cost(probe, k, cpu0, cmds0)
    sample = random.Random(n).sample(leases, min(len(leases), max(k, 2000)))
    cpu0, script0 = probe.cpu(), probe.script_us()
    renew_lat = []
    t0 = time.perf_counter()
    for lease in sample:
        alive, dt = timed(store.renew, lease)
        assert alive, f"{label}: lease {lease.call_id} lapsed during the benchmark"
        renew_lat.append(dt)
    renew_wall = time.perf_counter() - t0
    renew_cpu = probe.cpu() - cpu0
    renew_script_us = (probe.script_us() - script0) / len(sample)
    expired_lat = []
    for _ in range(5):
        found, dt = timed(store.expired)
        assert not found, f"{label}: {len(found)} held calls reported as expired"
        expired_lat.append(dt)
    finish_lat = []
    cpu0, cmds0 = probe.cpu(), probe.commands()
    for lease in probe_leases:
        verdict, dt = timed(store.finish, lease, ok, SCALE_CONFIG)
        finish_lat.append(dt)
    finish_server = server_cost(probe, 2 * k, cpu0, cmds0)

    t0 = time.perf_counter()
    for lease in leases:
        store.finish(lease, ok, SCALE_CONFIG)
    drain_s = time.perf_counter() - t0
    time.sleep(0.2)
    mem2 = probe.memory()

    per_renew_cpu = renew_cpu / len(sample)
    per_renew_wall = renew_wall / len(sample)
    return {
        "held": n,
        "probe": k,
        "fill_per_s": n / fill_s,
        "fill_begin": lat(fill_lat),
        "begin": lat(begin_lat),
        "begin_registered": lat(registered_lat),
        "begin_registered_server": registered_server,
        "renew": lat(renew_lat),
        "finish": lat(finish_lat),
        "begin_server": begin_server,
        "finish_server": finish_server,
        "expired_sweep": lat(expired_lat),
        "drain_finish_per_s": n / drain_s,
        "bytes_per_leased_call": (mem1 - mem0) / n,
        "bytes_per_finished_call_retained": (mem2 - mem0) / n,
        "heartbeat": {
            "period_s": DEFAULT_HEARTBEAT_S,
            "round_trips_per_call_per_s": 1 / DEFAULT_HEARTBEAT_S,
            "server_cpu_us_per_renew": per_renew_cpu * 1e6,
            "server_script_us_per_renew": renew_script_us,
            "server_cpu_us_per_call_per_s": per_renew_cpu * 1e6 / DEFAULT_HEARTBEAT_S,
            "client_wall_us_per_call_per_s": per_renew_wall * 1e6 / DEFAULT_HEARTBEAT_S,
            "running_calls_per_server_core": (DEFAULT_HEARTBEAT_S / per_renew_cpu) if per_renew_cpu else None,
        },
    }


class BigPostgres(DurablePostgres):
    """The benchmark's durable PostgreSQL with a lock table for many leases."""

    max_connections = 300
    max_locks_per_transaction = 512

    @property
    def settings(self) -> dict[str, str]:  # type: ignore[override]
        return {"max_connections": str(self.max_connections),
                "max_locks_per_transaction": str(self.max_locks_per_transaction)}


def pin(server_pids: list[int], enabled: bool) -> None:
    """Put the store server on the last core and this client on the others (``--pin``), so
    that the two do not take turns on one core; new PostgreSQL backends inherit the
    postmaster's affinity."""
    cores = sorted(os.sched_getaffinity(0))
    if not enabled or len(cores) < 2:
        return
    for pid in server_pids:
        os.sched_setaffinity(pid, {cores[-1]})
    os.sched_setaffinity(0, set(cores[:-1]))


def run_redis(sizes: list[int], k: int, pinned: bool = False) -> list[dict[str, Any]]:
    from benchmarks._common import redis_server
    from aaa_celery.stores.redis import RedisStore

    rows = []
    with redis_server() as server:
        assert server.proc is not None
        pin([server.proc.pid], pinned)
        store = RedisStore(server.url)
        probe = RedisProbe(server.url)
        for n in sizes:
            print(f"  redis: {n:,} held ...", flush=True)
            rows.append({"store": "redis", "requested": n, **measure(store, probe, n, min(k, n), "r")})
        store.close()
    return rows


def run_postgres(sizes: list[int], k: int, max_connections: int, pinned: bool = False) -> list[dict[str, Any]]:
    from aaa_celery.stores.sql.postgres import PostgresStore

    BigPostgres.max_connections = max_connections
    headroom = k + 1000  # the probe's own leases, and locks others take
    capacity = BigPostgres.max_locks_per_transaction * max_connections - headroom
    rows = []
    server = BigPostgres.start()
    try:
        root = server.pid()
        pin([root, *children(root)] if root else [], pinned)
        store = PostgresStore(server.url)
        probe = PostgresProbe(server)
        for n in sizes:
            if n > capacity:
                rows.append({"store": "postgresql", "requested": n, "held": None, "note": (
                    f"not feasible: one lease = one advisory lock, so {n:,} leases need {n:,} slots "
                    f"of the lock table; this server has max_locks_per_transaction="
                    f"{BigPostgres.max_locks_per_transaction} x max_connections={max_connections} "
                    f"({capacity:,} after the probe's {k} and headroom)."
                )})
                continue
            print(f"  postgresql: {n:,} held ...", flush=True)
            store.close()  # fresh pool: reset() terminates every other session
            probe.reset()
            store = PostgresStore(server.url)
            rows.append({"store": "postgresql", "requested": n, **measure(store, probe, n, min(k, n), "p")})
        store.close()
    finally:
        server.stop()
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    out = []
    lat_rows, cost_rows = [], []
    for r in rows:
        if r.get("held") is None:
            lat_rows.append([r["store"], r["requested"], "-", "-", "-", "-", "-", "-", "-", "-", "-", "not feasible"])
            continue
        b, rn, f, e = r["begin"], r["renew"], r["finish"], r["expired_sweep"]
        br = r.get("begin_registered") or {"p50_ms": float("nan"), "p99_ms": float("nan")}
        lat_rows.append([r["store"], r["held"], br["p50_ms"], br["p99_ms"], b["p50_ms"], b["p99_ms"],
                         rn["p50_ms"], rn["p99_ms"], f["p50_ms"], f["p99_ms"], e["p50_ms"], ""])
        hb = r["heartbeat"]
        cost_rows.append([r["store"], r["held"], r["bytes_per_leased_call"], r["bytes_per_finished_call_retained"],
                          hb["server_cpu_us_per_renew"], hb["server_script_us_per_renew"],
                          hb["server_cpu_us_per_call_per_s"],
                          hb["running_calls_per_server_core"] or float("nan"), r["fill_per_s"]])
    out.append(table(
        ["store", "leased calls held", "begin p50 ms", "begin p99 ms", "begin unregistered p50 ms",
         "begin unregistered p99 ms", "renew p50 ms", "renew p99 ms",
         "finish p50 ms", "finish p99 ms", "expired() sweep ms", "note"], lat_rows,
        "Latency with N calls leased at once (one client, loopback). begin: a call registered at "
        "publish, as apply_async sends it (the worker's path); unregistered: its first sight of the call"))
    out.append("")
    out.append(table(
        ["store", "held", "bytes / leased call", "bytes / finished call (retained)",
         "server CPU µs / renew", "in-script µs / renew", f"heartbeat: server CPU µs / running call / s (heartbeat {DEFAULT_HEARTBEAT_S:g} s)",
         "running calls one server core can heartbeat", "begin/s (fill)"], cost_rows,
        "Memory and heartbeat cost"))
    server_rows = []
    for r in rows:
        if r.get("held") is None:
            continue
        b, f = r.get("begin_registered_server", r["begin_server"]), r["finish_server"]
        script = "evalsha" if r["store"] == "redis" else ""
        server_rows.append([
            r["store"], r["held"], b["cpu_us_per_op"],
            b["commands"].get(script, {}).get("usec_per_call", float("nan")),
            f["cpu_us_per_op"], f["commands"].get(script, {}).get("usec_per_call", float("nan")),
            ", ".join(f"{c} {x['usec_per_call']:.2f}" for c, x in sorted(b["commands"].items()) if c != script),
        ])
    out.append("")
    out.append(table(
        ["store", "held", "begin: server CPU µs / op", "begin: evalsha µs / call", "finish: server CPU µs / op",
         "finish: evalsha µs / call", "begin: µs / call of each command inside the script"], server_rows,
        "The store server's own work per operation (INFO cpu, INFO commandstats): holds under load"))
    notes = [r["note"] for r in rows if r.get("note")]
    if notes:
        out += ["", *[f"- postgresql {r['requested']:,}: {r['note']}" for r in rows if r.get("note")]]
    return "\n".join(out)


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """p99 at the largest size held / p99 at the smallest, per store (target: <= 2)."""
    out = {}
    for kind in ("redis", "postgresql"):
        got = [r for r in rows if r["store"] == kind and r.get("held")]
        if len(got) < 2:
            continue
        lo, hi = got[0], got[-1]
        out[kind] = {
            "from": lo["held"], "to": hi["held"],
            **{f"{op}_p99_ratio": hi[op]["p99_ms"] / lo[op]["p99_ms"] for op in ("begin_registered", "begin", "renew", "finish")
               if op in lo and op in hi},
            **{f"{op}_server_cpu_ratio": hi[f"{op}_server"]["cpu_us_per_op"] / lo[f"{op}_server"]["cpu_us_per_op"]
               for op in ("begin", "finish") if lo[f"{op}_server"]["cpu_us_per_op"]},
        }
    return out


QUICK = "Redis 1k, PostgreSQL 100"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "scale", QUICK)
    ap.add_argument("--sizes", default="1000,10000,100000", help="Redis sizes, comma-separated (default %(default)s)")
    ap.add_argument("--pg-sizes", default="100,1000,10000,100000",
                    help="PostgreSQL sizes; those above max_connections are reported as not feasible")
    ap.add_argument("--probe", type=int, default=1000, help="operations timed per size for Redis (default %(default)s)")
    ap.add_argument("--pg-probe", type=int, default=100, help="operations timed per size for PostgreSQL")
    ap.add_argument("--pg-max-connections", type=int, default=300,
                    help="max_connections of the benchmark's PostgreSQL (default %(default)s)")
    ap.add_argument("--stores", default="redis,postgresql", help="which stores (default %(default)s)")
    ap.add_argument("--pin", action="store_true",
                    help="pin the store server to the last core and this client to the others")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.pg_sizes, args.probe, args.pg_probe, args.pg_max_connections = "1000", "100", 200, 50, 200
    sizes = [int(s) for s in args.sizes.split(",") if s]
    pg_sizes = [int(s) for s in args.pg_sizes.split(",") if s]
    stores = args.stores.split(",")

    rows: list[dict[str, Any]] = []
    if "redis" in stores:
        rows += run_redis(sizes, args.probe, args.pin)
    if "postgresql" in stores:
        rows += run_postgres(pg_sizes, args.pg_probe, args.pg_max_connections, args.pin)
    text = report(rows)
    growth = ratios(rows)
    print()
    print(text)
    for kind, g in growth.items():
        print(f"\n{kind}: p99 at {g['to']:,} / p99 at {g['from']:,}: begin {g.get('begin_registered_p99_ratio', float('nan')):.2f}x "
              f"(unregistered {g['begin_p99_ratio']:.2f}x), "
              f"renew {g['renew_p99_ratio']:.2f}x, finish {g['finish_p99_ratio']:.2f}x (target: begin/finish <= 2x)")
        if "begin_server_cpu_ratio" in g:
            print(f"{kind}: server CPU per op at {g['to']:,} / at {g['from']:,}: begin {g['begin_server_cpu_ratio']:.2f}x, "
                  f"finish {g.get('finish_server_cpu_ratio', float('nan')):.2f}x")
    path = write_json(args.out, {"config": {"lease_ttl_s": SCALE_CONFIG.lease_ttl_s,
                                            "heartbeat_costed_at_s": DEFAULT_HEARTBEAT_S, **vars(args)},
                                 "rows": rows, "p99_growth": growth, "table": text})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
