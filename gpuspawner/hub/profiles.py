"""Profiles (what a user may pick in the spawn form or name in ``user_options``) and the
choice of one (the shape of ``user_options`` is checked before, in :mod:`gpuspawner.hub.request`).

A profile is a named bundle, in the spirit of KubeSpawner's ``profile_list``: ``slug``,
``display_name``, ``description``, ``cpu`` (cores), ``memory`` and ``disk`` (sizes such as "4G"),
``gpus`` (a whole number of GPUs, or a milli-GPU share written ``gpu_milli: 250``, or
``gpus: 0.25``), or ``mig`` (a MIG profile name such as ``1g.10gb``, with ``mig_count``,
default 1; exclusive with ``gpus``), ``gpu_models``, ``image``, ``numa_policy``, ``groups``
(who may use it; empty = everyone), ``nodes`` (restrict to these node names; empty = any) and
``default``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..placement import GPU_MILLI, Bundle, parse_bytes
from ..schemas import ConfigSchemaError, format_field, load_schema, validate
from .images import ImageOption, ImageOptionError, parse_image_option
from .volumes import VolumeConfigError, VolumeSpec, parse_volumes

#: the keys of a profile (the ``profiles`` schema's)
PROFILE_KEYS = frozenset(load_schema("profiles")["$defs"]["profile"]["properties"])

#: help of ``GPUSpawner.profiles``
PROFILES_HELP = """Profiles users choose from: a list of dicts or the path of a YAML file.

