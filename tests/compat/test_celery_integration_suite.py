"""Celery's own ``t/integration/test_tasks.py``, plain and with every task guarded (issue 11).

Runs ``scripts/celery-compat test_tasks.py --parallel`` (both modes at once, each with the
suite's own embedded worker on a private Redis; about 4 minutes on a 2-core box, against 7
one mode after the other: the suite mostly waits) and compares:
every test that passes plain must pass guarded, unless ``celery_suite_known.txt``
lists it with the reason. A listed test that passes guarded now fails this test too,
so the list only shrinks. The canvas module and the rest of the suite run on demand:
``scripts/celery-compat --help``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ..conftest import unavailable
from .celery_suite_plugin import read_known

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "celery-compat"
KNOWN = Path(__file__).with_name("celery_suite_known.txt")
MODULE = "test_tasks.py"
#: The plain run must pass this share of the tests it ran (skips aside): a broken
#: environment where everything fails in both modes must not pass as "no regressions".
PLAIN_PASS_FLOOR = 0.85

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_known_list_is_well_formed() -> None:
    known = read_known(KNOWN)
    for test_id, reason in known.items():
        assert test_id.startswith(f"t/integration/{MODULE}::"), test_id
        assert "not supported yet" not in reason.lower(), (test_id, reason)


@pytest.mark.timeout(1500)
def test_celery_integration_suite_guarded_matches_plain() -> None:
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed (scripts/test installs it)")
    known = read_known(KNOWN)
    # logs outside pytest's tmp_path, which other pytest runs on this machine rotate away
    (ROOT / ".cache").mkdir(exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="celery-compat-ci-", dir=ROOT / ".cache"))
    report_path = logs / "report.json"
    cmd = [sys.executable, str(SCRIPT), MODULE, "--known", str(KNOWN), "--report-only",
           "--timeout", "60", "--session-timeout", "660", "--parallel", "--json", str(report_path), "--keep", str(logs)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1450,
                          stdin=subprocess.DEVNULL, check=False)
    output = f"{done.stdout}\n{done.stderr[-3000:]}\n(pytest logs of both runs in {logs})"
    if done.returncode != 0 or not report_path.is_file():
        pytest.fail(f"scripts/celery-compat exited {done.returncode}:\n{output}", pytrace=False)
    report = json.loads(report_path.read_text())
    runs = report["runs"]

    ran = [t for t in runs["plain"]["tests"].values() if t["outcome"] not in ("skipped", "xfailed")]
    passed = sum(t["outcome"] in ("passed", "xpassed") for t in ran)
    if not ran or passed < PLAIN_PASS_FLOOR * len(ran):
        pytest.fail(f"the plain run passed only {passed} of {len(ran)}: the environment is broken "
                    f"and the comparison means nothing\n{output}", pytrace=False)
    if not runs["guarded"]["store_keys"]:
        pytest.fail(f"the guarded run left no keys in the guard's store\n{output}", pytrace=False)

    problems = []
    if report["regressions"]:
        problems.append(f"{len(report['regressions'])} tests pass plain and fail guarded, "
                        f"and {KNOWN.name} does not list them:")
        problems += [f"  {t}\n      [{r['outcome']}] {r['reason']}" for t, r in report["regressions"].items()]
    if report["known_passing"]:
        problems.append(f"{len(report['known_passing'])} tests listed in {KNOWN.name} pass guarded "
                        "now: remove their lines")
        problems += [f"  {t}" for t in report["known_passing"]]
    seen = set(runs["plain"]["tests"]) | set(runs["guarded"]["tests"])
    missing = [t for t in known if t not in seen]
    if missing:
        problems.append(f"{len(missing)} tests listed in {KNOWN.name} did not run (renamed? another Celery?):")
        problems += [f"  {t}" for t in missing]
    if problems:
        pytest.fail("\n".join(problems) + f"\n\n{output}", pytrace=False)
    print(done.stdout)
    shutil.rmtree(logs, ignore_errors=True)
