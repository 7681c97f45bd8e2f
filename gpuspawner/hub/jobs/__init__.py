"""The hub side of notebook jobs (docs/jobs.md): the settings (``c.GPUJobs.*``,
:mod:`~gpuspawner.hub.jobs.settings`), the jobs database (:mod:`~gpuspawner.hub.jobs.store`),
the runner that places, launches, watches and releases jobs through the hub's one cluster
(:mod:`~gpuspawner.hub.jobs.runner`) and the REST handlers of the ``gpuspawner`` service
(:mod:`~gpuspawner.hub.jobs.service`). What knows nothing of the hub is
:mod:`gpuspawner.jobs`."""
