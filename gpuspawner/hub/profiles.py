"""Profiles (what a user may pick in the spawn form or name in ``user_options``) and the
choice of one (the shape of ``user_options`` is checked before, in :mod:`gpuspawner.hub.request`).

A profile is a named bundle, in the spirit of KubeSpawner's ``profile_list``: ``slug``,
``display_name``, ``description``, ``cpu`` (cores), ``memory`` and ``disk`` (sizes such as "4G"),
``gpus`` (a whole number of GPUs, or a milli-GPU share written ``gpu_milli: 250``, or
``gpus: 0.25``), or ``mig`` (a MIG profile name such as ``1g.10gb``, with ``mig_count``,
default 1; exclusive with ``gpus``), ``gpu_models``, ``image``, ``numa_policy``, ``groups``
(who may use it; empty = everyone), ``nodes`` (restrict to these node names; empty = any) and
``default``.

KubeSpawner's ``profile_list`` shape is accepted too (:func:`from_kubespawner`; the trait
``c.GPUSpawner.profile_list`` is an alias of ``profiles``): ``slug`` may be left out (made
from ``display_name`` as KubeSpawner does), ``kubespawner_override`` may set ``image``,
``cpu_limit``/``cpu_guarantee`` (whole cores), ``mem_limit``/``mem_guarantee`` and
``extra_resource_limits``/``extra_resource_guarantees`` with ``nvidia.com/gpu`` only, and
``profile_options.image`` takes KubeSpawner's choices (``description`` included) and
``unlisted_choice`` (``display_name_in_choices``, ``description_in_choices`` and
``kubespawner_override: {image: "{value}"}`` included). Any other KubeSpawner key is refused
at hub start with the key named: Kubernetes' own (``node_selector``, ``tolerations``, ...)
have no meaning on this spawner. A callable profile list is refused (profiles are booked
before any spawner exists).
"""

from __future__ import annotations

import json
import os
import re
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

KubeSpawner's profile_list entries are accepted (c.GPUSpawner.profile_list is an alias):
slug may be left out (made from display_name), kubespawner_override may set image,
cpu_limit/cpu_guarantee, mem_limit/mem_guarantee and extra_resource_limits/guarantees
{"nvidia.com/gpu": N}; any other KubeSpawner key stops the hub, named
(docs/howto/user-images.md). A callable is refused.
"""

#: keys a client may send in ``user_options`` (the ``user-options`` schema's)
USER_OPTION_KEYS = frozenset(load_schema("user-options")["properties"])

#: loaded configurations (:func:`load_profiles`), by :func:`_config_key`; a few at most
_LOADED: dict[tuple[Any, ...], tuple[Profile, ...]] = {}
_LOADED_MAX = 8


class ProfileConfigError(ValueError):
    """A malformed ``c.GPUSpawner.profiles`` entry; the message names the profile and field."""


#: KubeSpawner settings that place a pod on Kubernetes: what does it here
_K8S_PLACEMENT = frozenset({
    "node_selector", "tolerations", "node_affinity_required", "node_affinity_preferred",
    "pod_affinity_required", "pod_affinity_preferred", "pod_anti_affinity_required",
    "pod_anti_affinity_preferred", "scheduler_name", "priority_class_name", "namespace",
    "extra_pod_config", "extra_container_config", "extra_resource_guarantees_gpu"})
#: kubespawner_override keys this spawner maps onto a profile
KUBESPAWNER_OVERRIDE_KEYS = ("image", "cpu_limit", "cpu_guarantee", "mem_limit",
                             "mem_guarantee", "extra_resource_limits",
                             "extra_resource_guarantees")
#: KubeSpawner settings a profile cannot set here, and what to do instead
_OVERRIDE_ADVICE = {
    "default_url": "set c.Spawner.default_url (every server)",
    "environment": "set c.Spawner.environment (every server)",
    "cmd": "set c.Spawner.cmd (every server)",
    "start_timeout": "set c.Spawner.start_timeout (every server)",
    "volumes": "use the profile's volumes ({host_path: container_path}, docs/howto/data-mounts.md)",
    "volume_mounts": "use the profile's volumes ({host_path: container_path}, "
                     "docs/howto/data-mounts.md)",
}
#: the one extended resource a profile can ask for
GPU_RESOURCE = "nvidia.com/gpu"
#: keys of an unlisted choice (KubeSpawner's) that only change what the form says
_UNLISTED_DISPLAY_ONLY = ("display_name_in_choices", "description_in_choices")


def kubespawner_slug(display_name: str) -> str:
    """KubeSpawner's slug for a profile without one: the display name in lower case, every
    run of characters other than letters and digits made one ``-`` (``"GPU (A100)"`` ->
    ``"gpu-a100"``)."""
    return re.sub(r"[^a-z0-9]+", "-", display_name.lower()).strip("-")


def _whole(value: Any, at: str, what: str) -> int:
    """A whole number from a KubeSpawner number (int, float or numeric string)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ProfileConfigError(f"{at}: must be a number of {what}, got {value!r}") from None
    if number < 0 or not number.is_integer():
        raise ProfileConfigError(f"{at}: must be a whole number of {what} here (cores and GPUs "
                                 f"are pinned, not shared by time), got {value!r}")
    return int(number)


