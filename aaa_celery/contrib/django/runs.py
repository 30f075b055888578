"""The process's one :class:`AgentRuns`, made on first use from ``settings.AAA_CELERY``."""

from __future__ import annotations

import atexit
import threading

from .._web import AgentRuns
from .settings import load_settings

_lock = threading.Lock()
_runs: AgentRuns | None = None


def get_runs() -> AgentRuns:
    """This process's agent runs (its sync engine), started on first call."""
    global _runs
    with _lock:
        if _runs is None:
            _runs = AgentRuns(load_settings())
            atexit.register(close_runs)
        return _runs


def close_runs() -> None:
    """Stop this process's engine (tests; at exit it stops on its own). The next
    ``get_runs()`` starts a new one."""
    global _runs
    with _lock:
        runs, _runs = _runs, None
    if runs is not None:
        runs.close()
        atexit.unregister(close_runs)
