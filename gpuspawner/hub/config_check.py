"""Check gpuspawner's configuration when the hub starts, not at the first spawn.

JupyterHub applies ``c.GPUSpawner.*`` to a spawner only when it makes one (the first spawn or
the first restored server), so a typo in a profile would surface as a 500 for the first user.
:func:`check_hub_config`, called at the end of ``jupyterhub_config.py``, checks every structured
setting with the same code the spawner uses, reads each node's inventory once (the topology
files, or this host through sysfs and NVML) so that the first spawn does not, and raises
:class:`SystemExit` with the trait, the entry and the reason: ``jupyterhub`` stops at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traitlets.config import LazyConfigValue


class HubConfigError(ValueError):
    """A wrong gpuspawner setting; the message starts with the trait, e.g.
    ``GPUSpawner.profiles: profiles[1].gpus: must be a number >= 0, got 'two'``."""


def _section(c: Any, name: str) -> Mapping[str, Any]:
    return c[name] if name in c else {}


def check_trait(name: str, value: Any) -> None:
    """Check one structured GPUSpawner setting (``backend``, ``profiles``, ``quotas``,
    ``nodes``; nodes by structure only) with the code the hub uses.
    The spawner's trait validator and :func:`check_spawner_settings` both call it.

    Raises:
        HubConfigError: ``GPUSpawner.<name>: <entry>: <reason>``.
    """
    from ..backends.base import backend_class
    from .cluster import check_node_entries, check_quotas
    from .profiles import load_profiles

    checks = {"profiles": load_profiles, "quotas": check_quotas, "nodes": check_node_entries,
              "backend": backend_class}
    try:
        checks[name](value)
    except ValueError as e:
        raise HubConfigError(f"GPUSpawner.{name}: {e}") from None


def check_spawner_settings(settings: Mapping[str, Any], config: Any = None) -> None:
    """Check ``GPUSpawner`` settings (a mapping of trait name to value; missing = default)
    and build the hub's cluster for them, reading every node's inventory now and making the
    backend from ``config`` (the whole traitlets ``Config``: its ``c.<Backend>.*`` section is
    validated by the backend's traits).

    Raises:
        HubConfigError: the first wrong setting, named ``GPUSpawner.<trait>`` or
            ``<Backend>.<trait>``.
    """
    from traitlets import TraitError

    from ..placement import POLICIES
    from .cluster import get_cluster
    from .spawner import GPUSpawner

    defaults = GPUSpawner.class_traits()

    def get(name: str) -> Any:
        return settings[name] if name in settings else defaults[name].default()

    policy = get("placement_policy")
    if policy not in POLICIES:
        raise HubConfigError(f"GPUSpawner.placement_policy: unknown policy {policy!r}; "
                             f"choose one of: {', '.join(POLICIES)}")
    for name in ("backend", "profiles", "quotas", "nodes"):
        check_trait(name, get(name))
    if not isinstance(get("nodes"), list) or not get("nodes"):
        raise HubConfigError("GPUSpawner.nodes: must be a non-empty list of node entries")
    try:
        # builds the hub's cluster: every topology is read here, once, before any spawn
        get_cluster(get("nodes"), policy, get("quotas"), get("profiles"), get("backend"),
                    config)
    except TraitError as e:  # a backend trait; the validators name it
        raise HubConfigError(str(e)) from None
    except ValueError as e:
        raise HubConfigError(f"GPUSpawner.nodes: {e}") from None


def check_culler_policies(path: str) -> None:
    """Load the idle culler's policy file as the culler will.

    Raises:
        HubConfigError: the file does not load, named with its path and entry.
    """
    from idle_culler.policies import PolicyError, PolicySet

    try:
        PolicySet.load(path)
    except PolicyError as e:
        raise HubConfigError(f"idle culler --policies {path}: {e}") from None


def check_hub_config(c: Any) -> None:
    """Check the GPUSpawner settings of the config object ``c`` (and the idle culler's policy
    file, when an ``idle-culler`` service with ``--policies`` is configured); stop the hub with
    the reason when one is wrong.

    Raises:
        SystemExit: ``gpuspawner configuration error: <trait>: <entry>: <reason>``.
    """
    try:
        check_spawner_settings(_section(c, "GPUSpawner"), c)
        services = c.JupyterHub.services if "services" in _section(c, "JupyterHub") else []
        if isinstance(services, LazyConfigValue):  # only .append()ed to, never assigned
            services = services.get_value([])
        for svc in services:
            cmd = list(svc.get("command") or [])
            if svc.get("name") == "idle-culler" and "--policies" in cmd:
                check_culler_policies(cmd[cmd.index("--policies") + 1])
    except HubConfigError as e:
        raise SystemExit(f"gpuspawner configuration error: {e}") from None
