"""The hub process's one placement state: the nodes' inventories, the
:class:`~gpuspawner.placement.Ledger` and the :class:`~gpuspawner.backends.base.Backend` that
runs servers; after a hub restart the ledger is rebuilt from what the backend finds running.

There is exactly one :class:`Cluster` per hub process (:func:`get_cluster`), shared by every
GPUSpawner instance (a spawner exists per user server). It is the single source of truth for
who holds which device: the hub-side REST service reads the same object (``get_cluster``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Backend, Managed, NodeRuntime, backend_class
from ..gpushare.mechanism import Mechanism, ShareModeUnavailable, detect_mechanism
from ..gpushare.watchdog import Action, Share, Watchdog, shares_from_allocations
from ..inventory.health import GPUHealth, HealthReader, HealthThresholds
from ..inventory.local import read_local_node
from ..inventory.topology import load_topology_file
from ..placement import Ledger, LivePrior, Node, QuotaTable, RestoreReport
from ..placement.queue import WaitQueue
from ..schemas import ConfigSchemaError, validate
from .drains import DrainFileError, DrainRecord, DrainState, DrainStore
from .identity import is_job_server
from .isolation import (
    IsolationCheckError,
    is_local_engine,
    missing_message,
    parse_pools,
    read_forward_rules,
    uncovered,
)
from .metrics import gpu_share_action
from .profiles import ProfileConfigError, load_profiles
from .runtime import hub_runtime
from .spawn_queue import QueueSettings, SpawnQueue
from .start_slots import StartSlots

log = logging.getLogger("gpuspawner")

__all__ = ["Cluster", "GPUHealthSettings", "NodeConfigError", "NodeRuntime",
           "check_node_entries", "check_quotas", "current_clusters", "get_cluster",
           "parse_node_config", "reset_clusters"]


class NodeConfigError(ValueError):
    """A malformed ``c.GPUSpawner.nodes`` entry (the message names the entry and field)."""


NODE_KEYS = ("name", "docker_url", "topology", "host", "network_pool", "gpu_share", "elastic",
             "category", "provider")
QUOTA_KEYS = ("users", "groups", "default_user")


def check_quotas(quotas: Any) -> QuotaTable:
    """``c.GPUSpawner.quotas`` as a :class:`QuotaTable`:
    ``{"users": {name: q}, "groups": {name: q}, "default_user": q}``.

    First the ``quotas`` JSON Schema (:mod:`gpuspawner.schemas`: sections, keys, types,
    minimums, the form of sizes), then :meth:`QuotaTable.from_config` converts the values.

    Raises:
        ValueError: not a mapping, an unknown section, or a malformed entry; the message
            starts with the field, e.g. ``quotas.groups.students.gpus: -1 is less than the
            minimum of 0``.
    """
    validate("quotas", quotas, where="quotas")
    try:
        return QuotaTable.from_config(users=quotas.get("users"), groups=quotas.get("groups"),
                                      default_user=quotas.get("default_user"))
    except ValueError as e:  # a guard: the schema refuses what from_config would
        raise ValueError(f"quotas.{e}") from None


def check_node_entries(entries: Sequence[Any]) -> None:
    """The structure of ``c.GPUSpawner.nodes`` without reading any topology: the ``nodes``
    JSON Schema (:mod:`gpuspawner.schemas`: mappings with only :data:`NODE_KEYS`, string
    values), then unique names (empty or missing = ``local``), which a schema cannot express.

    Raises:
        NodeConfigError: the entry and field that are wrong, e.g. ``nodes[0].gpus: unknown
            field; known: ...`` or ``nodes[1].name: must be unique, 'a' is nodes[0]'s``.
    """
    try:
        validate("nodes", entries, where="nodes")
    except ConfigSchemaError as e:
        raise NodeConfigError(str(e)) from None
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        name = entry.get("name") or "local"
        if name in seen:
            raise NodeConfigError(f"nodes[{i}].name: must be unique, {name!r} is "
                                  f"nodes[{seen[name]}]'s")
        seen[name] = i


def parse_node_config(entries: Sequence[Mapping[str, Any]],
                      share_mode: str = "auto") -> list[NodeRuntime]:
    """Read ``c.GPUSpawner.nodes``: dicts with ``name``, ``docker_url`` (default: the local
    engine), ``topology`` ("auto" reads this host through sysfs and NVML, else a topology file
    path), ``host`` (default 127.0.0.1) and ``network_pool`` (CIDR blocks of its server
    networks; default: the spawner's ``server_network_pool``); an elastic node (``elastic``:
    true, :mod:`gpuspawner.elastic`) also ``category`` and ``provider``, kept in its
    runtime's ``extra["elastic"]``.

    Raises:
        NodeConfigError: unknown keys, duplicate names, or an unreadable topology (the message
            names the entry, the file and the field); a ``gpu_share`` (the node's, else
            ``share_mode``: ``c.GPUSpawner.gpu_share_mode``) that the node lacks
            (:func:`~gpuspawner.gpushare.mechanism.detect_mechanism`, which also chooses each
            runtime's ``gpu_share``).
    """
    entries = list(entries or [{"name": "local"}])
    check_node_entries(entries)
    out: list[NodeRuntime] = []
    shares: list[Mechanism] = []
    for i, entry in enumerate(entries):
        where = f"nodes[{i}]"
        name = entry.get("name") or "local"
        topology = entry.get("topology", "auto")
        pool = entry.get("network_pool") or ""
        url = str(entry.get("docker_url") or "")
        elastic = bool(entry.get("elastic"))
        if elastic and topology == "auto":
            raise NodeConfigError(
                f"{where} ({name}).topology: an elastic node needs its category's topology "
                "file (what the machine its provider starts must report), not 'auto'")
        if topology == "auto" and url and not url.startswith("unix://"):
            raise NodeConfigError(
                f"{where} ({name}).topology: 'auto' reads the hub's own host, but the node's "
                f"engine is remote ({url}); give it a topology file made on that node "
                "(gpuspawner inventory)")
        try:
            if topology == "auto":
                node = read_local_node(name)
            else:
                node = load_topology_file(topology)
                if node.name != name:
                    node = Node(name, node.numa_nodes, node.gpus, node.disk_bytes, node.labels)
        except ValueError as e:
            raise NodeConfigError(f"{where} ({name}): {e}") from None
        shares.append(_gpu_share(entry, f"{where} ({name})", node, url, share_mode))
        out.append(NodeRuntime(name=name, host=str(entry.get("host") or "127.0.0.1"),
                               topology=str(topology), node=node,
                               docker_url=str(entry.get("docker_url") or ""),
                               network_pool=str(pool),
                               extra={"elastic": {
                                   "category": str(entry.get("category") or name),
                                   "provider": str(entry.get("provider") or "command")}}
                               if elastic else {}))
    for rt, share in zip(out, shares, strict=True):
        rt.gpu_share = share
    return out


def _gpu_share(entry: Mapping[str, Any], where: str, node: Node, url: str,
               default: str) -> Mechanism:
    """The node's share mechanism (:func:`~gpuspawner.gpushare.mechanism.detect_mechanism`;
    the node is this host when its engine is, a unix socket or the environment's)."""
    mode = str(entry.get("gpu_share") or default)
    local = not url or url.startswith("unix://")
    try:
        return detect_mechanism(mode, node.gpus, local=local)
    except ShareModeUnavailable as e:
        setting = f"{where}.gpu_share" if entry.get("gpu_share") else \
            "GPUSpawner.gpu_share_mode"
        raise NodeConfigError(f"{setting}: {e}") from None


#: ``DrainRecord.by`` of the automatic health check's drains
HEALTH = "health"


@dataclass(frozen=True)
class GPUHealthSettings:
    """GPU health and drains of a hub (from ``c.GPUSpawner.gpu_*``, see
    :class:`~gpuspawner.hub.settings.SpawnerSettings`).

    Attributes:
        drains_file: the JSON file drains are kept in across restarts
            (:mod:`gpuspawner.hub.drains`); "" = not kept.
        interval_s: seconds between two health readings of this host's GPUs (nodes with
            ``topology: auto``); 0 = no automatic check.
        thresholds: when a GPU is unhealthy.
        share_mode: ``c.GPUSpawner.gpu_share_mode`` (:mod:`gpuspawner.gpushare`).
        share_grace_s: seconds a share may stay over its GPU memory before the watchdog
            interrupts its kernel. share_interval_s: seconds between two watchdog passes
            (0: no watchdog).
    """

    drains_file: str = ""
    interval_s: float = 60.0
    thresholds: HealthThresholds = field(default_factory=HealthThresholds)
    share_mode: str = "auto"
    share_grace_s: float = 60.0
    share_interval_s: float = 5.0


#: how many moves of servers off failed nodes a cluster remembers for the admin page
MOVES_KEPT = 100


@dataclass
class Cluster:
    """Nodes, the ledger and the backend of one hub process.

    Attributes:
        nodes: node runtimes by name.
        ledger: the placement ledger.
        backend: what runs the servers (bound to ``nodes``).
        restored: what the rebuild from the backend's running servers found (None before it
            ran).
    """

    nodes: dict[str, NodeRuntime]
    ledger: Ledger
    backend: Backend

    def __post_init__(self) -> None:
        self.backend.ledger = self.ledger
        if self.queue is None:  # a queue in memory until make_queue sets the hub's
            self.queue = SpawnQueue(WaitQueue(self.ledger), QueueSettings())
        self.queue.before_tick = self.refresh_held_elsewhere
    restored: RestoreReport | None = None
    _restore_lock: asyncio.Lock | None = field(default=None, repr=False)
    #: restored allocations whose owner was not yet checked against the hub's database
    _unverified: list[str] = field(default_factory=list, repr=False)
    #: allocation id -> the running server the restore found for it
    _found: dict[str, Managed] = field(default_factory=dict, repr=False)
    #: event-loop time of the last node health check
    _health_read: float = field(default=float("-inf"), repr=False)
    #: where drains are kept across restarts (None: in memory only)
    drain_store: DrainStore | None = None
    #: per-node slots for servers starting at once (c.GPUSpawner.node_concurrent_starts)
    start_slots: StartSlots = field(default_factory=StartSlots, repr=False)
    #: reads this host's GPU health (called in a worker thread); None: no automatic check
    health_reader: Callable[[], list[GPUHealth]] | None = None
    #: seconds between two GPU health readings (0: none)
    health_interval_s: float = 60.0
    #: the latest reading per GPU UUID (this host's GPUs)
    last_health: dict[str, GPUHealth] = field(default_factory=dict)
    _drains: DrainState = field(default_factory=DrainState, repr=False)
    #: GPU UUID -> why, for GPUs the ledger holds drained because something the hub did not
    #: start holds them (:meth:`refresh_held_elsewhere`; never in the drains file)
    _held_elsewhere: dict[str, str] = field(default_factory=dict, repr=False)
    #: seconds a caller of :meth:`refresh_gpu_health` waits for the reading
    health_wait_s: float = 5.0
    _gpu_health_read: float = field(default=float("-inf"), repr=False)
    _gpu_health_task: asyncio.Task[list[GPUHealth]] | None = field(default=None, repr=False)
    #: the wait queue of spawns that fit the capacity but not what is free now (never None
    #: after construction)
    queue: SpawnQueue | None = None
    #: servers moved off failed nodes, newest last (:meth:`record_move`; the admin page)
    moves: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MOVES_KEPT))
    #: seconds between two looks at nodes that stopped answering (:meth:`watch`): one that
    #: answers again is swept at once, before it takes new work
    watch_interval_s: float = 2.0
    #: seconds between two checks of the isolation firewall rule (:meth:`check_isolation`;
    #: 0: never); each spawn also reads it (``iptables -S FORWARD``, about 10 ms; concurrent
    #: spawns share one reading) unless the last one is younger than ``isolation_max_age_s``;
    #: other callers of :meth:`refresh_health` read it at most once per their ``max_age``
    isolation_interval_s: float = 60.0
    isolation_max_age_s: float = 0.0
    #: node -> why it takes no new servers: its isolation rule is missing
    isolation_missing: dict[str, str] = field(default_factory=dict)
    _isolation_read: float = field(default=float("-inf"), repr=False)
    _isolation_lock: asyncio.Lock | None = field(default=None, repr=False)
    _isolation_logged: set[str] = field(default_factory=set, repr=False)
    _watch_task: asyncio.Task[None] | None = field(default=None, repr=False)
    #: the GPU share watchdog of this host's nodes (:meth:`check_shares`; made on first use)
    share_watchdog: Watchdog | None = None
    share_grace_s: float = 60.0
    #: seconds between two watchdog passes (0: none)
    share_interval_s: float = 5.0
    _shares_read: float = field(default=float("-inf"), repr=False)
    #: the elastic nodes' manager (:class:`gpuspawner.elastic.manager.ElasticManager`), None
    #: without elastic nodes; its nodes that are not running are left out of the backend's
    #: node table and of :meth:`refresh_health`
    elastic: Any = None
    #: called with the report once the rebuild from the backend ran (:meth:`ensure_restored`):
    #: the usage records close the intervals of what no longer runs (:mod:`gpuspawner.usage`)
    after_restore: list[Callable[[RestoreReport], None]] = field(default_factory=list)
    #: the hub's usage recorder (:class:`gpuspawner.usage.UsageRecorder`), None: no records
    usage: Any = None
    #: the usage budgets (:class:`gpuspawner.usage.budgets.BudgetPolicy`), None: no records
    usage_budgets: Any = None

    def record_move(self, user: str, server: str, source: str, target: str, at: float,
                    reason: str) -> None:
        """Remember that a server moved from node ``source`` to ``target`` at ``at`` (seconds
        since the epoch) because of ``reason`` (the last :data:`MOVES_KEPT`; in memory: the
        servers' states and the log keep them across restarts)."""
        self.moves.append({"user": user, "server": server, "from": source, "to": target,
                           "at": at, "reason": reason})

    def make_queue(self, settings: QueueSettings) -> SpawnQueue:
        """Make :attr:`queue` over this ledger and restore what the queue file kept (bad
        records are logged and skipped).

        Raises:
            QueueFileError: the file's folder is missing or not writable.
        """
        q = SpawnQueue(WaitQueue(self.ledger, group_weights=settings.group_weights,
                                 max_bypass=settings.max_bypass), settings)
        q.check_file()
        for problem in q.load():
            log.error("wait queue: %s", problem)
        q.before_tick = self.refresh_held_elsewhere
        self.queue = q
        return q

    async def ensure_restored(self, owner_exists: Callable[[str, str], bool] | None = None
                              ) -> RestoreReport:
        """Rebuild the ledger from the allocations the backend's running servers carry
        (container labels, job comments), once per process (later calls return the first
        report). A node that does not answer is logged and skipped; its allocations come back
        when its spawners are polled (see GPUSpawner.poll).

        Args:
            owner_exists: ``(user, server) -> bool`` from the hub's database; a restored
                allocation whose user or server no longer exists is released and its server
                removed. None = keep all.
        """
        if hub_runtime() is self:  # the hub's own: nodes watched while it runs
            self.start_watch()
        if self.restored is not None and not (owner_exists and self._unverified):
            return self.restored
        if self._restore_lock is None:
            self._restore_lock = asyncio.Lock()
        async with self._restore_lock:
            if self.restored is None:
                await self._restore()
            if owner_exists and self._unverified:
                unverified, self._unverified = self._unverified, []
                await self._release_ownerless(unverified, owner_exists)
            assert self.restored is not None
            return self.restored

    async def _restore(self) -> None:
        found = await self.backend.list_managed()
        for m in found:
            try:
                self._found[json.loads(m.allocation)["id"]] = m
            except (ValueError, KeyError, TypeError):
                pass
        report = self.ledger.restore([m.allocation for m in found])
        for conflict in report.conflicts:
            log.error("restore: allocation %s of %s refused: %s", conflict.allocation_id,
                      conflict.owner, conflict.problem)
        if report.restored:
            log.info("restored %d allocation(s) from running servers", len(report.restored))
        self._unverified = list(report.restored)
        self.restored = report
        for fn in self.after_restore:
            try:
                fn(report)
            except Exception:  # a hook never stops the hub's restore
                log.exception("after the restore: %s failed", fn)

    async def _release_ownerless(self, allocation_ids: list[str],
                                 owner_exists: Callable[[str, str], bool]) -> None:
        """Release restored allocations whose user or server the hub no longer has, and
        remove their servers."""
        for alloc_id in allocation_ids:
            alloc = self.ledger.get(alloc_id)
            if alloc is None or is_job_server(alloc.owner.server):
                continue  # a notebook job is no hub server: the job runner adopts it
            if owner_exists(alloc.owner.user, alloc.owner.server):
                continue
            log.warning("restore: %s/%s no longer exists; removing its server and releasing "
                        "allocation %s", alloc.owner.user, alloc.owner.server, alloc.id)
            where = self._found.get(alloc.id)
            if where is not None:
                await self.backend.remove_managed(where)
            self.ledger.release(alloc.id)

    async def refresh_health(self, max_age: float = 10.0) -> None:
        """Ask the backend for every node's state (at most once per ``max_age`` seconds) and
        set it in the ledger: a down or drained node takes no new placements. A node that comes
        back up is swept first (:meth:`sweep_if_suspect`). Also reads this host's GPU health
        (:meth:`refresh_gpu_health`, at most every ``health_interval_s``)."""
        await self.refresh_gpu_health()
        await self.check_isolation(max(self.isolation_max_age_s, max_age))
        loop = asyncio.get_running_loop()
        if loop.time() - self._health_read < max_age:
            return
        self._health_read = loop.time()
        await self.refresh_held_elsewhere()
        states = await self.backend.node_states()
        for name, rt in self.nodes.items():
            if self.elastic is not None and not self.elastic.live(name):
                continue  # an elastic node that is off, starting or stopping: its manager's
            state, reason = states.get(name, ("up", ""))
            before = self._state_without_isolation(name)
            if state == "up" and name in self.isolation_missing and before[0] == "up":
                self.ledger.set_node_state(name, "drain", self.isolation_missing[name])
                continue
            if state == "up" and before[0] != "up":
                rt.suspect = True
                try:
                    await self.sweep_if_suspect(name)
                except Exception as e:  # answers ping but not the sweep: still down
                    log.warning("node %s: sweep after outage failed: %s", name, e)
                    continue
                log.info("node %s is up again", name)
            elif state != "up" and before[0] == "up":
                log.warning("node %s is %s: %s", name, state, reason)
                rt.suspect = True
            if state == "up" and name in self.isolation_missing:
                state, reason = "drain", self.isolation_missing[name]
            self.ledger.set_node_state(name, state, reason)

    async def refresh_held_elsewhere(self) -> None:
        """Ask the backend, now, which GPUs things the hub did not start hold
        (:meth:`~gpuspawner.backends.base.Backend.held_elsewhere`: on Slurm, other jobs) and
        hold them in the ledger as drained with that reason, so that no spawn is sent where it
        could only wait and a refusal names why; give each back once it is free again. A GPU
        an admin or the health check drained keeps that drain. A backend that cannot answer
        changes nothing (logged)."""
        try:
            held = await self.backend.held_elsewhere()
        except Exception as e:
            log.warning("cannot read which GPUs other jobs hold: %s", e)
            return
        drained = self.ledger.drained_gpus()
        for uuid, why in held.items():
            if self.gpu_node(uuid) is None or uuid in self._drains.drains:
                continue  # (a MIG instance, another hub's GPU; a drain of an admin's)
            if drained.get(uuid) != why:
                try:
                    self.ledger.drain_gpu(uuid, why)
                except KeyError:
                    continue
            self._held_elsewhere[uuid] = why
        for uuid in [u for u in self._held_elsewhere if u not in held]:
            del self._held_elsewhere[uuid]
            if uuid not in self._drains.drains:
                self.ledger.undrain_gpu(uuid)

    def _state_without_isolation(self, name: str) -> tuple[str, str]:
        """The ledger's state of node ``name``, "up" where it is drained only for its missing
        isolation rule."""
        state = self.ledger.node_state(name)
        if state == ("drain", self.isolation_missing.get(name)):
            return ("up", "")
        return state

    def isolation_nodes(self) -> dict[str, list[Any]]:
        """Nodes whose isolation rule the hub can check, with their server networks' blocks:
        with per-server networks (``network_isolation``), engines on this host only
        (:func:`~gpuspawner.hub.isolation.is_local_engine`)."""
        if getattr(self.backend, "network_isolation", None) != "per-server":
            return {}
        default = str(getattr(self.backend, "server_network_pool", "") or "")
        out: dict[str, list[Any]] = {}
        for name, rt in self.nodes.items():
            pool = rt.network_pool or default
            if not pool:
                continue
            if not is_local_engine(rt.docker_url):
                if name not in self._isolation_logged:
                    self._isolation_logged.add(name)
                    log.warning("node %s: its engine %s is remote: the hub cannot read that "
                                "node's firewall; keep scripts/network.sh's isolation rule "
                                "there (docs/install.md)", name, rt.docker_url)
                continue
            try:
                out[name] = parse_pools(pool)
            except ValueError as e:
                log.error("node %s: isolation rule not checked: %s", name, e)
        return out

    async def check_isolation(self, max_age: float = 0.0) -> dict[str, str]:
        """Read this host's firewall (not when the last reading is younger than ``max_age``
        seconds; callers that wait while a reading runs share the next one) and refuse new
        servers on each checkable node (:meth:`isolation_nodes`) whose server networks no
        rule isolates: the node is set to "drain" in the ledger with the reason (what runs
        there stays), naming the node and the command that restores the rule; it takes
        servers again once the rule is back.
        A firewall that cannot be read (no iptables, not root) is logged, once, and changes
        nothing.

        Returns:
            node -> reason, for the nodes that lack the rule now.
        """
        if self.isolation_interval_s <= 0:
            return self.isolation_missing
        loop = asyncio.get_running_loop()
        asked = loop.time()
        if asked - self._isolation_read < max_age:
            return self.isolation_missing
        if self._isolation_lock is None:
            self._isolation_lock = asyncio.Lock()
        async with self._isolation_lock:
            if self._isolation_read >= asked:  # a reading that began after we asked
                return self.isolation_missing
            nodes = self.isolation_nodes()
            self._isolation_read = loop.time()
            if not nodes:
                return self.isolation_missing
            try:
                rules = await read_forward_rules()
            except IsolationCheckError as e:
                if "" not in self._isolation_logged:
                    self._isolation_logged.add("")
                    log.error("the isolation rule cannot be checked on %s: %s",
                              ", ".join(sorted(nodes)), e)
                return self.isolation_missing
            for name, pools in nodes.items():
                missing = uncovered(rules, pools)
                if missing:
                    why = missing_message(name, missing)
                    if self.isolation_missing.get(name) != why:
                        log.error("%s", why)
                    before = self._state_without_isolation(name)
                    self.isolation_missing[name] = why
                    if before[0] == "up":
                        self.ledger.set_node_state(name, "drain", why)
                elif name in self.isolation_missing:
                    before = self._state_without_isolation(name)
                    del self.isolation_missing[name]
                    if before[0] == "up":
                        self.ledger.set_node_state(name, "up")
                    log.warning("node %s: the isolation rule is back; it takes new servers "
                                "again", name)
            return self.isolation_missing

    def start_watch(self) -> None:
        """Start :meth:`watch` on the running event loop, once (again after a loop that ran
        it ended)."""
        if self.elastic is not None:
            self.elastic.start()
        task = self._watch_task
        loop = asyncio.get_running_loop()
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        self._watch_task = loop.create_task(self.watch(), name="gpuspawner-cluster-watch")

    async def watch(self) -> None:
        """Run while the hub runs: every ``watch_interval_s`` seconds, while a node is
        suspect (stopped answering), ask the nodes' states (:meth:`refresh_health`), so that
        a node that answers again is swept at once, before anything else runs there (the
        containers of servers that moved away, with their old tokens, are removed); and
        every ``isolation_interval_s`` check the isolation rule (:meth:`check_isolation`);
        every ``share_interval_s`` watch the GPU shares (:meth:`check_shares`).
        Errors are logged; the loop goes on."""
        while True:
            try:
                if any(rt.suspect for rt in self.nodes.values()):
                    await self.refresh_health(max_age=0)
                await self.check_isolation(self.isolation_interval_s)
                await self.check_shares()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the watch must outlive any one error
                log.warning("node watch: %s", e)
            await asyncio.sleep(self.watch_interval_s)

    def share_nodes(self) -> list[str]:
        """Nodes whose GPU shares the watchdog here can see: their engine is on this host (a
        unix socket or the environment's) and they have GPUs."""
        return [name for name, rt in self.nodes.items()
                if rt.gpu_share is not None and rt.node.gpus
                and (not rt.docker_url or rt.docker_url.startswith("unix://"))]

    async def check_shares(self, force: bool = False) -> list[Action]:
        """One watchdog pass over the shares on this host's nodes (:mod:`gpuspawner.gpushare.
        watchdog`), at most every ``share_interval_s`` seconds (``force``: now): the running
        servers from :meth:`Backend.list_managed`, NVML read in a worker thread.

        Returns:
            what the watchdog did (empty when no pass was due, no share runs, or NVML is not
            usable here: then, logged once, the watchdog stays off).
        """
        if self.share_interval_s <= 0 and not force:
            return []
        now = time.monotonic()
        if not force and now - self._shares_read < self.share_interval_s:
            return []
        self._shares_read = now
        nodes = set(self.share_nodes())
        if not nodes:
            return []
        # on the loop only the engine's list; the allocations are parsed in the worker thread
        # (one Allocation.from_json per running server at every pass)
        found = [(m.node, m.handle, m.allocation) for m in await self.backend.list_managed()
                 if m.node in nodes]
        if not found:
            return []
        return await asyncio.to_thread(self._share_pass, found)

    def _shares(self, found: list[tuple[str, str, str]]) -> dict[str, Share]:
        """The shares among ``(node, container id, allocation JSON)`` of running servers
        (:func:`~gpuspawner.gpushare.watchdog.shares_from_allocations` per node)."""
        by_node: dict[str, list[tuple[str, str]]] = {}
        for node, handle, text in found:
            by_node.setdefault(node, []).append((handle, text))
        shares: dict[str, Share] = {}
        for node, pairs in by_node.items():
            rt = self.nodes.get(node)
            if rt is not None and rt.gpu_share is not None:
                shares.update(shares_from_allocations(
                    pairs, {g.uuid: g for g in rt.node.gpus}, rt.gpu_share))
        return shares

    def share_notices(self, user: str) -> list[dict[str, Any]]:
        """The user's shares over their GPU memory at the watchdog's last pass
        (:meth:`gpuspawner.gpushare.watchdog.Notice.to_dict`, with ``message``); empty when
        none is over or the watchdog is off."""
        wd = self.share_watchdog
        return [n.to_dict() for n in (wd.notices.get(user, ()) if wd is not None else ())]

    def _share_pass(self, found: list[tuple[str, str, str]]) -> list[Action]:
        shares = self._shares(found)
        if not shares:
            return []
        if self.share_watchdog is None:
            try:
                import pynvml

                pynvml.nvmlInit()
            except Exception as e:  # noqa: BLE001 - no NVML here: no watchdog
                log.warning("GPU share watchdog off: NVML unusable here (%s)", e)
                self.share_interval_s = 0
                return []
            self.share_watchdog = Watchdog(pynvml, grace_s=self.share_grace_s,
                                           count=gpu_share_action)
        return self.share_watchdog.check(shares)

    async def sweep_if_suspect(self, node: str) -> None:
        """If ``node`` stopped answering earlier, remove its servers the ledger no longer
        books before it gets new work (their servers were reported stopped and released, but
        may have outlived the outage and must not keep devices the ledger has given away).

        Raises:
            BackendUnavailable: the node still does not answer.
        """
        rt = self.nodes.get(node)
        if rt is None or not rt.suspect:
            return
        def booked_here(user: str, server: str) -> bool:  # a moved server: booked elsewhere
            a = self.ledger.find(user, server)
            return a is not None and a.node == node

        await self.backend.sweep(
            node, booked=lambda a: self.ledger.get(a) is not None, owner_booked=booked_here)
        rt.suspect = False

    def mark_suspect(self, node: str, reason: str = "not answering") -> None:
        """Remember that ``node`` did not answer: it takes no new placements until a health
        check sees it up again (:meth:`refresh_health`), and is swept before new work."""
        if node in self.nodes:
            self.nodes[node].suspect = True
            self.ledger.set_node_state(node, "down", reason)
            self._health_read = float("-inf")  # ask again at the next chance


    # -- drained GPUs -------------------------------------------------------------------------
    def gpu_node(self, uuid: str) -> str | None:
        """The node that has GPU ``uuid``, or None."""
        for n in self.ledger.nodes:
            if any(g.uuid == uuid for g in n.gpus):
                return n.name
        return None

    def load_drains(self) -> None:
        """Apply the drains file to the ledger (when the cluster is made, before the restore,
        which books servers that run on a drained GPU all the same). A drained GPU that no
        node has any more stays in the file (it may come back) and is logged.

        Raises:
            DrainFileError: the file does not load.
        """
        if self.drain_store is None:
            return
        self._drains = self.drain_store.load()
        for uuid, rec in self._drains.drains.items():
            try:
                self.ledger.drain_gpu(uuid, rec.reason)
            except KeyError:
                log.warning("drained GPU %s (%s) is in no node's inventory; kept in %s",
                            uuid, rec.reason, self.drain_store.path)
        if self._drains.drains:
            log.info("%d drained GPU(s) from %s", len(self._drains.drains),
                     self.drain_store.path)

    def _save_drains(self) -> None:
        if self.drain_store is None:
            return
        try:
            self.drain_store.save(self._drains)
        except DrainFileError as e:  # the ledger holds the drain; only persistence failed
            log.error("drains not saved: %s", e)

    def drain_records(self) -> dict[str, DrainRecord]:
        """Drained GPUs: UUID -> record (node, reason, by, since)."""
        return dict(self._drains.drains)

    def drain_gpu(self, uuid: str, reason: str, by: str) -> DrainRecord:
        """Take GPU ``uuid`` out of placement (:meth:`Ledger.drain_gpu`) and keep the drain in
        the drains file. ``by``: an admin's name, or ``"health"``. Draining a drained GPU
        replaces its reason and who.

        Raises:
            KeyError: no node has that GPU.
        """
        node = self.ledger.drain_gpu(uuid, reason)
        rec = DrainRecord(node, reason, by, time.time())
        self._drains.drains[uuid] = rec
        self._save_drains()
        return rec

    def undrain_gpu(self, uuid: str) -> DrainRecord | None:
        """Give GPU ``uuid`` back to placement; returns the drain it had (None: not drained).
        Undraining a GPU the health check drained acknowledges the reasons of its latest
        reading: the check drains it again only for a new reason (a new XID, a higher ECC
        count), not for the same pending retirement.

        Raises:
            KeyError: no node has that GPU.
        """
        if self.gpu_node(uuid) is None:
            raise KeyError(f"no node has GPU {uuid}")
        self.ledger.undrain_gpu(uuid)
        rec = self._drains.drains.pop(uuid, None)
        seen = self.last_health.get(uuid)
        if rec is not None and rec.by == HEALTH and seen is not None and seen.reasons:
            self._drains.acknowledged[uuid] = list(seen.reasons)
        self._save_drains()
        return rec

    # -- GPU health of this host ---------------------------------------------------------------
    def health_nodes(self) -> list[str]:
        """Nodes read from this host (``topology: auto``): their GPUs are the ones NVML here
        sees, so the automatic health check applies to them."""
        return [name for name, rt in self.nodes.items()
                if rt is not None and getattr(rt, "topology", "") == "auto"]

    async def refresh_gpu_health(self, force: bool = False) -> list[GPUHealth]:
        """Read this host's GPU health in a worker thread (``asyncio.to_thread``: NVML calls
        never run on the event loop), at most every ``health_interval_s`` seconds (``force``:
        now), and apply it (:meth:`apply_health`).

        The caller (a spawn, a service request) waits at most ``health_wait_s`` seconds: a
        reading that takes longer (NVML can hang on a failing GPU) goes on as an asyncio task
        and is applied when it ends; no second reading starts meanwhile.

        Returns:
            the reading, or [] when none was due or it did not end in time.
        """
        if self.health_reader is None or (self.health_interval_s <= 0 and not force):
            return []
        loop = asyncio.get_running_loop()
        task = self._gpu_health_task
        if task is not None and not task.done():
            return []
        if not force and loop.time() - self._gpu_health_read < self.health_interval_s:
            return []
        self._gpu_health_read = loop.time()
        task = self._gpu_health_task = loop.create_task(self._read_gpu_health())
        done, _ = await asyncio.wait({task}, timeout=self.health_wait_s)
        if not done:
            log.warning("GPU health reading takes longer than %.1f s; applied when it ends",
                        self.health_wait_s)
            return []
        return task.result()

    async def _read_gpu_health(self) -> list[GPUHealth]:
        assert self.health_reader is not None
        try:
            readings = await asyncio.to_thread(self.health_reader)
        except Exception as e:  # a failing reading must not stop spawns
            log.warning("GPU health reading failed: %s", e)
            return []
        self.apply_health(readings)
        return readings

    def apply_health(self, readings: list[GPUHealth]) -> list[str]:
        """Drain the unhealthy GPUs of this host's nodes (``by="health"``, reason: the
        reading's reasons joined with "; "). A GPU already drained keeps its drain (an
        admin's reason stays; the check's own reason is updated); a GPU that is healthy again
        stays drained until an admin undrains it (XIDs are events: the next reading no longer
        shows them); reasons acknowledged by that undrain do not drain it again.

        Returns:
            the UUIDs drained now.
        """
        local = {g.uuid for n in self.ledger.nodes if n.name in self.health_nodes()
                 for g in n.gpus}
        drained: list[str] = []
        for h in readings:
            self.last_health[h.uuid] = h
            if h.uuid not in local:
                continue
            if h.healthy:
                if self._drains.acknowledged.pop(h.uuid, None) is not None:
                    self._save_drains()
                continue
            reason = "; ".join(h.reasons)
            rec = self._drains.drains.get(h.uuid)
            if rec is not None:
                if rec.by == HEALTH and rec.reason != reason:
                    self.drain_gpu(h.uuid, reason, HEALTH)
                continue
            if set(h.reasons) <= set(self._drains.acknowledged.get(h.uuid, ())):
                continue
            rec = self.drain_gpu(h.uuid, reason, HEALTH)
            log.warning("GPU %s on node %s is unhealthy, drained: %s", h.uuid, rec.node, reason)
            drained.append(h.uuid)
        return drained


