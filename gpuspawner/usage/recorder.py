"""The ledger's observer that keeps one usage record per booked bundle
(:class:`UsageRecorder`).

Where the intervals come from: the :class:`~gpuspawner.placement.Ledger` calls its
``observers`` after each booking (``reserve``, ``restore``), each ``adopt`` (Slurm names the
devices it granted) and each ``release``, under its lock; every path of the hub that books or
frees a server's or a job's bundle goes through them. The recorder then

- on ``book``: continues the open record of that allocation (a server adopted after a hub
  restart keeps its interval), opens again a record a restart closed (its node answered late),
  or opens a new one, starting at ``Allocation.created`` (the booking's time, kept in the
  server's labels: an interval whose write was lost in a crash comes back at the next start);
- on ``adopt``: writes the devices granted;
- on ``release``: closes it now, with the used figures gathered so far.

After the hub's rebuild from the backend (:meth:`reconcile`, a hook of
:attr:`gpuspawner.hub.cluster.Cluster.after_restore`), the records left open by the previous
process whose allocation no longer runs are closed at that time with ``closed_at_restart``.

Used figures: :meth:`add_gpu_sample` (utilisation percent and memory used of one GPU, per
sample) and :meth:`set_cpu_seconds` feed each open interval's figures; they are written at the
release and by :meth:`flush_used`.

A failing database write is logged and never refuses or undoes a booking.

Writes: the records' writes are queued to the store's writer thread
(:meth:`~gpuspawner.usage.store.UsageStore.write_behind`) in the order of the ledger's events,
so a booking or a release on the hub's event loop commits nothing there; a new record's id is
a future until its insert ran (the later writes of that record, queued after it, read it
there). Reads (:attr:`UsageRecorder.open_ids`, the store's) wait for the writes queued before
them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Union

from ..placement import Allocation, Ledger, RestoreReport
from .store import UsageStore

log = logging.getLogger("gpuspawner")

__all__ = ["JOB_PREFIX", "ClosedInterval", "UsageRecorder", "record_fields"]

#: the owner server name of a notebook job's allocation (``job/<id>``,
#: :func:`gpuspawner.hub.identity.job_server`)
JOB_PREFIX = "job/"
#: seconds between two deletions of records past their retention
PRUNE_EVERY_S = 3600.0

#: a record's id: known, or the future of its insert queued to the store's writer thread
RecordRef = Union[int, "Future[int]"]


def _rid(ref: RecordRef) -> int:
    """The id of ``ref``; in the writer thread (the insert ran before: it was queued first).
    Raises the insert's error when it failed."""
    return ref if isinstance(ref, int) else ref.result()


def _rid_or_none(ref: RecordRef) -> int | None:
    """The id of ``ref`` (waits for its insert), None when the insert failed (logged)."""
    try:
        return _rid(ref)
    except Exception:  # noqa: BLE001 - logged by the store's writer
        return None


def _failed(ref: RecordRef) -> bool:
    """Whether ``ref`` is an insert that failed (logged when it did)."""
    return isinstance(ref, Future) and ref.done() and ref.exception() is not None


def _who(alloc: Allocation, event: str) -> str:
    return f"usage record of allocation {alloc.id} ({event} of {alloc.owner.user}/" \
        f"{alloc.owner.server})"


def record_fields(alloc: Allocation, ledger: Ledger | None, profile: str = "") -> dict[str, Any]:
    """The columns of a new record for ``alloc``: owner, groups at booking, kind (``job``
    for a ``job/<id>`` owner server, else ``server``), name (the server's name, "" = the
    default server; a job's id), profile, node, devices (GPU UUIDs, then MIG instances'), the
    GPU model (the models of its GPUs, "+"-joined when several; a MIG instance counts its
    parent's; "" without GPUs), milli-GPU, milli-CPU (cores x 1000), memory and disk bytes,
    start (``created``, seconds since the epoch)."""
    server = alloc.owner.server
    job = server.startswith(JOB_PREFIX)
    return {
        "allocation_id": alloc.id,
        "user": alloc.owner.user,
        "groups": sorted(alloc.owner.groups),
        "kind": "job" if job else "server",
        "name": server[len(JOB_PREFIX) :] if job else server,
        "profile": profile,
        "node": alloc.node,
        "gpu_uuids": list(alloc.device_ids),
        "gpu_model": gpu_model(alloc, ledger),
        "gpu_milli": int(alloc.total_gpu_milli),
        "cpu_milli": 1000 * len(alloc.cpuset),
        "memory_bytes": int(alloc.memory_bytes),
        "disk_bytes": int(alloc.disk_bytes),
        "started": float(alloc.created or time.time()),
    }


