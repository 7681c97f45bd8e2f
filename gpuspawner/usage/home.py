"""A user's own GPU-hours and core-hours this month and their usage budgets on the hub's home
page: :class:`HomeFigures` is ``c.JupyterHub.template_vars["gpuspawner_usage"]`` (set by
:func:`gpuspawner.hub.wiring.wire_hub`) and ``home.html`` in
``gpuspawner/hub/templates/hub/`` (on ``c.JupyterHub.template_paths``) shows it.

JupyterHub calls a callable template variable with the page's user on its event loop for every
page it renders (``BaseHandler.template_namespace``), so the figures are never read there: a
call answers from a cache (:attr:`HomeFigures.ttl_s` seconds) and, when the user's figures are
missing or old, starts one read in a worker thread; the first visit shows none, a reload
after the read shows them. docs/usage.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from .budgets import budget_status, warning_text
from .report import parse_query, report_from_store

log = logging.getLogger("gpuspawner")

__all__ = ["HomeFigures", "own_figures"]


def own_figures(recorder: Any, policy: Any, user: str, groups: Iterable[str],
                now: float | None = None) -> dict[str, Any]:
    """The user's figures this month (UTC months, as ``api/usage``'s default):

    ``{"gpu_hours": float, "core_hours": float, "budgets": [{"name", "percent", "used",
    "limit", "unit", "renews_at", "warning": str ("" below 80 %), "exceeded": bool}]}``.

    ``recorder``: the hub's :class:`~gpuspawner.usage.recorder.UsageRecorder`; ``policy``: the
    cluster's budgets (:class:`~gpuspawner.usage.budgets.BudgetPolicy`) or None. Reads the
    usage database: call it off the event loop.
    """
    now = time.time() if now is None else now
    q = parse_query({"group_by": "user", "user": user}, now,
                    retention_days=recorder.retention_days)
    totals = report_from_store(recorder.store, q, now).get("totals") or {}
    budgets = []
    if policy:
        for b in budget_status(recorder.store, policy, user, list(groups), now):
            budgets.append({k: b[k] for k in ("name", "percent", "used", "limit", "unit",
                                             "renews_at", "exceeded")}
                           | {"warning": warning_text(b)})
    return {"gpu_hours": float(totals.get("gpu_hours") or 0.0),
            "core_hours": float(totals.get("core_hours") or 0.0), "budgets": budgets}


class HomeFigures:
    """``template_vars`` callable: ``figures(user)`` -> :func:`own_figures`'s dict from the
    cache, or None (no user, usage records off, not read yet).

    Args:
        cluster: returns the hub's cluster (``usage``: the recorder, ``usage_budgets``), or
            raises / returns None before the hub made it.
        ttl_s: seconds a user's figures are shown before they are read again.
        clock: monotonic seconds.
    """

    def __init__(self, cluster: Callable[[], Any], ttl_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._reading: set[str] = set()

    def __call__(self, user: Any) -> dict[str, Any] | None:
        name = getattr(user, "name", None)
        if not name:
            return None
        got = self._cache.get(name)
        if (got is None or self.clock() - got[0] > self.ttl_s) and name not in self._reading:
            self._start_read(name, [g.name for g in getattr(user, "groups", None) or []])
        return got[1] if got else None

    def _start_read(self, name: str, groups: list[str]) -> None:
        try:
            cluster = self.cluster()
            loop = asyncio.get_running_loop()
        except Exception:  # noqa: BLE001 - no hub cluster yet, or no loop: nothing to show
            return
        recorder = getattr(cluster, "usage", None)
        if recorder is None:
            return
        policy = getattr(cluster, "usage_budgets", None)
        self._reading.add(name)
        fut = loop.run_in_executor(None, own_figures, recorder, policy, name, groups)

        def done(f: asyncio.Future[dict[str, Any]]) -> None:
            self._reading.discard(name)
            try:
                self._cache[name] = (self.clock(), f.result())
            except Exception as e:  # noqa: BLE001 - the page renders without figures
                log.warning("usage: the home page's figures of %s: %s", name, e)

        fut.add_done_callback(done)
