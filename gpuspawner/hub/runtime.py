"""The hub's one runtime: the :class:`~gpuspawner.hub.cluster.Cluster` (nodes, ledger,
backend, wait queue, drains, health check) made once when the hub starts, from the
configuration the hub finally runs with, and attached to the JupyterHub application.

The path (docs/architecture.md, "The runtime"): ``jupyterhub`` loads every configuration file
(the shipped ``hub_config/jupyterhub_config.py`` through ``load_subconfig``, the admin's lines
after it, a second ``-f`` file); the shipped file's call of
:func:`~gpuspawner.hub.config_check.check_hub_config` only registers :func:`at_hub_start`;
right after the last file, JupyterHub calls ``init_logging``, where the whole final
configuration is checked and the runtime built (:func:`attach`), or the hub stops naming the
setting. Spawners (``GPUSpawner.cluster``), the REST service (``hub_cluster``) and the metrics
then take :func:`hub_runtime` from the application; nothing builds a second one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ATTRIBUTE", "at_hub_start", "attach", "hub_runtime", "loading_hub"]

#: the JupyterHub application's attribute holding the runtime
ATTRIBUTE = "gpuspawner_runtime"
_REGISTERED = "_gpuspawner_check_registered"


def loading_hub() -> Any | None:
    """The JupyterHub application whose configuration file is being loaded right now (a
    ``load_config_file`` of a ``JupyterHub`` on the call stack), else None: a config file
    read by anything else (a test, ``check_hub_config`` called by hand) is checked at once."""
    try:
        from jupyterhub.app import JupyterHub
    except ImportError:  # pragma: no cover
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "load_config_file":
            app = frame.f_locals.get("self")
            if isinstance(app, JupyterHub):
                return app
        frame = frame.f_back
    return None


def at_hub_start(app: Any, build: Callable[[Any], Any]) -> None:
    """Have ``build(app.config)`` run once all of ``app``'s configuration files are loaded
    (it wraps ``app.init_logging``, which JupyterHub calls right after them) and attach its
    result. Registering twice is one registration. ``build`` raises SystemExit to stop the
    hub."""
    if getattr(app, _REGISTERED, False):
        return
    setattr(app, _REGISTERED, True)
    init_logging = app.init_logging

    def init_logging_then_build() -> None:
        init_logging()
        attach(app, build(app.config))

    app.init_logging = init_logging_then_build


def attach(app: Any, runtime: Any) -> None:
    """Attach the runtime to the application (once; a second one would book devices twice).
    """
    setattr(app, ATTRIBUTE, runtime)
    log = getattr(app, "log", None)
    if log is not None and runtime is not None:
        log.info("gpuspawner runtime ready: %d nodes, backend %s, policy %s",
                 len(runtime.nodes), type(runtime.backend).__name__, runtime.ledger.policy_name)


def hub_runtime(app: Any = None) -> Any | None:
    """The runtime of ``app`` (default: the running JupyterHub, when there is one), or None
    (no hub, or a hub whose configuration did not build one: a test's in-process hub)."""
    if app is None:
        try:
            from jupyterhub.app import JupyterHub
        except ImportError:  # pragma: no cover
            return None
        if not JupyterHub.initialized():
            return None
        app = JupyterHub.instance()
    return getattr(app, ATTRIBUTE, None)
