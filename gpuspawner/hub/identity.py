"""Who a server runs as and what it is called: escaped object names, uid/gid from the
authenticator's ``auth_state``, the user's home on the shared file system. Pure functions."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from escapism import escape

#: longest escaped user or server name used in container, network and home directory names
#: (a path component may have 255 bytes; Docker names and DNS labels want far less)
MAX_NAME_CHARS = 48
_SAFE = set("abcdefghijklmnopqrstuvwxyz0123456789")


def safe_name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """``text`` escaped as DockerSpawner escapes names (lower case letters and digits kept,
    every other character as ``-XX`` hex), capped at ``limit`` characters: a longer result
    keeps its first ``limit - 13`` characters and appends ``-`` and 12 hex digits of the
    SHA-256 of ``text``, so distinct names stay distinct. Safe as one path component, a Docker
    object name, a Slurm job name and a DNS label."""
    out = escape(text, _SAFE, escape_char="-").lower()
    if len(out) <= limit:
        return out
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{out[:limit - 13]}-{digest}"


def object_name(user: str, server: str) -> str:
    """The name of a server's engine objects: ``jupyter-<user>`` or
    ``jupyter-<user>--<server>`` (DockerSpawner's ``name_template`` defaults; ``--`` cannot
    occur inside an escaped name), each part :func:`safe_name`."""
    name = f"jupyter-{safe_name(user)}"
    return f"{name}--{safe_name(server)}" if server else name


def ids_from_auth_state(auth_state: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(uid, gid) from ``uidNumber``/``gidNumber`` in ``auth_state`` (top level or under
    ``user_attributes``, as ldapauthenticator 2.x stores them; single values or one-element
    lists); gid defaults to the uid. None when there is no uid."""
    if not auth_state:
        return None
    attrs = dict(auth_state.get("user_attributes") or {})
    attrs.update(auth_state)
    uid, gid = attrs.get("uidNumber"), attrs.get("gidNumber")
    if isinstance(uid, list):
        uid = uid[0] if uid else None
    if isinstance(gid, list):
        gid = gid[0] if gid else None
    if uid is None:
        return None
    return int(uid), int(gid) if gid is not None else int(uid)


def home_path(template: str, escaped_user: str) -> str | None:
    """The user's home on the host from ``template`` (``{username}`` = the escaped name, which
    holds no ``/`` or ``..``), or None for an empty template.

    Raises:
        ValueError: the result is not strictly inside the template's base folder.
    """
    if not template:
        return None
    path = os.path.normpath(template.format(username=escaped_user, raw_username=escaped_user))
    base = os.path.normpath(template.split("{", 1)[0] or "/")
    if os.path.commonpath([path, base]) != base or path == base:
        raise ValueError(f"home path {path!r} escapes {base!r}")
    return path
