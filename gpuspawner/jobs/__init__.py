"""Notebook jobs: run one notebook once, in its own bundle, placed by the hub's one ledger.

This package is the part that knows nothing of the hub: the request's rules and the job's
states (:mod:`~gpuspawner.jobs.model`), the program that runs inside the job's container
(:mod:`~gpuspawner.jobs.execute`, standard library plus papermill there) and the REST client
behind ``gpuspawner jobs`` (:mod:`~gpuspawner.jobs.client`). The hub side (the database, the
runner that places, launches, watches and releases, the REST handlers) is
:mod:`gpuspawner.hub.jobs`. User guide and settings: ``docs/jobs.md``.
"""
