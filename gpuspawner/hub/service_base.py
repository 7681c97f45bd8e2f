"""What every request handler of the ``gpuspawner`` hub service builds on: the hub application
and its cluster (:func:`hub_app`, :func:`hub_cluster`, :func:`hub_user`) and the handlers' base
class (:class:`ServiceHandler`: the caller's identity through the hub, JSON errors).

It sits outside the :mod:`gpuspawner.hub.service` package, so that a part of the service built
elsewhere (notebook jobs' handlers, :mod:`gpuspawner.hub.jobs.service`) can build on it without
running the package's ``__init__``, whose :func:`~gpuspawner.hub.service.configure_service`
starts those very jobs. :mod:`gpuspawner.hub.service.app` re-exports these names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from html import escape
from typing import Any, Literal

from jupyterhub.services.auth import HubOAuth, HubOAuthenticated, UserNotAllowed
from tornado import web

from .cluster import Cluster, get_cluster
from .runtime import hub_runtime
from .settings import (
    HEALTH_TRAITS,
    QUEUE_TRAITS,
    health_settings,
    queue_settings,
    spawner_values,
)
from .spawner import GPUSpawner

__all__ = ["ADMIN_SCOPE", "OTHERS_SCOPES", "FreshHubOAuth", "ServiceHandler", "hub_app",
           "hub_cluster", "hub_user", "hub_user_scopes"]

#: custom scope granting the admin view (all allocations, the map, metrics)
ADMIN_SCOPE = "custom:gpuspawner:admin"
#: unfiltered token scopes that read other users' figures through the service besides the
#: admin view (``api/queue``'s every entry: read:servers, admin:servers; ``metrics``:
#: read:metrics); a kept hub answer holding one is checked afresh (:class:`ServiceHandler`)
OTHERS_SCOPES = frozenset({"read:servers", "admin:servers", "read:metrics"})


# -- the hub process's state ---------------------------------------------------------------
def hub_app() -> Any:
    """The running JupyterHub application.

    Raises:
        web.HTTPError(503): no hub is initialised in this process.
    """
    from jupyterhub.app import JupyterHub

    if not JupyterHub.initialized():
        raise web.HTTPError(503, "the hub is not initialised")
    return JupyterHub.instance()


def hub_cluster() -> Cluster:
    """The cluster GPUSpawner uses in this hub process: the runtime made at hub start
    (:func:`~gpuspawner.hub.runtime.hub_runtime`). A hub whose configuration never called
    ``check_hub_config`` has none; then the key arguments (``nodes``, ``placement_policy``,
    ``quotas``, ``backend``) are resolved from the hub's configuration the way traitlets
    resolves them for the spawner class (sections of the class's MRO, the most derived last,
    over the traits' defaults), so :func:`~gpuspawner.hub.cluster.get_cluster` returns the
    very object the spawners hold, created on first use if no spawner has run yet.

    Raises:
        web.HTTPError(503): the hub does not use GPUSpawner.
    """
    app = hub_app()
    runtime = hub_runtime(app)
    if runtime is not None:  # made at hub start: the one the spawners use
        return runtime
    cls = app.spawner_class
    if not (isinstance(cls, type) and issubclass(cls, GPUSpawner)):
        raise web.HTTPError(503, f"the hub's spawner_class is {cls!r}, not a GPUSpawner")
    values = spawner_values(app, ("nodes", "placement_policy", "quotas", "profiles", "backend",
                                  *HEALTH_TRAITS, *QUEUE_TRAITS))
    return get_cluster(values["nodes"], values["placement_policy"], values["quotas"],
                       values["profiles"], values["backend"], app.config,
                       health=lambda: health_settings(values, str(app.db_url)),
                       queue=lambda: queue_settings(values, str(app.db_url)))


def hub_user(name: str) -> tuple[bool, list[str]] | None:
    """(admin flag, group names) of a hub user from the hub's database, or None if unknown."""
    from jupyterhub import orm

    app = hub_app()
    u = orm.User.find(app.db, name)
    if u is None:
        return None
    return bool(u.admin), sorted(g.name for g in u.groups)


def hub_user_scopes(name: str) -> set[str] | None:
    """The scopes a hub user holds through their roles and groups (JupyterHub's
    ``get_scopes_for``, expanded), from the hub's database; None if unknown. Used for
    exemptions a user holds whatever token they send (``custom:gpuspawner:budget-exempt``)."""
    from jupyterhub import orm
    from jupyterhub.scopes import get_scopes_for

    app = hub_app()
    u = orm.User.find(app.db, name)
    if u is None:
        return None
    return set(get_scopes_for(u))


class FreshHubOAuth(HubOAuth):
    """JupyterHub's OAuth client (it keeps the hub's answer about a token for
    ``cache_max_age`` seconds, so a token revoked, a user deleted or a scope taken away
    still counts meanwhile) that can ask the hub afresh for one request
    (:meth:`get_user_fresh`), when a kept answer grants more than the caller's own figures.
    """

    def token_cache_key(self, token: str, session_id: str) -> str:
        """The key under which ``HubAuth.user_for_token`` keeps the hub's answer about
        ``token`` (jupyterhub.services.auth; tests/test_attack_admin_map.py checks that a
        lookup stores it there)."""
        digest = hashlib.sha256(token.encode("utf8", "replace")).hexdigest()
        return f"token:{session_id}:{digest}"

    def _keys(self, handler: web.RequestHandler) -> tuple[str | None, str | None]:
        """(key of the header's token, key of the OAuth cookie's token) of a request; None
        where it sends none."""
        session_id = self.get_session_id(handler)
        header = self.get_token(handler, in_cookie=False)
        cookie = self._get_token_cookie(handler)
        return (self.token_cache_key(header, session_id) if header else None,
                self.token_cache_key(cookie, session_id) if cookie else None)

    async def get_user_fresh(self, handler: web.RequestHandler,
                             afresh: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        """The hub's model of the request's caller (as ``get_user(handler, sync=False)``),
        asked afresh when the answer was a kept one and ``afresh(model)`` is true: the kept
        answer about the request's token is dropped and the hub asked again (its new answer,
        None for a revoked token or a deleted user, is kept in its place). A kept answer for
        which ``afresh`` is false, and an answer the hub just gave, cost no second request.

        Args:
            handler: the request's handler.
            afresh: kept model -> whether it must be checked with the hub now (it may read
                ``handler._token_authenticated``, set by then).

        Returns:
            the model, or None when the hub identifies nobody.

        Raises:
            web.HTTPError: 500/502 when the hub cannot be asked (as ``get_user``).
        """
        header, cookie = self._keys(handler)
        kept = {key for key in (header, cookie) if key is not None and key in self.cache}
        model = await self.get_user(handler, sync=False)
        if not model:
            return model
        key = header if getattr(handler, "_token_authenticated", False) else cookie
        if key not in kept or not afresh(model):
            return model
        self.cache.pop(key, None)
        # HubAuth._get_user answers once per handler; forget that answer and how it came
        for name in ("_cached_hub_user", "_token_authenticated"):
            handler.__dict__.pop(name, None)
        return await self.get_user(handler, sync=False)


class ServiceHandler(HubOAuthenticated, web.RequestHandler):
    """The base of the service's request handlers: identify the caller with the hub (async,
    :meth:`prepare`), answer JSON errors on the API (:meth:`write_error`), reach the hub's
    cluster (:meth:`cluster`). Its handlers get ``service`` (the
    :class:`~gpuspawner.hub.service.app.GPUService`) as their ``initialize`` argument."""

    #: no authentication (the OpenAPI document)
    public = False
    #: answer errors as JSON (API) rather than HTML
    api = True
    #: when the hub's kept answer about the caller's token (``HubOAuth`` keeps it
    #: ``cache_max_age`` seconds) is checked with the hub again before answering: "never";
    #: "admin" (when it grants the admin view or a scope of :data:`OTHERS_SCOPES`: a caller
    #: reading their own figures costs no request to the hub); "always" (the admin map,
    #: draining GPUs). So a token revoked, a user deleted or a role taken away stops reading
    #: others' figures at the next request, not when the kept answer expires.
    fresh: Literal["never", "admin", "always"] = "admin"

    def initialize(self, service: Any) -> None:
        self.service = service
        self.hub_auth = service.hub_auth

    @property
    def hub_scopes(self) -> set[str]:
        return {f"access:services!service={self.service.name}"}

    def grants_others(self, model: dict[str, Any]) -> bool:
        """Whether the hub's model ``model`` lets this request read or change what is not the
        caller's own: the admin view (:meth:`is_admin`) or a scope of :data:`OTHERS_SCOPES`."""
        return self.is_admin(model) or bool(OTHERS_SCOPES & set(model.get("scopes") or []))

    async def _hub_user(self) -> dict[str, Any] | None:
        """The caller's model from the hub, asked afresh as :attr:`fresh` says (an OAuth
        client without ``get_user_fresh``, a test's stand-in, is asked as it is)."""
        auth = self.hub_auth
        if self.fresh == "never" or not isinstance(auth, FreshHubOAuth):
            return await auth.get_user(self, sync=False)
        if self.fresh == "always":
            return await auth.get_user_fresh(self, lambda model: True)
        return await auth.get_user_fresh(self, self.grants_others)

    async def prepare(self) -> None:
        # resolve the user asynchronously; HubAuthenticated.get_current_user then returns this
        # cached model instead of blocking the hub's own loop
        self._denied = False
        model = None
        if not self.public:
            model = await self._hub_user()
            if model:
                try:
                    model = self.check_hub_user(model)
                except UserNotAllowed:
                    model, self._denied = None, True
        self._hub_auth_user_cache = model

    def require_user(self) -> dict[str, Any]:
        """The caller's hub model. Raises 401 (nobody) or 403 (missing scope)."""
        user = self.current_user
        if not user:
            raise web.HTTPError(403 if self._denied else 401,
                                "this service needs access:services!service="
                                f"{self.service.name}" if self._denied else
                                "log in to the hub or send a JupyterHub API token")
        return user

    def admin_page_user(self, page: str, own_url: str) -> dict[str, Any] | None:
        """The caller of an admins' HTML page, or None after redirecting a browser without a
        login to the hub's login page. ``page``: what the page is ("the GPU map");
        ``own_url``: where a user who is not an admin finds their own figures (the 403's
        message says so).

        Raises:
            web.HTTPError(403): a login without access to the service, or not an admin.
        """
        if not self.current_user:
            if self._denied:
                raise web.HTTPError(403, "this page needs access to the gpuspawner service")
            self.redirect(self.get_login_url())
            return None
        user = self.current_user
        if not self.is_admin(user):
            raise web.HTTPError(403, f"{page} is for hub admins; your own figures are at "
                                     f"{own_url}")
        return user

    def is_admin(self, model: dict[str, Any]) -> bool:
        """The service's admin rule (``GPUService.is_admin``) for this request: by scope
        alone when the hub authenticated it by a token (``_token_authenticated``). Worked out
        once per model and request (a browser login's rule may read the hub's database)."""
        token = getattr(self, "_token_authenticated", False)
        memo = getattr(self, "_admin_memo", None)
        if memo is not None and memo[0] is model and memo[1] == token:
            return memo[2]
        admin = self.service.is_admin(model, token=token)
        self._admin_memo = (model, token, admin)
        return admin

    def read_json_body(self, most: int, over: str = "allowed", expected: str = "") -> Any:
        """The request's body as JSON, parsed only when it is at most ``most`` bytes (the
        jobs API's and the admin endpoints' one body reader).

        Args:
            most: the largest body read, bytes.
            over: how the 413's message ends ("body: N bytes, more than the M <over>").
            expected: added to a 400's message ("body: not JSON; <expected>").

        Raises:
            web.HTTPError: 413 for a larger body (before it is parsed: parsing runs on the
                hub's event loop), 400 when it is not JSON or nests deeper than the parser
                goes (``RecursionError``, else an HTTP 500).
        """
        raw = self.request.body or b""
        if len(raw) > most:
            raise web.HTTPError(413, f"body: {len(raw)} bytes, more than the {most} {over}")
        tail = f"; {expected}" if expected else ""
        try:
            return json.loads(raw)
        except RecursionError:
            raise web.HTTPError(400, f"body: nested too deeply{tail}") from None
        except ValueError:
            raise web.HTTPError(400, f"body: not JSON{tail}") from None

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data, sort_keys=True))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if self.api:
            self.set_header("Content-Type", "application/json; charset=UTF-8")
            self.finish(json.dumps({"status": status_code, "message": message}))
        else:
            self.set_header("Content-Type", "text/html; charset=UTF-8")
            self.finish(f"<!doctype html><title>{status_code}</title><h1>{status_code}</h1>"
                        f"<p>{escape(message)}</p>")

    async def cluster(self) -> Cluster:
        """The hub's cluster, restored, with node and GPU health refreshed when due."""
        c = self.service.cluster_provider()
        await c.ensure_restored()
        await c.refresh_health()
        return c
