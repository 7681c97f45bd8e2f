"""The jobs database (SQLAlchemy): one row per job, one per job definition, and the schema
version.

Default: SQLite, ``gpuspawner-jobs.sqlite`` in the state folder (``GPUSpawner.state_dir``),
made empty with mode 0600 before SQLAlchemy opens it, write-ahead log (both done by
:mod:`gpuspawner.dbutil`, which the usage database shares); ``c.GPUJobs.db_url`` names another
database. The schema is alembic's: :func:`migrate` runs ``upgrade head`` of the revisions in
:mod:`gpuspawner.hub.jobs.migrations` when the store opens (the version in the table
``gpuspawner_jobs_alembic_version``). A database of the version table that came before
alembic (``gpuspawner_jobs_schema``, versions 1..3) is stamped with the revision of its
version first, then upgraded; one of a newer version, or of a revision this code does not
know, is refused.

The hub process is the only writer; calls are short and synchronous on the event loop, as
JupyterHub's own database calls are.
"""

from __future__ import annotations

import json
import time
import zlib
from typing import Any

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ...dbutil import alembic_config, current_revision, open_engine, refuse_unknown_revision
from ...jobs.model import ACTIVE_STATES

__all__ = ["DefinitionRow", "JobRow", "JobRun", "JobStore", "MAX_MESSAGE_CHARS",
           "SCHEMA_VERSION", "StoreError", "clean_text", "migrate"]

#: the last schema version of the version table that came before alembic (kept in
#: ``gpuspawner_jobs_schema`` by the revisions up to 0003 for releases that read it)
SCHEMA_VERSION = 3
#: the alembic revisions (a package resource) and their version table
MIGRATIONS = "gpuspawner.hub.jobs:migrations"
VERSION_TABLE = "gpuspawner_jobs_alembic_version"
#: a version of the table before alembic -> the revision of the same schema
LEGACY_REVISIONS = {1: "0001", 2: "0002", 3: "0003"}


class StoreError(RuntimeError):
    """The database cannot be used (a newer schema, an unreadable file)."""


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "gpuspawner_jobs_schema"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class JobRow(Base):
    """One job. Times are seconds since the epoch; JSON columns are text."""

    __tablename__ = "gpuspawner_jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[str] = mapped_column(Text, default="[]")
    name: Mapped[str] = mapped_column(String(100))
    profile: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    time_limit: Mapped[int] = mapped_column(Integer)
    parameters: Mapped[str] = mapped_column(Text, default="{}")
    notebook: Mapped[bytes] = mapped_column(LargeBinary)
    created: Mapped[float] = mapped_column(Float)
    not_before: Mapped[float | None] = mapped_column(Float, nullable=True)
    started: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished: Mapped[float | None] = mapped_column(Float, nullable=True)
    history: Mapped[str] = mapped_column(Text, default="[]")
    node: Mapped[str] = mapped_column(String(255), default="")
    gpu_uuids: Mapped[str] = mapped_column(Text, default="[]")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    output_dir: Mapped[str] = mapped_column(Text, default="")
    allocation: Mapped[str | None] = mapped_column(Text, nullable=True)
    backend_state: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    output: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    definition_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    #: the image chosen, output formats, input folder (JSON; :meth:`JobRequest.options`)
    options: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")

    # -- JSON columns ----------------------------------------------------------------------
    def get_json(self, column: str, default: Any = None) -> Any:
        text = getattr(self, column)
        return json.loads(text) if text else default

    def set_json(self, column: str, value: Any) -> None:
        setattr(self, column, None if value is None else json.dumps(value, sort_keys=True))

    def set_state(self, state: str, message: str | None = None,
                  when: float | None = None) -> None:
        """Change the state, record it in the history with its time. The message is stored
        as :func:`clean_text` makes it (it may quote the job's own error)."""
        when = time.time() if when is None else when
        self.state = state
        if message is not None:
            self.message = clean_text(message)
        self.set_json("history", [*self.get_json("history", []), [state, when]])

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def notebook_dict(self) -> dict[str, Any]:
        return json.loads(zlib.decompress(self.notebook))

    @property
    def output_notebook(self) -> dict[str, Any] | None:
        return json.loads(zlib.decompress(self.output)) if self.output else None


#: the longest message a job keeps (characters); a longer one is cut, ending in "..."
MAX_MESSAGE_CHARS = 2000


