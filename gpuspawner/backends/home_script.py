"""The home folder's rules, standard library only, so that the same code runs in the hub
(a node on this machine) and on a node through a short-lived helper container
(``python3 home_script.py '<json>'``, :func:`main`). See
:func:`gpuspawner.backends.home.ensure_home` for the rules and the errors."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from typing import Any

#: keys of a failure's ``error``
OWNED, NOT_FOLDER, NO_PARENT = "owned-by-other", "not-a-folder", "parent-missing"


def _folder_of(path: str, uid: int) -> tuple[bool, int | None] | None:
    """(is a folder of ``uid``, its owner or None when not a folder); None when missing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return False, None
    return st.st_uid == uid, st.st_uid


def prepare(path: str, uid: int, gid: int, legacy: str | None = None,
            create: bool = True) -> dict[str, Any]:
    """Apply the home rules to ``path`` (blocking). Returns ``{"result": "kept" | "moved" |
    "made" | "absent"}`` or ``{"error": OWNED | NOT_FOLDER | NO_PARENT, "owner": uid or
    None, "parent": folder}``; raises only OSError (a folder that cannot be made or moved).
    """
    found = _folder_of(path, uid)
    # a folder of this process's euid that is not the user's: another spawn of the same user
    # made it and gives it away right after mkdir; wait for that (1 s at most)
    for _ in range(50):
        if found is None or found[0] or found[1] != os.geteuid():
            break
        time.sleep(0.02)
        found = _folder_of(path, uid)
    if found is not None:
        mine, owner = found
        if mine:
            return {"result": "kept"}
        return {"error": OWNED if owner is not None else NOT_FOLDER, "owner": owner}
    parent = os.path.dirname(os.path.normpath(path)) or "."
    if not os.path.isdir(parent):
        return {"error": NO_PARENT, "parent": parent}
    if legacy and legacy != path and _folder_of(legacy, uid) == (True, uid):
        try:
            os.rename(legacy, path)
        except OSError:
            if not os.path.lexists(path):
                raise
            return prepare(path, uid, gid, None, create)  # moved by a concurrent spawn
        return {"result": "moved"}
    if not create:
        return {"result": "absent"}
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:  # another server of the same user made it meanwhile
        return prepare(path, uid, gid, None, create)
    os.chown(path, uid, gid)
    return {"result": "made"}


def main(argv: list[str]) -> int:
    """``home_script.py '{"path": ..., "uid": ..., "gid": ..., "legacy": ...}'``: prints the
    answer of :func:`prepare` as JSON (an OSError as ``{"error": "os", "message": ...}``)."""
    try:
        answer = prepare(**json.loads(argv[1]))
    except OSError as e:
        answer = {"error": "os", "message": str(e)}
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
