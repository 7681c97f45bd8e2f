"""The ``api/usage`` part of the gpuspawner service's OpenAPI document (merged into
:func:`gpuspawner.hub.service.openapi.openapi_document`)."""

from __future__ import annotations

from typing import Any

from .budgets import PERIODS, UNITS
from .report import FIGURES, GROUP_KEYS

__all__ = ["SCHEMAS", "paths"]

_ERR = {"$ref": "#/components/schemas/Error"}
_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": "number", "nullable": True}
_STR = {"type": "string"}
_STR_OR_NULL = {"type": "string", "nullable": True}


def _resp(
    description: str, schema: dict[str, Any], media: str = "application/json"
) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


#: one row of a report: a record (no group_by) or a group's figures
USAGE_ROW: dict[str, Any] = {
    "type": "object",
    "description": "without group_by: one usage record (its columns, with gpu_hours and "
    "core_hours inside the range); with group_by: the keys, then the figures",
    "properties": {
        **{k: _STR for k in GROUP_KEYS},
        "id": {"type": "integer"},
        "kind": {"type": "string", "enum": ["server", "job"]},
        "name": _STR,
        "groups": {"type": "array", "items": _STR},
        "gpu_uuids": {"type": "array", "items": _STR},
        "gpu_milli": {"type": "integer"},
        "cpu_milli": {"type": "integer"},
        "memory_bytes": {"type": "integer"},
        "disk_bytes": {"type": "integer"},
        "start": _STR,
        "end": _STR_OR_NULL,
        "closed_at_restart": {"type": "boolean"},
        "gpu_util_percent": _NUM_OR_NULL,
        "gpu_mem_peak_bytes": {"type": "integer", "nullable": True},
        "gpu_used": {"type": "object", "nullable": True},
        "cpu_seconds": _NUM_OR_NULL,
        **{k: _NUM_OR_NULL for k in FIGURES if k not in ("intervals", "gpu_mem_peak_bytes")},
        "intervals": {"type": "integer"},
    },
}

USAGE_REPORT: dict[str, Any] = {
    "type": "object",
    "required": ["from", "to", "tz", "group_by", "rows", "totals"],
    "properties": {
        "from": _STR,
        "to": _STR,
        "tz": _STR,
        "user": _STR_OR_NULL,
        "group_by": {"type": "array", "items": {"type": "string", "enum": list(GROUP_KEYS)}},
        "rows": {"type": "array", "items": {"$ref": "#/components/schemas/UsageRow"}},
        "totals": {"$ref": "#/components/schemas/UsageRow"},
    },
}

#: one entry of ``api/usage/budgets`` (:func:`gpuspawner.usage.budgets.budget_status`)
BUDGET_ENTRY: dict[str, Any] = {
    "type": "object",
    "required": ["name", "kind", "key", "period", "unit", "limit", "used", "percent",
                 "period_start", "renews_at", "warning", "exceeded"],
    "properties": {
        "name": {"type": "string", "description": "'user ann', 'group physics' or 'default'"},
        "kind": {"type": "string", "enum": ["user", "group", "default"]},
        "key": {"type": "string", "description": "the user's or the group's name"},
        "period": {"type": "string", "enum": list(PERIODS)},
        "unit": {"type": "string", "enum": list(UNITS)},
        "limit": {**_NUM, "description": "hours per period"},
        "used": {**_NUM, "description": "hours reserved in this period so far"},
        "percent": _NUM,
        "period_start": {**_STR, "format": "date-time"},
        "renews_at": {**_STR, "format": "date-time"},
        "warning": {"type": "boolean", "description": "percent >= warn_percent"},
        "exceeded": {"type": "boolean", "description": "used >= limit: starts are refused"},
    },
}

BUDGET_STATUS: dict[str, Any] = {
    "type": "object",
    "required": ["user", "time_zone", "warn_percent", "exempt", "budgets"],
    "properties": {
        "user": _STR,
        "time_zone": {**_STR, "description": "c.GPUUsage.time_zone, the periods' zone"},
        "warn_percent": _NUM,
        "exempt": {"type": "boolean",
                   "description": "the user holds custom:gpuspawner:budget-exempt"},
        "budgets": {"type": "array", "items": {"$ref": "#/components/schemas/BudgetEntry"}},
    },
}

#: the component schemas ``api/usage`` adds
SCHEMAS = {"UsageRow": USAGE_ROW, "UsageReport": USAGE_REPORT, "BudgetEntry": BUDGET_ENTRY,
           "BudgetStatus": BUDGET_STATUS}


def _param(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema or _STR,
        "description": description,
    }


def paths() -> dict[str, Any]:
    """The ``api/usage`` and ``api/usage/budgets`` paths."""
    return {
        "/api/usage/budgets": {
            "get": {
                "operationId": "usageBudgets",
                "summary": "Where a user stands with their usage budgets (your own; admins: "
                "anyone's)",
                "description": "docs/usage.md, Budgets. One entry per budget and unit; a "
                "start is refused while an entry is exceeded, unless exempt.",
                "parameters": [_param("user", "another user's (admins only); default: yours")],
                "responses": {
                    "200": _resp("the budgets", {"$ref": "#/components/schemas/BudgetStatus"}),
                    "400": _resp("user given twice", _ERR),
                    "401": _resp("no token or cookie identifies a hub user", _ERR),
                    "403": _resp("another user's budgets, and not an admin", _ERR),
                    "404": _resp("no such hub user", _ERR),
                    "503": _resp("usage records are off (c.GPUUsage.enabled)", _ERR),
                },
            }
        },
        "/api/usage": {
            "get": {
                "operationId": "usageReport",
                "summary": "Usage records of servers and jobs, as they are or grouped (your own; "
                "admins: everyone's)",
                "description": "docs/usage.md. Every figure is clipped to [from, to). A "
                "user's query is filtered to the user's own records whatever else it asks.",
                "parameters": [
                    _param(
                        "from",
                        "a date (YYYY-MM-DD) or an ISO 8601 time; default: this month's start",
                    ),
                    _param("to", "a date or an ISO 8601 time; default: now"),
                    _param("group_by", "comma-separated, up to 3 of: " + ", ".join(GROUP_KEYS)),
                    _param("user", "one user's records (another user's: admins only)"),
                    _param("tz", "IANA time zone of days and times; default UTC"),
                    _param(
                        "format",
                        "json (default) or csv",
                        {"type": "string", "enum": ["json", "csv"]},
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "the report",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/UsageReport"}
                            },
                            "text/csv": {"schema": {"type": "string"}},
                        },
                    },
                    "400": _resp("a bad parameter, named first in the message", _ERR),
                    "401": _resp("no token or cookie identifies a hub user", _ERR),
                    "403": _resp("another user's records, and not an admin", _ERR),
                    "503": _resp("usage records are off (c.GPUUsage.enabled)", _ERR),
                },
            }
        }
    }
