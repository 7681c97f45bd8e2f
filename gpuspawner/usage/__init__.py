"""Usage accounting (hub side, docs/usage.md): one record per booked bundle of a server or a
notebook job, from its booking to its release, with what was reserved and what was used.

- :mod:`~gpuspawner.usage.store`: the usage database (SQLAlchemy, alembic migrations in
  :mod:`~gpuspawner.usage.migrations`);
- :mod:`~gpuspawner.usage.recorder`: the ledger's observer that opens, continues and closes
  the records (also across hub restarts);
- :mod:`~gpuspawner.usage.settings`: ``c.GPUUsage.*``;
- :mod:`~gpuspawner.usage.hub`: attaches the recorder to the hub's cluster at start;
- :mod:`~gpuspawner.usage.report`: reports (from, to, group by), JSON and CSV;
- :mod:`~gpuspawner.usage.api`: ``GET api/usage`` of the gpuspawner service;
- :mod:`~gpuspawner.usage.cli`: ``gpuspawner usage``.

:mod:`gpuspawner.placement` stays pure: the ledger only calls its observers.
"""
