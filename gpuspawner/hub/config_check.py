"""Check gpuspawner's configuration when the hub starts, not at the first spawn.

JupyterHub applies ``c.GPUSpawner.*`` to a spawner only when it makes one (the first spawn or
the first restored server), so a typo in a profile would surface as a 500 for the first user.
:func:`check_hub_config`, called at the end of ``jupyterhub_config.py``, checks every structured
setting with the same code the spawner uses, reads each node's inventory once (the topology
files, or this host through sysfs and NVML) so that the first spawn does not, and raises
:class:`SystemExit` with the trait, the entry and the reason: ``jupyterhub`` stops at start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from traitlets import TraitError
from traitlets.config import LazyConfigValue
from traitlets.utils.importstring import import_item

from idle_culler.policies import PolicyError, PolicySet

from ..elastic.attach import attach_elastic
from ..elastic.config import ElasticConfigError
from ..placement import POLICIES
from ..usage.budgets import BudgetConfigError, parse_budgets
from ..usage.fairshare import attach_fairshare
from ..usage.hub import UsageConfigError, attach_usage
from ..usage.settings import GPUUsage
from .certs import private_keys_at_hub_start
from .cluster import Cluster, current_clusters, get_cluster
from .drains import DrainFileError
from .hub_id import hub_id as hub_id_of
from .images import (
    ImageOptionError,
    check_allowed_registries,
    check_deny_patterns,
    refuse_networks,
)
from .metrics import usage_counters
from .profiles import load_profiles
from .runtime import at_hub_start, loading_hub
from .settings import (
    HEALTH_TRAITS,
    QUEUE_TRAITS,
    SpawnerSettings,
    health_settings,
    hub_db_url,
    queue_settings,
    resolve_aliases,
)
from .spawn_queue import QueueFileError
from .start_slots import START_SLOT_TRAITS, check_start_slot_settings
from .state import prepare_state_dir, resolve_state_dir
from .trait_check import HubConfigError, check_trait, named, shared_value
from .volumes import VolumeConfigError, check_volume_settings

#: (HubConfigError and check_trait live in :mod:`gpuspawner.hub.trait_check`, below the
#: settings whose validators use them; importable from here as before)
__all__ = ["IGNORED_SPAWNER_OPTIONS", "HubConfigError", "check_culler_policies",
           "check_hub_config", "check_ignored_spawner_options", "check_internal_ssl",
           "check_spawner_settings", "check_trait", "culler_policies_path",
           "share_checked_settings"]


def _section(c: Any, name: str) -> Mapping[str, Any]:
    return c[name] if name in c else {}


def check_spawner_settings(settings: Mapping[str, Any], config: Any = None) -> Cluster:
    """Check ``GPUSpawner`` settings (a mapping of trait name to value; missing = default)
    and build the hub's cluster for them, reading every node's inventory now and making the
    backend from ``config`` (the whole traitlets ``Config``: its ``c.<Backend>.*`` section is
    validated by the backend's traits).

    Raises:
        HubConfigError: the first wrong setting, named ``GPUSpawner.<trait>`` or
            ``<Backend>.<trait>``.
    """
    defaults = SpawnerSettings.class_traits()  # GPUSpawner's own traits, their defaults

    def get(name: str) -> Any:
        return settings[name] if name in settings else defaults[name].default()

    policy = get("placement_policy")
    if policy not in POLICIES:
        raise HubConfigError(f"GPUSpawner.placement_policy: unknown policy {policy!r}; "
                             f"choose one of: {', '.join(POLICIES)}")
    for name in ("backend", "profiles", "quotas", "nodes"):
        check_trait(name, get(name))
    try:
        parse_budgets(get("usage_budgets"))
    except BudgetConfigError as e:
        raise HubConfigError(str(e)) from None
    if not isinstance(get("nodes"), list) or not get("nodes"):
        raise HubConfigError("GPUSpawner.nodes: must be a non-empty list of node entries")
    try:
        db_url = None
        if config is not None and "JupyterHub" in config and "db_url" in config.JupyterHub:
            db_url = str(config.JupyterHub.db_url)
        health = health_settings({n: settings[n] for n in HEALTH_TRAITS if n in settings},
                                 db_url)
        queue = queue_settings({n: settings[n] for n in QUEUE_TRAITS if n in settings}, db_url)
        check_start_slot_settings({n: settings[n] for n in START_SLOT_TRAITS if n in settings})
    except ValueError as e:
        raise HubConfigError(f"GPUSpawner.{e}") from None
    try:
        # the state folder 0700 and its files 0600 (the SQLite database made 0600 before
        # JupyterHub creates it): gpuspawner.hub.state
        changed = prepare_state_dir(str(get("state_dir") or ""), db_url or hub_db_url(),
                                    [health.drains_file, queue.file])
    except OSError as e:
        raise HubConfigError(f"GPUSpawner.state_dir: {e}") from None
    for line in changed:
        logging.getLogger("gpuspawner").info("state folder: %s", line)
    try:  # the site's mounts: gpuspawner.hub.volumes (a profile's parsed by load_profiles)
        check_volume_settings(get("volumes"), get("group_volumes"),
                              load_profiles(get("profiles")),
                              home_path_template=get("home_path_template"),
                              home_mount_point=get("home_mount_point"),
                              state_dir=resolve_state_dir(str(get("state_dir") or ""),
                                                          db_url or hub_db_url()),
                              backend=get("backend"))
    except VolumeConfigError as e:
        raise HubConfigError(str(e)) from None
    try:  # users' own images: gpuspawner.hub.images (a profile's checked by load_profiles)
        check_deny_patterns(get("image_deny_patterns"))
        check_allowed_registries(get("allowed_registries"))
    except ImageOptionError as e:
        raise HubConfigError(str(e)) from None
    if get("backend") == "slurm":
        offering = [p.slug for p in load_profiles(get("profiles")) if p.image_option]
        if offering:
            raise HubConfigError(
                f"GPUSpawner.profiles ({offering[0]}).profile_options.image: users' own images "
                "are not supported with the Slurm backend (its servers run as processes on "
                "the node, without a container image): remove the option")
    try:  # inside a hub: its id, made once in the state folder
        hub_id = hub_id_of(str(get("state_dir") or ""), db_url or hub_db_url())
    except (OSError, ValueError) as e:
        raise HubConfigError(f"GPUSpawner.state_dir: {e}") from None
    try:
        # builds the hub's cluster: every topology is read here, once, before any spawn; the
        # drains file is checked and applied to the new ledger
        return get_cluster(get("nodes"), policy, get("quotas"), get("profiles"),
                           get("backend"), config, health=health, queue=queue, hub_id=hub_id)
    except DrainFileError as e:
        raise HubConfigError(f"GPUSpawner.gpu_drains_file: {e}") from None
    except QueueFileError as e:
        raise HubConfigError(f"GPUSpawner.queue_file: {e}") from None
    except TraitError as e:  # a backend trait; the validators name it
        raise HubConfigError(str(e)) from None
    except ValueError as e:
        raise HubConfigError(named("nodes", str(e))) from None


def check_culler_policies(path: str) -> None:
    """Load the idle culler's policy file as the culler will (the ``culler-policies`` JSON
    Schema first, then the culler's conversions: :class:`idle_culler.policies.PolicySet`).

    Raises:
        HubConfigError: the file does not load: ``idle culler --policies <path>: <field>:
            <reason>``, e.g. ``... global.idle_timeout: 'soon' is not a duration ...``.
    """
    try:
        PolicySet.load(path)
    except PolicyError as e:
        text = str(e).removeprefix(f"{path}: ")  # the culler names the file itself
        raise HubConfigError(f"idle culler --policies {path}: {text}") from None


def culler_policies_path(service: Mapping[str, Any]) -> str | None:
    """The policy file of a JupyterHub service entry that runs the idle culler, or None.

    A service runs the culler when its command runs ``idle_culler`` (``python -m idle_culler``
    or the ``idle-culler`` script) or it is named ``idle-culler``; its file is the value of
    ``--policies`` (also written ``--policies=PATH`` or ``--IdleCuller.policies_file=PATH``,
    the culler's traitlets aliases, idle_culler/app.py), relative to the service's ``cwd``.
    """
    cmd = [str(a) for a in (service.get("command") or [])]
    runs_culler = service.get("name") == "idle-culler" or any(
        a == "idle_culler" or a.rsplit("/", 1)[-1] == "idle-culler" for a in cmd)
    if not runs_culler:
        return None
    path = None
    for i, arg in enumerate(cmd):
        for flag in ("--policies", "--IdleCuller.policies_file"):
            if arg == flag and i + 1 < len(cmd):
                path = cmd[i + 1]
            elif arg.startswith(flag + "="):
                path = arg[len(flag) + 1:]
    if not path:
        return None
    cwd = service.get("cwd")
    return os.path.join(cwd, path) if cwd else path


def check_internal_ssl(c: Any) -> None:
    """A backend whose servers share a network with other users' processes (Slurm jobs on a
    node) needs ``c.JupyterHub.internal_ssl = True``.

    Raises:
        HubConfigError: it is off (the message names both settings).
    """
    hub = _section(c, "JupyterHub")
    for cluster in current_clusters():
        backend = cluster.backend
        if backend.requires_internal_ssl and not hub.get("internal_ssl", False):
            name = type(backend).__name__
            raise HubConfigError(
                f"JupyterHub.internal_ssl: must be True with {name}: its servers share the "
                "node's network with other users' processes (docs/slurm-backend.md); "
                f"c.{name}.allow_plain_http = True allows it for a trusted test cluster")
        if (backend.requires_internal_ssl and hub.get("internal_ssl", False)
                and not proxy_checks_servers(hub.get("proxy_class", "configurable-http-proxy"))):
            name = type(backend).__name__
            raise HubConfigError(
                f'JupyterHub.proxy_class: must be "gpuspawner" with {name} and internal_ssl: '
                "any other proxy accepts for a server's route every certificate that names the "
                "node's address, so after a server exits another user who binds its port gets "
                "its requests (docs/slurm-backend.md, \"How the hub learns the port\")")


def proxy_checks_servers(proxy_class: Any) -> bool:
    """Whether ``c.JupyterHub.proxy_class`` (a class, an entry point name of
    ``jupyterhub.proxies`` or a dotted path) is :class:`gpuspawner.hub.proxy.GPUProxy` or a
    subclass, whose route accepts only its own server's certificate. A name that does not load
    is False."""
    cls = proxy_class
    if isinstance(proxy_class, str):
        found = [e for e in entry_points(group="jupyterhub.proxies") if e.name == proxy_class]
        try:
            cls = found[0].load() if found else import_item(proxy_class)
        except (ImportError, AttributeError, ValueError):
            return False
    return isinstance(cls, type) and any(
        f"{k.__module__}.{k.__qualname__}" == GPU_PROXY for k in cls.__mro__)


#: the proxy class whose route accepts only its own server's certificate (not imported here:
#: it needs jupyterhub, which this module does not)
GPU_PROXY = "gpuspawner.hub.proxy.GPUProxy"


#: JupyterHub ``Spawner`` options that GPUSpawner ignores, and the profile field that replaces
#: each (``c.GPUSpawner.profiles``): a server gets its profile's cores and memory, pinned
IGNORED_SPAWNER_OPTIONS = {"cpu_limit": "cpu", "cpu_guarantee": "cpu",
                           "mem_limit": "memory", "mem_guarantee": "memory"}


def check_ignored_spawner_options(c: Any) -> None:
    """Refuse a ``Spawner`` option that GPUSpawner ignores (:data:`IGNORED_SPAWNER_OPTIONS`),
    set on ``c.Spawner`` or ``c.GPUSpawner`` to anything but None (its default): the admin
    would believe it limits servers.

    Raises:
        HubConfigError: ``Spawner.mem_limit: GPUSpawner ignores it; ...`` naming the profile
            field that replaces it.
    """
    for section in ("Spawner", "GPUSpawner"):
        values = _section(c, section)
        for name, field in IGNORED_SPAWNER_OPTIONS.items():
            if name in values and values[name] is not None:
                raise HubConfigError(
                    f"{section}.{name}: GPUSpawner ignores it; set the profile field "
                    f"'{field}' of each profile in c.GPUSpawner.profiles instead (e.g. "
                    + ('{"slug": "gpu", "cpu": 8, ...}' if field == "cpu"
                       else '{"slug": "gpu", "memory": "64G", ...}')
                    + "): every server gets its profile's bundle")


def check_hub_config(c: Any) -> None:
    """Check the GPUSpawner settings of the config object ``c`` (and the idle culler's policy
    file against the ``culler-policies`` schema and the culler's own rules, when a service
    runs the culler with a policy file: :func:`culler_policies_path`); stop the hub with the
    reason when one is wrong. ``Spawner`` options GPUSpawner ignores are refused first
    (:func:`check_ignored_spawner_options`).

    Called while a hub loads its configuration files (the shipped file calls it), it checks
    nothing yet: it registers the check of the *final* configuration, after the last file
    (lines after ``load_subconfig``, a second file), which also builds the hub's one runtime
    (:mod:`gpuspawner.hub.runtime`). Called anywhere else, it checks ``c`` at once.

    Raises:
        SystemExit: ``gpuspawner configuration error: <trait>.<field>: <reason>`` (or
            ``idle culler --policies <file>: <field>: <reason>``).
    """
    app = loading_hub()
    if app is not None:  # a hub loading its files: check the final configuration, once
        private_keys_at_hub_start(app)  # internal_ssl keys never readable, even for a moment
        at_hub_start(app, _check_and_build_hub)
        return
    _check_and_build(c)


def _check_and_build_hub(c: Any) -> Cluster:
    """:func:`_check_and_build` at a hub's start: also the usage records (a check called by
    hand opens no database), and the checked ``nodes`` shared by every spawner
    (:func:`share_checked_settings`)."""
    cluster = _check_and_build(c, usage=True)
    share_checked_settings(c)
    return cluster


def share_checked_settings(c: Any) -> None:
    """Put ``c.GPUSpawner.nodes`` back into ``c`` as a read-only value every spawner shares
    (:func:`~gpuspawner.hub.trait_check.shared_value`): JupyterHub makes a spawner per server
    and spawn, and traitlets deep-copies and validates each of its configured values into it,
    O(nodes) per spawn for this one (the wiring's and a second file's lines are loaded before
    this runs: it sees the final value). ``quotas`` is left as it is: JupyterHub's
    ``group_overrides`` merge into each spawner's own copy.

    Raises:
        SystemExit: a value that does not pass its check (as :func:`check_hub_config`).
    """
    section = _section(c, "GPUSpawner")
    try:
        if "nodes" in section:
            section["nodes"] = shared_value("nodes", section["nodes"])
    except HubConfigError as e:
        raise SystemExit(f"gpuspawner configuration error: {e}") from None


def _usage(cluster: Cluster, c: Any, settings: Mapping[str, Any]) -> None:
    """Usage records (``c.GPUUsage``, :func:`gpuspawner.usage.hub.attach_usage`) on the
    hub's ledger, before anything is booked; each closed record counts in the usage
    counters (:func:`gpuspawner.hub.metrics.usage_counters`) and, with
    ``c.GPUSpawner.fairshare_half_life``, feeds the wait queue's fair share
    (:func:`gpuspawner.usage.fairshare.attach_fairshare`). Raises HubConfigError naming the
    setting."""
    hub = _section(c, "JupyterHub")
    try:
        recorder = attach_usage(cluster, c, str(settings.get("state_dir") or ""),
                                str(hub["db_url"]) if "db_url" in hub else hub_db_url())
    except UsageConfigError as e:
        raise HubConfigError(str(e)) from None
    if recorder is None:
        return
    counters = usage_counters(bool(GPUUsage(config=c).metrics_user_label))
    if counters.count not in recorder.on_close:
        recorder.on_close.append(counters.count)
    counters.open_intervals = recorder.open_intervals
    attach_fairshare(cluster, recorder)


def _elastic(cluster: Cluster, c: Any) -> None:
    """Elastic nodes (``c.GPUElastic``, :func:`gpuspawner.elastic.attach_elastic`) on the
    hub's cluster, before anything is restored (once per cluster). Raises HubConfigError
    naming the setting."""
    if cluster.elastic is not None:
        return
    hub = _section(c, "JupyterHub")
    db_url = str(hub["db_url"]) if "db_url" in hub else hub_db_url()
    state_dir = str(_section(c, "GPUSpawner").get("state_dir") or "")
    try:
        attach_elastic(cluster, c, resolve_state_dir(state_dir, db_url))
    except ElasticConfigError as e:
        raise HubConfigError(str(e)) from None


def _check_and_build(c: Any, usage: bool = False) -> Cluster:
    """:func:`check_hub_config`'s checks on ``c`` now; the cluster they built. ``usage``:
    also open the usage database and record on the cluster's ledger (:func:`_usage`).

    Raises:
        SystemExit: as :func:`check_hub_config`.
    """
    try:
        check_ignored_spawner_options(c)
        # profile_list, read_only_volumes: KubeSpawner's and DockerSpawner's names
        spawner_settings = resolve_aliases(_section(c, "GPUSpawner"))
        cluster = check_spawner_settings(spawner_settings, c)
        if usage:
            _usage(cluster, c, spawner_settings)
        _elastic(cluster, c)
        # users' own images: no registry in the servers' networks (gpuspawner.hub.images)
        refuse_networks([str(getattr(cluster.backend, "server_network_pool", "") or ""),
                         *(rt.network_pool for rt in cluster.nodes.values())])
        check_internal_ssl(c)
        services = c.JupyterHub.services if "services" in _section(c, "JupyterHub") else []
        if isinstance(services, LazyConfigValue):  # only .append()ed to, never assigned
            services = services.get_value([])
        for svc in services:
            path = culler_policies_path(svc) if isinstance(svc, Mapping) else None
            if path:
                check_culler_policies(path)
    except HubConfigError as e:
        raise SystemExit(f"gpuspawner configuration error: {e}") from None
    return cluster
