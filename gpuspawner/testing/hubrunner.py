"""Run a real JupyterHub (with configurable-http-proxy) from hub_config/jupyterhub_config.py in
a subprocess on loopback ports, and talk to its REST API. Used by the docker-marked tests."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from .waiting import wait_until

REPO = Path(__file__).resolve().parents[2]  #: the source checkout
CONFIG = REPO / "hub_config" / "jupyterhub_config.py"


#: the ids of the hubs this process started (:mod:`gpuspawner.hub.hub_id`): tests that look
#: for engine objects keep only these hubs' (:func:`own`), since other test modules run
#: their own hubs on the same engine at the same time (``make test`` runs modules in parallel)
STARTED_HUB_IDS: set[str] = set()


def own(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine objects (containers or networks, as ``docker.APIClient`` lists them) made by
    a hub this process started: their ``gpuspawner.hub`` label is in :data:`STARTED_HUB_IDS`."""
    return [o for o in objects
            if (o.get("Labels") or {}).get("gpuspawner.hub") in STARTED_HUB_IDS]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HubProcess:
    """A JupyterHub subprocess on loopback ports and its REST API (``api_url``, with the admin
    service ``token``). Subclasses write the config and set ``env`` before :meth:`start`."""

    #: extra command-line arguments of ``jupyterhub``
    args: tuple[str, ...] = ()

    def __init__(self, state_dir: Path, url: str, api_url: str, token: str) -> None:
        self.state_dir = state_dir
        self.url = url
        self.api_url = api_url
        self.token = token
        self.config = state_dir / "jupyterhub_config.py"
        self.log_path = state_dir / "hub.log"
        self.env = dict(os.environ)
        self.proc: subprocess.Popen | None = None
        self.session = requests.Session()

    def start(self, timeout: float = 60) -> None:
        """Start the hub and wait until its API answers. Raises RuntimeError with the log's
        tail when it exits or does not answer in ``timeout`` seconds."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.config), *self.args],
            cwd=self.state_dir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                # the API, and the hub's route in the proxy: a hub whose API port is its own
                # answers before the proxy routes /hub/ to it (a login right after start
                # met the proxy's 404)
                if requests.get(f"{self.api_url}/", timeout=2).status_code == 200 and \
                        requests.get(f"{self.url}/hub/api/", timeout=2).status_code == 200:
                    self._note_hub_id()
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"hub did not answer in {timeout}s:\n{self.tail()}")

    def _note_hub_id(self) -> None:
        state = Path(self.env.get("GPUSPAWNER_STATE_DIR") or self.state_dir / "hub")
        try:
            STARTED_HUB_IDS.add((state / "gpuspawner-hub-id").read_text().strip())
        except OSError:
            pass  # a hub without gpuspawner state (e.g. DockerSpawner's)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM the hub's process group (GPUSpawner servers keep running:
        cleanup_servers is False in hub_config)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # -- REST ----------------------------------------------------------------------------------
    def api(self, method: str, path: str, body: Any = None, timeout: float = 60,
            token: str | None = None) -> requests.Response:
        headers = {"Authorization": f"token {token or self.token}"}
        data = None if body is None else json.dumps(body)
        return self.session.request(method, f"{self.api_url}{path}", data=data,
                                    headers=headers, timeout=timeout)

    def progress(self, user: str, server: str = "", until: str = "",
                 timeout: float = 30) -> list[str]:
        """The messages of a spawn's progress event stream (JupyterHub's progress API), read
        until one contains ``until``."""
        path = f"/users/{user}/servers/{server}/progress" if server else \
            f"/users/{user}/server/progress"
        out: list[str] = []
        with self.session.get(f"{self.api_url}{path}", stream=True, timeout=timeout,
                              headers={"Authorization": f"token {self.token}"}) as r:
            assert r.status_code == 200, r.text
            for line in r.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    out.append(json.loads(line[5:]).get("message", ""))
                    if until in out[-1]:
                        break
        return out

    def ensure_user(self, name: str, groups: tuple[str, ...] = ()) -> None:
        r = self.api("POST", f"/users/{name}")
        assert r.status_code in (201, 409), r.text
        for g in groups:
            r = self.api("POST", f"/groups/{g}")
            assert r.status_code in (201, 409), r.text
            r = self.api("POST", f"/groups/{g}/users", {"users": [name]})
            assert r.status_code == 200, r.text

    def form_login(self, name: str, password: str = "gpuspawner"
                   ) -> tuple[requests.Session, requests.Response]:
        """Post the hub's login form as a browser would; returns the session (cookies) and
        the answer to the POST, whatever its status."""
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=30)
        r = s.post(f"{self.url}/hub/login", data={"username": name, "password": password,
                                                  "_xsrf": s.cookies.get("_xsrf")}, timeout=30)
        return s, r

    def login(self, name: str, password: str = "gpuspawner") -> requests.Session:
        """Log in through the login form (asserting it worked); returns the session."""
        s, r = self.form_login(name, password)
        assert r.status_code == 200, r.text[:300]
        return s

    def server(self, user: str, server: str = "") -> dict[str, Any] | None:
        """The user's server model, or None when it does not exist."""
        model = self.api("GET", f"/users/{user}").json()
        return (model.get("servers") or {}).get(server)

    def wait_ready(self, user: str, server: str = "", timeout: float = 90) -> dict[str, Any]:
        """The server model once ready. Raises AssertionError when it is gone or not ready
        within ``timeout`` seconds."""
        def ready() -> dict[str, Any] | None:
            s = self.server(user, server)
            if not s or (not s.get("pending") and not s.get("ready")):
                raise AssertionError(f"server {user}/{server} is gone: {s}\n{self.tail()}")
            return s if s.get("ready") else None

        return wait_until(ready, timeout, 0.3, f"server {user}/{server} ready")

    def wait_stopped(self, user: str, server: str = "", timeout: float = 60) -> None:
        wait_until(lambda: self.server(user, server) is None, timeout, 0.3,
                   f"server {user}/{server} gone")


