"""The settings of usage accounting, ``c.GPUUsage.*`` in ``jupyterhub_config.py``
(docs/usage.md); checked when the hub starts (:func:`gpuspawner.usage.hub.attach_usage`)."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Float, Int, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from .budgets import BudgetConfigError, check_time_zone

__all__ = ["GPUUsage", "USAGE_DB_FILE"]

#: the usage database's file in the state folder (GPUSpawner.state_dir)
USAGE_DB_FILE = "gpuspawner-usage.sqlite"


class GPUUsage(LoggingConfigurable):
    """Usage accounting: one record per booked bundle of a server or a notebook job
    (docs/usage.md)."""

    enabled = Bool(
        True,
        help="""Keep a usage record of every bundle the hub books (servers
        and notebook jobs): who, which devices, from when to when, and what was used.
        Reports: GET api/usage of the gpuspawner service, `gpuspawner usage`.""",
    ).tag(config=True)
    db_url = Unicode(
        "",
        help="""SQLAlchemy URL of the usage database. Empty = SQLite,
        gpuspawner-usage.sqlite in GPUSpawner.state_dir (made mode 0600). A PostgreSQL URL
        works where its driver is installed.""",
    ).tag(config=True)
    retention_days = Int(
        400,
        help="""Days a usage record is kept after it ended (at least
        1); older records are deleted when the hub starts and once an hour after. Reports
        cannot reach further back.""",
    ).tag(config=True)

    sample_interval = Float(
        30.0,
        help="""Seconds between two readings of the utilisation and memory used of the
        booked GPUs of the hub's own host (nodes with topology "auto", through NVML); each
        usage record gets its GPUs' mean utilisation and peak memory. 0 = no readings.""",
    ).tag(config=True)

    metrics_user_label = Bool(
        False,
        help="""Add a user label to the Prometheus usage counters
        (gpuspawner_usage_*_seconds_total, served at /services/gpuspawner/metrics), beside
        group and profile. Off by default: every user becomes time series Prometheus keeps (at
        most 1000 label sets; later ones count under "_other").""",
    ).tag(config=True)

    time_zone = Unicode(
        "UTC",
        help="""The site's IANA time zone (e.g. Europe/Berlin): usage budgets' weeks and months
        (c.GPUSpawner.usage_budgets) start at its midnights. Records stay in UTC.""",
    ).tag(config=True)

    @validate("time_zone")
    def _time_zone(self, proposal: Any) -> str:
        try:
            return check_time_zone(proposal.value)
        except BudgetConfigError as e:
            raise TraitError(str(e)) from None

    @validate("sample_interval")
    def _interval(self, proposal: Any) -> float:
        value = proposal.value
        if value < 0:
            raise TraitError(
                f"GPUUsage.sample_interval: must be >= 0 seconds (0 = off), got {value!r}"
            )
        return float(value)

    @validate("retention_days")
    def _retention(self, proposal: Any) -> int:
        value = proposal.value
        if isinstance(value, bool) or value < 1:
            raise TraitError(
                f"GPUUsage.retention_days: must be a whole number of days >= 1, got {value!r}"
            )
        return int(value)
