"""One call that wires a hub for gpuspawner: :func:`wire_hub`.

A site's ``jupyterhub_config.py`` sets what is its own (authenticator, profiles, nodes, homes,
quotas) and calls :func:`wire_hub` once for the rest that must agree across several settings:
the gpuspawner service (REST API, GPU map, metrics, notebook jobs), the listener where servers
send notebook jobs, the idle culler service with its signal sources, and the scopes, roles and
environment that let servers, users and the culler reach them. Each piece is what
``hub_config/jupyterhub_config.py`` did inline before (issue 43, item 2); docs/install.md
shows the call, with what to change for several nodes and for Slurm.

Addresses follow JupyterHub's ``hub_ip`` / ``hub_connect_ip``: ``listen_ip`` is where the
culler and the servers' listener bind (an address of the hub machine that servers reach; on
one machine the hub network's gateway), ``connect_ip`` what servers are told (a name or
address every node resolves to the hub machine; on several nodes the hub network's gateway
exists only on the hub machine, so it must be changed there).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuspawner.hub.collector import HUB_GC_THRESHOLD, check_gc_threshold, set_hub_gc_threshold
from gpuspawner.hub.service import configure_service
from gpuspawner.hub.service_base import hub_cluster
from gpuspawner.usage.home import HomeFigures

log = logging.getLogger(__name__)

#: JupyterHub's default ``Spawner.server_token_scopes``
DEFAULT_SERVER_TOKEN_SCOPES = ("users:activity!user", "access:servers!server")


#: the hub page templates gpuspawner adds (home.html: the user's own usage)
HUB_TEMPLATES = Path(__file__).resolve().parent / "templates" / "hub"


@dataclass
class Wiring:
    """What :func:`wire_hub` set up.

    Attributes:
        service: the running gpuspawner service (``GPUService``), or None when the config was
            loaded without an event loop (``jupyterhub --help-all``).
        culler_url: the culler service's URL (``http://listen_ip:port``), or None without one.
        service_url_for_servers: the URL servers send notebook jobs to (what they get as
            ``GPUSPAWNER_SERVICE_URL``), or None where that listener is off.
    """

    service: Any
    culler_url: str | None
    service_url_for_servers: str | None


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _server_token_scopes(c: Any) -> list[str]:
    spawner = c.Spawner
    return list(spawner.server_token_scopes if "server_token_scopes" in spawner
                else DEFAULT_SERVER_TOKEN_SCOPES)


def culler_docker_urls(c: Any) -> list[str]:
    """``--docker-url NODE=URL`` for each Docker node set in ``c.GPUSpawner.nodes`` so far (the
    culler's network signal: container bytes/s, the policies' ``network_floor``), then
    ``--docker-tls-cert-path`` when ``c.DockerBackend.tls_cert_path`` is set. Empty on Slurm:
    a job shares its node's network, there is no per-server counter. A node with
    ``docker_url`` "" is the hub's own engine (``$DOCKER_HOST``, else the engine's default)."""
    if c.GPUSpawner.get("backend", "docker") != "docker":
        return []
    nodes = c.GPUSpawner.get("nodes") or [{"name": "local"}]
    local = os.environ.get("DOCKER_HOST", "")
    tls = c.DockerBackend.get("tls_cert_path") or ""
    return [a for n in nodes if isinstance(n, dict) and n.get("name")
            for a in ("--docker-url", f"{n['name']}={n.get('docker_url') or local}")
            ] + (["--docker-tls-cert-path", tls] if tls else [])


def wire_hub(c: Any, *, listen_ip: str, state_dir: str | Path,
             connect_ip: str | None = None,
             internal_ssl: bool = False,
             service_port: int = 0,
             servers_service_port: int = 0,
             culler: bool = True,
             culler_policies: str | Path | None = None,
             culler_port: int = 0,
             culler_every: int = 60,
             culler_timeout: int = 3600,
             culler_concurrency: int = 10,
             nvml: bool = False,
             dcgm_urls: Sequence[str] = (),
             gc_threshold: Sequence[int] | None = HUB_GC_THRESHOLD) -> Wiring:
    """Wire the gpuspawner service, the notebook-jobs listener and the idle culler into the hub
    configuration ``c`` (call it once, after ``c.GPUSpawner.nodes`` and ``backend`` are set:
    the culler's network signal is read from them).

    Args:
        c: the configuration (``get_config()``).
        listen_ip: an address of the hub machine that servers reach; the culler and the
            servers' notebook-jobs listener bind there (the hub API is set by the site itself:
            ``c.JupyterHub.hub_ip``).
        state_dir: gpuspawner's state folder (``c.GPUSpawner.state_dir``); the culler's log of
            culls (``culls.jsonl``) goes there and the culler runs in it.
        connect_ip: what servers are told for those two (default ``listen_ip``).
        internal_ssl: the hub runs with ``c.JupyterHub.internal_ssl``; the notebook-jobs
            listener is plain HTTP and stays off then (jobs are still submitted through
            the service's ``api/jobs`` with a user's token; docs/jobs.md).
        service_port: the service's loopback port (0: a free one).
        servers_service_port: the notebook-jobs listener's port on ``listen_ip`` (0: a free
            one).
        culler: add the idle culler service (``idle_culler``, ``/services/idle-culler/``).
        culler_policies: its policies file (default: ``hub_config/culler_policies.yaml`` of a
            checkout when present, else the culler's built-in default policy).
        culler_port: its port on ``listen_ip`` (0: a free one, fixed for this hub run).
        culler_every: seconds between culling passes.
        culler_timeout: default idle timeout in seconds (a policy file overrides it).
        culler_concurrency: at most this many hub API calls of the culler at a time.
        nvml: the culler reads GPU utilisation through NVML on this machine (``--nvml``: a
            hub machine that is also the GPU node).
        dcgm_urls: dcgm-exporter ``/metrics`` URLs of the GPU nodes (``--dcgm-url``), the GPU
            signal for nodes other than the hub's.
        gc_threshold: this hub process's garbage-collector thresholds (``gc.set_threshold``;
            :mod:`gpuspawner.hub.collector`: generation 0 at 10,000 allocations instead of 700,
            so a 1,000-server hub's request handlers no longer set off full collections that
            hold the event loop for half a second); None keeps Python's.

    Returns:
        :class:`Wiring`: the service and the URLs it set.

    Raises:
        ValueError: ``gc_threshold`` is not three integers >= 1 (nothing is set then).

    Sets (appending to lists and updating dicts already set): ``c.JupyterHub.services``,
    ``load_roles``, ``extra_user_scopes``, ``custom_scopes`` (through
    :func:`gpuspawner.hub.service.configure_service`), ``c.Spawner.server_token_scopes``
    (the culler's status and the service, beside JupyterHub's defaults or the site's),
    ``c.GPUSpawner.environment`` (``GPUSPAWNER_CULLER_URL``, ``GPUSPAWNER_SERVICE_URL``),
    ``c.JupyterHub.template_paths`` and ``template_vars`` (the home page's own usage figures,
    :mod:`gpuspawner.usage.home`).
    """
    connect_ip = connect_ip or listen_ip
    state_dir = Path(state_dir)
    if gc_threshold is not None:
        check_gc_threshold(gc_threshold, "wire_hub(gc_threshold=...)")
    service = configure_service(c, port=service_port)
    # the user's own GPU-hours this month and budgets on the hub's home page: after the
    # site's own template folders (a site's home.html wins), before JupyterHub's own
    if isinstance(c.JupyterHub.template_paths, list):  # the site's list
        c.JupyterHub.template_paths.append(str(HUB_TEMPLATES))
    else:  # JupyterHub's default list (its own folder) follows
        c.JupyterHub.template_paths.prepend([str(HUB_TEMPLATES)])
    c.JupyterHub.template_vars.update({"gpuspawner_usage": HomeFigures(hub_cluster)})
    environment: dict[str, str] = {}
    scopes = _server_token_scopes(c)
    culler_url = None
    if culler:
        port = culler_port or _free_port(listen_ip)
        culler_url = f"http://{listen_ip}:{port}"
        policies = culler_policies
        if policies is None:
            shipped = Path(__file__).resolve().parents[2] / "hub_config" / "culler_policies.yaml"
            policies = shipped if shipped.is_file() else None
        command = [sys.executable, "-m", "idle_culler",
                   *(["--policies", str(policies)] if policies else []),
                   "--cull-log", str(state_dir / "culls.jsonl"),
                   "--cull-every", str(culler_every),
                   "--timeout", str(culler_timeout),
                   "--concurrency", str(culler_concurrency),
                   *culler_docker_urls(c),
                   *(["--nvml"] if nvml else []),
                   *[a for u in dcgm_urls for a in ("--dcgm-url", u)],
                   # the wait queue (pressure_idle_timeout), on the service's loopback port
                   *(["--gpuspawner-url", service.url + service.prefix]
                     if service is not None else [])]
        c.JupyterHub.services.append({
            "name": "idle-culler", "url": culler_url, "command": command,
            "cwd": str(state_dir), "oauth_no_confirm": True})
        c.JupyterHub.load_roles.append({
            "name": "idle-culler",
            "description": "Cull idle servers (idle_culler/README.md)",
            "scopes": ["list:users", "read:users:activity", "read:users:groups",
                       "read:servers", "delete:servers", "admin:server_state",
                       # gpuspawner's wait queue and GPU models (culling under pressure)
                       "access:services!service=gpuspawner"],
            "services": ["idle-culler"]})
        # users may open the culler's page (their own servers' status) through hub OAuth
        c.JupyterHub.extra_user_scopes.add("access:services!service=idle-culler")
        # the Lab GPU panel shows this server's cull warning with the server's own token
        scopes.append("access:services!service=idle-culler")
        environment["GPUSPAWNER_CULLER_URL"] = (
            f"http://{connect_ip}:{port}/services/idle-culler/")
    service_url = None
    if service is not None and not internal_ssl:
        # jupyter-scheduler's UI in each server sends jobs here with the server's own token
        # (each request is checked with the hub; docs/jobs.md "From JupyterLab")
        jobs_port = service.listen_for_servers(listen_ip, servers_service_port)
        service_url = f"http://{connect_ip}:{jobs_port}{service.prefix}"
        environment["GPUSPAWNER_SERVICE_URL"] = service_url
        scopes.append("access:services!service=gpuspawner")
    elif service is not None:
        log.info("gpuspawner: internal_ssl is on; the plain-HTTP listener for servers' "
                 "notebook jobs stays off (docs/jobs.md)")
    c.Spawner.server_token_scopes = list(dict.fromkeys(scopes))
    c.GPUSpawner.environment.update(environment)
    if gc_threshold is not None:
        before, after = set_hub_gc_threshold(gc_threshold)
        log.info("garbage collector thresholds %s (were %s): gpuspawner.hub.collector",
                 after, before)
    return Wiring(service=service, culler_url=culler_url, service_url_for_servers=service_url)
