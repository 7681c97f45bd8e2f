"""The admins' usage page in Debian's Chromium driven by Python Playwright: the page as the
service renders it (its template, gpuspawner.usage.pages' chart and table views of a month of
three groups and four users), with JupyterHub's own stylesheet and theme script from the
installed package, opened from a file (no hub: what is checked is the page's markup and
script; tests/test_usage_pages.py checks the service's route and its refusals).

- axe-core: no serious or critical violation, in the light and the dark theme;
- the chart: one bar per day, the groups' segments stacked; the SVG's text takes the theme's
  colour;
- the table: least efficient first; the header buttons sort with the keyboard (Tab to the
  button, Enter), a second press reverses, ``aria-sort`` follows; users without a figure
  stay last;
- a screenshot goes to var/screenshots/usage-admin.png and to docs/usage-admin.png when that is
  missing or with GPUSPAWNER_UPDATE_DOCS=1 (docs/howto/usage-accounting.md shows it).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuspawner.hub.service.views import page_templates
from gpuspawner.usage.pages import chart_view, user_rows
from gpuspawner.webui import service_links
from tests.hubrunner import REPO
from tests.test_pages_browser import (  # noqa: F401 (browser: the fixture)
    AXE,
    CHROMIUM,
    browser,
    serious_violations,
)

sync_api = pytest.importorskip("playwright.sync_api")

STATIC = Path(sys.prefix) / "share" / "jupyterhub"
SCREENSHOTS = REPO / "var" / "screenshots"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK) or not AXE.exists(),
                       reason=f"{CHROMIUM} or {AXE} is missing"),
]

GROUPS = {"physics": 6.0, "chemistry": 3.5, "": 1.0}
USERS = [
    ("ann", 120.0, 96.0, 40.0, 30.0),
    ("bob", 80.0, 20.0, 16.0, 2.0),
    ("cid", 30.0, None, 8.0, None),
    ("dee", 10.0, 7.5, 64.0, 60.0),
]


def _html(tmp_path: Path) -> Path:
    rows = [{"day": f"2026-11-{d:02d}", "group": g, "gpu_hours": h * (1 + (d % 4) / 3)}
            for d in range(1, 15) for g, h in GROUPS.items()]
    users = [{"user": u, "gpu_hours": gh, "gpu_used_hours": gu,
              "gpu_efficiency_percent": None if gu is None else 100 * gu / gh,
              "core_hours": ch, "cpu_used_hours": cu,
              "cpu_efficiency_percent": None if cu is None else 100 * cu / ch, "intervals": 3}
             for u, gh, gu, ch, cu in USERS]
    html = page_templates().get_template("usage.html.j2").render(
        chart=chart_view({"rows": rows}), rows=user_rows({"rows": users}),
        totals={"gpu_hours": 240.0, "core_hours": 128.0},
        range={"from": "2026-11-01T00:00:00+01:00", "to": "2026-11-15T00:00:00+01:00",
               "tz": "Europe/Berlin"},
        args={"from": "2026-11-01", "to": "2026-11-15", "tz": "Europe/Berlin"},
        user={"name": "admin", "admin": True}, prefix="/services/gpuspawner/",
        hub_prefix=STATIC.as_uri() + "/", refresh_s=5, xsrf="x",
        links=service_links("/services/", "Usage"),
        api_links=[("usage report (JSON)", "/services/gpuspawner/api/usage?group_by=user")])
    out = tmp_path / "usage.html"
    out.write_text(html)
    return out


def _order(page: Any) -> list[str]:
    return page.eval_on_selector_all("[data-testid=usage-users] tbody tr",
                                     "rows => rows.map(r => r.dataset.user)")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_usage_page_is_accessible_and_sorts_with_the_keyboard(
        browser, tmp_path, theme):  # noqa: F811 (tests.test_pages_browser's fixture)
    page = browser.new_page(viewport={"width": 1100, "height": 900}, color_scheme=theme)
    page.add_init_script(f"localStorage.setItem('jupyterhub-bs-theme', '{theme}')")
    page.goto(_html(tmp_path).as_uri())
    page.evaluate(f"document.documentElement.setAttribute('data-bs-theme', '{theme}')")
    # the hub's stylesheet applied (Bootstrap's table rules), the theme's text colour in the SVG
    assert page.eval_on_selector("table", "t => getComputedStyle(t).borderCollapse") == "collapse"
    body = page.eval_on_selector("body", "b => getComputedStyle(b).color")
    svg_text = page.eval_on_selector(".usage-chart text", "t => getComputedStyle(t).fill")
    assert svg_text == body
    assert page.locator(".usage-chart g.bar").count() == 14
    assert page.locator(".usage-chart g.bar").first.locator("rect").count() == 3
    assert serious_violations(page) == []

    assert _order(page) == ["bob", "dee", "ann", "cid"]  # least efficient first, cid: none
    button = page.locator("th button[data-key=gpu_efficiency_percent]")
    button.focus()
    page.keyboard.press("Enter")  # ascending -> descending
    assert _order(page) == ["ann", "dee", "bob", "cid"]
    assert button.locator("xpath=..").get_attribute("aria-sort") == "descending"
    page.keyboard.press("Shift+Tab")  # the previous header: GPU-hours used
    page.keyboard.press("Enter")
    assert _order(page) == ["dee", "bob", "ann", "cid"]
    assert page.locator("th[aria-sort]").count() == 1
    assert "sorted by GPU-hours used, ascending" in page.inner_text("#sort-status")
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")  # user
    page.keyboard.press("Space")
    assert _order(page) == ["ann", "bob", "cid", "dee"]
    assert serious_violations(page) == []

    if theme == "light":
        page.evaluate("document.querySelector('th button[data-key=gpu_efficiency_percent]')"
                      ".click()")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        out = SCREENSHOTS / "usage-admin.png"
        page.screenshot(path=str(out), full_page=True)
        assert out.stat().st_size > 5_000
        docs = REPO / "docs" / "usage-admin.png"
        if not docs.exists() or os.environ.get("GPUSPAWNER_UPDATE_DOCS") == "1":
            shutil.copyfile(out, docs)
    page.close()
