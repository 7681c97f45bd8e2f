"""Fair share over time: the wait queue's order weighs each user's *decayed past usage* of GPUs
from the usage records (docs/queue.md, "Fair share over time").

The figure, per user, is GPU-seconds with each second of use weighted by
``2 ** (-age / half_life)``, ``age`` how long ago that second was. Slurm's multifactor priority
plugin keeps the same figure (slurm.conf(5) ``PriorityDecayHalfLife``; "Fairshare Factor" in
https://slurm.schedmd.com/priority_multifactor.html): every ``PriorityCalcPeriod`` it multiplies
the usage accumulated so far by the decay factor of one period and adds the period's new usage.
Here the same sum is computed exactly from the records, as the limit of that recurrence for a
period going to zero: a record holding ``g`` GPUs from ``s`` to ``e`` (``e`` = now while it is
held) contributes ``g * h / ln 2 * (2 ** (-(now - e) / h) - 2 ** (-(now - s) / h))``, the integral
of ``g * 2 ** (-(now - t) / h)`` over ``[s, e]`` (``h`` the half-life). The queue turns the
figures into Slurm's classic fair-share factor ``F = 2 ** (-U / S)``
(https://slurm.schedmd.com/classic_fair_share.html;
:meth:`gpuspawner.placement.queue.WaitQueue.fairshare_factor`).

Off the event loop: :func:`decayed_gpu_seconds` runs one query in a worker thread
(:class:`FairShareFeed`), every ``refresh_s`` seconds (60) and soon after a record closes (at
most once per ``min_gap_s``), never per decision of the queue. Records that ended more than
:data:`HORIZON_HALF_LIVES` half-lives ago (their weight below 0.1 %) are not read.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import case, func, literal, select, union_all
from sqlalchemy.exc import DBAPIError

from ..hub.cluster import Cluster
from .recorder import ClosedInterval, UsageRecorder
from .store import UsageRecord, UsageStore

log = logging.getLogger("gpuspawner")

__all__ = ["FairShareFeed", "HORIZON_HALF_LIVES", "attach_fairshare", "decayed_gpu_seconds",
           "decayed_interval"]

#: records that ended more than this many half-lives ago are left out: their weight is below
#: 2**-10 (< 0.1 %); reading them would cost most of the time (3.6x at a year of records)
HORIZON_HALF_LIVES = 10


def decayed_interval(gpu_milli: float, started: float, ended: float, now: float,
                     half_life_s: float) -> float:
    """Decayed GPU-seconds of holding ``gpu_milli`` milli-GPU from ``started`` to ``ended``
    (seconds since the epoch; clipped to ``now``), each second weighted by
    ``2 ** (-(now - t) / half_life_s)`` (see the module's docstring). ``half_life_s <= 0``: no
    decay (plain GPU-seconds)."""
    end = min(ended, now)
    if end <= started or gpu_milli <= 0:
        return 0.0
    g = gpu_milli / 1000.0
    if half_life_s <= 0:
        return g * (end - started)
    k = math.log(2) / half_life_s
    return g / k * (math.exp(-k * (now - end)) - math.exp(-k * (now - started)))


def decayed_gpu_seconds(store: UsageStore, now: float, half_life_s: float,
                        *, in_database: bool = True) -> dict[str, float]:
    """User -> decayed GPU-seconds at ``now`` over the records kept (open ones run until
    ``now``), by :func:`decayed_interval`; users without GPU records are left out.

    One grouped query where the database has ``exp`` (PostgreSQL; SQLite built with its math
    functions, as Python's usually is), else the rows are summed here (``in_database=False``
    forces that). Blocking: call it in a worker thread.

    Raises:
        ValueError: ``half_life_s <= 0``.
    """
    if not half_life_s > 0:
        raise ValueError(f"half_life_s: must be > 0, got {half_life_s!r}")
    store.wait_written()  # (it reads the engine itself: the records queued before count)
    c = UsageRecord.__table__.c
    k = math.log(2) / half_life_s
    cutoff = now - HORIZON_HALF_LIVES * half_life_s
    gpu = (c.gpu_milli > 0) & (c.started < now)
    # two index searches (ended after the horizon; still open), as UsageStore._range: one
    # scan with "ended IS NULL OR ended > x" reads every record (2.6 s against 0.5 s in
    # SQLite at a million records over a year of 1,000 users)
    closed_end = case((c.ended < now, c.ended), else_=literal(now))
    parts = [((c.ended > cutoff) & (c.ended > c.started), closed_end),
             (c.ended.is_(None), literal(now))]
    if in_database:
        terms = [select(c.user.label("user"), (c.gpu_milli * (
            func.exp(-k * (now - end)) - func.exp(-k * (now - c.started)))).label("v"))
            .where(gpu, where) for where, end in parts]
        u = union_all(*terms).subquery()
        q = select(u.c.user, func.sum(u.c.v)).group_by(u.c.user)
        try:
            with store.engine.connect() as conn:
                rows = conn.execute(q).fetchall()
            return {u: float(v) / 1000.0 / k for u, v in rows if v and v > 0}
        except DBAPIError as e:  # no exp() in this database: sum here
            log.debug("fair share: exp() not in the database (%s); summing the rows", e)
    out: dict[str, float] = {}
    with store.engine.connect() as conn:
        for where, end in parts:
            for user, milli, started, stop in conn.execute(
                    select(c.user, c.gpu_milli, c.started, end).where(gpu, where)):
                v = decayed_interval(milli, started, stop, now, half_life_s)
                if v > 0:
                    out[user] = out.get(user, 0.0) + v
    return out


class FairShareFeed:
    """Feeds a wait queue each user's decayed past GPU usage (see the module's docstring).

    Args:
        store: the usage database.
        apply: called on the event loop with the new figures (user -> decayed GPU-seconds):
            the hub passes :meth:`gpuspawner.hub.spawn_queue.SpawnQueue.set_past_usage`.
        half_life_s: the half-life, seconds (> 0).
        refresh_s: seconds between two refreshes when no record closes.
        min_gap_s: least seconds between two refreshes (records closing in a burst cost one).
        clock: seconds since the epoch.
        needed: whether the figures matter now (the hub: someone waits in the queue); while
            it says False no refresh reads the database, and it is asked again every
            ``min_gap_s`` seconds, so figures come within that time of the first wait. None:
            always refresh.

    Raises:
        ValueError: a half-life, refresh or gap that is not > 0.
    """

    def __init__(self, store: UsageStore, apply: Callable[[dict[str, float]], None], *,
                 half_life_s: float, refresh_s: float = 60.0, min_gap_s: float = 5.0,
                 clock: Callable[[], float] = time.time,
                 needed: Callable[[], bool] | None = None) -> None:
        for name, v in (("half_life_s", half_life_s), ("refresh_s", refresh_s),
                        ("min_gap_s", min_gap_s)):
            if not v > 0:
                raise ValueError(f"{name}: must be > 0, got {v!r}")
        self.store = store
        self.apply = apply
        self.half_life_s = half_life_s
        self.refresh_s = refresh_s
        self.min_gap_s = min_gap_s
        self.clock = clock
        self.needed = needed
        #: refreshes done (figures applied)
        self.refreshes = 0
        #: the figures applied last
        self.last: dict[str, float] = {}
        self._due: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> dict[str, float]:
        """Compute the figures in a worker thread and apply them on this loop; returns them."""
        now = self.clock()
        past = await asyncio.to_thread(decayed_gpu_seconds, self.store, now, self.half_life_s)
        self.last = past
        self.apply(past)
        self.refreshes += 1
        return past

    def poke(self, _interval: ClosedInterval | None = None) -> None:
        """Ask for a refresh soon (a record closed: :attr:`UsageRecorder.on_close`). Safe from
        any thread; a no-op before :meth:`start`."""
        loop, due = self._loop, self._due
        if loop is None or due is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            due.set()
        else:
            loop.call_soon_threadsafe(due.set)

    def start(self) -> asyncio.Task[None]:
        """Run the refreshes on the running loop (once); returns the task."""
        if self._task is None or self._task.done():
            self._loop = asyncio.get_running_loop()
            self._due = asyncio.Event()
            self._task = self._loop.create_task(self._run(), name="gpuspawner-fairshare")
        return self._task

    def stop(self) -> None:
        """Cancel the refreshes."""
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        assert self._due is not None
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            if self.needed is not None and not self.needed():
                await asyncio.sleep(self.min_gap_s)  # nobody waits: the figures change nothing
                continue
            try:
                await self.refresh()
            except Exception:  # the queue keeps its last figures
                log.exception("fair share: the past usage could not be read")
            self._due.clear()
            try:
                await asyncio.wait_for(self._due.wait(), self.refresh_s)
            except asyncio.TimeoutError:
                pass
            gap = self.min_gap_s - (loop.time() - started)
            if gap > 0:
                await asyncio.sleep(gap)


def attach_fairshare(cluster: Cluster, recorder: UsageRecorder) -> FairShareFeed | None:
    """Feed the cluster's wait queue from ``recorder``'s store when its settings turn fair
    share over time on (``QueueSettings.fairshare_half_life_s > 0``,
    ``c.GPUSpawner.fairshare_half_life``): refreshed every minute and after each record
    closes while someone waits in the queue (within 5 s of the first wait), started on the
    hub's loop once the cluster's restore ran. Returns the feed (None when it is off or the
    cluster has no queue); once per cluster."""
    queue = cluster.queue
    if queue is None or not queue.settings.fairshare_half_life_s > 0:
        return None
    existing = getattr(cluster, "_fairshare", None)
    if existing is not None:
        return existing
    feed = FairShareFeed(recorder.store, queue.set_past_usage,
                         half_life_s=queue.settings.fairshare_half_life_s,
                         needed=lambda: len(queue.wq) > 0)
    recorder.on_close.append(feed.poke)
    cluster._fairshare = feed  # type: ignore[attr-defined]

    def start(_report: Any = None) -> None:
        try:
            feed.start()
        except RuntimeError:  # no running loop (a check by hand)
            pass

    cluster.after_restore.append(start)
    if cluster.restored is not None:
        start()
    return feed
