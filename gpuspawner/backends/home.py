"""The user's home folder on the node that runs the server: made when missing (its parent,
the shared file system's folder, must be there), moved from its gpuspawner 0.x name, and never
handed from one uid to another (docs/security.md, "Names"). The rules are in
:mod:`~gpuspawner.backends.home_script` (standard library only): run here for a node on this
machine (:func:`ensure_home`), through a helper container on another Docker node
(:class:`~gpuspawner.backends.docker_backend.DockerBackend`), checked by the job itself on
Slurm (:func:`~gpuspawner.backends.slurm.job.job_script`).

Before any host path is handed to the engine (the home, the site's mounts, the server's
certificates), it is checked on the node that mounts it (:func:`check_mount_paths`): the
engine follows symbolic links as root when it makes a bind mount, so a link put in place of
a folder, or below a folder that users may write, would mount any folder of the node."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from . import home_script
from .base import LaunchFailed, LaunchRefused

__all__ = ["HomeOwnedByOther", "HomeParentMissing", "MountPathUnsafe", "check_mount_paths",
           "ensure_home", "raise_for"]

log = logging.getLogger(__name__)


class HomeOwnedByOther(LaunchRefused):
    """The home folder exists and belongs to another uid (or is not a plain folder): it is
    never given to the spawning user; an admin must look (HTTP 409).

    Attributes:
        path: the folder. owner: its uid (None when it is not a folder). uid: the spawning
            user's uid.
    """

    status_code = 409

    def __init__(self, path: str, owner: int | None, uid: int, user: str = "",
                 node: str = "") -> None:
        who = f"user {user!r} (uid {uid})" if user else f"uid {uid}"
        what = f"belongs to uid {owner}" if owner is not None else "is not a folder"
        where = f"node {node}: " if node else ""
        super().__init__(f"{where}home {path} {what}, not to {who}: refused; an admin must "
                         "check which user it belongs to")
        self.path, self.owner, self.uid = path, owner, uid


class HomeParentMissing(LaunchFailed):
    """The home's parent folder (the shared file system) is not on the node (HTTP 500):
    nothing is made there, so a server never gets an empty home on a node without it."""

    def __init__(self, node: str, parent: str, path: str) -> None:
        super().__init__(f"node {node or 'local'}: the folder {parent} of the home {path} does "
                         "not exist there: is the shared file system mounted on that node?")
        self.node, self.parent, self.path = node, parent, path


class MountPathUnsafe(LaunchRefused):
    """A host path the server would get (a mount's folder, the home's parent folder) could be
    redirected on the node: a symbolic link in it, a folder above it that is not root's (or a
    uid of ``c.DockerBackend.mount_owners``) or that others may write. The spawn is refused
    before the engine sees the path (HTTP 409: an admin must look; logged as an error).

    Attributes:
        path: the host path. reason: the component and what is wrong with it. node: the node.
    """

    status_code = 409

    def __init__(self, path: str, reason: str, node: str = "") -> None:
        why = ("; the admin must make it (the engine would make it as root)"
               if reason.endswith("does not exist") else
               "; the engine, as root, would follow a symbolic link there and mount another "
               "folder of the node. An admin must fix the folder (root's, writable by no "
               "user) or add its owner to c.DockerBackend.mount_owners")
        super().__init__(f"node {node or 'local'}: host path {path} refused: {reason}{why}")
        self.path, self.reason, self.node = path, reason, node


def check_mount_paths(paths: list[str], owners: list[int], *, strict: list[str] | None = None,
                      node: str = "") -> None:
    """Check host paths on this machine before the engine mounts them (blocking: a few
    ``lstat`` calls per path, :func:`~gpuspawner.backends.home_script.check_paths`): no
    component a symbolic link, every folder above the last component a folder of a uid in
    ``owners`` that no one else may write (sticky folders excepted); the last component of
    each of ``strict`` (the homes' folder) follows the same rules.

    Raises:
        MountPathUnsafe: the first path refused, naming it and its component.
    """
    raise_for(home_script.check_paths(paths, owners, strict=strict), "", 0, node=node)


def raise_for(answer: Mapping[str, Any], path: str, uid: int, *, user: str = "",
              node: str = "") -> str:
    """The result of :func:`~gpuspawner.backends.home_script.prepare` (``"kept"``,
    ``"moved"``, ``"made"``, ``"absent"``) or of ``check_paths`` (``"checked"``), or its
    error raised (and logged for the admin).

    Raises:
        HomeOwnedByOther, HomeParentMissing, MountPathUnsafe; LaunchFailed for an OSError on
        the node.
    """
    error = answer.get("error")
    if error is None:
        if answer.get("result") == "moved":
            log.warning("node %s: home of %s moved from its 0.x name to %s", node or "local",
                        user or uid, path)
        return str(answer.get("result"))
    err: LaunchFailed | LaunchRefused
    if error == home_script.UNSAFE:
        err = MountPathUnsafe(str(answer.get("path")), str(answer.get("reason")), node)
    elif error in (home_script.OWNED, home_script.NOT_FOLDER):
        err = HomeOwnedByOther(path, answer.get("owner"), uid, user, node)
    elif error == home_script.NO_PARENT:
        err = HomeParentMissing(node, str(answer.get("parent")), path)
    else:
        err = LaunchFailed(f"node {node or 'local'}: home {path}: {answer.get('message')}")
    log.error("%s", err)
    raise err


def ensure_home(path: str, uid: int, gid: int, *, legacy: str | None = None,
                user: str = "", create: bool = True, node: str = "") -> str:
    """The home rules applied on this machine (blocking):

    - exists, a folder of ``uid``: kept as it is;
    - exists otherwise (another uid's folder, a symbolic link, a file): refused;
    - missing, its parent missing too: refused (the shared file system is not here);
    - missing, and ``legacy`` (the 0.x name's folder, offered only when no other user can
      own it: :func:`~gpuspawner.hub.identity.legacy_home_owner`) is a folder of ``uid``:
      renamed to ``path``;
    - missing otherwise: made (mode 0700) and given to ``uid:gid`` when ``create``.

    Returns:
        "kept", "moved", "made" (or "absent" when not ``create``).
    Raises:
        HomeOwnedByOther: it is not ``uid``'s folder (logged as an error for the admin).
        HomeParentMissing: its parent folder does not exist.
        LaunchFailed: it cannot be made, moved or given away (an OSError).
    """
    try:
        answer = home_script.prepare(path, uid, gid, legacy, create)
    except OSError as e:
        answer = {"error": "os", "message": str(e)}
    return raise_for(answer, path, uid, user=user, node=node)
