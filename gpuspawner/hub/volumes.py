"""The site's data beside the home: shared datasets and group project folders mounted into
servers and notebook jobs.

Admins declare mounts in DockerSpawner's ``volumes`` shape (dockerspawner ``DockerSpawner.volumes``:
``{host_path: container_path}`` or ``{host_path: {"bind": container_path, "mode": "ro"|"rw"}}``),
in three places that add up:

- ``c.GPUSpawner.volumes``: every server and job;
- a profile's ``volumes``: servers and jobs of that profile;
- ``c.GPUSpawner.group_volumes``: ``{group: volumes}``, only for members of that JupyterHub
  group (a project folder only its members see).

Templates: ``{username}`` is the escaped user name (the same part as the home's,
:func:`~gpuspawner.hub.identity.safe_name`); ``{group}`` (in ``group_volumes`` only) is the
group's name. A mode left out is ``rw``, as in DockerSpawner; ``ro`` is enforced by the engine
(a read-only bind mount: writes fail with EROFS).

:func:`check_volume_settings` runs at hub start (:mod:`gpuspawner.hub.config_check`) and
refuses, naming the setting and the path: a relative or ``..`` path, a mount over ``/``,
``/proc``, ``/sys``, ``/dev`` or over the home, a host path that is the Docker socket, the
hub's state folder (or holds it), inside any home (the user's own too: a link the user puts
there would be followed by the engine on the host) or holding every home, an
untemplated host folder that does not exist on the hub's host, two mounts at one place, a
mount whose host folder lies inside (or, for some user's or group's name, is) a folder that
users can write through another setting (a ``rw`` mount or the homes, :func:`nested_in_writable`:
a user could put a symbolic link in its place, which the engine follows as root), and any
mount on the Slurm backend (its servers are processes on the node, not containers: there
is no bind mount to make, and the node's file systems are visible as they are).

The same paths are checked again on the node at every spawn and job start, before the engine
is handed them (:func:`gpuspawner.backends.home.check_mount_paths`).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..backends.spec import Mount

__all__ = ["VolumeConfigError", "VolumeSpec", "check_volume_settings", "fold_read_only_volumes",
           "mounts_for",
           "nested_in_writable", "parse_volumes", "site_volumes"]

#: container paths no mount may cover (the kernel's file systems)
FORBIDDEN_TARGETS = ("/proc", "/sys", "/dev")
_FIELD = re.compile(r"\{([^}]*)\}")


class VolumeConfigError(ValueError):
    """A mount setting the hub refuses; the message names the setting (``GPUSpawner.volumes``,
    ``GPUSpawner.group_volumes[physics]``, ``GPUSpawner.profiles[2] (a100).volumes``) and the
    host path."""


@dataclass(frozen=True)
class VolumeSpec:
    """One declared mount, templates not yet filled.

    Attributes:
        host_path: the folder on the node (absolute; may hold ``{username}``, ``{group}``).
        bind: where it appears in the server (absolute; same templates).
        read_only: mounted read-only (``mode: ro``).
        group: the JupyterHub group whose members get it ("" = everyone it applies to).
    """

    host_path: str
    bind: str
    read_only: bool
    group: str = ""


def _fields(text: str) -> set[str]:
    return set(_FIELD.findall(text))


def _check_path(path: str, what: str, where: str, allowed: set[str]) -> None:
    unknown = _fields(path) - allowed
    if unknown:
        raise VolumeConfigError(f"{where}: {what} {path!r}: unknown template "
                                f"{{{sorted(unknown)[0]}}}; allowed: "
                                f"{', '.join('{' + a + '}' for a in sorted(allowed)) or 'none'}")
    if not path.startswith("/"):
        raise VolumeConfigError(f"{where}: {what} {path!r} must be an absolute path")
    if ".." in path.split("/") or "\0" in path:
        raise VolumeConfigError(f"{where}: {what} {path!r} must not contain '..'")


def parse_volumes(value: Any, where: str, group: str = "") -> list[VolumeSpec]:
    """Read one ``volumes`` value (DockerSpawner's shape).

    Args:
        value: ``{host_path: container_path}`` or ``{host_path: {"bind": path, "mode": "ro"|
            "rw"}}``; None or {} = no mounts.
        where: the setting's name for messages.
        group: the group of ``group_volumes`` entries ("" elsewhere): ``{group}`` is allowed
            only there.

    Raises:
        VolumeConfigError: not a mapping, a value of another shape, a bad mode, a relative,
            ``..`` or unknown-template path.
    """
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise VolumeConfigError(f"{where}: must be a dict {{host_path: {{\"bind\": path, "
                                f"\"mode\": \"ro\"|\"rw\"}}}}, got {type(value).__name__}")
    allowed = {"username", "group"} if group else {"username"}
    if group and ("/" in group or group in (".", "..") or "\0" in group):
        raise VolumeConfigError(f"{where}: a group name with '/' or '..' cannot be a folder "
                                f"name ({{group}}), got {group!r}")
    out = []
    for host, target in value.items():
        if not isinstance(host, str) or not host:
            raise VolumeConfigError(f"{where}: a host path must be a non-empty string, got "
                                    f"{host!r}")
        at = f"{where}[{host!r}]"
        mode = "rw"
        if isinstance(target, str):
            bind = target
        elif isinstance(target, Mapping):
            extra = set(target) - {"bind", "mode"}
            if extra:
                raise VolumeConfigError(f"{at}: unknown key {sorted(extra)[0]!r}; known: "
                                        "bind, mode")
            bind, mode = target.get("bind"), target.get("mode", "rw")
            if not isinstance(bind, str) or not bind:
                raise VolumeConfigError(f"{at}.bind: must be the path in the server, got "
                                        f"{bind!r}")
            if mode not in ("ro", "rw"):
                raise VolumeConfigError(f"{at}.mode: must be 'ro' or 'rw', got {mode!r}")
        else:
            raise VolumeConfigError(f"{at}: must be the path in the server or "
                                    f"{{\"bind\": path, \"mode\": \"ro\"|\"rw\"}}, got "
                                    f"{type(target).__name__}")
        if not host.startswith("/") and "/" not in host:
            raise VolumeConfigError(
                f"{at}: host path {host!r} must be an absolute path; {host!r} is a Docker "
                "named volume (DockerSpawner's shape: a name, not a path), and named volumes "
                "are not supported: a server may start on any node and "
                "a named volume lives in one node's engine, so its files would not follow the "
                "user. Mount a folder of the shared file system by its absolute path (for a "
                "per-user folder, home_path_template)")
        _check_path(host, "host path", at, allowed)
        _check_path(bind, "bind", at, allowed)
        out.append(VolumeSpec(posixpath.normpath(host), posixpath.normpath(bind),
                              mode == "ro", group))
    return out


def _inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or below it (both normalised, absolute)."""
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder if folder == "/" else folder + "/")


