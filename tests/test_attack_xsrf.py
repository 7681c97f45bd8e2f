"""Hostile review: cross-site request forgery (CSRF) against the gpuspawner service with a
hub admin's browser login.

The service's Tornado application runs with ``xsrf_cookies=False``: Tornado itself checks no
XSRF token. What stands between a page of another site (or another user's server, which in
JupyterHub without subdomains shares the hub's origin, so ``SameSite`` cookies do not help)
and the admin's writing endpoints is JupyterHub's ``HubOAuth``: it accepts the service's OAuth
login cookie as the caller of a writing request (POST/PUT/PATCH/DELETE) only when the request
carries that login's XSRF token (``X-XSRFToken`` or ``_xsrf``;
``HubOAuth._get_user_cookie`` -> ``handler.check_xsrf_cookie`` ->
``jupyterhub._xsrf_utils.check_xsrf_cookie``, which the service's ``ServiceHandler`` inherits
from ``HubAuthenticated`` unchanged). Without it the cookie authenticates nobody and the
handler answers 401. The bodies need no CORS preflight to hurt: the handlers parse the raw
body as JSON whatever its ``Content-Type``, so a cross-site ``<form enctype="text/plain">``
can send ``{"reason": ...}``.

Replayed here in pytest-jupyterhub's in-process hub (tests/inprocess_hub.py) with the service
on loopback, its notebook jobs started (``api/jobs``, ``api/job_definitions``) as
``configure_service`` starts them, and real browser logins: the hub's login form, then the
service's OAuth dance through the hub (authorize, ``oauth_callback``), which leaves the
service's login cookie, the session id and the service's ``_xsrf`` cookie, and the admin page
with the ``xsrf-token`` meta its ``fetch()`` calls send. Every route of the running
application whose handler answers a writing method is found from its routes (a new one fails
:func:`test_the_writing_routes_are_the_ones_replayed` until it is given arguments here), and
each is sent with the admin's cookies:

- no XSRF token, plain; as a cross-site form post and a cross-site ``fetch`` (Fetch Metadata
  ``Sec-Fetch-Site: cross-site``, ``Origin: https://evil.example``); as a same-origin
  ``fetch`` from another user's server; with a bogus ``Authorization`` header beside;
- the XSRF token of another login (mallory's, from her own visit to the admin page) in the
  header, as the ``_xsrf`` argument, and with her ``_xsrf`` cookie tossed in place of the
  admin's.

Each must be answered 401 and change nothing (no GPU drained or undrained, no definition
changed, deleted or made, no job). The positive control then sends the same cookies with the
admin's own token, as the page does: every handler is reached (the GPU drain drains and
undrains), so the 401s are the missing token's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from jupyterhub import orm
from jupyterhub.services.auth import HubAuthenticated
from jupyterhub.tests.utils import AsyncSession
from jupyterhub.utils import random_port
from sqlalchemy import event
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httputil import url_concat

import tests.inprocess_hub as inprocess_hub_module
from gpuspawner.hub.jobs import metrics as job_metrics
from gpuspawner.hub.jobs import runner as jobs_runner
from gpuspawner.hub.jobs import service as jobs_service
from gpuspawner.hub.service.app import GPUService
from gpuspawner.hub.service.profiles_api import profile_routes
from gpuspawner.testing.inprocess import wait_for
from gpuspawner.usage.api import usage_routes
from tests.inprocess_hub import runtime
from tests.test_jobs_units import notebook
from tests.test_spawner_inprocess import PROFILES
from tests.test_usage_hub import token_of

NODE = "xsrf-n1"
#: the GPUs of :data:`NODE` (tests.inprocess_hub: two A100s): the first undrained during the
#: replay (the target of the forged drains), the second drained (of the forged undrains)
FREE_GPU, DRAINED_GPU = f"GPU-{NODE}-0", f"GPU-{NODE}-1"
WRITING = ("post", "put", "patch", "delete")
#: the attacker's site
EVIL = "https://evil.example"
#: a definition that never runs (paused): what the forged requests aim at
DEFINITION = {"notebook": notebook("print(x)"), "profile": "cpu", "schedule": "0 3 * * *",
              "name": "nightly", "paused": True, "time_limit": 60}


@dataclass
class Login:
    """A browser after logging in to the hub and opening the service's admin page: its
    cookies (name, path, value) and its login's xsrf token (:func:`browser_login`)."""

    name: str
    cookies: list[tuple[str, str, str]]
    xsrf: str

    def cookie_header(self, path: str, **replace: str) -> str:
        """The ``Cookie`` header a browser sends to ``path`` of the service's host: the
        cookies whose path is a prefix of it (``replace``: name -> another value)."""
        sent = {name: value for name, cpath, value in
                sorted(self.cookies, key=lambda c: len(c[1]))
                if path.startswith(cpath)}
        sent.update(replace)
        return "; ".join(f"{k}={v}" for k, v in sent.items())

    def cookie(self, name: str, path: str) -> str:
        """The value of cookie ``name`` a browser sends to ``path``."""
        found = [v for n, p, v in sorted(self.cookies, key=lambda c: len(c[1]))
                 if n == name and path.startswith(p)]
        assert found, (name, path, self.cookies)
        return found[-1]