def _gpus_of(resources: Any, at: str) -> int | None:
    """The ``nvidia.com/gpu`` count of ``extra_resource_limits`` (None when absent)."""
    if not isinstance(resources, Mapping):
        raise ProfileConfigError(f"{at}: must be a dict {{\"{GPU_RESOURCE}\": count}}")
    other = sorted(set(resources) - {GPU_RESOURCE})
    if other:
        raise ProfileConfigError(f"{at}.{other[0]}: has no meaning on this spawner; only "
                                 f"{GPU_RESOURCE} (whole GPUs; for a share of one GPU use gpus: "
                                 "0.25 or gpu_milli, for MIG use mig)")
    if GPU_RESOURCE not in resources:
        return None
    return _whole(resources[GPU_RESOURCE], f"{at}.{GPU_RESOURCE}", "GPUs")


def _map_override(override: Any, at: str) -> dict[str, Any]:
    """A profile's ``kubespawner_override`` as this spawner's profile keys.

    Raises:
        ProfileConfigError: a key that has no meaning here (named), or a bad value."""
    if not isinstance(override, Mapping):
        raise ProfileConfigError(f"{at}: must be a dict of KubeSpawner settings")
    for key in override:
        if key in _OVERRIDE_ADVICE:
            raise ProfileConfigError(f"{at}.{key}: has no meaning on this spawner per profile; "
                                     f"{_OVERRIDE_ADVICE[key]}")
        if key in _K8S_PLACEMENT:
            raise ProfileConfigError(f"{at}.{key}: has no meaning on this spawner; use nodes/"
                                     "gpu_models (where a profile may run, which GPU models)")
        if key not in KUBESPAWNER_OVERRIDE_KEYS:
            raise ProfileConfigError(f"{at}.{key}: has no meaning on this spawner; "
                                     f"kubespawner_override may set: "
                                     f"{', '.join(KUBESPAWNER_OVERRIDE_KEYS)}")
    out: dict[str, Any] = {}
    if "image" in override:
        out["image"] = override["image"]
    cpu_key = "cpu_limit" if override.get("cpu_limit") is not None else "cpu_guarantee"
    if override.get(cpu_key) is not None:
        out["cpu"] = _whole(override[cpu_key], f"{at}.{cpu_key}", "cores")
    mem_key = "mem_limit" if override.get("mem_limit") is not None else "mem_guarantee"
    if override.get(mem_key) is not None:
        out["memory"] = override[mem_key]
    gpus = [g for g in (_gpus_of(override[k], f"{at}.{k}") for k in
                        ("extra_resource_limits", "extra_resource_guarantees")
                        if override.get(k) is not None) if g is not None]
    if gpus:
        if len(set(gpus)) > 1:
            raise ProfileConfigError(f"{at}.extra_resource_guarantees.{GPU_RESOURCE}: differs "
                                     "from extra_resource_limits; GPUs are whole devices here "
                                     "(set one count)")
        out["gpus"] = gpus[0]
    return out