def _fixed_prefix(template: str) -> str:
    """The folder part of ``template`` before its first ``{field}`` (the whole path when it
    has none): ``/shared/home/{username}`` -> ``/shared/home``."""
    head = template.split("{", 1)[0]
    return posixpath.normpath(head if "{" not in template else head.rsplit("/", 1)[0] or "/")


def _component_re(part: str) -> re.Pattern[str]:
    """One path component with ``{field}``s as any non-empty name without ``/``."""
    pieces = _FIELD.split(part)  # literal, field, literal, ...
    return re.compile("".join(re.escape(p) if i % 2 == 0 else "[^/]+"
                              for i, p in enumerate(pieces)))


def _may_equal(a: str, b: str) -> bool:
    """Whether path components ``a`` and ``b`` (templates) can name the same folder for some
    names; with fields in both, the literal text before the first and after the last field
    must agree (conservative: a pair that might match counts)."""
    fa, fb = bool(_fields(a)), bool(_fields(b))
    if not fa and not fb:
        return a == b
    if fa != fb:
        pattern, text = (a, b) if fa else (b, a)
        return _component_re(pattern).fullmatch(text) is not None
    (pa, *_, sa), (pb, *_, sb) = _FIELD.split(a), _FIELD.split(b)
    return (pa.startswith(pb) or pb.startswith(pa)) and (sa.endswith(sb) or sb.endswith(sa))


