"""A user's own GPU usage this month and budgets on the hub's home page
(gpuspawner.usage.home): the figures are read in a worker thread, never in the template
callable JupyterHub runs on its event loop; the page shows them once read."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

from jinja2 import ChoiceLoader, DictLoader, Environment, FileSystemLoader, PrefixLoader
from jupyterhub.tests.utils import AsyncSession
from tornado.httputil import url_concat

import gpuspawner.usage.home as home
from gpuspawner.hub.wiring import HUB_TEMPLATES
from gpuspawner.usage.budgets import parse_budgets
from gpuspawner.usage.home import HomeFigures, own_figures
from tests.test_usage_budgets import record, store  # noqa: F401
from tests.test_usage_budgets_hub import budget_hub, used  # noqa: F401
from tests.test_usage_hub import runtime

HOUR = 3600.0


def recorder_of(store):  # noqa: F811
    return SimpleNamespace(store=store, retention_days=400)


def test_own_figures_this_month_and_the_budget_warning(store):  # noqa: F811
    now = time.time()
    record(store, "ann", ["lab"], now - 3 * HOUR, now - HOUR, gpu_milli=2000, cpu_milli=4000)
    record(store, "bob", ["lab"], now - 3 * HOUR, now - HOUR)  # not ann's
    policy = parse_budgets({"default": {"period": "month", "gpu_hours": 4.5}})
    got = own_figures(recorder_of(store), policy, "ann", ["lab"], now)
    assert round(got["gpu_hours"], 3) == 4.0 and round(got["core_hours"], 3) == 8.0
    (b,) = got["budgets"]
    assert (b["name"], b["limit"], b["exceeded"]) == ("default", 4.5, False)
    assert b["warning"].startswith("usage budget 'default': 88.9 % used (4 of 4.5 GPU-hours")
    assert own_figures(recorder_of(store), None, "ann", [], now)["budgets"] == []


def test_the_template_callable_never_reads_on_the_loop_and_caches(store):  # noqa: F811
    now = time.time()
    record(store, "ann", [], now - 2 * HOUR, now - HOUR)
    loop_thread: list[int] = []
    read_in: list[int] = []
    real = own_figures

    def counted(*args):
        read_in.append(threading.get_ident())
        return real(*args)

    cluster = SimpleNamespace(usage=recorder_of(store), usage_budgets=None)
    clock = {"t": 0.0}
    figures = HomeFigures(lambda: cluster, ttl_s=300, clock=lambda: clock["t"])
    ann = SimpleNamespace(name="ann", groups=[])

    async def main() -> None:
        loop_thread.append(threading.get_ident())
        home.own_figures = counted
        try:
            assert figures(ann) is None  # first page: nothing yet, one read started
            assert figures(ann) is None and len(read_in) <= 1  # no second read meanwhile
            deadline = time.monotonic() + 10
            while figures(ann) is None:
                assert time.monotonic() < deadline, "the figures never arrived"
                await asyncio.sleep(0.01)
            assert round(figures(ann)["gpu_hours"], 3) == 1.0
            clock["t"] = 299.0
            figures(ann)
            await asyncio.sleep(0.05)
            assert len(read_in) == 1  # within the ttl: from the cache
            clock["t"] = 301.0
            figures(ann)  # old: read again, the old figures shown meanwhile
            while len(read_in) < 2:
                assert time.monotonic() < deadline, "no second read after the ttl"
                await asyncio.sleep(0.01)
        finally:
            home.own_figures = real
    asyncio.run(main())
    assert read_in and loop_thread[0] not in read_in  # every read in a worker thread
    assert figures(None) is None and figures(SimpleNamespace(name="", groups=[])) is None


def test_the_home_page_shows_them_after_jupyterhubs_own_content():
    """gpuspawner's home.html extends JupyterHub's (``templates/home.html``) and adds the
    figures; a budget at 80 % or more shows its warning."""
    hub_default = DictLoader({"home.html": "{% block main %}<p>HUB HOME</p>{% endblock %}"})
    env = Environment(loader=ChoiceLoader([FileSystemLoader(str(HUB_TEMPLATES)),
                                           PrefixLoader({"templates": hub_default})]),
                      autoescape=True)
    page = env.get_template("home.html")
    usage = {"gpu_hours": 12.5, "core_hours": 40.0, "budgets": [
        {"name": "default", "used": 12.5, "limit": 15.0, "percent": 83.3, "unit": "gpu_hours",
         "renews_at": "2026-12-01T00:00:00+01:00", "exceeded": False,
         "warning": "usage budget 'default': 83.3 % used (12.5 of 15 GPU-hours this month)"},
        {"name": "group lab", "used": 2.0, "limit": 100.0, "percent": 2.0,
         "unit": "core_hours", "renews_at": "2026-12-01T00:00:00+01:00", "exceeded": False,
         "warning": ""}]}
    html = page.render(gpuspawner_usage=usage, base_url="/hub/")
    assert html.index("HUB HOME") < html.index("Your GPU usage this month")
    assert "12.5 GPU-hours" in html and "40.0 core-hours" in html
    assert 'role="status">usage budget &#39;default&#39;: 83.3 % used' in html
    assert "Budget group lab: 2 of 100" in html and "renews 2026-12-01" in html
    assert "Your GPU usage" not in page.render(gpuspawner_usage=None, base_url="/hub/")


async def test_the_hubs_home_page_shows_the_users_own_figures(budget_hub):  # noqa: F811
    """pytest-jupyterhub's in-process hub with gpuspawner's home template and callable (as
    wire_hub sets them): ann's home page shows her GPU-hours this month and her budget's
    warning, and none of bob's."""
    app, _ = budget_hub
    figures = HomeFigures(lambda: runtime(app))
    app.tornado_settings["template_vars"] = {"gpuspawner_usage": figures}
    env = app.tornado_settings["jinja2_env"]  # as template_paths with ours first
    env.loader.loaders.insert(0, FileSystemLoader(str(HUB_TEMPLATES)))
    if env.cache is not None:
        env.cache.clear()
    used(app, "ann", 8.5)
    used(app, "bob", 3.0)

    async def session(name: str) -> AsyncSession:
        """A browser's login as ``name`` straight to the hub (no proxy here), as MockHub's
        login_user does through the proxy."""
        s = AsyncSession()
        r = await s.get(app.hub.url + "login")
        r.raise_for_status()
        r = await s.post(url_concat(app.hub.url + "login", {"_xsrf": r.cookies["_xsrf"]}),
                         data={"username": name, "password": name}, allow_redirects=False)
        assert r.status_code == 302, r.text
        return s

    sessions = {name: await session(name) for name in ("ann", "bob")}

    async def home(name: str) -> str:
        r = await sessions[name].get(app.hub.url + "home", allow_redirects=False)
        assert r.status_code == 200, r.text
        return r.text

    deadline = time.monotonic() + 20
    while "Your GPU usage this month" not in (text := await home("ann")):
        assert time.monotonic() < deadline, "the home page never showed the figures"
        await asyncio.sleep(0.1)
    assert "8.5 GPU-hours" in text and "usage budget &#39;default&#39;: 85 % used" in text
    while "Your GPU usage this month" not in (text := await home("bob")):
        assert time.monotonic() < deadline, "bob's home page never showed his figures"
        await asyncio.sleep(0.1)
    assert "3.0 GPU-hours" in text and "8.5 GPU-hours" not in text
