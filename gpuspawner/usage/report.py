"""Usage reports: the records of a time range, clipped to it, as they are or added up by
user, group, profile, node, GPU model or day (``GET api/usage``, ``gpuspawner usage``).

Figures (each clipped to ``[from, to)``; an open interval counts until now):

- ``gpu_hours``: milli-GPU / 1000 x hours held (reserved); ``core_hours``: cores x hours;
  ``memory_gib_hours``: GiB x hours;
- ``gpu_hours_measured``: the part of ``gpu_hours`` whose intervals have a utilisation
  figure; ``gpu_used_hours``: each such interval's ``gpu_hours`` x its mean utilisation / 100;
  ``gpu_efficiency_percent`` = used / measured x 100 (None without a figure);
- ``core_hours_measured``, ``cpu_used_hours`` (CPU seconds / 3600, the clipped share of the
  interval's), ``cpu_efficiency_percent`` likewise;
- ``gpu_mem_peak_bytes``: the largest peak of one interval.

A used figure of an interval that is only partly in the range is its share by time (the
mean utilisation is taken as even over the interval). Grouping by ``group`` counts an
interval once in each group its user was in at booking ("" = in none), so the groups' sums may
exceed the total; by ``day`` an interval is cut at the midnights of the time zone ``tz`` (a
day of a DST change has its true length, 23 or 25 hours).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .store import UsageRecord, UsageStore

__all__ = [
    "GROUP_KEYS",
    "ReportError",
    "ReportQuery",
    "build_report",
    "month_start",
    "parse_query",
    "parse_time",
    "report_from_store",
    "to_csv",
]

#: what a report may be grouped by
GROUP_KEYS = ("user", "group", "profile", "node", "gpu_model", "day")
#: the figures of an aggregated row, in CSV column order
FIGURES = (
    "intervals",
    "gpu_hours",
    "core_hours",
    "memory_gib_hours",
    "gpu_hours_measured",
    "gpu_used_hours",
    "gpu_efficiency_percent",
    "core_hours_measured",
    "cpu_used_hours",
    "cpu_efficiency_percent",
    "gpu_mem_peak_bytes",
)
#: a record's columns in a listing (no group_by), in CSV column order
RECORD_COLUMNS = (
    "id",
    "user",
    "groups",
    "kind",
    "name",
    "profile",
    "node",
    "gpu_uuids",
    "gpu_model",
    "gpu_milli",
    "cpu_milli",
    "memory_bytes",
    "disk_bytes",
    "start",
    "end",
    "closed_at_restart",
    "gpu_util_percent",
    "gpu_mem_peak_bytes",
    "cpu_seconds",
    "gpu_hours",
    "core_hours",
)
#: the most group_by keys one report takes
MAX_GROUP_KEYS = 3


class ReportError(ValueError):
    """A bad query: ``field`` names the parameter (``from``, ``to``, ``group_by``, ``tz``,
    ``format``), the message starts with it (an HTTP 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class ReportQuery:
    """What a report covers.

    Attributes:
        start, end: ``[start, end)`` in seconds since the epoch.
        group_by: keys of :data:`GROUP_KEYS` (empty: the records themselves).
        user: only this user's records ("" = everyone the caller may see).
        tz: the IANA time zone of days and of the times shown.
    """

    start: float
    end: float
    group_by: tuple[str, ...] = ()
    user: str = ""
    tz: str = "UTC"
    zone: Any = field(default=timezone.utc, compare=False, repr=False)


def _zone(name: str) -> Any:
    if name in ("", "UTC", "utc", "Z"):
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a path
        raise ReportError(
            "tz", f"unknown time zone {name[:60]!r} (an IANA name, e.g. Europe/Berlin)"
        ) from None


def parse_time(text: str, name: str, zone: Any = timezone.utc) -> float:
    """Seconds since the epoch of ``text``: a date (``2026-11-01``: its midnight in
    ``zone``) or an ISO 8601 time (``2026-11-01T08:00``, in ``zone`` unless it carries an
    offset such as ``Z`` or ``+01:00``).

    Raises:
        ReportError: not such a date or time (``name`` is the field).
    """
    value = text.strip()
    try:
        if len(value) == 10:
            d = date.fromisoformat(value)
            dt = datetime(d.year, d.month, d.day)
        else:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ReportError(
            name, f"{text[:40]!r} is not a date (YYYY-MM-DD) or an ISO 8601 time"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=zone)
    return dt.timestamp()


def month_start(now: float, zone: Any = timezone.utc) -> float:
    """The first midnight of ``now``'s month in ``zone`` (seconds since the epoch)."""
    local = datetime.fromtimestamp(now, zone)
    return datetime(local.year, local.month, 1, tzinfo=zone).timestamp()


def parse_query(
    args: Mapping[str, str], now: float | None = None, retention_days: int | None = None
) -> ReportQuery:
    """A :class:`ReportQuery` from query parameters: ``from``, ``to`` (default: the start of
    this month, now), ``group_by`` (comma-separated :data:`GROUP_KEYS`), ``user``, ``tz``
    (default UTC).

    Raises:
        ReportError: a bad date, an unknown key, ``to`` not after ``from``, or ``from``
            before the retention (``retention_days`` ago), naming the parameter.
    """
    now = time.time() if now is None else now
    tz = (args.get("tz") or "UTC").strip()
    zone = _zone(tz)
    start = parse_time(args["from"], "from", zone) if args.get("from") else month_start(now, zone)
    end = parse_time(args["to"], "to", zone) if args.get("to") else now
    if end <= start:
        raise ReportError("to", "must be after from")
    if (
        args.get("from")
        and retention_days is not None
        and start < now - (retention_days + 1) * 86400.0
    ):  # (a day's grace: a date's midnight)
        raise ReportError(
            "from",
            f"before what is kept: records are kept {retention_days} "
            "days after they end (c.GPUUsage.retention_days)",
        )
    keys: list[str] = []
    for raw in (args.get("group_by") or "").split(","):
        key = raw.strip()
        if not key:
            continue
        if key not in GROUP_KEYS:
            raise ReportError(
                "group_by",
                f"unknown key {key[:40]!r}; one or more of "
                f"{', '.join(GROUP_KEYS)}, comma-separated",
            )
        if key not in keys:
            keys.append(key)
    if len(keys) > MAX_GROUP_KEYS:
        raise ReportError("group_by", f"at most {MAX_GROUP_KEYS} keys")
    return ReportQuery(start, end, tuple(keys), (args.get("user") or "").strip(), tz, zone)


def _iso(t: float | None, zone: Any) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, zone).isoformat(timespec="seconds")


