"""Engine: agent runs per second, through a worker fleet and through the embedded engine.

Each run is ``ToolLoop`` with a fake model (``FakeLLMClient``) that makes 3 tool
calls, one per turn (``lookup``, ``score``, ``notify``), then answers: 4 model
turns and 3 guarded tool calls per run. ``--concurrency`` runs are in flight at once.

* ``fleet``: ``Engine(app=...)`` in this process; the tools run in a real
  ``celery worker`` subprocess (``--pool``, ``--workers``) on Redis (broker, result
  backend and store in one ``redis-server``).
* ``embedded``: ``Engine()``: an in-process worker thread, in-memory broker and store.

Each mode runs twice: with the run state in the store (the default: record, events,
model turns and run lease written as the run goes, docs/durable-runs.md), and without
(``Engine(run_state=False)``, runs in process memory only, as before).

    python benchmarks/engine.py                  # 300 runs each, 20 at once
    python benchmarks/engine.py --quick          # < 30 s: 30 runs each
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import Worker, parser, pct, redis_server, table, write_json  # noqa: E402

from aaa_celery.algos import ToolLoop  # noqa: E402
from aaa_celery.llm import FakeLLMClient, LLMHandler  # noqa: E402
from aaa_celery.llm.fake import text, tool_call  # noqa: E402
from aaa_celery.runtime import Engine  # noqa: E402
from aaa_celery.tools import ToolHandler  # noqa: E402
from benchmarks.bench_tools import agent_registry  # noqa: E402


def model(request: Any) -> Any:
    """Three tool calls, one a turn, then the answer."""
    done = sum(1 for m in request.messages if m.role == "tool")
    order = request.messages[1 if request.messages[0].role == "system" else 0].content
    if done == 0:
        return tool_call("lookup", order_id=order)
    if done == 1:
        return tool_call("score", order_id=order)
    if done == 2:
        return tool_call("notify", order_id=order, text="your refund is on its way")
    return text(f"handled {order}")


async def drive(engine: Engine, runs: int, concurrency: int) -> dict[str, Any]:
    LLMHandler(FakeLLMClient(model)).attach(engine)
    ToolHandler(agent_registry).attach(engine)
    loop = ToolLoop(agent_registry)
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    failed: list[str] = []

    async def one(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            outcome = await engine.run(loop, {"task": f"A-{i}"})
            latencies.append(time.perf_counter() - t0)
            tools_ok = outcome.status == "completed" and outcome.value.get("turns") == 4
            if not tools_ok:
                failed.append(f"A-{i}: {outcome.status} {outcome.error or outcome.value}")

    # Warm up (imports, connections, the embedded worker) outside the timing.
    await asyncio.gather(*(one(-i - 1) for i in range(min(concurrency, 5))))
    latencies.clear()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(runs)))
    elapsed = time.perf_counter() - t0
    return {
        "runs": runs, "concurrency": concurrency, "elapsed_s": elapsed,
        "runs_per_s": runs / elapsed, "tool_calls_per_s": 3 * runs / elapsed,
        "run_latency_p50_s": pct(latencies, 50), "run_latency_p99_s": pct(latencies, 99),
        "run_latency_mean_s": statistics.mean(latencies), "failed": failed[:10], "failed_count": len(failed),
    }


def fleet(args: argparse.Namespace, logdir: Path) -> list[dict[str, Any]]:
    with ExitStack() as stack:
        srv = stack.enter_context(redis_server())
        env = {"BENCH_BROKER": srv.url, "BENCH_BACKEND": srv.url, "BENCH_STORE": srv.url,
               "BENCH_PREFETCH": str(args.prefetch)}
        os.environ.update(env)
        from benchmarks import bench_app

        workers = [Worker(env, args.pool, args.worker_concurrency, queues="aaa.default", name=f"engine{i}",
                          log=logdir / f"worker{i}.log") for i in range(args.workers)]
        for w in workers:
            stack.callback(w.stop)

        async def go(run_state: bool) -> dict[str, Any]:
            engine = Engine(app=bench_app.app, run_state=run_state)
            try:
                return await drive(engine, args.runs, args.concurrency)
            finally:
                await engine.aclose()

        pool = f"-P {args.pool} -c {args.worker_concurrency} x {args.workers}"
        return [{"mode": "fleet", "run_state": run_state, "pool": pool, **asyncio.run(go(run_state))}
                for run_state in (False, True)]


def embedded(args: argparse.Namespace) -> list[dict[str, Any]]:
    def one(run_state: bool) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            async with Engine(run_state=run_state) as engine:
                return await drive(engine, args.runs, args.concurrency)

        return {"mode": "embedded", "run_state": run_state,
                "pool": "in-process threads (Engine() default concurrency 4)", **asyncio.run(go())}

    return [one(False), one(True)]


QUICK = "30 runs per mode"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "engine", QUICK)
    ap.add_argument("--runs", type=int, default=300, help="timed runs per mode (default %(default)s)")
    ap.add_argument("--concurrency", type=int, default=20, help="runs in flight at once (default %(default)s)")
    ap.add_argument("--modes", default="fleet,embedded", help="default %(default)s")
    ap.add_argument("--pool", default="threads", help="fleet worker pool (default %(default)s)")
    ap.add_argument("--worker-concurrency", type=int, default=8, help="fleet worker -c (default %(default)s)")
    ap.add_argument("--workers", type=int, default=1, help="fleet worker processes (default %(default)s)")
    ap.add_argument("--prefetch", type=int, default=1, help="worker_prefetch_multiplier (default %(default)s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs = 30
    logdir = Path(tempfile.mkdtemp(prefix="aaa-bench-engine-"))
    rows = []
    for mode in args.modes.split(","):
        print(f"  {mode} ...", flush=True)
        rows.extend(fleet(args, logdir) if mode == "fleet" else embedded(args))
    text_ = table(["engine", "run state", "workers", "runs", "in flight", "runs/s", "tool calls/s", "run p50 s",
                   "run p99 s", "failed"],
                  [[r["mode"], "in the store" if r["run_state"] else "in memory", r["pool"], r["runs"],
                    r["concurrency"], r["runs_per_s"], r["tool_calls_per_s"],
                    r["run_latency_p50_s"], r["run_latency_p99_s"], r["failed_count"]] for r in rows],
                  "Agent runs (fake model, 3 guarded tool calls a run)")
    print()
    print(text_)
    path = write_json(args.out, {"config": vars(args), "rows": rows, "table": text_, "worker_logs": str(logdir)})
    print(f"\nwrote {path}; worker logs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
