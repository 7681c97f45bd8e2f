"""The admins' usage page (``GET usage`` of the gpuspawner service, gpuspawner.usage.pages).

- the chart's view: one bar per day, each group's segment as tall as its GPU-hours, stacked
  to the day's total; the y axis's top at or above the largest day;
- the users' table: least efficient GPU use first, users without a figure last;
- in pytest-jupyterhub's in-process hub (tests/test_usage_hub.py's fixture, real tokens and
  roles): an admin's token gets the page with every user's row and the chart; a user's own
  token (and another user's) gets 403; without a token the page is refused.
"""

from __future__ import annotations

import pytest
from tornado.httpclient import AsyncHTTPClient

from gpuspawner.usage.pages import CHART_COLOURS, chart_view, user_rows
from tests.test_usage_hub import (  # noqa: F401 (fixtures)
    spawn_and_stop,
    token_of,
    usage_hub,
)


def _report() -> dict:
    rows = [
        {"day": "2026-11-02", "group": "physics", "gpu_hours": 3.0},
        {"day": "2026-11-02", "group": "", "gpu_hours": 1.0},
        {"day": "2026-11-01", "group": "physics", "gpu_hours": 2.0},
        {"day": "2026-11-01", "group": "chem", "gpu_hours": 0.0},
    ]
    return {"rows": rows}


def test_the_chart_stacks_each_groups_gpu_hours_per_day():
    view = chart_view(_report())
    assert view["days"] == ["2026-11-01", "2026-11-02"]
    assert [g["name"] for g in view["groups"]] == ["(no group)", "physics"]  # chem: 0 h
    assert view["y_max"] == 5.0  # the largest day (4 h) rounded up to 1/2/2.5/5 x 10^k
    plot = view["bottom"] - view["top"]
    day1, day2 = view["bars"]
    assert [s["group"] for s in day2["segments"]] == ["(no group)", "physics"]
    assert day2["total"] == 4.0
    heights = [s["height"] for s in day2["segments"]]
    assert heights == pytest.approx([plot * 1 / 5, plot * 3 / 5], abs=0.01)
    # stacked: each segment starts where the one below ends, the lowest on the axis
    low, high = day2["segments"]
    assert low["y"] + low["height"] == pytest.approx(view["bottom"], abs=0.02)
    assert high["y"] + high["height"] == pytest.approx(low["y"], abs=0.02)
    assert [s["gpu_hours"] for s in day1["segments"]] == [2.0]
    assert {g["colour"] for g in view["groups"]} <= set(CHART_COLOURS)
    assert chart_view({"rows": []})["bars"] == []


def test_the_users_table_puts_the_least_efficient_first():
    rows = user_rows({"rows": [
        {"user": "ann", "gpu_hours": 2.0, "gpu_efficiency_percent": 80.0},
        {"user": "bob", "gpu_hours": 5.0, "gpu_efficiency_percent": None},
        {"user": "cid", "gpu_hours": 1.0, "gpu_efficiency_percent": 10.0},
    ]})
    assert [r["user"] for r in rows] == ["cid", "ann", "bob"]


async def _page(url: str, token: str | None, query: str = "") -> tuple[int, str]:
    headers = {"Authorization": f"token {token}"} if token else {}
    r = await AsyncHTTPClient().fetch(url + "usage" + (f"?{query}" if query else ""),
                                      headers=headers, raise_error=False,
                                      follow_redirects=False)
    return r.code, r.body.decode()


async def test_admins_see_the_usage_page_and_users_are_refused(usage_hub):  # noqa: F811
    app, url = usage_hub
    ann, root, bob = (await token_of(app, "ann"), await token_of(app, "admin"),
                      await token_of(app, "bob"))
    await spawn_and_stop(app, "ann", "a100-1")
    await spawn_and_stop(app, "bob", "cpu")

    code, body = await _page(url, root)
    assert code == 200, body
    assert 'data-testid="usage-chart"' in body and "<svg" in body
    assert 'data-user="ann"' in body and 'data-user="bob"' in body
    assert 'aria-current="page"' in body and ">Usage</a>" in body
    for token in (ann, bob):  # a user's own token: no admin view, whatever they ask
        code, body = await _page(url, token)
        assert code == 403, body
        assert "ann" not in body.replace("usage page is for hub admins", "")
    code, _ = await _page(url, None)
    assert code in (302, 401, 403)
    code, body = await _page(url, root, "from=yesterday")
    assert code == 400 and "from: " in body, body
