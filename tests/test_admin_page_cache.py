"""The admin GPU map's kept pages (gpuspawner/hub/service/page_cache.py) over HTTP.

Most tests run the service's own Tornado application with its real ``HubOAuth`` asking a
stand-in hub API (``GET /hub/api/user`` answering per token, loopback; as
tests/test_gpu_drain_service.py), so that a user and a service of the same name can call it;
one runs it in the in-process hub (tests/inprocess_hub.py: real tokens, a real spawn and stop).
Renders are counted by wrapping the ``map_view`` the handler calls; the cache's clock is the
test's own (no sleep).

- a kept page is served while nothing changed; a booking, a release, a drain, an undrain, a
  health reading and a move each show at the next request;
- each response carries its own request's xsrf token (the one its ``_xsrf`` cookie sets), never
  another viewer's; a kept page is byte for byte the page the handler renders;
- a user and a service of the same name get pages of their own; so do names with separator
  characters;
- at most 8 pages kept after 24 query strings, the least recently used dropped;
- a non-admin gets 403 and nothing is kept; a page is served at most 15 s after its copy.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPResponse

from gpuspawner.backends.base import Backend
from gpuspawner.hub.cluster import Cluster
from gpuspawner.hub.drains import DrainStore
from gpuspawner.hub.service import app as service_app
from gpuspawner.hub.service.app import GPUService
from gpuspawner.hub.service.frozen import FrozenCluster
from gpuspawner.hub.service.page_cache import MAX_AGE_S, MAX_PAGES, PageCache, page_key
from gpuspawner.hub.service.views import map_view
from gpuspawner.hub.service_base import ADMIN_SCOPE
from gpuspawner.inventory.health import GPUHealth
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Bundle, Ledger, Owner
from gpuspawner.webui import REFRESH_S, service_links
from tests.inprocess_hub import runtime
from tests.test_gpu_drain_service import FakeHubUser, _serve
from tests.test_spawner_inprocess import PROFILES, api, start, stopped
from tests.test_usage_hub import token_of

TOPO = Path(__file__).parent / "data" / "topologies"
ACCESS = "access:services!service=gpuspawner"
ADMIN = [ACCESS, ADMIN_SCOPE]
#: token -> the stand-in hub's model of its owner
MODELS = {
    "root-token": {"kind": "user", "name": "root", "admin": True, "groups": [],
                   "scopes": ADMIN},
    "ann-token": {"kind": "user", "name": "ann", "admin": True, "groups": [], "scopes": ADMIN},
    "bob-token": {"kind": "user", "name": "bob", "admin": True, "groups": [], "scopes": ADMIN},
    # a service named as the user ann, with the admin view
    "ann-service-token": {"kind": "service", "name": "ann", "scopes": ADMIN},
    # names that a joined key would confuse: "a|b" + "c" and "a" + "b|c"
    "sep1-token": {"kind": "user", "name": "a|b", "admin": True, "groups": [], "scopes": ADMIN},
    "sep2-token": {"kind": "user", "name": "a", "admin": True, "groups": [], "scopes": ADMIN},
    "carl-token": {"kind": "user", "name": "carl", "admin": False, "groups": [],
                   "scopes": [ACCESS]},
}


class Clock:
    """The cache's clock: seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster(tmp_path) -> Cluster:
    dgx = load_topology_file(str(TOPO / "dgx-a100.yaml"))
    ledger = Ledger([dgx], policy="first-fit")
    ledger.reserve(Bundle(cores=2, memory_bytes=2**30, gpus=1, numa_policy="none"),
                   Owner("alice"))
    c = Cluster({dgx.name: None}, ledger, Backend(),  # type: ignore[dict-item]
                drain_store=DrainStore(str(tmp_path / "drains.json")))
    c.load_drains()
    return c


@pytest.fixture
def renders(monkeypatch) -> list[int]:
    """One entry per admin map view made (the handler's ``map_view``, wrapped)."""
    made: list[int] = []

    def counted(cluster: Any) -> dict[str, Any]:
        made.append(1)
        return map_view(cluster)

    monkeypatch.setattr(service_app, "map_view", counted)
    return made


