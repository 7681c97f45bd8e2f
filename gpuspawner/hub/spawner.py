"""GPUSpawner: a DockerSpawner that asks the placement ledger for an atomic CPU/GPU/RAM/disk
bundle before anything starts, and pins the container to exactly those devices.

Lifecycle (start): validate ``user_options`` -> reserve in the ledger (quota checked in the same
step) -> create a *new* container with ``device_requests`` by GPU UUID, ``cpuset_cpus``,
``cpuset_mems``, memory and disk limits, the shared home and the allocation as a label -> start.
Any failure, cancellation or start timeout removes the container and releases the allocation.
``stop`` always releases. After a hub restart the ledger is rebuilt from container labels
(:meth:`Cluster.ensure_restored`) and from spawner state (:meth:`poll`).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from dockerspawner import DockerSpawner
from escapism import escape
from tornado import web
from traitlets import Callable, Dict, Enum, Int, List, TraitError, Unicode, Union, default, validate

from ..backends.docker import (
    CERTS_MOUNT,
    DiskLimitUnsupported,
    container_config,
    disk_rule,
    ensure_home,
)
from ..backends.docker_network import (
    DEFAULT_SERVER_POOL,
    ServerNetwork,
)
from ..backends.spec import MANAGED_LABEL, HomeMount, LaunchSpec, launch_spec
from ..placement import (
    DEFAULT_POLICY,
    POLICIES,
    Allocation,
    Owner,
    PlacementError,
    QuotaExceeded,
    UnknownAllocation,
)
from .cluster import Cluster, NodeRuntime, get_cluster
from .config_check import HubConfigError, check_trait
from .form import profile_cards, quota_line, render_form
from .metrics import placement_refused
from .profiles import OptionsError, Profile, ProfileConfigError, choose_profile, load_profiles
from .readiness import wait_for_own_server
from .user_options import check_user_options, install_user_options_guard, pending_refusal

#: longest escaped user or server name used in container, network and home directory names
#: (a path component may have 255 bytes; Docker names and DNS labels want far less)
MAX_NAME_CHARS = 48


def safe_name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """``text`` escaped as DockerSpawner escapes names (lower case letters and digits kept,
    every other character as ``-XX`` hex), capped at ``limit`` characters: a longer result
    keeps its first ``limit - 13`` characters and appends ``-`` and 12 hex digits of the
    SHA-256 of ``text``, so distinct names stay distinct. Safe as one path component, a Docker
    object name and a DNS label."""
    safe_chars = set("abcdefghijklmnopqrstuvwxyz0123456789")
    out = escape(text, safe_chars, escape_char="-").lower()
    if len(out) <= limit:
        return out
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{out[:limit - 13]}-{digest}"


class EngineUnavailable(web.HTTPError):
    """HTTP 503: a node's Docker engine does not answer (the message names the node)."""

    def __init__(self, node: str, reason: object) -> None:
        super().__init__(503, f"node {node}: Docker engine unavailable: {reason}")


def _engine_down(e: BaseException) -> bool:
    """Whether ``e`` says the engine cannot be reached (as opposed to an API refusal)."""
    if isinstance(e, requests.exceptions.ConnectionError):
        return True
    return isinstance(e, DockerException) and not isinstance(e, APIError)