@dataclass
class Hub:
    """The :func:`hub` fixture: the MockHub, the service's URL (its prefix included), the
    service, an API token of the hub's admin (``admin``)."""

    app: Any
    url: str
    service: GPUService
    admin_token: str


@pytest.fixture
async def hub(inprocess_hub, monkeypatch) -> AsyncIterator[Hub]:
    """The in-process hub at base URL ``/`` (so the service's OAuth redirect URI is the one the
    hub registered) with the service on loopback, its routes as ``configure_service`` gives
    them (jobs, profiles, usage) and its notebook jobs started; the admin's API token. The
    fake engine counts as a backend of jobs (the definitions made here are paused: nothing
    runs; without it making one is a 503). What starting jobs leaves in the process (the
    store the jobs metrics count, the hub's user deletions handed to these jobs, their
    SQLAlchemy listener) is undone afterwards."""
    made: list[GPUService] = []
    monkeypatch.setattr(jobs_runner, "JOB_BACKENDS", (*jobs_runner.JOB_BACKENDS, "fake"))
    monkeypatch.setattr(job_metrics, "_STORES", [])
    monkeypatch.setattr(jobs_service, "_DELETIONS", [])
    listened = event.contains(orm.User, "after_delete", jobs_service._user_deleted)

    class WithJobs(GPUService):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["extra_routes"] = [jobs_service.job_routes, profile_routes, usage_routes]
            super().__init__(*args, **kwargs)
            made.append(self)

        def listen(self, host: str = "127.0.0.1", port: int = 0) -> int:
            bound = super().listen(host, port)
            jobs_service.configure_jobs(self)  # started once the hub runs
            return bound

    monkeypatch.setattr(inprocess_hub_module, "GPUService", WithJobs)
    app, url = await inprocess_hub(
        NODE, PROFILES, service=True,
        config={"JupyterHub": {"bind_url": f"http://127.0.0.1:{random_port()}/"}})
    (service,) = made
    jobs = service.jobs
    await wait_for(jobs.ready.is_set, 30, message="the service's notebook jobs ready")
    assert jobs.runner is not None, jobs.error
    yield Hub(app, url, service, await token_of(app, "admin"))
    if jobs.scheduler is not None:
        await jobs.scheduler.stop()
    await jobs.runner.stop()
    jobs.runner.store.close()
    if not listened and event.contains(orm.User, "after_delete", jobs_service._user_deleted):
        event.remove(orm.User, "after_delete", jobs_service._user_deleted)


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


