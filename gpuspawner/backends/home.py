"""The user's home folder on the node: made when missing, moved from its gpuspawner 0.x name,
and never handed from one uid to another (docs/security.md, "Names"). Used by every backend
that makes homes (blocking calls: run them in a worker thread)."""

from __future__ import annotations

import logging
import os
import stat

from .base import LaunchRefused

__all__ = ["HomeOwnedByOther", "ensure_home"]

log = logging.getLogger(__name__)


class HomeOwnedByOther(LaunchRefused):
    """The home folder exists and belongs to another uid (or is not a plain folder): it is
    never given to the spawning user; an admin must look (HTTP 409).

    Attributes:
        path: the folder. owner: its uid (None when it is not a folder). uid: the spawning
            user's uid.
    """

    status_code = 409

    def __init__(self, path: str, owner: int | None, uid: int, user: str = "") -> None:
        who = f"user {user!r} (uid {uid})" if user else f"uid {uid}"
        what = (f"belongs to uid {owner}" if owner is not None
                else "is not a folder")
        super().__init__(f"home {path} {what}, not to {who}: refused; an admin must check "
                         "which user it belongs to")
        self.path, self.owner, self.uid = path, owner, uid


def ensure_home(path: str, uid: int, gid: int, *, legacy: str | None = None,
                user: str = "", create: bool = True) -> str:
    """Make sure the home ``path`` exists and belongs to ``uid`` (blocking).

    - exists, a folder of ``uid``: kept as it is;
    - exists otherwise (another uid's folder, a symbolic link, a file): refused;
    - missing, and ``legacy`` (the 0.x name's folder, offered only when no other user can
      own it: :func:`~gpuspawner.hub.identity.legacy_home_owner`) is a folder of ``uid``:
      renamed to ``path``;
    - missing otherwise: made (mode 0700, parents as needed) and given to ``uid:gid`` when
      ``create``; else left to the site (a cluster's homes).

    Returns:
        "kept", "moved" or "made" (or "absent" when not ``create``).
    Raises:
        HomeOwnedByOther: it (or the folder in its place) is not ``uid``'s folder; logged as
            an error for the admin.
        OSError: it cannot be made, moved or given away.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            return "kept"
        err = HomeOwnedByOther(path, st.st_uid if stat.S_ISDIR(st.st_mode) else None, uid,
                               user)
        log.error("%s", err)
        raise err
    if legacy and legacy != path:
        try:
            old = os.lstat(legacy)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode) and old.st_uid == uid:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            os.rename(legacy, path)
            log.warning("home of %s moved from its 0.x name %s to %s", user or uid, legacy,
                        path)
            return "moved"
    if not create:
        return "absent"
    os.makedirs(path, mode=0o700)
    os.chown(path, uid, gid)
    return "made"
