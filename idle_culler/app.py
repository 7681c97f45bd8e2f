"""The ``idle-culler`` application (traitlets), run as a JupyterHub-managed service.

Flags shared with jupyterhub-idle-culler 2.x keep their names and meanings: ``--timeout``,
``--max-age``, ``--cull-every``, ``--concurrency``, ``--cull-users``,
``--remove-named-servers``, ``--api-page-size``, ``--url``. ``--timeout`` and ``--max-age``
are the global values when the policies file's ``global`` entry does not set them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from textwrap import dedent
from typing import Any
from urllib.parse import urlparse

from traitlets import Bool, Dict, Float, Int, List, Unicode, default
from traitlets.config import Application

from . import __version__
from .api import make_app
from .core import Culler
from .gpu import GPUHistory, NVMLSampler, PrometheusSource
from .hub import HubClient, internal_ssl_context
from .metrics import Metrics
from .netstats import NetworkMeter, docker_reader
from .policies import OVERRIDES_FILE_NAME, PolicySet


class IdleCuller(Application):
    """Culls idle JupyterHub servers by activity, GPU utilisation and age, per policy."""

    name = "idle-culler"
    version = __version__
    description = __doc__

    aliases = {
        "timeout": "IdleCuller.timeout",
        "max-age": "IdleCuller.max_age",
        "cull-every": "IdleCuller.cull_every",
        "concurrency": "IdleCuller.concurrency",
        "api-page-size": "IdleCuller.api_page_size",
        "url": "IdleCuller.url",
        "policies": "IdleCuller.policies_file",
        "overrides": "IdleCuller.overrides_file",
        "gpuspawner-url": "IdleCuller.gpuspawner_url",
        "queue-timeout": "IdleCuller.queue_timeout",
        "exempt-users": "IdleCuller.exempt_users",
        "cull-log": "IdleCuller.cull_log",
        "dcgm-url": "IdleCuller.dcgm_urls",
        "dcgm-interval": "IdleCuller.dcgm_interval",
        "nvml-interval": "IdleCuller.nvml_interval",
        "docker-url": "IdleCuller.docker_urls",
        "docker-tls-cert-path": "IdleCuller.docker_tls_cert_path",
        "retries": "IdleCuller.retries",
        "backoff": "IdleCuller.backoff",
        "config": "IdleCuller.config_file",
        "log-level": "Application.log_level",
    }
    flags = {
        "cull-users": ({"IdleCuller": {"cull_users": True}},
                       "Also delete users whose servers were all culled (not admins)."),
        "remove-named-servers": ({"IdleCuller": {"remove_named_servers": True}},
                                 "Remove culled named servers, not only stop them."),
        "dry-run": ({"IdleCuller": {"dry_run": True}},
                    "Report what would be culled; cull nothing."),
        "once": ({"IdleCuller": {"once": True}}, "Run one pass and exit."),
        "nvml": ({"IdleCuller": {"nvml": True}},
                 "Sample GPU utilisation with NVML on this node."),
        "no-web": ({"IdleCuller": {"web": False}}, "Do not serve the web API."),
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Debug logging."),
    }

    timeout = Float(3600, help=dedent("""
        Global idle timeout (seconds) where the policies file's global entry sets none.
        0 = no idle culling.""")).tag(config=True)
    max_age = Float(0, help="Global max age (seconds) where the file sets none; 0 = off."
                    ).tag(config=True)
    cull_every = Float(0, help="Seconds between passes (default: timeout // 2, at most 300)."
                       ).tag(config=True)
    concurrency = Int(10, help="Hub API requests in flight at most.").tag(config=True)
    cull_users = Bool(False, help="Delete users whose servers were all culled.").tag(config=True)
    remove_named_servers = Bool(False, help="Remove culled named servers.").tag(config=True)
    api_page_size = Int(0, help="Users per /users page (0 = the hub's default)."
                        ).tag(config=True)
    url = Unicode(help="Hub API URL (default $JUPYTERHUB_API_URL).").tag(config=True)
    api_token = Unicode(help="Hub API token (default $JUPYTERHUB_API_TOKEN).").tag(config=True)
    policies_file = Unicode("", help="YAML policy file (see idle_culler/README.md), the shipped "
                            "policies; only read (admins' changes go to --overrides)."
                            ).tag(config=True)
    overrides_file = Unicode("", help=dedent(f"""
        YAML file holding admins' policy changes through the web API (mode 0600), merged over
        --policies at start and after each change; the policies file itself is never
        written. Default: {OVERRIDES_FILE_NAME} in the folder of --cull-log (the service's
        state folder) when one is given, else in the working directory.""")).tag(config=True)
    gpuspawner_url = Unicode(help=dedent("""
        URL of the gpuspawner service, e.g. http://127.0.0.1:8000/services/gpuspawner/ (through
        the proxy) or its own loopback URL and prefix: its wait queue (api/queue) and GPU
        models (api/nodes) drive pressure_idle_timeout. Default: from
        $JUPYTERHUB_PUBLIC_HUB_URL when the hub sets it, else none (never culled early).
        The culler's token needs access:services!service=gpuspawner.""")).tag(config=True)
    queue_timeout = Float(10.0, help="Seconds to wait for the queue (one try; a failure "
                          "means no pressure this pass).").tag(config=True)
    exempt_users = List(Unicode(), help=dedent("""
        Users never culled, whatever the policy file says (their effective policy's
        exempt has source cli). The shipped hub configuration passes the demo's admin here
        only while the hub runs the demo authenticator (gpuspawner/hub/demo.py); with any
        other authenticator nobody is exempt unless the policies say so.""")).tag(config=True)
    cull_log = Unicode("", help="JSON-lines file, one line per cull.").tag(config=True)
    dry_run = Bool(False, help="Decide and report, cull nothing.").tag(config=True)
    once = Bool(False, help="One pass, then exit.").tag(config=True)
    nvml = Bool(False, help="Sample GPU utilisation with NVML on this node.").tag(config=True)
    nvml_interval = Float(5.0, help="Seconds between NVML samples.").tag(config=True)
    dcgm_urls = List(Unicode(), help="dcgm-exporter /metrics URLs (DCGM_FI_DEV_GPU_UTIL)."
                     ).tag(config=True)
    dcgm_interval = Float(15.0, help="Seconds between dcgm-exporter scrapes.").tag(config=True)
    docker_urls = Dict(help=dedent("""
        Node name -> Docker engine URL ("" = local) for network bytes from the Docker stats API
        (only for servers on a bridge network; on the command line: --docker-url NODE=URL,
        repeated). The container and node come from GPUSpawner's server state. Empty: no
        network signal. Slurm servers never have one (a job shares its node's network).""")
                       ).tag(config=True)
    docker_tls_cert_path = Unicode("", help=dedent("""
        Folder with ca.pem, cert.pem and key.pem for the tcp:// and https:// engines of
        docker_urls (as c.DockerBackend.tls_cert_path): mutual TLS, the engine verified
        against ca.pem.""")).tag(config=True)
    retries = Int(4, help="Retries of a failed hub API request (exponential backoff)."
                  ).tag(config=True)
    backoff = Float(0.5, help="First retry delay (seconds); doubles each retry, max 10 s."
                    ).tag(config=True)
    web = Bool(True, help="Serve the web API on $JUPYTERHUB_SERVICE_URL.").tag(config=True)
    config_file = Unicode("idle_culler_config.py", help="traitlets config file."
                          ).tag(config=True)

    @default("log_level")
    def _log_level(self) -> int:
        return logging.INFO

    @default("url")
    def _url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("gpuspawner_url")
    def _gpuspawner_url(self) -> str:
        hub = os.environ.get("JUPYTERHUB_PUBLIC_HUB_URL", "")  # https://host/base/hub/
        if not hub:
            return ""
        return hub.rstrip("/").removesuffix("/hub") + "/services/gpuspawner/"

    @default("api_token")
    def _token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def overrides_path(self) -> str:
        """The overrides file, absolute: ``overrides_file``, else
        :data:`~idle_culler.policies.OVERRIDES_FILE_NAME` beside ``cull_log`` (the service's
        state folder; ``hub_config`` puts it in the hub's) or in the working directory."""
        if self.overrides_file:
            return os.path.abspath(self.overrides_file)
        folder = os.path.dirname(os.path.abspath(self.cull_log)) if self.cull_log else "."
        return os.path.abspath(os.path.join(folder, OVERRIDES_FILE_NAME))

    def build(self) -> Culler:
        """The :class:`Culler` with its sources, from this configuration."""
        base: dict[str, Any] = {"idle_timeout": self.timeout, "max_age": self.max_age}
        self.policies = PolicySet.load(self.policies_file or None, base,
                                       overrides=self.overrides_path())
        self.policies.exempt_users = frozenset(self.exempt_users)
        self.metrics = Metrics()
        self.history = GPUHistory()
        network = NetworkMeter(docker_reader(self.docker_urls, self.docker_tls_cert_path)
                               ) if self.docker_urls else None
        self.hub = HubClient(self.url, self.api_token, self.concurrency, self.retries,
                             self.backoff, ssl_context=internal_ssl_context())
        self.culler = Culler(self.hub, self.policies, history=self.history, network=network,
                             dry_run=self.dry_run, cull_users=self.cull_users,
                             remove_named_servers=self.remove_named_servers,
                             page_size=self.api_page_size, cull_log=self.cull_log or None,
                             metrics=self.metrics,
                             gpuspawner_url=self.gpuspawner_url or None,
                             queue_timeout=self.queue_timeout)
        return self.culler

    async def run(self) -> None:
        culler = self.build()
        sources: list[Any] = []
        if self.nvml:
            s = NVMLSampler(self.history, self.nvml_interval,
                            uuids=lambda: sorted(culler.seen_gpus))
            if s.start():
                sources.append(s)
        if self.dcgm_urls:
            p = PrometheusSource(self.history, list(self.dcgm_urls), self.dcgm_interval)
            await p.scrape_once()
            p.start()
            sources.append(p)
        if self.once:
            await culler.run_pass()
            for s in sources:
                s.stop()
            return
        server = None
        if self.web and os.environ.get("JUPYTERHUB_SERVICE_URL"):
            u = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
            prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/idle-culler/")
            server = make_app(culler, prefix, self.metrics).listen(
                u.port or 80, u.hostname or "127.0.0.1")
            self.log.info("web API on %s%s", os.environ["JUPYTERHUB_SERVICE_URL"], prefix)
        every = self.cull_every or min(300.0, max(1.0, self.timeout // 2))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.log.info("culling every %.0fs%s", every, " (dry run)" if self.dry_run else "")
        while not stop.is_set():
            try:
                await culler.run_pass()
            except Exception:
                self.log.exception("pass failed")
            try:
                await asyncio.wait_for(stop.wait(), every)
            except asyncio.TimeoutError:
                pass
        for s in sources:
            s.stop()
        if server is not None:
            server.stop()

    def start(self) -> None:
        if self.config_file and os.path.exists(self.config_file):
            self.load_config_file(self.config_file)
        if not self.api_token:
            self.exit("no hub API token: set $JUPYTERHUB_API_TOKEN (a hub-managed service "
                      "gets one)")
        logging.getLogger("idle_culler").setLevel(self.log_level)
        if not logging.getLogger("idle_culler").handlers:
            logging.basicConfig(format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")
        asyncio.run(self.run())
