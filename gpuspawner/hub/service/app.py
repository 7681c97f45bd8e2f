"""The ``gpuspawner`` hub service: a Tornado application that runs **inside the hub process**.

Why in the hub process: the placement state lives in one object, the hub's
:class:`~gpuspawner.hub.cluster.Cluster` (ledger), which GPUSpawner instances change under a lock.
A separate service process would need a second copy (a database table, a cache, a poll of the
hub) that can drift from it. Here the handlers read that very object at each request.

How: JupyterHub 6 runs ``initialize()`` (which executes ``jupyterhub_config.py``) inside its
running asyncio loop (``JupyterHub.launch_instance`` -> ``IOLoop.run_sync``), so the config
can bind a loopback socket and attach a Tornado ``HTTPServer`` to that loop
(:func:`~gpuspawner.hub.service.configure.configure_service`). The hub registers it as an
*external* service with a URL: the proxy routes ``/services/gpuspawner/`` to it and the hub is
its OAuth provider. Users are identified with :class:`jupyterhub.services.auth.HubOAuth` (cookie
after an OAuth login, or an API token in ``Authorization``), asynchronously: the hub answers
those checks on the same loop, so the blocking ``sync=True`` calls of ``HubAuthenticated``
would deadlock.

Access (JupyterHub scopes): every request needs ``access:services!service=gpuspawner`` (given to
all users by the default ``user`` role, see
:func:`~gpuspawner.hub.service.configure.configure_service`). Admins (the hub's admin flag,
unfiltered ``admin:users``, or the custom scope ``custom:gpuspawner:admin``) see every
allocation and the admin page; others see their own. ``metrics`` also accepts ``read:metrics``.
The OAuth client keeps the hub's answer about a token 60 s; a kept answer that grants more than
the caller's own figures is checked with the hub again before the request is answered, and the
admin page's and the GPU drain's callers always are
(:attr:`~gpuspawner.hub.service_base.ServiceHandler.fresh`, docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from prometheus_client import CONTENT_TYPE_LATEST
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from ...webui import REFRESH_S, service_links
from ...webui.headers import add_frame_headers
from .. import metrics
from ..cluster import Cluster
from ..identity import is_job_server
from ..service_base import (
    ADMIN_SCOPE,
    FreshHubOAuth,
    ServiceHandler,
    hub_app,
    hub_cluster,
    hub_user,
)
from .frozen import FrozenCluster, freeze_all
from .openapi import openapi_document
from .page_cache import KeptPage, PageCache, page_key, xsrf_placeholder
from .views import (
    INLINE_FORMAT_MAX,
    allocation_list,
    allocations_text,
    gpu_drain_view,
    map_view,
    node_views,
    page_templates,
    queue_view,
    schema_list_view,
    schema_view,
    unformatted,
    usage_view,
)

log = logging.getLogger("gpuspawner")

#: (the names notebook jobs' and api/profiles' handlers import from here)
_Base = ServiceHandler
_hub_app = hub_app


class NodesHandler(_Base):
    """``GET api/nodes``: inventory with free/used per GPU, NUMA node and cores (other users'
    holders hidden from non-admins)."""
    async def get(self) -> None:
        user = self.require_user()
        cluster = await self.cluster()
        viewer = None if self.is_admin(user) else user["name"]
        # the nodes copied on the loop (the ledger's incremental snapshot, the drains and
        # runtimes: frozen.py); the viewer's view (linear in the servers: about 12 ms of CPU
        # at 5,000) and its JSON made from the copy in a worker thread
        frozen = FrozenCluster(cluster, usage=False, allocations=False)
        body = await asyncio.to_thread(
            lambda: json.dumps(node_views(frozen, viewer), sort_keys=True))
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(body)


#: the largest body ``POST api/gpus/{uuid}/drain`` reads, bytes (a reason is a line of text)
DRAIN_BODY_MAX_BYTES = 64 * 1024


class GPUDrainHandler(_Base):
    """``POST api/gpus/{uuid}/drain`` with ``{"reason": "..."}``: take a GPU out of placement
    (kept across hub restarts in ``GPUSpawner.gpu_drains_file``); ``DELETE``: give it back.
    Admins only (403 for others), 404 for a UUID no node has, 400 for a body that is not a JSON
    object with a non-empty string ``reason`` (read by
    :meth:`~gpuspawner.hub.service_base.ServiceHandler.read_json_body`, as the jobs API's
    bodies: 413 past :data:`DRAIN_BODY_MAX_BYTES`). Answers the GPU's drain view
    (:func:`~gpuspawner.hub.service.views.gpu_drain_view`). Every request's caller is checked
    with the hub afresh (``fresh = "always"``)."""

    fresh = "always"

    def _admin(self) -> dict[str, Any]:
        user = self.require_user()
        if not self.is_admin(user):
            raise web.HTTPError(403, "draining a GPU is for hub admins")
        return user

    @staticmethod
    def _known(cluster: Cluster, uuid: str) -> None:
        if cluster.gpu_node(uuid) is None:
            raise web.HTTPError(404, f"no node has GPU {uuid!r}; see api/nodes")

    async def post(self, uuid: str) -> None:
        user = self._admin()
        cluster = await self.cluster()
        self._known(cluster, uuid)
        need = 'the body must be a JSON object with a non-empty string "reason", e.g. ' \
               '{"reason": "fan noise"}'
        body = self.read_json_body(DRAIN_BODY_MAX_BYTES, expected=need)
        reason = body.get("reason") if isinstance(body, dict) else None
        if not isinstance(reason, str) or not reason.strip():
            raise web.HTTPError(400, need)
        cluster.drain_gpu(uuid, reason.strip(), by=user["name"])
        log.warning("GPU %s drained by %s: %s", uuid, user["name"], reason.strip())
        self.write_json(gpu_drain_view(cluster, uuid, admin=True))

    async def delete(self, uuid: str) -> None:
        user = self._admin()
        cluster = await self.cluster()
        self._known(cluster, uuid)
        before = cluster.undrain_gpu(uuid)
        if before is not None:
            log.warning("GPU %s undrained by %s (was: %s, by %s)", uuid, user["name"],
                        before.reason, before.by)
        self.write_json(gpu_drain_view(cluster, uuid, admin=True))


class AllocationsHandler(_Base):
    """``GET api/allocations``: admins all allocations, users their own (the JSON text of
    each allocation is made once: :func:`views.allocations_text`)."""
    async def get(self) -> None:
        user = self.require_user()
        cluster = await self.cluster()
        wanted = self.get_query_argument("user", None)
        if not self.is_admin(user):
            if wanted is not None and wanted != user["name"]:
                raise web.HTTPError(403, f"{user['name']} may not read the allocations of "
                                         "another user")
            wanted = user["name"]
        # the list taken on the loop; allocations not formatted yet (all of them after a
        # burst of spawns: 24 ms at 1,000 on the loop, measured) formatted in a worker
        # thread, from frozen objects (views.py: the cache is safe to fill from a thread)
        allocs = allocation_list(cluster, wanted)
        if unformatted(allocs) > INLINE_FORMAT_MAX:
            body = await asyncio.to_thread(allocations_text, allocs)
        else:
            body = allocations_text(allocs)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(body)


#: token scopes (unfiltered) that read every entry of the queue (the idle culler's)
QUEUE_READ_SCOPES = frozenset({"read:servers", "admin:servers"})


class QueueHandler(_Base):
    """``GET api/queue``: the wait queue in fair order (:func:`views.queue_view`): counts for
    everyone, all entries for admins and tokens with ``read:servers``/``admin:servers``,
    else the caller's own."""
    async def get(self) -> None:
        user = self.require_user()
        cluster = await self.cluster()
        everything = self.is_admin(user) or bool(QUEUE_READ_SCOPES & set(
            user.get("scopes") or []))
        self.write_json(queue_view(cluster, None if everything else user["name"]))


