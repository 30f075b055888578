"""The chaos run's outputs: the result table, the side-by-side table, the PNG timeline."""

from __future__ import annotations

from typing import Any

from ..testing.checker import INVARIANTS, LEDGER_ONLY

RESULT_KINDS = ("completed", "OutcomeUnknown", "ExecutionAbandoned", "completed twice or more", "no result")
GUARD_ONLY_RESULTS = ("OutcomeUnknown", "ExecutionAbandoned")


def _rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    s = report["summary"]
    baseline = report["mode"] == "baseline"
    rows = [("calls", str(s["calls"]))]
    for kind in sorted(set(report["faults"]) | set(report["faults_skipped"])):
        skipped = report["faults_skipped"].get(kind, 0)
        rows.append((f"faults: {kind}", f"{report['faults'].get(kind, 0)}" + (f" ({skipped} skipped)" if skipped else "")))
    results = dict(s["results"])
    for kind in RESULT_KINDS:  # every kind in every table, so tables line up side by side
        n = results.pop(kind, 0)
        na = (kind in GUARD_ONLY_RESULTS and baseline) or (kind == "completed twice or more" and not baseline)
        rows.append((f"results: {kind}", "n/a" if na else str(n)))
    rows += [(f"results: {kind}", str(n)) for kind, n in results.items()]
    where = s.get("no_result_where") or {}
    rows.append(("  no result: in unacked / queued / gone",
                 f"{where.get('in unacked', 0)} / {where.get('queued', 0)} / {where.get('gone', 0)}" if where else "-"))
    rows += [
        ("body starts", str(s["body_starts"])),
        ("calls whose body ran more than once", str(s["calls_run_more_than_once"])),
        ("calls sent twice whose body ran once",
         f"{s.get('duplicate_sends_absorbed', 0)} of {report['duplicate_sends']}"),
        ("effects applied / deduplicated by key", f"{s['effects_applied']} / {s['effects_deduplicated_by_key']}"),
        ("stale results fenced / attempts cancelled", "n/a" if baseline else
         f"{s['stale_results_fenced']} / {s['attempts_cancelled_on_lost_lease']}"),
    ]
    for inv in INVARIANTS:
        na = baseline and inv not in LEDGER_ONLY
        rows.append((f"violations {inv} ({INVARIANT_NAMES[inv]})", "n/a" if na else str(s["violations"].get(inv, 0))))
    if report.get("documented_exceptions"):
        rows.append(("documented exceptions (outside the guarantee)", str(len(report["documented_exceptions"]))))
    rows.append(("wall time", f"{report['elapsed_s']:.0f} s"))
    return rows


INVARIANT_NAMES = {
    "I1": "exactly one result",
    "I2": "no overlap under valid leases",
    "I3": "at_most_once: <= 1 start",
    "I4": "at_least_once: <= max, contiguous",
    "I5": "superseded only as stale_result",
    "I6": "keyed effect exactly once",
    "I7": "recorded == returned",
    "I8": "no in-doubt or re-run without a loss",
    "I9": "<= limit live holders per concurrency key",
}


def label(report: dict[str, Any]) -> str:
    """The run's column title: the mode, and the broker settings that changed."""
    c = report.get("config") or {}
    extra = []
    if c.get("visibility_timeout"):
        extra.append(f"visibility_timeout {c['visibility_timeout']:g} s")
    if c.get("restore_s"):
        extra.append(f"restore every {c['restore_s']:g} s")
    name = "guard (aaa_celery)" if report["mode"] == "guard" else "plain Celery acks_late"
    return f"{name}, {', '.join(extra)}" if extra else name


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table of one run."""
    rows = [("", label(report))] + _rows(report)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def format_markdown(*reports: dict[str, Any]) -> str:
    """A Markdown table of several runs side by side (guard, baseline...)."""
    columns = [dict(_rows(r)) for r in reports]
    keys: list[str] = []
    for r in reports:
        keys += [k for k, _ in _rows(r) if k not in keys]
    head = "| | " + " | ".join(label(r) for r in reports) + " |"
    lines = [head, "|---" * (len(reports) + 1) + "|"]
    lines += ["| " + k + " | " + " | ".join(c.get(k, "") for c in columns) + " |" for k in keys]
    return "\n".join(lines)


def plot_timeline(report: dict[str, Any], timeline: dict[str, Any], path: str) -> bool:
    """A PNG of body runs per worker (one row per worker node, bars coloured by attempt,
    hatched when the run never returned) with the faults as vertical lines. Returns
    False (and writes nothing) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = timeline["executions"]
    hosts = sorted({r["host"] for r in runs})
    row = {h: i for i, h in enumerate(hosts)}
    colors = {None: "tab:gray", 1: "tab:green", 2: "tab:orange", 3: "tab:red"}
    fig, ax = plt.subplots(figsize=(14, max(3.0, 0.5 * len(hosts) + 1.5)))
    for r in runs:
        y = row[r["host"]] + (hash(r["pid"]) % 5) * 0.12 - 0.25
        for a, b in r.get("segments") or [(r["from"], r["to"])]:
            ax.barh(y, max(0.05, b - a), left=a, height=0.1,
                    color=colors.get(r["attempt"], "tab:purple"), hatch=None if r["returned"] else "///",
                    edgecolor="black" if not r["returned"] else None, linewidth=0.3)
    fault_colors = {"kill_main": "red", "kill_child": "orange", "freeze_kill": "purple", "stop_cont": "blue",
                    "duplicate": "green", "pg_kill": "brown"}
    for f in timeline["faults"]:
        if f.get("done_at") is not None:
            ax.axvline(f["done_at"], color=fault_colors.get(f["kind"], "black"), alpha=0.5, linewidth=0.8)
    ax.set_yticks(range(len(hosts)), hosts)
    ax.set_xlabel("seconds since the first call")
    s = report["summary"]
    ax.set_title(f"{report['mode']}: {s['calls']} calls, {sum(report['faults'].values())} faults, "
                 f"{sum(s['violations'].values())} violations (bars: attempt 1 green, 2 orange, 3 red, "
                 "none grey; hatched: never returned; gaps: frozen; lines: faults)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
