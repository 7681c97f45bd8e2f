"""Usage budgets (``c.GPUSpawner.usage_budgets``, docs/usage.md "Budgets"): GPU-hours and
core-hours a user or a group may book per week or month, counted from the usage records
(:mod:`gpuspawner.usage.store`).

The setting::

    c.GPUSpawner.usage_budgets = {
        "default": {"period": "month", "gpu_hours": 100},             # each user without own
        "users": {"ann": {"period": "week", "gpu_hours": 40, "core_hours": 400}},
        "groups": {"physics": {"period": "month", "gpu_hours": 1000}},  # the group together
    }

- a user's own entry in ``users`` replaces ``default`` for that user; ``default`` counts each
  user on their own;
- a group's budget counts the records of everyone who was in the group when the record was
  booked (its ``groups`` column), and applies to every member now;
- each budget has a ``period`` (``week``: from Monday 00:00; ``month``: from the 1st 00:00,
  both in the site's time zone ``c.GPUUsage.time_zone``) and ``gpu_hours`` and/or
  ``core_hours`` (> 0); a period's use is what the records reserved inside it (an open record
  counts until now), as ``GET api/usage`` adds it up.

A spawn or a notebook job that would *start* while any of its owner's budgets is used up
(``used >= limit``) is refused (:func:`check_budgets`, :class:`BudgetExceeded`); what already
runs is never stopped. At :data:`WARN_PERCENT` the spawn form, the home page and the
JupyterLab panel warn. Holders of :data:`EXEMPT_SCOPE` are never refused.

Standard library and the usage store only: the spawner, the jobs runner and the service all
call the same functions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.exc import SQLAlchemyError

from .store import UsageStore

log = logging.getLogger("gpuspawner")

__all__ = [
    "EXEMPT_SCOPE",
    "PERIODS",
    "UNITS",
    "WARN_PERCENT",
    "Budget",
    "BudgetConfigError",
    "BudgetExceeded",
    "BudgetPolicy",
    "budget_status",
    "check_budgets",
    "check_start",
    "check_time_zone",
    "parse_budgets",
    "period_bounds",
    "refusal_message",
    "warning_text",
]

#: the custom scope whose holders no budget refuses (JupyterHub custom scopes: ``custom:``
#: then lowercase letters, digits, ``-``, ``_``, ``:``; defined in c.JupyterHub.custom_scopes
#: by the gpuspawner service's set-up)
EXEMPT_SCOPE = "custom:gpuspawner:budget-exempt"
#: the share of a budget from which the user is warned (percent)
WARN_PERCENT = 80.0
#: a budget's periods
PERIODS = ("week", "month")
#: a budget's units -> their words in messages
UNITS = {"gpu_hours": "GPU-hours", "core_hours": "core-hours"}
_SETTING = "GPUSpawner.usage_budgets"


class BudgetConfigError(ValueError):
    """A wrong ``c.GPUSpawner.usage_budgets`` or ``c.GPUUsage.time_zone``; the message starts
    with the setting and the field (``GPUSpawner.usage_budgets.users.ann.period: ...``)."""


@dataclass(frozen=True)
class Budget:
    """One budget.

    Attributes:
        kind: ``user``, ``group`` or ``default``.
        key: the user's or group's name ("" for ``default``).
        period: one of :data:`PERIODS`.
        limits: unit (of :data:`UNITS`) -> hours per period (> 0).
    """

    kind: str
    key: str
    period: str
    limits: tuple[tuple[str, float], ...]

    @property
    def name(self) -> str:
        """How messages name it: ``user ann``, ``group physics`` or ``default``."""
        return "default" if self.kind == "default" else f"{self.kind} {self.key}"


@dataclass(frozen=True)
class BudgetPolicy:
    """The parsed setting (:func:`parse_budgets`) and the site's time zone.

    Attributes:
        users: user name -> their own budget.
        groups: group name -> the group's budget.
        default: each user without an own budget; None: none.
        time_zone: the IANA name of the periods' zone (``c.GPUUsage.time_zone``).
    """

    users: Mapping[str, Budget] = field(default_factory=dict)
    groups: Mapping[str, Budget] = field(default_factory=dict)
    default: Budget | None = None
    time_zone: str = "UTC"

    @property
    def zone(self) -> Any:
        return timezone.utc if self.time_zone == "UTC" else ZoneInfo(self.time_zone)

    def __bool__(self) -> bool:
        return bool(self.users or self.groups or self.default)

    def for_user(self, user: str, groups: Iterable[str]) -> list[Budget]:
        """The budgets that apply to ``user`` in ``groups`` now: their own (else the
        default), then their groups' (sorted by name)."""
        own = self.users.get(user, self.default)
        out = [own] if own is not None else []
        out += [self.groups[g] for g in sorted(set(groups)) if g in self.groups]
        return out


class BudgetExceeded(Exception):
    """A start refused: a budget is used up. ``status`` is its :func:`budget_status` entry;
    the message is :func:`refusal_message`'s."""

    #: the ``reason`` label of the placement refusals counter
    reason = "budget"

    def __init__(self, status: Mapping[str, Any]) -> None:
        super().__init__(refusal_message(status))
        self.status = dict(status)