class UsageHandler(_Base):
    """``GET api/users/{name}/usage``: what a user holds and their quota (self or admin)."""
    async def get(self, name: str) -> None:
        user = self.require_user()
        admin = self.is_admin(user)
        if not admin and name != user["name"]:
            raise web.HTTPError(403, f"{user['name']} may not read the usage of another user")
        cluster = await self.cluster()
        if name == user["name"] and user.get("groups") is not None:
            groups = list(user["groups"])
        else:
            info = self.service.user_lookup(name)
            groups = info[1] if info else []
        self.write_json(usage_view(cluster, name, groups))


class OpenAPIHandler(_Base):
    """``GET api/openapi.json``: the OpenAPI 3 document of this API (public)."""
    public = True

    def get(self) -> None:
        self.write_json(openapi_document(self.service.prefix))


class SchemasHandler(_Base):
    """``GET api/schemas``: the configuration's JSON Schemas, listed (public, like the OpenAPI
    document: they describe the configuration, not the hub's state)."""
    public = True

    def get(self) -> None:
        self.write_json(schema_list_view(self.service.prefix))


class SchemaHandler(_Base):
    """``GET api/schemas/{name}``: one JSON Schema (public); 404 for an unknown name."""
    public = True

    def get(self, name: str) -> None:
        schema = schema_view(name)
        if schema is None:
            raise web.HTTPError(404, f"no configuration schema {name!r}; see "
                                     f"{self.service.prefix}api/schemas")
        self.write_json(schema)