_CLUSTER: Cluster | None = None
_CLUSTER_KEY = ""
_WARNED: set[str] = set()


def get_cluster(nodes: Sequence[Mapping[str, Any]], policy: str,
                quotas: Mapping[str, Any], profiles: Any = None, backend: str = "docker",
                config: Any = None,
                health: GPUHealthSettings | Callable[[], GPUHealthSettings] | None = None,
                queue: QueueSettings | Callable[[], QueueSettings] | None = None,
                hub_id: str | Callable[[], str] = "") -> Cluster:
    """The hub process's one cluster: one ledger and one backend, whatever asks for it.

    It is made on the first call. A call with other nodes, policy or backend (a config file
    checked twice while it loads) gets a new cluster only while the current one is unused
    (nothing restored, nothing booked); after that it gets the same cluster and a warning: two
    ledgers would book the same devices twice. Other ``quotas`` (JupyterHub ``group_overrides``)
    do not make another cluster: the spawner passes its own table with each request.

    ``profiles`` (``GPUSpawner.profiles``) seed the ledger's live workload prior
    (:class:`~gpuspawner.placement.LivePrior`): fgd places against the mix of what this hub
    granted (decayed over days), with the profiles filling in while the history is short.
    ``backend`` (``GPUSpawner.backend``) is made with ``config`` (the hub's traitlets
    ``Config``: its ``c.<BackendClass>.*`` section) and bound to the nodes. ``health``
    (``GPUSpawner.gpu_*``) names the drains file, checked and applied to the new ledger here,
    and the automatic health check of this host's GPUs (not part of the key: the first
    caller's settings hold); a callable is called only when a cluster is made. ``queue``
    (``GPUSpawner.queue_*``) makes the wait queue (:class:`~gpuspawner.hub.spawn_queue.SpawnQueue`)
    and restores its file, likewise only with a new cluster; None = a queue in memory.
    ``hub_id`` (:mod:`~gpuspawner.hub.hub_id`; a callable is called only when a cluster is
    made) becomes the backend's ``hub_id``: objects of other hubs on the same engine are not
    this cluster's.

    Raises:
        NodeConfigError, ValueError: bad node, policy, quota or backend configuration.
        DrainFileError: the drains file's folder is not writable or the file does not load.
        QueueFileError: the queue file's folder is missing or not writable.
    """
    global _CLUSTER, _CLUSTER_KEY
    # not the quotas: a spawner's own table (JupyterHub group_overrides) is an input of its
    # requests (gpuspawner.hub.request.quota_table), the first caller's is the ledger's default
    key = json.dumps([list(nodes), policy, backend], sort_keys=True, default=str)
    if _CLUSTER is not None and key != _CLUSTER_KEY:
        if _CLUSTER.restored is None and not _CLUSTER.ledger.allocations():
            _CLUSTER = None  # still unused: the later configuration replaces it
        else:
            if key not in _WARNED:
                _WARNED.add(key)
                log.warning("a GPUSpawner asked for nodes/policy/backend that differ "
                            "from the hub's; it uses the hub's one ledger and backend")
            return _CLUSTER
    if _CLUSTER is None:
        settings = (health() if callable(health) else health) or GPUHealthSettings()
        runtimes = parse_node_config(nodes, settings.share_mode)
        quota_table = check_quotas(quotas)
        ledger = Ledger([rt.node for rt in runtimes], policy=policy, quotas=quota_table,
                        prior=_prior(profiles))
        # gpuspawner's MPS daemons serve one user per GPU (their clients share its IPC
        # namespace): placement keeps other users' shares off such a GPU
        ledger.set_one_user_shares(rt.name for rt in runtimes
                                   if getattr(rt.gpu_share, "mps_daemon", False))
        table = {rt.name: rt for rt in runtimes}
        made = backend_class(backend)(config=config) if config is not None else \
            backend_class(backend)()
        made.bind(table)
        made.ledger = ledger
        made.hub_id = hub_id() if callable(hub_id) else hub_id
        made.check_config()
        cluster = Cluster(table, ledger, made)
        cluster.share_grace_s = settings.share_grace_s
        cluster.share_interval_s = settings.share_interval_s
        if settings.drains_file:
            cluster.drain_store = DrainStore(settings.drains_file)
            cluster.drain_store.check()
            cluster.load_drains()
        cluster.health_interval_s = settings.interval_s
        if settings.interval_s > 0 and cluster.health_nodes():
            cluster.health_reader = HealthReader(None, settings.thresholds).read
        cluster.make_queue((queue() if callable(queue) else queue) or QueueSettings())
        _CLUSTER = cluster
        _CLUSTER_KEY = key
    return _CLUSTER


def _prior(profiles: Any) -> LivePrior | None:
    """The live workload prior seeded with the profiles' bundles (None without profiles;
    a profile configuration that does not load is reported by the configuration check)."""
    if profiles is None:
        return None
    try:
        return LivePrior.from_bundles([p.bundle for p in load_profiles(profiles)])
    except ProfileConfigError:
        return None


def current_clusters() -> list[Cluster]:
    """The hub process's cluster, as a list (empty before the first spawner or check)."""
    return [_CLUSTER] if _CLUSTER is not None else []


def reset_clusters() -> None:
    """Forget the cluster (tests; a new hub process starts empty anyway)."""
    global _CLUSTER, _CLUSTER_KEY
    _CLUSTER, _CLUSTER_KEY = None, ""
    _WARNED.clear()