def gpu_model(alloc: Allocation, ledger: Ledger | None) -> str:
    """The model names of an allocation's GPUs (a MIG instance: its parent's), sorted and
    "+"-joined; "" without GPUs or when the node is unknown."""
    parents = [g.uuid for g in alloc.gpus] + [m.gpu for m in alloc.mig]
    if not parents or ledger is None:
        return ""
    try:
        node = ledger.node(alloc.node)
    except KeyError:
        return ""
    models = {g.uuid: g.model for g in node.gpus}
    return "+".join(sorted({models[u] for u in parents if u in models}))


@dataclass(frozen=True)
class ClosedInterval:
    """A usage record just closed, as :attr:`UsageRecorder.on_close` callbacks get it.

    Attributes:
        user: the owner.
        groups: the owner's groups at the booking.
        profile: the profile's slug ("" when unknown).
        gpu_milli: milli-GPU held (1000 = one GPU).
        cpu_milli: cores held x 1000.
        started, ended: seconds since the epoch (UTC).
        gpu_util_percent: mean utilisation of its GPUs (0..100), None when not measured.
        cpu_seconds: CPU seconds its processes used, None when not measured.
        closed_at_restart: closed when the hub started again (``ended`` an upper bound).
    """

    user: str
    groups: tuple[str, ...]
    profile: str
    gpu_milli: int
    cpu_milli: int
    started: float
    ended: float
    gpu_util_percent: float | None = None
    cpu_seconds: float | None = None
    closed_at_restart: bool = False

    @property
    def seconds(self) -> float:
        """The interval's length in seconds (>= 0)."""
        return max(0.0, self.ended - self.started)


class _Used:
    """What was used by one open interval: per GPU (sum of utilisation samples, their number,
    peak memory bytes), CPU seconds."""

    def __init__(self) -> None:
        self.gpu: dict[str, list[float]] = {}
        self.cpu_seconds: float | None = None

    @classmethod
    def from_record(cls, gpu_used: str | None, cpu_seconds: float | None) -> _Used:
        u = cls()
        for uuid, v in (json.loads(gpu_used) if gpu_used else {}).items():
            n = int(v.get("samples") or 0)
            u.gpu[uuid] = [
                float(v.get("util_percent") or 0.0) * n,
                n,
                float(v.get("mem_peak_bytes") or 0),
            ]
        u.cpu_seconds = cpu_seconds
        return u

    def figures(self) -> dict[str, Any]:
        """The record's used columns (None where nothing was read)."""
        per = {
            uuid: {
                "util_percent": round(s / n, 3) if n else None,
                "mem_peak_bytes": int(peak),
                "samples": int(n),
            }
            for uuid, (s, n, peak) in sorted(self.gpu.items())
        }
        means = [v["util_percent"] for v in per.values() if v["util_percent"] is not None]
        return {
            "gpu_used": per or None,
            "gpu_util_percent": round(sum(means) / len(means), 3) if means else None,
            "gpu_mem_peak_bytes": sum(v["mem_peak_bytes"] for v in per.values()) if per else None,
            "cpu_seconds": self.cpu_seconds,
        }


def _meta_of(rec: Any) -> tuple[str, tuple[str, ...], str, int, int, float]:
    """(user, groups, profile, gpu_milli, cpu_milli, started) of a stored record."""
    return (rec.user, tuple(rec.group_list), rec.profile or "", int(rec.gpu_milli or 0),
            int(rec.cpu_milli or 0), float(rec.started))


