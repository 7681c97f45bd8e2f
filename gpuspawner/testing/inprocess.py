"""An in-process JupyterHub for spawner lifecycle tests that need no engine and no proxy:
pytest-jupyterhub's ``hub_app`` (jupyterhub.tests.mocking.MockHub: the hub's own application,
REST handlers, ``User`` objects and database, in the test's event loop) with GPUSpawner on the
fake engine (:class:`~gpuspawner.testing.fake_backend.FakeBackend`).

- :class:`MemoryProxy`: a JupyterHub proxy whose routing table is a dict (no
  configurable-http-proxy process): the hub adds and removes routes through the ``Proxy`` API
  as it would with the real one, and a test can read them.
- :func:`gpu_hub_config`: the configuration (a dict for ``hub_app(config=...)``).
- :func:`load_config_file`: what the shipped ``jupyterhub_config.py`` does at its end
  (:func:`~gpuspawner.hub.config_check.check_hub_config`), run where JupyterHub loads its
  configuration file, so the hub's start builds its one runtime the way ``jupyterhub`` does
  (:mod:`gpuspawner.hub.runtime`); MockHub loads no file.

Claims about the real process (the hub refusing to start from the command line, files and
modes it makes, the proxy's routes) stay with the real hub (:mod:`.hubrunner`).
"""

from __future__ import annotations

import asyncio
import inspect
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from jupyterhub import orm
from jupyterhub.proxy import Proxy
from sqlalchemy import event

from gpuspawner.hub import user_options
from gpuspawner.hub.config_check import check_hub_config

__all__ = ["FAKE_BACKEND", "MemoryProxy", "fake_node", "gpu_hub_config", "load_config_file",
           "reset_user_options_guard", "wait_for"]

#: ``c.GPUSpawner.backend`` of the fake engine
FAKE_BACKEND = "gpuspawner.testing.fake_backend.FakeBackend"


class MemoryProxy(Proxy):
    """A proxy that routes nothing: its table (:attr:`routes`, routespec -> route as
    ``get_all_routes`` returns it) lives in the hub process. ``should_start`` is False: the hub
    starts and stops no process."""

    should_start = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.routes: dict[str, dict[str, Any]] = {}

    async def add_route(self, routespec: str, target: str, data: dict[str, Any]) -> None:
        """Record the route (``routespec`` normalised as the real proxies do)."""
        routespec = self.validate_routespec(routespec)
        self.routes[routespec] = {"routespec": routespec, "target": target, "data": data}

    async def delete_route(self, routespec: str) -> None:
        """Forget the route; an unknown one is no error (as configurable-http-proxy)."""
        self.routes.pop(routespec, None)

    async def get_all_routes(self) -> dict[str, dict[str, Any]]:
        """Every route, by routespec."""
        return {k: dict(v) for k, v in self.routes.items()}


def fake_node(folder: Path, name: str, gpus: int = 2, model: str = "A100") -> dict[str, Any]:
    """A ``GPUSpawner.nodes`` entry whose topology file (docs/topology-files.md), written to
    ``folder/<name>.yaml``, has one NUMA node of 8 cores and 64 GiB, ``gpus`` whole GPUs of
    ``model`` with 80 GB each and 100 GB disk; GPU UUIDs ``GPU-<name>-<k>``.

    Raises:
        OSError: the file cannot be written.
    """
    topology = {
        "name": name, "disk": "100G",
        "numa_nodes": [{"id": 0, "cpus": "0-7", "memory": "64G"}],
        "gpus": [{"uuid": f"GPU-{name}-{k}", "index": k, "model": model, "memory": "80G",
                  "numa_node": 0} for k in range(gpus)],
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topology))
    return {"name": name, "topology": str(path)}


def gpu_hub_config(state_dir: Path, responder_port: int, nodes: list[dict[str, Any]],
                   profiles: list[dict[str, Any]], **gpuspawner: Any) -> dict[str, Any]:
    """The in-process hub's configuration: GPUSpawner (entry point ``gpu``) on the fake engine
    answered by the responder at 127.0.0.1:``responder_port``, :class:`MemoryProxy`, named
    servers allowed (5 per user, as the shipped config), ``state_dir`` for gpuspawner's state
    files; ``gpuspawner`` adds or overrides ``c.GPUSpawner.*`` settings.

    Args:
        state_dir: ``GPUSpawner.state_dir`` (made 0700 at start).
        responder_port: TCP port of :func:`~gpuspawner.testing.fake_backend.start_responder`.
        nodes: ``GPUSpawner.nodes`` (e.g. :func:`fake_node` entries).
        profiles: ``GPUSpawner.profiles``.
    """
    return {
        "JupyterHub": {"spawner_class": "gpu", "proxy_class": MemoryProxy,
                       "allow_named_servers": True, "named_server_limit_per_user": 5,
                       # (MockHub would write a cookie secret file in the working folder)
                       "cookie_secret": secrets.token_bytes(32),
                       # a spawn's outcome (201, 400, 500) is the POST's answer, not a 202,
                       # unless it takes 30 s (the default, 10 s, on a loaded test machine)
                       "tornado_settings": {"slow_spawn_timeout": 30}},
        "Spawner": {"http_timeout": 10, "start_timeout": 20},
        "GPUSpawner": {"backend": FAKE_BACKEND, "state_dir": str(state_dir), "nodes": nodes,
                       "profiles": profiles, **gpuspawner},
        "FakeBackend": {"responder_port": responder_port},
    }


def load_config_file(self: Any, *args: Any, **kwargs: Any) -> None:
    """A ``JupyterHub.load_config_file`` for MockHub (whose own loads nothing; set it with
    ``monkeypatch.setattr(MockHub, "load_config_file", load_config_file)``): the shipped
    configuration file's last step, :func:`~gpuspawner.hub.config_check.check_hub_config` of
    the application's configuration, called where and as ``jupyterhub`` calls it (a frame
    named ``load_config_file`` whose ``self`` is the hub), so the check of the final
    configuration and the build of the hub's one runtime run at the hub's ``init_logging``
    (:func:`gpuspawner.hub.runtime.at_hub_start`).

    Raises:
        SystemExit: later, at ``init_logging``, naming the wrong setting (``jupyterhub``
            stops there the same way).
    """
    check_hub_config(self.config)


def reset_user_options_guard() -> None:
    """Remove the ``user_options`` guard (:mod:`gpuspawner.hub.user_options`): it is
    registered once per process with the first GPUSpawner's profiles, and a test process
    makes hubs with other profiles; the next GPUSpawner made registers it anew with its own."""
    listener = user_options._installed.pop("listener", None)
    if listener is not None and event.contains(orm.Spawner.user_options, "set", listener):
        event.remove(orm.Spawner.user_options, "set", listener)
    user_options._installed.clear()


async def wait_for(condition: Callable[[], Any], timeout: float, interval: float = 0.05,
                   message: str | Callable[[], str] = "condition") -> Any:
    """:func:`gpuspawner.testing.waiting.wait_until` for the in-process hub's event loop:
    call ``condition`` (a function or a coroutine function) until it returns a truthy value
    (returned), at most ``timeout`` seconds, letting the loop run ``interval`` seconds
    between calls.

    Raises:
        AssertionError: the deadline passed; the text is ``message`` (or its result).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"not met within {timeout:g} s: {text}")
        await asyncio.sleep(interval)
