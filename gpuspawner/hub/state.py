"""Where gpuspawner keeps its state on the hub's machine: one folder,
``c.GPUSpawner.state_dir``.

Every state file of gpuspawner derives from it: the wait queue (``gpuspawner-queue.json``,
unless ``queue_file`` names another file) and the GPU drains (``gpuspawner-drains.json``,
unless ``gpu_drains_file`` does). Empty (the default) is the folder of the hub's SQLite
database (``JupyterHub.db_url``), else the hub's working directory: where these files were
before the setting existed. With ``state_dir`` set, moving ``db_url`` moves the database only.

When the hub starts (:func:`gpuspawner.hub.config_check.check_hub_config`,
:func:`prepare_state_dir`): a missing folder is made mode 0700; a ``state_dir`` the admin
named is tightened to 0700 when it is looser (the default folder, which may be the hub's
working directory, is left as it is); the state files there are made 0600 when they are
looser, and so is the hub's SQLite database when it lives in that folder. A database that does
not exist yet is created empty with mode 0600 before JupyterHub opens it (SQLite keeps the mode
of an existing file, and so do its ``-journal``/``-wal`` files; an empty file is an empty
database). The queue and drains files are written through ``tempfile.mkstemp`` (0600) and
``os.replace``, so every write keeps 0600.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

__all__ = ["STATE_DIR_MODE", "STATE_FILE_MODE", "prepare_state_dir", "resolve_state_dir",
           "sqlite_file", "state_file"]

#: mode of the state folder
STATE_DIR_MODE = 0o700
#: mode of the state files (and of the hub's SQLite database in the state folder)
STATE_FILE_MODE = 0o600
#: files SQLite keeps beside a database, with the database's mode
_SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")


def sqlite_file(db_url: str | None) -> str | None:
    """The absolute path of the SQLite database of ``db_url`` (``sqlite:///PATH``), or None
    (another database, an in-memory one, no URL)."""
    prefix = "sqlite:///"
    if not db_url or not db_url.startswith(prefix) or ":memory:" in db_url:
        return None
    path = db_url[len(prefix):].split("?", 1)[0]
    return os.path.abspath(path) if path else None


def resolve_state_dir(state_dir: str, db_url: str | None) -> str:
    """The state folder, absolute: ``state_dir`` when set, else the folder of the hub's
    SQLite database, else the working directory."""
    if state_dir:
        return os.path.abspath(os.path.expanduser(state_dir))
    db = sqlite_file(db_url)
    return os.path.dirname(db) if db else os.path.abspath(".")


def state_file(state_dir: str, db_url: str | None, name: str) -> str:
    """The absolute path of the state file ``name`` (:func:`resolve_state_dir`)."""
    return os.path.join(resolve_state_dir(state_dir, db_url), name)


def _tighten(path: str, mode: int) -> bool:
    """chmod ``path`` to ``mode`` when group or others have any access and this process owns
    it. Returns True when it changed the mode."""
    st = os.stat(path)
    if stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, mode)
        return True
    return False


def prepare_state_dir(state_dir: str, db_url: str | None, files: Iterable[str] = ()
                      ) -> list[str]:
    """Make the state folder and tighten it and its files (see the module's docstring).

    Args:
        state_dir: ``GPUSpawner.state_dir`` ("" = the default folder, not tightened when it
            exists).
        db_url: the hub's ``db_url``.
        files: gpuspawner's state files (queue, drains), wherever they are: made 0600 when
            they exist and are looser.

    Returns:
        what was changed, one line each (for the hub's log).

    Raises:
        OSError: the folder cannot be made, or a mode cannot be set.
    """
    folder = resolve_state_dir(state_dir, db_url)
    done: list[str] = []
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=STATE_DIR_MODE)
        os.chmod(folder, STATE_DIR_MODE)  # whatever the umask
        done.append(f"{folder}: made, mode 0700")
    elif state_dir and _tighten(folder, STATE_DIR_MODE):
        done.append(f"{folder}: mode 0700")
    paths = [f for f in files if f]
    db = sqlite_file(db_url)
    if db is not None and os.path.dirname(db) == folder:
        if not os.path.exists(db):
            os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, STATE_FILE_MODE))
            done.append(f"{db}: made empty, mode 0600")
        paths += [db, *(db + side for side in _SQLITE_SIDE_FILES)]
    for path in paths:
        if os.path.isfile(path) and _tighten(path, STATE_FILE_MODE):
            done.append(f"{path}: mode 0600")
    return done
