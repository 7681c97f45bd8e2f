"""Test doubles for benchmarks/hub_scale.py: a fake engine that "runs" thousands of user servers
at no cost, behind both spawners the benchmark compares.

- :class:`FakeBackend`: a gpuspawner :class:`~gpuspawner.backends.base.Backend` (configured as
  ``c.GPUSpawner.backend = "benchmarks.fake_backend.FakeBackend"``, its settings as
  ``c.FakeBackend.*``). GPUSpawner's own code runs unchanged (options check, queue, ledger
  reservation, launch spec, its readiness check, state) down to this interface.
- :class:`FakeDockerSpawner`: DockerSpawner 14 with docker-py's ``APIClient`` replaced by
  :class:`FakeDockerClient`. DockerSpawner's own code runs unchanged (image check, create, start,
  port lookup, poll by inspect, stop and remove, its one-thread executor) down to docker-py.
- :func:`serve_responder` (``python benchmarks/fake_backend.py --port-file F``): one HTTP
  server on 127.0.0.1 that answers every path with a Jupyter server's ``GET /api`` body
  (``{"version": ...}``). Every fake server of both spawners is this one process, reached at its
  own path (``/user/<name>/``): it satisfies GPUSpawner's readiness check
  (:func:`gpuspawner.hub.readiness.wait_for_own_server`: ``{base_url}api`` answers JSON with a
  ``version``) and JupyterHub's (any HTTP answer below 500 at the server's URL).

Neither double touches a Docker engine or starts a process per server. The fake engine's record
of what runs lives in the hub process (one dict per double), as a real engine's would live in
the engine: :meth:`FakeBackend.list_managed` and ``inspect_container`` read it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jupyterhub
from docker.errors import NotFound
from docker.types import HostConfig
from dockerspawner import DockerSpawner
from requests import Response
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from traitlets import Int, Unicode

from gpuspawner.backends.base import Backend, Managed, Progress, ServerRef
from gpuspawner.backends.spec import LaunchSpec
from gpuspawner.placement import Allocation

__all__ = ["RESPONDER_BODY", "FakeBackend", "FakeDockerClient", "FakeDockerSpawner",
           "responder_app", "serve_responder"]

#: what the responder answers on every path: a Jupyter server's ``GET /api``
RESPONDER_BODY = b'{"version": "2.14.2"}'


class FakeBackend(Backend):
    """A :class:`~gpuspawner.backends.base.Backend` whose servers are all the one loopback
    responder (:func:`serve_responder`) at ``responder_host:responder_port``.

    ``launch`` records the server in an in-memory table (the fake engine) and returns the
    responder's address at once; ``poll`` answers from that table (None while recorded, else 0);
    ``stop``/``cleanup`` drop the record; ``list_managed`` lists the records (empty in a new hub
    process: nothing survives a restart, as with an engine that was wiped). State stored in the
    hub's database: ``{"fake_id": "<handle>", "node": "<node>"}``.
    """

    backend_name = "fake"

    responder_host = Unicode("127.0.0.1", help="Address of the shared responder.").tag(
        config=True)
    responder_port = Int(0, help="Port of the shared responder (required).").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: handle -> what the fake engine runs
        self.running: dict[str, Managed] = {}
        #: handle -> owner labels (user, server)
        self.owners: dict[str, dict[str, str]] = {}
        self._ids = itertools.count(1)

    def check_config(self) -> None:
        """Raises ValueError: ``FakeBackend.responder_port`` is not set."""
        if not 0 < self.responder_port < 65536:
            raise ValueError(f"FakeBackend.responder_port: {self.responder_port} is not a "
                             "port (set it to the responder's)")

    @property
    def listen_ip(self) -> str:
        return self.responder_host

    async def launch(self, spec: LaunchSpec, state: dict[str, Any], progress: Progress
                     ) -> tuple[str, int]:
        """Record the server; returns the responder's (ip, port)."""
        handle = f"fake-{next(self._ids):06d}"
        alloc: Allocation = spec.allocation
        self.running[handle] = Managed(alloc.node, alloc.to_json(), handle)
        self.owners[handle] = {"gpuspawner.user": spec.user, "gpuspawner.server": spec.server}
        state["fake_id"] = handle
        state["node"] = alloc.node
        progress(50, f"fake server {handle} recorded on {alloc.node}")
        return self.responder_host, self.responder_port

    async def exit_report(self, state: Any) -> str | None:
        handle = state.get("fake_id", "")
        return None if handle in self.running else f"fake server {handle!r} is gone"

    async def poll(self, state: Any) -> int | None:
        return None if state.get("fake_id", "") in self.running else 0

    async def stop(self, state: Any, now: bool = False) -> None:
        self._drop(state.get("fake_id", ""))

    async def cleanup(self, alloc: Allocation | None, state: Any) -> None:
        self._drop(state.get("fake_id", ""))

    async def remove_server(self, node: str, server: ServerRef) -> None:
        for handle, labels in list(self.owners.items()):
            if server.owns(labels) and self.running[handle].node == node:
                self._drop(handle)

    async def list_managed(self) -> list[Managed]:
        return list(self.running.values())

    async def remove_managed(self, found: Managed) -> None:
        self._drop(found.handle)

    def _drop(self, handle: str) -> None:
        self.running.pop(handle, None)
        self.owners.pop(handle, None)