def clean_text(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as the database can store it and a listing can carry it: what UTF-8 cannot
    encode (a lone surrogate, e.g. from a job's ``evalue``, which SQLite refuses) becomes
    "?", and past ``limit`` characters it is cut and ends in "..."."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def pack(value: Any) -> bytes:
    """JSON, compressed, for the notebook columns."""
    return zlib.compress(json.dumps(value).encode("utf-8"), 6)


class JobRun(Base):
    """The job runner's record of one job's attempts (one row per job, made at submission):
    its retry budget, the attempt it is on, what each earlier attempt did, and each attempt's
    log and the HTML export of its executed notebook. A table of its own, so the job's row
    stays as it is (no schema version step: ``create_all`` makes it in an older database;
    a job without a row here is on attempt 1 with no retries) and the big columns are read
    only when asked for.

    ``attempts`` is a JSON list of the ended attempts, oldest first: ``{"attempt", "state",
    "message", "node", "gpu_uuids", "started", "finished", "exit_code", "output_dir"}``;
    ``logs`` is compressed JSON ``{"<attempt>": text}``; ``html`` the compressed export of the
    last attempt that made one (JSON string).
    """

    __tablename__ = "gpuspawner_job_runs"
    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    max_retries: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    attempts: Mapped[str] = mapped_column(Text, default="[]")
    logs: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    html: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class DefinitionRow(Base):
    """One job definition: what each of its jobs runs (the snapshot, parameters, profile,
    time limit, name) and its schedule. Times are seconds since the epoch.

    ``last_tick`` is the latest tick handled (run, skipped or refused; at first the creation
    time, on resume the resume time): a tick at or before it never runs again, also after a
    restart. ``next_tick`` is the first tick after it (None while paused): the scheduler
    reads only definitions whose ``next_tick`` has come.
    """

    __tablename__ = "gpuspawner_job_definitions"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[str] = mapped_column(Text, default="[]")
    name: Mapped[str] = mapped_column(String(100))
    profile: Mapped[str] = mapped_column(String(255))
    time_limit: Mapped[int] = mapped_column(Integer)
    parameters: Mapped[str] = mapped_column(Text, default="{}")
    notebook: Mapped[bytes] = mapped_column(LargeBinary)
    schedule: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    concurrency_policy: Mapped[str] = mapped_column(String(16), default="Forbid")
    starting_deadline: Mapped[int | None] = mapped_column(Integer, nullable=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    created: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)
    last_tick: Mapped[float] = mapped_column(Float)
    next_tick: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    last_job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    #: as a job's ``options``: what each of its jobs gets
    options: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")

    def get_json(self, column: str, default: Any = None) -> Any:
        text = getattr(self, column)
        return json.loads(text) if text else default

    def set_json(self, column: str, value: Any) -> None:
        setattr(self, column, None if value is None else json.dumps(value, sort_keys=True))

    @property
    def notebook_dict(self) -> dict[str, Any]:
        return json.loads(zlib.decompress(self.notebook))


def migrate(engine: Engine, url: str = "") -> str:
    """Bring the jobs database to the newest alembic revision (``upgrade head``), in one
    transaction; a database of the version table before alembic is stamped with its
    version's revision first (:data:`LEGACY_REVISIONS`). Returns the revision it is at.

    Raises:
        StoreError: a schema newer than this gpuspawner's (a newer version in the old table,
            or an alembic revision it does not know).
    """
    with engine.begin() as conn:
        cfg = alembic_config(conn, MIGRATIONS)
        script = ScriptDirectory.from_config(cfg)
        current = current_revision(conn, VERSION_TABLE)
        legacy = None
        if inspect(conn).has_table("gpuspawner_jobs_schema"):
            legacy = conn.execute(text("SELECT max(version) FROM gpuspawner_jobs_schema")
                                  ).scalar()
        if legacy is not None and legacy > SCHEMA_VERSION:
            raise StoreError(f"{url}: the jobs database has schema version {legacy}, newer "
                             f"than this gpuspawner's {SCHEMA_VERSION}")
        refuse_unknown_revision(script, current, url, "jobs database", StoreError)
        if current is None and legacy is not None:
            command.stamp(cfg, LEGACY_REVISIONS[int(legacy)])
        command.upgrade(cfg, "head")
        return str(current_revision(conn, VERSION_TABLE))


class JobStore:
    """The jobs of one hub, in one database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine, self.revision = open_engine(
            url, lambda engine: migrate(engine, url), "jobs database", StoreError)
        self.session = Session(self.engine, expire_on_commit=False)

    def _commit(self) -> None:
        """Commit; when that fails, roll back before raising, so that the one session every
        user's requests share stays usable (else each later query raises
        ``PendingRollbackError`` until the hub restarts)."""
        try:
            self.session.commit()
        except BaseException:
            self.session.rollback()
            raise

    def add(self, row: JobRow) -> JobRow:
        self.session.add(row)
        self._commit()
        return row

    def save(self) -> None:
        """Write what changed in the rows (rolled back when the write fails)."""
        self._commit()

    def get(self, job_id: str) -> JobRow | None:
        return self.session.get(JobRow, job_id)

    def list(self, user: str | None = None,
             definition_id: str | None = None) -> list[JobRow]:
        """Jobs, newest first; a user's only when ``user`` is given, one definition's only
        when ``definition_id`` is."""
        q = select(JobRow).order_by(JobRow.created.desc())
        if user is not None:
            q = q.where(JobRow.user == user)
        if definition_id is not None:
            q = q.where(JobRow.definition_id == definition_id)
        return list(self.session.scalars(q))

    def prune(self, user: str, keep: int) -> list[str]:
        """Delete ``user``'s ended jobs (not in :data:`ACTIVE_STATES`) beyond the newest
        ``keep``, with their runner records (logs, HTML); returns the ids deleted, oldest
        last. A job's output in the user's home is not touched."""
        q = (select(JobRow.id)
             .where(JobRow.user == user, JobRow.state.not_in(sorted(ACTIVE_STATES)))
             .order_by(JobRow.created.desc()).offset(max(0, keep)))
        ids = list(self.session.scalars(q))
        if ids:
            for row in self.session.scalars(select(JobRow).where(JobRow.id.in_(ids))):
                self.session.delete(row)
            for run in self.session.scalars(select(JobRun).where(JobRun.job_id.in_(ids))):
                self.session.delete(run)
            self._commit()
        return ids

    def kept_sizes(self, user: str) -> list[tuple[str, int]]:
        """(id, bytes) of ``user``'s ended jobs, newest first: what each keeps in the database
        (its snapshot, executed notebook, logs and HTML export, as stored), counted by the
        database without reading the columns."""
        size = (func.coalesce(func.length(JobRow.notebook), 0)
                + func.coalesce(func.length(JobRow.output), 0)
                + func.coalesce(func.length(JobRun.logs), 0)
                + func.coalesce(func.length(JobRun.html), 0))
        q = (select(JobRow.id, size)
             .outerjoin(JobRun, JobRun.job_id == JobRow.id)
             .where(JobRow.user == user, JobRow.state.not_in(sorted(ACTIVE_STATES)))
             .order_by(JobRow.created.desc()))
        return [(str(i), int(n or 0)) for i, n in self.session.execute(q)]

    def prune_bytes(self, user: str, budget: int) -> list[str]:
        """Delete ``user``'s oldest ended jobs (with their runner records) until the ended
        jobs kept hold at most ``budget`` bytes (:meth:`kept_sizes`); the newest ended job is
        always kept. Returns the ids deleted. A job's output in the home is not touched."""
        total, ids = 0, []
        for n, (job_id, size) in enumerate(self.kept_sizes(user)):
            total += size
            if n > 0 and total > budget:
                ids.append(job_id)
        self._delete_jobs(ids)
        return ids

    def _delete_jobs(self, ids: list[str]) -> None:
        if not ids:
            return
        for start in range(0, len(ids), 500):  # bound the IN list
            chunk = ids[start:start + 500]
            for row in self.session.scalars(select(JobRow).where(JobRow.id.in_(chunk))):
                self.session.delete(row)
            for run in self.session.scalars(select(JobRun).where(JobRun.job_id.in_(chunk))):
                self.session.delete(run)
        self._commit()

    def active(self, user: str | None = None) -> list[JobRow]:
        """Jobs that hold or wait for a place (:data:`ACTIVE_STATES`), oldest first."""
        q = select(JobRow).where(JobRow.state.in_(sorted(ACTIVE_STATES))).order_by(
            JobRow.created)
        if user is not None:
            q = q.where(JobRow.user == user)
        return list(self.session.scalars(q))

    # -- job definitions -------------------------------------------------------------------
    def add_definition(self, row: DefinitionRow) -> DefinitionRow:
        self.session.add(row)
        self._commit()
        return row

    def get_definition(self, definition_id: str) -> DefinitionRow | None:
        return self.session.get(DefinitionRow, definition_id)

    def definitions(self, user: str | None = None) -> list[DefinitionRow]:
        """Definitions, newest first; a user's only when ``user`` is given."""
        q = select(DefinitionRow).order_by(DefinitionRow.created.desc())
        if user is not None:
            q = q.where(DefinitionRow.user == user)
        return list(self.session.scalars(q))

    def count_definitions(self, user: str) -> int:
        return int(self.session.scalar(select(func.count()).select_from(DefinitionRow).where(
            DefinitionRow.user == user)) or 0)

    def due_definitions(self, now: float) -> list[DefinitionRow]:
        """Definitions not paused whose next tick is at or before ``now``, earliest first."""
        q = select(DefinitionRow).where(DefinitionRow.paused.is_(False),
                                        DefinitionRow.next_tick.is_not(None),
                                        DefinitionRow.next_tick <= now).order_by(
            DefinitionRow.next_tick)
        return list(self.session.scalars(q))

    def next_tick(self) -> float | None:
        """The earliest next tick of the definitions not paused (None: none)."""
        return self.session.scalar(select(func.min(DefinitionRow.next_tick)).where(
            DefinitionRow.paused.is_(False)))

    def active_of(self, definition_id: str) -> list[JobRow]:
        """The active jobs a definition made, oldest first."""
        q = select(JobRow).where(JobRow.definition_id == definition_id,
                                 JobRow.state.in_(sorted(ACTIVE_STATES))).order_by(
            JobRow.created)
        return list(self.session.scalars(q))

    def delete_definition(self, row: DefinitionRow) -> None:
        """Remove a definition (its jobs stay, with their ``definition_id``)."""
        self.session.delete(row)
        self._commit()

    def close(self) -> None:
        self.session.close()
        self.engine.dispose()