def check_time_zone(name: str, setting: str = "GPUUsage.time_zone") -> str:
    """``name`` if it is an IANA time zone :mod:`zoneinfo` knows (``UTC``, ``Europe/Berlin``).

    Raises:
        BudgetConfigError: ``<setting>: unknown time zone ...``.
    """
    if not isinstance(name, str) or not name.strip():
        raise BudgetConfigError(f"{setting}: must be an IANA time zone name, got {name!r}")
    try:
        ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: too long for a file name
        raise BudgetConfigError(
            f"{setting}: unknown time zone {name[:60]!r} (an IANA name such as UTC or "
            "Europe/Berlin)"
        ) from None
    return name.strip()


def _budget(kind: str, key: str, value: Any, where: str) -> Budget:
    if not isinstance(value, Mapping):
        raise BudgetConfigError(f"{where}: must be a dict such as "
                                '{"period": "month", "gpu_hours": 100}, got {value!r}'[:200])
    unknown = sorted(set(value) - {"period", *UNITS})
    if unknown:
        raise BudgetConfigError(
            f"{where}.{unknown[0]}: unknown key; a budget has period, gpu_hours, core_hours"
        )
    period = value.get("period", "month")
    if period not in PERIODS:
        raise BudgetConfigError(f"{where}.period: must be week or month, got {period!r}")
    limits = []
    for unit in UNITS:
        if unit not in value:
            continue
        v = value[unit]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v:
            raise BudgetConfigError(f"{where}.{unit}: must be a number of hours > 0, got {v!r}")
        limits.append((unit, float(v)))
    if not limits:
        raise BudgetConfigError(f"{where}: give gpu_hours, core_hours or both")
    return Budget(kind, key, period, tuple(limits))


def parse_budgets(value: Mapping[str, Any] | None, time_zone: str = "UTC") -> BudgetPolicy:
    """Check ``c.GPUSpawner.usage_budgets`` (see the module's docstring) and the site's time
    zone.

    Raises:
        BudgetConfigError: naming the field (``GPUSpawner.usage_budgets.groups.physics.
            gpu_hours: must be a number of hours > 0, got -1``).
    """
    zone = check_time_zone(time_zone)
    if not value:
        return BudgetPolicy(time_zone=zone)
    if not isinstance(value, Mapping):
        raise BudgetConfigError(f"{_SETTING}: must be a dict with users, groups, default")
    unknown = sorted(set(value) - {"users", "groups", "default"})
    if unknown:
        raise BudgetConfigError(
            f"{_SETTING}.{unknown[0]}: unknown key; the keys are users, groups, default"
        )
    tables: dict[str, dict[str, Budget]] = {}
    for kind in ("users", "groups"):
        table = value.get(kind)
        table = {} if table is None else table
        if not isinstance(table, Mapping):
            raise BudgetConfigError(f"{_SETTING}.{kind}: must be a dict name -> budget")
        tables[kind] = {}
        for name, spec in table.items():
            if not isinstance(name, str) or not name:
                raise BudgetConfigError(f"{_SETTING}.{kind}: {name!r} is not a name")
            tables[kind][name] = _budget(kind[:-1], name, spec, f"{_SETTING}.{kind}.{name}")
    default = value.get("default")
    return BudgetPolicy(
        tables["users"],
        tables["groups"],
        _budget("default", "", default, f"{_SETTING}.default") if default else None,
        zone,
    )


def _midnight(y: int, m: int, d: int, zone: Any) -> float:
    return datetime(y, m, d, tzinfo=zone).timestamp()


def period_bounds(period: str, now: float, zone: Any) -> tuple[float, float]:
    """``[start, renews)`` of the ``period`` (``week``: Monday 00:00 to the next Monday;
    ``month``: the 1st 00:00 to the next 1st) holding ``now``, at the midnights of ``zone``
    (a week over a DST change is 167 or 169 hours long). Seconds since the epoch."""
    local = datetime.fromtimestamp(now, zone)
    if period == "week":
        first = local.date() - timedelta(days=local.weekday())
        nxt = first + timedelta(days=7)
        return (_midnight(first.year, first.month, first.day, zone),
                _midnight(nxt.year, nxt.month, nxt.day, zone))
    if period == "month":
        y, m = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
        return _midnight(local.year, local.month, 1, zone), _midnight(y, m, 1, zone)
    raise ValueError(f"period: {period!r} is not week or month")


def _iso(t: float, zone: Any) -> str:
    return datetime.fromtimestamp(t, zone).isoformat(timespec="seconds")


def _used(store: UsageStore, budget: Budget, start: float, now: float) -> dict[str, float]:
    """Hours of each unit ``budget``'s owner reserved in ``[start, now)`` (one query)."""
    if budget.kind == "group":
        rows = [r for r in store.aggregate(["groups"], start, now, now, in_group=budget.key)
                if budget.key in (json.loads(r.groups) if r.groups else [])]
    else:
        rows = store.aggregate([], start, now, now, users=[budget.key])
    gpu_ms = sum(float(r.gpu_ms or 0) for r in rows)
    cpu_ms = sum(float(r.cpu_ms or 0) for r in rows)
    return {"gpu_hours": gpu_ms / 1000.0 / 3600.0, "core_hours": cpu_ms / 1000.0 / 3600.0}


