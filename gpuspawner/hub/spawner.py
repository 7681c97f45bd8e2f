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
import inspect
import time
from contextlib import AbstractAsyncContextManager
from typing import Any

import jupyterhub
from jupyterhub.scopes import get_scopes_for
from jupyterhub.spawner import Spawner
from tornado import web
from traitlets import default

from ..backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    ImageRefused,
    ServerRef,
    current_spawner,
)
from ..backends.spec import HomeMount, Mount, launch_spec
from ..placement import Allocation, Owner, PlacementError, QuotaExceeded
from ..placement.queue import QueueEntry
from ..server_state import ServerState, moved_env
from ..usage.budgets import BudgetExceeded, check_start
from . import certs, port_report  # noqa: F401 (port_report adds the hub's port-report API)
from .cluster import HEALTH, Cluster, get_cluster
from .form import OptionsFormMixin
from .hub_id import hub_id
from .identity import home_path, legacy_home_to_move, object_name, safe_name
from .metrics import placement_refused, server_moved
from .profiles import Profile
from .progress import ProgressEvents, placement_message
from .readiness import server_tls, wait_for_own_server
from .runtime import hub_runtime
from .settings import SpawnerSettings, hub_db_url
from .spawn_queue import QueueTimeout
from .start_slots import node_limit
from .user_options import install_user_options_guard
from .volumes import VolumeConfigError, mounts_for, site_volumes

__all__ = ["GPUSpawner", "safe_name"]


def http_error(e: BackendError) -> web.HTTPError:
    """A backend's error as the hub answers it (``BackendError.status_code``)."""
    return web.HTTPError(e.status_code, str(e))