async def browser_login(hub: Hub, name: str) -> Login:
    """``name`` logs in with the hub's login form (straight to the hub: no proxy here), opens
    the service's admin page and follows the OAuth redirects through the hub back to it (each
    Location read against the hub's or the service's address). The login's xsrf token: the
    page's ``xsrf-token`` meta for an admin (checked to be the ``_xsrf`` cookie the service
    set), the ``_xsrf`` cookie for anyone else (the page is 403 then; the cookie is the
    token the service expects of that login)."""
    s = AsyncSession()
    hub_url = hub.app.hub.url  # http://127.0.0.1:PORT/hub/
    hub_origin = origin(hub_url)
    r = await s.get(hub_url + "login")
    r.raise_for_status()
    r = await s.post(url_concat(hub_url + "login", {"_xsrf": r.cookies["_xsrf"]}),
                     data={"username": name, "password": name}, allow_redirects=False)
    assert r.status_code == 302, r.text
    url, hops = hub.url + "admin", []
    for _ in range(6):  # admin -> authorize -> oauth_callback -> admin
        r = await s.get(url, allow_redirects=False)
        if r.status_code != 302:
            break
        location = r.headers["Location"]
        base = hub_origin if urlsplit(location).path.startswith("/hub/") else hub.service.url
        url = location if "://" in location else base + location
        hops.append(urlsplit(url).path)
    assert hops == [hub.app.hub.base_url + "api/oauth2/authorize",
                    hub.service.prefix + "oauth_callback", hub.service.prefix + "admin"], hops
    cookies = [(c.name, c.path or "/", c.value) for c in s.cookies]
    login = Login(name, cookies, "")
    assert {"jupyterhub-session-id", hub.service.hub_auth.cookie_name} <= {
        c[0] for c in cookies}
    login.xsrf = login.cookie("_xsrf", hub.service.prefix)
    admin = hub.app.users[name].admin
    assert r.status_code == (200 if admin else 403), (r.status_code, r.text[:300])
    if admin:
        m = re.search(r'<meta name="xsrf-token" content="([^"]+)">', r.text)
        assert m and m.group(1) == login.xsrf, r.text[:500]
    return login


async def send(url: str, method: str, headers: dict[str, str], body: Any) -> tuple[int, str]:
    """(status, body) of one request, redirects not followed."""
    r = await AsyncHTTPClient().fetch(
        url, method=method.upper(), headers=headers, follow_redirects=False,
        raise_error=False, allow_nonstandard_methods=True,
        body=None if body is None else json.dumps(body).encode())
    return r.code, r.body.decode(errors="replace") if r.body else ""


def writing_routes(app: web.Application) -> dict[tuple[str, str], type]:
    """(route pattern, method) -> handler class, for every route of ``app`` whose handler
    overrides a writing method of ``RequestHandler``."""
    found = {}
    for rule in app.wildcard_router.rules:
        cls = rule.target
        if not (isinstance(cls, type) and issubclass(cls, web.RequestHandler)):
            continue
        for method in WRITING:
            if getattr(cls, method) is not getattr(web.RequestHandler, method):
                found[(rule.matcher.regex.pattern, method)] = cls
    return found


# -- the forged requests -------------------------------------------------------------------
#: (variant, what it adds to the admin's cookies): each a browser request the admin did not
#: mean (mallory's: her own login's token or cookie, see :func:`forged_headers`)
VARIANTS = ("plain, no token", "cross-site form post", "cross-site fetch",
            "same-origin fetch from a user's server", "bogus Authorization header",
            "another login's token", "another login's token as _xsrf argument",
            "another login's token and _xsrf cookie")


def forged_headers(variant: str, path: str, admin: Login, mallory: Login,
                   hub_origin: str) -> tuple[dict[str, str], dict[str, str]]:
    """(headers, query arguments) of ``variant`` sent to ``path`` with the admin's cookies."""
    cookie = admin.cookie_header(path)
    headers = {"Cookie": cookie, "Content-Type": "application/json"}
    query: dict[str, str] = {}
    if variant == "cross-site form post":
        headers.update({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate",
                        "Sec-Fetch-Dest": "document", "Origin": EVIL,
                        "Referer": f"{EVIL}/", "Content-Type": "text/plain"})
    elif variant == "cross-site fetch":
        headers.update({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors",
                        "Sec-Fetch-Dest": "empty", "Origin": EVIL, "Referer": f"{EVIL}/"})
    elif variant == "same-origin fetch from a user's server":
        headers.update({"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors",
                        "Sec-Fetch-Dest": "empty", "Origin": hub_origin,
                        "Referer": f"{hub_origin}/user/mallory/files/x.html"})
    elif variant == "bogus Authorization header":
        headers["Authorization"] = "token bogus"
    elif variant == "another login's token":
        headers["X-XSRFToken"] = mallory.xsrf
    elif variant == "another login's token as _xsrf argument":
        query["_xsrf"] = mallory.xsrf
    elif variant == "another login's token and _xsrf cookie":
        headers["X-XSRFToken"] = mallory.xsrf
        headers["Cookie"] = admin.cookie_header(path, _xsrf=mallory.cookie("_xsrf", path))
    else:
        assert variant == "plain, no token", variant
    return headers, query