def budget_status(
    store: UsageStore,
    policy: BudgetPolicy,
    user: str,
    groups: Iterable[str],
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Where ``user`` (in ``groups`` now) stands with each budget that applies to them: one
    entry per budget and unit, in the order of :meth:`BudgetPolicy.for_user`::

        {"name": "group physics", "kind": "group", "key": "physics", "period": "month",
         "unit": "gpu_hours", "limit": 1000.0, "used": 812.5, "percent": 81.2,
         "period_start": "2026-11-01T00:00:00+01:00",
         "renews_at": "2026-12-01T00:00:00+01:00", "warning": true, "exceeded": false}

    ``used`` in hours (rounded to 0.001), ``percent`` = used / limit x 100 (rounded to 0.1),
    ``warning``: percent >= :data:`WARN_PERCENT`; ``exceeded``: used >= limit (a start is
    refused). Times are ISO 8601 in the site's zone. Reads the store (a query per budget):
    call it off the event loop where a period holds many records."""
    now = time.time() if now is None else now
    zone = policy.zone
    out: list[dict[str, Any]] = []
    for b in policy.for_user(user, groups):
        key = b.key if b.kind == "group" else user
        start, renews = period_bounds(b.period, now, zone)
        used = _used(store, Budget(b.kind, key, b.period, b.limits), start, now)
        for unit, limit in b.limits:
            u = used[unit]
            out.append({
                "name": "default" if b.kind == "default" else f"{b.kind} {key}",
                "kind": b.kind,
                "key": key,
                "period": b.period,
                "unit": unit,
                "limit": limit,
                "used": round(u, 3),
                "percent": round(100.0 * u / limit, 1),
                "period_start": _iso(start, zone),
                "renews_at": _iso(renews, zone),
                "warning": 100.0 * u / limit >= WARN_PERCENT,
                "exceeded": u >= limit,
            })
    return out


def refusal_message(status: Mapping[str, Any]) -> str:
    """The refusal of a start past a budget, from its :func:`budget_status` entry: ``usage
    budget 'group physics' is used up: 1002.3 of 1000 GPU-hours this month; it renews at
    2026-12-01T00:00:00+01:00``."""
    words = UNITS.get(str(status["unit"]), str(status["unit"]))
    return (f"usage budget '{status['name']}' is used up: {status['used']:g} of "
            f"{status['limit']:g} {words} this {status['period']}; it renews at "
            f"{status['renews_at']}")


def warning_text(status: Mapping[str, Any]) -> str:
    """A line for the user about one :func:`budget_status` entry at or past
    :data:`WARN_PERCENT` (the spawn form, the home page, the JupyterLab panel); "" below it:
    ``usage budget 'default': 85 % used (17 of 20 GPU-hours this month; renews at
    2026-12-01T00:00:00+01:00)``, or the :func:`refusal_message` with "new servers and
    jobs cannot start until then" once it is used up."""
    if status.get("exceeded"):
        return refusal_message(status) + "; new servers and jobs cannot start until then"
    if not status.get("warning"):
        return ""
    words = UNITS.get(str(status["unit"]), str(status["unit"]))
    return (f"usage budget '{status['name']}': {status['percent']:g} % used "
            f"({status['used']:g} of {status['limit']:g} {words} this {status['period']}; "
            f"renews at {status['renews_at']})")


def check_budgets(
    store: UsageStore,
    policy: BudgetPolicy,
    user: str,
    groups: Iterable[str],
    scopes: Iterable[str] = (),
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Refuse a start of ``user``'s past a budget; holders of :data:`EXEMPT_SCOPE` (in
    ``scopes``, the user's expanded scopes) pass without a look at the store.

    Returns:
        the :func:`budget_status` entries (empty for an exempt user or no budgets).

    Raises:
        BudgetExceeded: the first used-up entry.
    """
    if not policy or EXEMPT_SCOPE in set(scopes):
        return []
    status = budget_status(store, policy, user, groups, now)
    for entry in status:
        if entry["exceeded"]:
            raise BudgetExceeded(entry)
    return status


async def check_start(
    store: UsageStore,
    policy: BudgetPolicy,
    user: str,
    groups: Iterable[str],
    scopes: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """:func:`check_budgets` for a start (a spawn, a job's run), off the event loop. A usage
    database that cannot be read lets the start pass, with the error in the hub's log (as a
    record that cannot be written never refuses a booking, docs/usage.md).

    Raises:
        BudgetExceeded: a budget of ``user``'s is used up.
    """
    try:
        return await asyncio.to_thread(check_budgets, store, policy, user, list(groups),
                                       set(scopes))
    except SQLAlchemyError as e:
        log.error("usage budgets of %s not checked (the usage database): %s", user, e)
        return []
