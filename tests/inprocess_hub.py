"""The in-process GPU hub's fixtures, shared by the tests on pytest-jupyterhub's ``hub_app``
(tests/test_spawner_inprocess.py, tests/test_usage_hub.py, tests/test_usage_budgets_hub.py and
the modules that take their hubs); registered for every module in tests/conftest.py.

- :func:`responder`: the fake engine's loopback responder (every fake server), in the test's
  event loop.
- :func:`inprocess_hub`: ``await inprocess_hub(node, profiles, ...)``: MockHub with GPUSpawner
  on the fake engine (:mod:`gpuspawner.testing.inprocess`), its one runtime built at start as
  ``jupyterhub`` builds it, and, with ``service=True``, the gpuspawner service's Tornado
  application on loopback asking that hub who calls (real tokens, real scopes).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

import pytest
from jupyterhub import orm
from jupyterhub.tests.mocking import MockHub

from gpuspawner.hub.cluster import Cluster, reset_clusters
from gpuspawner.hub.runtime import hub_runtime
from gpuspawner.hub.service.app import GPUService
from gpuspawner.hub.service_base import ADMIN_SCOPE
from gpuspawner.testing.fake_backend import start_responder
from gpuspawner.testing.inprocess import (
    fake_node,
    gpu_hub_config,
    load_config_file,
    reset_user_options_guard,
)
from gpuspawner.usage.api import usage_routes

#: the scope that lets hub users reach the gpuspawner service
ACCESS = "access:services!service=gpuspawner"


def runtime(app: MockHub) -> Cluster:
    """The runtime (nodes, ledger, backend, queue, usage) the hub built at its start.

    Raises:
        AssertionError: the hub built none.
    """
    found = hub_runtime(app)
    assert found is not None, "the hub built no runtime at start"
    return found


class MakeHub(Protocol):
    """What :func:`inprocess_hub` yields."""

    def __call__(self, node: str, profiles: list[dict[str, Any]], *, service: bool = False,
                 scopes: dict[str, str] | None = None, roles: Iterable[dict[str, Any]] = (),
                 config: dict[str, dict[str, Any]] | None = None,
                 **gpuspawner: Any) -> Awaitable[tuple[MockHub, str]]: ...


@pytest.fixture
async def responder() -> AsyncIterator[int]:
    """Every fake server: the loopback responder, served in this test's event loop; its port."""
    server, port = start_responder()
    yield port
    server.stop()


@pytest.fixture
async def inprocess_hub(hub_app: Callable[..., Awaitable[MockHub]], responder: int,
                        tmp_path, monkeypatch) -> AsyncIterator[MakeHub]:
    """``await inprocess_hub(node, profiles, service=..., scopes=..., roles=..., config=...,
    **gpuspawner_settings)`` -> ``(app, service URL)``: the started in-process hub with one
    node ``node`` of two A100s (:func:`~gpuspawner.testing.inprocess.fake_node`) and
    ``profiles``.

    - ``service``: the gpuspawner service's application (``api/usage`` routes) listens on
      loopback and the hub knows it; users hold ``self`` and :data:`ACCESS`, ``admin`` is the
      hub's admin and holds the service's admin scope; the URL ends in the service's prefix
      (``""`` without the service).
    - ``scopes`` (with ``service``): more ``JupyterHub.custom_scopes`` (name -> description);
      ``roles`` (with ``service``): more ``JupyterHub.load_roles``.
    - ``config``: sections merged over the configuration (e.g. ``{"GPUUsage": {...}}``).

    The process's one cluster and the ``user_options`` guard are reset before and after.
    """
    monkeypatch.setattr(MockHub, "load_config_file", load_config_file)
    reset_clusters()  # the process's one cluster: this hub's, made at its start
    reset_user_options_guard()  # registered anew with this hub's profiles
    services: list[GPUService] = []

    async def make(node: str, profiles: list[dict[str, Any]], *, service: bool = False,
                   scopes: dict[str, str] | None = None, roles: Iterable[dict[str, Any]] = (),
                   config: dict[str, dict[str, Any]] | None = None,
                   **gpuspawner: Any) -> tuple[MockHub, str]:
        holder: list[MockHub] = []
        settings = gpu_hub_config(tmp_path / "state", responder, [fake_node(tmp_path, node)],
                                  profiles, **gpuspawner)
        url = ""
        if service:
            def lookup(name: str) -> tuple[bool, list[str]] | None:
                u = orm.User.find(holder[0].db, name)
                return ((bool(u.admin), sorted(g.name for g in u.groups)) if u is not None
                        else None)

            svc = GPUService("gpuspawner", secrets.token_hex(32),
                             cluster_provider=lambda: runtime(holder[0]), user_lookup=lookup,
                             extra_routes=[usage_routes])
            svc.listen()
            services.append(svc)
            url = f"{svc.url}{svc.prefix}"
            settings["JupyterHub"].update({
                "services": [{"name": "gpuspawner", "url": svc.url,
                              "api_token": svc.api_token, "oauth_no_confirm": True}],
                "custom_scopes": {ADMIN_SCOPE: {"description": "the service's admin view"},
                                  **{k: {"description": v} for k, v in (scopes or {}).items()}},
                "load_roles": [
                    {"name": "user", "scopes": ["self", ACCESS]},
                    {"name": "gpuspawner-service-admins", "scopes": [ADMIN_SCOPE, ACCESS],
                     "users": ["admin"]},
                    *roles,
                ],
            })
            settings["Authenticator"] = {"admin_users": {"admin"}}
        for section, values in (config or {}).items():
            settings.setdefault(section, {}).update(values)
        app = await hub_app(config=settings)
        holder.append(app)
        for svc in services:
            svc._hub_api_url = app.hub.api_url
        return app, url

    yield make
    for svc in services:
        svc.server.stop()
    reset_clusters()
    reset_user_options_guard()
