"""The hub's id: which hub made an engine object when several hubs share one Docker engine
(:data:`~gpuspawner.backends.spec.HUB_LABEL`). Random, made once and kept in the state folder
(``gpuspawner-hub-id``, mode 0600), so it survives restarts and a moved database; a second hub
with its own state folder gets its own id and never adopts, sweeps or replaces the first
hub's servers."""

from __future__ import annotations

import os
import re
import secrets

from .state import state_file

__all__ = ["HUB_ID_FILE", "HubIdError", "hub_id", "load_or_create"]

#: the file's name in the state folder
HUB_ID_FILE = "gpuspawner-hub-id"
_VALID = re.compile(r"[a-z0-9]{8,64}")


class HubIdError(ValueError):
    """The id file exists but does not hold an id (the message names the file)."""


def load_or_create(path: str) -> str:
    """The id in ``path`` (8-64 characters of ``[a-z0-9]``), made there first when missing
    (16 random hex digits, mode 0600, created exclusively: two starting hubs never write
    one file twice; a missing folder is made 0700).

    Raises:
        HubIdError: the file holds something else.
        OSError: it cannot be read or made.
    """
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
        if not _VALID.fullmatch(text):
            raise HubIdError(f"{path}: not a hub id ({text[:40]!r}); remove the file to make "
                             "a new one (servers running now are then another hub's)") from None
        return text
    new = secrets.token_hex(8)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(new + "\n")
    return new


def hub_id(state_dir: str, db_url: str | None) -> str:
    """The id of the hub whose ``GPUSpawner.state_dir`` and ``JupyterHub.db_url`` these are
    (:data:`HUB_ID_FILE` in the state folder, :func:`~gpuspawner.hub.state.state_file`),
    made there on first use; "" when ``db_url`` is None (no hub).

    Raises:
        HubIdError, OSError: as :func:`load_or_create`.
    """
    if db_url is None:
        return ""
    return load_or_create(state_file(state_dir, db_url, HUB_ID_FILE))
