"""alembic's environment for the usage database: runs on the connection the store passes in
``config.attributes["connection"]`` (online only), with the version table
``gpuspawner_usage_alembic_version`` (gpuspawner.dbutil.run_migrations)."""

from gpuspawner.dbutil import run_migrations

run_migrations("gpuspawner_usage_alembic_version")