def _days(start: float, end: float, zone: Any) -> list[tuple[str, float, float]]:
    """``[start, end)`` cut at the midnights of ``zone``: (day, piece start, piece end)."""
    out = []
    t = start
    while t < end:
        local = datetime.fromtimestamp(t, zone)
        day = local.date()
        nxt = datetime(day.year, day.month, day.day, tzinfo=zone) + timedelta(days=1)
        # (a midnight of the zone, whatever the DST offset of that day)
        stop = min(end, datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone).timestamp())
        out.append((day.isoformat(), t, stop))
        t = stop
    return out


class _Sums:
    def __init__(self) -> None:
        self.v = dict.fromkeys(FIGURES, 0.0)
        self.v["gpu_mem_peak_bytes"] = None
        self.ids: set[int] = set()

    def add(self, rec: UsageRecord, seconds: float, share: float) -> None:
        h = seconds / 3600.0
        self.ids.add(rec.id)
        gpu_h = rec.gpu_milli / 1000.0 * h
        core_h = rec.cpu_milli / 1000.0 * h
        v = self.v
        v["gpu_hours"] += gpu_h
        v["core_hours"] += core_h
        v["memory_gib_hours"] += rec.memory_bytes / 2**30 * h
        if rec.gpu_util_percent is not None and gpu_h:
            v["gpu_hours_measured"] += gpu_h
            v["gpu_used_hours"] += gpu_h * rec.gpu_util_percent / 100.0
        if rec.cpu_seconds is not None and core_h:
            v["core_hours_measured"] += core_h
            v["cpu_used_hours"] += rec.cpu_seconds * share / 3600.0
        if rec.gpu_mem_peak_bytes is not None:
            v["gpu_mem_peak_bytes"] = max(v["gpu_mem_peak_bytes"] or 0, rec.gpu_mem_peak_bytes)

    def row(self) -> dict[str, Any]:
        v = dict(self.v)
        v["intervals"] = len(self.ids)
        v["gpu_efficiency_percent"] = (
            100.0 * v["gpu_used_hours"] / v["gpu_hours_measured"]
            if v["gpu_hours_measured"]
            else None
        )
        v["cpu_efficiency_percent"] = (
            100.0 * v["cpu_used_hours"] / v["core_hours_measured"]
            if v["core_hours_measured"]
            else None
        )
        for k, x in v.items():
            if isinstance(x, float):
                v[k] = round(x, 6)
        return v


