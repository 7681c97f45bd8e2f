"""Hostile review of the gpuspawner service's kept hub answers: JupyterHub's ``HubOAuth`` keeps
the hub's answer about a token 60 s (``cache_max_age``), so an admin who lost access (token
revoked, user deleted, taken out of the group whose role grants ``custom:gpuspawner:admin``,
hub admin flag taken away) kept the admin map, everyone's allocations and usage, the metrics
and the GPU drain for up to a minute. Replayed in pytest-jupyterhub's in-process hub with the
service on loopback (tests/inprocess_hub.py), with real tokens and the hub's REST API.

Also measured here: what the fresh check costs an admin's request, and that a user reading
their own figures costs no request to the hub beyond the first.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from jupyterhub import orm
from jupyterhub.services.auth import HubAuth
from tornado.httpclient import AsyncHTTPClient
from tornado.web import create_signed_value

import tests.inprocess_hub as inprocess_hub_module
from gpuspawner.hub.service.app import AllocationsHandler, GPUService
from gpuspawner.hub.service_base import ADMIN_SCOPE, FreshHubOAuth
from tests.inprocess_hub import ACCESS, runtime
from tests.test_spawner_inprocess import PROFILES, api
from tests.test_usage_hub import token_of

NODE = "fresh-n1"
#: the group whose role grants the service's admin view (as the shipped configuration's)
ADMINS = "gpuspawner-admins"
#: what an admin reads of bob's or everyone's through the service: each answers an admin 200
#: and anyone else 401/403 (or, for the map page, a redirect to the hub's login)
ADMIN_PATHS = ("admin", "api/usage?user=bob", "api/usage/budgets?user=bob",
               "api/allocations?user=bob", "api/users/bob/usage", "metrics")


@pytest.fixture
async def hub(inprocess_hub, monkeypatch) -> tuple[Any, str, list[GPUService]]:
    """The in-process hub with usage records and budgets, a role granting the admin view to
    the group :data:`ADMINS`, and the service on loopback: ``(app, service URL, [the
    GPUService])``."""
    made: list[GPUService] = []

    class Recorded(GPUService):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(inprocess_hub_module, "GPUService", Recorded)
    app, url = await inprocess_hub(
        NODE, PROFILES, service=True, usage_budgets={"default": {"period": "month",
                                                                  "gpu_hours": 10}},
        roles=[{"name": "map-admins", "scopes": [ADMIN_SCOPE, ACCESS], "groups": [ADMINS]}],
        config={"JupyterHub": {"load_groups": {ADMINS: {"users": []}}}})
    await token_of(app, "bob")
    return app, url, made


async def fetch(url: str, *, token: str | None = None, cookie: str | None = None,
                method: str = "GET", body: Any = None) -> tuple[int, str]:
    """(status, body) of one request to the service, redirects not followed."""
    headers = {}
    if token:
        headers["Authorization"] = f"token {token}"
    if cookie:
        headers["Cookie"] = cookie
    r = await AsyncHTTPClient().fetch(
        url, method=method, headers=headers, follow_redirects=False, raise_error=False,
        body=None if body is None else json.dumps(body))
    return r.code, r.body.decode(errors="replace") if r.body else ""


async def grouped_admin(app: Any, name: str) -> None:
    """Hub user ``name`` in :data:`ADMINS` (so holding the service's admin scope)."""
    await token_of(app, name)
    r = await api(app, "post", "groups", ADMINS, "users", body={"users": [name]})
    assert r.status_code == 200, r.text


def refused(path: str, code: int) -> bool:
    """Whether ``code`` refuses the caller: 401/403, or a redirect to log in for the map."""
    return code in (401, 403) or (path == "admin" and code == 302)


@pytest.mark.parametrize("loss", ["token revoked", "user deleted", "taken out of the group"])
async def test_who_lost_access_gets_no_kept_page_at_the_next_request(hub, loss):
    """An admin (by the group's role) reads the map, bob's usage, budgets, allocations and
    the metrics with one token each, and lists the nodes with another (so the hub's answer
    about each token is kept); then loses access through the hub's REST API. The next
    request with each token is refused, and the drain of a GPU is refused and drains
    nothing. Before: every one answered 200 (and drained) from the kept answer."""
    app, url, _ = hub
    await grouped_admin(app, "boss")
    tokens = {path: await token_of(app, "boss") for path in (*ADMIN_PATHS, "drain")}
    for path in ADMIN_PATHS:
        code, body = await fetch(url + path, token=tokens[path])
        assert code == 200, (path, code, body[:300])
    code, body = await fetch(url + "api/nodes", token=tokens["drain"])
    assert code == 200, body
    uuid = json.loads(body)[0]["gpus"][0]["uuid"]

    if loss == "token revoked":
        for token in tokens.values():
            token_id = orm.APIToken.find(app.db, token).api_id
            r = await api(app, "delete", "users", "boss", "tokens", token_id)
            assert r.status_code == 204, r.text
    elif loss == "user deleted":
        r = await api(app, "delete", "users", "boss")
        assert r.status_code == 204, r.text
    else:
        r = await api(app, "delete", "groups", ADMINS, "users", body={"users": ["boss"]})
        assert r.status_code == 200, r.text

    got = {path: (await fetch(url + path, token=tokens[path]))[0] for path in ADMIN_PATHS}
    code, body = await fetch(url + f"api/gpus/{uuid}/drain", token=tokens["drain"],
                             method="POST", body={"reason": "after losing access"})
    got["drain"] = code
    assert [p for p, code in got.items() if not refused(p, code)] == [], (loss, got)
    assert not runtime(app).drain_records(), runtime(app).drain_records()


def oauth_cookie(service: GPUService, token: str) -> str:
    """The service's OAuth cookie carrying ``token``, signed as the service signs it (what a
    browser holds after logging in to the service)."""
    secret = service.server.request_callback.settings["cookie_secret"]
    name = service.hub_auth.cookie_name
    return f"{name}={create_signed_value(secret, name, token).decode()}"


@pytest.mark.parametrize("loss", ["user deleted", "admin flag taken away"])
async def test_a_browser_that_lost_the_admin_view_gets_no_kept_map(hub, loss):
    """A hub admin's browser (the service's OAuth cookie) reads the map: 200, the hub's
    answer about the cookie's token kept. After the user is deleted the next visit is sent
    to log in (302, cookie cleared); after the admin flag is taken away it is a 403 (the
    kept answer said admin, scopes included). Before: 200 from the kept answer."""
    app, url, (service,) = hub
    await token_of(app, "chief")
    r = await api(app, "patch", "users", "chief", body={"admin": True})
    assert r.status_code == 200, r.text
    cookie = oauth_cookie(service, await token_of(app, "chief"))
    code, body = await fetch(url + "admin", cookie=cookie)
    assert code == 200, body[:300]
    if loss == "user deleted":
        r = await api(app, "delete", "users", "chief")
        assert r.status_code == 204, r.text
        expected = 302
    else:
        r = await api(app, "patch", "users", "chief", body={"admin": False})
        assert r.status_code == 200, r.text
        expected = 403
    code, body = await fetch(url + "admin", cookie=cookie)
    assert code == expected, (loss, code, body[:300])


def test_the_kept_answer_is_where_fresh_hub_oauth_drops_it():
    """FreshHubOAuth drops the kept answer under the key ``HubAuth.user_for_token`` keeps it
    (jupyterhub's own format: this fails when a jupyterhub release changes it)."""
    auth = FreshHubOAuth(api_token="t" * 64, api_url="http://127.0.0.1:1/hub/api",
                         cache_max_age=60)

    async def answer(method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        return {"name": "ann", "kind": "user", "scopes": []}

    auth._api_request = answer  # type: ignore[method-assign]
    auth.user_for_token("a-token", session_id="sid", sync=True)
    assert list(auth.cache.values) == [auth.token_cache_key("a-token", "sid")]


async def test_admin_requests_ask_the_hub_each_time_and_own_figures_never(hub, monkeypatch):
    """50 requests each, after a first that keeps the hub's answer: an admin's request asks
    the hub once (none with the handler's ``fresh = "never"``: the kept answer, as before),
    bob's own figures never. Prints the time per admin request both ways (pytest -s)."""
    app, url, _ = hub
    await grouped_admin(app, "boss")
    boss, bob = await token_of(app, "boss"), await token_of(app, "bob")
    asked: list[str] = []
    original = HubAuth._api_request

    async def counting(self: HubAuth, method: str, request_url: str, /,
                       **kwargs: Any) -> Any:
        asked.append(request_url)
        return await original(self, method, request_url, **kwargs)

    monkeypatch.setattr(HubAuth, "_api_request", counting)
    n = 50

    async def loop(path: str, token: str) -> tuple[int, float]:
        code, body = await fetch(url + path, token=token)  # the answer kept
        assert code == 200, body[:300]
        del asked[:]
        t0 = time.perf_counter()
        for _ in range(n):
            code, body = await fetch(url + path, token=token)
            assert code == 200, body[:300]
        return len(asked), (time.perf_counter() - t0) / n

    own = await loop("api/allocations", bob)
    fresh = await loop("api/allocations?user=bob", boss)
    monkeypatch.setattr(AllocationsHandler, "fresh", "never")
    kept = await loop("api/allocations?user=bob", boss)
    print(f"\nper request over {n}: admin fresh {fresh[1] * 1e3:.2f} ms ({fresh[0]} hub "
          f"requests), admin kept {kept[1] * 1e3:.2f} ms ({kept[0]}), own figures "
          f"{own[1] * 1e3:.2f} ms ({own[0]})")
    assert own[0] == 0
    assert fresh[0] == n
    assert kept[0] == 0
