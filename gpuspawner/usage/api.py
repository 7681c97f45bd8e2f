"""``GET api/usage`` of the gpuspawner service: usage reports from the usage records
(:mod:`gpuspawner.usage.report`).

Query: ``from``, ``to`` (a date ``YYYY-MM-DD`` or an ISO 8601 time; default: this month up to
now), ``group_by`` (comma-separated: ``user``, ``group``, ``profile``, ``node``,
``gpu_model``, ``day``; none: the records themselves), ``user``, ``tz`` (IANA name, default
UTC), ``format`` (``json``, default, or ``csv``).

Access: every user reads their own records only: ``user`` naming anyone else is a 403, and
without ``user`` the report is filtered to the caller (so ``group_by=user`` or ``group`` shows
the caller's own rows only). The service's admin view (:meth:`GPUService.is_admin`: the scope
``custom:gpuspawner:admin`` or unfiltered ``admin:users``; the hub's admin flag for a browser
login) reads everyone's, as the hub answers at that request (a kept answer granting it is
checked with the hub afresh: :attr:`ServiceHandler.fresh`). A parameter given twice is a 400
(one value decides, never the other). Bad input is a 400 naming the parameter; 503 when usage
records are off (``c.GPUUsage.enabled``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tornado import web

from ..hub.service_base import ServiceHandler, hub_user_scopes
from .budgets import EXEMPT_SCOPE, WARN_PERCENT, budget_status
from .pages import usage_page_routes
from .report import ReportError, parse_query, report_from_store, to_csv

__all__ = ["PARAMETERS", "BudgetStatusHandler", "UsageReportHandler", "usage_routes"]

#: the query parameters ``api/usage`` reads
PARAMETERS = ("from", "to", "group_by", "user", "tz", "format")


class UsageReportHandler(ServiceHandler):
    """``GET api/usage``: a usage report (see the module's docstring)."""

    def _args(self) -> dict[str, str]:
        args: dict[str, str] = {}
        for name in PARAMETERS:
            values = self.get_query_arguments(name)
            if len(values) > 1:
                raise web.HTTPError(400, f"{name}: given {len(values)} times; give it once")
            args[name] = values[0] if values else ""
        return args

    async def get(self) -> None:
        user = self.require_user()
        args = self._args()
        fmt = (args["format"] or "json").lower()
        if fmt not in ("json", "csv"):
            raise web.HTTPError(400, f"format: {args['format'][:20]!r} is not json or csv")
        if not self.is_admin(user):
            if args["user"] and args["user"] != user["name"]:
                raise web.HTTPError(403, f"{user['name']} may not read the usage of another user")
            args["user"] = user["name"]  # whatever else is asked: own rows only
        cluster = await self.cluster()  # restored: records of what ended meanwhile closed
        recorder = getattr(cluster, "usage", None)
        if recorder is None:
            raise web.HTTPError(503, "usage records are off (c.GPUUsage.enabled)")
        try:
            q = parse_query(args, retention_days=recorder.retention_days)
        except ReportError as e:
            raise web.HTTPError(400, str(e)) from None
        now = time.time()

        def read() -> dict[str, Any]:  # off the event loop: a year is many rows
            return report_from_store(recorder.store, q, now)

        report = await asyncio.to_thread(read)
        if fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=UTF-8")
            self.set_header("Content-Disposition", 'attachment; filename="usage.csv"')
            self.set_header("Cache-Control", "no-store")
            self.finish(to_csv(report))
            return
        self.write_json(report)


class BudgetStatusHandler(ServiceHandler):
    """``GET api/usage/budgets[?user=name]``: where a user stands with their usage budgets
    (:func:`gpuspawner.usage.budgets.budget_status`)::

        {"user": "ann", "time_zone": "Europe/Berlin", "warn_percent": 80.0,
         "exempt": false, "budgets": [{"name": "group physics", "kind": "group",
         "key": "physics", "period": "month", "unit": "gpu_hours", "limit": 1000.0,
         "used": 812.5, "percent": 81.2, "period_start": "2026-11-01T00:00:00+01:00",
         "renews_at": "2026-12-01T00:00:00+01:00", "warning": true, "exceeded": false}]}

    ``budgets`` is empty without budgets for the user; ``exempt``: the user holds
    ``custom:gpuspawner:budget-exempt`` (never refused; the figures still show). Access: the
    caller's own; ``user`` naming another user needs the service's admin view (else 403);
    an unknown user is a 404. 503 when usage records are off."""

    async def get(self) -> None:
        caller = self.require_user()
        names = self.get_query_arguments("user")
        if len(names) > 1:
            raise web.HTTPError(400, f"user: given {len(names)} times; give it once")
        name = names[0] if names and names[0] else caller["name"]
        if name != caller["name"] and not self.is_admin(caller):
            raise web.HTTPError(403, f"{caller['name']} may not read the budgets of another user")
        cluster = await self.cluster()
        recorder = getattr(cluster, "usage", None)
        policy = getattr(cluster, "usage_budgets", None)
        if recorder is None or policy is None:
            raise web.HTTPError(503, "usage records are off (c.GPUUsage.enabled)")
        info = self.service.user_lookup(name)
        if info is None:
            raise web.HTTPError(404, f"user: no hub user {name[:80]!r}")
        groups = info[1]
        scopes = hub_user_scopes(name) or set()
        now = time.time()
        status = await asyncio.to_thread(budget_status, recorder.store, policy, name, groups, now)
        self.write_json({
            "user": name,
            "time_zone": policy.time_zone,
            "warn_percent": WARN_PERCENT,
            "exempt": EXEMPT_SCOPE in scopes,
            "budgets": status,
        })


def usage_routes(prefix: str, kw: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The routes of ``api/usage``, ``api/usage/budgets`` and the admins' ``usage`` page
    (:mod:`gpuspawner.usage.pages`) under ``prefix`` (one of
    :class:`~gpuspawner.hub.service.app.GPUService`'s ``extra_routes``)."""
    return [
        (prefix + "api/usage", UsageReportHandler, kw),
        (prefix + "api/usage/budgets", BudgetStatusHandler, kw),
        *usage_page_routes(prefix, kw),
    ]