class GPUSpawner(OptionsFormMixin, ProgressEvents, SpawnerSettings, Spawner):
    """Spawn each server through a backend, pinned to an allocation from the ledger.

    Settings: :class:`~gpuspawner.hub.settings.SpawnerSettings` (``c.GPUSpawner.*``), the spawn
    form: :class:`~gpuspawner.hub.form.OptionsFormMixin`, the backend's own settings:
    ``c.DockerBackend.*`` (:class:`~gpuspawner.backends.docker_backend.DockerBackend`).
    """

    @default("port")
    def _default_port(self) -> int:
        return 8888  # in the server's own network namespace (DockerSpawner's default)

    @default("ip")
    def _default_ip(self) -> str:
        return self.backend_obj.listen_ip

    allocation: Allocation | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prepared: tuple[Profile, Allocation] | None = None
        #: the backend's JSON-able record of this server (stored in the hub's database)
        self.backend_state: dict[str, Any] = {}
        self.certs_dir = ""
        #: a user's own image as checked on the node (ServerState.image), {} for others
        self.image_record: dict[str, Any] = {}
        #: restarts on another node after a node failure (ServerState.moves)
        self.moves: list[dict[str, Any]] = []
        #: the move under way (``{"from", "at", "reason"}``) while restart_elsewhere starts
        #: the server anew: given to the new container as ``GPUSPAWNER_MOVED``
        self._moving: dict[str, Any] | None = None
        install_user_options_guard(self.profiles, self.user_options_max_bytes, self.log,
                                   self.image_deny_patterns, self.allowed_registries)

    @property
    def cluster(self) -> Cluster:
        """The hub's one runtime (:func:`~gpuspawner.hub.runtime.hub_runtime`: nodes,
        ledger, backend, queue), made at hub start; outside a started hub (a test's spawner),
        the cluster for this spawner's settings."""
        runtime = hub_runtime()
        if runtime is not None:
            return runtime
        return get_cluster(self.nodes, self.placement_policy, self.quotas, self.profiles,
                           self.backend, self.config, health=self.gpu_health_settings,
                           queue=self.queue_settings, hub_id=self._hub_id)

    def _hub_id(self) -> str:
        """This hub's id (:func:`~gpuspawner.hub.hub_id.hub_id`), kept in ``state_dir``; ""
        outside a hub."""
        return hub_id(self.state_dir, hub_db_url())

    @property
    def backend_obj(self) -> Backend:
        """The hub's one backend."""
        return self.cluster.backend

    @property
    def object_name(self) -> str:
        """Name of the server's engine objects (:func:`~gpuspawner.hub.identity.object_name`).
        """
        return object_name(self.user.name, self.name or "")

    @property
    def escaped_name(self) -> str:
        return safe_name(self.user.name)

    def _home_mount(self) -> HomeMount | None:
        """The user's home (``home_path_template``), with the folder of its gpuspawner 0.x
        name to move from when no one else may own that folder
        (:func:`~gpuspawner.hub.identity.legacy_home_to_move`)."""
        host_home = self.home_host_path()
        if not host_home:
            return None
        legacy = None
        old_part = legacy_home_to_move(self.user.name)
        if old_part is not None:
            try:
                legacy = home_path(self.home_path_template, old_part)
            except ValueError:
                legacy = None
        return HomeMount(host_home, self.home_mount_point.format(username=self.escaped_name),
                         legacy)

    def mounts(self, profile: Profile) -> tuple[Mount, ...]:
        """The site's folders for this server: ``volumes``, the profile's, and the
        ``group_volumes`` of the user's groups (:func:`~gpuspawner.hub.volumes.mounts_for`;
        checked at hub start). Raises web.HTTPError(500) for a setting that does not parse
        (a hub started without the start-up check)."""
        try:
            specs = site_volumes(self.volumes, self.group_volumes)
        except VolumeConfigError as e:
            raise web.HTTPError(500, str(e)) from None
        return mounts_for([*specs, *profile.volumes], self.escaped_name, self.group_names)

    def _ref(self) -> ServerRef:
        return ServerRef(self.user.name, self.name or "", self.object_name)

    async def _prepare(self) -> tuple[Profile, Allocation]:
        """Validate, reserve and have the backend prepare the server, once per spawn (from
        :meth:`create_certs` with internal_ssl, whose certificate names the address, else from
        :meth:`start`). Raises web.HTTPError 400 (options, quota, capacity) or 503."""
        if self._prepared is not None:
            return self._prepared
        self._events = []
        self.raise_options_refusal()
        request, cluster = self.server_request(), self.cluster
        profile = request.profile
        await cluster.ensure_restored(self._owner_exists)
        await cluster.refresh_health()
        await cluster.check_isolation(cluster.isolation_max_age_s)  # the firewall, now
        await cluster.refresh_held_elsewhere()  # before booking: other jobs' GPUs are not free
        await self._release_stale()
        owner = Owner(self.user.name, self.name or "", tuple(self.group_names))
        if request.user_image:  # before any booking: a pull or a bad image holds no GPU
            self.image_record = await self._check_user_image(request.image, profile)
        if self._moving is None:  # a server moved off a failed node is no new start
            await self._check_usage_budget(profile.slug)
        waited: list[bool] = []

        def on_wait(entry: QueueEntry, position: int, length: int) -> None:
            waited[:] = [True]
            self._queue_progress(entry, position, length)

        try:
            alloc = await cluster.queue.acquire(
                owner, profile.bundle, profile=profile.slug, nodes=profile.nodes,
                options=dict(request.options), wait=request.queue,
                on_wait=on_wait, quotas=self.request_quotas(),
                priority=self.queue_priority)
        except QueueTimeout as e:
            placement_refused(e)
            raise self.refused(503, f"profile {profile.slug!r}: {e}", profile.slug) from None
        except PlacementError as e:
            placement_refused(e)
            where = "profile" if isinstance(e, QuotaExceeded) else f"profile {profile.slug!r}"
            # a node it could use is down or drained: may pass, so "unavailable", not "bad"
            code = 400 if isinstance(e, QuotaExceeded) or not any(
                cluster.ledger.node_state(n)[0] != "up" for n in profile.nodes or cluster.nodes
            ) else 503
            raise self.refused(code, f"{where}: {e}", profile.slug) from None
        if waited and self._moving is None:  # the budget may have run out while it waited
            try:
                await self._check_usage_budget(profile.slug)
            except BaseException:  # refused (or the spawn cancelled meanwhile): not kept
                cluster.ledger.release(alloc.id, missing_ok=True)
                cluster.queue.kick()  # the GPUs it got go to the next in line
                raise
        self.allocation = alloc
        self.log.info("%s: placed on %s", self._log_name, alloc.summary())  # for admins
        self._emit(20, "Placed: " + placement_message(
            alloc, cluster.ledger.node(alloc.node), show_node=len(cluster.nodes) > 1))
        try:
            await cluster.sweep_if_suspect(alloc.node)
            self.backend_state = await self.backend_obj.prepare(self._ref(), alloc, {})
        except BaseException as e:
            await self._rollback()
            raise self._backend_failure(e) from None
        self._prepared = (profile, alloc)
        return self._prepared

    def user_scopes(self) -> set[str]:
        """The scopes the server's owner holds through roles and groups (JupyterHub's
        ``get_scopes_for``); empty without a hub user (tests' stand-ins)."""
        orm_user = getattr(self.user, "orm_user", None)
        return set(get_scopes_for(orm_user)) if orm_user is not None else set()

    async def _check_usage_budget(self, slug: str) -> None:
        """Refuse the spawn while one of the owner's usage budgets is used up
        (:func:`gpuspawner.usage.budgets.check_budgets`, ``c.GPUSpawner.usage_budgets``), on
        the quota refusal's path (HTTP 400, the spawn page shows it). Holders of
        ``custom:gpuspawner:budget-exempt`` pass.

        Raises:
            web.HTTPError(400): ``profile: usage budget 'group physics' is used up: ...``.
        """
        cluster = self.cluster
        policy = getattr(cluster, "usage_budgets", None)
        recorder = getattr(cluster, "usage", None)
        if not policy or recorder is None:
            return
        try:
            await check_start(recorder.store, policy, self.user.name, self.group_names,
                              self.user_scopes())
        except BudgetExceeded as e:
            placement_refused(e)
            raise self.refused(400, f"profile: {e}", slug) from None

    async def _check_user_image(self, image: str, profile: Profile) -> dict[str, Any]:
        """Check a user's own image (``image--unlisted-choice``) on every node the profile
        may use that is up (:meth:`Backend.check_image`: pulled, the node's architecture,
        ``jupyterhub-singleuser`` runs in it), and that its JupyterHub is one this hub talks
        to (major version 4 up to the hub's own). Returns ``ServerState.image``.

        Raises:
            web.HTTPError(400): the image fails a check, naming ``image--unlisted-choice``.
        """
        uid, gid = self.user_ids()
        cluster = self.cluster
        nodes = [n for n in (profile.nodes or cluster.nodes)
                 if n in cluster.nodes and cluster.ledger.node_state(n)[0] == "up"]
        hub_major = int(jupyterhub.__version__.split(".")[0])
        record: dict[str, Any] = {}
        for node in nodes:
            try:
                found = await self.backend_obj.check_image(
                    node, image, uid, gid, self.image_check_timeout, self._emit,
                    self.image_max_bytes)
            except ImageRefused as e:
                raise self.refused(400, f"image--unlisted-choice: {e}", profile.slug) from None
            except BackendUnavailable as e:
                cluster.mark_suspect(e.node, str(e))
                continue
            major = int(found.jupyterhub_version.split(".")[0])
            if not 4 <= major <= hub_major:
                raise self.refused(
                    400, f"image--unlisted-choice: image {image!r} has JupyterHub "
                         f"{found.jupyterhub_version}; this hub (JupyterHub "
                         f"{jupyterhub.__version__}) talks to 4.x up to {hub_major}.x",
                    profile.slug)
            record = {"reference": image, "digest": found.digest,
                      "jupyterhub_version": found.jupyterhub_version}
            self._emit(15, f"Image {image} checked ({found.digest[:19]}, JupyterHub "
                           f"{found.jupyterhub_version})")
        self.log.info("%s: user image %s checked: %s", self._log_name, image, record)
        return record

    def _queue_progress(self, entry: QueueEntry, position: int, length: int) -> None:
        """Progress while waiting: "waiting: position 2 of 3 for 1 x A100; 0 of 4 A100 free
        now" (emitted when it changes)."""
        wants = self.cluster.queue.wq.gpus_wanted(entry) or entry.bundle.describe()
        text = f"waiting: position {position} of {length} for {wants}"
        b = entry.bundle
        if b.total_gpu_milli:
            free, total = self.cluster.ledger.free_gpus(b.gpu_models, entry.nodes, b.mig)
            models = (f"MIG {b.mig}" if b.mig else
                      "/".join(b.gpu_models) if b.gpu_models else "GPUs")
            text += f"; {free} of {total} {models} free now"
        note = self.cluster.queue.note(entry)  # an elastic node being started for it
        if note:
            text += f"; {note}"
        text += "; you keep your place until a server stops (the stop button cancels)"
        if not self._events or self._events[-1]["message"] != text:
            self._emit(10, text)

    async def run_pre_spawn_hook(self) -> None:
        """The admin's pre_spawn_hook, then placement (:meth:`_prepare`): a spawn that waits
        in the queue waits here, before JupyterHub starts ``start_timeout`` for ``start``."""
        result = super().run_pre_spawn_hook()
        if inspect.isawaitable(result):
            await result
        await self._prepare()

    def _backend_failure(self, e: BaseException) -> BaseException:
        """What to raise for ``e`` from the backend: an HTTP error for a BackendError (a node
        that does not answer is marked down first), anything else as it is."""
        if isinstance(e, BackendUnavailable):
            self.cluster.mark_suspect(e.node, str(e))
        return http_error(e) if isinstance(e, BackendError) else e

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
        current_spawner.set(self)  # this task's spawner, for the admin's callable settings
        try:
            profile, alloc = await self._prepare()
            try:
                uid, gid = self.user_ids()
                # the admin's image (the profile's or the spawner's) runs the root helpers
                # on the node; a user's own image runs only the server, as the user
                admin_image = profile.image or self.image
                image = self.server_request().image or admin_image
                spec = launch_spec(
                    name=self.object_name, user=self.user.name, server=self.name or "",
                    allocation=alloc, image=image, cmd=[*self.cmd, *self.get_args()],
                    env={**self.get_env(), "JUPYTER_IMAGE_SPEC": image,
                         **moved_env(self._moving, alloc.node)}, uid=uid, gid=gid,
                    port=self.port, home=self._home_mount(),
                    certs_dir=self.certs_dir, mounts=self.mounts(profile),
                    helper_image=admin_image)
                async with self._start_slot(alloc.node):
                    ip, port = await self.backend_obj.launch(spec, self.backend_state,
                                                             self._emit)
                    self.allocation = self.cluster.ledger.get(alloc.id) or alloc  # adopted?
                    self._emit(60, f"Server started ({self.object_name} at {ip}:{port}), "
                               "waiting for Jupyter to answer")
                    await wait_for_own_server(
                        ip, port, self.server.base_url if self.server else "/",
                        exited=lambda: self.backend_obj.exit_report(self.backend_state),
                        timeout=self.http_timeout,
                        tls=self.internal_ssl and server_tls(self.user.settings,
                                                             self.object_name),
                        name=f"server of {self._log_name}")
                return ip, port
            except BaseException as e:
                await self._rollback()
                raise self._backend_failure(e) from None
        finally:
            self._prepared = None

    def _start_slot(self, node: str) -> AbstractAsyncContextManager[None]:
        """One of ``node``'s start slots (:mod:`gpuspawner.hub.start_slots`), held from the
        launch until the server answers; a wait shows in the progress."""
        try:
            cpus = self.cluster.ledger.node(node).cpu_count
        except KeyError:
            cpus = 1
        limit = node_limit(self.node_concurrent_starts, cpus)

        def on_wait(ahead: int) -> None:
            self._emit(55, f"Waiting to start: {ahead} server start(s) on {node} before this "
                           f"one (at most {limit} at once)")

        return self.cluster.start_slots.slot(node, limit, self.user.name, on_wait,
                                             self.node_start_slot_timeout)

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
            self.cluster.queue.kick()  # what was released may start a waiting spawn

    async def stop(self, now: bool = False) -> None:
        """Stop the server, remove its objects, release the allocation (always, also when
        the node does not answer); a wait in the queue that was cancelled is dropped."""
        self.cluster.queue.forget(self.user.name, self.name or "")
        try:
            await self.backend_obj.stop(self.backend_state, now=now)
        except BackendUnavailable as e:
            self.log.warning("%s: %s at stop; releasing", self._log_name, e)
            self.cluster.mark_suspect(e.node, str(e))
        finally:
            await self._rollback()

    async def poll(self) -> int | None:
        """None while the server runs. A stopped server, or a node that does not answer,
        gives an exit status and releases the allocation. After a hub restart a running server
        adopts the allocation restored from the backend, or books the one in its state."""
        await self.cluster.ensure_restored(self._owner_exists)
        if not getattr(self, "_spawn_pending", False):  # the user cancelled its wait
            self.cluster.queue.forget(self.user.name, self.name or "")
        unavailable: BackendUnavailable | None = None
        try:
            status = await self.backend_obj.poll(self.backend_state)
        except BackendUnavailable as e:
            self.cluster.mark_suspect(e.node, str(e))
            status, unavailable = 255, e
        if status is not None and unavailable is None and self.allocation is not None:
            # did it end because its node failed? (asked now: a node set down a moment ago)
            await self.cluster.refresh_health(max_age=0)
        failed = self.node_failure(unavailable)
        if status is not None and self.allocation is not None:
            self.log.info("%s: ended with status %s; node %s: %s", self._log_name, status,
                          self.allocation.node, failed or "up")
        if failed and not getattr(self, "_spawn_pending", False):
            if await self.restart_elsewhere(failed):
                return None
        if unavailable is not None:
            self.log.warning("%s: %s; reporting the server stopped", self._log_name,
                             unavailable)
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

    def node_failure(self, unavailable: BackendUnavailable | None = None) -> str:
        """Why this server's node failed, in words; "" when it did not. A node fails when its
        engine does not answer (``unavailable``), when the ledger has it down or drained
        (a health check, Slurm's node state), or when a GPU of the allocation is drained as
        unhealthy (:mod:`gpuspawner.hub.drains`, by ``health``)."""
        a = self.allocation
        if a is None:
            return ""
        if unavailable is not None:
            return f"node {a.node} does not answer ({unavailable.reason})"
        state, reason = self.cluster.ledger.node_state(a.node)
        if state != "up" and reason != self.cluster.isolation_missing.get(a.node):
            # (a node without its isolation rule takes no new servers; what runs stays)
            return f"node {a.node} is {state}" + (f" ({reason})" if reason else "")
        records = self.cluster.drain_records()
        sick = [u for u in a.gpu_uuids if u in records and records[u].by == HEALTH]
        if sick:
            return f"GPU {sick[0]} on node {a.node} is unhealthy ({records[sick[0]].reason})"
        return ""

    async def restart_elsewhere(self, why: str) -> bool:
        """Move this server off its failed node: release its booking (once; what is left on
        the node is swept when the node answers again), book the same request anew on a
        healthy node (through the wait queue), start it and route the user's URL to it.

        Allowed by the profile's ``restart_on_node_failure`` (else the spawner's), at most
        ``restart_limit`` times an hour, and not sooner than ``restart_backoff`` seconds
        (doubled per move in the hour) after the last move. Recorded in the state
        (``moves``), the hub's log, the ``gpuspawner_server_moves`` metric and the spawn
        page's progress events, in the user's words.

        Returns:
            True when the server runs again elsewhere; False when it may not move or could not
            be started (it is then reported stopped, as before).
        """
        try:
            profile = self.chosen_profile()
        except web.HTTPError:
            return False
        allowed = profile.restart_on_node_failure
        if not (self.restart_on_node_failure if allowed is None else allowed):
            return False
        now = time.time()
        recent = [m for m in self.moves if now - float(m.get("at", 0)) < 3600]
        wait = self.restart_backoff * 2 ** (len(recent) - 1) if recent else 0.0
        if len(recent) >= self.restart_limit or (
                recent and now - float(recent[-1].get("at", 0)) < wait):
            self.log.warning("%s: %s; not moved again (%d moves in the last hour, limit %d, "
                             "backoff %g s): stopping it", self._log_name, why, len(recent),
                             self.restart_limit, wait)
            server_moved("limit")
            return False
        old = self.allocation.node if self.allocation is not None else "?"
        owner = Owner(self.user.name, self.name or "", tuple(self.group_names))
        try:  # no other usable node could ever hold it (a profile pinned to that node)
            self.cluster.queue.wq.check_admissible(profile.bundle, owner, profile.nodes or None,
                                                   self.request_quotas())
        except PlacementError as e:
            self.log.warning("%s: %s; no other node can take it (%s): stopping it",
                             self._log_name, why, e)
            server_moved("failed")
            return False
        self.log.warning("%s: %s; moving it to another node", self._log_name, why)
        await self._rollback()  # the booking is released here, once
        self._renew_api_token()  # the container left on the old node keeps a dead token
        if self.server is not None and self.internal_ssl:
            self.cert_paths = await self.move_certs(await self.create_certs())
        self._moving = {"from": old, "at": now, "reason": why}
        try:
            ip, port = await asyncio.wait_for(self.start(), self.start_timeout)
        except BaseException as e:  # noqa: BLE001 - any failure: stopped, as before
            if isinstance(e, asyncio.CancelledError):
                raise
            self.log.error("%s: could not restart it elsewhere: %s", self._log_name, e)
            server_moved("failed")
            return False
        finally:
            self._moving = None
        new = self.allocation.node if self.allocation is not None else "?"
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now))
        self.moves = [*self.moves, {"from": old, "to": new, "at": now, "reason": why}]
        self.cluster.record_move(self.user.name, self.name or "", old, new, now, why)
        self._emit(100, f"Your server moved from node {old} to node {new} at {when} because "
                        f"{why}; files in your home are safe; running kernels were lost.")
        self.log.warning("%s: moved from node %s to node %s (%s)", self._log_name, old, new,
                         why)
        server_moved("moved")
        await self._route_to(ip, port)
        return True

    def _renew_api_token(self) -> None:
        """Give the server a new API token (the same note and scopes) and revoke the one it
        ran with, also as its OAuth client's secret: what is left of the server on a failed
        node (until the node answers again and is swept) can no longer act for the user or
        the server. Nothing to do outside a hub."""
        db, old = self.db, self.api_token
        if db is None or not old or self.user is None:
            return
        from jupyterhub import orm
        from jupyterhub.utils import hash_token

        found = orm.APIToken.find(db, old)
        if found is None:
            return
        self.api_token = self.user.new_api_token(note=found.note, scopes=list(found.scopes))
        client = db.query(orm.OAuthClient).filter_by(
            identifier=self.oauth_client_id).one_or_none()
        if client is not None:
            client.secret = hash_token(self.api_token)
        db.delete(found)
        db.commit()
        self.log.info("%s: API token renewed for the move; the old one is revoked",
                      self._log_name)

    async def _route_to(self, ip: str, port: int) -> None:
        """Point the hub's record and the proxy's route of this server at ``ip:port`` and save
        the state (inside a hub; nothing to do for a spawner without one)."""
        if self.server is None:
            return
        self.server.ip, self.server.port = ip, port
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is not None:
            orm_spawner.state = self.get_state()
        if self.db is not None:
            self.db.commit()
        proxy = (getattr(self.user, "settings", None) or {}).get("proxy")
        if proxy is not None:
            await proxy.add_user(self.user, self.name)

    def load_state(self, state: dict[str, Any]) -> None:
        """The allocation, the backend's state and the certificate folder
        (:class:`~gpuspawner.server_state.ServerState`, the view the culler reads too)."""
        super().load_state(state)
        view = ServerState.from_state(state)
        self.allocation = Allocation.from_dict(view.allocation) if view.allocation else None
        self.backend_state = view.backend
        self.certs_dir = view.certs_dir
        self.image_record = view.image
        self.moves = view.moves

    def get_state(self) -> dict[str, Any]:
        """``{"allocation", "backend", "certs_dir", "image", "moves"}`` (what exists), written
        through :class:`~gpuspawner.server_state.ServerState`. The allocation's dict is made
        once per allocation (JupyterHub asks for the state of every server in each page of
        ``GET /hub/api/users`` that shows states, and at each save)."""
        a = self.allocation
        if a is not None and (self._state_allocation is None
                              or self._state_allocation[0] is not a):
            self._state_allocation = (a, a.to_dict())  # (frozen: a change is a new object)
        return {**super().get_state(), **ServerState(
            self._state_allocation[1] if a is not None else {},  # type: ignore[index]
            self.backend_state, self.certs_dir, self.image_record, self.moves).to_state()}

    #: (allocation, its ``to_dict``) of the last :meth:`get_state`
    _state_allocation: tuple[Allocation, dict[str, Any]] | None = None

    def clear_state(self) -> None:
        """Forget the backend's state and the certificates (the ledger is released by
        stop/rollback, not here)."""
        super().clear_state()
        self.backend_state, self.certs_dir, self.image_record = {}, "", {}
        self.moves = []
