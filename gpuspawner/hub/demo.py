"""Demo defaults that fail safe: the shipped configuration's demo admin (``admin``) and its
culling exemption apply only while the hub runs the demo authenticator.

``hub_config/jupyterhub_config.py`` calls :func:`demo_defaults` instead of setting
``c.Authenticator.admin_users``. The decision is taken when the hub starts, on the *final*
configuration (after ``hub_config/ldap.py`` or a site's own lines replaced the
authenticator), in the same way as :func:`gpuspawner.hub.config_check.check_hub_config`:

- demo authenticator (JupyterHub's ``DummyAuthenticator`` or a subclass): the demo admin is
  added to the admins the configuration names and to the gpuspawner service's admin role,
  and the idle culler (the service named ``idle-culler``) is started with
  ``--exempt-users <admin>``;
- any other authenticator: the admins are exactly those its own settings name
  (``c.Authenticator.admin_users``, the authenticator's own section; none otherwise), and
  nobody is exempt from culling unless the policy file says so.

Either way the hub's log says who is admin: the configuration's admins at start, and every
admin in the hub's database once JupyterHub has loaded its roles (a database from an earlier
run keeps the admins it had; the log shows them, the admin page removes them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from jupyterhub import orm
from jupyterhub.auth import DummyAuthenticator

from .runtime import hub_runtime, loading_hub

__all__ = ["DEMO_ADMIN", "apply_demo_defaults", "demo_defaults", "is_demo_authenticator"]

#: the shipped configuration's demo admin
DEMO_ADMIN = "admin"
#: the custom scope of the gpuspawner service's admin view (its role gets the demo admin)
SERVICE_ADMIN_SCOPE = "custom:gpuspawner:admin"
_REGISTERED = "_gpuspawner_demo_registered"
log = logging.getLogger("gpuspawner")


def is_demo_authenticator(cls: Any) -> bool:
    """Whether ``cls`` (an authenticator class) is the demo authenticator: JupyterHub's
    ``DummyAuthenticator`` (any name, one password) or a subclass of it."""
    return isinstance(cls, type) and issubclass(cls, DummyAuthenticator)


def _configured_admins(config: Any, cls: Any) -> set[str]:
    """``admin_users`` as the configuration names them for authenticator class ``cls``: its
    own section over ``Authenticator``'s (traitlets' precedence)."""
    names = ["Authenticator"] + [k.__name__ for k in reversed(getattr(cls, "__mro__", ()))
                                 if k.__name__ not in ("Authenticator", "object")]
    admins: set[str] = set()
    for name in names:
        if name in config and "admin_users" in config[name]:
            admins = set(config[name]["admin_users"])
    return admins


def apply_demo_defaults(app: Any, admin: str = DEMO_ADMIN) -> set[str]:
    """Apply the demo defaults to JupyterHub application ``app`` whose configuration is
    final (its authenticator not made yet): see the module docstring.

    Returns:
        the admins the configuration now names.
    """
    cls = app.authenticator_class
    admins = _configured_admins(app.config, cls)
    name = getattr(cls, "__name__", str(cls))
    if is_demo_authenticator(cls):
        admins.add(admin)
        app.config[name]["admin_users"] = set(admins)
        for role in app.load_roles:  # the gpuspawner service's admin view (configure.py)
            if isinstance(role, dict) and SERVICE_ADMIN_SCOPE in (role.get("scopes") or ()):
                role["users"] = sorted({*(role.get("users") or ()), admin})
        for svc in app.services:
            if isinstance(svc, dict) and svc.get("name") == "idle-culler" and \
                    svc.get("command") and "--exempt-users" not in svc["command"]:
                svc["command"] = [*svc["command"], "--exempt-users", admin]
        log.warning("demo authenticator %s: any name logs in with the demo password; %r is "
                    "an admin and exempt from culling. Replace it before anyone else reaches "
                    "the hub (docs/howto/ldap.md)", name, admin)
    app.log.info("hub admins named in the configuration (%s): %s", name,
                 ", ".join(sorted(admins)) or "none")
    return admins


def _log_admins(app: Any) -> None:
    """Log every admin of the hub's database (once JupyterHub has assigned its roles)."""
    names = sorted(u.name for u in app.db.query(orm.User).filter_by(admin=True))
    app.log.info("hub admins: %s", ", ".join(names) or "none")


def demo_defaults(c: Any, admin: str = DEMO_ADMIN) -> None:
    """Have the demo admin and its culling exemption apply only if the hub, once every
    configuration file is loaded, runs the demo authenticator (:func:`apply_demo_defaults`),
    and have the hub log its admins at start; then the cluster's node watch starts
    (:meth:`~gpuspawner.hub.cluster.Cluster.watch`: the isolation rule is checked at start,
    not only at the first spawn or poll). Called from a configuration file that a
    JupyterHub is loading; anywhere else (a test reading the file) it does nothing. ``c`` is
    that file's configuration (unused: the final one is read at start)."""
    app = loading_hub()
    if app is None or getattr(app, _REGISTERED, False):
        return
    setattr(app, _REGISTERED, True)
    init_logging: Callable[[], None] = app.init_logging
    init_role_assignment = app.init_role_assignment

    def init_logging_then_demo() -> None:
        init_logging()
        apply_demo_defaults(app, admin)

    async def init_role_assignment_then_log() -> None:
        await init_role_assignment()
        _log_admins(app)
        runtime = hub_runtime(app)
        if runtime is not None:  # the isolation rule checked now, not at the first spawn
            runtime.start_watch()

    app.init_logging = init_logging_then_demo
    app.init_role_assignment = init_role_assignment_then_log
