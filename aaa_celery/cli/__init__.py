"""``celery -A proj aaa ...``: the operator's view of guarded calls.

Registered as a Celery subcommand through the ``celery.commands`` entry point
(pyproject.toml), as Flower registers ``celery flower``. Each command runs with the
app that ``-A`` names, so it opens the store that app's guarded tasks use
(``aaa_store_url``, else the Redis broker).

Every ``celery`` command loads this plugin, so importing it has Celery's settings table mask
the ``aaa_*`` settings' passwords (:func:`aaa_celery.worker.masking.install`): ``celery
report`` binds no task, so an app whose guarded tasks are only declared
(``@app.task(base=GuardedTask)``, ``Celery(task_cls=...)``) would print them in clear.
"""

from __future__ import annotations

from ..worker import masking
from .commands import aaa

masking.install()  # the one thing done at import: display only, idempotent

__all__ = ["aaa"]