def _parts(template: str, group: str) -> list[str]:
    """The components of a host path template, ``{group}`` filled with the entry's group (a
    ``group_volumes`` entry applies only to that group)."""
    path = template.replace("{group}", group) if group else template
    return [p for p in path.split("/") if p]


def nested_in_writable(inner: str, inner_group: str, outer: str, outer_group: str) -> bool:
    """Whether host path template ``inner`` may lie inside ``outer`` (or, for some names, be
    that folder without being the same template): every component of ``outer`` may name the
    component of ``inner`` at its place (:func:`_may_equal`; ``{username}`` any name,
    ``{group}`` the entry's group)."""
    a, b = _parts(inner, inner_group), _parts(outer, outer_group)
    if a == b or len(a) < len(b):
        return False
    return all(_may_equal(x, y) for x, y in zip(b, a[:len(b)], strict=True))


def _check_nesting(specs: list[tuple[str, VolumeSpec]], home_path_template: str) -> None:
    """Refuse a mount (or the homes) whose host folder lies inside a folder users can write
    through another setting: a ``rw`` mount, or a home. Such a user could replace the folder
    (or one above it) by a symbolic link, which the engine follows as root when it makes the
    bind mount: the next server with that mount, anyone's, would get any folder of the node.

    Raises:
        VolumeConfigError: naming both settings.
    """
    home_at = f"GPUSpawner.home_path_template ({home_path_template!r})"
    home = [(home_at, VolumeSpec(posixpath.normpath(home_path_template), "", False))] \
        if home_path_template else []
    writable = [(at, v) for at, v in specs if not v.read_only] + home
    for at, v in [*specs, *home]:
        for w_at, w in writable:
            if w_at == at or not nested_in_writable(v.host_path, v.group, w.host_path,
                                                     w.group):
                continue
            whose = "a home" if w_at == home_at else "the mount"
            raise VolumeConfigError(
                f"{at}: lies inside (or for some user's or group's name is) {w_at}, {whose} "
                f"that users can write: a user could put a symbolic link in place of "
                f"{v.host_path} or of a folder above it, and the engine, as root, would follow "
                "it and mount any folder of the node for every server with this mount. Mount "
                "a folder outside it (or mount it read-only)")