def _list(text: str | None) -> list[str]:
    return list(json.loads(text)) if text else []


def _keys(rec: UsageRecord, key: str) -> list[str]:
    if key == "group":
        return _list(rec.groups) or [""]
    return [str(getattr(rec, key) or "")]


def build_report(
    records: Iterable[UsageRecord], q: ReportQuery, now: float | None = None
) -> dict[str, Any]:
    """The report of ``records`` (:class:`UsageRecord` objects or :meth:`UsageStore.rows`)
    for ``q``: ``{"from", "to", "tz", "group_by", "rows",
    "totals"}``; times are ISO 8601 in ``q.tz``. Without ``group_by`` the rows are the
    records (:data:`RECORD_COLUMNS`, with their ``gpu_hours`` and ``core_hours`` in the
    range), else one row per key combination (its keys, then :data:`FIGURES`), sorted by
    the keys. ``totals`` adds up every record once."""
    now = time.time() if now is None else now
    total = _Sums()
    groups: dict[tuple[str, ...], _Sums] = {}
    listing: list[dict[str, Any]] = []
    for rec in records:
        end = rec.ended if rec.ended is not None else now
        a, b = max(rec.started, q.start), min(end, q.end)
        if b < a or (b == a and not q.start <= rec.started < q.end):
            continue  # outside the range (an interval of no length counts where it began)
        length = max(end - rec.started, 1e-9)
        total.add(rec, b - a, (b - a) / length)
        if not q.group_by:
            h = (b - a) / 3600.0
            listing.append(
                {
                    "id": rec.id,
                    "user": rec.user,
                    "groups": _list(rec.groups),
                    "kind": rec.kind,
                    "name": rec.name,
                    "profile": rec.profile,
                    "node": rec.node,
                    "gpu_uuids": _list(rec.gpu_uuids),
                    "gpu_model": rec.gpu_model,
                    "gpu_milli": rec.gpu_milli,
                    "cpu_milli": rec.cpu_milli,
                    "memory_bytes": rec.memory_bytes,
                    "disk_bytes": rec.disk_bytes,
                    "start": _iso(rec.started, q.zone),
                    "end": _iso(rec.ended, q.zone),
                    "closed_at_restart": bool(rec.closed_at_restart),
                    "gpu_util_percent": rec.gpu_util_percent,
                    "gpu_mem_peak_bytes": rec.gpu_mem_peak_bytes,
                    "gpu_used": json.loads(rec.gpu_used) if rec.gpu_used else None,
                    "cpu_seconds": rec.cpu_seconds,
                    "gpu_hours": round(rec.gpu_milli / 1000.0 * h, 6),
                    "core_hours": round(rec.cpu_milli / 1000.0 * h, 6),
                }
            )
            continue
        pieces = _days(a, b, q.zone) if "day" in q.group_by else [("", a, b)]
        other = [k for k in q.group_by if k != "day"]
        combos: list[dict[str, str]] = [{}]
        for k in other:
            combos = [{**c, k: v} for c in combos for v in _keys(rec, k)]
        for day, pa, pb in pieces:
            for c in combos:
                key = tuple(day if k == "day" else c[k] for k in q.group_by)
                groups.setdefault(key, _Sums()).add(rec, pb - pa, (pb - pa) / length)
    rows: list[dict[str, Any]]
    if q.group_by:
        rows = [
            {**dict(zip(q.group_by, key, strict=True)), **s.row()}
            for key, s in sorted(groups.items())
        ]
    else:
        rows = listing
    return {
        "from": _iso(q.start, q.zone),
        "to": _iso(q.end, q.zone),
        "tz": q.tz,
        "group_by": list(q.group_by),
        "user": q.user or None,
        "rows": rows,
        "totals": total.row(),
    }


#: group_by keys the database adds up itself -> their columns (``day`` is cut in Python)
SQL_KEYS = {
    "user": "user",
    "group": "groups",
    "profile": "profile",
    "node": "node",
    "gpu_model": "gpu_model",
}