class UsageRecorder:
    """Keeps the usage records of one ledger (see the module's docstring).

    Args:
        store: the usage database.
        ledger: the hub's ledger (GPU models of nodes; :meth:`attach` observes it).
        profile_of: ``allocation -> profile slug`` at booking time ("" when unknown); the hub
            passes the wait queue's entry (:func:`gpuspawner.usage.hub.attach_usage`).
        retention_days: records that ended longer ago are deleted (:meth:`prune`).
        clock: seconds since the epoch.
    """

    def __init__(
        self,
        store: UsageStore,
        ledger: Ledger | None = None,
        *,
        profile_of: Callable[[Allocation], str] | None = None,
        retention_days: int = 400,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.profile_of = profile_of
        self.retention_days = retention_days
        self.clock = clock
        self._lock = threading.RLock()
        self.started_at = clock()
        #: allocation id -> id of its open record (or the future of its queued insert)
        self._open: dict[str, RecordRef] = {}
        #: allocation id -> its devices (for samples by GPU UUID)
        self._devices: dict[str, tuple[str, ...]] = {}
        self._used: dict[str, _Used] = {}
        #: open records the previous hub process left (closed by :meth:`reconcile` when
        #: their allocation is not booked again)
        self._inherited: set[str] = set()
        self._pruned_at = float("-inf")
        #: called with a :class:`ClosedInterval` after each record is closed (the hub's usage
        #: counters and fair-share feed; given, not imported: this package stays below
        #: :mod:`gpuspawner.hub.metrics`); an error of one is logged, never raised
        self.on_close: list[Callable[[ClosedInterval], None]] = []
        #: allocation id -> (user, groups, profile, gpu_milli, cpu_milli, started) of its open
        #: record, for :attr:`on_close`
        self._meta: dict[str, tuple[str, tuple[str, ...], str, int, int, float]] = {}
        for rec in store.open_records():
            self._open[rec.allocation_id] = rec.id
            self._meta[rec.allocation_id] = _meta_of(rec)
            self._devices[rec.allocation_id] = tuple(rec.uuid_list)
            self._used[rec.allocation_id] = _Used.from_record(rec.gpu_used, rec.cpu_seconds)
            self._inherited.add(rec.allocation_id)

    @property
    def open_ids(self) -> dict[str, int]:
        """Allocation id -> id of its open record. A read: waits for the queued inserts (an
        insert that failed is left out); on the event loop use :meth:`is_open` and
        :meth:`open_count`, which wait for nothing."""
        with self._lock:
            items = list(self._open.items())
        out = {}
        for aid, ref in items:
            rid = _rid_or_none(ref)
            if rid is not None:
                out[aid] = rid
        return out

    def is_open(self, allocation_id: str) -> bool:
        """Whether ``allocation_id`` has an open record (queued or written)."""
        with self._lock:
            return allocation_id in self._open

    def open_count(self) -> int:
        """How many records are open (queued or written)."""
        with self._lock:
            return len(self._open)

    # -- the ledger's observer -----------------------------------------------------------------
    def attach(self, ledger: Ledger) -> None:
        """Observe ``ledger`` (once) and record what it books from now on."""
        self.ledger = ledger
        if self.observe not in ledger.observers:
            ledger.observers.append(self.observe)

    def observe(self, event: str, alloc: Allocation) -> None:
        """The ledger's call: ``book``, ``adopt`` or ``release`` of ``alloc``. Errors are
        logged (a booking is never refused for its record)."""
        try:
            with self._lock:
                if event == "book":
                    self.on_book(alloc)
                elif event == "adopt":
                    self.on_adopt(alloc)
                elif event == "release":
                    self.on_release(alloc)
        except Exception:
            log.exception(
                "usage record of allocation %s (%s of %s/%s) not written",
                alloc.id,
                event,
                alloc.owner.user,
                alloc.owner.server,
            )

    def on_book(self, alloc: Allocation) -> RecordRef:
        """Continue, reopen or open the record of ``alloc``; returns its id (a new record's:
        the future of its insert, queued to the store's writer thread)."""
        with self._lock:
            found = self._open.get(alloc.id)
            if found is not None:
                self._inherited.discard(alloc.id)
                return found
            if (alloc.created or 0) < self.started_at:  # booked by an earlier process
                closed = self.store.closed_at_restart(alloc.id)  # (a read: at a restart)
                if closed is not None:
                    self.store.write_behind(self.store.reopen, closed.id,
                                            what=_who(alloc, "book"))
                    log.info(
                        "usage record %d of %s/%s opened again: its server runs",
                        closed.id,
                        alloc.owner.user,
                        alloc.owner.server,
                    )
                    self._track(
                        alloc, closed.id, _Used.from_record(closed.gpu_used, closed.cpu_seconds)
                    )
                    self._meta[alloc.id] = _meta_of(closed)
                    return closed.id
            profile = ""
            if self.profile_of is not None:
                try:
                    profile = self.profile_of(alloc) or ""
                except Exception:  # noqa: BLE001 - the profile is a label, never a refusal
                    profile = ""
            fields = record_fields(alloc, self.ledger, profile)
            rid = self.store.write_behind(self.store.open, fields, what=_who(alloc, "book"))
            self._track(alloc, rid, _Used())
            self._meta[alloc.id] = (
                fields["user"], tuple(fields["groups"]), profile, fields["gpu_milli"],
                fields["cpu_milli"], fields["started"])
            self._prune_if_due()
            return rid

    def _track(self, alloc: Allocation, rid: RecordRef, used: _Used) -> None:
        self._open[alloc.id] = rid
        self._devices[alloc.id] = tuple(alloc.device_ids)
        self._used[alloc.id] = used

    def on_adopt(self, alloc: Allocation) -> None:
        """The engine granted other devices than planned: the record names them."""
        with self._lock:
            rid = self._open.get(alloc.id)
            if rid is None:
                self.on_book(alloc)
                return
            self._devices[alloc.id] = tuple(alloc.device_ids)
            self.store.write_behind(self._set_devices, rid, list(alloc.device_ids),
                                    gpu_model(alloc, self.ledger), what=_who(alloc, "adopt"))

    # (the writes queued to the store's writer thread: the record's id is known there)
    def _set_devices(self, rid: RecordRef, gpu_uuids: list[str], model: str) -> None:
        self.store.set_devices(_rid(rid), gpu_uuids, model)

    def _close(self, rid: RecordRef, ended: float, closed_at_restart: bool,
               figures: dict[str, Any] | None) -> None:
        self.store.close(_rid(rid), ended, closed_at_restart=closed_at_restart, used=figures)

    def _set_used(self, rid: RecordRef, figures: dict[str, Any]) -> None:
        self.store.set_used(_rid(rid), figures)

    def on_release(self, alloc: Allocation, ended: float | None = None) -> RecordRef | None:
        """Close the record of ``alloc`` (now, or at ``ended``) with its used figures, queued
        to the store's writer thread; returns its id (None: it had none open)."""
        with self._lock:
            rid = self._open.pop(alloc.id, None)
            self._devices.pop(alloc.id, None)
            used = self._used.pop(alloc.id, None)
            self._inherited.discard(alloc.id)
            meta = self._meta.pop(alloc.id, None)
            if rid is None:
                return None
            t = self.clock() if ended is None else ended
            figures = used.figures() if used is not None else None
            self.store.write_behind(self._close, rid, t, False, figures,
                                    what=_who(alloc, "release"))
        self._closed(meta, t, figures, False)
        return rid

    def _closed(
        self,
        meta: tuple[str, tuple[str, ...], str, int, int, float] | None,
        ended: float,
        figures: dict[str, Any] | None,
        at_restart: bool,
    ) -> None:
        """Tell :attr:`on_close` about a record just closed (each error logged)."""
        if meta is None or not self.on_close:
            return
        user, groups, profile, gpu_milli, cpu_milli, started = meta
        interval = ClosedInterval(
            user, groups, profile, gpu_milli, cpu_milli, started, ended,
            (figures or {}).get("gpu_util_percent"), (figures or {}).get("cpu_seconds"),
            at_restart)
        for callback in list(self.on_close):
            try:
                callback(interval)
            except Exception:
                log.exception("usage: a callback on the closed record of %s failed", user)

    def open_intervals(self) -> list[ClosedInterval]:
        """Every open record as a :class:`ClosedInterval` ending now (no used figures): what
        the usage counters add to the closed ones at a scrape."""
        now = self.clock()
        with self._lock:
            metas = list(self._meta.values())
        return [ClosedInterval(u, g, p, gm, cm, s, max(s, now)) for u, g, p, gm, cm, s in metas]

    # -- after a hub restart -------------------------------------------------------------------
    def reconcile(self, booked: Iterable[str] | RestoreReport | None = None) -> list[int]:
        """Close, now and with ``closed_at_restart``, the records the previous hub process
        left open whose allocation is not booked in the ledger (``booked``: allocation ids;
        default: the ledger's). A server that is polled later and books its allocation again
        reopens its record (:meth:`on_book`). Returns the ids closed (their writes queued to
        the store's writer thread)."""
        with self._lock:
            if booked is None or isinstance(booked, RestoreReport):
                ids = {a.id for a in self.ledger.allocations()} if self.ledger else set()
            else:
                ids = set(booked)
            now = self.clock()
            closed = []
            for aid in sorted(self._inherited - ids):
                rid = self._open.pop(aid, None)
                self._devices.pop(aid, None)
                used = self._used.pop(aid, None)
                meta = self._meta.pop(aid, None)
                if rid is None:
                    continue
                figures = used.figures() if used is not None else None
                self.store.write_behind(self._close, rid, now, True, figures,
                                        what=f"usage record {rid} of allocation {aid} "
                                             "(closed at the restart)")
                if isinstance(rid, int):  # (always: a record the previous process left open)
                    closed.append(rid)
                self._closed(meta, now, figures, True)
            self._inherited &= ids
            if closed:
                log.warning(
                    "usage: %d record(s) closed at the restart: their servers or jobs "
                    "ended while the hub was down",
                    len(closed),
                )
            return closed

    # -- retention -----------------------------------------------------------------------------
    def prune(self) -> int:
        """Delete the records that ended more than ``retention_days`` ago; returns how many
        (waits for the delete, in the store's writer thread)."""
        self._pruned_at = self.clock()
        return self._prune_before(self._pruned_at - self.retention_days * 86400.0)

    def _prune_before(self, before: float) -> int:
        n = self.store.prune(before)
        if n:
            log.info("usage: %d record(s) older than %d days deleted", n, self.retention_days)
        return n

    def _prune_if_due(self) -> None:
        """Queue the deletion of old records when it is due (once an hour, at a booking)."""
        if self.clock() - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = self.clock()
            self.store.write_behind(self._prune_before,
                                    self._pruned_at - self.retention_days * 86400.0,
                                    what="usage: deletion of records past the retention")

    # -- used figures --------------------------------------------------------------------------
    def add_gpu_sample(
        self, uuid: str, util_percent: float | None, mem_used_bytes: int | None = None
    ) -> int:
        """One reading of GPU ``uuid`` (NVML ``nvmlDeviceGetUtilizationRates().gpu`` percent,
        ``nvmlDeviceGetMemoryInfo().used`` bytes) for every open interval that holds it (a
        shared GPU's holders each get the whole GPU's reading). Returns how many got it."""
        n = 0
        with self._lock:
            for aid, devices in self._devices.items():
                if uuid not in devices:
                    continue
                acc = self._used[aid].gpu.setdefault(uuid, [0.0, 0, 0.0])
                if util_percent is not None:
                    acc[0] += float(util_percent)
                    acc[1] += 1
                if mem_used_bytes is not None:
                    acc[2] = max(acc[2], float(mem_used_bytes))
                n += 1
        return n

    def set_cpu_seconds(self, allocation_id: str, seconds: float) -> None:
        """The CPU seconds an open interval's processes used so far (a cumulative counter:
        the last value wins)."""
        with self._lock:
            used = self._used.get(allocation_id)
            if used is not None:
                used.cpu_seconds = float(seconds)

    def held_uuids(self) -> set[str]:
        """Every device UUID an open interval holds."""
        with self._lock:
            return {u for devices in self._devices.values() for u in devices}

    def flush_used(self) -> int:
        """Write the used figures so far of every open interval (they survive a restart),
        in the store's writer thread; waits for the writes (call it in a worker thread).
        Returns how many were written (a failed one is logged)."""
        with self._lock:
            items = [(a, self._open[a], u.figures()) for a, u in self._used.items()
                     if a in self._open and not _failed(self._open[a])]
        futures = [self.store.write_behind(self._set_used, rid, figures,
                                           what=f"used figures of allocation {aid}")
                   for aid, rid, figures in items]
        wait_futures(futures)
        return sum(1 for f in futures if f.exception() is None)
