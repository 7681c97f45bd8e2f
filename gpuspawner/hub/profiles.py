"""Profiles (what a user may pick in the spawn form or name in ``user_options``) and the
validation of ``user_options``.

A profile is a named bundle, in the spirit of KubeSpawner's ``profile_list``: ``slug``,
``display_name``, ``description``, ``cpu`` (cores), ``memory`` and ``disk`` (sizes such as "4G"),
``gpus`` (a whole number of GPUs, or a milli-GPU share written ``gpu_milli: 250``, or
``gpus: 0.25``), ``gpu_models``, ``image``, ``numa_policy``, ``groups`` (who may use it; empty =
everyone), ``nodes`` (restrict to these node names; empty = any) and ``default``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..placement import GPU_MILLI, NUMA_POLICIES, Bundle, parse_bytes

PROFILE_KEYS = frozenset({
    "slug", "display_name", "description", "cpu", "memory", "gpus", "gpu_milli", "gpu_models",
    "disk", "image", "numa_policy", "groups", "nodes", "default",
})

#: help of ``GPUSpawner.profiles``
PROFILES_HELP = """Profiles users choose from: a list of dicts or the path of a YAML file.

Keys: slug, display_name, description, cpu (cores), memory and disk (sizes like "4G"), gpus
(whole GPUs, or a fraction below 1 for a share) or gpu_milli (1..999), gpu_models (list), image,
numa_policy (strict | prefer | none), groups (who may use it; empty = everyone), nodes (node
names it may run on; empty = any), default.
"""

#: keys a client may send in ``user_options``
USER_OPTION_KEYS = frozenset({"profile"})


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
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def allowed_for(self, groups: Iterable[str]) -> bool:
        """True when the profile has no group restriction or shares a group with ``groups``."""
        return not self.groups or bool(set(self.groups) & set(groups))


def _bundle_from(entry: Mapping[str, Any], where: str) -> Bundle:
    def size(key: str) -> int:
        value = entry.get(key, 0)
        try:
            return parse_bytes(value if value is not None else 0)
        except ValueError as e:
            raise ProfileConfigError(f"{where}.{key}: {e}") from None

    cpu = entry.get("cpu", 1)
    if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 0:
        raise ProfileConfigError(f"{where}.cpu: must be a whole number of cores >= 0, got {cpu!r}")
    gpus_raw = entry.get("gpus", 0)
    milli = entry.get("gpu_milli", 0)
    if isinstance(gpus_raw, bool) or not isinstance(gpus_raw, (int, float)) or gpus_raw < 0:
        raise ProfileConfigError(f"{where}.gpus: must be a number >= 0, got {gpus_raw!r}")
    if isinstance(gpus_raw, float) and not gpus_raw.is_integer():
        if gpus_raw > 1 or milli:
            raise ProfileConfigError(f"{where}.gpus: a fraction must be below 1 (a share of one "
                                     f"GPU), got {gpus_raw}")
        milli, gpus_raw = round(gpus_raw * GPU_MILLI), 0
    if not isinstance(milli, int) or isinstance(milli, bool) or not 0 <= milli < GPU_MILLI:
        raise ProfileConfigError(f"{where}.gpu_milli: must be 0..999, got {milli!r}")
    models = entry.get("gpu_models", ())
    if isinstance(models, str):
        models = (models,)
    if not isinstance(models, (list, tuple)) or not all(isinstance(m, str) for m in models):
        raise ProfileConfigError(f"{where}.gpu_models: must be a list of model names")
    policy = entry.get("numa_policy", "strict")
    if policy not in NUMA_POLICIES:
        raise ProfileConfigError(f"{where}.numa_policy: must be one of "
                                 f"{', '.join(NUMA_POLICIES)}, got {policy!r}")
    return Bundle(cores=cpu, memory_bytes=size("memory"), gpus=int(gpus_raw), gpu_milli=milli,
                  gpu_models=tuple(models), disk_bytes=size("disk"), numa_policy=policy)


def _str_list(entry: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key) or ()
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ProfileConfigError(f"{where}.{key}: must be a list of names")
    return tuple(value)


def load_profiles(config: Sequence[Mapping[str, Any]] | str | os.PathLike[str]
                  ) -> list[Profile]:
    """Validate profiles from ``c.GPUSpawner.profiles``: a list of dicts, or the path of a YAML
    file holding such a list (or ``{"profiles": [...]}``).

    Raises:
        ProfileConfigError: the file is unreadable, a key is unknown or a value is bad; the
            message names the profile (``profiles[2] (a100)``) and the field.
    """
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
        config = data or []
    if not isinstance(config, (list, tuple)):
        raise ProfileConfigError(f"{source}: must be a list of profiles")
    out: list[Profile] = []
    seen: set[str] = set()
    for i, entry in enumerate(config):
        where = f"{source}[{i}]"
        if not isinstance(entry, Mapping):
            raise ProfileConfigError(f"{where}: must be a mapping")
        slug = entry.get("slug")
        if not isinstance(slug, str) or not slug or not slug.replace("-", "").replace(
                "_", "").replace(".", "").isalnum():
            raise ProfileConfigError(f"{where}.slug: must be a non-empty name of letters, "
                                     f"digits, '-', '_' or '.', got {slug!r}")
        where = f"{where} ({slug})"
        if slug in seen:
            raise ProfileConfigError(f"{where}.slug: duplicate slug")
        seen.add(slug)
        unknown = set(entry) - PROFILE_KEYS
        if unknown:
            raise ProfileConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                                     f"known: {', '.join(sorted(PROFILE_KEYS))}")
        image = entry.get("image", "")
        if not isinstance(image, str):
            raise ProfileConfigError(f"{where}.image: must be a string")
        out.append(Profile(
            slug=slug,
            display_name=str(entry.get("display_name") or slug),
            description=str(entry.get("description") or ""),
            bundle=_bundle_from(entry, where),
            image=image,
            groups=_str_list(entry, "groups", where),
            nodes=_str_list(entry, "nodes", where),
            default=bool(entry.get("default", False)),
        ))
    if sum(p.default for p in out) > 1:
        raise ProfileConfigError(f"{source}: more than one profile has default: true")
    return out


def choose_profile(user_options: Any, profiles: Sequence[Profile],
                   groups: Iterable[str]) -> Profile:
    """Check ``user_options`` (from the form or the REST API) and return the chosen profile.

    Empty options choose the default profile (the one marked ``default``, else the first the
    user may use).

    Raises:
        OptionsError: options not an object, an unknown key, a null, non-string or unknown
            profile, or a profile the user's groups may not use.
    """
    groups = set(groups)
    if user_options is None:
        user_options = {}
    if not isinstance(user_options, Mapping):
        raise OptionsError("user_options", f"must be a JSON object, got "
                                           f"{type(user_options).__name__}")
    unknown = set(user_options) - USER_OPTION_KEYS
    if unknown:
        raise OptionsError(sorted(unknown)[0], f"unknown option; allowed: "
                                               f"{', '.join(sorted(USER_OPTION_KEYS))}")
    if not profiles:
        raise OptionsError("profile", "no profiles are configured")
    visible = [p for p in profiles if p.allowed_for(groups)]
    if "profile" in user_options and user_options["profile"] is None:
        raise OptionsError("profile", "must be a string (a profile slug), got null; leave "
                                      "the key out for the default profile")
    slug = user_options.get("profile")
    if slug is None:
        chosen = next((p for p in visible if p.default), None) or (visible[0] if visible
                                                                    else None)
        if chosen is None:
            raise OptionsError("profile", "no profile is available to your groups")
        return chosen
    if not isinstance(slug, str):
        raise OptionsError("profile", f"must be a string (a profile slug), got "
                                      f"{type(slug).__name__}")
    match = next((p for p in profiles if p.slug == slug), None)
    if match is None:
        names = ", ".join(p.slug for p in visible) or "none"
        raise OptionsError("profile", f"unknown profile {slug!r}; choose one of: {names}")
    if not match.allowed_for(groups):
        raise OptionsError("profile", f"profile {slug!r} is not available to your groups "
                                      f"(it is for: {', '.join(match.groups)})")
    return match
