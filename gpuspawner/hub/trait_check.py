"""The check of one structured ``c.GPUSpawner`` setting, and the error every configuration
check raises.

Shared by the spawner's trait validators (:mod:`gpuspawner.hub.settings`) and the check of
the whole configuration at hub start (:mod:`gpuspawner.hub.config_check`, which re-exports
both names). It sits below both so that neither imports the other's module: the settings are
checked with the very code the hub later runs (the profiles' loader, the quota table, the
nodes' schema, the backend's class lookup), never a second copy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..backends.base import backend_class
from .cluster import check_node_entries, check_quotas
from .profiles import load_profiles

__all__ = ["HubConfigError", "SharedDict", "SharedList", "check_trait", "shared_value"]


class HubConfigError(ValueError):
    """A wrong gpuspawner setting; the message starts with the trait and the field, e.g.
    ``GPUSpawner.profiles[1] (gpu).gpus: 'two' is not of type 'number'``."""


def check_trait(name: str, value: Any) -> None:
    """Check one structured GPUSpawner setting (``backend``, ``profiles``, ``quotas``,
    ``nodes``; nodes by structure only) with the code the hub uses.
    The spawner's trait validator and
    :func:`~gpuspawner.hub.config_check.check_spawner_settings` both call it.

    Profiles, quotas and nodes go through their JSON Schema first (:mod:`gpuspawner.schemas`,
    inside :func:`~gpuspawner.hub.profiles.load_profiles`,
    :func:`~gpuspawner.hub.cluster.check_quotas` and
    :func:`~gpuspawner.hub.cluster.check_node_entries`), then through the rules a schema
    cannot express (unique names, one default profile, GPU fractions).

    Raises:
        HubConfigError: ``GPUSpawner.<field>: <reason>``, the field being the JSON path in the
            trait (``GPUSpawner.profiles[2] (a100).gpus: -1 is less than the minimum of 0``,
            ``GPUSpawner.quotas.users.ann.memory: ...``); for a profiles file,
            ``GPUSpawner.profiles: <file>[2] (a100).gpus: ...``.
        KeyError: ``name`` is none of the four.
    """
    checks = {"profiles": load_profiles, "quotas": check_quotas, "nodes": check_node_entries,
              "backend": backend_class}
    if isinstance(value, (SharedList, SharedDict)) and value.checked_as == name:
        return  # checked when the hub's start made it (shared_value): O(1), not O(nodes)
    key = _passed_key(name, value)
    if key is not None and key in _PASSED:
        return
    try:
        checks[name](value)
    except ValueError as e:
        raise HubConfigError(named(name, str(e))) from None
    if key is not None:
        if len(_PASSED) >= PASSED_KEPT:
            _PASSED.clear()
        _PASSED.add(key)


#: how many values of ``nodes`` and ``quotas`` that passed :func:`check_trait` are remembered
PASSED_KEPT = 32
#: (trait, the value as canonical JSON) of values that passed (a spawner is made per server
#: and spawn, and each one's traits are validated: the nodes' schema took about 1 ms with 42
#: nodes, most of a spawn's own work in the hub)
_PASSED: set[tuple[str, str]] = set()


def _passed_key(name: str, value: Any) -> tuple[str, str] | None:
    """What a passed check is remembered by: only ``nodes`` and ``quotas``, whose check reads
    nothing but the value (``profiles`` may name a file, ``backend`` a class to import);
    None for a value that is not plain JSON."""
    if name not in ("nodes", "quotas"):
        return None
    try:
        return name, json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return None


def named(name: str, text: str) -> str:
    """``GPUSpawner.<field>: <reason>`` from a check's message. The checks name the field from
    the trait down (``profiles[1] ...``, ``quotas.users...``, ``nodes[0] ...``); any other
    message (a profiles file's, the backend's) follows the trait's name."""
    if text.startswith((f"{name}[", f"{name}.", f"{name}:")):
        return f"GPUSpawner.{text}"
    return f"GPUSpawner.{name}: {text}"


def _read_only(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError("a GPUSpawner setting shared by every spawner of the hub is read-only; "
                    "set it in the hub's configuration")


class SharedList(list):  # type: ignore[type-arg]
    """A list setting of the hub's configuration that every spawner shares, read-only
    (:func:`shared_value`): ``copy.deepcopy`` and ``copy.copy`` return the same object, so
    traitlets' deep copy of each configuration value into each new spawner
    (``Configurable._load_config``) costs nothing; a change in place raises TypeError.
    Pickles as a plain list."""

    #: the trait whose check (:func:`check_trait`) this value passed when it was made
    checked_as = ""
    append = extend = insert = pop = remove = clear = sort = reverse = _read_only
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedList:
        return self

    def __copy__(self) -> SharedList:
        return self

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (list, (list(self),))


class SharedDict(dict):  # type: ignore[type-arg]
    """The mapping counterpart of :class:`SharedList` (a node entry and the mappings it
    holds): shared, read-only, copied as itself, pickled as a plain dict."""

    checked_as = ""
    pop = popitem = clear = update = setdefault = _read_only
    __setitem__ = __delitem__ = __ior__ = _read_only

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedDict:
        return self

    def __copy__(self) -> SharedDict:
        return self

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (dict, (dict(self),))


def _shared(value: Any) -> Any:
    """``value`` with its lists and dicts, all the way down, made Shared (new objects)."""
    if isinstance(value, Mapping):
        return SharedDict({k: _shared(v) for k, v in value.items()})
    if isinstance(value, list | tuple) and not isinstance(value, str):
        return SharedList(_shared(v) for v in value)
    return value


def shared_value(name: str, value: Any) -> Any:
    """``value`` of the ``nodes`` setting, checked (:func:`check_trait`) and made a read-only
    :class:`SharedList` of :class:`SharedDict` entries that remembers it passed: the hub's
    start puts it back in the configuration
    (:func:`~gpuspawner.hub.config_check.share_checked_settings`), so that a new spawner (one
    per server and spawn) takes it without traitlets' deep copy, the per-entry validation of
    ``List(Dict())`` and the check's JSON key, each O(nodes) (about 0.6 ms of CPU more per
    spawn for each 1,000 servers of benchmarks/hub_scale.py, where a node holds 24 servers).
    Other settings and values of other shapes (a lazy ``.append``, not JSON) come back as
    they were: ``quotas`` stays each spawner's own, since JupyterHub's ``group_overrides``
    merge a dict setting into the spawner's value in place.

    Raises:
        HubConfigError: the value does not pass :func:`check_trait`.
    """
    check_trait(name, value)
    if name != "nodes" or not isinstance(value, list) or _passed_key(name, value) is None:
        return value
    out = _shared(value)
    out.checked_as = name
    return out
