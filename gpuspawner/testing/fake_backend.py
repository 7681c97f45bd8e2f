"""A fake engine for a hub with no engine: :class:`FakeBackend` "runs" user servers at no
cost, all of them one loopback HTTP responder that answers as a Jupyter server.

- :class:`FakeBackend`: a gpuspawner :class:`~gpuspawner.backends.base.Backend` (configured as
  ``c.GPUSpawner.backend = "gpuspawner.testing.fake_backend.FakeBackend"``, its settings as
  ``c.FakeBackend.*``). GPUSpawner's own code runs unchanged (options check, queue, ledger
  reservation, launch spec, its readiness check, state) down to this interface. A test makes
  a launch fail with ``c.FakeBackend.fail_launch`` (the message of the BackendError raised).
- :func:`responder_app` / :func:`serve_responder` (``python -m gpuspawner.testing.fake_backend
  --port-file F``): one HTTP server on 127.0.0.1 that answers every path with a Jupyter
  server's ``GET /api`` body (``{"version": ...}``). Every fake server is this one responder,
  reached at its own path (``/user/<name>/``): it satisfies GPUSpawner's readiness check
  (:func:`gpuspawner.hub.readiness.wait_for_own_server`: ``{base_url}api`` answers JSON with a
  ``version``) and JupyterHub's (any HTTP answer below 500 at the server's URL). An in-process
  hub (tests/test_spawner_inprocess.py) serves :func:`responder_app` in its own event loop.

Used by the in-process hub tests and by ``benchmarks/hub_scale.py`` (through
``benchmarks/fake_backend.py``, which adds its DockerSpawner doubles). Nothing here touches a
Docker engine or starts a process per server. The fake engine's record of what runs lives in
the hub process (:attr:`FakeBackend.running`), as a real engine's would live in the engine:
:meth:`FakeBackend.list_managed` reads it.
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
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from traitlets import Int, Unicode

from gpuspawner.backends.base import Backend, BackendError, Managed, Progress, ServerRef
from gpuspawner.backends.spec import LaunchSpec
from gpuspawner.placement import Allocation

__all__ = ["RESPONDER_BODY", "FakeBackend", "main", "responder_app", "serve_responder",
           "start_responder"]

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
    fail_launch = Unicode("", help="""When set, ``launch`` records the server (as an engine
        that made the container) and then raises BackendError with this message (HTTP 500),
        as a server that could not start. Empty: launches succeed.""").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: handle -> what the fake engine runs
        self.running: dict[str, Managed] = {}
        #: handle -> the launch spec it was given (dropped with the record)
        self.specs: dict[str, LaunchSpec] = {}
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
        """Record the server; returns the responder's (ip, port).

        Raises:
            BackendError: ``fail_launch`` is set (its message), after the server was recorded.
        """
        handle = f"fake-{next(self._ids):06d}"
        alloc: Allocation = spec.allocation
        self.running[handle] = Managed(alloc.node, alloc.to_json(), handle)
        self.owners[handle] = {"gpuspawner.user": spec.user, "gpuspawner.server": spec.server}
        self.specs[handle] = spec
        state["fake_id"] = handle
        state["node"] = alloc.node
        progress(50, f"fake server {handle} recorded on {alloc.node}")
        if self.fail_launch:
            raise BackendError(self.fail_launch)
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
        self.specs.pop(handle, None)
        self.owners.pop(handle, None)


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


def start_responder(host: str = "127.0.0.1") -> tuple[HTTPServer, int]:
    """Serve :func:`responder_app` in the running event loop (an in-process hub's), on
    ``host`` at a free port. Returns the server (``.stop()`` it when done) and the port.

    Raises:
        OSError: no port could be bound on ``host``.
    """
    sockets = bind_sockets(0, host)
    server = HTTPServer(responder_app())
    server.add_sockets(sockets)
    return server, sockets[0].getsockname()[1]


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
    """The responder as a process: ``--port-file F`` (required) receives the port,
    ``--host`` (default 127.0.0.1). Serves until terminated; returns 0."""
    ap = argparse.ArgumentParser(description="the shared loopback responder of the fake "
                                 "servers (gpuspawner.testing.fake_backend)")
    ap.add_argument("--port-file", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    serve_responder(args.port_file, args.host)
    return 0


if __name__ == "__main__":
    sys.exit(main())

