"""The package's structure: layers that only look down, and no side effects at import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(*config: str) -> str:
    """import-linter's report on the package (``config``: a configuration file other than
    pyproject.toml); fails the test on a broken contract."""
    option = f"config_filename={config[0]!r}, " if config else ""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         f"sys.exit(lint_imports({option}no_cache=True))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def test_import_linter_contracts_hold():
    """Every rule of DESIGN.md §7 is an import-linter contract in pyproject.toml; a
    back-arrow (a store importing Celery, runtime importing a store, testing importing
    chaos, a cycle in the worker) breaks one."""
    assert "0 broken" in lint_imports()


def test_runtime_has_no_import_cycle_even_through_type_checking_imports():
    """The main contracts skip ``TYPE_CHECKING`` imports; runtime/'s own contract counts them
    (runtime/approvals.py once imported runtime/run.py's handle that way, and run.py imports
    approvals)."""
    assert "1 kept, 0 broken" in lint_imports("tests/project/runtime-imports.toml")


def in_a_fresh_interpreter(code: str) -> None:
    """Run ``code`` in a new Python process from the project root; its failure fails the test."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_importing_the_task_adapter_leaves_celerys_redis_backend_unloaded():
    """``worker/results.py`` imports Celery's Redis backend (and redis-py with it) on first use,
    not at import: it doubled the time of ``import aaa_celery.worker.task`` (0.37 s -> 0.70 s)
    for an app on any backend."""
    code = (
        "import sys\n"
        "import aaa_celery.worker.task\n"
        "assert 'celery.backends.redis' not in sys.modules, 'celery.backends.redis loaded at import'\n"
    )
    in_a_fresh_interpreter(code)


def test_the_sql_stores_without_postgresql_load_no_psycopg():
    """psycopg is the ``postgres`` extra: the SQLite store and the SQL package load without it.
    ``PostgresStore`` (whose modules import the driver at the top) is imported when asked for."""
    code = (
        "import sys\n"
        "from aaa_celery.stores.sql import SQLiteStore, SQLStore\n"
        "assert 'psycopg' not in sys.modules, 'psycopg loaded by aaa_celery.stores.sql'\n"
        "from aaa_celery.stores.sql import PostgresStore\n"
        "assert PostgresStore.__module__ == 'aaa_celery.stores.sql.postgres'\n"
    )
    in_a_fresh_interpreter(code)


def test_importing_the_pure_modules_loads_no_celery_and_connects_nothing():
    code = (
        "import sys\n"
        "import aaa_celery, aaa_celery.lifecycle, aaa_celery.config, aaa_celery.protocol, aaa_celery.guard\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'billiard'))\n"
        "assert not loaded, loaded\n"
    )
    in_a_fresh_interpreter(code)


def test_importing_the_worker_side_connects_no_signal_until_attached():
    code = (
        "from celery import signals\n"
        "import aaa_celery.worker, aaa_celery.tools, aaa_celery.runtime, aaa_celery.testing\n"
        "names = ('worker_process_init', 'worker_ready', 'worker_init', 'task_prerun', 'task_postrun',\n"
        "         'task_revoked', 'before_task_publish', 'after_task_publish')\n"
        "connected = {n: len(getattr(signals, n).receivers) for n in names}\n"
        "assert not any(connected.values()), connected\n"
        "from celery import Celery\n"
        "from aaa_celery import GuardedTask\n"
        "app = Celery('t', broker='memory://', set_as_current=False)\n"
        "app.conf.aaa_store_url = 'memory://'\n"
        "@app.task(base=GuardedTask, shared=False, name='t')\n"
        "def t(x): return x\n"
        "app.finalize()\n"
        "app.tasks['t']\n"
        "assert len(signals.worker_process_init.receivers) == 1, signals.worker_process_init.receivers\n"
    )
    in_a_fresh_interpreter(code)


def test_every_worker_module_sits_in_a_layer_of_the_worker_contract():
    """A module the worker's layers contract does not name is free of it: a new one could
    import upward unnoticed (worker.timelimit and worker.conf once were)."""
    import re
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "worker-layers"]
    named = {name for layer in contract["layers"] for name in re.split(r"\s*\|\s*", layer)}
    modules = {p.stem for p in (ROOT / "aaa_celery" / "worker").glob("*.py") if p.stem != "__init__"}
    assert modules <= named, f"worker modules outside every layer: {sorted(modules - named)}"
