"""The service's web API under ``/services/<name>/`` (hub OAuth; API clients send a hub token
in ``Authorization: token ...``).

====================================  =======  ==========================================
path (below the service prefix)       method   who / what
====================================  =======  ==========================================
``api/status``                        GET      a user: their own servers (decision, "will be
                                               culled at T, because ...", figures, policy);
                                               an admin: every server (``?user=NAME`` filters)
``api/policy``                        GET      the caller's effective policy with sources
``api/policies``                      GET/PUT  admin: the whole policy document in force; PUT
                                               replaces it (kept in the overrides file, never
                                               in the shipped policies file)
``api/policies/global``               PUT      admin: replace the global entry
``api/policies/(users|groups)/NAME``  PUT/DEL  admin: set or remove one entry
``metrics``                           GET      admin: Prometheus text format
(the prefix itself)                   GET      the page for people (HTML): servers, next
                                               cull, reason, signals, policy, recent culls
``oauth_callback``                    GET      hub OAuth
====================================  =======  ==========================================

Admins are hub admins (``admin: true`` in the user model the hub returns for the token).

Cross-site requests: a request authenticated by a valid hub token (``Authorization: token
...``) is exempt from the XSRF check; one authenticated by the login cookie is checked
(``_xsrf`` argument or ``X-XSRFToken`` header), whatever other headers it carries: a cookie
plus an invalid ``Authorization`` header is refused (403), as in JupyterHub's own handlers.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from .core import Culler
from .metrics import Metrics
from .policies import PolicyError


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    def initialize(self, culler: Culler, hub_auth: HubOAuth,
                   metrics: Metrics | None = None) -> None:
        self.culler = culler
        self.hub_auth = hub_auth
        self.metrics = metrics

    def check_xsrf_cookie(self) -> None:
        """Skip the XSRF check only for a request the hub authenticated by its token
        (``HubAuth`` sets ``_token_authenticated`` once the hub accepted the token); a
        cookie-authenticated request is checked whatever headers it carries (an invalid
        ``Authorization`` header does not exempt it)."""
        if getattr(self, "_token_authenticated", False):
            return None
        return super().check_xsrf_cookie()

    @property
    def is_admin(self) -> bool:
        """Unfiltered ``admin:users`` among the scopes of what authenticated the request, or,
        for a browser login to the culler (its OAuth cookie), the hub's admin flag. A token
        sent in a header must carry the scope itself: the model's ``admin`` is its owner's,
        and an admin's server token (readable by any code in that server) holds only what
        ``server_token_scopes`` grants, never the right to change policies."""
        user = self.current_user
        if not user:
            return False
        if "admin:users" in (user.get("scopes") or []):
            return True
        if getattr(self, "_token_authenticated", False):
            return False
        return bool(user.get("admin"))

    def require_admin(self) -> None:
        if not self.is_admin:
            raise web.HTTPError(403, "admin only")

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, sort_keys=True))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = self._reason
        exc = kwargs.get("exc_info")
        if exc and isinstance(exc[1], web.HTTPError) and exc[1].log_message:
            reason = exc[1].log_message
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": reason}))

    def body(self) -> Any:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError as e:
            raise web.HTTPError(400, f"body is not JSON: {e}") from e


class StatusHandler(BaseHandler):
    @web.authenticated
    def get(self) -> None:
        me = self.current_user["name"]
        if self.is_admin:
            self.write_json(self.culler.user_status(self.get_argument("user", None)))
        else:
            self.write_json(self.culler.user_status(me))


class MyPolicyHandler(BaseHandler):
    @web.authenticated
    def get(self) -> None:
        u = self.current_user
        user = u["name"]
        groups = u.get("groups") or []
        if self.is_admin and self.get_argument("user", None):
            user = self.get_argument("user")
            groups = [g for g in self.get_argument("groups", "").split(",") if g]
        pol = self.culler.policies.resolve(user, groups)
        self.write_json({"user": user, "groups": groups, "policy": pol.to_json()})


class PoliciesHandler(BaseHandler):
    @web.authenticated
    def get(self) -> None:
        self.require_admin()
        self.write_json(self.culler.policies.to_dict())

    @web.authenticated
    def put(self) -> None:
        self.require_admin()
        try:
            doc = self.culler.policies.put_document(self.body())
        except PolicyError as e:
            raise web.HTTPError(400, str(e)) from e
        self.write_json(doc)


class PolicyEntryHandler(BaseHandler):
    """One entry: kept in the overrides file (``PolicySet.put_entry`` / ``delete_entry``)."""

    @web.authenticated
    def put(self, section: str, name: str | None = None) -> None:
        self.require_admin()
        if (section == "global") != (name is None):
            raise web.HTTPError(404)
        try:
            doc = self.culler.policies.put_entry(section, name, self.body())
        except PolicyError as e:
            raise web.HTTPError(400, str(e)) from e
        self.write_json(doc)

    @web.authenticated
    def delete(self, section: str, name: str | None = None) -> None:
        self.require_admin()
        if section == "global" or name is None:
            raise web.HTTPError(405)
        try:
            doc = self.culler.policies.delete_entry(section, name)
        except KeyError:
            raise web.HTTPError(404, f"no {section} entry {name!r}") from None
        except PolicyError as e:
            raise web.HTTPError(400, str(e)) from e
        self.write_json(doc)


class MetricsHandler(BaseHandler):
    @web.authenticated
    def get(self) -> None:
        self.require_admin()
        self.set_header("Content-Type", "text/plain; version=0.0.4")
        self.finish(self.metrics.render() if self.metrics else b"")


class CallbackHandler(HubOAuthCallbackHandler):
    """Finishes the hub OAuth login with the service's own :class:`HubOAuth`."""

    def initialize(self, culler: Culler, hub_auth: HubOAuth,
                   metrics: Metrics | None = None) -> None:
        self.hub_auth = hub_auth


