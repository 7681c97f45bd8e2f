"""GPUSpawner: asks the placement ledger for an atomic CPU/GPU/RAM/disk bundle before anything
starts, then has the configured backend run the server pinned to exactly those devices.

Lifecycle (start): validate ``user_options`` -> reserve in the ledger (quota checked in the same
step) -> ``backend.prepare`` (e.g. the server's own network) -> internal_ssl certificates for
its address -> :func:`~gpuspawner.backends.spec.launch_spec` -> ``backend.launch`` -> wait
until *this* server answers. Any failure, cancellation or start timeout removes what was made
and releases the allocation; ``stop`` always releases. After a hub restart the ledger is rebuilt
from what the backend finds running (:meth:`Cluster.ensure_restored`) and from spawner state.
The spawner holds no engine code: see :mod:`gpuspawner.backends.base`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from jupyterhub.spawner import Spawner
from tornado import web
from traitlets import Callable, Dict, Enum, Int, List, TraitError, Unicode, Union, default, validate

from ..backends.base import Backend, BackendError, BackendUnavailable, LaunchRefused, ServerRef
from ..backends.spec import HomeMount, launch_spec
from ..placement import DEFAULT_POLICY, POLICIES, Allocation, Owner, PlacementError, QuotaExceeded
from . import certs
from .cluster import Cluster, get_cluster
from .config_check import HubConfigError, check_trait
from .form import OptionsFormMixin
from .identity import home_path, ids_from_auth_state, object_name, safe_name
from .metrics import placement_refused
from .profiles import PROFILES_HELP, OptionsError, Profile, ProfileConfigError, choose_profile
from .readiness import wait_for_own_server
from .user_options import check_user_options, install_user_options_guard, pending_refusal

__all__ = ["GPUSpawner", "safe_name"]


def http_error(e: BackendError) -> web.HTTPError:
    """A backend's error as the hub answers it: 503 (node unavailable), 400 (refused for this
    node), 500 (the server could not start)."""
    code = 503 if isinstance(e, BackendUnavailable) else 400 if isinstance(
        e, LaunchRefused) else 500
    return web.HTTPError(code, str(e))


class GPUSpawner(OptionsFormMixin, Spawner):
    """Spawn each server through a backend, pinned to an allocation from the ledger."""

    backend = Unicode("docker", help="""What runs servers: "docker" (DockerBackend, configured
        as c.DockerBackend.*) or a dotted Backend class path.""").tag(config=True)
    profiles = Union([List(Dict()), Unicode()], default_value=[
        {"slug": "cpu", "display_name": "CPU only", "cpu": 1, "memory": "1G", "default": True}],
        help=PROFILES_HELP).tag(config=True)
    nodes = List(Dict(), default_value=[{"name": "local", "docker_url": "", "topology": "auto"}],
                 help="""Nodes servers may run on: dicts with name, topology ("auto" = read this
        host with sysfs and NVML, or a topology YAML file), host (where its servers are reached
        with host networking; default 127.0.0.1), docker_url and network_pool (Docker backend).
        """).tag(config=True)
    placement_policy = Enum(list(POLICIES), default_value=DEFAULT_POLICY, help=(
        f"Node-selection policy, one of: {', '.join(POLICIES)} (docs/placement.md).")
    ).tag(config=True)
    quotas = Dict(help="""Quotas: {"users": {name: q}, "groups": {name: q}, "default_user": q}
        where q has gpus, cores, memory, disk and servers. A group quota caps what all members
        hold together. Checked in the same atomic step as the reservation.""").tag(config=True)
    image = Unicode("gpuspawner/singleuser:latest",
                    help="Image of servers whose profile names none.").tag(config=True)
    home_path_template = Unicode("", help="""Host path of the user's home on the shared file
        system, e.g. "/shared/home/{username}" ({username}: the escaped user name). Created when
        missing, owned by the user's uid/gid, mounted at home_mount_point. Empty = none.
        """).tag(config=True)
    home_mount_point = Unicode("/home/{username}", help="Where the home is mounted in the "
                               "server; also its HOME.").tag(config=True)
    uid_map = Union([Dict(), Callable()], default_value={}, help="""uid/gid for users whose
        authenticator gives none in auth_state: {username: {"uid": N, "gid": M}} or a
        callable(spawner) returning (uid, gid).""").tag(config=True)
    default_uid = Int(1000, help="uid when neither auth_state nor uid_map give one.").tag(
        config=True)
    default_gid = Int(100, help="gid when neither auth_state nor uid_map give one.").tag(
        config=True)
    user_options_max_bytes = Int(4096, help="""Largest user_options (as JSON, bytes) accepted;
        larger ones are refused with HTTP 400 before the hub stores them.""").tag(config=True)

    @validate("backend", "profiles", "nodes", "quotas")
    def _validate_structured(self, proposal: Any) -> Any:
        try:
            check_trait(proposal.trait.name, proposal.value)
        except HubConfigError as e:
            raise TraitError(str(e)) from None
        return proposal.value

    @validate("user_options")
    def _validate_user_options(self, proposal: Any) -> dict[str, Any]:
        """Keep refused options out of memory too (the REST model echoes them): a refused
        value leaves the previous one in place; apply_user_options / start raise the refusal."""
        try:
            check_user_options(proposal.value, self.profiles, self.group_names,
                               self.user_options_max_bytes)
        except web.HTTPError as e:
            self._options_refusal = e
            return dict(self.user_options or {})
        except Exception:  # profiles that do not load: start() reports it with the field
            pass
        self._options_refusal = None
        return proposal.value

    @default("port")
    def _default_port(self) -> int:
        return 8888  # in the server's own network namespace (DockerSpawner's default)

    @default("ip")
    def _default_ip(self) -> str:
        return self.backend_obj.listen_ip

    allocation: Allocation | None = None
    _uid_gid: tuple[int, int] | None = None
    _options_refusal: web.HTTPError | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events: list[dict[str, Any]] = []
        self._event_signal = asyncio.Event()
        self._prepared: tuple[Profile, Allocation] | None = None
        #: the backend's JSON-able record of this server (stored in the hub's database)
        self.backend_state: dict[str, Any] = {}
        self.certs_dir = ""
        install_user_options_guard(self.profiles, self.user_options_max_bytes, self.log)

    @property
    def cluster(self) -> Cluster:
        """This hub process's cluster (nodes, ledger, backend)."""
        return get_cluster(self.nodes, self.placement_policy, self.quotas, self.profiles,
                           self.backend, self.config)

    @property
    def backend_obj(self) -> Backend:
        """The hub's backend (the admin's callables receive this spawner)."""
        backend = self.cluster.backend
        backend.spawner = self
        return backend

    @property
    def group_names(self) -> list[str]:
        """Names of the user's JupyterHub groups."""
        return sorted(g.name for g in getattr(getattr(self, "user", None), "groups", []) or [])

    @property
    def object_name(self) -> str:
        """Name of the server's engine objects (:func:`~gpuspawner.hub.identity.object_name`).
        """
        return object_name(self.user.name, self.name or "")

    @property
    def escaped_name(self) -> str:
        return safe_name(self.user.name)

    def _ref(self) -> ServerRef:
        return ServerRef(self.user.name, self.name or "", self.object_name)

    def _emit(self, progress: int, message: str) -> None:
        self.log.info("%s: %s", self._log_name, message)
        self._events.append({"progress": progress, "message": message})
        self._event_signal.set()

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Spawn progress events: placement, network, disk limit, launch (JupyterHub API)."""
        sent = 0
        while True:
            while sent < len(self._events):
                yield self._events[sent]
                sent += 1
            if not getattr(self, "_spawn_pending", False) or self.ready:
                break
            self._event_signal.clear()
            try:
                await asyncio.wait_for(self._event_signal.wait(), 1)
            except asyncio.TimeoutError:
                pass

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

    def raise_options_refusal(self) -> None:
        """Raise the HTTP 400 recorded when refused ``user_options`` were kept out of the
        database (gpuspawner.hub.user_options) or out of this spawner."""
        refused = pending_refusal(getattr(self, "orm_spawner", None)) or self._options_refusal
        self._options_refusal = None
        if refused is not None:
            raise refused

    def chosen_profile(self) -> Profile:
        """The profile ``user_options`` ask for. Raises web.HTTPError 400 (bad options, the
        field named) or 500 (bad profile configuration)."""
        try:
            return choose_profile(self.user_options, self.load_profile_list(), self.group_names)
        except ProfileConfigError as e:
            raise web.HTTPError(500, f"profile configuration: {e}") from None
        except OptionsError as e:
            raise web.HTTPError(400, str(e)) from None

    async def _prepare(self) -> tuple[Profile, Allocation]:
        """Validate, reserve and have the backend prepare the server, once per spawn (from
        :meth:`create_certs` with internal_ssl, whose certificate names the address, else from
        :meth:`start`). Raises web.HTTPError 400 (options, quota, capacity) or 503."""
        if self._prepared is not None:
            return self._prepared
        self._events = []
        self.raise_options_refusal()
        profile, cluster = self.chosen_profile(), self.cluster
        await cluster.ensure_restored(self._owner_exists)
        await self._release_stale()
        try:
            alloc = cluster.ledger.reserve(profile.bundle, Owner(
                self.user.name, self.name or "", tuple(self.group_names)),
                nodes=profile.nodes or None)
        except PlacementError as e:
            placement_refused(e)
            where = "profile" if isinstance(e, QuotaExceeded) else f"profile {profile.slug!r}"
            raise web.HTTPError(400, f"{where}: {e}") from None
        self.allocation = alloc
        self._emit(20, f"placed on {alloc.summary()}")
        try:
            await cluster.sweep_if_suspect(alloc.node)
            self.backend_state = await self.backend_obj.prepare(self._ref(), alloc, {})
        except BaseException as e:
            await self._rollback()
            if isinstance(e, BackendError):
                raise http_error(e) from None
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
        return found is not None and (server == "" or server in found.orm_spawners)

    async def _release_stale(self) -> None:
        """Free what an interrupted spawn of this very server still holds (its objects, found
        by label, and its allocation): this server is starting, so nothing of it may run."""
        stale = self.cluster.ledger.find(self.user.name, self.name or "")
        if stale is None:
            return
        try:
            await self.backend_obj.remove_server(stale.node, self._ref())
        except BackendError as e:
            raise http_error(e) from None
        self.log.warning("%s: releasing allocation %s left by an interrupted spawn",
                         self._log_name, stale.id)
        self.cluster.ledger.release(stale.id, missing_ok=True)
        if self.allocation is not None and self.allocation.id == stale.id:
            self.allocation = None

    async def start(self) -> tuple[str, int]:
        """Validate, reserve, launch; return only when *this* server answers. Roll back on any
        failure (including cancellation by the start timeout or a stop during the spawn).

        Raises:
            web.HTTPError: 400 (options, quota, capacity, refused on the node), 503 (the node
                does not answer), 500 (the server could not start: the backend's report).
        """
        try:
            profile, alloc = await self._prepare()
            try:
                uid, gid = self.user_ids()
                host_home = self.home_host_path()
                home_in = self.home_mount_point.format(username=self.escaped_name)
                image = profile.image or self.image
                spec = launch_spec(
                    name=self.object_name, user=self.user.name, server=self.name or "",
                    allocation=alloc, image=image, cmd=[*self.cmd, *self.get_args()],
                    env={**self.get_env(), "JUPYTER_IMAGE_SPEC": image}, uid=uid, gid=gid,
                    port=self.port, home=HomeMount(host_home, home_in) if host_home else None,
                    certs_dir=self.certs_dir)
                ip, port = await self.backend_obj.launch(spec, self.backend_state, self._emit)
                self._emit(60, f"{self.object_name} started at {ip}:{port}, waiting for it")
                await wait_for_own_server(
                    ip, port, self.server.base_url if self.server else "/",
                    exited=lambda: self.backend_obj.exit_report(self.backend_state),
                    timeout=self.http_timeout, tls=self.internal_ssl,
                    name=f"server of {self._log_name}")
                return ip, port
            except BaseException as e:
                await self._rollback()
                if isinstance(e, BackendError):
                    raise http_error(e) from None
                raise
        finally:
            self._prepared = None

    async def create_certs(self) -> dict[str, str]:
        """The server's internal_ssl key pair naming its address (placement and the backend's
        prepare come first: :meth:`_prepare`). See :mod:`gpuspawner.hub.certs`."""
        alloc = (await self._prepare())[1]
        names = self.backend_obj.cert_alt_names(alloc, self.backend_state)
        return await asyncio.to_thread(
            certs.create_pair, self.internal_certs_location, self.object_name, names,
            self.internal_trust_bundles["notebooks-ca"])

    async def move_certs(self, paths: dict[str, str]) -> dict[str, str]:
        """Copy the files to a folder owned by the user (0500/0400); the paths the server sees.
        """
        uid, gid = self.user_ids()
        folder = certs.server_folder(self.internal_certs_location, self.object_name)
        out = await asyncio.to_thread(certs.copy_for_server, paths, folder, uid, gid,
                                      self.backend_obj.certs_path(folder))
        self.certs_dir = folder
        return out

    async def _rollback(self) -> None:
        """Remove what the backend made and the certificates, release. Never raises."""
        state, self.backend_state = self.backend_state, {}
        await self.backend_obj.cleanup(self.allocation, state)
        folder, self.certs_dir = self.certs_dir, ""
        if folder:
            await asyncio.to_thread(certs.remove, self.internal_certs_location,
                                    self.object_name, folder)
        alloc, self.allocation = self.allocation, None
        if alloc is not None:
            self.cluster.ledger.release(alloc.id, missing_ok=True)
            self.log.info("released allocation %s of %s", alloc.id, self._log_name)

    async def stop(self, now: bool = False) -> None:
        """Stop the server, remove its objects, release the allocation (always, also when
        the node does not answer)."""
        try:
            await self.backend_obj.stop(self.backend_state, now=now)
        except BackendUnavailable as e:
            self.log.warning("%s: %s at stop; releasing", self._log_name, e)
            self.cluster.mark_suspect(e.node)
        finally:
            await self._rollback()

    async def poll(self) -> int | None:
        """None while the server runs. A stopped server, or a node that does not answer,
        gives an exit status and releases the allocation. After a hub restart a running server
        adopts the allocation restored from the backend, or books the one in its state."""
        await self.cluster.ensure_restored(self._owner_exists)
        try:
            status = await self.backend_obj.poll(self.backend_state)
        except BackendUnavailable as e:
            self.log.warning("%s: %s; reporting the server stopped", self._log_name, e)
            self.cluster.mark_suspect(e.node)
            status = 255
        ledger = self.cluster.ledger
        if status is None and self.allocation is None:
            self.allocation = ledger.find(self.user.name, self.name or "")
        a = self.allocation
        if status is not None and a is not None and not getattr(self, "_spawn_pending", False):
            # JupyterHub does not call stop() for a server whose poll says it stopped
            self.log.warning("%s stopped with status %s; releasing", self._log_name, status)
            await self._rollback()
        elif status is None and a is not None and ledger.get(a.id) is None:
            for c in ledger.restore([a]).conflicts:
                self.log.error("%s: allocation from state refused: %s", self._log_name,
                               c.problem)
        return status

    def load_state(self, state: dict[str, Any]) -> None:
        """The allocation, the backend's state and the certificate folder."""
        super().load_state(state)
        text = state.get("allocation")
        self.allocation = Allocation.from_dict(text) if text else None
        self.backend_state = dict(state.get("backend") or {})
        self.certs_dir = state.get("certs_dir", "")

    def get_state(self) -> dict[str, Any]:
        """``{"allocation", "backend", "certs_dir"}`` (what exists)."""
        state = super().get_state()
        if self.allocation is not None:
            state["allocation"] = self.allocation.to_dict()
        if self.backend_state:
            state["backend"] = self.backend_state
        if self.certs_dir:
            state["certs_dir"] = self.certs_dir
        return state

    def clear_state(self) -> None:
        """Forget the backend's state and the certificates (the ledger is released by
        stop/rollback, not here)."""
        super().clear_state()
        self.backend_state, self.certs_dir = {}, ""
