"""What people see, in Debian's Chromium driven by Python Playwright (issue 16), on the hub as
`make up` runs it on a machine without a GPU (marked ``browser``, ``hub``, ``docker``):

- the spawn form: only the profiles that can start, one line each, singular/plural, green
  "free now", no quota line on a hub without GPUs, a radio group usable with the keyboard, the
  ``#profile=<slug>`` preselection, light and dark themes; a refused spawn links back to the form;
- the progress page: the placement in user words;
- JupyterLab in a CPU-only session: the neutral "GPU: no GPU" item, no news pop-up (the image's
  overrides.json), the idle culler's warning as a notification with the time left and reason;
- the GPU map and the idle culler's page as an admin: the hub's stylesheet, navigation bar,
  live refresh, links to each other, node state, the cores count; the culler page as a user.

axe-core (``labextension/ui-tests/node_modules/axe-core``, ``make labext-ui``) runs on every page:
no serious or critical violation (on JupyterLab: on this project's elements only, the status
item and the notification, JupyterLab's own UI is not this project's). The screenshots go to
var/screenshots/ and are copied to docs/ when missing or with GPUSPAWNER_UPDATE_DOCS=1.

The image is $SINGLEUSER_IMAGE (default gpuspawner/singleuser:latest, `make images`).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.hubrunner import REPO, Hub

pytest.importorskip("docker")
sync_api = pytest.importorskip("playwright.sync_api")

from gpuspawner.testing.browser import hub_login  # noqa: E402
from tests.test_hub_e2e import _engine, containers_of  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
AXE = REPO / "labextension" / "ui-tests" / "node_modules" / "axe-core" / "axe.min.js"
IMAGE = os.environ.get("SINGLEUSER_IMAGE", "gpuspawner/singleuser:latest")
SCREENSHOTS = REPO / "var" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-dev-shm-usage"]


def _skip_reasons() -> list[str]:
    out = []
    if not os.access(CHROMIUM, os.X_OK):
        out.append(f"{CHROMIUM} is missing (make test-tools)")
    if not AXE.exists():
        out.append(f"{AXE} is missing (make labext-ui)")
    return out


pytestmark = [pytest.mark.browser, pytest.mark.hub, pytest.mark.docker,
              pytest.mark.skipif(bool(_skip_reasons()), reason="; ".join(_skip_reasons()))]

PROFILES = [
    {"slug": "cpu", "display_name": "CPU, small", "cpu": 1, "memory": "256M",
     "description": "For editing and small computations.", "default": True},
    {"slug": "cpu-2", "display_name": "CPU, medium", "cpu": 1, "memory": "512M"},
    {"slug": "gpu-share", "display_name": "Shared GPU", "cpu": 1, "memory": "1G",
     "gpus": 0.25},
    {"slug": "a100-1", "display_name": "One A100", "cpu": 1, "memory": "1G", "gpus": 1,
     "gpu_models": ["A100"], "disk": "50G"},
    {"slug": "a100-2", "display_name": "Two A100", "cpu": 2, "memory": "2G", "gpus": 2,
     "gpu_models": ["A100"], "groups": ["gpu-users"]},
]
# every running server is warned at once (warning longer than the max age), culled in 25 min
# JupyterHub's progress page (its spawn_pending.html, not this project's) has a progress bar
# without an accessible name (axe aria-progressbar-name): left out of the check, the rest of
# the page (the messages this project writes) is checked
PENDING_PAGE = {"include": [["body"]], "exclude": [["#progress-bar"]]}
POLICIES = {"global": {"idle_timeout": "1h", "max_age": "20m", "warning": "25m"}}


def _shot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    out = SCREENSHOTS / name
    page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 5_000
    docs = REPO / "docs" / name
    if not docs.exists() or os.environ.get("GPUSPAWNER_UPDATE_DOCS") == "1":
        shutil.copyfile(out, docs)
    return out


def serious_violations(page: Any, context: Any = None) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page (or in ``context``: a selector
    or axe's ``{include: [...]}``), each with its rule id, impact and the failing nodes."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    result = page.evaluate("async (ctx) => await axe.run(ctx || document, "
                           "{resultTypes: ['violations']})", context)
    return [{"id": v["id"], "impact": v["impact"], "help": v["help"],
             "nodes": [n["target"] for n in v["nodes"]][:5]}
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    engine = _engine()
    tmp = tmp_path_factory.mktemp("pageshub")
    policies = tmp / "culler.yaml"
    policies.write_text(yaml.safe_dump(POLICIES))
    h = Hub(tmp, [{"name": "local", "topology": "auto"}], PROFILES, extra_config=(
        f"c.GPUSpawner.image = {IMAGE!r}\n"
        "c.GPUSpawner.quotas = {'default_user': {'gpus': 2, 'servers': 3}}\n"
        # always the progress page, however fast the spawn (JupyterHub's default: 10 s)
        "c.JupyterHub.tornado_settings = {'slow_spawn_timeout': 0}\n"))
    h.env.update({"GPUSPAWNER_CULLER_POLICIES": str(policies),
                  "GPUSPAWNER_CULLER_EVERY": "3"})
    h.start()
    try:
        yield h
    finally:
        for u in ("carol", "bob"):
            h.api("DELETE", f"/users/{u}/server")
        h.stop()
        for u in ("carol", "bob"):
            for c in containers_of(engine, u):
                engine.remove_container(c["Id"], force=True)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _page(browser: Any, hub: Hub, user: str, dark: bool = False) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 860},
                                  color_scheme="dark" if dark else "light")
    page = context.new_page()
    page.set_default_timeout(30_000)
    _ERRORS[id(page)] = errors = []
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: errors.append(f"{m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    hub_login(page, hub.url, user)  # home, spawn or the server
    return page


_ERRORS: dict[int, list[str]] = {}

#: GET a JSON path as the page's user would from a script: the login cookie plus the xsrf
#: token JupyterHub's auth wants with it (the page's xsrf-token meta, else the _xsrf cookie)
FETCH_JSON = """async (path) => {
    const meta = document.querySelector('meta[name=xsrf-token]');
    const cookie = /(?:^|; )_xsrf=([^;]*)/.exec(document.cookie);
    const xsrf = meta ? meta.content : (cookie ? decodeURIComponent(cookie[1]) : '');
    const r = await fetch(path, {headers: {'X-XSRFToken': xsrf}});
    const text = await r.text();
    let body = null;
    try { body = JSON.parse(text); } catch (e) { body = text.slice(0, 500); }
    return {status: r.status, body};
}"""


def wait_js(page: Any, condition: str, timeout_ms: float, what: str) -> None:
    """Wait until the JavaScript ``condition`` holds; on timeout fail with what the page says
    (its live status, visibility, console errors)."""
    try:
        page.wait_for_function(condition, timeout=timeout_ms)
    except sync_api.TimeoutError:
        state = page.evaluate("() => ({hidden: document.hidden, status: "
                              "document.getElementById('live-status')?.textContent})")
        pytest.fail(f"{what}: not within {timeout_ms / 1000:g} s; page {state}, console "
                    f"{_ERRORS.get(id(page), [])[-10:]}")


@pytest.fixture(scope="module")
def bob(hub):
    """bob's CPU server, running (the pages below show it)."""
    hub.ensure_user("bob")
    r = hub.api("POST", "/users/bob/server", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("bob", timeout=120)
    return "bob"


# -- the spawn form --------------------------------------------------------------------------
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_spawn_form(hub, browser, theme):
    hub.ensure_user("ann")
    page = _page(browser, hub, "ann", dark=theme == "dark")
    try:
        page.goto(f"{hub.url}/hub/spawn/ann")
        page.wait_for_selector(".gpus-form")
        assert page.evaluate("document.documentElement.dataset.bsTheme") == theme
        # only what can start here: no GPU on this machine, so no GPU card
        assert page.eval_on_selector_all("[data-profile]", "els => els.map(e => "
                                         "e.dataset.profile)") == ["cpu", "cpu-2"]
        lines = page.eval_on_selector_all(".gpus-bundle", "els => els.map(e => e.textContent)")
        assert lines == ["1 core · 256 MiB memory", "1 core · 512 MiB memory"]
        text = page.inner_text(".gpus-form")
        assert "1 cores" not in text and "GPU" not in text
        assert page.locator("[data-testid=quota]").count() == 0  # no GPU here: no GPU quota
        # green and saying so: free capacity exists for both
        assert page.eval_on_selector_all(".gpus-status.free", "els => els.length") == 2
        green = page.eval_on_selector(".gpus-status.free", "e => getComputedStyle(e).color")
        r, g, b = (int(x) for x in re.findall(r"\d+", green)[:3])
        assert g > r and g > b, green
        # a named radio group, operated with the keyboard
        group = page.get_by_role("radiogroup", name="Choose what your server gets")
        assert group.count() == 1
        first = page.get_by_role("radio", name=re.compile("CPU, small"))
        assert first.is_checked()
        first.focus()
        page.keyboard.press("ArrowDown")
        assert page.get_by_role("radio", name=re.compile("CPU, medium")).is_checked()
        assert serious_violations(page) == []
        _shot(page, f"spawn-form-{theme}.png")
        # "#profile=<slug>" checks that card (the link back from a refused spawn)
        page.goto(f"{hub.url}/hub/home")
        page.goto(f"{hub.url}/hub/spawn/ann#profile=cpu-2")
        page.wait_for_selector(".gpus-form")
        assert page.get_by_role("radio", name=re.compile("CPU, medium")).is_checked()
    finally:
        page.context.close()


def test_refused_spawn_links_back_to_the_form(hub, browser):
    """A profile the form hides, posted anyway (a stale form): the page that reports the
    refusal (progress or error page) shows the reason and the link back to the form with that
    profile selected."""
    hub.ensure_user("dan")
    page = _page(browser, hub, "dan")
    try:
        page.goto(f"{hub.url}/hub/spawn/dan")
        page.wait_for_selector(".gpus-form")
        page.eval_on_selector("input[value=cpu]", "e => { e.value = 'a100-1'; e.checked = true }")
        page.click("#spawn_form button[type=submit]")
        # JupyterHub shows a spawn that fails within 1 s on its error page, a later failure on
        # the progress page (SpawnHandler._wrap_spawn_single_user): the link is on both
        link = page.wait_for_selector("a.gpus-back", timeout=60_000)
        assert link.get_attribute("href") == "/hub/spawn/dan#profile=a100-1"
        text = page.inner_text("body")
        assert "profile 'a100-1'" in text and "A100" in text, text
        assert serious_violations(page, PENDING_PAGE) == []
        _shot(page, "spawn-refused.png")
    finally:
        page.context.close()
    assert not hub.api("GET", "/users/dan").json()["servers"]


# -- progress and JupyterLab -------------------------------------------------------------------
def test_progress_then_lab_without_red_item_or_pop_up(hub, browser):
    hub.ensure_user("carol")
    page = _page(browser, hub, "carol")
    try:
        page.goto(f"{hub.url}/hub/spawn/carol")
        page.wait_for_selector(".gpus-form")
        page.click("#spawn_form button[type=submit]")
        # the pending page: the placement in user words, then the start
        wait_js(page, "() => /Placed: 1 core/.test(document.getElementById("
                "'progress-log')?.textContent || '')", 60_000, "the placement message")
        log = page.text_content("#progress-log") or ""
        assert re.search(r"Placed: 1 core( on NUMA node \d+)?, 256 MiB memory", log), log
        assert "GPU-" not in log  # no UUIDs for users
        page.eval_on_selector("#progress-details", "d => { d.open = true }")
        assert serious_violations(page, PENDING_PAGE) == []
        _shot(page, "spawn-progress.png")
        page.wait_for_url(re.compile(r".*/user/carol/lab.*"), timeout=120_000)
        item = page.locator("#gpuspawner-gpu-status")
        item.wait_for(timeout=60_000)
        page.wait_for_function("() => document.getElementById('gpuspawner-gpu-status')"
                               ".textContent === 'GPU: no GPU'", timeout=30_000)
        assert item.get_attribute("data-level") in ("idle", "warn")
        # the culler warns at once (POLICIES): a JupyterLab notification, time left and reason
        toast = page.locator(".jp-Notification-Toast, .Toastify__toast").filter(
            has_text="stopped by the idle culler")
        toast.first.wait_for(timeout=60_000)
        note = toast.first.inner_text()
        assert re.search(r"in \d+ min \(at \d\d:\d\d UTC\): running for", note), note
        # no news pop-up: the image's overrides.json, as JupyterLab reads it
        # (JupyterLab applies overrides.json to the schema's defaults it serves)
        got = page.evaluate(FETCH_JSON, "/user/carol/lab/api/settings/"
                            "@jupyterlab/apputils-extension:notification")
        assert got["status"] == 200, got
        props = got["body"]["schema"]["properties"]
        assert props["fetchNews"]["default"] == "false", props
        assert props["checkForUpdates"]["default"] is False, props
        news = page.locator(".jp-Notification-Toast, .Toastify__toast").filter(
            has_text=re.compile("official Jupyter news", re.I))
        assert news.count() == 0
        assert serious_violations(page, {"include": [["#gpuspawner-gpu-status"],
                                                     [".Toastify"]]}) == []
        _shot(page, "lab-cpu-session.png")
    finally:
        page.context.close()


# -- admin pages -------------------------------------------------------------------------------
def _hub_look(page: Any) -> None:
    """The hub's stylesheet loaded (not a 404), its navigation bar and theme toggle there."""
    loaded = page.evaluate("""() => [...document.styleSheets].some(s =>
        (s.href || '').endsWith('/hub/static/css/style.min.css') && s.cssRules.length > 100)""")
    assert loaded
    assert page.locator("nav.navbar #dark-theme-toggle").count() == 1
    assert page.locator("nav.navbar a", has_text="Home").count() == 1


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_gpu_map_page(hub, browser, bob, theme):
    page = _page(browser, hub, "admin", dark=theme == "dark")
    try:
        page.goto(f"{hub.url}/services/gpuspawner/")
        page.wait_for_selector("[data-testid=map]")
        assert page.url.endswith("/services/gpuspawner/admin")
        _hub_look(page)
        assert page.evaluate("document.documentElement.dataset.bsTheme") == theme
        # live: the page fetched itself again within a few seconds
        wait_js(page, "() => document.getElementById('live-status').dataset.updated",
                20_000, "a live refresh")
        assert page.inner_text("[data-node=local] [data-testid=node-state]") == "up"
        row = page.locator("[data-allocation][data-user=bob]")
        got = page.evaluate(FETCH_JSON, "/services/gpuspawner/api/allocations")
        assert got["status"] == 200, got
        allocs = [a for a in got["body"] if a["owner"]["user"] == "bob"]
        assert len(allocs) == 1
        cores = len(allocs[0]["cpuset"])
        assert row.locator("td[data-cores]").inner_text() == str(cores)
        title = row.locator("td[data-cores] span").get_attribute("title")
        assert title == f"CPU ids {allocs[0]['cpuset_text']}"
        assert serious_violations(page) == []
        _shot(page, f"service-admin-map-{theme}.png")
        # both pages link to each other and to their REST API
        assert page.locator("a", has_text="REST API (OpenAPI)").count() == 1
        page.click("nav.navbar a:text('Idle culler')")
        page.wait_for_url(re.compile(r".*/services/idle-culler/$"))
        assert page.locator("nav.navbar a:text('GPU map')").count() == 1
    finally:
        page.context.close()


@pytest.mark.parametrize("who", ["admin", "bob"])
def test_culler_page(hub, browser, bob, who):
    page = _page(browser, hub, who)
    try:
        page.goto(f"{hub.url}/services/idle-culler/")
        page.wait_for_selector("[data-testid=servers]")
        _hub_look(page)
        # filled from api/status once the culler has made a pass over bob's running server
        wait_js(page, "() => [...document.querySelectorAll('#servers tbody tr')]"
                ".some(r => r.cells[0].textContent === 'bob')", 60_000, "bob's server listed")
        rows = page.eval_on_selector_all("#servers tbody tr", "rows => rows.map(r => "
                                         "[...r.cells].map(c => c.textContent))")
        users = {r[0] for r in rows}
        assert users == {"bob"} if who == "bob" else "bob" in users
        mine = next(r for r in rows if r[0] == "bob")
        assert mine[2] == "warn", mine
        assert re.match(r"in \d+ min \(\d\d:\d\d UTC\)", mine[3]), mine
        assert "running for" in mine[4] and "max age 20.0min" in mine[4], mine
        assert "age " in mine[5] and "last activity" in mine[5], mine
        assert "max age 20 min (global)" in mine[6] and "warning 25 min (global)" in mine[6]
        assert "Last pass" in page.inner_text("[data-testid=last-pass]")
        assert (page.locator("#policies").count() == 1) is (who == "admin")
        assert serious_violations(page) == []
        if who == "admin":
            assert "max_age" in page.inner_text("#policies") or \
                "max age" in page.inner_text("#policies")
            _shot(page, "culler-page.png")
        # the GPU map is for admins: linked for them only
        assert page.locator("nav.navbar a:text('GPU map')").count() == (who == "admin")
    finally:
        page.context.close()