@pytest.fixture
async def served(cluster):
    """(the service, its URL prefix, the cache's clock)."""
    hub, hub_port = _serve(web.Application([(r"/hub/api/user", FakeHubUser, {"models": MODELS})]))
    service = GPUService("gpuspawner", "t" * 64,
                         hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api",
                         cluster_provider=lambda: cluster,
                         user_lookup=lambda name: (name == "root", []))
    clock = Clock()
    service.map_pages = PageCache(clock=clock)
    server, port = _serve(service.make_app())
    yield service, f"http://127.0.0.1:{port}{service.prefix}", clock
    for s in (server, hub):
        s.stop()
        await s.close_all_connections()


async def get(url: str, token: str, agent: str = "test", path: str = "admin") -> HTTPResponse:
    """``GET <path>`` with ``token``; ``agent``: the User-Agent (the hub's xsrf token of a
    token-authenticated request is made from the client's address and agent)."""
    return await AsyncHTTPClient().fetch(
        url + path, headers={"Authorization": f"token {token}", "User-Agent": agent},
        raise_error=False, follow_redirects=False)


def page_xsrf(r: HTTPResponse) -> str:
    """The xsrf token in the page's ``<meta name="xsrf-token">``."""
    found = re.findall(r'<meta name="xsrf-token" content="([^"]*)">', r.body.decode())
    assert len(found) == 1, found
    return found[0]


def cookie_xsrf(r: HTTPResponse) -> str:
    """The ``_xsrf`` cookie the response sets (the request's own token)."""
    cookies = [c for c in r.headers.get_list("Set-Cookie") if c.startswith("_xsrf=")]
    assert len(cookies) == 1, r.headers.get_list("Set-Cookie")
    return cookies[0].split(";")[0].removeprefix("_xsrf=").strip('"')


async def test_a_kept_page_is_served_while_nothing_changed(served, renders, cluster):
    service, url, _ = served
    first = await get(url, "root-token")
    assert first.code == 200, first.body
    assert len(renders) == 1 and len(service.map_pages) == 1
    for _ in range(3):
        again = await get(url, "root-token")
        assert again.code == 200
        assert again.headers["Cache-Control"] == "no-store"
        assert again.headers["Content-Type"] == "text/html; charset=UTF-8"
    assert len(renders) == 1, "a kept page is served while nothing changed"
    assert service.map_pages.hits == 3
    # byte for byte the page the handler renders for that request (its xsrf token included)
    token = page_xsrf(again)
    rendered = service.templates.get_template("admin.html.j2").render(
        view=map_view(FrozenCluster(cluster)), user={"name": "root", "admin": True},
        prefix=service.prefix, hub_prefix=service.hub_prefix, refresh_s=REFRESH_S,
        xsrf=token, links=service_links(service.services_prefix, "GPU map"),
        api_links=[("REST API (OpenAPI)", f"{service.prefix}api/openapi.json"),
                   ("nodes", f"{service.prefix}api/nodes"),
                   ("allocations", f"{service.prefix}api/allocations"),
                   ("metrics", f"{service.prefix}metrics")])
    assert again.body == rendered.encode("utf-8")


