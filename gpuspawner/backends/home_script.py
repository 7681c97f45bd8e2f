"""The home folder's rules and the check of mounted host paths, standard library only, so that
the same code runs in the hub (a node on this machine) and on a node through a short-lived
helper container (``python3 home_script.py '<json>'``, :func:`main`). See
:func:`gpuspawner.backends.home.ensure_home` for the home's rules and
:func:`gpuspawner.backends.home.check_mount_paths` for the paths'."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from typing import Any

#: keys of a failure's ``error``
OWNED, NOT_FOLDER, NO_PARENT = "owned-by-other", "not-a-folder", "parent-missing"
#: key of a host path refused by :func:`check_paths`
UNSAFE = "unsafe-path"
#: where the helper container sees the node's root folder (read-only)
HOST_ROOT = "/gpuspawner-host"


def _unsafe_component(path: str, owners: frozenset[int], root: str, strict_last: bool,
                      seen: dict[str, os.stat_result]) -> str | None:
    """Why ``path`` (absolute, normalised, on the node) could be redirected, or None.

    Every component is looked at with ``lstat`` (links are never followed): none may be a
    symbolic link; each folder above the last component must be a folder owned by a uid of
    ``owners`` and writable by no one else (no group or other write bit, unless the folder
    is sticky and the next component is owned by one of ``owners``, as ``/tmp``); the last
    component must exist, and follows the folders' rules too when ``strict_last`` (then a
    missing component ends the walk without refusal: nothing is there to redirect). ``root``
    is prefixed to every path (the node's root folder as the helper container sees it).
    """
    parts = [p for p in path.split("/") if p]
    sticky_open = False  # the folder above is writable by others but sticky
    chain = ["/"] + ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]
    for i, current in enumerate(chain):
        last = i == len(chain) - 1
        st = seen.get(current)
        if st is None:
            try:
                st = os.lstat(root + current if root else current)
            except FileNotFoundError:
                # a strict folder (the homes'): nothing there to redirect; the home's rules
                # say which folder is missing
                return None if strict_last else f"{current} does not exist"
            except OSError as e:
                return f"{current} cannot be looked at ({e.strerror})"
            seen[current] = st
        if stat.S_ISLNK(st.st_mode):
            return f"{current} is a symbolic link"
        if sticky_open and st.st_uid not in owners:
            return (f"{current} belongs to uid {st.st_uid} in a folder that others may write "
                    "(sticky)")
        if last and not strict_last:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return f"{current} is not a folder"
        if st.st_uid not in owners:
            return (f"{current} belongs to uid {st.st_uid}, not to root or a uid of "
                    "mount_owners")
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and not st.st_mode & stat.S_ISVTX:
            return (f"{current} may be written by its group or by others (mode "
                    f"{stat.S_IMODE(st.st_mode):o}): whoever can write it can replace what "
                    "is below it")
        sticky_open = bool(writable)
    return None


def check_paths(paths: list[str], owners: list[int], root: str = "",
                strict: list[str] | None = None) -> dict[str, Any]:
    """Check host paths before the engine is handed them (blocking; a few ``lstat`` calls
    per path, shared prefixes looked at once). ``paths``: mount sources (their last
    component may belong to anyone: a user's own scratch folder); ``strict``: folders whose
    last component follows the folders' rules too (the parent of a home). Rules:
    :func:`_unsafe_component`.

    Returns:
        ``{"result": "checked"}``, or ``{"error": UNSAFE, "path": the path, "reason": why}``
        for the first path refused.
    """
    allowed = frozenset(owners)
    seen: dict[str, os.stat_result] = {}
    for path, strict_last in [*((p, True) for p in strict or []), *((p, False) for p in paths)]:
        if not path.startswith("/"):
            return {"error": UNSAFE, "path": path, "reason": "not an absolute path"}
        reason = _unsafe_component(os.path.normpath(path), allowed, root, strict_last, seen)
        if reason is not None:
            return {"error": UNSAFE, "path": path, "reason": reason}
    return {"result": "checked"}


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
    """``home_script.py '{"path": ..., "uid": ..., "gid": ..., "legacy": ..., "check": {...}}'``:
    prints the answer of :func:`check_paths` (``check``: its arguments, run first) when it
    refuses, else that of :func:`prepare` (no ``path``: ``{"result": "checked"}``) as JSON
    (an OSError as ``{"error": "os", "message": ...}``)."""
    try:
        args = json.loads(argv[1])
        check = args.pop("check", None)
        answer = check_paths(**check) if check else {"result": "checked"}
        if "error" not in answer and args.get("path"):
            answer = prepare(**args)
    except OSError as e:
        answer = {"error": "os", "message": str(e)}
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
