"""What the hub's two SQLAlchemy databases share: the jobs database
(:mod:`gpuspawner.hub.jobs.store`) and the usage database (:mod:`gpuspawner.usage.store`).

- :func:`open_engine`: a ``sqlite:///PATH`` file made empty with mode 0600 (its folder 0700)
  before SQLAlchemy opens it, the engine with :func:`sqlite_wal` on every SQLite connection,
  the store's migration run on it (the engine disposed of when that fails).
- :func:`alembic_config`, :func:`current_revision`, :func:`refuse_unknown_revision`: the
  alembic side of a store's ``migrate`` (revisions as a package resource, each store with its
  own version table).
- :func:`run_migrations`: the body of each store's alembic ``env.py``.

Each store keeps its own error class and words ("jobs database", "usage database").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from alembic import context
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError as AlembicError
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url

from .hub.state import STATE_FILE_MODE, sqlite_file

__all__ = [
    "WAL_SIZE_LIMIT",
    "alembic_config",
    "current_revision",
    "make_sqlite_file",
    "open_engine",
    "refuse_unknown_revision",
    "run_migrations",
    "shown_url",
    "sqlite_wal",
]

#: bytes SQLite's write-ahead log is cut back to after a checkpoint
WAL_SIZE_LIMIT = 4 * 2**20


def sqlite_wal(dbapi_connection: Any, record: Any) -> None:
    """Each SQLite connection (a SQLAlchemy ``connect`` event listener): write-ahead log,
    synchronous=NORMAL (https://www.sqlite.org/wal.html). A commit then appends to the log
    instead of rewriting a rollback journal with two fsyncs: a job a tick or a submission
    stores costs about half the CPU (benchmarks/jobs.py, 10,000 definitions: ~70 -> ~40 ms a
    tick on 2 CPUs), a usage record one append. A power loss may lose the last commits but
    never corrupts the file. The -wal/-shm files get the database file's mode (0600); the log
    is cut back to :data:`WAL_SIZE_LIMIT` bytes after each checkpoint (else it stays as large
    as the largest burst of writes: 19.5 MB after two jobs of large logs). Not on a network
    file system (SQLite's rule): use PostgreSQL there."""
    cur = dbapi_connection.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    finally:
        cur.close()


def shown_url(url: str) -> str:
    """``url`` as logs and messages show it: no password, no query."""
    try:
        return make_url(url).render_as_string(hide_password=True).split("?")[0]
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: its scheme only
        return url.split(":", 1)[0] + ":..."


def make_sqlite_file(path: str, what: str, error: type[Exception]) -> None:
    """Make ``path`` an empty file of mode 0600 (:data:`gpuspawner.hub.state.STATE_FILE_MODE`),
    its folder 0700 where missing, before SQLAlchemy opens it (SQLite would create it with
    the umask's mode); a file that appeared meanwhile is kept.

    Raises:
        error: ``"{path}: cannot make the {what}: {reason}"`` (an ``OSError``).
    """
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, STATE_FILE_MODE))
    except FileExistsError:
        pass
    except OSError as e:
        raise error(f"{path}: cannot make the {what}: {e}") from None


def open_engine(
    url: str,
    migrate: Callable[[Engine], str],
    what: str,
    error: type[Exception],
    create: bool = True,
) -> tuple[Engine, str]:
    """The engine of ``url`` with its schema brought up by ``migrate`` (which returns the
    revision it is at). A ``sqlite:///PATH`` that does not exist is made first
    (:func:`make_sqlite_file`) and every SQLite connection gets :func:`sqlite_wal`. Returns
    ``(engine, revision)``; the engine is disposed of when ``migrate`` raises.

    Args:
        what: the database in messages ("jobs database").
        error: the store's error class.
        create: False: a missing SQLite file is refused instead of made (a reader).

    Raises:
        error: ``"{path}: no {what} there"`` (``create`` False), the file cannot be made.
        Whatever ``migrate`` raises.
    """
    path = sqlite_file(url)
    if path is not None and not os.path.exists(path):
        if not create:
            raise error(f"{path}: no {what} there")
        make_sqlite_file(path, what, error)
    engine = create_engine(url, future=True)
    if path is not None:  # before the first connection, so every one has it
        event.listen(engine, "connect", sqlite_wal)
    try:
        return engine, migrate(engine)
    except BaseException:
        engine.dispose()
        raise


def alembic_config(conn: Any, migrations: str) -> Config:
    """An alembic configuration for the revisions at ``migrations`` (a package resource,
    ``"gpuspawner.usage:migrations"``) that runs on ``conn`` (``attributes["connection"]``,
    read by :func:`run_migrations`)."""
    cfg = Config()
    cfg.set_main_option("script_location", migrations)
    cfg.attributes["connection"] = conn
    return cfg


def current_revision(conn: Any, version_table: str) -> str | None:
    """The alembic revision the database of ``conn`` is at (None: no revision yet)."""
    return MigrationContext.configure(
        conn, opts={"version_table": version_table}
    ).get_current_revision()


def refuse_unknown_revision(
    script: ScriptDirectory, current: str | None, where: str, what: str, error: type[Exception]
) -> None:
    """Raise ``error`` when ``current`` is a revision ``script`` does not have (a newer
    gpuspawner's); ``where`` starts the message (the URL as shown)."""
    if current is None:
        return
    try:
        script.get_revision(current)
    except AlembicError:
        raise error(
            f"{where}: the {what} is at revision {current!r}, "
            "which this gpuspawner does not know (a newer one?)"
        ) from None


def run_migrations(version_table: str) -> None:
    """The body of a store's alembic ``env.py``: the migrations on the connection the store
    passes in ``config.attributes["connection"]`` (online only; :func:`alembic_config`), with
    ``version_table``, in batch mode (SQLite's ALTER TABLE)."""
    context.configure(
        connection=context.config.attributes["connection"],
        target_metadata=None,
        version_table=version_table,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()