@dataclass
class Target:
    """What one writing route and method is sent: its path's arguments, the body of the
    forged requests (one the handler would carry out), and of the positive control, with
    the status and a piece of the answer it gets (the handler reached, past the caller's
    check)."""

    args: Callable[[dict[str, str]], tuple[str, ...]]
    forged_body: Any
    control_body: Any
    control_status: int
    control_text: str


#: handler class name, method -> :class:`Target`, in the order they are sent (the
#: deletions last); ``ids``: "definition" -> the aimed-at definition's id, "job" -> an id
#: no job has
TARGETS: dict[tuple[str, str], Target] = {
    ("GPUDrainHandler", "post"): Target(lambda ids: (FREE_GPU,), {"reason": "csrf"},
                                        {"reason": "the page's own fetch"}, 200,
                                        '"drained_by": "admin"'),
    ("GPUDrainHandler", "delete"): Target(lambda ids: (DRAINED_GPU,), None, None, 200,
                                          '"drained": null'),
    ("JobsHandler", "post"): Target(lambda ids: (), {"notebook": notebook("print(x)"),
                                                     "profile": "cpu", "time_limit": 60},
                                    {}, 400, "notebook"),
    ("DefinitionsHandler", "post"): Target(lambda ids: (), DEFINITION, DEFINITION, 201,
                                           '"name": "nightly"'),
    ("DefinitionHandler", "patch"): Target(lambda ids: (ids["definition"],),
                                           {"paused": False}, {"name": "renamed"}, 200,
                                           '"name": "renamed"'),
    ("DefinitionJobsHandler", "post"): Target(lambda ids: (ids["definition"],), {},
                                              {"nonsense": 1}, 400, "parameters only"),
    ("JobHandler", "delete"): Target(lambda ids: (ids["job"],), None, None, 404,
                                     "no job 000"),
    ("DefinitionHandler", "delete"): Target(lambda ids: (ids["definition"],), None, None,
                                            200, '"name": "renamed"'),
}
#: what the service answers a request whose caller it does not know (ServiceHandler's 401)
NOBODY = "log in to the hub or send a JupyterHub API token"


def path_of(pattern: str, args: tuple[str, ...]) -> str:
    """The path of route ``pattern`` (a regular expression ending in ``$``) with its groups
    replaced by ``args``."""
    parts = re.split(r"\([^)]*\)", pattern.removesuffix("$"))
    assert len(parts) == len(args) + 1, (pattern, args)
    out = parts[0]
    for arg, rest in zip(args, parts[1:], strict=True):
        out += arg + rest
    return out


async def state(hub: Hub) -> dict[str, Any]:
    """What a forged request could change: the drains (GPU -> reason, by), the GPUs
    ``api/nodes`` shows drained, the definitions as stored and the jobs."""
    cluster = runtime(hub.app)
    r = await AsyncHTTPClient().fetch(hub.url + "api/nodes", headers={
        "Authorization": f"token {hub.admin_token}"})
    listed = sorted(g["uuid"] for n in json.loads(r.body) for g in n["gpus"]
                    if g.get("drained"))
    runner = hub.service.jobs.runner
    return {
        "drains": {u: (d.reason, d.by) for u, d in cluster.drain_records().items()},
        "api/nodes drained": listed,
        "definitions": [jobs_service.definition_view(d)
                        for d in runner.store.definitions()],
        "jobs": [j.id for j in runner.store.list(None)],
    }


# -- the tests -----------------------------------------------------------------------------
def test_the_writing_routes_are_the_ones_replayed():
    """The service as ``configure_service`` builds it (its extra routes: jobs, profiles,
    usage) has exactly the writing routes and methods :data:`TARGETS` replays, and Tornado's
    own XSRF check is off (so ``HubOAuth``'s is the only one)."""
    service = GPUService("gpuspawner", "t" * 64, hub_api_url="http://127.0.0.1:1/hub/api",
                         extra_routes=[jobs_service.job_routes, profile_routes,
                                       usage_routes])
    app = service.make_app()
    assert app.settings["xsrf_cookies"] is False
    found = {(cls.__name__, method) for (_, method), cls in writing_routes(app).items()}
    assert found == set(TARGETS)
    # no handler of the service overrides JupyterHub's check (HubAuthenticated's)
    for cls in {cls for cls in writing_routes(app).values()}:
        assert cls.check_xsrf_cookie is HubAuthenticated.check_xsrf_cookie, cls


