"""The 0.1.0 import path of :class:`~aaa_celery.stores.sql.postgres.PostgresStore`."""

from __future__ import annotations

from .sql.postgres import PostgresStore

__all__ = ["PostgresStore"]