class FakeDockerClient:
    """The part of docker-py's ``APIClient`` that DockerSpawner 14 calls for a container
    server, answered from memory: containers are dicts by name and id; ``port`` maps every
    container's port to the responder. Unknown containers raise ``docker.errors.NotFound``
    (HTTP 404), as the engine does. ``create_host_config`` is docker-py's own
    :class:`docker.types.HostConfig` (pure: it talks to no engine)."""

    #: the Docker API version docker-py would negotiate (for HostConfig's checks)
    api_version = "1.45"
    base_url = "http+docker://localhost"

    def __init__(self, responder_host: str, responder_port: int) -> None:
        self.responder = (responder_host, responder_port)
        self.by_name: dict[str, dict[str, Any]] = {}
        self.by_id: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)

    def _find(self, ref: str) -> dict[str, Any]:
        found = self.by_id.get(ref) or self.by_name.get(ref)
        if found is None:  # as docker-py raises it: the engine's 404 response attached
            response = Response()
            response.status_code = 404
            raise NotFound(f"No such container: {ref}", response=response)
        return found

    def create_host_config(self, **kwargs: Any) -> HostConfig:
        return HostConfig(self.api_version, **kwargs)

    def inspect_image(self, image: str) -> dict[str, Any]:
        return {"Id": "sha256:" + "0" * 64, "RepoTags": [image],
                "Config": {"Cmd": ["jupyterhub-singleuser"]}}

    def create_container(self, *, name: str, **kwargs: Any) -> dict[str, Any]:
        cid = f"{next(self._ids):064x}"
        c = {"Id": cid, "Name": "/" + name, "Config": {"Env": kwargs.get("environment")},
             "HostConfig": dict(kwargs.get("host_config") or {}),
             "State": {"Running": False, "ExitCode": 0, "Error": "", "FinishedAt": ""},
             "NetworkSettings": {"Networks": {}}}
        self.by_name[name] = c
        self.by_id[cid] = c
        return {"Id": cid, "Warnings": []}

    def start(self, container: str) -> None:
        self._find(container)["State"]["Running"] = True

    def inspect_container(self, container: str) -> dict[str, Any]:
        return self._find(container)

    def port(self, container: str, private_port: int) -> list[dict[str, str]]:
        self._find(container)
        return [{"HostIp": self.responder[0], "HostPort": str(self.responder[1])}]

    def stop(self, container: str, **kwargs: Any) -> None:
        self._find(container)["State"]["Running"] = False

    def remove_container(self, container: str, **kwargs: Any) -> None:
        c = self._find(container)
        self.by_id.pop(c["Id"], None)
        self.by_name.pop(c["Name"].lstrip("/"), None)


class FakeDockerSpawner(DockerSpawner):
    """DockerSpawner whose docker-py client is :class:`FakeDockerClient` (settings as
    ``c.FakeDockerSpawner.*``; ``responder_port`` is required). Everything else, its thread
    executor included, is DockerSpawner's."""

    responder_host = Unicode("127.0.0.1", help="Address of the shared responder.").tag(
        config=True)
    responder_port = Int(0, help="Port of the shared responder (required).").tag(config=True)

    _fake_client: FakeDockerClient | None = None

    @property
    def client(self) -> FakeDockerClient:  # type: ignore[override]
        cls = FakeDockerSpawner
        if cls._fake_client is None:
            cls._fake_client = FakeDockerClient(self.responder_host, self.responder_port)
        return cls._fake_client


# -- the responder -------------------------------------------------------------------------
class _Answer(web.RequestHandler):
    def get(self, *_: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("X-JupyterHub-Version", jupyterhub.__version__)  # as the server's
        self.finish(RESPONDER_BODY)

    head = get

    def log_exception(self, *args: Any) -> None:  # pragma: no cover - nothing to log
        pass


def responder_app() -> web.Application:
    """The responder's Tornado application: ``GET``/``HEAD`` of any path answers 200 with
    :data:`RESPONDER_BODY` (no access log)."""
    return web.Application([(r"/(.*)", _Answer)], log_function=lambda handler: None)


def serve_responder(port_file: Path, host: str = "127.0.0.1",
                    stop: Callable[[], bool] | None = None) -> None:
    """Serve :func:`responder_app` on ``host`` at a free port, write the port to ``port_file``
    (written whole, then renamed) and serve until the process is terminated (or ``stop()``
    returns True, checked every 0.2 s)."""
    async def main() -> None:
        sockets = bind_sockets(0, host)
        port = sockets[0].getsockname()[1]
        server = HTTPServer(responder_app())
        server.add_sockets(sockets)
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, port_file)
        while not (stop and stop()):
            await asyncio.sleep(0.2)

    asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the shared loopback responder of the fake "
                                 "servers (benchmarks/hub_scale.py)")
    ap.add_argument("--port-file", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    serve_responder(args.port_file, args.host)
    return 0


if __name__ == "__main__":
    sys.exit(main())

