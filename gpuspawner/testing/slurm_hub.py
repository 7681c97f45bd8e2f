"""A real JupyterHub on loopback whose GPUSpawner runs servers as Slurm jobs on the private
cluster of ``scripts/slurm.sh`` (``make slurm``): :class:`SlurmHub` (with ``jobs=True`` also
the gpuspawner service and its notebook jobs, run by the nodes' :func:`job_python`), the job
users (:data:`USER`, :data:`OTHER`) and a stand-in server program (:data:`SERVER`);
:func:`real_singleuser` (the real jupyterhub-singleuser as the job user runs it) and
:func:`running` (a started hub, its servers, the hub and its home cleaned up after)."""

from __future__ import annotations

import pwd
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .hubrunner import HubProcess, free_port

REPO = Path(__file__).resolve().parents[2]  #: the source checkout

#: the server: binds the address of JUPYTERHUB_SERVICE_URL as jupyterhub-singleuser does, and
#: answers every GET with what it sees (a Jupyter-like JSON with "version")
SERVER = r"""
import http.server, json, os, urllib.parse
url = urllib.parse.urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({
            "version": "test", "path": self.path, "uid": os.getuid(), "cwd": os.getcwd(),
            "cpus": sorted(os.sched_getaffinity(0)),
            "env": {k: os.environ.get(k) for k in ("TRICKY", "HOME", "GPUSPAWNER_PORT",
                    "GPUSPAWNER_ALLOCATION", "GPS_HUB_SECRET", "JUPYTERHUB_SERVICE_URL",
                    "FROM_PROLOGUE")},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
print("serving on", url.hostname, url.port, flush=True)
http.server.HTTPServer((url.hostname, url.port), H).serve_forever()
"""


USER = "gpsuser1"
OTHER = "gpsuser2"


def job_python() -> str | None:
    """The nodes' Python for notebook jobs (papermill, ipykernel, nbconvert) that
    ``scripts/slurm-jobenv.sh`` makes in var/slurm/jobenv, or None when it is not there."""
    for base in (REPO, Path("/work/main")):
        path = base / "var" / "slurm" / "jobenv" / "bin" / "python"
        if path.exists():
            return str(path)
    return None


def chp() -> str | None:
    for base in (REPO, Path("/work/main")):
        path = base / "node_modules" / ".bin" / "configurable-http-proxy"
        if path.exists():
            return str(path)
    return shutil.which("configurable-http-proxy")


#: the real server: jupyterhub-singleuser in the nodes' system Python (3.11, the hub's own)
SINGLEUSER_CMD = ["/usr/bin/python3", "-m", "jupyterhub.singleuser"]


def real_singleuser() -> dict[str, Any] | None:
    """:class:`SlurmHub`'s ``cmd`` and ``environment`` for the real jupyterhub-singleuser, run
    by the job user with the system Python and the hub's site-packages on ``PYTHONPATH`` (the
    hub's own interpreter lives under /root, which the job user cannot enter); None where the
    hub's site-packages have no jupyterhub or there is no /usr/bin/python3."""
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" \
        / "site-packages"
    if not (site / "jupyterhub").is_dir() or not Path(SINGLEUSER_CMD[0]).exists():
        return None
    return {"cmd": list(SINGLEUSER_CMD), "environment": {"PYTHONPATH": str(site)}}


