"""The usage database's alembic migrations (``script_location`` =
``gpuspawner.usage:migrations``): :class:`~gpuspawner.usage.store.UsageStore` runs ``upgrade
head`` when the hub opens it. The version is kept in ``gpuspawner_usage_alembic_version`` (not
alembic's default ``alembic_version``, which JupyterHub's own database uses, nor the jobs
database's table: the three may share one PostgreSQL database).

A new revision: change the model in ``store.py``, then
``alembic -c <(printf '[alembic]\\nscript_location = gpuspawner.usage:migrations\\n')
revision -m "what"`` and write its ``upgrade`` (``tests/test_usage_records.py`` checks that the
migrated schema equals the model)."""