Keys: slug, display_name, description, cpu (whole cores), memory and disk (bytes, or sizes like
"4G": K, M, G, T are powers of 1024), gpus (whole GPUs, or a fraction below 1 for a share) or
gpu_milli (milli-GPU, 1..999: a share of one GPU) or mig (a MIG profile name such as 1g.10gb,
with mig_count, default 1), gpu_models (list), image, profile_options (image choices users
may make, KubeSpawner's shape), volumes (mounts beside c.GPUSpawner.volumes, same shape),
restart_on_node_failure (move servers off a failed node), numa_policy
(strict | prefer | none), groups (who may use it; empty = everyone), nodes (node names it may
run on; empty = any), queue (wait when the bundle is not free now), default.
"""

#: keys a client may send in ``user_options`` (the ``user-options`` schema's)
USER_OPTION_KEYS = frozenset(load_schema("user-options")["properties"])

#: loaded configurations (:func:`load_profiles`), by :func:`_config_key`; a few at most
_LOADED: dict[tuple[Any, ...], tuple[Profile, ...]] = {}
_LOADED_MAX = 8


class ProfileConfigError(ValueError):
    """A malformed ``c.GPUSpawner.profiles`` entry; the message names the profile and field."""


class OptionsError(ValueError):
    """Malformed or forbidden ``user_options``; ``field`` names the offending key. The spawner
    turns it into HTTP 400 with the message ``"<field>: <reason>"``."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


@dataclass(frozen=True)
class Profile:
    """One validated profile. Sizes in bytes, GPUs as a :class:`Bundle`."""

    slug: str
    display_name: str
    bundle: Bundle
    description: str = ""
    image: str = ""
    groups: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    default: bool = False
    #: wait in the queue when the bundle fits the capacity but not what is free now
    queue: bool = False
    #: the profile's own mounts (:mod:`gpuspawner.hub.volumes`), beside the site's
    volumes: tuple[VolumeSpec, ...] = ()
    #: the images users may choose (``profile_options.image``, :mod:`gpuspawner.hub.images`)
    image_option: ImageOption | None = None
    #: restart its servers elsewhere when their node fails; None = the spawner's setting
    restart_on_node_failure: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def allowed_for(self, groups: Iterable[str]) -> bool:
        """True when the profile has no group restriction or shares a group with ``groups``."""
        return not self.groups or bool(set(self.groups) & set(groups))


def _bundle_from(entry: Mapping[str, Any], where: str) -> Bundle:
    """The bundle of one profile entry that passed the ``profiles`` schema: sizes parsed to
    bytes, a GPU fraction (``gpus: 0.25``) turned into milli-GPU.

    Raises:
        ProfileConfigError: a rule the schema cannot express: a fraction of a GPU above 1
            or together with ``gpu_milli``; ``mig`` together with ``gpus`` or ``gpu_milli``,
            or ``mig_count`` without ``mig``.
    """
    def size(key: str) -> int:
        try:
            return parse_bytes(entry.get(key) or 0)
        except ValueError as e:  # the schema's pattern and parse_bytes agree; kept as a guard
            raise ProfileConfigError(f"{where}.{key}: {e}") from None

    gpus_raw = entry.get("gpus", 0)
    milli = int(entry.get("gpu_milli", 0))
    if not float(gpus_raw).is_integer():
        if gpus_raw > 1 or milli:
            raise ProfileConfigError(f"{where}.gpus: a fraction must be below 1 (a share of one "
                                     f"GPU) and not given with gpu_milli, got {gpus_raw}")
        milli, gpus_raw = round(gpus_raw * GPU_MILLI), 0
    mig = entry.get("mig") or ""
    if mig and (gpus_raw or milli):
        raise ProfileConfigError(f"{where}.mig: MIG instances and gpus/gpu_milli are exclusive; "
                                 "set one of them")
    if "mig_count" in entry and not mig:
        raise ProfileConfigError(f"{where}.mig_count: only with mig (a MIG profile name)")
    return Bundle(cores=int(entry.get("cpu", 1)), memory_bytes=size("memory"),
                  gpus=int(gpus_raw), gpu_milli=milli,
                  gpu_models=_names(entry.get("gpu_models")), disk_bytes=size("disk"),
                  numa_policy=entry.get("numa_policy", "strict"),
                  mig=mig, mig_count=int(entry.get("mig_count", 1)))


def _volumes_from(value: Any, where: str) -> list[VolumeSpec]:
    """A profile's ``volumes`` (:func:`~gpuspawner.hub.volumes.parse_volumes`).

    Raises:
        ProfileConfigError: a path or mode the mount rules refuse, the field named."""
    try:
        return parse_volumes(value, where)
    except VolumeConfigError as e:
        raise ProfileConfigError(str(e)) from None


def _image_option_from(entry: Mapping[str, Any], where: str) -> ImageOption | None:
    """A profile's ``profile_options.image`` (:func:`~gpuspawner.hub.images.parse_image_option`),
    or None.

    Raises:
        ProfileConfigError: the option is malformed, the field named."""
    value = (entry.get("profile_options") or {}).get("image")
    if value is None:
        return None
    try:
        return parse_image_option(value, f"{where}.profile_options.image")
    except ImageOptionError as e:
        raise ProfileConfigError(str(e)) from None


def _names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """A ``names`` value of the schema (a list, one name, or null) as a tuple."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _schema_error(e: ConfigSchemaError, config: Sequence[Any], source: str
                  ) -> ProfileConfigError:
    """The schema's refusal, with the profile's slug after its index where it has one:
    ``profiles[2] (a100).gpus: -1 is less than the minimum of 0``."""
    path = list(e.path)
    if path and isinstance(path[0], int):
        entry = config[path[0]]
        slug = entry.get("slug") if isinstance(entry, Mapping) else None
        head = f"{source}[{path[0]}]" + (f" ({slug})" if isinstance(slug, str) and slug
                                        else "")
        return ProfileConfigError(f"{format_field(head, path[1:])}: {e.reason}")
    return ProfileConfigError(str(e))


def _config_key(config: Any) -> tuple[Any, ...] | None:
    """What identifies one profile configuration: a file by path, size and modification time
    (nanoseconds), a list by its JSON text; None when it cannot be told (not cached)."""
    if isinstance(config, (str, os.PathLike)):
        try:
            st = os.stat(config)
        except OSError:
            return None
        return ("file", os.fspath(config), st.st_size, st.st_mtime_ns)
    try:
        return ("list", json.dumps(config, sort_keys=True))
    except (TypeError, ValueError):
        return None


def load_profiles(config: Sequence[Mapping[str, Any]] | str | os.PathLike[str]
                  ) -> list[Profile]:
    """Validate profiles from ``c.GPUSpawner.profiles``: a list of dicts, or the path of a YAML
    file holding such a list (or ``{"profiles": [...]}``).

    Each configuration is loaded once: while the list's contents or the file's size and
    modification time are the same, the same :class:`Profile` objects come back (frozen; the
    list is new). A configuration that fails is checked again on every call.

    First the ``profiles`` JSON Schema (:mod:`gpuspawner.schemas`: keys, types, ranges, the
    form of slugs and sizes, ``numa_policy``), then what it cannot express: unique slugs, at
    most one default, a GPU fraction below 1.

    Raises:
        ProfileConfigError: the file is unreadable, a key is unknown or a value is bad; the
            message names the profile (``profiles[2] (a100)``, or the file:
            ``/etc/p.yaml[2] (a100)``, ``/etc/p.yaml: profiles[2] (a100)``) and the field.
    """
    key = _config_key(config)
    if key is not None and key in _LOADED:
        return list(_LOADED[key])
    out = _load_profiles(config)
    if key is not None:
        if len(_LOADED) >= _LOADED_MAX:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = tuple(out)
    return out


def _load_profiles(config: Sequence[Mapping[str, Any]] | str | os.PathLike[str]
                   ) -> list[Profile]:
    """:func:`load_profiles` without the cache."""
    source = "profiles"
    if isinstance(config, (str, os.PathLike)):
        source = os.fspath(config)
        try:
            with open(config, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ProfileConfigError(f"{source}: cannot read: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ProfileConfigError(f"{source}: not valid YAML: {e}") from None
        if isinstance(data, dict):
            data = data.get("profiles")
            source = f"{source}: profiles"
        config = data or []
    try:
        validate("profiles", config, where=source)
    except ConfigSchemaError as e:
        raise _schema_error(e, config, source) from None
    out: list[Profile] = []
    seen: set[str] = set()
    for i, entry in enumerate(config):
        slug = entry["slug"]
        where = f"{source}[{i}] ({slug})"
        if slug in seen:
            raise ProfileConfigError(f"{where}.slug: duplicate slug")
        seen.add(slug)
        bundle = _bundle_from(entry, where)
        out.append(Profile(
            slug=slug,
            display_name=entry.get("display_name") or slug,
            description=entry.get("description") or "",
            bundle=bundle,
            image=entry.get("image", ""),
            groups=_names(entry.get("groups")),
            nodes=_names(entry.get("nodes")),
            default=entry.get("default", False),
            queue=bool(entry.get("queue", bundle.total_gpu_milli > 0)),
            volumes=tuple(_volumes_from(entry.get("volumes"), f"{where}.volumes")),
            image_option=_image_option_from(entry, where),
            restart_on_node_failure=entry.get("restart_on_node_failure"),
        ))
    if sum(p.default for p in out) > 1:
        raise ProfileConfigError(f"{source}: more than one profile has default: true")
    return out


def choose_profile(user_options: Mapping[str, Any] | None, profiles: Sequence[Profile],
                   groups: Iterable[str]) -> Profile:
    """The profile ``user_options`` name (their ``profile`` key), for a user in ``groups``.

    ``user_options`` are expected in the ``user-options`` schema's shape already (checked by
    :func:`gpuspawner.hub.request.parse_request`; a job's request is made by the hub). No
    ``profile`` key chooses the default profile (the one marked ``default``, else the first
    the user may use).

    Raises:
        OptionsError: field ``profile``: no profiles, an unknown profile, or one the user's
            groups may not use.
    """
    groups = set(groups)
    user_options = user_options or {}
    if not profiles:
        raise OptionsError("profile", "no profiles are configured")
    visible = [p for p in profiles if p.allowed_for(groups)]
    slug = user_options.get("profile")
    if slug is None:
        chosen = next((p for p in visible if p.default), None) or (visible[0] if visible
                                                                    else None)
        if chosen is None:
            raise OptionsError("profile", "no profile is available to your groups")
        return chosen
    match = next((p for p in profiles if p.slug == slug), None)
    if match is None:
        names = ", ".join(p.slug for p in visible) or "none"
        raise OptionsError("profile", f"unknown profile {slug!r}; choose one of: {names}")
    if not match.allowed_for(groups):
        raise OptionsError("profile", f"profile {slug!r} is not available to your groups "
                                      f"(it is for: {', '.join(match.groups)})")
    return match
