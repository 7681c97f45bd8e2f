"""Start the ``gpuspawner`` hub service from ``jupyterhub_config.py``: :func:`configure_service`.

It sits above the service's application (:mod:`gpuspawner.hub.service.app`) and the notebook
jobs' part of it (:mod:`gpuspawner.hub.jobs.service`, whose handlers build on the
application's), and joins them: the application is given the jobs' routes and the metrics
their clusters, so that neither lower module imports the other (docs/architecture.md).

The jobs' module is imported as a module, not its names: it imports
:mod:`gpuspawner.hub.service.app`, which runs this package's ``__init__`` (hence this module)
while the jobs' module is half made when it is imported first. (That package-level loop ends
once the jobs' handlers build on a module outside this package.)
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Iterable
from typing import Any

from ...usage.api import usage_routes
from ...usage.budgets import EXEMPT_SCOPE
from .. import metrics
from ..cluster import current_clusters
from ..jobs import service as jobs_service  # (the module: see the docstring)
from .app import ADMIN_SCOPE, GPUService, resume_queue
from .profiles_api import profile_routes

log = logging.getLogger("gpuspawner")

__all__ = ["configure_service"]


def configure_service(c: Any, name: str = "gpuspawner", host: str = "127.0.0.1",
                      port: int = 0, admin_groups: Iterable[str] = ("gpuspawner-admins",),
                      track_spawn_time: bool = True) -> GPUService | None:
    """Start the service inside the hub process and register it with the hub (call it from
    ``jupyterhub_config.py``; see ``docs/service.md``).

    It binds ``host:port`` (loopback; 0 = a free port), adds the external service
    ``{"name": name, "url": ..., "oauth_no_confirm": True}``, defines the custom scope
    :data:`~gpuspawner.hub.service.app.ADMIN_SCOPE` and a role granting it (with service
    access) to the hub's ``admin_users`` and the JupyterHub groups ``admin_groups``, adds
    ``access:services!service=<name>`` to every user (``JupyterHub.extra_user_scopes``),
    registers the ledger gauges and, with ``track_spawn_time``, chains
    :func:`gpuspawner.hub.metrics.track_spawn` in front of any ``pre_spawn_hook`` already
    configured. It also starts notebook jobs (:func:`gpuspawner.hub.jobs.service.configure_jobs`,
    their routes under ``api/jobs``).

    Returns:
        the service, or None when no event loop is running (a config load that serves nothing,
        e.g. ``jupyterhub --help-all``).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        log.info("gpuspawner service: no running event loop; not started")
        return None
    jh = c.JupyterHub
    base_url = jh.base_url if "base_url" in jh else "/"
    # notebook jobs' routes (api/jobs) build on the service's handlers (gpuspawner.hub.jobs.service)
    service = GPUService(name, secrets.token_hex(32), base_url=base_url,
                         extra_routes=[jobs_service.job_routes, profile_routes,
                                       usage_routes])
    service.listen(host, port)

    # append/update/add work on lists already set above and on unset (lazy) values alike
    jh.services.append({
        "name": name,
        "url": service.url,
        "api_token": service.api_token,
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": [ADMIN_SCOPE],
        "display": True,
        "info": {"description": "GPU placement: map, REST API, metrics"},
    })
    jh.custom_scopes.update({ADMIN_SCOPE: {
        "description": "See every user's GPU allocations and usage, the GPU map and metrics "
                       "of the gpuspawner service"}})
    # usage budgets (c.GPUSpawner.usage_budgets) never refuse its holders: the service's
    # admins below, and whom a role of the site's gives it
    jh.custom_scopes.update({EXEMPT_SCOPE: {
        "description": "Start servers and notebook jobs past the usage budgets"}})
    access = f"access:services!service={name}"
    # every user may open the service (JupyterHub adds these to the default 'user' role)
    jh.extra_user_scopes.add(access)
    admins = sorted(c.Authenticator.admin_users) if "admin_users" in c.Authenticator else []
    jh.load_roles.append({"name": f"{name}-service-admins",
                          "description": "admin view of the gpuspawner service",
                          "scopes": [ADMIN_SCOPE, EXEMPT_SCOPE, access],
                          "users": admins, "groups": sorted(admin_groups)})

    # spawns queued before a hub restart are spawned again by the service (resume_queue)
    jh.load_roles.append({"name": f"{name}-service-queue",
                          "description": "spawn queued servers again after a hub restart",
                          "scopes": ["servers", "read:users:name"], "services": [name]})
    service.resume_task = asyncio.ensure_future(resume_queue(service))
    # notebook jobs (c.GPUJobs.*): api/jobs, started once the hub runs (docs/jobs.md)
    jobs_service.configure_jobs(service)

    metrics.register_cluster_collector(current_clusters)
    if track_spawn_time:
        previous = None
        for section in ("GPUSpawner", "DockerSpawner", "Spawner"):
            if section in c and "pre_spawn_hook" in c[section]:
                previous = c[section]["pre_spawn_hook"]
                break

        def pre_spawn_hook(spawner: Any) -> Any:
            metrics.track_spawn(spawner)
            return previous(spawner) if previous else None

        c.GPUSpawner.pre_spawn_hook = pre_spawn_hook
    log.info("gpuspawner service listening on %s (proxied at %s)", service.url, service.prefix)
    return service