class MetricsHandler(_Base):
    """``GET metrics``: Prometheus text from the ledger (needs ``read:metrics``)."""
    @property
    def hub_scopes(self) -> set[str]:
        return {f"access:services!service={self.service.name}", "read:metrics"}

    async def get(self) -> None:
        user = self.require_user()
        if not (self.is_admin(user) or "read:metrics" in (user.get("scopes") or [])):
            raise web.HTTPError(403, "metrics need read:metrics or the admin view")
        # the ledger copied and the other metrics collected on the loop; the ledger gauges and
        # the text made in a worker thread
        frozen = freeze_all(metrics.reported_clusters())
        body = await asyncio.to_thread(metrics.latest_from, frozen, metrics.other_families())
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(body)


#: the scopes that decide the admin map page's viewer (part of its kept page's key)
MAP_PAGE_SCOPES = frozenset({ADMIN_SCOPE, "admin:users"})


class AdminPageHandler(_Base):
    """``GET admin``: the cluster map, allocations and quota use (admins; every request's
    caller checked with the hub afresh: ``fresh = "always"``)."""
    api = False
    fresh = "always"

    async def get(self) -> None:
        user = self.admin_page_user("the GPU map", f"{self.service.prefix}api/allocations")
        if user is None:
            return
        cluster = await self.cluster()
        # the page kept for this viewer while nothing it shows changed (page_cache.py); the
        # stamp and the copy read in one stretch of the loop, so the page kept is the copy's
        pages = self.service.map_pages
        token = getattr(self, "_token_authenticated", False)
        rights = (frozenset(MAP_PAGE_SCOPES & set(user.get("scopes") or [])),
                  bool(user.get("admin")), bool(token))
        key = page_key(str(user.get("kind", "user")), user["name"], rights, self.request.query)
        stamp = pages.stamp(cluster)
        kept = pages.get(key, stamp)
        if kept is None:
            # the cluster copied on the loop (frozen.py); the view and its HTML (about 1 MiB
            # at 1,000 servers, 100-200 ms) made from the copy in a worker thread, with a
            # placeholder where each request's own xsrf token goes; the template loaded
            # there too (its first load compiles it: 65-75 ms on the loop at the first
            # request after the hub's start, measured)
            frozen = FrozenCluster(cluster)
            templates = self.service.templates
            placeholder = xsrf_placeholder()
            html = await asyncio.to_thread(
                lambda **kw: templates.get_template("admin.html.j2").render(
                    view=map_view(frozen), **kw),
                user={"name": user["name"], "admin": True}, prefix=self.service.prefix,
                hub_prefix=self.service.hub_prefix, refresh_s=REFRESH_S, xsrf=placeholder,
                links=service_links(self.service.services_prefix, "GPU map"),
                api_links=[("REST API (OpenAPI)", f"{self.service.prefix}api/openapi.json"),
                           ("nodes", f"{self.service.prefix}api/nodes"),
                           ("allocations", f"{self.service.prefix}api/allocations"),
                           ("metrics", f"{self.service.prefix}metrics")])
            kept = pages.put(key, KeptPage.from_html(html, placeholder, stamp))
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(kept.page(self.xsrf_token.decode()))


class RootHandler(_Base):
    """``GET /services/gpuspawner/``: redirects to the ``admin`` map page."""
    public = True
    api = False

    def get(self) -> None:
        self.redirect(self.service.prefix + "admin")


class CallbackHandler(HubOAuthCallbackHandler):
    """OAuth callback; its ``current_user`` comes from the async ``prepare`` too."""

    def initialize(self, service: GPUService) -> None:
        self.service = service
        self.hub_auth = service.hub_auth

    async def prepare(self) -> None:
        model = await self.hub_auth.get_user(self, sync=False)
        self._hub_auth_user_cache = model


class NotFoundHandler(_Base):
    """Any other path: a JSON 404."""
    public = True

    def prepare(self) -> None:
        raise web.HTTPError(404, f"no such endpoint: {self.request.path}")


