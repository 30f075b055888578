"""Alembic's environment for the SQL stores' schema: it runs on the connection (inside its
transaction, under the store's schema lock) that :mod:`aaa_celery.stores.sql.versions`
hands it in ``config.attributes["connection"]``; there is no ``alembic.ini`` to read."""

from alembic import context

from aaa_celery.stores.sql.schema import metadata
from aaa_celery.stores.sql.versions import VERSION_TABLE

context.configure(connection=context.config.attributes["connection"], target_metadata=metadata,
                  version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
