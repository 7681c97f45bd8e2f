"""The configurable settings of :class:`~gpuspawner.hub.spawner.GPUSpawner` (``c.GPUSpawner.*``)
and who its servers run as: traits with their validators (checked when the hub starts, see
:mod:`gpuspawner.hub.config_check`), uid/gid from ``auth_state``, ``uid_map`` or the defaults,
and the user's home on the shared file system."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jupyterhub.traitlets import ByteSpecification
from tornado import web
from traitlets import (
    Bool,
    Callable,
    Dict,
    Enum,
    Float,
    HasTraits,
    Int,
    List,
    TraitError,
    Unicode,
    Union,
    observe,
    validate,
)

from ..inventory.health import DEFAULT_XIDS, HealthThresholds
from ..placement import DEFAULT_POLICY, POLICIES
from ..placement.units import parse_seconds
from ..usage.budgets import BudgetConfigError, parse_budgets
from .cluster import GPUHealthSettings
from .drains import DRAINS_FILE_NAME
from .identity import home_path, ids_from_auth_state
from .profiles import PROFILES_HELP, ProfileConfigError, resolve_profile_list
from .spawn_queue import QUEUE_FILE_NAME, QueueSettings
from .start_slots import START_SLOT_TRAITS, check_start_slot_settings
from .state import state_file
from .trait_check import HubConfigError, SharedList, check_trait
from .user_options import check_user_options
from .volumes import VolumeConfigError, fold_read_only_volumes


class SharedNodes(List):  # type: ignore[type-arg]
    """``List(Dict())`` that takes the hub's shared, already checked value
    (:class:`~gpuspawner.hub.trait_check.SharedList`, made at the hub's start) as it is,
    without validating each entry again for every new spawner (O(nodes) per spawn)."""

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, SharedList):
            return value
        return super().validate(obj, value)


class SpawnerSettings(HasTraits):
    """GPUSpawner's own traits (configured as ``c.GPUSpawner.*``). Expects the spawner's
    ``user``, ``user_options``, ``group_names`` and ``escaped_name``.

    A ``HasTraits`` mixin, not a ``Configurable``: traitlets gives every ``Configurable``
    class in a configured class's MRO a section of its own, so ``jupyterhub
    --generate-config`` printed each option twice (``c.SpawnerSettings.*`` beside
    ``c.GPUSpawner.*``). Its traits are configured through GPUSpawner only."""

    _uid_gid: tuple[int, int] | None = None
    _options_refusal: web.HTTPError | None = None

    backend = Unicode("docker", help="""What runs servers: "docker" (DockerBackend, configured
        as c.DockerBackend.*), "slurm" (SlurmBackend, c.SlurmBackend.*, docs/slurm-backend.md)
        or a dotted Backend class path.""").tag(config=True)
    profiles = Union([List(Dict()), Unicode(), Callable()], default_value=[
        {"slug": "cpu", "display_name": "CPU only", "cpu": 1, "memory": "1G", "default": True}],
        help=PROFILES_HELP).tag(config=True)
    profile_list = Union([List(Dict()), Unicode(), Callable()], default_value=None,
                         allow_none=True, help="""KubeSpawner's name of ``profiles`` (an alias:
        set one of them). KubeSpawner's entry shape is accepted in both
        (docs/howto/user-images.md); a callable is refused at hub start.""").tag(config=True)
    nodes = SharedNodes(Dict(), default_value=[
        {"name": "local", "docker_url": "", "topology": "auto"}],
        help="""Nodes servers may run on: dicts with name, topology ("auto" = read this
        host with sysfs and NVML, or a topology YAML file), host (where its servers are reached
        with host networking; default 127.0.0.1), docker_url and network_pool (Docker backend).
        """).tag(config=True)
    placement_policy = Enum(list(POLICIES), default_value=DEFAULT_POLICY, help=(
        f"Node-selection policy, one of: {', '.join(POLICIES)} (docs/placement.md).")
    ).tag(config=True)
    quotas = Dict(help="""Quotas: {"users": {name: q}, "groups": {name: q}, "default_user": q}
        where q has gpus (GPUs, fractions allowed; or gpu_milli in milli-GPU), cores (logical
        CPUs), memory and disk (bytes, or sizes like "64G") and servers (running servers); a
        limit left out is unlimited. A group quota caps what all members hold together.
        Checked in the same atomic step as the reservation.""").tag(config=True)
    usage_budgets = Dict(help="""Usage budgets (docs/usage.md "Budgets"): {"default": b,
        "users": {name: b}, "groups": {name: b}} where b is {"period": "week" or "month",
        "gpu_hours": h, "core_hours": h} (at least one of the two, > 0). Periods start at
        Monday or the 1st, 00:00 in c.GPUUsage.time_zone. A user's own budget replaces the
        default; a group's counts all its members together. A spawn or notebook job that
        would start while one of its owner's budgets is used up is refused, naming the budget,
        its use and when it renews; holders of the scope custom:gpuspawner:budget-exempt
        never are. Needs usage records (c.GPUUsage.enabled).""").tag(config=True)
    image = Unicode("gpuspawner/singleuser:latest",
                    help="Image of servers whose profile names none.").tag(config=True)
    restart_on_node_failure = Bool(True, help="""Restart a server on another node when its
        node fails (its engine does not answer, the node is down or drained, or one of its
        GPUs is drained as unhealthy): the same profile, options and image, a new bundle
        from the ledger (through the wait queue when nothing is free), the user's URL routed
        to it. Files in the shared home survive; running kernels do not. A profile's
        ``restart_on_node_failure`` overrides this (docs/howto/node-failure.md).""").tag(
        config=True)
    restart_limit = Int(3, help="""Restarts elsewhere of one server within an hour; past it
        the server is stopped as before (a flapping node cannot bounce a server around).
        """).tag(config=True)
    restart_backoff = Float(30.0, help="""Seconds before a server that was just moved may be
        moved again, doubled for each move within the hour (30 s, 60 s, 120 s, ...); a
        failure sooner stops the server instead.""").tag(config=True)
    image_deny_patterns = List(Unicode(), help="""Images no user may type as their own
        (``image--unlisted-choice`` of a profile's ``profile_options.image``): Python regular
        expressions matched against the whole reference, as typed and in its normalised form
        (``docker.io/library/ubuntu:latest``), e.g. ``["docker\\.io/.*", ".*:latest"]``.
        Checked at hub start (docs/howto/user-images.md).""").tag(config=True)
    allowed_registries = List(Unicode(), help="""Registries of users' own images that are on
        the hub's host or in the hub's or servers' networks and may be pulled from all the
        same: ``host`` (any port) or ``host:port``, e.g. ``["127.0.0.1:17010"]`` (the
        project's test registry). Without it, a reference whose registry is loopback,
        link-local, in 198.18.0.0/15 or the servers' network pools, ``localhost`` or this
        host's name is refused (HTTP 400
        naming ``image--unlisted-choice``): the engine would send requests to the hub's own
        services for the user. Checked at hub start (docs/howto/user-images.md).""").tag(
        config=True)
    image_check_timeout = Float(60.0, help="""Seconds the check of a user's own image may
        take on a node (pull, then ``jupyterhub-singleuser --version`` in a throwaway
        container without network or devices); longer is a refusal.""").tag(config=True)
    image_max_bytes = ByteSpecification(0, help="""Largest user's own image (bytes, or "20G"):
        a pull stops once the layers it announced pass it, an image already on the node is
        refused when its size does (HTTP 400 naming image); 0 = no limit. Profile images are
        the admin's and are not checked.""").tag(config=True)
    home_path_template = Unicode("", help="""Host path of the user's home on the shared file
        system, e.g. "/shared/home/{username}" ({username}: the escaped user name). Created when
        missing, owned by the user's uid/gid, mounted at home_mount_point. Empty = none.
        """).tag(config=True)
    home_mount_point = Unicode("/home/{username}", help="Where the home is mounted in the "
                               "server; also its HOME.").tag(config=True)
    volumes = Dict(help="""Folders of the node mounted into every server and notebook job,
        beside the home (shared datasets, software), in DockerSpawner's shape:
        {host_path: container_path} or {host_path: {"bind": container_path, "mode": "ro"|"rw"}}
        (mode left out: rw; {username}: the escaped user name). "ro" is enforced by the
        engine. Checked at hub start: absolute paths without "..", an untemplated host
        folder must exist, never the Docker socket, the hub's state folder, another user's home
        or the folder of all homes (docs/data-mounts.md). Not with the Slurm backend. A
        profile's "volumes" add to these.""").tag(config=True)
    read_only_volumes = Dict(help="""DockerSpawner's read_only_volumes: {host_path:
        container_path}, each mounted read-only; the same as a ``volumes`` entry
        {host_path: {"bind": container_path, "mode": "ro"}} (a host path may be in only one of
        the two). Checked at hub start with ``volumes``.""").tag(config=True)
    group_volumes = Dict(help="""Mounts only members of a JupyterHub group get (a project
        folder per group): {group: volumes}, each value in the shape of ``volumes``;
        {group} in a path is the group's name, {username} the escaped user name.
        """).tag(config=True)
    uid_map = Union([Dict(), Callable()], default_value={}, help="""uid/gid for users whose
        authenticator gives none in auth_state: {username: {"uid": N, "gid": M}} or a
        callable(spawner) returning (uid, gid).""").tag(config=True)
    default_uid = Int(1000, help="uid when neither auth_state nor uid_map give one.").tag(
        config=True)
    default_gid = Int(100, help="gid when neither auth_state nor uid_map give one.").tag(
        config=True)
    user_options_max_bytes = Int(4096, help="""Largest user_options (as JSON, bytes) accepted;
        larger ones are refused with HTTP 400 before the hub stores them.""").tag(config=True)

    state_dir = Unicode("", help="""Folder of gpuspawner's state on the hub's machine: the
        wait queue (gpuspawner-queue.json) and the GPU drains (gpuspawner-drains.json), unless
        queue_file / gpu_drains_file name other files. When the hub starts (the configuration
        check) it is made mode 0700 if missing, a folder named here is tightened to 0700, and
        its state files are made 0600, the hub's SQLite database too when it lives here (made
        empty with 0600 before JupyterHub creates it). Empty (default) = the folder of the
        hub's SQLite database (JupyterHub.db_url), else the hub's working directory (left at
        its mode). gpuspawner.hub.state.""").tag(config=True)
    gpu_drains_file = Unicode("", help="""JSON file that keeps drained GPUs (an admin's
        drain-gpu and the health check's) across hub restarts. Empty = gpuspawner-drains.json
        in state_dir. Its folder must exist and be writable; checked when the hub starts.
        """).tag(config=True)
    gpu_health_interval = Float(60.0, help="""Seconds between two health readings of this
        host's GPUs (nodes with topology "auto"): NVML ECC counts, retired pages, remapped
        rows and XID events (gpuspawner.inventory.health); an unhealthy GPU is drained. Read
        in a worker thread when a spawn or a service request refreshes node health. 0 = off.
        """).tag(config=True)
    gpu_health_xids = List(Int(), default_value=sorted(DEFAULT_XIDS), help="""XIDs that
        make a GPU unhealthy (NVIDIA's XID catalog; default 48, 63, 64, 74, 79, 92, 94, 95).
        """).tag(config=True)
    gpu_health_max_uncorrected_ecc = Int(0, help="""Volatile uncorrected ECC errors a GPU
        may have and stay healthy.""").tag(config=True)
    gpu_health_max_retired_pages = Int(59, help="""Pages retired for double-bit ECC errors a
        GPU may have and stay healthy.""").tag(config=True)
    gpu_share_mode = Enum(["auto", "dmem", "mps", "mps-daemon", "watchdog"],
                          default_value="auto", help="""What holds a GPU share (a profile's
        gpus below 1) on the device, for every node whose entry in nodes sets no gpu_share
        (docs/gpu-sharing.md):
        "auto" takes the kernel's cgroup dmem controller (each server's share of the GPU's
        memory as its cgroup's dmem.max) where the node's kernel and driver have it, else
        the watchdog; "mps" needs the MPS control daemon running (its pipe directory
        /tmp/nvidia-mps) and gives each server CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE from its share; "mps-daemon": the same limits, with
        one MPS control daemon per shared GPU that gpuspawner runs itself, a container each
        (c.DockerBackend.mps_daemon_image); "watchdog": per-process GPU memory
        watched only. Chosen per node when the hub starts ("dmem" or "mps" on a node without
        it stops the hub naming the node) and shown on the admin map.""").tag(config=True)
    gpu_share_grace = Float(60.0, help="""Seconds a GPU share may use more GPU memory than
        its share before the watchdog interrupts its largest kernel (SIGINT: the running cell
        stops, the kernel and the server stay); the share is warned when first seen over.
        """).tag(config=True)
    gpu_share_interval = Float(5.0, help="""Seconds between two passes of the GPU share
        watchdog over the shares on this host's nodes (NVML per-process memory). 0 = off.
        """).tag(config=True)

    queue_file = Unicode("", help="""JSON file that keeps the wait queue across hub restarts
        (the order, the waiting spawns' user_options). Empty = gpuspawner-queue.json in
        state_dir. Its folder must exist and be writable; checked when the hub starts.
        """).tag(config=True)
    queue_timeout = Float(4 * 3600.0, help="""Seconds a spawn may wait in the queue for its
        bundle (profiles with queue: true); then it fails with the reason. This wait is not
        counted in Spawner.start_timeout.""").tag(config=True)
    queue_max_bypass = Int(3, help="""How many later, smaller spawns may start ahead of a
        blocked spawn at the head of the queue on the nodes that could take it, before the one
        of those nodes that lacks the least to hold it is reserved for it (bounded backfill;
        0 = reserve at once).""").tag(config=True)
    queue_group_weights = Dict(help="""Fair-share weights of JupyterHub groups in the queue's
        dominant-resource-fairness order, {group: weight > 0}; a user's weight is the largest
        of the user's groups, else 1.""").tag(config=True)
    queue_restore_grace = Float(300.0, help="""Seconds an entry restored after a hub restart
        keeps its place while its server is spawned again.""").tag(config=True)
    queue_priority = Int(0, help="""Priority of the servers' spawns in the wait queue, which
        notebook jobs share (c.GPUJobs.queue_priority is theirs): every waiting request of a
        higher priority starts before any of a lower one; fairness (DRF) orders requests of
        one priority. 0 for both by default (one fair order); e.g.
        c.GPUJobs.queue_priority = -1 lets interactive servers go first.""").tag(config=True)

    node_concurrent_starts = Int(-1, help="""Servers that may start at once on one node: the
        rest wait in order ("Waiting to start" in their progress) until a start ends (its server
        answers or fails). A start costs a few CPU seconds; started all at once on a small node
        they share the CPUs and all answer late together. -1 (default): the node's logical CPUs;
        0: no limit; n: at most n. A user's starts do not follow each other while others wait.
        See docs/benchmarks.md ("Start slots").""").tag(config=True)
    node_start_slot_timeout = Float(30.0, help="""Seconds a start holds its node's start slot
        at most (c.GPUSpawner.node_concurrent_starts): then the slot goes to the next waiting
        start while this one goes on, so a server that never answers holds no slot for the whole
        Spawner.http_timeout.""").tag(config=True)

    fairshare_half_life = Union([Float(), Unicode()], default_value=7 * 86400.0,
                                allow_none=True, help="""Fair share over time in the wait
        queue's order: each user's past GPU usage (from the usage records, c.GPUUsage) counts
        with this half-life, as Slurm's PriorityDecayHalfLife: seconds, or a duration such as
        "7d", "12h", "30m". A user who used more GPU-hours lately waits behind one who used
        fewer, at equal holdings now. 0 or None = off: the order weighs only what users hold
        now (DRF).""").tag(config=True)

    def queue_settings(self, db_url: str | None = None) -> QueueSettings:
        """The ``queue_*`` traits as :class:`~gpuspawner.hub.spawn_queue.QueueSettings`."""
        return queue_settings({name: getattr(self, name) for name in QUEUE_TRAITS}, db_url)

    def gpu_health_settings(self, db_url: str | None = None) -> GPUHealthSettings:
        """The ``gpu_*`` traits as :class:`~gpuspawner.hub.cluster.GPUHealthSettings`; an
        empty ``gpu_drains_file`` resolves in ``state_dir``, by default beside ``db_url`` (the
        hub's; None: read from the running hub when there is one)."""
        return health_settings({name: getattr(self, name) for name in HEALTH_TRAITS}, db_url)

    @validate("queue_timeout", "queue_max_bypass", "queue_group_weights",
              "queue_restore_grace", "fairshare_half_life")
    def _validate_queue(self, proposal: Any) -> Any:
        try:
            queue_settings({proposal.trait.name: proposal.value})
        except ValueError as e:
            raise TraitError(f"GPUSpawner.{e}") from None
        return proposal.value

    @validate(*START_SLOT_TRAITS)
    def _validate_start_slots(self, proposal: Any) -> Any:
        try:
            check_start_slot_settings({proposal.trait.name: proposal.value})
        except ValueError as e:
            raise TraitError(f"GPUSpawner.{e}") from None
        return proposal.value

    @validate("backend", "profiles", "nodes", "quotas")
    def _validate_structured(self, proposal: Any) -> Any:
        try:
            check_trait(proposal.trait.name, proposal.value)
        except HubConfigError as e:
            raise TraitError(str(e)) from None
        return proposal.value

    @validate("usage_budgets")
    def _validate_usage_budgets(self, proposal: Any) -> Any:
        try:
            parse_budgets(proposal.value)
        except BudgetConfigError as e:
            raise TraitError(str(e)) from None
        return proposal.value

    @validate("volumes")
    def _validate_volumes(self, proposal: Any) -> Any:
        """``read_only_volumes`` folded in (:func:`~gpuspawner.hub.volumes.
        fold_read_only_volumes`), whichever of the two is set first."""
        try:
            return fold_read_only_volumes(proposal.value, self.read_only_volumes)
        except VolumeConfigError as e:
            raise TraitError(str(e)) from None

    @observe("read_only_volumes")
    def _read_only_volumes_changed(self, change: Any) -> None:
        old = change.old if isinstance(change.old, dict) else {}  # Undefined at first
        self.volumes = {k: v for k, v in self.volumes.items() if k not in old}

    @validate("profile_list")
    def _validate_profile_list(self, proposal: Any) -> Any:
        """``profile_list`` is ``profiles`` under KubeSpawner's name: checked as it, then set
        as it."""
        if proposal.value is None:
            return None
        try:
            check_trait("profiles", proposal.value)
        except HubConfigError as e:
            raise TraitError(str(e).replace("GPUSpawner.profiles", "GPUSpawner.profile_list",
                                            1)) from None
        self.profiles = proposal.value
        return proposal.value

    @validate("user_options")
    def _validate_user_options(self, proposal: Any) -> dict[str, Any]:
        """Keep refused options out of memory too (the REST model echoes them): a refused
        value leaves the previous one in place; apply_user_options / start raise the refusal."""
        try:
            check_user_options(proposal.value, self.profiles, self.group_names,
                               self.user_options_max_bytes, self.image_deny_patterns,
                               self.allowed_registries)
        except web.HTTPError as e:
            self._options_refusal = e
            return dict(self.user_options or {})
        except Exception:  # profiles that do not load: start() reports it with the field
            pass
        self._options_refusal = None
        return proposal.value


    async def run_auth_state_hook(self, auth_state: dict[str, Any] | None) -> None:
        """Take uid/gid from ``auth_state`` (:func:`ids_from_auth_state`), then run the hook."""
        self._uid_gid = ids_from_auth_state(auth_state)
        await super().run_auth_state_hook(auth_state)

    def user_ids(self) -> tuple[int, int]:
        """(uid, gid) the server runs as: auth_state, then uid_map, then the defaults."""
        if self._uid_gid is not None:
            return self._uid_gid
        if callable(self.uid_map):
            uid, gid = self.uid_map(self)
            return int(uid), int(gid)
        entry = self.uid_map.get(self.user.name)
        if entry:
            return int(entry["uid"]), int(entry.get("gid", entry["uid"]))
        return self.default_uid, self.default_gid

    def home_host_path(self) -> str | None:
        """The user's home on the host, or None. Raises web.HTTPError(500) if the template
        escapes its base folder."""
        try:
            return home_path(self.home_path_template, self.escaped_name)
        except ValueError as e:
            raise web.HTTPError(500, str(e)) from None



#: the GPUSpawner traits of GPU health and drains
HEALTH_TRAITS = ("state_dir", "gpu_drains_file", "gpu_health_interval", "gpu_health_xids",
                 "gpu_health_max_uncorrected_ecc", "gpu_health_max_retired_pages",
                 "gpu_share_mode", "gpu_share_grace", "gpu_share_interval")


def spawner_values(app: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The hub spawner class's trait values ``names`` from the hub application's
    configuration, as traitlets resolves them for that class: the sections of its MRO, the
    most derived last, over the traits' defaults. For code in the hub process that is no
    spawner (the REST service, notebook jobs)."""
    cls = app.spawner_class
    traits = cls.class_traits()
    values: dict[str, Any] = {name: traits[name].default() for name in names}
    for klass in reversed(cls.mro()):
        section = klass.__name__
        if section in app.config:
            for name in values:
                if name in app.config[section]:
                    values[name] = app.config[section][name]
            if "profiles" in values and app.config[section].get("profile_list") is not None:
                # KubeSpawner's name (an alias; both set is refused at hub start)
                values["profiles"] = app.config[section]["profile_list"]
            if "volumes" in values and app.config[section].get("read_only_volumes"):
                # DockerSpawner's read-only mounts (a clash is refused at hub start)
                values["volumes"] = fold_read_only_volumes(
                    values["volumes"], app.config[section]["read_only_volumes"])
    return values


def resolve_aliases(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``c.GPUSpawner`` section (trait name -> value) with KubeSpawner's and DockerSpawner's
    names resolved: ``profile_list`` as ``profiles``, ``read_only_volumes`` folded into
    ``volumes`` (:func:`~gpuspawner.hub.volumes.fold_read_only_volumes`).

    Raises:
        HubConfigError: ``profiles`` and ``profile_list`` both set; ``read_only_volumes``
            malformed or sharing a host path with ``volumes`` (the field named).
    """
    try:
        out = resolve_profile_list(settings)
        if out.get("read_only_volumes"):
            out["volumes"] = fold_read_only_volumes(out.get("volumes") or {},
                                                    out["read_only_volumes"])
    except (ProfileConfigError, VolumeConfigError) as e:
        raise HubConfigError(str(e) if str(e).startswith("GPUSpawner.")
                             else f"GPUSpawner.{e}") from None
    return out


def hub_db_url() -> str | None:
    """The running hub's ``db_url``, or None outside a hub."""
    try:
        from jupyterhub.app import JupyterHub
    except ImportError:  # pragma: no cover
        return None
    return str(JupyterHub.instance().db_url) if JupyterHub.initialized() else None


def health_settings(values: dict[str, Any], db_url: str | None = None) -> GPUHealthSettings:
    """:class:`~gpuspawner.hub.cluster.GPUHealthSettings` from ``GPUSpawner`` trait values
    (missing ones take the traits' defaults). Raises ValueError for a negative interval."""
    traits = SpawnerSettings.class_traits()

    def get(name: str) -> Any:
        return values[name] if name in values else traits[name].default()

    interval = float(get("gpu_health_interval"))
    if interval < 0:
        raise ValueError(f"gpu_health_interval: must be >= 0 seconds, got {interval}")
    for name in ("gpu_share_grace", "gpu_share_interval"):
        if float(get(name)) < 0:
            raise ValueError(f"{name}: must be >= 0 seconds, got {get(name)}")
    path = str(get("gpu_drains_file") or "") or state_file(
        str(get("state_dir") or ""), db_url or hub_db_url(), DRAINS_FILE_NAME)
    return GPUHealthSettings(
        drains_file=path, interval_s=interval,
        thresholds=HealthThresholds(
            max_uncorrected_ecc=int(get("gpu_health_max_uncorrected_ecc")),
            max_retired_pages_dbe=int(get("gpu_health_max_retired_pages")),
            xids=frozenset(int(x) for x in get("gpu_health_xids"))),
        share_mode=str(get("gpu_share_mode")), share_grace_s=float(get("gpu_share_grace")),
        share_interval_s=float(get("gpu_share_interval")))


#: the GPUSpawner traits of the wait queue
QUEUE_TRAITS = ("state_dir", "queue_file", "queue_timeout", "queue_max_bypass",
                "queue_group_weights", "queue_restore_grace", "fairshare_half_life")


def queue_settings(values: dict[str, Any], db_url: str | None = None) -> QueueSettings:
    """:class:`~gpuspawner.hub.spawn_queue.QueueSettings` from ``GPUSpawner`` trait values
    (missing ones take the traits' defaults; an empty file resolves in ``state_dir``, by
    default beside ``db_url``: :func:`~gpuspawner.hub.state.state_file`).

    Raises:
        ValueError: a timeout or grace <= 0, a negative bypass, a weight that is not a
            number > 0, a ``fairshare_half_life`` that is not a duration >= 0 (seconds or
            e.g. ``"7d"``); the message starts with the trait, e.g.
            ``queue_group_weights.students: must be a number > 0, got 0``.
    """
    traits = SpawnerSettings.class_traits()

    def get(name: str) -> Any:
        return values[name] if name in values else traits[name].default()

    for name in ("queue_timeout", "queue_restore_grace"):
        if not float(get(name)) > 0:
            raise ValueError(f"{name}: must be > 0 seconds, got {get(name)}")
    if int(get("queue_max_bypass")) < 0:
        raise ValueError(f"queue_max_bypass: must be >= 0, got {get('queue_max_bypass')}")
    weights = dict(get("queue_group_weights") or {})
    for group, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
            raise ValueError(f"queue_group_weights.{group}: must be a number > 0, got {w!r}")
    half_life = get("fairshare_half_life")
    try:
        half_life_s = 0.0 if half_life is None else parse_seconds(half_life)
    except ValueError as e:
        raise ValueError(f"fairshare_half_life: {e}") from None
    path = str(get("queue_file") or "") or state_file(
        str(get("state_dir") or ""), db_url or hub_db_url(), QUEUE_FILE_NAME)
    return QueueSettings(file=path, timeout_s=float(get("queue_timeout")),
                         max_bypass=int(get("queue_max_bypass")),
                         group_weights={g: float(w) for g, w in weights.items()},
                         restore_grace_s=float(get("queue_restore_grace")),
                         fairshare_half_life_s=half_life_s)
