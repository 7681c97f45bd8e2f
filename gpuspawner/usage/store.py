"""The usage database (SQLAlchemy): one row per booked bundle of a server or a notebook job,
an interval from its booking to its release.

Default: SQLite, ``gpuspawner-usage.sqlite`` in the state folder (``GPUSpawner.state_dir``),
made empty with mode 0600 before SQLAlchemy opens it, write-ahead log as the jobs database
(:mod:`gpuspawner.dbutil`, which both stores use); ``c.GPUUsage.db_url`` names another
database. The schema is
alembic's: :func:`migrate` runs ``upgrade head`` of :mod:`gpuspawner.usage.migrations` when the
hub opens the store (version table ``gpuspawner_usage_alembic_version``); a revision this code
does not know is refused. ``gpuspawner usage`` opens it read-only (``migrate=False``): a
database not at this code's head is refused there rather than changed.

Every method opens its own short session: the ledger calls the recorder under its lock from
the event loop (and, in benchmarks, from threads); the pool hands each call a connection.

Writes go through one writer thread the store owns (:meth:`UsageStore.write_behind`), committed
in the order given: the recorder queues a booking's record there and goes on, so no SQLite
commit runs on the hub's event loop. The write methods (:meth:`UsageStore.open`, ``close``,
...) called from another thread queue theirs and wait for it. Every read first waits for the
writes queued before it (:meth:`UsageStore.wait_written`), so a read sees what was written
before it. :meth:`UsageStore.close_store` finishes the queued writes; so does the end of the
process (the thread is a ``concurrent.futures`` worker, which Python lets finish its queue at
exit): a hub that stops writes what its stopping servers booked.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Integer,
    String,
    Text,
    and_,
    case,
    delete,
    func,
    insert,
    literal,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..dbutil import (
    alembic_config,
    current_revision,
    open_engine,
    refuse_unknown_revision,
    shown_url,
    sqlite_wal,
)

__all__ = [
    "MIGRATIONS",
    "UsageRecord",
    "UsageStore",
    "UsageStoreError",
    "VERSION_TABLE",
    "migrate",
    "sqlite_pragmas",
]

log = logging.getLogger("gpuspawner")

T = TypeVar("T")

#: the alembic revisions (a package resource) and their version table
MIGRATIONS = "gpuspawner.usage:migrations"
VERSION_TABLE = "gpuspawner_usage_alembic_version"
#: each SQLite connection's pragmas: the jobs database's (write-ahead log)
sqlite_pragmas = sqlite_wal


class UsageStoreError(RuntimeError):
    """The usage database cannot be used (a newer schema, an unreadable file)."""


class Base(DeclarativeBase):
    pass


class UsageRecord(Base):
    """One booked bundle: a server's or a job's, from booking to release.

    Times are seconds since the epoch (UTC); JSON columns are text. ``ended`` is None while
    the bundle is booked. ``closed_at_restart``: the hub found, when it started again, that
    the bundle was no longer running; ``ended`` is then the time of that restart (an upper
    bound: it ended while the hub was down). ``gpu_milli`` is the milli-GPU held in all (1000
    = one whole GPU; a MIG instance counts its slices / 7), ``cpu_milli`` the cores held times
    1000.

    Used figures (None where no signal was read): ``gpu_util_percent`` the mean utilisation
    of its GPUs (percent, 0..100, the mean over the GPUs of each GPU's mean over the samples),
    ``gpu_mem_peak_bytes`` the sum over its GPUs of each GPU's peak memory used, ``gpu_used``
    per GPU ``{uuid: {"util_percent", "mem_peak_bytes", "samples"}}``, ``cpu_seconds`` CPU
    time its processes used (seconds).
    """

    __tablename__ = "gpuspawner_usage"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    allocation_id: Mapped[str] = mapped_column(String(64), index=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[str] = mapped_column(Text, default="[]")
    kind: Mapped[str] = mapped_column(String(8))
    name: Mapped[str] = mapped_column(String(255))
    profile: Mapped[str] = mapped_column(String(255), default="")
    node: Mapped[str] = mapped_column(String(255))
    gpu_uuids: Mapped[str] = mapped_column(Text, default="[]")
    gpu_model: Mapped[str] = mapped_column(String(255), default="")
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    disk_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    started: Mapped[float] = mapped_column(Float, index=True)
    ended: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    closed_at_restart: Mapped[bool] = mapped_column(Boolean, default=False)
    gpu_util_percent: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_mem_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    gpu_used: Mapped[str | None] = mapped_column(Text, nullable=True)
    cpu_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)

    @property
    def group_list(self) -> list[str]:
        return list(json.loads(self.groups or "[]"))

    @property
    def uuid_list(self) -> list[str]:
        return list(json.loads(self.gpu_uuids or "[]"))


#: the columns a caller may set when opening a record (:meth:`UsageStore.open`)
OPEN_FIELDS = (
    "allocation_id",
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
    "started",
)
#: the used figures :meth:`UsageStore.close` and :meth:`UsageStore.set_used` write
USED_FIELDS = ("gpu_util_percent", "gpu_mem_peak_bytes", "gpu_used", "cpu_seconds")


def migrate(engine: Engine, url: str = "", upgrade: bool = True) -> str:
    """Bring the usage database to the newest alembic revision (``upgrade head``, one
    transaction); with ``upgrade`` False only check that it is there. Returns the revision.

    Raises:
        UsageStoreError: a revision this gpuspawner does not know (a newer one), or, without
            ``upgrade``, a database not at the head (the hub upgrades it when it starts).
    """
    with engine.begin() as conn:
        cfg = alembic_config(conn, MIGRATIONS)
        script = ScriptDirectory.from_config(cfg)
        current = current_revision(conn, VERSION_TABLE)
        refuse_unknown_revision(script, current, shown_url(url), "usage database", UsageStoreError)
        if not upgrade:
            head = script.get_current_head()
            if current != head:
                raise UsageStoreError(
                    f"{shown_url(url)}: the usage database is at revision {current!r}, "
                    f"not {head!r}: start the hub of this gpuspawner once "
                    "(it upgrades the database)"
                )
            return str(current)
        command.upgrade(cfg, "head")
        return str(current_revision(conn, VERSION_TABLE))


class UsageStore:
    """The usage records of one hub, in one database.

    Args:
        url: SQLAlchemy URL (``sqlite:///PATH`` is made 0600, with its folder 0700).
        upgrade: run the migrations (the hub); False: refuse a database not at the head
            (``gpuspawner usage`` reads, it never changes the schema).

    Raises:
        UsageStoreError: the file cannot be made, or the schema is newer / not at the head.
    """

    def __init__(self, url: str, upgrade: bool = True) -> None:
        self.url = url
        self.engine, self.revision = open_engine(
            url,
            lambda engine: migrate(engine, url, upgrade=upgrade),
            "usage database",
            UsageStoreError,
            create=upgrade,
        )
        #: the writer thread (started at the first write)
        self._writer = ThreadPoolExecutor(max_workers=1,
                                          thread_name_prefix="gpuspawner-usage-writer")
        self._queue_lock = threading.Lock()
        #: the write queued last (done: every write queued before it is done too)
        self._last: Future[Any] | None = None
        self._closed = False
        self._on_writer = threading.local()

    # -- the writer thread -------------------------------------------------------------------
    def write_behind(self, fn: Callable[..., T], *args: Any, what: str = "") -> Future[T]:
        """Queue ``fn(*args)`` to the store's writer thread and return at once; the writes run
        one at a time in the order given. ``fn`` calls this store's write methods (they run
        in the writer thread directly). Returns a ``concurrent.futures.Future`` of its result.

        An error of ``fn`` is logged (``"<what> not written"``, with ``fn``'s name, its
        arguments and the traceback) and set on the future. After :meth:`close_store` (or
        while the process exits) ``fn`` runs in the calling thread instead.
        """
        return self._submit(fn, args, what or "a usage write", True)

    def _submit(self, fn: Callable[..., T], args: tuple[Any, ...], what: str,
                log_errors: bool) -> Future[T]:
        def run() -> T:
            outer = self.on_writer_thread()
            self._on_writer.active = True
            try:
                return fn(*args)
            except Exception:
                if log_errors:
                    log.exception("%s not written (%s%r)", what,
                                  getattr(fn, "__name__", "write"), args)
                raise
            finally:
                self._on_writer.active = outer

        with self._queue_lock:
            if not self._closed:
                try:
                    fut = self._writer.submit(run)
                except RuntimeError:  # the process is exiting: the queue is finished
                    pass
                else:
                    self._last = fut
                    return fut
        done: Future[T] = Future()
        try:
            done.set_result(run())
        except Exception as e:
            done.set_exception(e)
        return done

    def on_writer_thread(self) -> bool:
        """Whether the calling thread runs a queued write of this store now."""
        return bool(getattr(self._on_writer, "active", False))

    def wait_written(self, timeout: float | None = None) -> bool:
        """Wait until every write queued so far is committed (or failed); at once in the
        writer thread. Returns False when ``timeout`` (seconds) passed first."""
        last = self._last
        if last is None or last.done() or self.on_writer_thread():
            return True
        return not wait_futures([last], timeout).not_done

    def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the writer thread, after the writes queued before it; waits for
        it and returns its result (raises its error)."""
        if self.on_writer_thread():
            return fn(*args)
        return self._submit(fn, args, "", False).result()

    # -- writing -----------------------------------------------------------------------------
    def open(self, fields: Mapping[str, Any]) -> int:
        """Insert an open record (``ended`` None) with :data:`OPEN_FIELDS` (``groups`` and
        ``gpu_uuids`` as lists); returns its id. Runs in the writer thread (waits for it)."""
        return self._write(self._open, fields)

    def _open(self, fields: Mapping[str, Any]) -> int:
        values = {k: fields[k] for k in OPEN_FIELDS if k in fields}
        for k in ("groups", "gpu_uuids"):
            if k in values and not isinstance(values[k], str):
                values[k] = json.dumps(list(values[k]))
        with self.engine.begin() as c:  # (Core: no ORM object for a write on every booking)
            result = c.execute(
                insert(UsageRecord.__table__).values(closed_at_restart=False, **values)
            )
            return int(result.inserted_primary_key[0])

    def close(
        self,
        record_id: int,
        ended: float,
        *,
        closed_at_restart: bool = False,
        used: Mapping[str, Any] | None = None,
    ) -> None:
        """End an open record at ``ended`` (seconds since the epoch), with the used figures
        (:data:`USED_FIELDS`; ``gpu_used`` as a mapping) that are not None. Runs in the writer
        thread (waits for it)."""
        self._write(self._close, record_id, ended, closed_at_restart, used)

    def _close(self, record_id: int, ended: float, closed_at_restart: bool,
               used: Mapping[str, Any] | None) -> None:
        values: dict[str, Any] = {"ended": ended, "closed_at_restart": closed_at_restart}
        values.update(_used_values(used))
        with self.engine.begin() as c:
            c.execute(
                update(UsageRecord.__table__)
                .where(UsageRecord.__table__.c.id == record_id)
                .values(**values)
            )

    def set_used(self, record_id: int, used: Mapping[str, Any]) -> None:
        """Write the used figures so far of a record (open or not)."""
        values = _used_values(used)
        if values:
            self._write(self._update, record_id, values)

    def _update(self, record_id: int, values: Mapping[str, Any]) -> None:
        with Session(self.engine) as s, s.begin():
            s.execute(update(UsageRecord).where(UsageRecord.id == record_id).values(**values))

    def reopen(self, record_id: int) -> None:
        """Open again a record closed at a restart: its bundle is running after all (a node
        that did not answer when the hub started answers now)."""
        self._write(self._update, record_id, {"ended": None, "closed_at_restart": False})

    def set_devices(self, record_id: int, gpu_uuids: list[str], gpu_model: str) -> None:
        """The devices of an open record (an engine granted others than planned: Slurm)."""
        self._write(self._update, record_id,
                    {"gpu_uuids": json.dumps(gpu_uuids), "gpu_model": gpu_model})

    def prune(self, before: float) -> int:
        """Delete the records that ended before ``before`` (seconds since the epoch); open
        records are kept whatever their age. Returns how many were deleted."""
        return self._write(self._prune, before)

    def _prune(self, before: float) -> int:
        with Session(self.engine) as s, s.begin():
            result = s.execute(
                delete(UsageRecord).where(
                    UsageRecord.ended.is_not(None), UsageRecord.ended < before
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)

    # -- reading -----------------------------------------------------------------------------
    def get(self, record_id: int) -> UsageRecord | None:
        """The record ``record_id``, or None."""
        self.wait_written()
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(UsageRecord, record_id)

    def open_records(self) -> list[UsageRecord]:
        """The records not ended, oldest first."""
        self.wait_written()
        with Session(self.engine, expire_on_commit=False) as s:
            return list(
                s.scalars(
                    select(UsageRecord)
                    .where(UsageRecord.ended.is_(None))
                    .order_by(UsageRecord.started, UsageRecord.id)
                )
            )

    def closed_at_restart(self, allocation_id: str) -> UsageRecord | None:
        """The newest record of ``allocation_id`` that a restart closed, or None."""
        self.wait_written()
        with Session(self.engine, expire_on_commit=False) as s:
            return s.scalars(
                select(UsageRecord)
                .where(
                    UsageRecord.allocation_id == allocation_id,
                    UsageRecord.closed_at_restart.is_(True),
                )
                .order_by(UsageRecord.id.desc())
            ).first()

    def _range(
        self, q: Any, start: float | None, end: float | None, users: Iterable[str] | None
    ) -> list[Any]:
        """``q`` limited to the records meeting ``[start, end)``, as two index searches
        (ended after ``start``; still open) rather than one scan of every record that
        started before ``end`` (6x faster at 100,000 records over a year)."""
        if end is not None:
            q = q.where(UsageRecord.started < end)
        if users is not None:
            q = q.where(UsageRecord.user.in_(sorted(set(users))))
        if start is None:
            return [q]
        return [q.where(UsageRecord.ended > start), q.where(UsageRecord.ended.is_(None))]

    def records(
        self,
        start: float | None = None,
        end: float | None = None,
        users: Iterable[str] | None = None,
    ) -> list[UsageRecord]:
        """The records whose interval meets ``[start, end)`` (open ones count as running
        now), oldest first; only ``users``' when given."""
        out: list[UsageRecord] = []
        self.wait_written()
        with Session(self.engine, expire_on_commit=False) as s:
            for q in self._range(select(UsageRecord), start, end, users):
                out += s.scalars(q)
        return sorted(out, key=lambda r: (r.started, r.id))

    def rows(
        self,
        start: float | None = None,
        end: float | None = None,
        users: Iterable[str] | None = None,
    ) -> list[Any]:
        """:meth:`records` as plain rows (SQLAlchemy ``Row``: the same attribute names, the
        JSON columns as text), for reports: no ORM objects to build."""
        out: list[Any] = []
        self.wait_written()
        with self.engine.connect() as c:
            for q in self._range(select(UsageRecord.__table__), start, end, users):
                out += c.execute(q).fetchall()
        return sorted(out, key=lambda r: (r.started, r.id))

    #: the columns :meth:`aggregate` may group by
    AGGREGATE_KEYS = ("user", "groups", "profile", "node", "gpu_model")

    def aggregate(
        self,
        keys: Iterable[str],
        start: float,
        end: float,
        now: float,
        users: Iterable[str] | None = None,
        in_group: str | None = None,
    ) -> list[Any]:
        """Sums over the records meeting ``[start, end)``, each clipped to it (an open
        record runs until ``now``; with ``in_group``, only records whose ``groups`` text holds
        that name as a JSON string: a pre-filter in SQL, the caller checks the list), grouped
        by the columns ``keys`` (of
        :data:`AGGREGATE_KEYS`; ``groups`` is the JSON text of the record's groups), in the
        database: one row per key combination with ``intervals``, ``gpu_ms`` (milli-GPU x
        seconds), ``cpu_ms`` (milli-CPU x seconds), ``mem_bs`` (bytes x seconds), ``gpu_meas``
        and ``gpu_used`` (milli-GPU x seconds of the records with a utilisation figure, and
        that times the utilisation percent), ``cpu_meas`` (milli-CPU x seconds of those with
        CPU seconds), ``cpu_used`` (their CPU seconds, by the clipped share of each record)
        and ``peak`` (the largest ``gpu_mem_peak_bytes``). Portable SQL (CASE, no
        dialect's min/max of two values).

        Raises:
            ValueError: a key not in :data:`AGGREGATE_KEYS`.
        """
        keys = list(keys)
        bad = [k for k in keys if k not in self.AGGREGATE_KEYS]
        if bad:
            raise ValueError(f"cannot group by {bad[0]!r}")
        t = UsageRecord.__table__
        parts = self._range(select(t), start, end, users)
        if in_group is not None:  # '"name"' as JSON writes it, LIKE's wildcards escaped
            text = json.dumps(in_group)
            for ch in ("\\", "%", "_"):
                text = text.replace(ch, "\\" + ch)
            parts = [p.where(t.c.groups.like(f"%{text}%", escape="\\")) for p in parts]
        if now <= start:  # an open record ends now: none of them meets the range
            parts = parts[:1]
        u = union_all(*parts).subquery() if len(parts) > 1 else parts[0].subquery()
        c = u.c
        ended = case((c.ended.is_(None), literal(now)), else_=c.ended)
        lo = case((c.started > start, c.started), else_=literal(start))
        hi = case((ended < end, ended), else_=literal(end))
        secs = case((hi > lo, hi - lo), else_=literal(0.0))
        length = ended - c.started
        share = case((length > 0, secs / length), else_=literal(0.0))
        gpu_ok = and_(c.gpu_util_percent.is_not(None), c.gpu_milli > 0)
        cpu_ok = and_(c.cpu_seconds.is_not(None), c.cpu_milli > 0)
        q = select(
            *[c[k] for k in keys],
            func.count().label("intervals"),
            func.sum(c.gpu_milli * secs).label("gpu_ms"),
            func.sum(c.cpu_milli * secs).label("cpu_ms"),
            func.sum(c.memory_bytes * secs).label("mem_bs"),
            func.sum(case((gpu_ok, c.gpu_milli * secs), else_=literal(0.0))).label("gpu_meas"),
            func.sum(
                case((gpu_ok, c.gpu_milli * secs * c.gpu_util_percent), else_=literal(0.0))
            ).label("gpu_used"),
            func.sum(case((cpu_ok, c.cpu_milli * secs), else_=literal(0.0))).label("cpu_meas"),
            func.sum(case((cpu_ok, c.cpu_seconds * share), else_=literal(0.0))).label("cpu_used"),
            func.max(c.gpu_mem_peak_bytes).label("peak"),
        ).group_by(*[c[k] for k in keys])
        self.wait_written()
        with self.engine.connect() as conn:
            return list(conn.execute(q).fetchall())

    def oldest(self) -> float | None:
        """When the oldest record kept started (seconds since the epoch), or None."""
        self.wait_written()
        with Session(self.engine) as s:
            return s.scalar(select(UsageRecord.started).order_by(UsageRecord.started).limit(1))

    def close_store(self) -> None:
        """Finish the queued writes (waits for them), stop the writer thread and close the
        database's connections. Writes given later run in the calling thread."""
        with self._queue_lock:
            self._closed = True
        self._writer.shutdown(wait=not self.on_writer_thread())
        self.engine.dispose()


def _used_values(used: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in USED_FIELDS:
        v = (used or {}).get(k)
        if v is None:
            continue
        out[k] = json.dumps(v, sort_keys=True) if k == "gpu_used" and not isinstance(v, str) else v
    return out