async def test_an_allocation_a_stop_a_drain_a_reading_and_a_move_show_at_once(
        served, renders, cluster):
    service, url, _ = served

    async def page() -> str:
        r = await get(url, "root-token")
        assert r.code == 200, r.body
        return r.body.decode()

    await page()
    assert len(renders) == 1
    # a new allocation
    alloc = cluster.ledger.reserve(Bundle(cores=1, gpus=1, numa_policy="none"), Owner("dora"))
    html = await page()
    assert f'data-allocation="{alloc.id}" data-user="dora"' in html
    assert len(renders) == 2
    await page()
    assert len(renders) == 2
    # a stop
    cluster.ledger.release(alloc.id)
    html = await page()
    assert alloc.id not in html and 'data-user="dora"' not in html
    assert len(renders) == 3
    # a drain through the API, then its undrain
    uuid = cluster.ledger.nodes[0].gpus[5].uuid
    r = await AsyncHTTPClient().fetch(f"{url}api/gpus/{uuid}/drain", method="POST",
                                      headers={"Authorization": "token root-token"},
                                      body=b'{"reason": "fan noise"}', raise_error=False)
    assert r.code == 200, r.body
    html = await page()
    assert f'data-gpu="{uuid}"' in html
    assert 'data-drained="fan noise" data-drained-by="root"' in html
    assert len(renders) == 4
    r = await AsyncHTTPClient().fetch(f"{url}api/gpus/{uuid}/drain", method="DELETE",
                                      headers={"Authorization": "token root-token"},
                                      raise_error=False)
    assert r.code == 200, r.body
    html = await page()
    assert 'data-drained="fan noise"' not in html
    assert len(renders) == 5
    # a health reading (the first of a GPU, then a new one of it)
    gpu = cluster.ledger.nodes[0].gpus[6]
    cluster.last_health[gpu.uuid] = GPUHealth(gpu.uuid, gpu.index, False, ["xid 79"])
    html = await page()
    assert "xid 79" in html
    assert len(renders) == 6
    cluster.last_health[gpu.uuid] = GPUHealth(gpu.uuid, gpu.index, False, ["xid 48"])
    html = await page()
    assert "xid 48" in html and "xid 79" not in html
    assert len(renders) == 7
    # a server moved off a failed node
    cluster.record_move("erin", "", "n1", "n2", 1_764_000_000.0, "node n1 does not answer")
    html = await page()
    assert "node n1 does not answer" in html
    assert len(renders) == 8
    await page()
    assert len(renders) == 8


async def test_each_page_carries_its_own_requests_xsrf_token(served, renders):
    _, url, _ = served
    ann1 = await get(url, "ann-token", agent="ann-firefox")
    ann2 = await get(url, "ann-token", agent="ann-chromium")  # the kept page
    bob = await get(url, "bob-token", agent="bob-firefox")
    assert all(r.code == 200 for r in (ann1, ann2, bob))
    assert len(renders) == 2  # ann's page kept, bob's made
    for r in (ann1, ann2, bob):
        assert page_xsrf(r) == cookie_xsrf(r), "the page holds the request's own token"
    tokens = {page_xsrf(r) for r in (ann1, ann2, bob)}
    assert len(tokens) == 3
    for ann in (ann1, ann2):
        assert page_xsrf(ann).encode() not in bob.body
        assert page_xsrf(bob).encode() not in ann.body
    assert page_xsrf(ann1).encode() not in ann2.body
    # and after a change, bob's new page still carries bob's token only
    bob2 = await get(url, "bob-token", agent="bob-chromium")
    assert page_xsrf(bob2) == cookie_xsrf(bob2)
    for r in (ann1, ann2, bob):
        assert page_xsrf(r).encode() not in bob2.body


async def test_a_user_and_a_service_of_one_name_get_pages_of_their_own(served, renders):
    service, url, _ = served
    user = await get(url, "ann-token")
    assert user.code == 200 and len(renders) == 1
    svc = await get(url, "ann-service-token")
    assert svc.code == 200, svc.body
    assert len(renders) == 2, "the service was served the user's kept page"
    assert page_xsrf(svc) == cookie_xsrf(svc)
    assert len(service.map_pages) == 2
    # names with a separator character and a query string that would join alike
    a = await get(url, "sep1-token", path="admin?c")
    b = await get(url, "sep2-token", path="admin?b|c")
    assert a.code == b.code == 200
    assert len(renders) == 4 and len(service.map_pages) == 4
    keys = {page_key("user", "a|b", "r", "c"), page_key("user", "a", "r", "b|c"),
            page_key("service", "ann", "r", ""), page_key("user", "ann", "r", "")}
    assert len(keys) == 4