def _figures(v: Mapping[str, Any]) -> dict[str, Any]:
    """A row's figures (:data:`FIGURES`) from :meth:`UsageStore.aggregate`'s sums."""
    h = 3600.0
    out: dict[str, Any] = {
        "intervals": int(v["intervals"]),
        "gpu_hours": v["gpu_ms"] / 1000.0 / h,
        "core_hours": v["cpu_ms"] / 1000.0 / h,
        "memory_gib_hours": v["mem_bs"] / 2**30 / h,
        "gpu_hours_measured": v["gpu_meas"] / 1000.0 / h,
        "gpu_used_hours": v["gpu_used"] / 1000.0 / h / 100.0,
        "core_hours_measured": v["cpu_meas"] / 1000.0 / h,
        "cpu_used_hours": v["cpu_used"] / h,
        "gpu_mem_peak_bytes": v["peak"],
    }
    out["gpu_efficiency_percent"] = (
        100.0 * out["gpu_used_hours"] / out["gpu_hours_measured"]
        if out["gpu_hours_measured"]
        else None
    )
    out["cpu_efficiency_percent"] = (
        100.0 * out["cpu_used_hours"] / out["core_hours_measured"]
        if out["core_hours_measured"]
        else None
    )
    return {k: round(x, 6) if isinstance(x, float) else x for k, x in out.items()}


_SUMS = ("intervals", "gpu_ms", "cpu_ms", "mem_bs", "gpu_meas", "gpu_used", "cpu_meas", "cpu_used")


def _add(acc: dict[str, Any], row: Any) -> None:
    for k in _SUMS:
        acc[k] = acc.get(k, 0) + float(getattr(row, k) or 0)
    peak = row.peak
    if peak is not None:
        acc["peak"] = max(acc.get("peak") or 0, int(peak))
    acc.setdefault("peak", None)


def report_from_store(
    store: UsageStore, q: ReportQuery, now: float | None = None
) -> dict[str, Any]:
    """The report of ``q`` from ``store``, as :func:`build_report` makes it: grouped by
    keys of :data:`SQL_KEYS` only, the database adds up the figures
    (:meth:`UsageStore.aggregate`: one row per key combination, not one per record; a
    record's groups are expanded here); with ``day`` or without ``group_by``, the records
    are read and added up here."""
    now = time.time() if now is None else now
    users = [q.user] if q.user else None
    if not q.group_by or "day" in q.group_by:
        return build_report(store.rows(q.start, q.end, users=users), q, now)
    sums = store.aggregate([SQL_KEYS[k] for k in q.group_by], q.start, q.end, now, users)
    total: dict[str, Any] = {}
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in sums:
        _add(total, row)
        combos: list[tuple[str, ...]] = [()]
        for k in q.group_by:
            values = (
                (_list(row.groups) or [""])
                if k == "group"
                else [str(getattr(row, SQL_KEYS[k]) or "")]
            )
            combos = [c + (v,) for c in combos for v in values]
        for key in combos:
            _add(groups.setdefault(key, {}), row)
    empty = dict.fromkeys(_SUMS, 0.0) | {"peak": None}
    return {
        "from": _iso(q.start, q.zone),
        "to": _iso(q.end, q.zone),
        "tz": q.tz,
        "group_by": list(q.group_by),
        "user": q.user or None,
        "rows": [
            {**dict(zip(q.group_by, key, strict=True)), **_figures(v)}
            for key, v in sorted(groups.items())
        ],
        "totals": _figures(total or empty),
    }


#: first characters a spreadsheet reads as a formula (OWASP "CSV injection")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        value = " ".join(str(v) for v in value)
    elif isinstance(value, dict):
        value = json.dumps(value, sort_keys=True)
    text = str(value)
    if text.startswith(_FORMULA) and not isinstance(value, (int, float)):
        return "'" + text  # a user's server name is never run as a formula
    return text


def to_csv(report: Mapping[str, Any]) -> str:
    """The report's rows as CSV (RFC 4180, a header line): the record columns, or the
    group keys and :data:`FIGURES`. Lists are space-joined; a text cell starting like a
    spreadsheet formula gets a leading ``'``."""
    keys: Sequence[str] = report.get("group_by") or ()
    columns = [*keys, *FIGURES] if keys else list(RECORD_COLUMNS)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n")
    w.writerow(columns)
    for row in report.get("rows") or []:
        w.writerow([_cell(row.get(c)) for c in columns])
    return out.getvalue()
