"""Test doubles for benchmarks/hub_scale.py: a fake engine that "runs" thousands of user servers
at no cost, behind both spawners the benchmark compares.

- :class:`FakeBackend`: gpuspawner's fake engine, from :mod:`gpuspawner.testing.fake_backend`
  (its home: the in-process hub tests use it too), importable here under its old name
  (``c.GPUSpawner.backend = "benchmarks.fake_backend.FakeBackend"``, its settings as
  ``c.FakeBackend.*``). GPUSpawner's own code runs unchanged down to the backend interface.
- :class:`FakeDockerSpawner`: DockerSpawner 14 with docker-py's ``APIClient`` replaced by
  :class:`FakeDockerClient`. DockerSpawner's own code runs unchanged (image check, create, start,
  port lookup, poll by inspect, stop and remove, its one-thread executor) down to docker-py.
- :func:`serve_responder` (``python benchmarks/fake_backend.py --port-file F``, also from
  :mod:`gpuspawner.testing.fake_backend`): one HTTP server on 127.0.0.1 that answers every
  path with a Jupyter server's ``GET /api`` body. Every fake server of both spawners is this
  one process, reached at its own path (``/user/<name>/``).

Neither double touches a Docker engine or starts a process per server.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from docker.errors import NotFound
from docker.types import HostConfig
from dockerspawner import DockerSpawner
from requests import Response
from traitlets import Int, Unicode

from gpuspawner.testing.fake_backend import (
    RESPONDER_BODY,
    FakeBackend,
    main,
    responder_app,
    serve_responder,
)

__all__ = ["RESPONDER_BODY", "FakeBackend", "FakeDockerClient", "FakeDockerSpawner",
           "responder_app", "serve_responder"]


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


if __name__ == "__main__":
    sys.exit(main())
