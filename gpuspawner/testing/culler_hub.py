"""A real JupyterHub + configurable-http-proxy on loopback for the idle-culler tests and
benchmark, without Docker.

Spawners (importable by the hub subprocess as ``gpuspawner.testing.culler_hub.<name>``):

- :class:`GPUTestSpawner`: a ``SimpleLocalProcessSpawner`` running the real
  ``jupyterhub-singleuser`` from this venv on 127.0.0.1, whose state carries a GPU allocation in
  GPUSpawner's shape (``state["allocation"]["gpus"][i]["uuid"]``) with the fake UUIDs of
  :func:`fake_gpu_uuid`, so the culler sees what it would see with GPUSpawner.
- :class:`CheapGPUSpawner`: no process at all; every "server" is answered by one tiny HTTP
  server inside the hub process (for the 1,000-server benchmark).

:class:`CullerHub` writes a config to a temporary directory (DummyAuthenticator, loopback ports,
an admin service token, optionally the culler as a hub-managed service) and runs the hub.
"""

from __future__ import annotations

import secrets
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .hubrunner import HubProcess, free_port

REPO = Path(__file__).resolve().parents[2]  #: the source checkout
CHP = REPO / "node_modules" / ".bin" / "configurable-http-proxy"

try:  # only inside the hub process (and wherever jupyterhub is installed)
    from jupyterhub.spawner import SimpleLocalProcessSpawner, Spawner
    from traitlets import Int
except ImportError:  # pragma: no cover
    SimpleLocalProcessSpawner = Spawner = object  # type: ignore[misc,assignment]


def fake_gpu_uuid(user: str, server: str = "", index: int = 0) -> str:
    """The deterministic fake GPU UUID of a test server's ``index``-th GPU."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{user}/{server}/{index}')}"


def _allocation(spawner: Any, n_gpus: int) -> dict[str, Any]:
    return {
        "id": f"test-{spawner.user.name}-{spawner.name}",
        "owner": {"user": spawner.user.name, "server": spawner.name,
                  "groups": sorted(g.name for g in spawner.user.groups)},
        "node": "local",
        "gpus": [{"uuid": fake_gpu_uuid(spawner.user.name, spawner.name, i), "milli": 1000}
                 for i in range(n_gpus)],
        "cpuset": "0", "mems": "0", "memory_bytes": 1 << 30,
    }


class GPUTestSpawner(SimpleLocalProcessSpawner):  # type: ignore[misc,valid-type]
    """The real jupyterhub-singleuser on 127.0.0.1, plus a fake GPU allocation in its state
    (``user_options["gpus"]`` GPUs, default 1)."""

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.pid:
            state["allocation"] = _allocation(self, int(self.user_options.get("gpus", 1)))
        return state

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
        return env


_shared_port: int | None = None


def _shared_server() -> int:
    """One HTTP server in the hub process answering 200 on every path (started once)."""
    global _shared_port
    if _shared_port is None:
        from tornado import web

        class Ok(web.RequestHandler):
            def get(self, *_: Any) -> None:
                self.finish({"ok": True})

        port = free_port()
        web.Application([(r"/(.*)", Ok)]).listen(port, "127.0.0.1")
        _shared_port = port
    return _shared_port


class CheapGPUSpawner(Spawner):  # type: ignore[misc,valid-type]
    """A spawner with no process: start returns the shared in-hub HTTP server's URL; poll says
    running until stopped. Carries a 1-GPU fake allocation in its state."""

    gpus = Int(1).tag(config=True)

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if getattr(self, "_running", False):
            state["allocation"] = _allocation(self, self.gpus)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self._running = bool(state.get("allocation"))

    async def start(self) -> tuple[str, int]:
        self._running = True
        return ("127.0.0.1", _shared_server())

    async def poll(self) -> int | None:
        return None if getattr(self, "_running", False) else 0

    async def stop(self, now: bool = False) -> None:
        self._running = False


HUB_CONFIG = """
import sys
sys.path.insert(0, {repo!r})
c = get_config()  # noqa
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_api_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.pid_file = "proxy.pid"
c.JupyterHub.db_url = "sqlite:///jupyterhub.sqlite"
c.JupyterHub.cookie_secret = bytes.fromhex({secret!r})
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {{"admin"}}
c.JupyterHub.allow_named_servers = True
c.JupyterHub.spawner_class = {spawner!r}
c.Spawner.ip = "127.0.0.1"
c.Spawner.start_timeout = 60
c.Spawner.http_timeout = 60
c.Spawner.default_url = "/api/status"
c.Spawner.args = ["--allow-root", "--ServerApp.open_browser=False"]
c.SimpleLocalProcessSpawner.home_dir_template = {home!r} + "/{{username}}"
c.JupyterHub.last_activity_interval = 3600
c.JupyterHub.concurrent_spawn_limit = 0
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0.05}}
c.JupyterHub.active_server_limit = 0
c.JupyterHub.services = [{{"name": "test-admin", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [
    {{"name": "test-admin", "services": ["test-admin"],
      "scopes": ["admin:users", "admin:groups", "admin:servers", "list:users", "read:users",
                 "users:activity", "tokens"]}},
]
{extra}
"""


class CullerHub(HubProcess):
    """A hub subprocess in ``state_dir`` (port numbers free on 127.0.0.1). ``spawner`` is the
    spawner class's import path; ``extra_config`` is Python appended to the config. The REST
    API is the hub's own port (not the proxy), as a hub-managed service sees it."""

    def __init__(self, state_dir: Path,
                 spawner: str = "gpuspawner.testing.culler_hub.GPUTestSpawner",
                 extra_config: str = "") -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        hub_api_port = free_port()
        super().__init__(state_dir, f"http://127.0.0.1:{port}",
                         f"http://127.0.0.1:{hub_api_port}/hub/api", secrets.token_hex(16))
        self.port = port
        self.hub_api_port = hub_api_port
        self.config.write_text(HUB_CONFIG.format(
            repo=str(REPO), port=port, hub_api_port=hub_api_port,
            proxy_api_port=free_port(), chp=str(CHP), secret=secrets.token_hex(32),
            spawner=spawner, token=self.token, extra=extra_config,
            home=str(state_dir / "home")))
        self.env["CONFIGPROXY_AUTH_TOKEN"] = secrets.token_hex(16)
        self.env["PYTHONPATH"] = f"{REPO}:{self.env.get('PYTHONPATH', '')}"

    def spawn(self, user: str, server: str = "", options: dict[str, Any] | None = None
              ) -> None:
        path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
        r = self.api("POST", path, options or {})
        assert r.status_code in (201, 202), r.text

    def activity(self, user: str, server: str = "", when: float | None = None) -> None:
        """Report activity of a server at ``when`` (epoch seconds; default now) through
        ``POST /users/{name}/activity`` (the hub only moves ``last_activity`` forward)."""
        from datetime import datetime, timezone

        ts = datetime.fromtimestamp(time.time() if when is None else when, timezone.utc)
        body = {"servers": {server: {"last_activity": ts.isoformat().replace("+00:00", "Z")}}}
        r = self.api("POST", f"/users/{user}/activity", body)
        assert r.status_code == 200, r.text

    def user_token(self, user: str) -> str:
        r = self.api("POST", f"/users/{user}/tokens", {"note": "culler test"})
        assert r.status_code in (200, 201), r.text
        return r.json()["token"]