async def test_at_most_eight_pages_after_twenty_four_query_strings(served, renders):
    service, url, _ = served
    assert MAX_PAGES == 8
    for i in range(24):
        r = await get(url, "root-token", path=f"admin?v={i}")
        assert r.code == 200
        assert len(service.map_pages) <= MAX_PAGES
    assert len(renders) == 24 and len(service.map_pages) == MAX_PAGES
    await get(url, "root-token", path="admin?v=23")  # kept: the most recent
    assert len(renders) == 24
    await get(url, "root-token", path="admin?v=16")  # kept: the oldest of the eight
    assert len(renders) == 24
    await get(url, "root-token", path="admin?v=0")  # dropped long ago
    assert len(renders) == 25 and len(service.map_pages) == MAX_PAGES
    # v=17 was the least recently used (16 was read again): dropped for v=0
    await get(url, "root-token", path="admin?v=17")
    assert len(renders) == 26


async def test_a_non_admin_gets_403_and_nothing_is_kept(served, renders):
    service, url, _ = served
    r = await get(url, "carl-token")
    assert r.code == 403, r.body
    assert b"GPU map is for hub admins" in r.body
    assert len(service.map_pages) == 0 and renders == []
    r = await get(url, "no-such-token")
    assert r.code == 302  # to the hub's login
    assert len(service.map_pages) == 0 and renders == []


async def test_a_page_is_served_at_most_fifteen_seconds(served, renders):
    service, url, clock = served
    assert MAX_AGE_S == 15.0
    await get(url, "root-token")
    assert len(renders) == 1
    clock.now += 14.9
    await get(url, "root-token")
    assert len(renders) == 1
    clock.now += 0.2  # 15.1 s after the copy
    await get(url, "root-token")
    assert len(renders) == 2
    clock.now += 10.0
    await get(url, "root-token")
    assert len(renders) == 2


def test_page_cache_unit_lru_and_stamp(cluster):
    """The cache alone: a stamp equals one read again while nothing changed (the ledger's
    snapshot keeps unchanged nodes' dicts), and differs after a booking."""
    clock = Clock()
    cache = PageCache(max_pages=2, clock=clock)
    s1, s2 = cache.stamp(cluster), cache.stamp(cluster)
    assert s1.same(s2) and all(a is b for a, b in zip(s1.nodes, s2.nodes, strict=True))
    cluster.ledger.reserve(Bundle(cores=1, numa_policy="none"), Owner("x"))
    assert not s1.same(cache.stamp(cluster))
    with pytest.raises(ValueError):
        PageCache(max_pages=0)


async def test_in_process_hub_spawn_and_stop_show_at_the_next_request(
        inprocess_hub, monkeypatch, renders):
    """The in-process hub (real tokens and scopes): ann's spawn through the hub shows on the
    admin's kept page at the next request, and so does its stop; a second GET in between is
    served from the cache."""
    caches: list[PageCache] = []

    def made() -> PageCache:
        caches.append(PageCache())
        return caches[-1]

    monkeypatch.setattr(service_app, "PageCache", made)
    app, url = await inprocess_hub("cache-n1", PROFILES, service=True)
    root = await token_of(app, "admin")
    await token_of(app, "ann")

    async def page() -> str:
        r = await AsyncHTTPClient().fetch(url + "admin",
                                          headers={"Authorization": f"token {root}"},
                                          raise_error=False)
        assert r.code == 200, r.body
        return r.body.decode()

    assert 'data-user="ann"' not in await page()
    await page()
    assert len(renders) == 1 and caches[0].hits == 1
    r = await start(app, "ann", "", {"profile": "a100-1"})
    assert r.status_code in (201, 202), r.text
    [alloc] = runtime(app).ledger.allocations()
    assert f'data-allocation="{alloc.id}" data-user="ann"' in await page()
    assert len(renders) == 2
    r = await api(app, "delete", "users", "ann", "server")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "ann")
    assert alloc.id not in await page()
    assert len(renders) == 3
