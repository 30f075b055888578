"""``celery -A proj aaa ...``: the operator's view of guarded calls.

Registered as a Celery subcommand through the ``celery.commands`` entry point
(pyproject.toml), as Flower registers ``celery flower``. Each command runs with the
app that ``-A`` names, so it opens the store that app's guarded tasks use
(``aaa_store_url``, else the Redis broker).
"""

from __future__ import annotations

from .commands import aaa

__all__ = ["aaa"]