# -- the service -------------------------------------------------------------------------------
class GPUService:
    """The service's Tornado application and its hub OAuth client.

    Args:
        name: service name (``/services/<name>/``).
        api_token: the token the hub registers for this service; also its OAuth client
            secret.
        base_url: the hub's ``base_url``.
        hub_api_url: the hub's internal API URL; default: read from the running hub.
        cluster_provider: returns the cluster to show (default :func:`hub_cluster`).
        user_lookup: name -> (admin, groups) or None (default :func:`hub_user`).
        extra_routes: functions ``(prefix, handler kwargs) -> [(pattern, handler, kwargs)]``
            whose routes the application adds (notebook jobs' ``job_routes``, given by
            :func:`~gpuspawner.hub.service.configure.configure_service`: the jobs' handlers
            build on this module's, so this module does not import them).
    """

    def __init__(self, name: str, api_token: str, base_url: str = "/",
                 hub_api_url: str | None = None,
                 cluster_provider: Callable[[], Cluster] = hub_cluster,
                 user_lookup: Callable[[str], tuple[bool, list[str]] | None] = hub_user,
                 extra_routes: Iterable[Callable[[str, dict[str, Any]], list[Any]]] = (),
                 ) -> None:
        self.name = name
        self.api_token = api_token
        self.base_url = base_url
        self.prefix = url_path_join(base_url, "services", name) + "/"
        self.hub_prefix = url_path_join(base_url, "hub") + "/"
        self.services_prefix = url_path_join(base_url, "services") + "/"
        self._hub_api_url = hub_api_url
        self.cluster_provider = cluster_provider
        self.user_lookup = user_lookup
        self.extra_routes = list(extra_routes)
        self._hub_auth: FreshHubOAuth | None = None
        self.templates = page_templates()
        #: the admin map's rendered pages, kept per viewer (:mod:`.page_cache`)
        self.map_pages = PageCache()
        self.server: HTTPServer | None = None
        #: the listener of :meth:`listen_for_servers`, when there is one
        self.servers_server: HTTPServer | None = None
        self.port: int | None = None
        #: the task of :func:`resume_queue` (started by
        #: :func:`~gpuspawner.hub.service.configure.configure_service`)
        self.resume_task: asyncio.Future[list[str]] | None = None
        #: notebook jobs (:mod:`gpuspawner.hub.jobs.service`; set by configure_service)
        self.jobs: Any = None

    @property
    def hub_auth(self) -> FreshHubOAuth:
        """The OAuth client, made on first use (the hub's API URL is known by then). It keeps
        the hub's answer about a token 60 s; the handlers ask afresh where that answer grants
        more than the caller's own figures
        (:attr:`~gpuspawner.hub.service_base.ServiceHandler.fresh`)."""
        if self._hub_auth is None:
            api_url = self._hub_api_url or _hub_app().hub.api_url
            self._hub_auth = FreshHubOAuth(
                api_token=self.api_token,
                api_url=api_url,
                base_url=self.prefix,
                hub_prefix=self.hub_prefix,
                oauth_client_id=f"service-{self.name}",
                oauth_redirect_uri=self.prefix + "oauth_callback",
                access_scopes={f"access:services!service={self.name}"},
                cache_max_age=60,
            )
        return self._hub_auth

    def is_admin(self, model: dict[str, Any], token: bool = False) -> bool:
        """Admin view: the custom scope or unfiltered ``admin:users`` among the scopes of
        what authenticated the request; for a browser login to this service (``token``
        False: the service's own OAuth cookie) also the hub's admin flag. A token sent in
        a header must carry the scope itself: the model's ``admin`` says what the token's
        owner is, not what the token may do, and an admin's server token (which any code in
        that server reads from its environment) carries only what ``server_token_scopes``
        grants."""
        scopes = set(model.get("scopes") or [])
        if ADMIN_SCOPE in scopes or "admin:users" in scopes:
            return True
        if token or model.get("kind", "user") != "user":
            return False
        if model.get("admin"):
            return True
        info = self.user_lookup(model["name"])
        return bool(info and info[0])

    def make_app(self) -> web.Application:
        p = self.prefix
        kw = {"service": self}
        # every response: not to be framed by another site (gpuspawner.webui.headers)
        return add_frame_headers(web.Application([
            (p.rstrip("/") + "/?", RootHandler, kw),
            (p + "admin", AdminPageHandler, kw),
            (p + "api/nodes", NodesHandler, kw),
            (p + "api/allocations", AllocationsHandler, kw),
            (p + r"api/gpus/([^/]+)/drain", GPUDrainHandler, kw),
            (p + r"api/users/([^/]+)/usage", UsageHandler, kw),
            (p + "api/queue", QueueHandler, kw),
            (p + "api/openapi.json", OpenAPIHandler, kw),
            (p + "api/schemas", SchemasHandler, kw),
            (p + r"api/schemas/([^/]+)", SchemaHandler, kw),
            (p + "metrics", MetricsHandler, kw),
            (p + "oauth_callback", CallbackHandler, kw),
            *(route for routes in self.extra_routes for route in routes(p, kw)),
        ], cookie_secret=secrets.token_bytes(32), default_handler_class=NotFoundHandler,
            default_handler_args=kw, xsrf_cookies=False, log_function=_log_request))

    def listen(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind ``host:port`` now (0 = a free port) and serve on the running loop.

        Returns:
            the bound port.
        """
        sockets = bind_sockets(port, host)
        self.port = sockets[0].getsockname()[1]
        self.server = HTTPServer(self.make_app(), xheaders=True)
        self.server.add_sockets(sockets)
        return self.port

    def listen_for_servers(self, host: str, port: int = 0) -> int:
        """Also serve on ``host:port`` (0 = a free port), for the users' servers: the hub
        network's gateway address, where containers reach the hub API and the proxy's
        loopback address is out of their reach (jupyter-scheduler's UI in JupyterLab sends
        notebook jobs here with the server's token; docs/jobs.md). Every request is
        authenticated with the hub as on the main port. Its own application: no
        ``X-Forwarded-*`` headers are trusted there (anyone on a server network may send
        them) and the main port's OAuth cookies do not apply.

        Returns:
            the bound port.
        """
        sockets = bind_sockets(port, host)
        self.servers_server = HTTPServer(self.make_app(), xheaders=False)
        self.servers_server.add_sockets(sockets)
        return int(sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def resume_queue(service: GPUService, *, deadline_s: float = 300.0,
                       cluster: Callable[[], Cluster] | None = None) -> list[str]:
    """After a hub restart: spawn again, through the hub's REST API with the service's token
    and each entry's ``user_options``, the servers whose entries the queue file kept, so each
    spawn claims its old place (:mod:`gpuspawner.hub.spawn_queue`). Also starts the queue's
    tick. Waits up to ``deadline_s`` seconds for the hub API to answer.

    Returns:
        ``"user/server"`` of each spawn requested (a refused request is logged).
    """
    from jupyterhub.utils import make_ssl_context
    from tornado.escape import url_escape
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    client = AsyncHTTPClient()
    while True:  # the hub's API answers once JupyterHub.start has run
        try:
            app = _hub_app()
            api = app.hub.api_url.rstrip("/") + "/"
            ssl = make_ssl_context(app.internal_ssl_key, app.internal_ssl_cert,
                                   cafile=app.internal_ssl_ca) if app.internal_ssl else None
            await client.fetch(api, ssl_options=ssl, request_timeout=5)
            break
        except (web.HTTPError, OSError, HTTPClientError) as e:
            if loop.time() > end:
                log.error("wait queue: the hub API did not answer in %g s (%s); queued "
                          "servers are not spawned again", deadline_s, e)
                return []
            await asyncio.sleep(1.0)
    c = (cluster or hub_cluster)()
    if c.queue is None:
        return []
    c.queue.start()
    done = []
    for e in c.queue.restored_entries():
        if is_job_server(e.owner.server):
            continue  # a notebook job claims its place itself (gpuspawner.hub.jobs.runner)
        who = f"{e.owner.user}/{e.owner.server}"
        path = f"users/{url_escape(e.owner.user, plus=False)}/" + (
            f"servers/{url_escape(e.owner.server, plus=False)}" if e.owner.server else "server")
        req = HTTPRequest(api + path, method="POST", body=json.dumps(e.options),
                          headers={"Authorization": f"token {service.api_token}",
                                   "Content-Type": "application/json"},
                          ssl_options=ssl, request_timeout=30)
        try:
            resp = await client.fetch(req, raise_error=False)
        except OSError as err:
            log.error("wait queue: spawning %s again failed: %s", who, err)
            continue
        if resp.code >= 400:
            log.error("wait queue: spawning %s again refused: %s %s", who, resp.code,
                      resp.body[:300] if resp.body else b"")
            continue
        log.info("wait queue: %s spawned again to claim its place (%s)", who, resp.code)
        done.append(who)
    return done


def _log_request(handler: web.RequestHandler) -> None:
    status = handler.get_status()
    level = logging.WARNING if status >= 500 else logging.DEBUG
    log.log(level, "gpuspawner service %s %s %s %.1fms", status, handler.request.method,
            handler.request.uri, 1000 * handler.request.request_time())
