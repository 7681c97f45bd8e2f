"""The hub process's one placement state: the nodes' inventories, their Docker engines and the
:class:`~gpuspawner.placement.Ledger`, rebuilt from container labels after a hub restart.

There is exactly one :class:`Cluster` per hub process (:func:`get_cluster`), shared by every
GPUSpawner instance (a spawner exists per user server). It is the single source of truth for
who holds which device: the hub-side REST service reads the same object (``get_cluster``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import docker

from ..backends.docker import DISK_LIMIT_DRIVERS
from ..backends.docker_network import NetworkManager, parse_pool
from ..backends.spec import ALLOCATION_LABEL, MANAGED_LABEL
from ..inventory.local import read_local_node
from ..inventory.topology import load_topology_file
from ..placement import Ledger, LivePrior, Node, QuotaTable, RestoreReport

log = logging.getLogger("gpuspawner")



class NodeConfigError(ValueError):
    """A malformed ``c.GPUSpawner.nodes`` entry (the message names the entry and field)."""


@dataclass
class NodeRuntime:
    """One configured node: its inventory, its Docker engine and how to reach its servers.

    Attributes:
        name: node name.
        docker_url: Docker engine URL ("" = the environment's default, ``DOCKER_HOST``).
        host: address at which servers on this node are reached with host networking.
        topology: "auto" or the topology file's path.
        node: the inventory.
        network_pool: CIDR blocks this node's server networks come from ("" = the
            spawner's ``server_network_pool``); engines sharing one host need disjoint pools.
    """

    name: str
    docker_url: str
    host: str
    topology: str
    node: Node
    network_pool: str = ""
    #: set when the engine stopped answering: containers the ledger no longer books may
    #: still run there; the next placement on the node removes them first (sweep_orphans)
    suspect: bool = False
    _client: docker.APIClient | None = None
    _disk_limit: bool | None = None
    _storage_driver: str = ""
    _networks: dict[tuple[str, int], NetworkManager] = field(default_factory=dict)

    def networks(self, pool: str, prefixlen: int) -> NetworkManager:
        """The manager of this node's server networks carved from the node's
        ``network_pool``, else ``pool`` (CIDR blocks, comma separated), in /``prefixlen``
        blocks (one manager per pool and size)."""
        pool = self.network_pool or pool
        key = (pool, prefixlen)
        if key not in self._networks:
            self._networks[key] = NetworkManager(self.client, parse_pool(pool), prefixlen)
        return self._networks[key]

    @property
    def client(self) -> docker.APIClient:
        """Low-level Docker client of this node's engine (created on first use)."""
        if self._client is None:
            if self.docker_url:
                self._client = docker.APIClient(base_url=self.docker_url, version="auto")
            else:
                kwargs = docker.utils.kwargs_from_env()
                self._client = docker.APIClient(version="auto", **kwargs)
        return self._client

    def disk_limit_supported(self) -> tuple[bool, str]:
        """Whether the engine enforces ``storage_opt size`` and its storage driver (blocking:
        one ``docker info`` call, cached). overlay2 counts only on an xfs backing file system
        (which then must be mounted with ``pquota``; docker refuses the option otherwise)."""
        if self._disk_limit is None:
            info = self.client.info()
            driver = str(info.get("Driver", ""))
            backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
            self._storage_driver = driver
            self._disk_limit = driver in DISK_LIMIT_DRIVERS or (
                driver == "overlay2" and backing == "xfs")
        return self._disk_limit, self._storage_driver


NODE_KEYS = ("name", "docker_url", "topology", "host", "network_pool")
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
    from ..schemas import validate

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
    from ..schemas import ConfigSchemaError, validate

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


def parse_node_config(entries: Sequence[Mapping[str, Any]]) -> list[NodeRuntime]:
    """Read ``c.GPUSpawner.nodes``: dicts with ``name``, ``docker_url`` (default: the local
    engine), ``topology`` ("auto" reads this host through sysfs and NVML, else a topology file
    path), ``host`` (default 127.0.0.1) and ``network_pool`` (CIDR blocks of its server
    networks; default: the spawner's ``server_network_pool``).

    Raises:
        NodeConfigError: unknown keys, duplicate names, or an unreadable topology (the message
            names the entry, the file and the field).
    """
    entries = list(entries or [{"name": "local"}])
    check_node_entries(entries)
    out: list[NodeRuntime] = []
    for i, entry in enumerate(entries):
        where = f"nodes[{i}]"
        name = entry.get("name") or "local"
        topology = entry.get("topology", "auto")
        pool = entry.get("network_pool") or ""
        try:
            if pool:
                parse_pool(pool, f"{where}.network_pool")
            if topology == "auto":
                node = read_local_node(name)
            else:
                node = load_topology_file(topology)
                if node.name != name:
                    node = Node(name, node.numa_nodes, node.gpus, node.disk_bytes, node.labels)
        except ValueError as e:
            raise NodeConfigError(f"{where} ({name}): {e}") from None
        out.append(NodeRuntime(name=name, docker_url=str(entry.get("docker_url") or ""),
                               host=str(entry.get("host") or "127.0.0.1"),
                               topology=str(topology), node=node, network_pool=str(pool)))
    return out


@dataclass
class Cluster:
    """Nodes, engines and the ledger of one hub process.

    Attributes:
        nodes: node runtimes by name.
        ledger: the placement ledger.
        restored: what the rebuild from container labels found (None before it ran).
    """

    nodes: dict[str, NodeRuntime]
    ledger: Ledger
    restored: RestoreReport | None = None
    _restore_lock: asyncio.Lock | None = field(default=None, repr=False)
    #: restored allocations whose owner was not yet checked against the hub's database
    _unverified: list[str] = field(default_factory=list, repr=False)
    #: allocation id -> (node, container id) of the containers found by the restore
    _containers: dict[str, tuple[NodeRuntime, str]] = field(default_factory=dict, repr=False)

    async def ensure_restored(self, owner_exists: Callable[[str, str], bool] | None = None
                              ) -> RestoreReport:
        """Rebuild the ledger from the labels of running GPUSpawner containers on every node,
        once per process (later calls return the first report). A node whose engine does not
        answer is logged and skipped; its allocations come back when its spawners are polled
        (see GPUSpawner.poll).

        Args:
            owner_exists: ``(user, server) -> bool`` from the hub's database; a restored
                allocation whose user or server no longer exists is released and its
                container removed. None = keep all.
        """
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
        """List GPUSpawner containers on every node and restore the ledger from their
        labels (see ensure_restored)."""
        labels: list[str] = []
        containers = self._containers
        for rt in self.nodes.values():
            try:
                found = await asyncio.to_thread(
                    rt.client.containers, all=True,
                    filters={"label": f"{MANAGED_LABEL}=1"})
            except Exception as e:  # engine down: report, do not crash the hub
                log.warning("node %s: cannot list containers to restore allocations: %s",
                            rt.name, e)
                continue
            for c in found:
                text = (c.get("Labels") or {}).get(ALLOCATION_LABEL)
                if text and c.get("State") in ("running", "created", "restarting"):
                    labels.append(text)
                    try:
                        containers[json.loads(text)["id"]] = (rt, c["Id"])
                    except (ValueError, KeyError, TypeError):
                        pass
        report = self.ledger.restore(labels)
        for conflict in report.conflicts:
            log.error("restore: allocation %s of %s refused: %s", conflict.allocation_id,
                      conflict.owner, conflict.problem)
        if report.restored:
            log.info("restored %d allocation(s) from container labels",
                     len(report.restored))
        self._unverified = list(report.restored)
        self.restored = report

    async def _release_ownerless(self, allocation_ids: list[str],
                                 owner_exists: Callable[[str, str], bool]) -> None:
        """Release restored allocations whose user or server the hub no longer has, and
        remove their containers."""
        containers = self._containers
        for alloc_id in allocation_ids:
            alloc = self.ledger.get(alloc_id)
            if alloc is None or owner_exists(alloc.owner.user, alloc.owner.server):
                continue
            log.warning("restore: %s/%s no longer exists; removing its container and "
                        "releasing allocation %s", alloc.owner.user, alloc.owner.server,
                        alloc.id)
            where = containers.get(alloc.id)
            if where is not None:
                try:
                    await asyncio.to_thread(where[0].client.remove_container, where[1],
                                            v=True, force=True)
                except Exception as e:
                    log.warning("restore: removing container %s failed: %s",
                                where[1][:12], e)
            self.ledger.release(alloc.id)

    def sweep_orphans(self, rt: NodeRuntime) -> list[str]:
        """Remove GPUSpawner containers on ``rt`` whose allocation the ledger does not book,
        and server networks whose server holds nothing (blocking). Run after the node's
        engine was unreachable: its servers were reported stopped and released, but their
        containers may have outlived the outage and must not keep devices the ledger has
        given away. Returns the removed container ids."""
        removed = []
        for c in rt.client.containers(all=True, filters={"label": f"{MANAGED_LABEL}=1"}):
            try:
                alloc_id = json.loads((c.get("Labels") or {}).get(ALLOCATION_LABEL, ""))["id"]
            except (ValueError, KeyError, TypeError):
                alloc_id = None
            if alloc_id is None or self.ledger.get(alloc_id) is None:
                log.warning("node %s: removing container %s, not booked in the ledger",
                            rt.name, c["Id"][:12])
                rt.client.remove_container(c["Id"], v=True, force=True)
                removed.append(c["Id"])
        for n in rt.client.networks(filters={"label": "gpuspawner.user"}):
            labels = n.get("Labels") or {}
            if self.ledger.find(labels.get("gpuspawner.user", ""),
                                labels.get("gpuspawner.server", "")) is None:
                try:
                    rt.client.remove_network(n["Id"])
                except Exception as e:  # still in use by something else: leave it
                    log.info("node %s: network %s kept: %s", rt.name, n.get("Name"), e)
        rt.suspect = False
        return removed


_CLUSTER: Cluster | None = None
_CLUSTER_KEY = ""
_WARNED: set[str] = set()


def get_cluster(nodes: Sequence[Mapping[str, Any]], policy: str,
                quotas: Mapping[str, Any], profiles: Any = None) -> Cluster:
    """The hub process's one cluster: one ledger, whatever asks for it.

    It is made on the first call. A call with another configuration (a config file checked
    twice while it loads, JupyterHub ``group_overrides`` changing a spawner's quotas) gets a new
    cluster only while the current one is unused (nothing restored, nothing booked); after
    that it gets the same cluster and a warning: two ledgers would book the same devices twice.

    ``profiles`` (``GPUSpawner.profiles``) seed the ledger's live workload prior
    (:class:`~gpuspawner.placement.LivePrior`): fgd places against the mix of what this hub
    granted (decayed over days), with the profiles filling in while the history is short.

    Raises:
        NodeConfigError, ValueError: bad node, policy or quota configuration.
    """
    global _CLUSTER, _CLUSTER_KEY
    key = json.dumps([list(nodes), policy, dict(quotas)], sort_keys=True, default=str)
    if _CLUSTER is not None and key != _CLUSTER_KEY:
        if _CLUSTER.restored is None and not _CLUSTER.ledger.allocations():
            _CLUSTER = None  # still unused: the later configuration replaces it
        else:
            if key not in _WARNED:
                _WARNED.add(key)
                log.warning("a GPUSpawner asked for nodes/policy/quotas that differ from the "
                            "hub's; it uses the hub's one ledger (its quotas and policy)")
            return _CLUSTER
    if _CLUSTER is None:
        runtimes = parse_node_config(nodes)
        quota_table = check_quotas(quotas)
        ledger = Ledger([rt.node for rt in runtimes], policy=policy, quotas=quota_table,
                        prior=_prior(profiles))
        _CLUSTER = Cluster({rt.name: rt for rt in runtimes}, ledger)
        _CLUSTER_KEY = key
    return _CLUSTER


def _prior(profiles: Any) -> LivePrior | None:
    """The live workload prior seeded with the profiles' bundles (None without profiles;
    a profile configuration that does not load is reported by the configuration check)."""
    if profiles is None:
        return None
    from .profiles import ProfileConfigError, load_profiles

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