def check_volume_settings(volumes: Any, group_volumes: Any, profiles: Iterable[Any] = (), *,
                          home_path_template: str = "",
                          home_mount_point: str = "/home/{username}",
                          state_dir: str = "", backend: str = "docker",
                          check_exists: bool = True) -> list[VolumeSpec]:
    """Check every mount setting at hub start and return the parsed mounts (all sources).

    Args:
        volumes: ``c.GPUSpawner.volumes``.
        group_volumes: ``c.GPUSpawner.group_volumes`` (``{group: volumes}``).
        profiles: the loaded profiles (:class:`~gpuspawner.hub.profiles.Profile`: ``slug`` and
            ``volumes``, already parsed).
        home_path_template: ``c.GPUSpawner.home_path_template`` (homes on the node).
        home_mount_point: ``c.GPUSpawner.home_mount_point`` (the home in the server).
        state_dir: the hub's state folder (``c.GPUSpawner.state_dir``), "" = none.
        backend: ``c.GPUSpawner.backend``: mounts are refused on ``slurm``.
        check_exists: refuse an untemplated host folder missing on this host.

    Raises:
        VolumeConfigError: the first rule broken (see the module's docstring), naming the
            setting and the path.
    """
    specs: list[tuple[str, VolumeSpec]] = [
        (f"GPUSpawner.group_volumes[{v.group!r}]" if v.group else "GPUSpawner.volumes", v)
        for v in site_volumes(volumes, group_volumes)]
    for p in profiles:
        specs += [(f"GPUSpawner.profiles ({p.slug}).volumes", v) for v in p.volumes]
    if specs and backend == "slurm":
        raise VolumeConfigError(
            f"{specs[0][0]}: mounts are not supported with the Slurm backend (its servers run "
            "as processes on the node, not in containers, so there is no bind mount to make; "
            "the node's file systems are visible as they are): remove the setting")
    homes = _fixed_prefix(home_path_template) if home_path_template else ""
    home_target = posixpath.normpath(home_mount_point) if home_mount_point else ""
    seen: dict[tuple[str, str], str] = {}
    templated: dict[str, tuple[str, set[str]]] = {}  # host path, fields as \0 -> (at, fields)
    for where, v in specs:
        at = f"{where}[{v.host_path!r}]"
        if v.bind == "/" or any(_inside(v.bind, t) for t in FORBIDDEN_TARGETS):
            raise VolumeConfigError(f"{at}: bind {v.bind!r} would cover a system folder of "
                                    "the server")
        if home_target and v.bind == home_target:
            raise VolumeConfigError(f"{at}: bind {v.bind!r} is the home's mount point "
                                    "(home_mount_point): it would hide the home")
        host = v.host_path
        fields = _fields(host)
        name = posixpath.basename(host)
        if name.endswith(".sock") or "docker.sock" in host or _inside(host, "/var/run/docker") \
                or _inside(host, "/run/docker"):
            raise VolumeConfigError(f"{at}: refusing to mount the Docker socket or its folder")
        if state_dir:
            state = posixpath.normpath(os.path.abspath(state_dir))
            if _inside(host, state) or _inside(state, _fixed_prefix(host)):
                raise VolumeConfigError(f"{at}: the hub's state folder ({state}) must not be "
                                        "mounted into servers")
        if homes:
            # {username} as a character no name has: a path inside ``own`` is below the
            # user's own home whatever the name; no templated path can hold ``homes``
            h0 = host.replace("{username}", "\0")
            own = posixpath.normpath(home_path_template).replace("{username}", "\0")
            if h0 == own:
                raise VolumeConfigError(f"{at}: is the user's home itself, mounted already at "
                                        "home_mount_point")
            if _inside(h0, own):
                # the user may put a link in its place: the engine, as root, would follow it
                # on the host and mount whatever folder it names
                raise VolumeConfigError(
                    f"{at}: is inside the user's home ({home_path_template}), which the user "
                    "controls: a symbolic link put in its place would make the engine mount "
                    "any folder of the host. The home is mounted at home_mount_point already "
                    "(use the folder there), or mount one from outside the homes")
            if _inside(homes, h0):
                raise VolumeConfigError(f"{at}: holds every user's home ({homes}): mount a "
                                        "folder beside the homes")
            prefix = _fixed_prefix(host)
            if fields and prefix != homes and _inside(homes, prefix):
                # a name equal to the next folder of the homes' path fills the template there
                nxt = homes[len(prefix):].strip("/").split("/", 1)[0]
                raise VolumeConfigError(
                    f"{at}: a user or group named {nxt!r} would get a folder inside the homes "
                    f"({homes}): keep templated folders out of {prefix}, or give them a "
                    "folder of their own")
            if _inside(prefix, homes):
                raise VolumeConfigError(f"{at}: is inside the homes ({homes}) but not the "
                                        f"user's own home ({home_path_template}): it would "
                                        "show another user's files")
        if fields:
            # {username} and {group} in one place: a user named like a group (or the other
            # way round) gets the other's folder
            shape = host.replace("{username}", "\0").replace("{group}", "\0")
            other = templated.get(shape)
            if other is not None and other[1] != fields:
                raise VolumeConfigError(
                    f"{at}: is {other[0]} with {{username}} and {{group}} swapped: a user "
                    "named like a group would get the group's folder (or a group a user's); "
                    "keep users' and groups' folders in different places")
            templated.setdefault(shape, (at, fields))
        key = (v.group, v.bind)
        if key in seen:
            raise VolumeConfigError(f"{at}: bind {v.bind!r} is already the mount point of "
                                    f"{seen[key]}")
        seen[key] = at
        if check_exists and not fields and not os.path.isdir(host):
            raise VolumeConfigError(f"{at}: the host folder does not exist (or is not a "
                                    "folder) on the hub's host")
    _check_nesting([(f"{where}[{v.host_path!r}]", v) for where, v in specs],
                   home_path_template)
    return [v for _, v in specs]


