"""The seeded plan and the report formats, without a fleet."""

from __future__ import annotations

import json

from aaa_celery.chaos.__main__ import main
from aaa_celery.chaos.report import format_markdown, format_table, plot_timeline
from aaa_celery.chaos.workload import ChaosConfig, make_plan, segments


def test_the_plan_is_a_function_of_the_seed_the_same_for_guard_and_baseline():
    a = make_plan(ChaosConfig(calls=50, faults=10, seed=3), "n1")
    b = make_plan(ChaosConfig(calls=50, faults=10, seed=3, baseline=True), "n2")
    strip = lambda p: ([(c.delivery, c.keyed, c.duration_s, c.sent_at) for c in p.calls],  # noqa: E731
                       [(f.at, f.kind, f.worker, f.hold_s) for f in p.faults])
    assert strip(a) == strip(b)
    assert strip(a) != strip(make_plan(ChaosConfig(calls=50, faults=10, seed=4), "n1"))
    assert all(0.5 <= c.duration_s <= 4.0 for c in a.calls)
    assert {c.delivery for c in a.calls} == {"at_least_once", "at_most_once"}
    assert "pg_kill" not in {f.kind for f in a.faults}
    pg = make_plan(ChaosConfig(calls=50, faults=40, seed=3, store="postgresql+psycopg://x/y"), "n")
    assert "pg_kill" in {f.kind for f in pg.faults}


def test_segments_split_a_body_run_where_it_was_frozen():
    assert segments([0.0, 0.2, 0.4, 3.0, 3.2]) == [(0.0, 0.4), (3.0, 3.2)]


def report(mode: str, **violations: int) -> dict:
    return {
        "mode": mode, "config": {"visibility_timeout": 10.0} if mode == "baseline" else {},
        "elapsed_s": 60.0, "faults": {"kill_main": 3, "duplicate": 1}, "faults_skipped": {"kill_child": 1},
        "duplicate_sends": 1,
        "summary": {"calls": 10, "results": {"completed": 9, "no result": 1}, "body_starts": 12,
                    "calls_run_more_than_once": 2, "duplicate_sends_absorbed": 1, "effects_applied": 4,
                    "effects_deduplicated_by_key": 1, "stale_results_fenced": 0,
                    "attempts_cancelled_on_lost_lease": 1, "no_result_where": {"in unacked": 1},
                    "violations": {f"I{i}": violations.get(f"I{i}", 0) for i in range(1, 8)}},
    }


def test_tables_and_compare(tmp_path, capsys):
    text = format_table(report("guard"))
    lines = {line.rsplit("  ", 1)[0].strip(): line.rsplit("  ", 1)[1].strip() for line in text.splitlines()[1:]}
    assert lines["violations I5 (superseded only as stale_result)"] == "0"
    assert lines["faults: kill_child"] == "0 (1 skipped)"
    md = format_markdown(report("guard"), report("baseline", I1=1))
    assert md.splitlines()[0] == "| | guard (aaa_celery) | plain Celery acks_late, visibility_timeout 10 s |"
    assert "| violations I7 (recorded == returned) | 0 | n/a |" in md
    paths = []
    for i, r in enumerate((report("guard"), report("baseline", I1=1))):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(r))
    assert main(["--compare", *map(str, paths)]) == 0
    assert "| results: no result | 1 | 1 |" in capsys.readouterr().out


def test_plot_writes_a_png_or_says_it_cannot(tmp_path):
    timeline = {"executions": [{"call_id": "c", "attempt": 1, "host": "w1", "pid": 1, "from": 0.0, "to": 1.0,
                                "returned": True, "segments": [(0.0, 1.0)]}],
                "faults": [{"kind": "kill_main", "done_at": 0.5}]}
    path = tmp_path / "t.png"
    if plot_timeline(report("guard"), timeline, str(path)):
        assert path.read_bytes()[:4] == b"\x89PNG"
    else:
        assert not path.exists()
