"""Who a server runs as and what it is called: object names that cannot collide, uid/gid from
the authenticator's ``auth_state``, the user's home on the shared file system. Pure functions.

**Names are injective.** A user or server name becomes a *name part* (:func:`safe_name`):

- *kept*: its escape (:func:`escape_name`: ``[a-z0-9]`` kept, every other UTF-8 byte as ``-``
  and two lower-case hex digits, DockerSpawner's scheme with the byte always padded to two
  digits) when that has at most :data:`MAX_NAME_CHARS` characters;
- *shortened*: else the longest prefix of whole escape units (a character, or ``-xx``) that
  fits, then ``-z``, then :data:`HASH_CHARS` base32 characters (130 bits) of the SHA-256 of
  the whole raw name (KubeSpawner 7's ``safe_slug`` idea: a separator no kept name holds, a
  hash over the raw name).

In an escape every ``-`` is followed by two hex digits, so ``-z`` never occurs in a kept part
and occurs exactly once in a shortened one: kept parts are distinct because escaping is
injective (every byte has one two-digit form), shortened parts are distinct unless SHA-256
collides, and a kept part never equals a shortened one. No part contains ``--`` or ends with
``-``, so ``jupyter-<user>--<server>`` (:func:`object_name`) splits back at its first ``--``
after the prefix: distinct (user, server) pairs get distinct names. The argument, and the
earlier scheme's collisions, are in docs/security.md ("Names").
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections.abc import Mapping
from typing import Any

from escapism import escape

#: longest name part (user or server) in container, network, job and home folder names
#: (a path component may have 255 bytes; Docker names and DNS labels want far less)
MAX_NAME_CHARS = 48
#: base32 characters of the SHA-256 in a shortened part (26 x 5 = 130 bits)
HASH_CHARS = 26
#: the mark between a shortened part's prefix and its hash; never inside an escape
SHORT_MARK = "-z"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_UNIT = re.compile(r"-[0-9a-f]{2}|[a-z0-9]")
#: a gpuspawner 0.x shortened part: 35 characters, "-", 12 hex digits of a SHA-256
_LEGACY_SHORT = re.compile(r"[a-z0-9-]{35}-[0-9a-f]{12}")
_SHORT = re.compile(rf"(?:-[0-9a-f]{{2}}|[a-z0-9])*-z[a-z2-7]{{{HASH_CHARS}}}")


def escape_name(text: str) -> str:
    """``text`` with ``[a-z0-9]`` kept and every other character's UTF-8 bytes written as
    ``-xx`` (two lower-case hex digits each; lone surrogates as their surrogatepass bytes).

    Injective: unlike escapism's ``escape`` (which writes byte 0x01 before ``23`` and byte
    0x12 before ``3`` both as ``-123``), every byte has exactly one three-character form.
    """
    out: list[str] = []
    for ch in text:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"-{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def unescape_name(part: str) -> str | None:
    """The raw name of a *kept* part (the inverse of :func:`escape_name`), or None when
    ``part`` is not an escape of some text (a shortened part, or any other string)."""
    raw = bytearray()
    pos = 0
    while pos < len(part):
        m = _UNIT.match(part, pos)
        if m is None:
            return None
        unit = m.group()
        raw.extend(bytes([int(unit[1:], 16)]) if unit[0] == "-" else unit.encode())
        pos = m.end()
    try:
        text = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return text if escape_name(text) == part else None


def safe_name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """The name part of ``text`` (a user or server name): its :func:`escape_name` when that
    has at most ``limit`` characters and is not shaped like a gpuspawner 0.x shortened part
    (35 characters, ``-``, 12 hex digits: such a folder may be another user's 0.x home);
    else the longest prefix of whole escape units that fits, ``-z`` and :data:`HASH_CHARS`
    base32 characters of the SHA-256 of ``text`` (module docstring: why distinct texts never
    share a part). Safe as one path component, a Docker object name, a Slurm job name and a
    DNS label character set (``[a-z0-9-]``).

    Raises:
        ValueError: ``limit`` leaves no room for the hash.
    """
    room = limit - len(SHORT_MARK) - HASH_CHARS
    if room < 0:
        raise ValueError(f"limit {limit}: a shortened name needs {limit - room} characters")
    out = escape_name(text)
    if len(out) <= limit and not (limit == MAX_NAME_CHARS and _LEGACY_SHORT.fullmatch(out)):
        return out
    cut = 0
    for m in _UNIT.finditer(out):
        if m.end() > room:
            break
        cut = m.end()
    digest = base64.b32encode(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
    return f"{out[:cut]}{SHORT_MARK}{digest.decode().lower()[:HASH_CHARS]}"


def is_shortened(part: str) -> bool:
    """Whether ``part`` is a shortened name part (prefix, ``-z``, hash)."""
    return _SHORT.fullmatch(part) is not None


def object_name(user: str, server: str) -> str:
    """The name of a server's engine objects: ``jupyter-<user>`` or
    ``jupyter-<user>--<server>`` (DockerSpawner's ``name_template`` defaults), each part
    :func:`safe_name`; injective over (user, server) pairs (module docstring)."""
    name = f"jupyter-{safe_name(user)}"
    return f"{name}--{safe_name(server)}" if server else name


#: the owner's server name of a notebook job is ``job/<id>``: JupyterHub refuses a ``/`` in
#: a named server's name, so no user's server can ever be a job (placement.Owner.server)
JOB_SERVER_PREFIX = "job/"


def job_server(job_id: str) -> str:
    """The :class:`~gpuspawner.placement.Owner` server name of job ``job_id``."""
    return JOB_SERVER_PREFIX + job_id


def is_job_server(server: str) -> bool:
    """Whether an owner's server name is a notebook job's (:func:`job_server`), not a
    JupyterHub server's."""
    return server.startswith(JOB_SERVER_PREFIX)


def job_object_name(user: str, job_id: str) -> str:
    """The name of a notebook job's engine objects: ``job-<user>--<job id>``, each part
    :func:`safe_name`. Injective over (user, job id) pairs for the same reason as
    :func:`object_name`, and never a server's name: those start with ``jupyter-``."""
    return f"job-{safe_name(user)}--{safe_name(job_id)}"


# -- the names of gpuspawner 0.x, for finding what it made ---------------------------------------
def legacy_safe_name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """The name part gpuspawner 0.x gave ``text`` (escapism's escape, lower-cased; past
    ``limit`` the first ``limit - 13`` characters, ``-`` and 12 hex digits of the SHA-256).
    Not injective (docs/security.md, "Names"): used only to find homes made under it."""
    out = escape(text, _SAFE, escape_char="-").lower()
    if len(out) <= limit:
        return out
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{out[:limit - 13]}-{digest}"


def legacy_home_to_move(user: str) -> str | None:
    """The 0.x name part of ``user``'s home folder when it may be moved to today's name, else
    None (the same name, or a folder that someone else may own; the admin moves those).

    - a 0.x *shortened* part (or one shaped like it): moved only when no text escapes to it,
      i.e. no user's kept 0.x name could be that folder (:func:`unescape_name` is None);
    - a 0.x *kept* part that differs today (a byte below 0x10): moved only when it is no
      other user's part today (:func:`legacy_home_owner`).
    Whether the folder is the user's uid's is judged where it is
    (:func:`gpuspawner.backends.home.ensure_home`)."""
    old = legacy_safe_name(user)
    if old == safe_name(user):
        return None
    if _LEGACY_SHORT.fullmatch(old):
        return old if unescape_name(old) is None else None
    return old if legacy_home_owner(old) in (None, user) else None


def legacy_home_owner(part: str) -> str | None:
    """The user whose *current* name part is ``part``, when ``part`` (a 0.x home folder
    name) is also a kept part today, else None: such a folder may be that user's home."""
    raw = unescape_name(part)
    return raw if raw is not None and safe_name(raw) == part else None


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
