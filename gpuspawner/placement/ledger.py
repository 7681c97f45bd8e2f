"""The atomic ledger: the one record of which device of which node belongs to whom.

``reserve`` takes every resource of a bundle or none of them, in one step under one lock, with
the quota check in the same step. ``release`` gives them back. ``restore`` rebuilds the record
after a hub restart from allocations read back from containers, refusing (and reporting) any
that would double-book. The lock is a ``threading.RLock`` and no method awaits while holding it,
so the ledger is safe for threads and for asyncio tasks alike (a decision takes micro- to
milliseconds, see ``benchmarks/placement.py``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .devices import min_numa_count, model_allowed, plan
from .errors import (
    PlacementError,
    PlacementRefused,
    RestoreConflict,
    RestoreReport,
    UnknownAllocation,
)
from .fragmentation import FragmentationModel
from .model import GPU_MILLI, Allocation, Bundle, GPUShare, MigShare, Node, Owner, now
from .policies import DEFAULT_POLICY, POLICIES, get_policy, pod_type_of
from .prior import LivePrior
from .quota import QuotaTable, Usage
from .state import NodeState, Plan
from .units import format_bytes
from .workload import PodType

__all__ = ["Ledger", "POLICIES", "DEFAULT_POLICY"]


def _usage(a: Allocation) -> Usage:
    return Usage(a.total_gpu_milli, len(a.cpuset), a.memory_bytes, a.disk_bytes, 1)


def _affinity_tag(a: Allocation) -> str:
    """The GPU-affinity tag of an allocation (``GetGpuAffinityFromPodAnnotation``): "" for no
    GPU, ``share`` for a share of one GPU, ``<n>-gpu`` for n whole GPUs."""
    if not a.gpus:
        return ""
    if len(a.gpus) == 1 and a.gpus[0].milli < GPU_MILLI:
        return "share"
    return f"{len(a.gpus)}-gpu"


def _profile(st: NodeState) -> tuple:
    """What :func:`~.devices.min_numa_count` reads of a node: per NUMA node its cores,
    memory and the (model, shareable) of its GPUs."""
    return tuple((len(n.cpus), n.memory_bytes,
                  tuple(sorted((g.model, g.shareable) for g in st.gpus_by_numa[n.id])))
                 for n in st.node.numa_nodes)


def _bundle_usage(b: Bundle) -> Usage:
    return Usage(b.total_gpu_milli, b.cores, b.memory_bytes, b.disk_bytes, 1)


@dataclass
class _Cluster:
    states: list[NodeState] = field(default_factory=list)
    buckets: dict[tuple[int, int, int], dict[str, NodeState]] = field(default_factory=dict)
    frag: FragmentationModel = field(default_factory=FragmentationModel)
    rng: random.Random = field(default_factory=random.Random)
    #: bucket key -> version, bumped whenever a node that might now fit more joins or grows
    versions: dict[tuple[int, int, int], int] = field(default_factory=dict)
    #: bundle shape id -> {bucket key: version at which no node of it fitted}
    no_fit: dict[int, dict[tuple[int, int, int], int]] = field(default_factory=dict)
    shapes: dict[tuple, int] = field(default_factory=dict)
    #: node name -> GPU-affinity tag -> allocations with it (for ``gpu-clustering``)
    affinity: dict[str, dict[str, int]] = field(default_factory=dict)
    #: ``fgd`` compares the FGD plugin's integer score (True) or the exact growth (False)
    quantize: bool = True
    #: bundle shape -> (profile count, whether some node can hold it on one NUMA node)
    one_numa: dict[tuple, tuple[int, bool]] = field(default_factory=dict)
    #: signature id -> the keys of its buckets (an ordered set)
    by_sid: dict[int, dict[tuple[int, int, int], None]] = field(default_factory=dict)
    #: node name -> state (the ledger's own index)
    by_name: dict[str, NodeState] = field(default_factory=dict)
    #: bucket key -> the smallest node name in it (kept where known; see _rebucket)
    first_name: dict[tuple[int, int, int], str] = field(default_factory=dict)
    #: hardware profile (per NUMA node: cores, memory, GPU models and shareability) -> the
    #: first node of it
    profiles: dict[tuple, NodeState] = field(default_factory=dict)


#: what :meth:`Ledger.set_node_state` accepts
NODE_STATES = ("up", "drain", "down")


class Ledger:
    """Placement state of a set of nodes.

    Args:
        nodes: the nodes (names must be unique).
        policy: node-selection policy name, one of :data:`POLICIES` (default ``fgd``).
        quotas: user and group quotas; None = no quotas.
        seed: seed of the ``random`` policy's generator.
        clock: returns seconds since the epoch (``Allocation.created``).
        workload: the target workload of ``fgd``, ``[(PodType, frequency)]`` (e.g.
            :func:`~.workload.typical_pods` or :meth:`~.prior.LivePrior.workload`); None = learn
            it from the bundles this ledger sees (see
            :class:`~.fragmentation.FragmentationModel`).
        prior: a :class:`~.prior.LivePrior` to feed: every granted bundle and every restored
            allocation is recorded in it, and ``fgd``'s workload is re-read from it every
            ``prior_refresh_s`` seconds of ``clock`` (at the first reservation too); ignored
            when ``workload`` is given.
        prior_refresh_s: see ``prior``.

    Raises:
        ValueError: duplicate node names or an unknown policy.
    """

    def __init__(self, nodes: Iterable[Node], policy: str = DEFAULT_POLICY, *,
                 quotas: QuotaTable | None = None, seed: int | None = None,
                 clock: Callable[[], float] = now,
                 workload: list[tuple[PodType, float]] | None = None,
                 prior: LivePrior | None = None, prior_refresh_s: float = 3600.0) -> None:
        self._lock = threading.RLock()
        self.policy_name = policy
        self._policy = get_policy(policy)
        self.quotas = quotas or QuotaTable()
        self._clock = clock
        self._c = _Cluster(rng=random.Random(seed), frag=FragmentationModel(workload))
        self.prior = prior if workload is None else None
        self._prior_refresh_s = prior_refresh_s
        self._prior_read: float | None = None
        self._by_name: dict[str, NodeState] = self._c.by_name
        self._allocs: dict[str, Allocation] = {}
        self._by_owner: dict[tuple[str, str], str] = {}
        self._user_used: dict[str, Usage] = {}
        self._group_used: dict[str, Usage] = {}
        #: node name -> (state, reason) for nodes that take no new placements
        self._node_state: dict[str, tuple[str, str]] = {}
        #: GPU UUID -> (node, reason, milli held): drained GPUs; their free capacity is held
        #: so no new placement gets it, while allocations already there keep theirs
        self._drained: dict[str, list[Any]] = {}
        #: (node, drained GPU UUIDs) -> that node with nothing booked (capacity checks)
        self._empty_cache: dict[tuple[str, frozenset[str]], NodeState] = {}
        #: (nodes added, node states, drained GPUs) -> capacity(): the wait queue asks for it
        #: at every order() and it is O(GPUs) to add up; nodes are never removed
        self._capacity_cache: tuple[tuple[int, frozenset[str], frozenset[str]], Usage] | None
        self._capacity_cache = None
        self._grown = 0
        for n in nodes:
            self.add_node(n)

    # -- nodes -------------------------------------------------------------------------------
    def add_node(self, node: Node) -> None:
        """Add a node with nothing booked on it.

        Raises:
            ValueError: a node of that name exists.
        """
        with self._lock:
            if node.name in self._by_name:
                raise ValueError(f"duplicate node name {node.name!r}")
            st = NodeState(node, order=len(self._c.states))
            self._c.states.append(st)
            self._c.profiles.setdefault(_profile(st), st)
            self._by_name[node.name] = st
            self._rebucket(st)

    @property
    def grown(self) -> int:
        """A counter bumped whenever a node may fit more than before: added, something
        released on it (``release``, ``adopt``, ``restore(replace=True)``), back up, a GPU
        undrained. Bookings, drains and nodes going down never bump it, so a bundle that did
        not fit (on some nodes) while it had one value does not fit there while it keeps it
        (what the wait queue uses to skip tries that cannot succeed)."""
        return self._grown

    def node(self, name: str) -> Node:
        """The node of that name. Raises KeyError."""
        return self._by_name[name].node

    @property
    def nodes(self) -> list[Node]:
        """All nodes, in configuration order."""
        return [st.node for st in self._c.states]

    def set_workload(self, workload: list[tuple[PodType, float]] | None) -> None:
        """Set the target workload of ``fgd`` (``[(PodType, frequency)]``, frequencies summing
        to 1), e.g. ``LivePrior.workload()`` once a day; None = learn it online again."""
        with self._lock:
            self._c.frag.set_workload(workload)

    @property
    def workload(self) -> list[tuple[PodType, float]]:
        """The target workload ``fgd`` uses now."""
        return list(self._c.frag.workload)

    def set_policy(self, name: str) -> None:
        """Switch the node-selection policy. Raises ValueError for an unknown name."""
        fn = get_policy(name)
        with self._lock:
            self._policy, self.policy_name = fn, name

    # -- queries -----------------------------------------------------------------------------
    def allocations(self, user: str | None = None) -> list[Allocation]:
        """All allocations, or one user's, oldest first."""
        with self._lock:
            out = [a for a in self._allocs.values() if user is None or a.owner.user == user]
        return sorted(out, key=lambda a: (a.created, a.id))

    def get(self, allocation_id: str) -> Allocation | None:
        """The allocation with that id, or None."""
        return self._allocs.get(allocation_id)

    def find(self, user: str, server: str = "") -> Allocation | None:
        """The allocation held by one user's server, or None."""
        with self._lock:
            aid = self._by_owner.get((user, server))
            return self._allocs.get(aid) if aid else None

    def usage(self, user: str) -> Usage:
        """What one user holds now."""
        return self._user_used.get(user, Usage())

    def group_usage(self, group: str) -> Usage:
        """What all members of a group hold now (allocations made while they were members)."""
        return self._group_used.get(group, Usage())

    def quota_remaining(self, user: str, groups: Iterable[str] = (),
                        quotas: QuotaTable | None = None) -> dict[str, int | None]:
        """What the user may still take of each resource; None = unlimited (see QuotaTable).
        ``quotas``: the request's own table (a JupyterHub ``group_overrides`` of ``quotas``)
        instead of the ledger's."""
        with self._lock:
            return (quotas or self.quotas).remaining(user, tuple(groups), self.usage(user),
                                                     self._group_used)

    def observe(self, bundle: Bundle) -> None:
        """Count ``bundle`` as one arriving request of ``fgd``'s online workload model (what
        :meth:`reserve` does unless ``observe=False``)."""
        with self._lock:
            self._c.frag.observe(pod_type_of(bundle))

    def check_quota(self, bundle: Bundle, owner: Owner,
                    quotas: QuotaTable | None = None) -> None:
        """Raise :class:`QuotaExceeded` if ``bundle`` would take ``owner`` (or one of its
        groups) over a quota of ``quotas`` (None: the ledger's), counting what they hold now;
        nothing is booked."""
        with self._lock:
            (quotas or self.quotas).check(owner.user, owner.groups, _bundle_usage(bundle),
                                          self.usage(owner.user), self._group_used)

    # -- capacity (what could ever fit: the wait queue's admission) ---------------------------
    def usable_nodes(self) -> set[str]:
        """Names of the nodes that take new placements (not down, not drained)."""
        with self._lock:
            return set(self._by_name) - set(self._node_state)

    def capacity(self) -> Usage:
        """What the usable nodes have in all, booked or not (drained GPUs left out):
        milli-GPU, cores, memory bytes, disk bytes. The denominators of DRF shares.
        Cached until a node is added, a node's state or the set of drained GPUs changes."""
        with self._lock:
            key = (len(self._by_name), frozenset(self._node_state), frozenset(self._drained))
            if self._capacity_cache is not None and self._capacity_cache[0] == key:
                return self._capacity_cache[1]
            gpu = cores = mem = disk = 0
            for name in self.usable_nodes():
                n = self._by_name[name].node
                gpu += sum(GPU_MILLI for g in n.gpus if g.uuid not in self._drained)
                cores += sum(len(nn.cpus) for nn in n.numa_nodes)
                mem += sum(nn.memory_bytes for nn in n.numa_nodes)
                disk += n.disk_bytes
            cap = Usage(gpu, cores, mem, disk, 0)
            self._capacity_cache = (key, cap)
            return cap

    def _empty_state(self, name: str) -> NodeState:
        """Node ``name`` with nothing booked but its drained GPUs (cached per drain set)."""
        st = self._by_name[name]
        drained = frozenset(u for u in st.gpu_used if u in self._drained)
        key = (name, drained)
        cache = self._empty_cache
        if key not in cache:
            fresh = NodeState(st.node, order=st.order)
            for u in drained:
                fresh.gpu_used[u] = GPU_MILLI
                if fresh.gpu_by_uuid[u].mig_enabled:
                    fresh.mig_drained.add(u)
            fresh.refresh_signature()
            cache[key] = fresh
        return cache[key]

    def nodes_that_could_take(self, bundle: Bundle, nodes: Iterable[str] | None = None
                              ) -> set[str]:
        """Usable nodes (within ``nodes``, when given) whose capacity could hold ``bundle``
        if nothing else ran there, under its NUMA policy. O(nodes) plans of an empty node."""
        spill = bundle.numa_policy != "strict"
        with self._lock:
            names = self.usable_nodes()
            if nodes:
                names &= set(nodes)
            return {n for n in names if plan(self._empty_state(n), bundle, spill) is not None}

    def fits_now(self, bundle: Bundle, nodes: Iterable[str] | None = None) -> str | None:
        """The first usable node (within ``nodes``, when given; configuration order) on which
        ``bundle`` could be placed now, under its NUMA policy and the devices' rules
        (:func:`~.devices.plan` on the live state: booked and drained devices are taken), or
        None. The question the form, the queue and the REST service ask instead of counting
        free capacity beside the ledger; quotas are not judged here (:meth:`check_quota`).
        O(nodes) plans at most, stopping at the first that fits."""
        with self._lock:
            names = self.usable_nodes()
            if nodes:
                names &= set(nodes)
            for n in sorted(names, key=lambda n: self._by_name[n].order):
                st = self._by_name[n]
                if bundle.numa_policy != "none" and plan(st, bundle, False) is not None:
                    return n
                if bundle.numa_policy != "strict" and plan(st, bundle, True) is not None:
                    return n
            return None

    def closest_node(self, bundle: Bundle, nodes: Iterable[str]) -> str | None:
        """Of ``nodes``, the one that lacks the least to hold ``bundle`` now, for the wait
        queue's reservation (:class:`~.queue.WaitQueue`): the smallest (GPUs missing, cores
        missing, memory bytes missing, configuration order). GPUs missing: for whole GPUs,
        ``bundle.gpus`` minus the node's fully free GPUs of an allowed model (0 at least);
        for a share, 0 when one shareable GPU of an allowed model has ``gpu_milli`` free,
        else 1. A proxy: NUMA placement is not planned. None when ``nodes`` is empty."""
        with self._lock:
            best: tuple[int, int, int, int] | None = None
            name = None
            for n in nodes:
                st = self._by_name.get(n)
                if st is None:
                    continue
                ok = [g for g in st.node.gpus if model_allowed(g, bundle)]
                if bundle.mig:
                    gpus = max(0, bundle.mig_count - st.free_mig(bundle.mig))
                elif bundle.gpus:
                    free = sum(1 for g in ok if st.gpu_used[g.uuid] == 0)
                    gpus = max(0, bundle.gpus - free)
                elif bundle.gpu_milli:
                    gpus = 0 if any(g.shareable and st.gpu_free_milli(g.uuid) >= bundle.gpu_milli
                                    for g in ok) else 1
                else:
                    gpus = 0
                key = (gpus, max(0, bundle.cores - st.free_cpu_count()),
                       max(0, bundle.memory_bytes - st.free_memory()), st.order)
                if best is None or key < best:
                    best, name = key, n
            return name

    def capacity_refusal(self, bundle: Bundle, nodes: Iterable[str] | None = None
                         ) -> PlacementRefused | None:
        """None when some usable node could hold ``bundle`` once enough of it is free; else
        the refusal saying why not even an empty cluster could (reason keys as
        :class:`PlacementRefused`, ``never`` when only the combination does not fit)."""
        spill = bundle.numa_policy != "strict"
        with self._lock:
            names = self.usable_nodes() & set(nodes) if nodes else self.usable_nodes()
            # any() stops at the first node that could: O(1) plans on a roomy cluster
            if any(plan(self._empty_state(n), bundle, spill) is not None for n in names):
                return None
            states = [self._empty_state(n) for n in sorted(
                names, key=lambda n: self._by_name[n].order)]
            detail, reason, _ = _explain(states, bundle)
            if reason in ("gpus", "gpu_share", "numa", "cores", "memory", "disk"):
                detail = detail.replace(" free", "").replace("; best:", "; largest:")
                reason = "never"
            text = f"no usable node could ever hold {bundle.describe()}: {detail}"
            if self._node_state:
                text += "; " + "; ".join(f"node {n} is {s}" + (f" ({r})" if r else "")
                                         for n, (s, r) in sorted(self._node_state.items()))
            if bundle.total_gpu_milli and self._drained:
                text += "; drained: " + "; ".join(
                    f"GPU {u} on {d[0]} ({d[1]})" for u, d in sorted(self._drained.items())
                    if not nodes or d[0] in set(nodes))
            return PlacementRefused(reason, text)

    def gpu_milli_capacity(self) -> int:
        """Milli-GPU of all nodes."""
        return sum(len(st.gpu_used) for st in self._c.states) * GPU_MILLI

    def gpu_milli_allocated(self) -> int:
        """Milli-GPU booked now (a MIG-enabled GPU counts its booked instances'
        :func:`~.model.mig_milli`, not the 1000 its NodeState holds against whole-GPU use)."""
        with self._lock:
            held = sum(d[2] for d in self._drained.values())
            total = 0
            for st in self._c.states:
                total += sum(st.gpu_used.values())
                if st.mig_by_uuid or any(g.mig_mode for g in st.node.gpus):
                    total -= sum(GPU_MILLI for g in st.node.gpus if g.mig_enabled)
                    total += sum(st.mig_by_uuid[u].milli for u in st.mig_used)
            return total - held

    def free_gpus(self, models: Iterable[str] = (),
                  nodes: Iterable[str] = (), mig: str = "") -> tuple[int, int]:
        """(untouched GPUs, all GPUs) of the given models (empty = any) on the given nodes
        (a profile's node selector; empty = all nodes); what the spawn form and a waiting
        spawn's progress show as "3 of 8 A100 free now". With ``mig`` (a MIG profile name):
        (free, all) MIG instances of that profile on GPUs of those models instead."""
        probe = Bundle(cores=0, gpus=1, gpu_models=tuple(models))
        only = set(nodes)
        free = total = 0
        with self._lock:
            for st in self._c.states:
                if only and st.node.name not in only:
                    continue
                for g in st.node.gpus:
                    if not model_allowed(g, probe):
                        continue
                    if mig:
                        for m in g.mig:
                            if m.profile == mig:
                                total += 1
                                free += st.mig_free(m)
                    elif not g.mig_enabled:
                        total += 1
                        free += st.gpu_used[g.uuid] == 0
        return free, total

    def snapshot(self) -> list[dict[str, Any]]:
        """Per node: free/used GPUs (by UUID, with milli used), cores and memory per NUMA node,
        disk; JSON-ready. This is what the admin map and ``GET api/nodes`` show."""
        with self._lock:
            holders: dict[str, list[dict[str, Any]]] = {}
            cpu_holder: dict[tuple[str, int], str] = {}
            for a in self._allocs.values():
                for g in a.gpus:
                    holders.setdefault(g.uuid, []).append(
                        {"allocation": a.id, "user": a.owner.user, "server": a.owner.server,
                         "milli": g.milli})
                for c in a.cpuset:
                    cpu_holder[(a.node, c)] = a.owner.user
            out = []
            for st in self._c.states:
                n = st.node
                state, reason = self._node_state.get(n.name, ("up", ""))
                out.append({
                    "name": n.name,
                    "state": state,
                    "state_reason": reason,
                    "labels": dict(n.labels),
                    "disk_bytes": n.disk_bytes,
                    "disk_free_bytes": st.free_disk,
                    "numa_nodes": [{
                        "id": nn.id,
                        "cpus": list(nn.cpus),
                        "cpus_free": sorted(st.free_cpus[nn.id]),
                        "cpu_owners": {str(c): cpu_holder[(n.name, c)] for c in nn.cpus
                                       if (n.name, c) in cpu_holder},
                        "memory_bytes": nn.memory_bytes,
                        "memory_free_bytes": st.free_mem[nn.id],
                    } for nn in n.numa_nodes],
                    "gpus": [{
                        "uuid": g.uuid, "index": g.index, "model": g.model,
                        "memory_bytes": g.memory_bytes, "pci_bus_id": g.pci_bus_id,
                        "numa_node": g.numa_node, "shareable": g.shareable,
                        "milli_used": st.gpu_used[g.uuid] - self._held(g.uuid),
                        "holders": holders.get(g.uuid, []),
                        "drained": self._drained[g.uuid][1] if g.uuid in self._drained
                        else None,
                    } for g in n.gpus],
                })
            return out

    # -- reserve / release ---------------------------------------------------------------------
    def reserve(self, bundle: Bundle, owner: Owner, nodes: Iterable[str] | None = None, *,
                explain: bool = True, observe: bool = True,
                quotas: QuotaTable | None = None) -> Allocation:
        """Book every resource of ``bundle`` for ``owner`` on one node, or nothing.

        Args:
            bundle: what to book.
            owner: user, server name and the user's groups (for group quotas).
            nodes: restrict the choice to these node names (a profile's node selector).
            explain: build the refusal's sentence (an O(nodes) pass over the cluster); False
                gives the reason key ``unplaced`` and a short sentence, for simulations.
            observe: count the bundle as an arriving request of the online workload model
                (False for the wait queue's retries: it counts an arrival once, in
                :meth:`observe`).
            quotas: the request's quota table instead of the ledger's (a JupyterHub
                ``group_overrides`` that sets ``quotas`` for the user's groups: a per-user
                difference is an input of the request, not a second ledger).

        Returns:
            The allocation (already booked).

        Raises:
            QuotaExceeded: a user or group quota would be exceeded (nothing booked).
            PlacementRefused: no node has the devices free now; the message says what is
                missing, the closest node and what the quota still allows.
            PlacementError: the owner's server already holds an allocation.
        """
        allowed = set(nodes) if nodes is not None else None
        with self._lock:
            if self._node_state:  # nodes that are down or drained take nothing new
                if allowed is None:
                    allowed = set(self._by_name)
                allowed -= set(self._node_state)
            ok = (lambda st: st.node.name in allowed) if allowed is not None else None
            key = (owner.user, owner.server)
            if key in self._by_owner:
                raise PlacementError(
                    f"server {owner.user}/{owner.server} already holds allocation "
                    f"{self._by_owner[key]}; release it first")
            (quotas or self.quotas).check(owner.user, owner.groups, _bundle_usage(bundle),
                                          self.usage(owner.user), self._group_used)
            if observe:
                self._c.frag.observe(pod_type_of(bundle))
            if self.prior is not None:
                t = self._clock()
                if self._prior_read is None or t - self._prior_read >= self._prior_refresh_s:
                    self._prior_read = t
                    self._c.frag.set_workload(self.prior.workload(t))
            choice = None
            if bundle.numa_policy != "none":
                choice = self._policy(self._c, bundle, False, ok)
            if choice is None and bundle.numa_policy != "strict":
                choice = self._policy(self._c, bundle, True, ok)
            if choice is None:
                if not explain:
                    raise PlacementRefused("unplaced", f"no node can take {bundle.describe()} "
                                           "now")
                raise self._refusal(bundle, owner, allowed)
            st, p = choice
            alloc = self._allocation(bundle, owner, st, p)
            self._book(st, alloc)
            if self.prior is not None:
                self.prior.record_bundle(bundle, alloc.created)
            return alloc

    def _allocation(self, bundle: Bundle, owner: Owner, st: NodeState, p: Plan) -> Allocation:
        mems = tuple(sorted(n for n, _ in p.memory_by_numa))
        return Allocation(
            id=Allocation.new_id(), owner=owner, node=st.name,
            gpus=tuple(GPUShare(u, m) for u, m in p.gpus),
            cpuset=tuple(sorted(p.cpus)), mems=mems,
            memory_bytes=bundle.memory_bytes, disk_bytes=bundle.disk_bytes,
            memory_by_numa=tuple(sorted(p.memory_by_numa)),
            created=self._clock(), numa_aligned=p.aligned, note=p.note,
            mig=tuple(MigShare(u, st.mig_by_uuid[u].gpu, st.mig_by_uuid[u].profile,
                               st.mig_by_uuid[u].slices) for u in p.mig),
        )

    def _book(self, st: NodeState, alloc: Allocation) -> None:
        old = self._bucket_key(st)
        st.book(alloc)
        self._rebucket(st, old, grew=False)
        self._allocs[alloc.id] = alloc
        self._by_owner[(alloc.owner.user, alloc.owner.server)] = alloc.id
        tag = _affinity_tag(alloc)
        if tag:
            aff = self._c.affinity.setdefault(alloc.node, {})
            aff[tag] = aff.get(tag, 0) + 1
        u = _usage(alloc)
        self._user_used[alloc.owner.user] = self.usage(alloc.owner.user) + u
        for g in alloc.owner.groups:
            self._group_used[g] = self.group_usage(g) + u

    def _bucket_key(self, st: NodeState) -> tuple[int, int, int]:
        """(GPU signature id, free cores, free-memory class); the class is the bit length of
        the free MiB, so class c holds amounts in [2**(c-1), 2**c - 1] and the ``fgd`` policy
        can skip a whole bucket whose nodes are all too small. Free cores are exact: the
        fragmentation depends on them (a task type that no longer fits the CPU)."""
        return (self._c.frag.intern(st.sig), st.free_cpu_count(),
                (st.free_memory() >> 20).bit_length())

    def _rebucket(self, st: NodeState, old: tuple[int, int, int] | None = None,
                  grew: bool = True) -> None:
        """Move a node to the bucket of its current key. ``grew`` says the node may fit more
        than before (added, or something released), which invalidates the bucket's cached
        no-fit results; bookings only shrink a node, so they keep them."""
        key = self._bucket_key(st)
        c = self._c
        if grew:
            self._grown += 1
        if key != old:
            if old is not None:
                bucket = c.buckets.get(old)
                if bucket is not None:
                    bucket.pop(st.name, None)
                    if not bucket:
                        del c.buckets[old]
                        same_sig = c.by_sid[old[0]]
                        del same_sig[old]
                        if not same_sig:
                            del c.by_sid[old[0]]
                    if c.first_name.get(old) == st.name:
                        del c.first_name[old]  # recomputed when next asked for
            bucket = c.buckets.get(key)
            if bucket is None:
                bucket = c.buckets[key] = {}
                c.by_sid.setdefault(key[0], {})[key] = None
            bucket[st.name] = st
            first = c.first_name.get(key)
            if first is not None and st.name < first:
                c.first_name[key] = st.name
            c.versions[key] = c.versions.get(key, 0) + 1
        elif grew:
            c.versions[key] = c.versions.get(key, 0) + 1

    def release(self, allocation_id: str, missing_ok: bool = False) -> Allocation | None:
        """Give back everything an allocation holds; returns it (None when ``missing_ok``
        and the ledger holds no such allocation).

        Raises:
            UnknownAllocation: the ledger holds no allocation with that id (unless
                ``missing_ok``).
        """
        with self._lock:
            alloc = self._allocs.pop(allocation_id, None)
            if alloc is None:
                if missing_ok:
                    return None
                raise UnknownAllocation(f"no allocation {allocation_id}")
            st = self._by_name[alloc.node]
            old = self._bucket_key(st)
            st.unbook(alloc)
            for g in alloc.gpus:  # a drained GPU keeps what is given back
                if g.uuid in self._drained:
                    st.gpu_used[g.uuid] += g.milli
                    self._drained[g.uuid][2] += g.milli
            st.refresh_signature()
            self._rebucket(st, old)
            self._by_owner.pop((alloc.owner.user, alloc.owner.server), None)
            tag = _affinity_tag(alloc)
            aff = self._c.affinity.get(alloc.node, {})
            if tag in aff:
                aff[tag] -= 1
                if not aff[tag]:
                    del aff[tag]
            u = _usage(alloc)
            self._user_used[alloc.owner.user] = self.usage(alloc.owner.user) - u
            if self._user_used[alloc.owner.user] == Usage():
                del self._user_used[alloc.owner.user]
            for g in alloc.owner.groups:
                self._group_used[g] = self.group_usage(g) - u
                if self._group_used[g] == Usage():
                    del self._group_used[g]
            return alloc

    def adopt(self, allocation_id: str, *, cpuset: Iterable[int] | None = None,
              gpus: Iterable[str] | None = None) -> Allocation:
        """Make a booked allocation name the devices an engine actually granted: Slurm cannot
        be told core ids (``sbatch`` asks for a count, the select plugin picks them) and, in
        model mode, picks the GPUs itself. The allocation keeps its id, owner, node, memory
        and disk; ``cpuset`` replaces its cores (same count; when they sit on other NUMA nodes
        than its memory, the memory moves to theirs, split by core count), ``gpus`` its GPUs
        (UUIDs, same count and models, each keeping its milli-GPU). Every new core, GPU share
        and byte of NUMA memory must be free or already this allocation's. Atomic: on refusal
        nothing changes.

        Returns:
            the allocation as booked now.

        Raises:
            UnknownAllocation: no such allocation.
            PlacementError: the granted devices do not fit (held by another allocation, other
                counts, models or NUMA nodes); the message says which.
        """
        with self._lock:
            old = self._allocs.get(allocation_id)
            if old is None:
                raise UnknownAllocation(f"no allocation {allocation_id}")
            st = self._by_name[old.node]
            new_cpus = tuple(sorted(cpuset)) if cpuset is not None else old.cpuset
            if len(new_cpus) != len(old.cpuset):
                raise PlacementError(f"adopt {old.id}: {len(new_cpus)} cores granted, "
                                     f"{len(old.cpuset)} allocated")
            unknown_cpus = [c for c in new_cpus if c not in st.cpu_numa]
            if unknown_cpus:
                raise PlacementError(f"adopt {old.id}: cores {unknown_cpus} are not on node "
                                     f"{old.node}")
            mems, by_numa = old.mems, old.memory_by_numa
            numa_of = sorted({st.cpu_numa[c] for c in new_cpus})
            if new_cpus and old.mems and set(numa_of) != set(old.mems):
                # the memory follows the cores (split by core count), where it fits
                total, n = old.memory_bytes, len(new_cpus)
                share = {m: total * sum(st.cpu_numa[c] == m for c in new_cpus) // n
                         for m in numa_of}
                share[numa_of[0]] += total - sum(share.values())
                mems, by_numa = tuple(numa_of), tuple(sorted(share.items()))
            new_gpus = old.gpus
            if gpus is not None:
                uuids = list(gpus)
                models_old = sorted(st.gpu_by_uuid[g.uuid].model for g in old.gpus)
                unknown = [u for u in uuids if u not in st.gpu_by_uuid]
                if unknown or sorted(st.gpu_by_uuid[u].model for u in uuids) != models_old:
                    raise PlacementError(f"adopt {old.id}: GPUs {uuids} are not "
                                         f"{len(old.gpus)} of the models {models_old}")
                new_gpus = tuple(GPUShare(u, g.milli) for u, g in zip(uuids, old.gpus, strict=True))
            new = replace(old, cpuset=new_cpus, gpus=new_gpus, mems=mems,
                          memory_by_numa=by_numa)
            if new == old:
                return old
            self.release(old.id)
            problem = self._restore_problem(new)
            if problem:
                self._book(st, old)
                raise PlacementError(f"adopt {old.id}: {problem}")
            self._book(st, new)
            return new

    def restore(self, allocations: Iterable[Allocation | Mapping[str, Any] | str],
                replace: bool = False) -> RestoreReport:
        """Book allocations read back after a restart (from container labels or spawner state).

        Each is checked against what is already booked: an allocation whose node is unknown,
        whose devices are held already, whose owner's server holds another allocation, or that
        is malformed is refused and listed as a conflict; it is never double-booked. Quotas are
        not applied (the containers already run).

        Args:
            allocations: :class:`Allocation` objects, their ``to_dict()`` or ``to_json()`` forms.
            replace: drop everything booked first (a full rebuild).
        """
        report = RestoreReport()
        with self._lock:
            if replace:
                for aid in list(self._allocs):
                    self.release(aid)
            for item in allocations:
                try:
                    if isinstance(item, str):
                        alloc = Allocation.from_json(item)
                    elif isinstance(item, Mapping):
                        alloc = Allocation.from_dict(item)
                    else:
                        alloc = item
                except ValueError as e:
                    report.conflicts.append(RestoreConflict("?", "?", str(e)))
                    continue
                who = f"{alloc.owner.user}/{alloc.owner.server}"
                taken = self._unhold_for(alloc)  # a drained GPU still serves what runs there
                problem = self._restore_problem(alloc)
                if problem:
                    self._rehold(alloc.node, taken)
                    report.conflicts.append(RestoreConflict(alloc.id, who, problem))
                    continue
                self._book(self._by_name[alloc.node], alloc)
                if self.prior is not None:
                    self.prior.record_allocation(alloc)
                report.restored.append(alloc.id)
        return report

    def _restore_problem(self, alloc: Allocation) -> str | None:
        if alloc.id in self._allocs:
            return f"allocation {alloc.id} is already booked"
        st = self._by_name.get(alloc.node)
        if st is None:
            return f"node {alloc.node!r} is not in the inventory"
        other = self._by_owner.get((alloc.owner.user, alloc.owner.server))
        if other is not None:
            return f"server {alloc.owner.user}/{alloc.owner.server} already holds {other}"
        conflict = st.conflict(alloc)
        if conflict is None:
            return None
        holder = self._holder_of(alloc) if conflict.held else None
        return f"{conflict.text}; held by {holder}" if holder else conflict.text

    def _holder_of(self, alloc: Allocation) -> str | None:
        uuids = {g.uuid for g in alloc.gpus} | {m.uuid for m in alloc.mig}
        cpus = set(alloc.cpuset)
        for a in self._allocs.values():
            if a.node == alloc.node and (uuids & set(a.device_ids) or cpus & set(a.cpuset)):
                return f"{a.owner.user}/{a.owner.server} ({a.id})"
        return None

    # -- health: nodes that take no new work, drained GPUs ------------------------------------
    def set_node_state(self, name: str, state: str, reason: str = "") -> None:
        """Mark node ``name`` "up", "drain" (no new placements; what runs stays) or "down"
        (no new placements; the caller stops and releases what ran there). Slurm's node
        states (slurm.conf(5): DRAIN, DOWN, NOT_RESPONDING) and a Docker engine that stops
        answering map onto these.

        Raises:
            KeyError: unknown node. ValueError: unknown state.
        """
        if state not in NODE_STATES:
            raise ValueError(f"node state must be one of {', '.join(NODE_STATES)}, got "
                             f"{state!r}")
        with self._lock:
            st = self._by_name[name]
            if state == "up":
                if self._node_state.pop(name, None) is not None:
                    self._rebucket(st, self._bucket_key(st), grew=True)
            else:
                self._node_state[name] = (state, reason)

    def node_state(self, name: str) -> tuple[str, str]:
        """(state, reason) of node ``name``; ("up", "") unless set otherwise."""
        return self._node_state.get(name, ("up", ""))

    def drain_gpu(self, uuid: str, reason: str) -> str:
        """Take GPU ``uuid`` out of placement (unhealthy: NVML XID errors, ECC, retired pages;
        or an admin's choice): its free capacity is held, so no new allocation gets any of
        it; allocations already on it keep running and what they give back is held too.
        Returns the GPU's node. Draining a drained GPU updates the reason.

        A MIG-enabled GPU drained offers none of its MIG instances (those in use keep running).

        Raises:
            KeyError: no node has that GPU (a MIG instance's UUID: the message names its GPU,
                which is what is drained).
        """
        with self._lock:
            st = next((s for s in self._c.states if uuid in s.gpu_used), None)
            if st is None:
                parent = next((s.mig_by_uuid[uuid].gpu for s in self._c.states
                               if uuid in s.mig_by_uuid), None)
                if parent is not None:
                    raise KeyError(f"{uuid} is a MIG instance; drain its GPU {parent}")
                raise KeyError(f"no node has GPU {uuid}")
            if uuid in self._drained:
                self._drained[uuid][1] = reason
                return st.name
            old = self._bucket_key(st)
            if st.gpu_by_uuid[uuid].mig_enabled:
                st.mig_drained.add(uuid)
            free = GPU_MILLI - st.gpu_used[uuid]
            st.gpu_used[uuid] += free
            self._drained[uuid] = [st.name, reason, free]
            st.refresh_signature()
            self._rebucket(st, old, grew=False)
            return st.name

    def undrain_gpu(self, uuid: str) -> None:
        """Give a drained GPU back to placement (nothing if it is not drained)."""
        with self._lock:
            entry = self._drained.pop(uuid, None)
            if entry is None:
                return
            st = self._by_name[entry[0]]
            old = self._bucket_key(st)
            st.mig_drained.discard(uuid)
            st.gpu_used[uuid] -= entry[2]
            st.refresh_signature()
            self._rebucket(st, old, grew=True)

    def drained_gpus(self) -> dict[str, str]:
        """Drained GPUs: UUID -> reason."""
        with self._lock:
            return {u: d[1] for u, d in self._drained.items()}

    def _held(self, uuid: str) -> int:
        d = self._drained.get(uuid)
        return d[2] if d else 0

    def _unhold_for(self, alloc: Allocation) -> dict[str, int]:
        """Give back to ``alloc``'s drained GPUs as much of the hold as it books (restore of
        a server that runs there); returns what was taken, for :meth:`_rehold`."""
        taken: dict[str, int] = {}
        st = self._by_name.get(alloc.node)
        if st is None:
            return taken
        for g in alloc.gpus:
            d = self._drained.get(g.uuid)
            if d is not None and d[0] == alloc.node:
                n = min(d[2], g.milli)
                d[2] -= n
                st.gpu_used[g.uuid] -= n
                taken[g.uuid] = n
        return taken

    def _rehold(self, node: str, taken: Mapping[str, int]) -> None:
        st = self._by_name[node] if taken else None
        for uuid, n in taken.items():
            self._drained[uuid][2] += n
            st.gpu_used[uuid] += n  # type: ignore[union-attr]

    # -- refusals ----------------------------------------------------------------------------
    def _refusal(self, bundle: Bundle, owner: Owner,
                 allowed: set[str] | None) -> PlacementRefused:
        states = [st for st in self._c.states if allowed is None or st.name in allowed]
        detail, reason, best = _explain(states, bundle)
        if self._node_state:
            detail += "; " + "; ".join(f"node {n} is {s}" + (f" ({r})" if r else "")
                                       for n, (s, r) in sorted(self._node_state.items()))
        if bundle.total_gpu_milli and self._drained:
            names = {st.name for st in states}
            drained = [(d[0], u, d[1]) for u, d in self._drained.items() if d[0] in names]
            if drained:
                detail += "; drained: " + "; ".join(f"GPU {u} on {n} ({r})"
                                                    for n, u, r in sorted(drained))
        left = self.quotas.remaining(owner.user, owner.groups, self.usage(owner.user),
                                     self._group_used)
        if bundle.total_gpu_milli and left["gpu_milli"] is not None:
            n = left["gpu_milli"] / GPU_MILLI
            detail += f"; your quota allows {n:g} more GPU" + ("" if n == 1 else "s")
        return PlacementRefused(reason, detail, best)


