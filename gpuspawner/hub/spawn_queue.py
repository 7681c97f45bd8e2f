"""The hub side of the wait queue: spawns that fit the cluster's capacity but not what is free
now wait here, in the fair order of :class:`~gpuspawner.placement.queue.WaitQueue`, and start
when the ledger frees what they need.

One :class:`SpawnQueue` per hub process, on :attr:`Cluster.queue
<gpuspawner.hub.cluster.Cluster>`. A waiting spawn is a coroutine in
:meth:`SpawnQueue.acquire`, called from ``GPUSpawner.run_pre_spawn_hook``: JupyterHub runs the
pre-spawn hook before it starts ``Spawner.start`` under ``start_timeout``, so the wait has its
own limit (``c.GPUSpawner.queue_timeout``), not JupyterHub's.

What moves the queue: :meth:`SpawnQueue.kick` after every release (the spawner calls it), and a
tick every ``tick_s`` seconds for what changes elsewhere (a node back up, a GPU undrained, a
drop in a user's holdings that changes the DRF order).

Kept across a hub restart: every change is written to a JSON file (``queue_file``); a new hub
process loads it (entries hold their places, unclaimed), the ``gpuspawner`` service spawns each
entry's server again through the hub's REST API with the same ``user_options``
(:func:`gpuspawner.hub.service.app.resume_queue`), and each spawn claims its old place. A
restored entry no spawn claims within ``restore_grace_s`` is dropped.

A cancelled wait (the user's stop button: JupyterHub cancels the spawn, then polls and stops
the server) leaves its entry unclaimed and marked cancelled; the following ``poll``/``stop`` of
that server drops it (:meth:`SpawnQueue.forget`). At hub shutdown JupyterHub cancels every task
too: the entry then stays in the file and the next hub process restores it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..placement import (
    Allocation,
    Bundle,
    Owner,
    PlacementError,
    PlacementRefused,
    QuotaTable,
)
from ..placement.queue import QueueEntry, QueueOutcome, WaitQueue
from .drains import file_beside_db
from .metrics import queue_waited

log = logging.getLogger("gpuspawner")

QUEUE_FILE_NAME = "gpuspawner-queue.json"
VERSION = 1

__all__ = ["QueueFileError", "QueueSettings", "QueueTimeout", "SpawnQueue", "QUEUE_FILE_NAME",
           "default_queue_file"]


class QueueFileError(ValueError):
    """The queue file cannot be written, or its folder is missing (message names the path)."""


class QueueTimeout(PlacementError):
    """A spawn waited ``queue_timeout`` seconds without its bundle coming free."""

    reason = "queue_timeout"


@dataclass(frozen=True)
class QueueSettings:
    """The wait queue of a hub (from ``c.GPUSpawner.queue_*``).

    Attributes:
        file: JSON file the queue is kept in across restarts; "" = memory only.
        timeout_s: seconds a spawn may wait before it fails with a clear message.
        max_bypass: later entries that may start ahead of a blocked head on its nodes.
        group_weights: group -> DRF weight (> 0).
        restore_grace_s: seconds a restored entry keeps its place without a spawn claiming it.
        tick_s: seconds between two passes of the queue without a release.
        fairshare_half_life_s: half-life of past usage in the fair order (seconds; 0 = off:
            DRF on current holdings only); the feed is :mod:`gpuspawner.usage.fairshare`.
    """

    file: str = ""
    timeout_s: float = 4 * 3600.0
    max_bypass: int = 3
    group_weights: Mapping[str, float] = field(default_factory=dict)
    restore_grace_s: float = 300.0
    tick_s: float = 5.0
    fairshare_half_life_s: float = 7 * 86400.0


def default_queue_file(db_url: str | None) -> str:
    """``gpuspawner-queue.json`` beside the hub's SQLite database, else in the hub's working
    directory (:func:`~gpuspawner.hub.drains.file_beside_db`). An absolute path."""
    return file_beside_db(db_url, QUEUE_FILE_NAME)


class SpawnQueue:
    """Waiting spawns of one hub process over the cluster's ledger.

    Args:
        wait_queue: the fair queue (its ledger is the cluster's).
        settings: limits and the file.
        clock: seconds since the epoch.
    """

    #: the text :meth:`save` wrote last (None: nothing written yet by this process)
    _saved_text: str | None = None

    def __init__(self, wait_queue: WaitQueue, settings: QueueSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.wq = wait_queue
        self.settings = settings
        self._clock = clock
        self._waiters: dict[str, asyncio.Future[QueueOutcome]] = {}
        self._changed: asyncio.Event | None = None
        self._tick_task: asyncio.Task[None] | None = None
        #: entry ids whose wait was cancelled (see the module's docstring)
        self._cancelled: set[str] = set()
        #: bumped by every change (:meth:`_notify`); positions are computed once per value
        self._generation = 0
        self._positions: tuple[int, dict[str, int], int] | None = None
        #: awaited before each tick's pass while spawns wait (the cluster sets it: GPUs other
        #: jobs held may be free now, ``Cluster.refresh_held_elsewhere``)
        self.before_tick: Callable[[], Awaitable[None]] | None = None

        #: a note on a waiting entry beside its position (the elastic nodes' manager: "a node
        #: is being started for this, about 2 min"), None: none
        self.wait_note: Callable[[QueueEntry], str | None] | None = None

    def note(self, entry: QueueEntry) -> str | None:
        """The note on a waiting entry (:attr:`wait_note`), None when there is none or it
        fails (logged)."""
        if self.wait_note is None:
            return None
        try:
            return self.wait_note(entry)
        except Exception:  # a note never stops a wait
            log.exception("wait queue: the note on %s failed", entry.id)
            return None

    @property
    def ledger(self) -> Any:
        return self.wq.ledger

    # -- the file -------------------------------------------------------------------------
    def check_file(self) -> None:
        """At hub start: the file's folder exists and is writable.

        Raises:
            QueueFileError: the folder is missing or not writable.
        """
        path = self.settings.file
        if not path:
            return
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise QueueFileError(f"{path}: folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise QueueFileError(f"{path}: folder {folder} is not writable")

    def load(self) -> list[str]:
        """Restore the entries kept by an earlier hub process (unclaimed, holding their places).
        Returns the problems found (each bad record is skipped and named); an unreadable file
        is one problem and an empty queue (its content is kept aside as ``<file>.bad``)."""
        path = self.settings.file
        if not path or not os.path.exists(path):
            return []
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"version: must be {VERSION}")
            records = data.get("entries")
            if not isinstance(records, list):
                raise ValueError("entries: must be a list")
        except (OSError, ValueError) as e:
            os.replace(path, path + ".bad")
            return [f"{path}: {e} (kept as {path}.bad; the queue starts empty)"]
        problems = [f"{path}: {p}" for p in self.wq.restore(records)]
        if len(self.wq):
            log.info("wait queue: %d entries restored from %s", len(self.wq), path)
        return problems

    def save(self) -> None:
        """Write the queue atomically (no-op without a file), unless this process wrote the
        same content last (a spawn that books at once leaves the queue as it was: no file
        written per spawn). An unwritable file is logged, never raised: a spawn must not fail
        because the queue could not be kept."""
        path = self.settings.file
        if not path:
            return
        text = json.dumps({"version": VERSION, "entries": self.wq.to_list()}, indent=1,
                          sort_keys=True)
        if text == self._saved_text and os.path.exists(path):
            return
        folder = os.path.dirname(os.path.abspath(path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".gpuspawner-queue.", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
            self._saved_text = text
        except OSError as e:
            log.error("wait queue: cannot write %s: %s", path, e)

    # -- waiting --------------------------------------------------------------------------
    async def acquire(self, owner: Owner, bundle: Bundle, *, profile: str = "",
                      nodes: Iterable[str] = (), options: Mapping[str, Any] | None = None,
                      wait: bool = True,
                      on_wait: Callable[[QueueEntry, int, int], None] | None = None,
                      quotas: QuotaTable | None = None, priority: int = 0) -> Allocation:
        """Book ``bundle`` for ``owner`` now, or wait in the queue until it can be booked.

        Args:
            owner: user, server, groups.
            bundle: what to book.
            profile: the profile's slug (shown to people, metrics label).
            nodes: the profile's node selector (empty = any node).
            options: the spawn's ``user_options`` (kept to spawn it again after a restart).
            wait: False = refuse at once when it cannot start now ("fail now").
            on_wait: called with (entry, position, length) when the wait starts and whenever
                the queue changes.
            quotas: the request's own quota table (the spawner's ``quotas`` after JupyterHub's
                ``group_overrides``), None = the ledger's.
            priority: the request's queue priority (higher starts first, before fairness;
                :mod:`gpuspawner.placement.queue`).

        Returns:
            the allocation (booked in the ledger).

        Raises:
            QuotaExceeded: over a quota now, or when its turn came.
            PlacementRefused: it can never fit (reason ``never``, ``no_gpu_model``,
                ``too_large``, ``no_nodes``), or it cannot start now and ``wait`` is False.
            QueueTimeout: it waited ``timeout_s`` seconds.
            asyncio.CancelledError: the spawn was cancelled (the entry stays, unclaimed,
                until :meth:`forget`; an allocation granted meanwhile is released).
        """
        self._ensure_ticking()
        nodes = tuple(nodes)
        self.wq.check_admissible(bundle, owner, nodes or None, quotas)
        entry = self.wq.add(owner, bundle, profile=profile, nodes=nodes, options=options,
                            quotas=quotas, priority=priority)
        self._cancelled.discard(entry.id)
        fut: asyncio.Future[QueueOutcome] = asyncio.get_running_loop().create_future()
        self._waiters[entry.id] = fut
        self.kick()
        if fut.done():
            return self._result(fut.result())
        if not wait:
            refusal = self.refusal_now(entry)
            self._waiters.pop(entry.id, None)
            self.wq.remove(entry.id)
            self.kick()
            raise refusal
        self.save()
        deadline = asyncio.get_running_loop().time() + self.settings.timeout_s
        try:
            while not fut.done():
                if on_wait is not None:
                    pos, total = self.position(entry.id)
                    on_wait(entry, pos, total)
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise QueueTimeout(self._timeout_text(entry))
                changed = self._change_event()
                await asyncio.wait([fut, asyncio.ensure_future(changed.wait())],
                                   timeout=min(left, self.settings.tick_s),
                                   return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._abandon(entry, fut, keep=True)
            raise
        except BaseException:
            self._abandon(entry, fut, keep=False)
            raise
        return self._result(fut.result())

    def _result(self, outcome: QueueOutcome) -> Allocation:
        if outcome.error is not None:
            raise outcome.error
        assert outcome.allocation is not None
        queue_waited(outcome.entry.profile, max(0.0, self._clock() - outcome.entry.enqueued))
        return outcome.allocation

    def _abandon(self, entry: QueueEntry, fut: asyncio.Future[QueueOutcome],
                 keep: bool) -> None:
        """The wait ended without the spawn taking its allocation: release what was granted
        meanwhile; keep the entry unclaimed (cancelled) or drop it."""
        self._waiters.pop(entry.id, None)
        if fut.done() and not fut.cancelled() and fut.result().allocation is not None:
            self.ledger.release(fut.result().allocation.id, missing_ok=True)
            keep = False  # it had left the queue already
        if keep and self.wq.get(entry.id) is not None:
            entry.claimed, entry.restored_at = False, self._clock()
            self._cancelled.add(entry.id)
        else:
            self.wq.remove(entry.id)
        self.save()
        self.kick()

    def forget(self, user: str, server: str = "") -> bool:
        """Drop the entry of a server whose wait was cancelled (the server's poll or stop
        after the user's cancel). Returns True when one was dropped."""
        e = self.wq.find(user, server)
        if e is None or e.id not in self._cancelled:
            return False
        self._cancelled.discard(e.id)
        self.wq.remove(e.id)
        self.save()
        self.kick()
        return True

    def refusal_now(self, entry: QueueEntry) -> PlacementRefused:
        """Why ``entry`` cannot start now (for "fail now" spawns): the ledger's refusal, or
        the entries ahead of it when only the queue's order holds it back."""
        ahead = max(0, self.wq.position(entry.id)[0] - 1)  # not yet notified: compute
        try:
            alloc = self.ledger.reserve(entry.bundle, entry.owner, entry.nodes or None,
                                        quotas=entry.quotas, notify=False)  # a probe
        except PlacementRefused as e:
            return e
        except PlacementError as e:
            return PlacementRefused(getattr(e, "reason", "placement"), str(e))
        self.ledger.release(alloc.id, notify=False)
        return PlacementRefused("queued", f"{ahead} spawn{'s' if ahead != 1 else ''} wait "
                                          "ahead of you for these resources; ask to wait "
                                          "(queue) to keep your place")

    def _timeout_text(self, entry: QueueEntry) -> str:
        pos, total = self.wq.position(entry.id)
        return (f"waited {self.settings.timeout_s:g} s in the queue for {entry.bundle.describe()}"
                f" (position {pos} of {total}) without it coming free; try again later or "
                "choose another profile")

    # -- moving the queue -----------------------------------------------------------------
    def kick(self) -> list[QueueOutcome]:
        """Start what can start now (:meth:`WaitQueue.schedule`) and wake its spawns; every
        waiting spawn re-reads its position. Call after anything was released."""
        outcomes = self.wq.schedule()
        for o in outcomes:
            fut = self._waiters.pop(o.entry.id, None)
            if fut is not None and not fut.done():
                fut.set_result(o)
            elif o.allocation is not None:  # nobody waits for it any more
                self.ledger.release(o.allocation.id, missing_ok=True)
        if outcomes:
            self.save()
        self._notify()
        return outcomes

    def _change_event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def position(self, entry_id: str) -> tuple[int, int]:
        """(1-based position, length) of an entry, from one :meth:`WaitQueue.order` per
        change of the queue, however many spawns wait and ask (0 when not queued)."""
        if self._positions is None or self._positions[0] != self._generation:
            order = self.wq.order()
            self._positions = (self._generation, {e.id: i for i, e in enumerate(order, 1)},
                               len(order))
        _, where, n = self._positions
        return where.get(entry_id, 0), n

    def _notify(self) -> None:
        self._generation += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _ensure_ticking(self) -> None:
        if self._tick_task is None or self._tick_task.done():
            self._tick_task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        """Every ``tick_s``: drop restored entries nobody claimed, then :meth:`kick`."""
        while True:
            await asyncio.sleep(self.settings.tick_s)
            try:
                gone = self.wq.expire_unclaimed(self.settings.restore_grace_s)
                for e in gone:
                    self._cancelled.discard(e.id)
                    log.warning("wait queue: %s/%s left the queue: no spawn claimed its place "
                                "within %g s", e.owner.user, e.owner.server,
                                self.settings.restore_grace_s)
                if gone:
                    self.save()
                if self.before_tick is not None and len(self.wq):
                    await self.before_tick()
                self.kick()
            except Exception:  # the queue must keep moving
                log.exception("wait queue: tick failed")

    def start(self) -> None:
        """Start the tick on the running loop (the service does this at hub start)."""
        self._ensure_ticking()

    def set_past_usage(self, past: Mapping[str, float]) -> None:
        """Each user's decayed past usage for the fair order
        (:meth:`WaitQueue.set_past_usage`; the fair-share feed calls it on the loop); the
        waiting spawns re-read their positions when it changed.

        Raises:
            ValueError: a negative amount.
        """
        if dict(past) == self.wq.past_usage:
            return
        self.wq.set_past_usage(past)
        if len(self.wq):
            self._notify()

    # -- views ----------------------------------------------------------------------------
    def restored_entries(self) -> list[QueueEntry]:
        """Entries that wait for a spawn to claim them (restored, not cancelled)."""
        return [e for e in self.wq.order() if not e.claimed and e.id not in self._cancelled]

