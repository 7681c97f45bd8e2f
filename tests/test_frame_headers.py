"""Every response of the project's hub services forbids framing by other sites
(gpuspawner.webui.headers): ``Content-Security-Policy: frame-ancestors 'none'`` and
``X-Frame-Options: DENY``.

The hole replayed (found probing as a hostile user): the admin GPU map
(``/services/gpuspawner/admin``, with its drain buttons), the culler's page and their APIs sent
neither header, so any web site could load them in an invisible frame over its own page and
have an admin click them (clickjacking); JupyterHub's own pages send ``frame-ancestors``.

The hub test (``docker``, ``hub``) asks through the real proxy of the shipped ``hub_config``,
logged in as the hub admin and not logged in, every page and API of both services, the
redirects and OAuth callbacks on the way and their errors.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlparse

import pytest
import requests
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from tests.waiting import wait_until

GPU = "/services/gpuspawner/"
CULLER = "/services/idle-culler/"


def assert_not_frameable(r: requests.Response) -> None:
    csp = r.headers.get("Content-Security-Policy", "")
    assert "frame-ancestors 'none'" in csp, (r.status_code, r.url, dict(r.headers))
    assert r.headers.get("X-Frame-Options") == "DENY", (r.status_code, r.url, dict(r.headers))


# -- without a hub ------------------------------------------------------------------------------
def test_frame_headers_on_every_response_of_an_application():
    from gpuspawner.webui.headers import FRAME_HEADERS, add_frame_headers

    class Page(web.RequestHandler):
        def get(self) -> None:
            self.write("page")

    class OwnPolicy(web.RequestHandler):
        def get(self) -> None:
            self.set_header("Content-Security-Policy", "default-src 'self'")
            self.write("own")

    class Fails(web.RequestHandler):
        def get(self) -> None:
            raise web.HTTPError(403)

    async def run() -> dict[str, tuple[int, dict[str, str]]]:
        sockets = bind_sockets(0, "127.0.0.1")
        port = sockets[0].getsockname()[1]
        app = add_frame_headers(web.Application([
            ("/page", Page), ("/own", OwnPolicy), ("/fails", Fails),
            ("/away", web.RedirectHandler, {"url": "/page"})]))
        add_frame_headers(app)  # once only
        server = HTTPServer(app)
        server.add_sockets(sockets)
        client = AsyncHTTPClient()
        out = {}
        for path in ("/page", "/own", "/fails", "/away", "/no-such-path"):
            r = await client.fetch(f"http://127.0.0.1:{port}{path}", raise_error=False,
                                   follow_redirects=False)
            out[path] = (r.code, dict(r.headers))
        server.stop()
        return out

    answers = asyncio.run(run())
    assert [answers[p][0] for p in answers] == [200, 200, 403, 301, 404]
    for path, (_, headers) in answers.items():
        assert headers["X-Frame-Options"] == "DENY", path
        csp = headers["Content-Security-Policy"]
        expected = "default-src 'self'; " + FRAME_HEADERS["Content-Security-Policy"] \
            if path == "/own" else FRAME_HEADERS["Content-Security-Policy"]
        assert csp == expected, (path, csp)


# -- a real hub with both services --------------------------------------------------------------
@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    pytest.importorskip("docker")
    from tests.hubrunner import Hub
    from tests.test_hub_e2e import MiB, _engine, topology

    _engine()
    tmp = tmp_path_factory.mktemp("framehub")
    nodes = [{"name": "st-node", "topology": topology(tmp, "st-node", 1024 * MiB)}]
    profiles = [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}]
    h = Hub(tmp, nodes, profiles)  # the culler on, as shipped
    h.start()
    # the culler is a process the hub starts: wait until the proxy reaches it
    wait_until(lambda: requests.get(f"{h.url}{CULLER}api/status", timeout=10,
                                    allow_redirects=False).status_code != 503,
               60, 0.3, "the culler answers through the proxy")
    yield h
    h.stop()


@pytest.mark.docker
@pytest.mark.hub
def test_service_pages_cannot_be_framed(hub):
    answers: list[requests.Response] = []

    def get(session: requests.Session, path: str) -> requests.Response:
        r = session.get(f"{hub.url}{path}", timeout=30)
        # the redirects on the way (to the hub's login, the OAuth dance, back to the page)
        answers.extend(x for x in [*r.history, r]
                       if urlparse(x.url).path.startswith("/services/"))
        return r

    # not logged in: redirects to the hub's login page, 401/403 from the APIs, 404s
    anonymous = requests.Session()
    for path in (GPU, GPU + "admin", GPU + "api/nodes", GPU + "api/openapi.json",
                 GPU + "no-such-page", GPU + "oauth_callback", CULLER, CULLER + "api/status",
                 CULLER + "no-such-page"):
        get(anonymous, path)
    # the hub admin, through the hub's OAuth: the GPU map, the culler's page, their APIs
    admin = hub.login("admin")
    r = get(admin, GPU + "admin")
    assert r.status_code == 200 and "GPU map" in r.text, r.text[:300]
    r = get(admin, CULLER)
    assert r.status_code == 200, r.text[:300]
    for path in (GPU + "api/nodes", GPU + "api/allocations", GPU + "api/queue",
                 GPU + "api/schemas", GPU + "metrics", CULLER + "api/status",
                 CULLER + "api/policy", CULLER + "api/policies", CULLER + "metrics"):
        r = get(admin, path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    codes = sorted({x.status_code for x in answers})
    assert {200, 302, 404} <= set(codes), codes
    for r in answers:
        assert_not_frameable(r)
    # JupyterHub's own pages keep their own policy (not this module's business)
    r = admin.get(f"{hub.url}/hub/home", timeout=30)
    assert "frame-ancestors" in r.headers.get("Content-Security-Policy", "")
    # the shipped configuration's home page (wire_hub): JupyterHub's, then the admin's own
    # usage this month once read (gpuspawner.usage.home, in a worker thread)
    assert r.status_code == 200 and "Start" in r.text and "My Server" in r.text
    deadline = time.monotonic() + 30
    while "Your GPU usage this month" not in r.text:
        assert time.monotonic() < deadline, "the home page never showed the usage figures"
        time.sleep(0.2)
        r = admin.get(f"{hub.url}/hub/home", timeout=30)
    assert "0.0 GPU-hours" in r.text
