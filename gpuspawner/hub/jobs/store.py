"""The jobs database (SQLAlchemy): one row per job, and its schema version.

Default: SQLite, ``gpuspawner-jobs.sqlite`` in the state folder (``GPUSpawner.state_dir``),
made empty with mode 0600 before SQLAlchemy opens it; ``c.GPUJobs.db_url`` names another
database. The schema is made with ``create_all`` and its version is kept in the table
``gpuspawner_jobs_schema`` (:data:`SCHEMA_VERSION`): a database of a newer version is refused
at start, one of an older version is brought up by the steps in :data:`UPGRADES` (1 -> 2: the
column of ``at``).
No alembic: the schema is one table, and a version row with explicit steps is what it needs.

The hub process is the only writer; calls are short and synchronous on the event loop, as
JupyterHub's own database calls are.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable
from typing import Any

from sqlalchemy import Float, Integer, LargeBinary, String, Text, create_engine, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ...jobs.model import ACTIVE_STATES
from ..state import STATE_FILE_MODE, sqlite_file

__all__ = ["JobRow", "JobStore", "SCHEMA_VERSION", "StoreError"]

#: the schema this code writes
SCHEMA_VERSION = 2


def _add_not_before(session: Session) -> None:
    """1 -> 2: the one-off start time (``at``) of a job."""
    session.execute(text("ALTER TABLE gpuspawner_jobs ADD COLUMN not_before FLOAT"))


#: version -> the step that brings a database of that version to the next one
UPGRADES: dict[int, Callable[[Session], None]] = {1: _add_not_before}


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

    # -- JSON columns ----------------------------------------------------------------------
    def get_json(self, column: str, default: Any = None) -> Any:
        text = getattr(self, column)
        return json.loads(text) if text else default

    def set_json(self, column: str, value: Any) -> None:
        setattr(self, column, None if value is None else json.dumps(value, sort_keys=True))

    def set_state(self, state: str, message: str | None = None,
                  when: float | None = None) -> None:
        """Change the state, record it in the history with its time."""
        when = time.time() if when is None else when
        self.state = state
        if message is not None:
            self.message = message
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


def pack(value: Any) -> bytes:
    """JSON, compressed, for the notebook columns."""
    return zlib.compress(json.dumps(value).encode("utf-8"), 6)


class JobStore:
    """The jobs of one hub, in one database."""

    def __init__(self, url: str) -> None:
        path = sqlite_file(url)
        if path is not None and not os.path.exists(path):
            try:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                 STATE_FILE_MODE))
            except FileExistsError:
                pass
            except OSError as e:
                raise StoreError(f"{path}: cannot make the jobs database: {e}") from None
        self.url = url
        self.engine = create_engine(url, future=True)
        Base.metadata.create_all(self.engine)
        self.session = Session(self.engine, expire_on_commit=False)
        self._check_version()

    def _check_version(self) -> None:
        row = self.session.scalars(select(SchemaVersion)).first()
        if row is None:
            self.session.add(SchemaVersion(version=SCHEMA_VERSION))
            self.session.commit()
            return
        if row.version > SCHEMA_VERSION:
            raise StoreError(f"{self.url}: the jobs database has schema version {row.version}, "
                             f"newer than this gpuspawner's {SCHEMA_VERSION}")
        while row.version < SCHEMA_VERSION:
            UPGRADES[row.version](self.session)
            row.version += 1
            self.session.commit()

    def add(self, row: JobRow) -> JobRow:
        self.session.add(row)
        self.session.commit()
        return row

    def save(self) -> None:
        """Write what changed in the rows."""
        self.session.commit()

    def get(self, job_id: str) -> JobRow | None:
        return self.session.get(JobRow, job_id)

    def list(self, user: str | None = None) -> list[JobRow]:
        """Jobs, newest first; a user's only when ``user`` is given."""
        q = select(JobRow).order_by(JobRow.created.desc())
        if user is not None:
            q = q.where(JobRow.user == user)
        return list(self.session.scalars(q))

    def active(self, user: str | None = None) -> list[JobRow]:
        """Jobs that hold or wait for a place (:data:`ACTIVE_STATES`), oldest first."""
        q = select(JobRow).where(JobRow.state.in_(sorted(ACTIVE_STATES))).order_by(
            JobRow.created)
        if user is not None:
            q = q.where(JobRow.user == user)
        return list(self.session.scalars(q))

    def close(self) -> None:
        self.session.close()
        self.engine.dispose()