class IndexHandler(BaseHandler):
    """``GET /services/idle-culler/``: the page for people (HTML, in the hub's look): each
    server's decision, next cull time, reason, signals and policy, the recent culls and, for
    admins, the policies in force; it reads ``api/status`` (and ``api/policies``) itself."""

    @web.authenticated
    def get(self) -> None:
        from jinja2 import PackageLoader

        from gpuspawner.webui import REFRESH_S, environment, service_links

        base = os.environ.get("JUPYTERHUB_BASE_URL", "/")
        prefix = self.settings["service_prefix"]
        api = [("status", f"{prefix}api/status"), ("your policy", f"{prefix}api/policy")]
        if self.is_admin:
            api += [("policies", f"{prefix}api/policies"), ("metrics", f"{prefix}metrics")]
        html = environment(PackageLoader("idle_culler", "templates")).get_template(
            "index.html.j2").render(
            hub_prefix=url_path_join(base, "hub") + "/", prefix=prefix, refresh_s=REFRESH_S,
            user={"name": self.current_user["name"], "admin": self.is_admin},
            links=service_links(url_path_join(base, "services") + "/", "Idle culler"),
            api_links=api, xsrf=self.xsrf_token.decode())
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(html)


def make_app(culler: Culler, prefix: str, metrics: Metrics | None = None,
             hub_auth: HubOAuth | None = None, cookie_secret: bytes | None = None
             ) -> web.Application:
    """The tornado application; ``prefix`` is ``JUPYTERHUB_SERVICE_PREFIX``
    (``/services/idle-culler/``)."""
    hub_auth = hub_auth or HubOAuth(cache_max_age=10)
    from gpuspawner.webui.headers import add_frame_headers  # shared with gpuspawner's service

    kw = {"culler": culler, "hub_auth": hub_auth, "metrics": metrics}
    p = prefix.rstrip("/")
    return add_frame_headers(web.Application([  # every response: not framed by other sites
        (p + "/?", IndexHandler, kw),
        (p + "/api/status", StatusHandler, kw),
        (p + "/api/policy", MyPolicyHandler, kw),
        (p + "/api/policies", PoliciesHandler, kw),
        (p + r"/api/policies/(global)", PolicyEntryHandler, kw),
        (p + r"/api/policies/(users|groups)/([^/]+)", PolicyEntryHandler, kw),
        (p + "/metrics", MetricsHandler, kw),
        (p + "/oauth_callback", CallbackHandler, kw),
    ], cookie_secret=cookie_secret or os.urandom(32), xsrf_cookies=False,
        service_prefix=p + "/"))
