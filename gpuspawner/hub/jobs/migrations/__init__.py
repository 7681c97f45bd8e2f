"""The jobs database's alembic migrations (``script_location`` =
``gpuspawner.hub.jobs:migrations``): :mod:`~gpuspawner.hub.jobs.store` runs ``upgrade head``
when the hub starts. Revisions ``0001``..``0003`` are the schema versions 1..3 of the version
table that came before alembic (``gpuspawner_jobs_schema``): a database of one of them is
stamped with its revision first. The version is kept in ``gpuspawner_jobs_alembic_version``,
not alembic's default ``alembic_version``, which JupyterHub's own database uses (the two may
share one PostgreSQL database).

A new revision: change the models in ``store.py``, then
``alembic -c <(printf '[alembic]\\nscript_location = gpuspawner.hub.jobs:migrations\\n')
revision -m "what"`` and write its ``upgrade`` (``tests/test_job_definitions.py`` checks that
the migrated schema equals the models)."""
