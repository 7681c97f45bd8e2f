"""``GET usage`` of the gpuspawner service: the admins' usage page, in the hub's look like the
GPU map (``service/templates/usage.html.j2``).

It shows the range of ``from``, ``to`` and ``tz`` (as ``api/usage``; default: this month up to
now, UTC): a stacked bar chart of GPU-hours per group per day, drawn here as SVG (no script
library; colours that read on the light and the dark theme), and a table of every user's
GPU- and core-hours with their efficiency (used / reserved, :mod:`gpuspawner.usage.report`),
sortable by any column with buttons in the headers (keyboard and screen readers: ``aria-sort``).
Access: the service's admin view (:meth:`GPUService.is_admin`), else 403; a browser without a
login is sent to the hub's login.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from tornado import web

from ..hub.service_base import ServiceHandler
from ..webui import REFRESH_S, service_links
from .report import ReportError, parse_query, report_from_store

__all__ = ["CHART_COLOURS", "UsagePageHandler", "chart_view", "usage_page_routes",
           "user_rows"]

#: group colours in the chart, in turn (Okabe and Ito's palette for colour-blind readers,
#: https://jfly.uni-koeln.de/color/; each reads on white and on the dark theme's background)
CHART_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                 "#F0E442", "#999999")
#: the chart's size in SVG units (it scales to the page's width)
WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 46
#: the label of records whose user was in no group
NO_GROUP = "(no group)"


def _nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above ``value`` (the y axis's top)."""
    if value <= 0:
        return 1.0
    exp = 10.0 ** math.floor(math.log10(value))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * exp >= value - 1e-12:
            return m * exp
    return 10.0 * exp  # pragma: no cover (the loop ends at 10)