def _gpu_free(st: NodeState, bundle: Bundle, strict: bool) -> int:
    """Free whole GPUs of the allowed models (on the fewest NUMA nodes that could hold the
    bundle when ``strict``), or for a share the most free milli-GPU of one shareable GPU."""
    if bundle.mig:
        per = [sum(1 for m in st.mig_by_numa[n] if m.profile == bundle.mig
                   and st.mig_free(m) and model_allowed(st.gpu_by_uuid[m.gpu], bundle))
               for n in st.numa_ids]
        if not strict:
            return sum(per)
        m = min_numa_count(st, bundle) or len(per)
        return sum(sorted(per, reverse=True)[:m])
    if bundle.gpus:
        per = [sum(1 for g in st.gpus_by_numa[n] if st.gpu_used[g.uuid] == 0
                   and model_allowed(g, bundle)) for n in st.numa_ids]
        if not strict:
            return sum(per)
        m = min_numa_count(st, bundle) or len(per)
        return sum(sorted(per, reverse=True)[:m])
    return max((GPU_MILLI - st.gpu_used[g.uuid] for g in st.node.gpus
                if g.shareable and model_allowed(g, bundle)), default=0)


def _explain(states: list[NodeState], bundle: Bundle) -> tuple[str, str, str | None]:
    """(sentence, reason key, closest node) for a bundle no node can take. O(nodes)."""
    if not states:
        return "no node is available for this profile", "no_nodes", None
    models = "|".join(bundle.gpu_models) if bundle.gpu_models else "GPU"
    strict = bundle.numa_policy == "strict"
    wants_gpu = bool(bundle.total_gpu_milli)
    if bundle.mig and not any(m.profile == bundle.mig and model_allowed(g, bundle)
                              for st in states for g in st.node.gpus for m in g.mig):
        have = sorted({m.profile for st in states for g in st.node.gpus for m in g.mig})
        on = f" on {models}" if bundle.gpu_models else ""
        return (f"no node has a MIG {bundle.mig} instance{on} (MIG profiles here: "
                f"{', '.join(have) or 'none'})", "no_gpu_model", None)
    if wants_gpu and not bundle.mig and not any(
            model_allowed(g, bundle) and (bundle.gpus or g.shareable)
            for st in states for g in st.node.gpus):
        have = sorted({g.model for st in states for g in st.node.gpus if g.model})
        kind = "shareable " if bundle.gpu_milli else ""
        return (f"no node has a {kind}{models} (models here: {', '.join(have) or 'none'})",
                "no_gpu_model", None)
    big = [st for st in states if min_numa_count(st, bundle) is not None]
    if not big:
        return (f"no node is large enough for {bundle.describe()}", "too_large", None)
    if wants_gpu:
        need = bundle.gpus or bundle.gpu_milli or bundle.mig_units
        free = {st.name: _gpu_free(st, bundle, strict) for st in big}
        best = max(big, key=lambda st: (free[st.name], -st.order))
        n = free[best.name]
        if n < need:
            if bundle.mig:
                return (f"no node has {need} free MIG {bundle.mig} instance"
                        f"{'' if need == 1 else 's'}; best: {best.name} with {n} free",
                        "gpus", best.name)
            if bundle.gpus:
                m = min_numa_count(best, bundle) or 1
                where = ("" if not strict else " on one NUMA node" if m == 1
                         else f" on {m} NUMA nodes")
                return (f"no node has {bundle.gpus} free {models}{where}; best: {best.name} "
                        f"with {n} free", "gpus", best.name)
            return (f"no shareable {models} has {bundle.gpu_milli} milli-GPU free; best: "
                    f"{best.name} with {n} milli-GPU free", "gpu_share", best.name)
        big = [st for st in big if free[st.name] >= need]
    with_gpus = f" beside {bundle.gpus or 1} free {models}" if wants_gpu else ""
    if bundle.mig:
        with_gpus = f" beside {bundle.mig_count} free MIG {bundle.mig}"
    checks = (
        ("cores", lambda st: st.free_cpu_count(), bundle.cores, str),
        ("memory", lambda st: st.free_memory(), bundle.memory_bytes, format_bytes),
        ("disk", lambda st: st.free_disk, bundle.disk_bytes, format_bytes),
    )
    for reason, have, need, fmt in checks:
        best = max(big, key=lambda st: (have(st), -st.order))
        if have(best) < need:
            what = f"{need} free cores" if reason == "cores" else \
                f"{fmt(need)} of free {reason}"
            return (f"no node has {what}{with_gpus}; best: {best.name} with "
                    f"{fmt(have(best))}", reason, best.name)
    best = big[0]
    spill = plan(best, bundle, True) if strict else None
    hint = "; numa_policy 'prefer' would place it across NUMA nodes" if spill else ""
    return (f"no node has {bundle.describe()} free together on one NUMA node{hint}; "
            f"closest: {best.name}", "numa", best.name)