def _map_image_option(option: Any, at: str) -> Any:
    """KubeSpawner's ``profile_options.image`` in this spawner's shape: a choice's
    ``description`` and the unlisted choice's ``display_name_in_choices`` /
    ``description_in_choices`` dropped (the form does not show them), the unlisted choice's
    ``kubespawner_override`` checked to be ``{image: "{value}"}`` and dropped.

    Raises:
        ProfileConfigError: an override of the unlisted choice that sets anything else."""
    if not isinstance(option, Mapping):
        return option  # the schema names the field
    out = dict(option)
    choices = out.get("choices")
    if isinstance(choices, Mapping):
        out["choices"] = {k: ({n: v for n, v in c.items() if n != "description"}
                              if isinstance(c, Mapping) else c) for k, c in choices.items()}
    unlisted = out.get("unlisted_choice")
    if isinstance(unlisted, Mapping):
        unlisted = {k: v for k, v in unlisted.items() if k not in _UNLISTED_DISPLAY_ONLY}
        override = unlisted.pop("kubespawner_override", None)
        if override is not None:
            u_at = f"{at}.unlisted_choice.kubespawner_override"
            if not isinstance(override, Mapping):
                raise ProfileConfigError(f"{u_at}: must be {{image: \"{{value}}\"}}")
            for key, value in override.items():
                if key != "image":
                    raise ProfileConfigError(f"{u_at}.{key}: has no meaning on this spawner; "
                                             "an unlisted choice may set only image")
                if value != "{value}":
                    raise ProfileConfigError(f"{u_at}.image: must be \"{{value}}\" (the "
                                             f"reference the user types), got {value!r}")
        out["unlisted_choice"] = unlisted
    return out


def from_kubespawner(entry: Any, where: str) -> Any:
    """One ``profile_list`` entry of KubeSpawner's shape as this spawner's profile (entries
    already in this shape come back unchanged; a non-dict is left to the schema).

    Args:
        entry: the profile entry.
        where: the entry's name for messages (``profiles[2]``).

    Raises:
        ProfileConfigError: a ``kubespawner_override`` key, a ``profile_options`` option or an
            unlisted choice's override that has no meaning here (the key named, with what to
            use instead), a non-whole ``cpu_limit`` or GPU count, a key set both ways, or no
            slug and no display name to make one from.
    """
    if not isinstance(entry, Mapping):
        return entry
    out = dict(entry)
    if "slug" not in out and isinstance(out.get("display_name"), str):
        out["slug"] = kubespawner_slug(out["display_name"])
        if not out["slug"]:
            raise ProfileConfigError(f"{where}.slug: missing, and display_name "
                                     f"{out['display_name']!r} gives none; set slug")
    slug = out.get("slug")
    if isinstance(slug, str) and slug:
        where = f"{where} ({slug})"
    override = out.pop("kubespawner_override", None)
    if override is not None:
        for key, value in _map_override(override, f"{where}.kubespawner_override").items():
            if key in entry:
                raise ProfileConfigError(f"{where}.{key}: set both here and through "
                                         "kubespawner_override; set one")
            out[key] = value
    options = out.get("profile_options")
    if isinstance(options, Mapping):
        for name in options:
            if name != "image":
                raise ProfileConfigError(
                    f"{where}.profile_options.{name}: unknown field: it has no meaning on this "
                    "spawner; only an option named image (choices whose kubespawner_override "
                    "sets image only) is supported: resources are chosen by picking a profile")
        if "image" in options:
            out["profile_options"] = {"image": _map_image_option(
                options["image"], f"{where}.profile_options.image")}
    return out


def resolve_profile_list(settings: Mapping[str, Any]) -> dict[str, Any]:
    """GPUSpawner settings (trait name -> value) with ``profile_list`` (KubeSpawner's name)
    moved to ``profiles``.

    Raises:
        ProfileConfigError: both ``profiles`` and ``profile_list`` are set.
    """
    out = dict(settings)
    if out.get("profile_list", 0) is None:
        del out["profile_list"]
    if "profile_list" in out:
        if "profiles" in out:
            raise ProfileConfigError("profile_list: an alias of profiles, and both are set; set "
                                     "one")
        out["profiles"] = out.pop("profile_list")
    return out


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
    if callable(config):
        raise ProfileConfigError(
            "profiles: a callable profile list (KubeSpawner's profile_list(spawner)) is not "
            "supported: the hub books capacity, quotas and the wait queue for every profile "
            "before any spawner exists. Give the list itself and restrict profiles to users "
            "with groups")
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
            data, key = _list_in_file(data)
            source = f"{source}: {key}"
        config = data or []
    if isinstance(config, Sequence) and not isinstance(config, (str, bytes)):
        config = [from_kubespawner(e, f"{source}[{i}]") for i, e in enumerate(config)]
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


def _list_in_file(data: Mapping[str, Any]) -> tuple[Any, str]:
    """The profile list in a YAML mapping: ``profiles``, ``profile_list``, or Zero to
    JupyterHub's ``singleuser.profileList`` (a chart's values file); the key path."""
    for key in ("profiles", "profile_list"):
        if key in data:
            return data[key], key
    single = data.get("singleuser")
    if isinstance(single, Mapping) and "profileList" in single:
        return single["profileList"], "singleuser.profileList"
    return None, "profiles"


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
