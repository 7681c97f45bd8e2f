"""Usage accounting in the hub: :func:`attach_usage` opens the usage database and makes the
hub's ledger keep one record per booked bundle; called when the hub's runtime is built
(:func:`gpuspawner.hub.config_check.check_hub_config`), before anything is booked or
restored."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from traitlets import TraitError

from ..hub.cluster import Cluster
from ..hub.state import state_file
from ..placement import Allocation
from .budgets import BudgetConfigError, parse_budgets
from .recorder import UsageRecorder
from .sampler import GPUSampler, run_readings
from .settings import USAGE_DB_FILE, GPUUsage
from .store import UsageStore, UsageStoreError, shown_url

log = logging.getLogger("gpuspawner")

__all__ = ["UsageConfigError", "attach_usage", "usage_db_url"]


class UsageConfigError(ValueError):
    """A ``c.GPUUsage`` setting is wrong or its database cannot be opened; the message starts
    with the setting (``GPUUsage.retention_days: ...``)."""


def usage_db_url(settings: GPUUsage, state_dir: str, hub_db_url: str | None) -> str:
    """The usage database's URL: ``c.GPUUsage.db_url``, else SQLite
    :data:`~gpuspawner.usage.settings.USAGE_DB_FILE` in the state folder
    (:func:`gpuspawner.hub.state.state_file`)."""
    return settings.db_url or "sqlite:///" + state_file(state_dir, hub_db_url, USAGE_DB_FILE)


def _section(c: Any, name: str) -> Any:
    return c[name] if name in c else {}


def _start_readings(
    cluster: Cluster, recorder: UsageRecorder, interval_s: float, gpu: GPUSampler | None
) -> None:
    """Start the readings of what is used on the running loop (once; called after the
    restore, which runs on the hub's loop)."""
    if getattr(cluster, "_usage_readings", None) is not None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(
        run_readings(recorder, interval_s, gpu=gpu, backend=cluster.backend),
        name="gpuspawner-usage-readings",
    )
    cluster._usage_readings = task  # type: ignore[attr-defined]


def attach_usage(
    cluster: Cluster, config: Any, state_dir: str = "", hub_db_url: str | None = None
) -> UsageRecorder | None:
    """Read ``c.GPUUsage`` from ``config``, open the usage database (migrated to the head),
    delete records past the retention and attach a :class:`UsageRecorder` to the cluster's
    ledger (``cluster.usage``), closing what the previous hub left open once the cluster's
    restore ran (``cluster.after_restore``). The profile of a booking is its wait-queue
    entry's (every spawn and job is booked through the queue). Once per cluster: a second call
    returns the recorder made first.

    Args:
        cluster: the hub's cluster.
        config: the hub's traitlets ``Config``.
        state_dir: ``GPUSpawner.state_dir`` ("" = the folder of the hub's database).
        hub_db_url: the hub's ``JupyterHub.db_url``.

    The usage budgets (``c.GPUSpawner.usage_budgets`` in ``c.GPUUsage.time_zone``,
    :func:`gpuspawner.usage.budgets.parse_budgets`) become ``cluster.usage_budgets``.

    Returns:
        the recorder, or None when ``c.GPUUsage.enabled`` is False.

    Raises:
        UsageConfigError: a setting is wrong, or the database cannot be opened (a newer
            schema, a folder that cannot be written), naming the setting.
    """
    if cluster.usage is not None:
        return cluster.usage
    try:
        settings = GPUUsage(config=config)
    except TraitError as e:
        raise UsageConfigError(str(e)) from None
    spawner = _section(config, "GPUSpawner")
    budgets = spawner["usage_budgets"] if "usage_budgets" in spawner else None
    try:
        policy = parse_budgets(budgets, settings.time_zone)
    except BudgetConfigError as e:
        raise UsageConfigError(str(e)) from None
    if not settings.enabled:
        if policy:
            raise UsageConfigError(
                "GPUSpawner.usage_budgets: budgets count the usage records; they are off "
                "(c.GPUUsage.enabled = False)"
            )
        return None
    url = usage_db_url(settings, state_dir, hub_db_url)
    try:
        store = UsageStore(url)
    except UsageStoreError as e:
        raise UsageConfigError(f"GPUUsage.db_url: {e}") from None
    except Exception as e:  # a driver's error: a URL that does not open
        raise UsageConfigError(f"GPUUsage.db_url: {shown_url(url)}: {e}") from None

    def profile_of(alloc: Allocation) -> str:
        queue = cluster.queue
        entry = queue.wq.find(alloc.owner.user, alloc.owner.server) if queue else None
        return entry.profile if entry is not None else ""

    recorder = UsageRecorder(
        store, cluster.ledger, profile_of=profile_of, retention_days=settings.retention_days
    )
    recorder.prune()
    recorder.attach(cluster.ledger)
    cluster.after_restore.append(recorder.reconcile)
    if cluster.restored is not None:  # restored before: what it booked continues
        for alloc in cluster.ledger.allocations():
            recorder.on_book(alloc)
        recorder.reconcile()
    cluster.usage = recorder
    cluster.usage_budgets = policy
    if settings.sample_interval > 0:
        gpu = None
        if cluster.health_nodes():  # GPUs NVML on this host reads
            local = {g.uuid for n in cluster.health_nodes() for g in cluster.ledger.node(n).gpus}
            gpu = GPUSampler(recorder, lambda: local)
        cluster.after_restore.append(
            lambda _report: _start_readings(cluster, recorder, settings.sample_interval, gpu)
        )
        if cluster.restored is not None:
            _start_readings(cluster, recorder, settings.sample_interval, gpu)
    log.info(
        "usage records: %s (%d open, kept %d days)",
        shown_url(url),
        recorder.open_count(),
        settings.retention_days,
    )
    return recorder
