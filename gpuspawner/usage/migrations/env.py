"""alembic's environment for the usage database: runs on the connection the store passes in
``config.attributes["connection"]`` (online only), with the version table
``gpuspawner_usage_alembic_version``."""

from alembic import context

VERSION_TABLE = "gpuspawner_usage_alembic_version"

connection = context.config.attributes["connection"]
context.configure(
    connection=connection, target_metadata=None, version_table=VERSION_TABLE, render_as_batch=True
)
with context.begin_transaction():
    context.run_migrations()
