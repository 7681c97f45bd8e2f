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
from typing import Any

from ..backends.base import backend_class
from .cluster import check_node_entries, check_quotas
from .profiles import load_profiles

__all__ = ["HubConfigError", "check_trait"]


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