def chart_view(report: Mapping[str, Any]) -> dict[str, Any]:
    """The stacked chart of a report grouped by ``day`` and ``group`` (``api/usage``'s rows):
    ``{"days", "groups": [{"name", "colour", "gpu_hours"}], "bars": [{"day", "x", "width",
    "total", "label", "segments": [{"group", "y", "height", "colour", "gpu_hours"}]}],
    "ticks": [{"y", "label"}], "y_max", "width", "height", "left", "bottom", "summary"}``;
    positions in SVG units, figures in GPU-hours. A record counts once in each group of its
    user (the groups' bars may add up to more than the GPU-hours held)."""
    per: dict[tuple[str, str], float] = {}
    days: list[str] = []
    totals: dict[str, float] = {}
    for row in report.get("rows", ()):
        day, group = str(row.get("day", "")), str(row.get("group", "")) or NO_GROUP
        hours = float(row.get("gpu_hours") or 0.0)
        if day not in days:
            days.append(day)
        per[(day, group)] = per.get((day, group), 0.0) + hours
        totals[group] = totals.get(group, 0.0) + hours
    days.sort()
    names = sorted(g for g, h in totals.items() if h > 0)
    colour = {g: CHART_COLOURS[i % len(CHART_COLOURS)] for i, g in enumerate(names)}
    day_sums = {d: sum(per.get((d, g), 0.0) for g in names) for d in days}
    y_max = _nice_max(max(day_sums.values(), default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(days), 1)
    bars = []
    for i, d in enumerate(days):
        y = TOP + plot_h
        segments = []
        for g in names:
            h = per.get((d, g), 0.0)
            if h <= 0:
                continue
            height = plot_h * h / y_max
            y -= height
            segments.append({"group": g, "y": round(y, 2), "height": round(height, 2),
                             "colour": colour[g], "gpu_hours": round(h, 3)})
        bars.append({"day": d, "x": round(LEFT + i * step + step * 0.1, 2),
                     "width": round(step * 0.8, 2), "total": round(day_sums[d], 3),
                     "label": d[5:] if len(d) == 10 else d,
                     "label_x": round(LEFT + (i + 0.5) * step, 2),
                     "show_label": len(days) <= 16 or i % math.ceil(len(days) / 16) == 0,
                     "segments": segments})
    ticks = [{"y": round(TOP + plot_h - plot_h * k / 4, 2), "label": f"{y_max * k / 4:g}"}
             for k in range(5)]
    summary = ", ".join(f"{g} {totals[g]:.1f} GPU-hours" for g in names) or "no GPU-hours"
    return {"days": days,
            "groups": [{"name": g, "colour": colour[g], "gpu_hours": round(totals[g], 3)}
                       for g in names],
            "bars": bars, "ticks": ticks, "y_max": y_max, "width": WIDTH, "height": HEIGHT,
            "left": LEFT, "right": WIDTH - RIGHT, "top": TOP, "bottom": TOP + plot_h,
            "summary": summary}


def user_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The table's rows from a report grouped by ``user``: each user's ``gpu_hours``
    (reserved), ``gpu_used_hours``, ``gpu_efficiency_percent`` (None without a utilisation
    figure), ``core_hours``, ``cpu_used_hours``, ``cpu_efficiency_percent``; least efficient
    GPU use first (users without a figure last), then by name."""
    rows = [{k: r.get(k) for k in ("user", "gpu_hours", "gpu_used_hours",
                                   "gpu_efficiency_percent", "core_hours", "cpu_used_hours",
                                   "cpu_efficiency_percent", "intervals")}
            for r in report.get("rows", ())]
    rows.sort(key=lambda r: (r["gpu_efficiency_percent"] is None,
                             r["gpu_efficiency_percent"] or 0.0, r["user"]))
    return rows


class UsagePageHandler(ServiceHandler):
    """``GET usage``: the admins' usage page (see the module's docstring)."""

    api = False

    async def get(self) -> None:
        user = self.admin_page_user("the usage page", f"{self.service.prefix}api/usage")
        if user is None:
            return
        args = {}
        for name in ("from", "to", "tz"):
            values = self.get_query_arguments(name)
            if len(values) > 1:
                raise web.HTTPError(400, f"{name}: given {len(values)} times; give it once")
            args[name] = values[0] if values else ""
        cluster = await self.cluster()
        recorder = getattr(cluster, "usage", None)
        if recorder is None:
            raise web.HTTPError(503, "usage records are off (c.GPUUsage.enabled)")
        now = time.time()
        try:
            by_day = parse_query({**args, "group_by": "day,group"}, now, recorder.retention_days)
            by_user = parse_query({**args, "group_by": "user"}, now, recorder.retention_days)
        except ReportError as e:
            raise web.HTTPError(400, str(e)) from None
        templates = self.service.templates
        p = self.service.prefix

        def render() -> str:  # off the event loop: a month of records and the page (and
            # the template's first load: Jinja2 compiles it, tens of ms)
            template = templates.get_template("usage.html.j2")
            days = report_from_store(recorder.store, by_day, now)
            users = report_from_store(recorder.store, by_user, now)
            query = urlencode({k: v for k, v in args.items() if v})
            return template.render(
                chart=chart_view(days), rows=user_rows(users), totals=users["totals"],
                range={"from": users["from"], "to": users["to"], "tz": users["tz"]},
                args=args, user={"name": user["name"], "admin": True}, prefix=p,
                hub_prefix=self.service.hub_prefix, refresh_s=REFRESH_S,
                xsrf=self.xsrf_token.decode(),
                links=service_links(self.service.services_prefix, "Usage"),
                api_links=[("usage report (JSON)", f"{p}api/usage?group_by=user"
                            + (f"&{query}" if query else "")),
                           ("CSV", f"{p}api/usage?group_by=user&format=csv"
                            + (f"&{query}" if query else ""))])

        html = await asyncio.to_thread(render)
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(html)


def usage_page_routes(prefix: str, kw: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The route of the ``usage`` page under ``prefix`` (with :func:`usage_routes`)."""
    return [(prefix + "usage", UsagePageHandler, kw)]