class SlurmHub(HubProcess):
    """A hub on loopback whose GPUSpawner runs servers as Slurm jobs."""

    def __init__(self, state_dir: Path, conf: str, cmd: list[str] | None = None,
                 environment: dict[str, str] | None = None, internal_ssl: bool = False,
                 profiles: list[dict] | None = None, extra: str = "",
                 jobs: bool = False) -> None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        super().__init__(state_dir, url, f"{url}/hub/api", secrets.token_hex(16))
        topo = REPO / "hub_config" / "slurm"
        nodes = [{"name": n, "topology": str(topo / f"{n}.yaml"), "host": "127.0.0.1"}
                 for n in ("node1", "node2")]
        profiles = profiles or [
            {"slug": "gpu1", "display_name": "1 GPU", "cpu": 1, "memory": "256M", "gpus": 1,
             "nodes": ["node1"], "default": True},
            {"slug": "gpu2", "display_name": "2 GPUs", "cpu": 2, "memory": "256M", "gpus": 2,
             "nodes": ["node1"]}]
        ids = {u: {"uid": pwd.getpwnam(u).pw_uid, "gid": pwd.getpwnam(u).pw_gid}
               for u in (USER, OTHER)}
        # job users must reach their homes: not under pytest's tmp_path (0700 root)
        home = Path(tempfile.mkdtemp(prefix="gps-slurmhub-", dir="/tmp"))
        home.chmod(0o1777)  # users make their own home in it (the job does), as in /tmp
        # the jobs' output: root's folder of the users' 0700 folders (SlurmBackend.output_dir)
        output_dir = home / "slurm-output"
        output_dir.mkdir()
        output_dir.chmod(0o711)
        self.config.write_text(f"""
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = {url!r}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "{'https' if internal_ssl else 'http'}://127.0.0.1:{free_port()}"
c.JupyterHub.internal_ssl = {internal_ssl!r}
c.SlurmBackend.allow_plain_http = {not internal_ssl!r}
c.JupyterHub.internal_certs_location = "{home}/internal-ssl"
c.ConfigurableHTTPProxy.command = [{chp()!r}]
# with internal_ssl a route accepts only its own server's certificate (gpuspawner.hub.proxy)
c.JupyterHub.proxy_class = "gpuspawner.hub.proxy.GPUProxy"
c.ConfigurableHTTPProxy.auth_token = {secrets.token_hex(16)!r}
c.JupyterHub.db_url = "sqlite:///{state_dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{state_dir}/cookie_secret"
c.JupyterHub.pid_file = "{state_dir}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{state_dir}/proxy.pid"
c.JupyterHub.cleanup_servers = False
c.JupyterHub.spawner_class = "gpu"
c.GPUSpawner.backend = "slurm"
c.GPUSpawner.nodes = {nodes!r}
c.GPUSpawner.profiles = {profiles!r}
c.GPUSpawner.cmd = {cmd or ["/usr/bin/python3", "-c", SERVER]!r}
c.GPUSpawner.environment = {environment or {}!r}
c.GPUSpawner.uid_map = {ids!r}
c.GPUSpawner.home_path_template = "{home}/{{username}}"
c.GPUSpawner.http_timeout = 60
c.GPUSpawner.start_timeout = 120
c.GPUSpawner.poll_interval = 2
c.SlurmBackend.slurm_conf = {conf!r}
c.SlurmBackend.python = "/usr/bin/python3"
c.SlurmBackend.output_dir = "{output_dir}"
c.SlurmBackend.submit_timeout = 40
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.services = [{{"name": "admin", "api_token": {self.token!r}}}]
c.JupyterHub.load_roles = [{{"name": "admin-svc", "services": ["admin"], "scopes": [
    "admin:users", "admin:servers", "list:users", "read:users", "access:servers"]}}]
""" + (self._jobs_config() if jobs else "") + extra)
        self.home = home
        self.output_dir = output_dir

    def _jobs_config(self) -> str:
        """The gpuspawner service (its api/jobs) with notebook jobs run by the nodes'
        :func:`job_python`; the admin service may make users' tokens; the runner's log lines
        go to hub.log."""
        return f"""
from gpuspawner.hub.service import configure_service
configure_service(c)
for _r in c.JupyterHub.load_roles:
    if _r.get("name") == "admin-svc":
        _r["scopes"] = list(_r["scopes"]) + ["tokens", "access:services"]
c.SlurmBackend.job_python = {job_python() or "/usr/bin/python3"!r}
c.SlurmBackend.stop_timeout = 15
c.GPUJobs.poll_interval = 0.5
c.GPUJobs.retry_backoff = 0.5
import logging as _logging
_logging.getLogger("gpuspawner").addHandler(_logging.StreamHandler())
_logging.getLogger("gpuspawner").setLevel(_logging.INFO)
"""


@contextmanager
def running(hub: SlurmHub, users: Iterable[str] = (USER, OTHER)) -> Iterator[SlurmHub]:
    """Start ``hub``; on leaving, stop the servers (named ones too) that ``users`` still have
    and wait for each to be gone (its Slurm job cancelled before the next test takes the
    GPUs), then stop the hub and remove its home folder, whatever failed before."""
    hub.start()
    try:
        yield hub
    finally:
        try:
            left = []
            for user in users:
                r = hub.api("GET", f"/users/{user}")
                if r.status_code != 200:
                    continue  # no such user
                for name in r.json().get("servers") or {}:
                    path = f"/users/{user}/servers/{name}" if name else \
                        f"/users/{user}/server"
                    hub.api("DELETE", path)
                    left.append((user, name))
            for user, name in left:
                hub.wait_stopped(user, name)
        finally:
            hub.stop()
            shutil.rmtree(hub.home, ignore_errors=True)