async def test_cross_site_writes_with_the_admin_cookie_are_refused(hub: Hub):
    """Every writing route and method of the running service, sent with the admin's login
    cookie in each of :data:`VARIANTS`: all 401 (the cookie authenticates nobody without the
    login's own XSRF token), nothing changed. Then the same cookie with the admin's own token
    (the page's ``X-XSRFToken``) reaches each handler: the drain drains, the undrain
    undrains."""
    t0 = time.monotonic()
    admin, mallory = await browser_login(hub, "admin"), await browser_login(hub, "mallory")
    assert admin.xsrf != mallory.xsrf
    prefix = hub.service.prefix
    hub_origin = origin(hub.app.hub.url)
    token = {"Authorization": f"token {hub.admin_token}"}
    # the state aimed at: one GPU drained, one definition (paused), no job
    code, body = await send(f"{hub.url}api/gpus/{DRAINED_GPU}/drain", "post", token,
                            {"reason": "fan noise"})
    assert code == 200, body
    code, body = await send(f"{hub.url}api/job_definitions", "post", token, DEFINITION)
    assert code == 201, body
    ids = {"definition": json.loads(body)["id"], "job": "0" * 32}
    before = await state(hub)
    assert before["drains"] == {DRAINED_GPU: ("fan noise", "admin")}
    assert before["api/nodes drained"] == [DRAINED_GPU]

    routes = writing_routes(hub.service.server.request_callback)
    assert {(cls.__name__, m) for (_, m), cls in routes.items()} == set(TARGETS)
    order = list(TARGETS)
    plan = []  # (name, method, path, target), in the order of TARGETS
    for (pattern, method), cls in sorted(
            routes.items(), key=lambda r: order.index((r[1].__name__, r[0][1]))):
        target = TARGETS[(cls.__name__, method)]
        path = path_of(pattern, target.args(ids))
        assert path.startswith(prefix), path
        plan.append((f"{cls.__name__} {method.upper()}", method, path, target))

    got: dict[tuple[str, str], tuple[int, bool]] = {}  # -> (status, the 401 for nobody)
    for name, method, path, target in plan:
        for variant in VARIANTS:
            headers, query = forged_headers(variant, path, admin, mallory, hub_origin)
            url = url_concat(hub.service.url + path, query)
            code, body = await send(url, method, headers, target.forged_body)
            got[(name, variant)] = (code, NOBODY in body)
    through = {k: code for k, (code, nobody) in got.items() if (code, nobody) != (401, True)}
    assert through == {}, f"{len(through)} of {len(got)} forged requests not refused as " \
                          f"nobody's: {through}"
    assert await state(hub) == before

    # the positive control: the same cookie with the admin's own token, as the page's
    # fetch() sends it, reaches each handler
    reached = {}
    for name, method, path, target in plan:
        headers = {"Cookie": admin.cookie_header(path), "X-XSRFToken": admin.xsrf,
                   "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors",
                   "Sec-Fetch-Dest": "empty", "Origin": hub_origin,
                   "Content-Type": "application/json"}
        code, body = await send(hub.service.url + path, method, headers, target.control_body)
        reached[name] = code
        assert (code, target.control_text in body) == (target.control_status, True), (
            name, code, body[:300])
    after = await state(hub)
    assert after["drains"] == {FREE_GPU: ("the page's own fetch", "admin")}
    assert after["api/nodes drained"] == [FREE_GPU]
    assert [d["name"] for d in after["definitions"]] == ["nightly"]  # the one made now
    assert after["jobs"] == []
    print(f"\n{len(got)} forged requests over {len(plan)} writing routes and methods: "
          f"(status, the 401 for nobody) {sorted(set(got.values()))}; positive control: "
          f"{reached}; {time.monotonic() - t0:.1f} s")