def fold_read_only_volumes(volumes: Any, read_only_volumes: Any) -> Any:
    """``c.GPUSpawner.volumes`` with DockerSpawner's ``read_only_volumes``
    (``{host_path: container_path}``, every one mounted read-only) added as
    ``{host_path: {"bind": container_path, "mode": "ro"}}``.

    Args:
        volumes: ``c.GPUSpawner.volumes`` (returned as it is when there is nothing to add or
            it is not a dict: :func:`parse_volumes` names that).
        read_only_volumes: ``c.GPUSpawner.read_only_volumes``; None or {} = none.

    Raises:
        VolumeConfigError: ``read_only_volumes`` is not a dict of strings, or a host path is
            in both settings.
    """
    if not read_only_volumes:
        return volumes
    where = "GPUSpawner.read_only_volumes"
    if not isinstance(read_only_volumes, Mapping):
        raise VolumeConfigError(f"{where}: must be a dict {{host_path: container_path}}, got "
                                f"{type(read_only_volumes).__name__}")
    if not isinstance(volumes, Mapping):
        return volumes
    out = dict(volumes)
    for host, bind in read_only_volumes.items():
        if not isinstance(bind, str):
            raise VolumeConfigError(f"{where}[{host!r}]: must be the path in the server (a "
                                    f"string), got {type(bind).__name__}")
        if host in out and out[host] != {"bind": bind, "mode": "ro"}:
            raise VolumeConfigError(f"{where}[{host!r}]: is in GPUSpawner.volumes too; set it "
                                    "in one of them")
        out[host] = {"bind": bind, "mode": "ro"}
    return out


def site_volumes(volumes: Any, group_volumes: Any) -> list[VolumeSpec]:
    """``c.GPUSpawner.volumes`` then ``c.GPUSpawner.group_volumes``, parsed (what servers and
    notebook jobs share; a profile's come from its :class:`~gpuspawner.hub.profiles.Profile`).

    Raises:
        VolumeConfigError: a setting that does not parse (the hub's start-up check refuses
            it first: :func:`check_volume_settings`).
    """
    specs = parse_volumes(volumes, "GPUSpawner.volumes")
    if group_volumes is not None and not isinstance(group_volumes, Mapping):
        raise VolumeConfigError("GPUSpawner.group_volumes: must be a dict {group: volumes}, "
                                f"got {type(group_volumes).__name__}")
    for group, value in (group_volumes or {}).items():
        specs += parse_volumes(value, f"GPUSpawner.group_volumes[{group!r}]", group=str(group))
    return specs


def mounts_for(volumes: Iterable[VolumeSpec], username: str, groups: Iterable[str]
               ) -> tuple[Mount, ...]:
    """The mounts of one server or job: every spec that applies to a member of ``groups``,
    templates filled (``username``: the escaped name; ``{group}``: the spec's group), in
    order; a later spec with the same bind replaces an earlier one (a profile's mount over the
    site's).

    Returns:
        :class:`~gpuspawner.backends.spec.Mount` tuples for the backend's launch spec.
    """
    member = set(groups)
    out: dict[str, Mount] = {}
    for v in volumes:
        if v.group and v.group not in member:
            continue
        fill = {"username": username, "group": v.group}
        bind = v.bind.format(**fill)
        out[bind] = Mount(source=v.host_path.format(**fill), target=bind,
                          read_only=v.read_only)
    return tuple(out.values())
