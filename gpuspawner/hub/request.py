"""One spawn request, checked once: ``user_options`` -> :class:`ServerRequest`.

What a user sends to start a server (the spawn form's fields through ``options_from_form``, or
the JSON body of the hub's REST ``POST /hub/api/users/{name}/servers/{server_name}``) becomes
``Spawner.user_options``. :func:`parse_request` is the one place that checks it:

1. its size (``c.GPUSpawner.user_options_max_bytes``, bytes of its JSON encoding);
2. its shape, against the shipped ``user-options`` JSON Schema (:mod:`gpuspawner.schemas`:
   an object with ``profile`` (a string) and ``queue`` (a boolean), nothing else);
3. what a schema cannot say: the profile exists, and the user's groups may use it
   (:func:`~gpuspawner.hub.profiles.choose_profile`); the image the user chose is one the
   profile offers (:func:`~gpuspawner.hub.images.choose_image`).

The result is a frozen :class:`ServerRequest` that everything after the boundary receives
(the user_options guard before JupyterHub stores the options, the spawner's trait,
``apply_user_options``, the spawner's placement); :func:`checked_request` keeps recent ones,
so a spawn parses its options once, not once per step. Profiles come from
:func:`~gpuspawner.hub.profiles.load_profiles`, which loads each configuration once.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..placement import QuotaTable
from ..schemas import ConfigSchemaError, load_schema, validate
from .cluster import check_quotas
from .images import ImageRequestError, choose_image
from .profiles import OptionsError, Profile, choose_profile

#: the schema's name in :mod:`gpuspawner.schemas`
SCHEMA = "user-options"


@dataclass(frozen=True)
class ServerRequest:
    """A checked spawn request.

    Attributes:
        profile: the chosen profile (its bundle: cores, bytes of memory, milli-GPU, MIG).
        queue: wait in the fair wait queue when the bundle is not free now (the profile's
            ``queue`` and the options' ``queue``, both must allow it).
        options: the ``user_options`` it was made from (a copy, JSON values only).
        groups: the user's JupyterHub group names it was checked with (sorted).
        image: the image the user chose among the profile's ``profile_options.image``
            (:mod:`gpuspawner.hub.images`); "" = the profile's (or the site's) image.
        user_image: ``image`` is a reference the user typed (``image--unlisted-choice``):
            the hub checks it on the node before booking anything.
    """

    profile: Profile
    queue: bool
    options: Mapping[str, Any] = field(default_factory=dict)
    groups: tuple[str, ...] = ()
    image: str = ""
    user_image: bool = False


def _schema_message(e: ConfigSchemaError, options: Any) -> OptionsError:
    """The schema's refusal as an :class:`OptionsError` naming the field, with the words the
    API has always used (``cpu: unknown option; allowed: profile, queue``, ``queue: must be
    true (...) or false (...), got 'x'``): the field's ``title`` in the schema says what it
    must be."""
    properties = load_schema(SCHEMA)["properties"]
    if not e.path:
        return OptionsError("user_options", f"must be a JSON object, got "
                                            f"{type(options).__name__}")
    key = str(e.path[0])
    options = options if isinstance(options, Mapping) else {}
    if key not in properties:
        return OptionsError(key, f"unknown option; allowed: {', '.join(properties)}")
    value = options.get(key)
    if isinstance(value, str) and "is too long" in e.reason:
        return OptionsError(key, f"is {len(value)} characters long; at most "
                                 f"{properties[key].get('maxLength')}")
    got = "null" if value is None else repr(value)
    hint = "; leave the key out for the default profile" if key == "profile" and value is None \
        else ""
    return OptionsError(key, f"must be {properties[key]['title']}, got {got}{hint}")


def parse_request(options: Any, profiles: Sequence[Profile], groups: Sequence[str],
                  max_bytes: int | None = None,
                  deny_images: Sequence[re.Pattern[str]] = (),
                  allowed_registries: Collection[str] = ()) -> ServerRequest:
    """Check ``options`` and return the request it makes.

    Args:
        options: the decoded ``user_options`` (None = empty: the default profile).
        profiles: the validated profiles (:func:`~gpuspawner.hub.profiles.load_profiles`).
        groups: the user's JupyterHub group names.
        max_bytes: the largest JSON encoding accepted, bytes; None = no limit.
        deny_images: the site's ``image_deny_patterns``, compiled
            (:func:`~gpuspawner.hub.images.check_deny_patterns`).
        allowed_registries: the site's ``allowed_registries``, normalised
            (:func:`~gpuspawner.hub.images.check_allowed_registries`).

    Raises:
        OptionsError: too large (field ``user_options``), not the schema's shape (the field
            named: an unknown key, a non-string ``profile``, a non-boolean ``queue``), an
            unknown profile or one the user's groups may not use (field ``profile``), an image
            the profile does not offer (``image``, ``image--unlisted-choice``:
            :func:`~gpuspawner.hub.images.choose_image`). The hub answers HTTP 400 with its
            message ``<field>: <reason>``.
    """
    if options is None:
        options = {}
    if max_bytes is not None:
        size = len(json.dumps(options, default=str).encode())
        if size > max_bytes:
            raise OptionsError("user_options", f"{size} bytes is more than the {max_bytes} "
                                               f"allowed")
    try:
        validate(SCHEMA, options, where="")
    except ConfigSchemaError as e:
        raise _schema_message(e, options) from None
    if not isinstance(options, Mapping):  # the schema's "object" is any Mapping
        raise OptionsError("user_options", f"must be a JSON object, got "
                                           f"{type(options).__name__}")
    profile = choose_profile(options, profiles, groups)
    try:
        image, user_image = choose_image(options, profile.image_option, profile.slug,
                                         deny_images, allowed_registries)
    except ImageRequestError as e:
        raise OptionsError(e.field, e.reason) from None
    return ServerRequest(profile=profile,
                         queue=profile.queue and options.get("queue", True) is not False,
                         options=json.loads(json.dumps(dict(options))),
                         groups=tuple(sorted(groups)), image=image, user_image=user_image)


#: checked requests by their inputs, newest last (:func:`checked_request`)
_CHECKED: OrderedDict[tuple[Any, ...], tuple[tuple[Profile, ...], ServerRequest]] = \
    OrderedDict()
#: how many distinct (options, profiles, groups) are kept
CACHE_SIZE = 512


def checked_request(options: Any, profiles: Sequence[Profile], groups: Sequence[str],
                    max_bytes: int | None = None,
                    deny_images: Sequence[re.Pattern[str]] = (),
                    allowed_registries: Collection[str] = ()) -> ServerRequest:
    """:func:`parse_request`, once per distinct input.

    A spawn meets its options at several steps (the guard before JupyterHub stores them, the
    spawner's trait, ``apply_user_options``, placement); all of them ask here, and only the
    first parses. Inputs are equal when the options have the same JSON text, the groups are
    the same set, the limit is the same and the profiles are the same objects
    (:func:`~gpuspawner.hub.profiles.load_profiles` returns the same ones while the
    configuration is unchanged; a kept entry holds them, so their ids stay unique). The last
    :data:`CACHE_SIZE` inputs are kept; a refusal is not.

    Raises:
        OptionsError: as :func:`parse_request`.
    """
    try:
        text = json.dumps(options, sort_keys=True)
    except (TypeError, ValueError):  # not JSON: parse_request says why
        return parse_request(options, profiles, groups, max_bytes, deny_images,
                             allowed_registries)
    key = (text, tuple(id(p) for p in profiles), tuple(sorted(groups)), max_bytes,
           tuple(p.pattern for p in deny_images), tuple(sorted(allowed_registries)))
    hit = _CHECKED.get(key)
    if hit is not None:
        _CHECKED.move_to_end(key)
        return hit[1]
    request = parse_request(options, profiles, groups, max_bytes, deny_images,
                            allowed_registries)
    _keep(_CHECKED, key, (tuple(profiles), request))
    return request


def _keep(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    """Store ``value`` as the newest entry of ``cache``, dropping the oldest beyond
    :data:`CACHE_SIZE` (the bounded caches of this module)."""
    cache[key] = value
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)


#: quota tables by the JSON text of their setting (:func:`quota_table`)
_TABLES: OrderedDict[str, QuotaTable] = OrderedDict()


def quota_table(quotas: Any) -> QuotaTable:
    """``c.GPUSpawner.quotas`` (as a spawner sees it, after JupyterHub's ``group_overrides``)
    as a :class:`~gpuspawner.placement.QuotaTable`, checked once per distinct setting (the
    last :data:`CACHE_SIZE` kept).

    Raises:
        ValueError: as :func:`~gpuspawner.hub.cluster.check_quotas` (the field named).
    """
    text = json.dumps(quotas, sort_keys=True, default=str)
    table = _TABLES.get(text)
    if table is None:
        table = check_quotas(quotas)
        _keep(_TABLES, text, table)
    return table
