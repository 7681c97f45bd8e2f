"""Usage budgets in pytest-jupyterhub's in-process hub (as tests/test_usage_hub.py: the hub's
own application, REST API, database, roles and scopes; GPUSpawner on the fake engine), with
the gpuspawner service's application serving ``api/usage/budgets``.

The budget is 10 GPU-hours a month in Europe/Berlin; what users used this month is written
into the usage store (the records the hub keeps): ann used 10 (refused, with the message
naming the budget, its use and when it renews), bob 8.5 (starts, the spawn form warns at 85 %),
eve 20 but holds ``custom:gpuspawner:budget-exempt`` through a role (starts, no warning).
Another user's token reads no one else's budgets.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from jupyterhub import orm
from jupyterhub.tests.mocking import MockHub
from tornado.httpclient import AsyncHTTPClient

from gpuspawner.usage.budgets import EXEMPT_SCOPE, period_bounds
from tests.test_service_unit import _validate
from tests.test_spawner_inprocess import PROFILES, api, start, stopped
from tests.test_usage_hub import recorder, runtime, token_of

NODE = "budget-n1"
ZONE = "Europe/Berlin"
BUDGETS = {"default": {"period": "month", "gpu_hours": 10}}


@pytest.fixture
async def budget_hub(inprocess_hub):
    """The started in-process hub (:data:`PROFILES` as this module holds it when the fixture
    runs) with :data:`BUDGETS` in :data:`ZONE`, eve exempt by a role, and the service's
    application on loopback (tests/inprocess_hub.py); ``(app, service URL)``."""
    return await inprocess_hub(
        NODE, PROFILES, service=True, usage_budgets=BUDGETS,
        scopes={EXEMPT_SCOPE: "past the usage budgets"},
        roles=[{"name": "budget-exempt", "scopes": [EXEMPT_SCOPE], "users": ["eve"]}],
        config={"GPUUsage": {"time_zone": ZONE}, "Authenticator": {"allowed_users": {"eve"}}})


def used(app: MockHub, user: str, gpu_hours: float) -> None:
    """Write a closed record of ``gpu_hours`` GPU-hours of ``user``'s, the last minute (inside
    this month unless the month began less than a minute ago)."""
    now = time.time()
    start, _ = period_bounds("month", now, ZoneInfo(ZONE))
    begin = max(start, now - 60.0)
    store = recorder(app).store
    rid = store.open({"allocation_id": secrets.token_hex(8), "user": user, "groups": [],
                      "kind": "server", "name": "earlier", "node": NODE,
                      "gpu_milli": round(gpu_hours * 3600 * 1000 / (now - begin)),
                      "cpu_milli": 1000, "started": begin})
    store.close(rid, now)


async def budgets(url: str, token: str, query: str = "") -> tuple[int, dict]:
    r = await AsyncHTTPClient().fetch(url + "api/usage/budgets" + (f"?{query}" if query else ""),
                                      headers={"Authorization": f"token {token}"},
                                      raise_error=False)
    return r.code, json.loads(r.body or b"{}")


def next_month_berlin() -> str:
    _, renews = period_bounds("month", time.time(), ZoneInfo(ZONE))
    return datetime.fromtimestamp(renews, ZoneInfo(ZONE)).isoformat(timespec="seconds")


async def test_over_budget_is_refused_exempt_is_not_and_80_percent_warns(budget_hub):
    app, url = budget_hub
    ann, bob, eve = [await token_of(app, u) for u in ("ann", "bob", "eve")]
    used(app, "ann", 10.0)
    used(app, "bob", 8.5)
    used(app, "eve", 20.0)

    # ann: refused on the quota refusal's path (HTTP 400), naming budget, use and renewal
    r = await api(app, "post", "users", "ann", "server", body={"profile": "a100-1"})
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert (f"usage budget 'default' is used up: 10 of 10 GPU-hours this month; it renews at "
            f"{next_month_berlin()}") in message, message
    assert runtime(app).ledger.allocations() == []  # nothing was booked
    code, doc = await budgets(url, ann)
    assert code == 200, doc
    _validate(doc, "BudgetStatus")  # the OpenAPI document's schema
    assert doc["user"] == "ann" and doc["time_zone"] == ZONE and not doc["exempt"]
    [entry] = doc["budgets"]
    assert (entry["name"], entry["unit"], entry["limit"]) == ("default", "gpu_hours", 10.0)
    assert entry["exceeded"] and entry["used"] == pytest.approx(10.0, abs=0.01)
    assert entry["renews_at"] == next_month_berlin()

    # bob at 85 %: the spawn form warns; the spawn starts
    spawner = app.users[orm.User.find(app.db, "bob")].spawner
    form = await spawner.get_options_form()
    assert "Warning: usage budget &#39;default&#39;: 85 % used (8.5 of 10 GPU-hours this " \
        "month; renews at " + next_month_berlin() + ")" in form, form
    code, doc = await budgets(url, bob)
    assert code == 200 and doc["budgets"][0]["percent"] == 85.0 and doc["budgets"][0]["warning"]
    r = await start(app, "bob", "", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text

    # eve is past her budget twice over but exempt by her role: starts, no warning
    r = await start(app, "eve", "", {"profile": "a100-1"})
    assert r.status_code in (201, 202), r.text
    form = await app.users[orm.User.find(app.db, "eve")].spawner.get_options_form()
    assert "usage budget" not in form
    code, doc = await budgets(url, eve)
    assert code == 200 and doc["exempt"] and doc["budgets"][0]["exceeded"], doc

    for user in ("bob", "eve"):
        r = await api(app, "delete", "users", user, "server")
        assert r.status_code in (202, 204), r.text
        await stopped(app, user)


async def test_another_users_token_cannot_read_your_budgets(budget_hub):
    app, url = budget_hub
    ann, bob, root = [await token_of(app, u) for u in ("ann", "bob", "admin")]
    used(app, "ann", 9.0)
    for query in ("user=ann", "user=ANN", "user=bob&user=ann", "user=admin"):
        code, doc = await budgets(url, bob, query)
        assert code in (400, 403), (query, code, doc)
        assert "9.0" not in json.dumps(doc) and "budgets" not in doc, (query, doc)
    code, doc = await budgets(url, bob)  # own: nothing used
    assert code == 200 and doc["user"] == "bob" and doc["budgets"][0]["used"] == 0.0
    # the service's admin reads anyone's; an unknown user is a 404
    code, doc = await budgets(url, root, "user=ann")
    assert code == 200 and doc["budgets"][0]["used"] == pytest.approx(9.0, abs=0.01), doc
    code, doc = await budgets(url, root, "user=nobody-here")
    assert code == 404, doc
