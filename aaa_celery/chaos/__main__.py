"""``python -m aaa_celery.chaos``: a seeded chaos run on a real worker fleet.

    python -m aaa_celery.chaos --calls 100 --workers 3 --faults 20 --seed 7 --json guard.json
    python -m aaa_celery.chaos --calls 100 --workers 3 --faults 20 --seed 7 --json base.json --baseline
    python -m aaa_celery.chaos --compare guard.json base.json      # a Markdown table, side by side

Exit status: 0 with no violation, 1 with any violation of the guard's invariants
(a ``--baseline`` run exits 0 whatever it finds, unless ``--strict``), 2 when the
run itself failed. Ctrl-C stops every process the run started.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from typing import Any

from .report import format_markdown, format_table, plot_timeline
from .workload import FAULT_KINDS, ChaosConfig, ChaosRun


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aaa_celery.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=100, help="calls to send (default 100)")
    p.add_argument("--workers", type=int, default=3, help="celery worker processes (default 3)")
    p.add_argument("--concurrency", type=int, default=2, help="prefork children per worker (default 2)")
    p.add_argument("--faults", type=int, default=20, help="faults to inject (default 20)")
    p.add_argument("--broker", help="Redis broker URL (default: start a redis-server on loopback)")
    p.add_argument("--store", help="guard store URL (default: the broker's Redis)")
    p.add_argument("--baseline", action="store_true", help="plain Celery acks_late tasks, no guard")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ttl", type=float, default=2.0, help="lease_ttl_s (default 2)")
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--min-duration", type=float, default=0.5)
    p.add_argument("--max-duration", type=float, default=4.0)
    p.add_argument("--at-most-once-share", type=float, default=0.35, help="share of at_most_once calls")
    p.add_argument("--keyed-share", type=float, default=0.5, help="share of calls applying a keyed effect")
    p.add_argument("--finish-share", type=float, default=0.3,
                   help="share of at_least_once calls with on_lost_lease=finish (exercises the fence)")
    p.add_argument("--drain", type=float, default=90.0, help="seconds to wait for results after the last fault")
    p.add_argument("--visibility-timeout", type=float, help="Redis transport visibility_timeout (default kombu's 3600)")
    p.add_argument("--restore-interval", type=float, help="kombu unacked restore interval, throttle 1")
    p.add_argument("--unclaimed-grace", type=float, default=20.0, help="aaa_unclaimed_grace_s (default 20)")
    p.add_argument("--kinds", help=f"comma-separated fault kinds (default all of {', '.join(FAULT_KINDS)})")
    p.add_argument("--effects-db", help="SQLAlchemy URL: keyed calls apply their effect there through "
                                        "aaa_celery.effects.once, and I6 counts the table's rows")
    p.add_argument("--store-replicas", type=int, default=0,
                   help="the Redis store's replicas option: each write of a call waits for this many replicas "
                        "(WAIT), so a store_failover loses none and its calls are not excused (default 0)")
    p.add_argument("--limited-share", type=float, default=0.0,
                   help="share of calls with a concurrency limit (Concurrency(key=slot, on_busy=wait); checked as I9)")
    p.add_argument("--slot-limit", type=int, default=2, help="the limit of those calls' keys (default 2)")
    p.add_argument("--slot-keys", type=int, default=2, help="how many keys they spread over (default 2)")
    p.add_argument("--json", help="write the JSON report here")
    p.add_argument("--plot", help="write a PNG timeline here (needs matplotlib)")
    p.add_argument("--workdir", help="worker logs go here (default: a temp directory)")
    p.add_argument("--old-python", help="a Python with another release of aaa_celery installed: every other "
                                        "worker runs it (a mixed-version fleet; the store is migrated first)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--strict", action="store_true", help="a baseline run with violations exits 1 too")
    p.add_argument("--compare", nargs="+", metavar="REPORT.json", help="print saved reports side by side and exit")
    return p


def config_from(args: argparse.Namespace) -> ChaosConfig:
    kinds = tuple(k.strip() for k in (args.kinds or "").split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; known: {', '.join(FAULT_KINDS)}")
    return ChaosConfig(
        calls=args.calls, workers=args.workers, concurrency=args.concurrency, faults=args.faults,
        broker=args.broker, store=args.store, baseline=args.baseline, seed=args.seed, ttl_s=args.ttl,
        max_attempts=args.max_attempts, at_most_once_share=args.at_most_once_share,
        keyed_share=args.keyed_share, finish_share=args.finish_share, min_s=args.min_duration, max_s=args.max_duration, drain_s=args.drain,
        visibility_timeout=args.visibility_timeout, restore_s=args.restore_interval,
        unclaimed_grace_s=args.unclaimed_grace, kinds=kinds, progress=not args.quiet, workdir=args.workdir,
        old_python=args.old_python,
        effects_db=args.effects_db, store_replicas=args.store_replicas,
        limited_share=args.limited_share, slot_limit=args.slot_limit, slot_keys=args.slot_keys,
    )


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.compare:
        reports = [json.load(open(p)) for p in args.compare]  # noqa: SIM115
        print(format_markdown(*reports))
        return 0
    config = config_from(args)
    command = "python -m aaa_celery.chaos " + shlex.join(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _terminate)  # stop the fleet on kill too, like Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    run = ChaosRun(config, command=command)
    try:
        report = run.run()
    except KeyboardInterrupt:
        print("interrupted: every worker and server this run started has been stopped", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a failed run is exit status 2, with the reason
        print(f"chaos run failed: {e}", file=sys.stderr)
        return 2
    data = report.to_dict()
    print(format_table(data))
    if report.violations:
        print(f"\n{len(report.violations)} violation(s), first ones:")
        for v in report.violations[:15]:
            print(f"  {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**data, "timeline": run.timeline}, f, indent=1)
    if args.plot:
        if plot_timeline(data, run.timeline, args.plot):
            print(f"timeline: {args.plot}")
        else:
            print("timeline skipped: matplotlib is not installed (pip install 'aaa_celery[chaos]')")
    if report.violation_count and (not config.baseline or args.strict):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