class GPUSpawner(DockerSpawner):
    """Spawn each server in a Docker container pinned to an allocation from the ledger."""

    profiles = Union(
        [List(Dict()), Unicode()],
        default_value=[{"slug": "cpu", "display_name": "CPU only", "cpu": 1, "memory": "1G",
                        "default": True}],
        help="""Profiles users choose from: a list of dicts or the path of a YAML file.

        Keys: slug, display_name, description, cpu (cores), memory and disk (sizes like "4G"),
        gpus (whole GPUs, or a fraction below 1 for a share) or gpu_milli (1..999),
        gpu_models (list), image, numa_policy (strict | prefer | none), groups (who may use
        it; empty = everyone), nodes (node names it may run on; empty = any), default.
        """,
    ).tag(config=True)

    nodes = List(
        Dict(),
        default_value=[{"name": "local", "docker_url": "", "topology": "auto"}],
        help="""Nodes servers may run on: dicts with name, docker_url (default: the local
        engine from DOCKER_HOST), topology ("auto" = read this host with sysfs and NVML, or
        the path of a topology YAML file) and host (where the node's servers are reached;
        default 127.0.0.1).
        """,
    ).tag(config=True)

    placement_policy = Enum(
        list(POLICIES),
        default_value=DEFAULT_POLICY,
        help=f"Node-selection policy, one of: {', '.join(POLICIES)} (docs/placement.md).",
    ).tag(config=True)

    quotas = Dict(
        help="""Quotas: {"users": {name: q}, "groups": {name: q}, "default_user": q} where q
        has gpus, cores, memory, disk and servers. A group quota caps what all members hold
        together. Checked in the same atomic step as the reservation.
        """,
    ).tag(config=True)

    home_path_template = Unicode(
        "",
        help="""Host path of the user's home on the shared file system, e.g.
        "/shared/home/{username}" ({username} is the escaped user name, safe as one path
        component). Created when missing, owned by the user's uid/gid and mounted at
        home_mount_point. Empty = no home mount.
        """,
    ).tag(config=True)

    home_mount_point = Unicode(
        "/home/{username}",
        help="Where the home is mounted in the container; also the container's HOME.",
    ).tag(config=True)

    uid_map = Union(
        [Dict(), Callable()],
        default_value={},
        help="""uid/gid for users whose authenticator gives none in auth_state: a dict
        {username: {"uid": N, "gid": M}} or a callable(spawner) returning (uid, gid).
        """,
    ).tag(config=True)

    default_uid = Int(1000, help="uid when neither auth_state nor uid_map give one.").tag(
        config=True)
    default_gid = Int(100, help="gid when neither auth_state nor uid_map give one.").tag(
        config=True)

    disk_limit_mode = Enum(
        ["refuse", "account"],
        default_value="account",
        help="""When a profile asks for disk and the node's storage driver cannot enforce
        storage_opt size (only btrfs, zfs and overlay2 on xfs+pquota can): "refuse" fails the
        spawn, "account" books the disk in the ledger without a limit. Spawn progress says
        which.
        """,
    ).tag(config=True)

    pids_limit = Int(4096, help="Maximum processes in a container (docker pids_limit).").tag(
        config=True)

    network_isolation = Enum(
        ["per-server", "shared", "host"],
        default_value="per-server",
        help="""How servers are networked (docs/security.md).

        "per-server" (default): each server gets its own bridge network, a /server_network_prefix
        block of server_network_pool, and its own network namespace; it listens on `port` there
        and the hub reaches it by IP. With the host firewall rule of scripts/network.sh, users'
        containers cannot reach each other.
        "shared": all servers on the bridge network `network_name` (created if missing on a
        free block of server_network_pool); containers of different users can reach each other.
        "host": network_mode=host, the server on 127.0.0.1:`port` in the hub's own namespace,
        so one server per node. Only for a single trusted user: any user process can then
        take the hub's ports.
        """,
    ).tag(config=True)

    server_network_pool = Unicode(
        DEFAULT_SERVER_POOL,
        help="""CIDR blocks (comma separated) server networks are carved from. Every network
        gets an explicit subnet; blocks in use on the engine are skipped. Private (RFC 1918)
        ranges are refused. Checked when the hub starts.""",
    ).tag(config=True)

    server_network_prefix = Int(
        28, help="Prefix length of each per-server network (28: 14 addresses).",
    ).tag(config=True)

    user_options_max_bytes = Int(
        4096,
        help="""Largest user_options (as JSON, bytes) accepted. Larger ones are refused with
        HTTP 400 before the hub stores them.""",
    ).tag(config=True)

    @validate("profiles", "nodes", "quotas", "server_network_pool")
    def _validate_structured(self, proposal: Any) -> Any:
        """Profiles, nodes (structure; topologies are read at hub start), quotas and the
        network pool (:func:`gpuspawner.hub.config_check.check_trait`)."""
        try:
            check_trait(proposal.trait.name, proposal.value)
        except HubConfigError as e:
            raise TraitError(str(e)) from None
        return proposal.value

    @validate("user_options")
    def _validate_user_options(self, proposal: Any) -> dict[str, Any]:
        """Keep refused options out of memory too (the REST server model echoes them): a value
        the profiles or the size limit refuse leaves the previous one in place, and the
        refusal is raised by apply_user_options / start."""
        try:
            groups = self.group_names
            check_user_options(proposal.value, self.profiles, groups,
                               self.user_options_max_bytes)
        except web.HTTPError as e:
            self._options_refusal = e
            return dict(self.user_options or {})
        except Exception:  # profiles that do not load: start() reports it with the field
            pass
        self._options_refusal = None
        return proposal.value

    @validate("server_network_prefix")
    def _validate_prefix(self, proposal: Any) -> int:
        if not 16 <= proposal.value <= 29:
            raise TraitError(f"server_network_prefix: must be 16..29, got {proposal.value}")
        return proposal.value

    profile_form_template = Unicode(
        "profiles.html.j2",
        help="Jinja2 template name of the spawn form (see additional_template_paths).",
    ).tag(config=True)

    additional_template_paths = List(
        Unicode(),
        help="Directories searched before the built-in templates (override the form).",
    ).tag(config=True)

    # DockerSpawner defaults that pinning needs ------------------------------------------
    @default("remove")
    def _default_remove(self) -> bool:
        # never restart an old container with a stale GPU/cpuset binding (dockerspawner #331)
        return True

    @default("network_name")
    def _default_network_name(self) -> str:
        return {"host": "host", "shared": "gpuspawner-servers"}.get(self.network_isolation,
                                                                     "bridge")

    @default("escape")
    def _default_escape(self):
        return safe_name

    @default("use_internal_hostname")
    def _default_use_internal_hostname(self) -> bool:
        # container names do not resolve on the hub's host; internal_ssl certs name the IP
        return False

    @default("image")
    def _default_image(self) -> str:
        return "gpuspawner/singleuser:latest"

    @default("pull_policy")
    def _default_pull_policy(self) -> str:
        return "never"

    @default("options_form")
    def _default_options_form(self) -> str:
        return ""  # get_options_form renders the profile cards

    @default("apply_user_options")
    def _default_apply_user_options(self):
        def apply_user_options(spawner: GPUSpawner, user_options: dict[str, Any]) -> None:
            """Validate early (JupyterHub runs this before start and answers 400 for an
            HTTPError); start() checks again against the current configuration. A refusal
            the user_options guard recorded before storage is raised here."""
            spawner.raise_options_refusal()
            spawner.chosen_profile()
        return apply_user_options

    @default("options_from_form")
    def _default_options_from_form(self):
        def options_from_form(formdata: dict[str, list[str]]) -> dict[str, Any]:
            values = formdata.get("profile") or []
            return {"profile": values[0]} if values else {}
        return options_from_form

    # ------------------------------------------------------------------------------------
    allocation: Allocation | None = None
    #: this server's own network (per-server isolation), once made
    server_network: ServerNetwork | None = None
    _uid: int | None = None
    _gid: int | None = None
    _certs_dir: str = ""
    _options_refusal: web.HTTPError | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events: list[dict[str, Any]] = []
        self._event_signal = asyncio.Event()
        self._configured_host_config = None
        self._configured_create_kwargs = None
        self._prepared: tuple[Profile, Allocation] | None = None
        install_user_options_guard(self.profiles, self.user_options_max_bytes, self.log)

    # -- shared state ----------------------------------------------------------------------
    @property
    def cluster(self) -> Cluster:
        """This hub process's cluster (nodes, engines, ledger)."""
        return get_cluster(self.nodes, self.placement_policy, self.quotas, self.profiles)

    def load_profile_list(self) -> list[Profile]:
        """The validated profiles. Raises ProfileConfigError for bad configuration."""
        return load_profiles(self.profiles)

    @property
    def group_names(self) -> list[str]:
        """Names of the user's JupyterHub groups."""
        user = getattr(self, "user", None)
        return sorted(g.name for g in getattr(user, "groups", []) or [])

    @property
    def node_runtime(self) -> NodeRuntime | None:
        """The node of the current allocation."""
        if self.allocation is None:
            return None
        return self.cluster.nodes.get(self.allocation.node)

    @property
    def client(self):  # type: ignore[override]
        """Docker client of the allocation's node (the first node when there is none)."""
        rt = self.node_runtime or next(iter(self.cluster.nodes.values()))
        return rt.client

    # -- progress ------------------------------------------------------------------------------
    def _emit(self, progress: int, message: str) -> None:
        self.log.info("%s: %s", self._log_name, message)
        self._events.append({"progress": progress, "message": message})
        self._event_signal.set()

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Spawn progress events: placement, container, disk limit (JupyterHub progress API)."""
        sent = 0
        while True:
            while sent < len(self._events):
                yield self._events[sent]
                sent += 1
            if self._spawn_done():
                break
            self._event_signal.clear()
            try:
                await asyncio.wait_for(self._event_signal.wait(), 1)
            except asyncio.TimeoutError:
                pass

    def _spawn_done(self) -> bool:
        return not getattr(self, "_spawn_pending", False) or self.ready

    # -- uid/gid -------------------------------------------------------------------------------
    async def run_auth_state_hook(self, auth_state: dict[str, Any] | None) -> None:
        """Take ``uidNumber``/``gidNumber`` from ``auth_state`` (top level or under
        ``user_attributes``, as ldapauthenticator 2.x stores them), then run the configured
        hook."""
        self._uid = self._gid = None
        if auth_state:
            attrs = dict(auth_state.get("user_attributes") or {})
            attrs.update(auth_state)
            uid, gid = attrs.get("uidNumber"), attrs.get("gidNumber")
            if isinstance(uid, list):
                uid = uid[0] if uid else None
            if isinstance(gid, list):
                gid = gid[0] if gid else None
            if uid is not None:
                self._uid = int(uid)
                self._gid = int(gid) if gid is not None else self._uid
        await super().run_auth_state_hook(auth_state)

    def user_ids(self) -> tuple[int, int]:
        """(uid, gid) the container runs as and the home is owned by: auth_state, then
        uid_map, then default_uid/default_gid."""
        if self._uid is not None:
            return self._uid, self._gid if self._gid is not None else self._uid
        if callable(self.uid_map):
            uid, gid = self.uid_map(self)
            return int(uid), int(gid)
        entry = self.uid_map.get(self.user.name)
        if entry:
            return int(entry["uid"]), int(entry.get("gid", entry["uid"]))
        return self.default_uid, self.default_gid

    # -- home ------------------------------------------------------------------------------------
    def home_host_path(self) -> str | None:
        """The user's home on the host, or None without ``home_path_template``.

        The user name is the escaped form (``escapism``, DNS-label safe), so it can hold no
        ``/`` or ``..``; the result is also checked to stay inside the template's base folder.

        Raises:
            web.HTTPError(500): the template escapes its base folder.
        """
        if not self.home_path_template:
            return None
        path = os.path.normpath(self.home_path_template.format(
            username=self.escaped_name, raw_username=self.escaped_name))
        base = os.path.normpath(self.home_path_template.split("{", 1)[0] or "/")
        if os.path.commonpath([path, base]) != base or path == base:
            raise web.HTTPError(500, f"home path {path!r} escapes {base!r}")
        return path

    # -- start ---------------------------------------------------------------------------------
    def _owner(self) -> Owner:
        return Owner(self.user.name, self.name or "", tuple(self.group_names))

    def raise_options_refusal(self) -> None:
        """Raise the HTTP 400 recorded when refused ``user_options`` were kept out of the
        database (gpuspawner.hub.user_options) or out of this spawner (``user_options``
        validation); nothing when none was."""
        refused = pending_refusal(getattr(self, "orm_spawner", None)) or self._options_refusal
        self._options_refusal = None
        if refused is not None:
            raise refused

    def chosen_profile(self) -> Profile:
        """The profile ``user_options`` ask for, validated.

        Raises:
            web.HTTPError(400): bad options (the message names the field).
            web.HTTPError(500): bad profile configuration.
        """
        try:
            profiles = self.load_profile_list()
        except ProfileConfigError as e:
            raise web.HTTPError(500, f"profile configuration: {e}") from None
        try:
            return choose_profile(self.user_options, profiles, self.group_names)
        except OptionsError as e:
            raise web.HTTPError(400, str(e)) from None

    @property
    def network_label(self) -> str:
        """Name of this server's own network (per-server isolation)."""
        return f"{self.object_name}-net"

    async def _prepare(self) -> tuple[Profile, Allocation]:
        """Validate, reserve and (per-server isolation) create the server's network, once per
        spawn. Runs from :meth:`create_certs` when ``internal_ssl`` is on (the certificate must
        name the server's IP, and JupyterHub makes certificates before :meth:`start`), else
        from :meth:`start`.

        Raises:
            web.HTTPError(400): bad ``user_options``, over quota, or no capacity now.
            EngineUnavailable (503): the node's engine does not answer.
        """
        if self._prepared is not None:
            return self._prepared
        self._events = []
        self.raise_options_refusal()
        profile = self.chosen_profile()
        cluster = self.cluster
        await cluster.ensure_restored(self._owner_exists)
        await self._release_stale()
        try:
            alloc = cluster.ledger.reserve(profile.bundle, self._owner(),
                                           nodes=profile.nodes or None)
        except QuotaExceeded as e:
            placement_refused(e)
            raise web.HTTPError(400, f"profile: {e}") from None
        except PlacementError as e:
            placement_refused(e)
            raise web.HTTPError(400, f"profile {profile.slug!r}: {e}") from None
        self.allocation = alloc
        self._emit(20, f"placed on {alloc.summary()}")
        try:
            if cluster.nodes[alloc.node].suspect:
                await asyncio.to_thread(cluster.sweep_orphans, cluster.nodes[alloc.node])
            if self.network_isolation == "per-server":
                rt = cluster.nodes[alloc.node]
                labels = {"gpuspawner.user": self.user.name, "gpuspawner.server": self.name or ""}
                self.server_network = await asyncio.to_thread(
                    rt.networks(self.server_network_pool, self.server_network_prefix).create,
                    self.network_label, labels)
            elif self.network_isolation == "shared":
                rt = cluster.nodes[alloc.node]
                await asyncio.to_thread(
                    rt.networks(self.server_network_pool, 24).create, self.network_name, {})
        except BaseException as e:
            await self._rollback()
            if _engine_down(e):
                raise EngineUnavailable(alloc.node, e) from None
            raise
        self._prepared = (profile, alloc)
        return self._prepared

    def _owner_exists(self, user: str, server: str) -> bool:
        """Whether the hub's database still has user ``user`` with server ``server``."""
        db = getattr(self.user, "db", None)
        if db is None:
            return True
        from jupyterhub import orm

        found = orm.User.find(db, user)
        # every user has the default server ""; named ones have a row of their own
        return found is not None and (server == "" or server in found.orm_spawners)

    async def _release_stale(self) -> None:
        """Free what an earlier, interrupted spawn of this very server still holds (a hub
        killed mid-spawn leaves a container whose label books the allocation on restart, but
        no spawner state): this server is starting, so nothing of it may still run. Removes
        the containers and the network labelled with this user and server, then releases."""
        stale = self.cluster.ledger.find(self.user.name, self.name or "")
        if stale is None:
            return
        rt = self.cluster.nodes.get(stale.node)
        if rt is not None:
            try:
                await asyncio.to_thread(self._remove_labelled, rt)
            except Exception as e:
                if _engine_down(e):
                    raise EngineUnavailable(stale.node, e) from None
                raise
        self.log.warning("%s: releasing allocation %s left by an interrupted spawn",
                         self._log_name, stale.id)
        try:
            self.cluster.ledger.release(stale.id)
        except UnknownAllocation:
            pass
        if self.allocation is not None and self.allocation.id == stale.id:
            self.allocation = None

    def _remove_labelled(self, rt: NodeRuntime) -> None:
        """Remove this server's containers and network on ``rt`` (blocking)."""
        for c in rt.client.containers(all=True, filters={"label": [
                f"{MANAGED_LABEL}=1", f"gpuspawner.user={self.user.name}",
                f"gpuspawner.server={self.name or ''}"]}):
            try:
                rt.client.remove_container(c["Id"], v=True, force=True)
            except NotFound:
                pass
        if self.network_isolation == "per-server":
            rt.networks(self.server_network_pool, self.server_network_prefix).remove(
                self.network_label)

    async def start(self) -> tuple[str, int]:
        """Validate, reserve, create a new pinned container in the server's own network and
        start it; return only when *this* container's server answers. Roll back on any failure
        (including cancellation by the hub's start timeout or a stop during the spawn).

        Raises:
            web.HTTPError(400): bad ``user_options``, over quota, or no capacity now.
            EngineUnavailable (503): the node's engine does not answer.
            web.HTTPError(500): the container exited during start (its exit code and last log
                lines in the message), or the image is missing.
        """
        try:
            profile, alloc = await self._prepare()
            try:
                return await self._start_container(profile, alloc)
            except BaseException as e:
                await self._rollback()
                if _engine_down(e):
                    raise EngineUnavailable(alloc.node, e) from None
                raise
        finally:
            self._prepared = None

    async def _start_container(self, profile: Profile, alloc: Allocation) -> tuple[str, int]:
        """Build the server's LaunchSpec, make the home and apply the disk rule (Docker
        backend functions), then create a new container from the spec and start it."""
        rt = self.cluster.nodes[alloc.node]
        image = profile.image or self.image
        uid, gid = self.user_ids()
        host_home = self.home_host_path()
        home = HomeMount(host_home, self._home_in_container()) if host_home else None
        if home:
            await asyncio.to_thread(ensure_home, home.host_path, uid, gid)
        supported, driver = (await asyncio.to_thread(rt.disk_limit_supported)
                             if alloc.disk_bytes else (False, ""))
        image_bytes = (await self._image_size(image)
                       if alloc.disk_bytes and supported else 0)
        try:
            storage_opt, message = disk_rule(alloc.disk_bytes, supported=supported,
                                             driver=driver, image_bytes=image_bytes,
                                             mode=self.disk_limit_mode)
        except DiskLimitUnsupported as e:
            raise web.HTTPError(400, f"profile {profile.slug!r}: node {rt.name}: {e}") from None
        if message:
            self._emit(30, message)
        try:
            await self.pull_image(image)
        except ImageNotFound:
            raise web.HTTPError(500, f"image {image!r} is not on node {rt.name}; the admin "
                                     "must build or pull it (make images)") from None
        spec = launch_spec(
            name=self.object_name, user=self.user.name, server=self.name or "",
            allocation=alloc, image=image, cmd=await self._command(image),
            env={**self.get_env(), "JUPYTER_IMAGE_SPEC": image},
            uid=uid, gid=gid, port=self.port, home=home, certs_dir=self._certs_dir)
        self._emit(40, f"creating container from {image}")
        if await self.get_object() is not None:  # a leftover of this name: never reuse it
            await self.remove_object()
        obj = await self._create_container(spec, storage_opt)
        self.object_id = obj[self.object_id_key]
        await self.start_object()
        ip, port = await self.get_ip_and_port()
        self._emit(60, f"container {self.object_name} started at {ip}:{port}, waiting for "
                       "the server")
        await self._wait_for_own_server(ip, port)
        return ip, port

    async def _create_container(self, spec: LaunchSpec, storage_opt: dict[str, str]
                                ) -> dict[str, Any]:
        """``create_container`` from the spec (``backends.docker.container_config``), the
        admin's ``extra_host_config`` / ``extra_create_kwargs`` kept where they do not
        conflict with pinning and hardening."""
        base_host = await self._resolved(self.extra_host_config)
        base_create = await self._resolved(self.extra_create_kwargs)
        net = self.server_network
        if self.network_isolation == "per-server" and net is not None:
            network, fixed_ip = net.name, str(net.server_ip)
        else:
            network, fixed_ip = self.network_name, None
        try:
            create, host = container_config(
                spec, network=network, fixed_ip=fixed_ip, pids_limit=self.pids_limit,
                storage_opt=storage_opt, base_host=base_host, base_create=base_create)
        except ValueError as e:
            raise web.HTTPError(500, str(e)) from None
        create["host_config"] = self.client.create_host_config(**host)
        return await self.docker("create_container", **create)

    async def _command(self, image: str) -> list[str]:
        """``cmd`` (else the image's own command) and the hub's arguments, as DockerSpawner
        builds them."""
        if self.cmd:
            cmd = list(self.cmd)
        else:
            cmd = list((await self.docker("inspect_image", image))["Config"]["Cmd"] or [])
        return cmd + self.get_args()

    async def _resolved(self, value: Any) -> dict[str, Any]:
        """A DockerSpawner-style setting: a dict, or a callable(spawner) returning one (or an
        awaitable of one)."""
        value = self._eval_if_callable(value)
        if inspect.isawaitable(value):
            value = await value
        return dict(value or {})

    async def _wait_for_own_server(self, ip: str, port: int) -> None:
        """Ready only when *this* container's server answers at its own address
        (:func:`~gpuspawner.hub.readiness.wait_for_own_server`); a container that exited
        fails the spawn at once with its exit code and last log lines."""
        async def exited() -> str | None:
            st = (await self.docker("inspect_container", self.object_id)).get("State") or {}
            return None if st.get("Running") else await self._exit_report(st)

        await wait_for_own_server(
            ip, port, self.server.base_url if self.server else "/", exited=exited,
            timeout=self.http_timeout, tls=self.internal_ssl,
            name=f"server of {self._log_name}")

    async def _exit_report(self, state: dict[str, Any]) -> str:
        """'container exited with code N' and its last log lines."""
        try:
            logs = (await self.docker("logs", self.object_id, tail=8)).decode(
                "utf-8", "replace").strip()
        except Exception:
            logs = ""
        code = state.get("ExitCode")
        text = f"container {self.object_name} exited during start with code {code}"
        if state.get("OOMKilled"):
            text += " (out of memory)"
        return f"{text}; last log lines:\n{logs}" if logs else text

    async def _image_size(self, image: str) -> int:
        """Size of ``image`` on the node's engine, bytes (0 if unknown)."""
        try:
            return int((await self.docker("inspect_image", image)).get("Size") or 0)
        except (APIError, NotFound, ValueError):
            return 0

    def _home_in_container(self) -> str:
        return self.home_mount_point.format(username=self.escaped_name)

    async def get_ip_and_port(self) -> tuple[str, int]:
        """Per-server network: the container's fixed IP on it. Host networking: 127.0.0.1
        (the node's host address) and ``port``. Shared network: DockerSpawner's answer."""
        if self.network_isolation == "per-server" and self.server_network is not None:
            return str(self.server_network.server_ip), self.port
        if self.network_isolation == "host":
            rt = self.node_runtime
            return (rt.host if rt else "127.0.0.1"), self.port
        return await super().get_ip_and_port()

    @default("use_internal_ip")
    def _default_use_internal_ip(self) -> bool:
        # host mode: no port_bindings (docker refuses them with network_mode=host)
        return True

    @default("ip")
    def _default_ip(self) -> str:
        # host mode shares the hub's namespace: loopback only. Otherwise the server has a
        # namespace of its own and listens on its one interface there.
        return "127.0.0.1" if self.network_isolation == "host" else "0.0.0.0"

    # -- internal_ssl --------------------------------------------------------------------------
    async def create_certs(self) -> dict[str, str]:
        """The server's key pair for ``internal_ssl``, signed by the hub's notebooks CA, naming
        the server's fixed IP (placement and the network come first, see :meth:`_prepare`).

        Unlike ``Spawner.create_certs``, files are named after the escaped, capped user *and*
        server name: JupyterHub names them ``user-<name>`` only, which fails for long names
        and lets two named servers of one user overwrite each other's certificate.

        Returns:
            {"keyfile", "certfile", "cafile"}: paths on the hub's host.
        """
        from certipy import Certipy

        _, alloc = await self._prepare()
        names = ["DNS:localhost", "IP:127.0.0.1"]
        if self.server_network is not None:
            names.append(f"IP:{self.server_network.server_ip}")
        elif self.network_isolation == "host":
            rt = self.cluster.nodes[alloc.node]
            names.append(f"IP:{rt.host}" if rt.host[:1].isdigit() else f"DNS:{rt.host}")
        certipy = Certipy(store_dir=self.internal_certs_location)
        pair = certipy.create_signed_pair(
            f"server-{self.object_name}", "notebooks-ca", alt_names=names, overwrite=True)
        return {"keyfile": pair["files"]["key"], "certfile": pair["files"]["cert"],
                "cafile": self.internal_trust_bundles["notebooks-ca"]}

    async def move_certs(self, paths: dict[str, str]) -> dict[str, str]:
        """Copy the server's certificate files to a host folder of their own, owned by the
        user's uid with mode 0400/0500, mounted read-only at ``/etc/gpuspawner/certs``
        (DockerSpawner stages them with an extra container and a volume, which costs a
        container start and leaves the volume behind).

        Returns:
            the same keys with the paths inside the container.
        """
        uid, gid = self.user_ids()
        folder = os.path.join(self.internal_certs_location, "gpuspawner-servers",
                              self.object_name)

        def copy() -> dict[str, str]:
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder, mode=0o700)
            out = {}
            for key, src in paths.items():
                name = os.path.basename(src)
                dst = os.path.join(folder, name)
                shutil.copyfile(src, dst)
                os.chmod(dst, 0o400)
                os.chown(dst, uid, gid)
                out[key] = f"{CERTS_MOUNT}/{name}"
            os.chmod(folder, 0o500)
            os.chown(folder, uid, gid)
            return out

        result = await asyncio.to_thread(copy)
        self._certs_dir = folder
        return result

    async def _remove_certs(self) -> None:
        """Remove the server's certificate copy and the key pair made for it. Never raises."""
        folder, self._certs_dir = self._certs_dir, ""
        if folder:
            pair = os.path.join(self.internal_certs_location, f"server-{self.object_name}")
            for path in (folder, pair):
                await asyncio.to_thread(shutil.rmtree, path, True)

    # -- rollback / stop / poll / state --------------------------------------------------------
    async def _rollback(self) -> None:
        """Remove the container and the network if made, release the allocation. Never
        raises."""
        try:
            if self.object_id:
                await self.remove_object()
        except Exception as e:
            self.log.warning("rollback of %s: removing container failed: %s", self._log_name, e)
        finally:
            self.object_id = ""
            await self._remove_network()
            await self._remove_certs()
            self._release()

    async def _remove_network(self) -> None:
        """Remove this server's own network (per-server isolation). Never raises."""
        net, self.server_network = self.server_network, None
        alloc = self.allocation
        if net is None or alloc is None:
            return
        rt = self.cluster.nodes.get(alloc.node)
        if rt is None:
            return
        manager = rt.networks(self.server_network_pool, self.server_network_prefix)
        try:
            await asyncio.to_thread(manager.remove, net.name)
        except Exception as e:
            self.log.warning("%s: removing network %s failed: %s", self._log_name, net.name, e)

    def _release(self) -> None:
        alloc, self.allocation = self.allocation, None
        if alloc is None:
            return
        try:
            self.cluster.ledger.release(alloc.id)
            self.log.info("released allocation %s of %s", alloc.id, self._log_name)
        except UnknownAllocation:
            pass

    async def remove_object(self) -> None:
        """Remove the container (force), tolerating one that is gone already."""
        try:
            await self.docker("remove_container", self.object_id, v=True, force=True)
        except NotFound:
            pass
        except APIError as e:
            if e.status_code not in (404, 409):
                raise

    async def stop(self, now: bool = False) -> None:
        """Stop and remove the container and its network, then release the allocation
        (always, also when the engine does not answer)."""
        net, certs = self.server_network, self._certs_dir
        try:
            if self.object_id:
                await super().stop(now=now)  # ends with clear_state()
        except Exception as e:
            if not _engine_down(e):
                raise
            node = self.allocation.node if self.allocation else "?"
            self.log.warning("%s: engine of node %s unavailable at stop (%s); releasing",
                             self._log_name, node, e)
            self._mark_suspect()
        finally:
            self.server_network, self._certs_dir = net, certs
            await self._remove_network()
            await self._remove_certs()
            self._release()
            self.clear_state()

    def _mark_suspect(self) -> None:
        rt = self.node_runtime
        if rt is not None:
            rt.suspect = True

    async def poll(self) -> int | None:
        """DockerSpawner's poll. A stopped container, or an engine that does not answer
        (whose containers are gone or unreachable), gives an exit status and releases the
        allocation. After a hub restart a running server adopts the allocation restored from
        its container label, or books the one in its state."""
        await self.cluster.ensure_restored(self._owner_exists)
        try:
            status = await super().poll()
        except Exception as e:
            if not _engine_down(e):
                raise
            node = self.allocation.node if self.allocation else "?"
            self.log.warning("%s: engine of node %s unavailable (%s); reporting the server "
                             "stopped", self._log_name, node, e)
            self._mark_suspect()
            status = 255
        if status is None and self.allocation is None:
            found = self.cluster.ledger.find(self.user.name, self.name or "")
            if found is not None:
                self.allocation = found  # restored from the label: attach it again
        a = self.allocation
        if status is not None and a is not None and not getattr(self, "_spawn_pending", False):
            # the container died (killed, crashed, OOM): JupyterHub does not call stop() for a
            # server whose poll says it stopped, so the allocation is released here
            self.log.warning("%s stopped with status %s; releasing its allocation",
                             self._log_name, status)
            if status != 255 and self.object_id:
                try:
                    await self.remove_object()
                except Exception as e:
                    self.log.warning("%s: removing its container failed: %s", self._log_name, e)
            await self._remove_network()
            await self._remove_certs()
            self._release()
        elif status is None and a is not None and self.cluster.ledger.get(a.id) is None:
            report = self.cluster.ledger.restore([a])
            for c in report.conflicts:
                self.log.error("%s: allocation from state refused: %s", self._log_name,
                               c.problem)
        return status

    def load_state(self, state: dict[str, Any]) -> None:
        """DockerSpawner's state plus the allocation, the server's network and its
        certificate folder."""
        super().load_state(state)
        text = state.get("allocation")
        self.allocation = Allocation.from_dict(text) if text else None
        net = state.get("network")
        self.server_network = ServerNetwork.from_dict(net) if net else None
        self._certs_dir = state.get("certs_dir", "")

    def get_state(self) -> dict[str, Any]:
        """DockerSpawner's state plus the allocation (a dict), network and certificate
        folder."""
        state = super().get_state()
        if self.allocation is not None:
            state["allocation"] = self.allocation.to_dict()
        if self.server_network is not None:
            state["network"] = self.server_network.to_dict()
        if self._certs_dir:
            state["certs_dir"] = self._certs_dir
        return state

    def clear_state(self) -> None:
        """Forget the container, the network and the allocation reference (the ledger is
        released by stop/rollback, not here)."""
        super().clear_state()
        self.server_network = None
        self._certs_dir = ""

    # -- the form --------------------------------------------------------------------------------
    def profile_cards(self) -> list[dict[str, Any]]:
        """The form's cards for this user (:func:`gpuspawner.hub.form.profile_cards`)."""
        return profile_cards(self.load_profile_list(), self.cluster.ledger, self.user.name,
                             self.group_names)

    async def get_options_form(self) -> str:
        """The spawn form: profile cards with live availability (Jinja2 template), unless the
        admin configured ``options_form`` themselves."""
        if self.options_form:
            return await super().get_options_form()
        await self.cluster.ensure_restored(self._owner_exists)
        return render_form(self.profile_form_template, self.additional_template_paths,
                           cards=self.profile_cards(), spawner=self,
                           quota_text=quota_line(self.cluster.ledger, self.user.name,
                                                 self.group_names))
