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
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

from docker.errors import APIError, ImageNotFound, NotFound
from docker.types import DeviceRequest
from dockerspawner import DockerSpawner
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, select_autoescape
from tornado import web
from traitlets import Bool, Callable, Dict, Enum, Int, List, Unicode, Union, default

from .cluster import ALLOCATION_LABEL, MANAGED_LABEL, Cluster, NodeRuntime, get_cluster
from .metrics import placement_refused
from .placement import (
    GPU_MILLI,
    Allocation,
    Owner,
    PlacementError,
    QuotaExceeded,
    UnknownAllocation,
    format_bytes,
)
from .profiles import OptionsError, Profile, ProfileConfigError, choose_profile, load_profiles

#: capabilities asked of the NVIDIA container runtime (docker docs, "--gpus":
#: capabilities map to NVIDIA_DRIVER_CAPABILITIES)
GPU_CAPABILITIES = [["gpu", "compute", "utility"]]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (bound, read and closed; the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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

    placement_policy = Unicode(
        "fgd",
        help="Node-selection policy: fgd (fragmentation-aware, default), first-fit, "
             "best-fit, spread or random.",
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

    host_network = Bool(
        True,
        help="""Run containers with network_mode=host, the server on 127.0.0.1 at a free port
        (one node). Set False to use network_name (a bridge or custom network) as
        DockerSpawner does.
        """,
    ).tag(config=True)

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
        return "host" if self.host_network else "bridge"

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
            HTTPError); start() checks again against the current configuration."""
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
    _uid: int | None = None
    _gid: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events: list[dict[str, Any]] = []
        self._event_signal = asyncio.Event()
        self._configured_host_config = None
        self._configured_create_kwargs = None

    # -- shared state ----------------------------------------------------------------------
    @property
    def cluster(self) -> Cluster:
        """This hub process's cluster (nodes, engines, ledger)."""
        return get_cluster(self.nodes, self.placement_policy, self.quotas)

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

    def ensure_home(self, path: str, uid: int, gid: int) -> None:
        """Create the home (mode 0700) if missing and give it to uid:gid. Blocking I/O."""
        created = not os.path.isdir(path)
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if created or (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(path, uid, gid)

    # -- start ---------------------------------------------------------------------------------
    def _owner(self) -> Owner:
        return Owner(self.user.name, self.name or "", tuple(self.group_names))

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

    async def start(self) -> tuple[str, int]:
        """Validate, reserve, create a new pinned container and start it; roll back on any
        failure (including cancellation by the hub's start timeout).

        Raises:
            web.HTTPError(400): bad ``user_options``, over quota, or no capacity now.
        """
        self._events = []
        profile = self.chosen_profile()
        cluster = self.cluster
        await cluster.ensure_restored()
        if self.allocation is not None:  # a leftover from a failed stop
            self._release()
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
            return await self._start_container(profile, alloc)
        except BaseException:
            await self._rollback()
            raise

    async def _start_container(self, profile: Profile, alloc: Allocation) -> tuple[str, int]:
        rt = self.cluster.nodes[alloc.node]
        if profile.image:
            self.image = profile.image
        uid, gid = self.user_ids()
        home = self.home_host_path()
        if home:
            await asyncio.to_thread(self.ensure_home, home, uid, gid)
        disk_opt: dict[str, str] = {}
        if alloc.disk_bytes:
            supported, driver = await asyncio.to_thread(rt.disk_limit_supported)
            if supported:
                size = alloc.disk_bytes
                if driver in ("btrfs", "zfs"):
                    # their quota counts the image's own bytes too (a subvolume/dataset per
                    # container); the profile's disk is the space the user may write
                    size += await self._image_size()
                disk_opt = {"size": str(size)}
                self._emit(30, f"disk limited to {format_bytes(alloc.disk_bytes)} writable "
                               f"({driver} storage_opt size)")
            elif self.disk_limit_mode == "refuse":
                raise web.HTTPError(400, f"profile {profile.slug!r}: node {rt.name} cannot "
                                         f"limit disk (storage driver {driver}); "
                                         "disk_limit_mode is 'refuse'")
            else:
                self._emit(30, f"disk {format_bytes(alloc.disk_bytes)} accounted only: "
                               f"storage driver {driver} cannot enforce a size limit")
        if self.host_network:
            self.port = free_port(rt.host if rt.host != "localhost" else "127.0.0.1")
        self._apply_container_config(alloc, uid, gid, home, disk_opt)
        self._emit(40, f"creating container from {self.image}")
        try:
            ip_port = await super().start()
        except ImageNotFound:
            raise web.HTTPError(500, f"image {self.image!r} is not on node {rt.name}; the "
                                     "admin must build or pull it (make images)") from None
        self._emit(90, f"container {self.object_name} started, waiting for the server")
        return ip_port

    async def _image_size(self) -> int:
        """Size of the spawn's image on the node's engine, bytes (0 if unknown)."""
        try:
            return int((await self.docker("inspect_image", self.image)).get("Size") or 0)
        except (APIError, NotFound, ValueError):
            return 0

    def get_env(self) -> dict[str, str]:
        """DockerSpawner's env plus the allocation: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
        ``OMP_NUM_THREADS``, ``MEM_LIMIT`` (bytes) and ``CPU_LIMIT`` (cores), as
        jupyter-resource-usage reads them, ``GPUSPAWNER_ALLOCATION`` (JSON) and
        ``NVIDIA_VISIBLE_DEVICES`` (GPU UUIDs, or ``void``)."""
        env = super().get_env()
        a = self.allocation
        if a is None:
            return env
        env.update({
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "OMP_NUM_THREADS": str(max(1, len(a.cpuset))),
            "MEM_LIMIT": str(a.memory_bytes),
            "CPU_LIMIT": str(len(a.cpuset)),
            "GPUSPAWNER_ALLOCATION": a.to_json(),
            "NVIDIA_VISIBLE_DEVICES": ",".join(a.gpu_uuids) or "void",
        })
        if self.home_path_template:
            env["HOME"] = self._home_in_container()
        return env

    def _home_in_container(self) -> str:
        return self.home_mount_point.format(username=self.escaped_name)

    def _apply_container_config(self, alloc: Allocation, uid: int, gid: int,
                                home: str | None, disk_opt: dict[str, str]) -> None:
        """Merge the pinning into extra_host_config / extra_create_kwargs for this start; the
        admin's own settings stay, ours win where they overlap (security and pinning)."""
        if self._configured_host_config is None:
            self._configured_host_config = self.extra_host_config
            self._configured_create_kwargs = self.extra_create_kwargs
        base_host = self._eval_if_callable(self._configured_host_config) or {}
        base_create = self._eval_if_callable(self._configured_create_kwargs) or {}
        if asyncio.iscoroutine(base_host) or asyncio.iscoroutine(base_create):
            raise web.HTTPError(500, "async extra_host_config/extra_create_kwargs callables "
                                     "are not supported by GPUSpawner")
        host: dict[str, Any] = dict(base_host)
        mem = alloc.memory_bytes or None
        host.update({
            "cpuset_cpus": alloc.cpuset_str() or None,
            "cpuset_mems": alloc.mems_str() or None,
            "mem_limit": mem,
            "memswap_limit": mem,  # no swap beyond the memory limit (docker docs)
            "privileged": False,
            "security_opt": sorted(set(host.get("security_opt") or []) |
                                   {"no-new-privileges"}),
            "pids_limit": self.pids_limit,
        })
        whole = [g.uuid for g in alloc.gpus]
        if whole:
            host["device_requests"] = [DeviceRequest(driver="nvidia", device_ids=whole,
                                                     capabilities=GPU_CAPABILITIES)]
        if disk_opt:
            host["storage_opt"] = disk_opt
        if home:
            binds = dict(host.get("binds") or {})
            binds[home] = {"bind": self._home_in_container(), "mode": "rw"}
            host["binds"] = binds
        # never hand the Docker socket to a user
        binds = host.get("binds") or {}
        for path in list(binds):
            if "docker.sock" in str(path):
                raise web.HTTPError(500, f"refusing to mount the Docker socket ({path})")
        host = {k: v for k, v in host.items() if v is not None}
        create: dict[str, Any] = dict(base_create)
        labels = dict(create.get("labels") or {})
        labels.update({ALLOCATION_LABEL: alloc.to_json(), MANAGED_LABEL: "1",
                       "gpuspawner.user": self.user.name,
                       "gpuspawner.server": self.name or ""})
        create["labels"] = labels
        create["user"] = f"{uid}:{gid}"
        if self.home_path_template:
            create["working_dir"] = self._home_in_container()
        self.extra_host_config = host
        self.extra_create_kwargs = create
        self.mem_limit = None  # the allocation decides
        self.cpu_limit = None

    async def get_ip_and_port(self) -> tuple[str, int]:
        """Host networking: the node's host address and the port chosen for this spawn."""
        if self.host_network:
            rt = self.node_runtime
            return (rt.host if rt else "127.0.0.1"), self.port
        return await super().get_ip_and_port()

    @default("use_internal_ip")
    def _default_use_internal_ip(self) -> bool:
        # host mode: no port_bindings (docker refuses them with network_mode=host)
        return True if self.host_network else self.network_name not in ("bridge", "host")

    @default("ip")
    def _default_ip(self) -> str:
        return "127.0.0.1" if self.host_network else "0.0.0.0"

    async def _rollback(self) -> None:
        """Remove the container if one was made and release the allocation. Never raises."""
        try:
            if self.object_id:
                await self.remove_object()
        except Exception as e:
            self.log.warning("rollback of %s: removing container failed: %s", self._log_name, e)
        finally:
            self.object_id = ""
            self._release()

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

    # -- stop / poll / state ---------------------------------------------------------------------
    async def stop(self, now: bool = False) -> None:
        """Stop and remove the container, then release the allocation (always)."""
        try:
            if self.object_id:
                await super().stop(now=now)
        finally:
            self._release()
            self.clear_state()

    async def poll(self) -> int | None:
        """DockerSpawner's poll. A stopped container releases its allocation; after a hub
        restart a running one books its allocation from spawner state if the labels did not
        bring it back."""
        await self.cluster.ensure_restored()
        status = await super().poll()
        a = self.allocation
        if status is not None and a is not None and not getattr(self, "_spawn_pending", False):
            # the container died (killed, crashed, OOM): JupyterHub does not call stop() for a
            # server whose poll says it stopped, so the allocation is released here
            self.log.warning("%s stopped with status %s; releasing its allocation",
                             self._log_name, status)
            self._release()
        elif status is None and a is not None and self.cluster.ledger.get(a.id) is None:
            report = self.cluster.ledger.restore([a])
            for c in report.conflicts:
                self.log.error("%s: allocation from state refused: %s", self._log_name,
                               c.problem)
        return status

    def load_state(self, state: dict[str, Any]) -> None:
        """DockerSpawner's state plus the allocation."""
        super().load_state(state)
        text = state.get("allocation")
        self.allocation = Allocation.from_dict(text) if text else None

    def get_state(self) -> dict[str, Any]:
        """DockerSpawner's state plus the allocation (a dict)."""
        state = super().get_state()
        if self.allocation is not None:
            state["allocation"] = self.allocation.to_dict()
        return state

    def clear_state(self) -> None:
        """Forget the container and the allocation reference (the ledger is released by
        stop/rollback, not here)."""
        super().clear_state()

    # -- the form --------------------------------------------------------------------------------
    def _jinja(self) -> Environment:
        loaders = [FileSystemLoader(p) for p in self.additional_template_paths]
        loaders.append(PackageLoader("gpuspawner", "templates"))
        return Environment(loader=ChoiceLoader(loaders),
                           autoescape=select_autoescape(["html", "j2"]))

    def profile_cards(self) -> list[dict[str, Any]]:
        """What the form shows per profile: availability now, quota and group permission.

        Each card: slug, display_name, description, bundle (text), default, available (bool),
        reason (why not), free/total GPUs of the profile's models."""
        ledger = self.cluster.ledger
        groups = self.group_names
        left = ledger.quota_remaining(self.user.name, groups)
        cards = []
        for p in self.load_profile_list():
            b = p.bundle
            card: dict[str, Any] = {"slug": p.slug, "display_name": p.display_name,
                                    "description": p.description, "bundle": b.describe(),
                                    "default": p.default, "available": True, "reason": "",
                                    "availability": ""}
            if b.total_gpu_milli:
                free, total = ledger.free_gpus(b.gpu_models)
                models = "/".join(b.gpu_models) or "GPU"
                card["availability"] = f"{free} of {total} {models} free now"
                need = b.gpus or 1
                if total == 0:
                    card.update(available=False, reason=f"no {models} on this hub")
                elif b.gpus and free < need:
                    card.update(available=False, reason=f"only {free} {models} free now")
            if not p.allowed_for(groups):
                card.update(available=False, reason="not available to your group")
            else:
                for key, need in (("gpu_milli", b.total_gpu_milli), ("cores", b.cores),
                                  ("memory_bytes", b.memory_bytes), ("disk_bytes",
                                                                     b.disk_bytes),
                                  ("servers", 1)):
                    if left.get(key) is not None and need > left[key]:
                        card.update(available=False, reason=f"over your quota ({key})")
                        break
            cards.append(card)
        return cards

    async def get_options_form(self) -> str:
        """The spawn form: profile cards with live availability (Jinja2 template), unless the
        admin configured ``options_form`` themselves."""
        if self.options_form:
            return await super().get_options_form()
        await self.cluster.ensure_restored()
        cards = self.profile_cards()
        usage = self.cluster.ledger.usage(self.user.name)
        left = self.cluster.ledger.quota_remaining(self.user.name, self.group_names)
        quota_text = ""
        if left.get("gpu_milli") is not None:
            total = (usage.gpu_milli + left["gpu_milli"]) / GPU_MILLI
            quota_text = f"you use {usage.gpu_milli / GPU_MILLI:g} of your {total:g} GPUs"
        template = self._jinja().get_template(self.profile_form_template)
        return template.render(cards=cards, quota_text=quota_text, spawner=self)
