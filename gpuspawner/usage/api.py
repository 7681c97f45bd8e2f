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
login) reads everyone's. A parameter given twice is a 400 (one value decides, never the other).
Bad input is a 400 naming the parameter; 503 when usage records are off
(``c.GPUUsage.enabled``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tornado import web

from ..hub.service_base import ServiceHandler
from .report import ReportError, parse_query, report_from_store, to_csv

__all__ = ["PARAMETERS", "UsageReportHandler", "usage_routes"]

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


def usage_routes(prefix: str, kw: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The route of ``api/usage`` under ``prefix`` (one of
    :class:`~gpuspawner.hub.service.app.GPUService`'s ``extra_routes``)."""
    return [(prefix + "api/usage", UsageReportHandler, kw)]