class Hub(HubProcess):
    """The project's hub_config with GPUSpawner. ``nodes`` and ``profiles`` are written to
    YAML files the config reads (GPUSPAWNER_NODES_FILE / GPUSPAWNER_PROFILES_FILE);
    ``extra_config`` is Python appended to a wrapper config that loads hub_config first."""

    args = ("--debug",)

    def __init__(self, state_dir: Path, nodes: list[dict[str, Any]],
                 profiles: list[dict[str, Any]], extra_config: str = "") -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        super().__init__(state_dir, url, f"{url}/hub/api", secrets.token_hex(16))
        self.port = port
        (state_dir / "nodes.yaml").write_text(yaml.safe_dump(nodes))
        (state_dir / "profiles.yaml").write_text(yaml.safe_dump(profiles))
        # the extra settings are checked too, as the last lines of a site's config would be
        self.config.write_text(f"load_subconfig({str(CONFIG)!r})\n{extra_config}\n"
                               "from gpuspawner.hub.config_check import check_hub_config\n"
                               "check_hub_config(c)\n")
        self.env.update({
            "GPUSPAWNER_STATE_DIR": str(state_dir / "hub"),
            "GPUSPAWNER_HUB_PORT": str(port),
            "GPUSPAWNER_HUB_API_PORT": str(free_port()),
            "GPUSPAWNER_PROXY_API_PORT": str(free_port()),
            "GPUSPAWNER_NODES_FILE": str(state_dir / "nodes.yaml"),
            "GPUSPAWNER_PROFILES_FILE": str(state_dir / "profiles.yaml"),
            "GPUSPAWNER_API_TOKEN": self.token,
            "CONFIGPROXY_AUTH_TOKEN": secrets.token_hex(16),
        })
